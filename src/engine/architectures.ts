// The model architectures sluice serves, as one table: what the TypeScript side (the checkpoint
// reader, the ONNX exporter) and the model maker (models/) know of each family. The native reader
// (kArchitectures in native/src/model/architectures.cpp) is its C++ mirror; test/architectures.test.ts
// checks that both list the same families with the same model_type and optional pieces.
//
// Adding a family: an entry here (and in the C++ table), then what its forward pass needs.

/**
 * What a family's configFields reads of a shape; models/presets.ts's PresetShape extends it. The
 * optional fields belong to the families named, and are absent elsewhere.
 */
export interface FamilyShape {
  numLayers: number;
  maxPositionEmbeddings: number;
  /** sliding_window: Mistral and Mixtral (null = full attention), Gemma 3 and gpt-oss (the window of their sliding layers). */
  slidingWindow?: number | null;
  // ---- Mixture of experts (Qwen3-MoE, Mixtral, gpt-oss). ----
  /** Experts of a sparse layer (num_experts / num_local_experts). */
  numExperts?: number;
  /** Experts each token is routed to (num_experts_per_tok). */
  numExpertsPerTok?: number;
  /** Qwen3-MoE: each expert's intermediate size (intermediateSize is the dense layers'); Mixtral's and gpt-oss's experts use intermediateSize. */
  moeIntermediateSize?: number;
  /** Qwen3-MoE: the top-k routing weights are renormalised to sum 1 (default true). */
  normTopkProb?: boolean;
  /** Qwen3-MoE: layer i is sparse iff (i + 1) % decoderSparseStep == 0 (default 1) and i is not in mlpOnlyLayers. */
  decoderSparseStep?: number;
  mlpOnlyLayers?: number[];
  // ---- Gemma 3 (required there). ----
  /** Attention scores are scaled by queryPreAttnScalar ** -0.5 (not head_dim's). */
  queryPreAttnScalar?: number;
  /** Layer i attends to everything iff (i + 1) % slidingWindowPattern == 0, else within slidingWindow. */
  slidingWindowPattern?: number;
  /** Rope base of the sliding layers (never scaled; ropeTheta and ropeScaling are the global layers'). */
  ropeLocalBaseFreq?: number;
  /** logits = tanh(logits / cap) * cap; null (Gemma 3's published configs) = none. */
  finalLogitSoftcapping?: number | null;
  attnLogitSoftcapping?: number | null;
  // ---- gpt-oss (required there): layers alternate sliding (even) and full (odd); rope is YaRN. ----
  /** The clamped SwiGLU's limit (swiglu_limit). */
  swigluLimit?: number;
  /** initial_context_length: the context trained before YaRN. */
  initialContextLength?: number;
}

export interface ArchitectureSpec {
  /** config.json's model_type for this family (the native reader assumes it when absent). */
  modelType: string;
  /** The q, k and v projections carry biases whatever attention_bias says (Qwen2). */
  qkvBias: boolean;
  /** q and k are RMS-normalised per head before rope (Qwen3, Qwen3-MoE, Gemma 3). */
  qkNorm: boolean;
  /**
   * What turns sliding-window attention on in config.json: `sliding_window` being set (Mistral,
   * Mixtral), `use_sliding_window: true` (the Qwen families; Llama has neither and never slides),
   * or `layer_types` / `sliding_window_pattern` (Gemma 3, gpt-oss: windowed layers among global
   * ones). Every rule but 'layer_types' is served by capping the context at the window (full
   * attention within it); windowed layers are computed as such and leave the context alone.
   */
  slidingWindowBy: 'sliding_window' | 'use_sliding_window' | 'layer_types';
  /** max_position_embeddings when config.json leaves it out: the native reader's 2048, or the family's config class default. */
  defaultContextLength: number;
  /** Feed-forward blocks: one gated MLP, or a router over gated-MLP experts (see moeLayout). */
  mlp: 'dense' | 'moe';
  /**
   * How the experts' tensors are named (null for dense families):
   * - 'qwen3_moe': mlp.gate [E, H] (router), mlp.experts.{e}.{gate,up,down}_proj; layers in
   *   mlp_only_layers or off the decoder_sparse_step have a dense mlp.{gate,up,down}_proj;
   * - 'mixtral': block_sparse_moe.gate [E, H], block_sparse_moe.experts.{e}.w1 (gate), w3 (up),
   *   w2 (down), of intermediate_size; every layer is sparse.
   * - 'gpt_oss': mlp.router (weight [E, H] and bias [E]), mlp.experts.gate_up_proj_{blocks,scales}
   *   (MXFP4, [E, 2I, H/32, 16] and [E, 2I, H/32]; gate and up rows interleaved) and _bias [E, 2I],
   *   mlp.experts.down_proj_{blocks,scales,bias}; every layer is sparse.
   */
  moeLayout: 'qwen3_moe' | 'mixtral' | 'gpt_oss' | null;
  /** Gemma: every RMSNorm (q/k norms included) scales by (1 + w), and embeddings by sqrt(hidden_size). */
  gemmaNorms: boolean;
  /** Gemma: four norms a layer: input, post-attention (on the attention output), pre- and post-feedforward. */
  sandwichNorms: boolean;
  /** The gated MLP's activation; config.json spells it hidden_act (silu) or hidden_activation (Gemma). */
  activation: 'silu' | 'gelu_pytorch_tanh';
  /** Rope positions of three components (Qwen2-VL's M-RoPE, rope_scaling.mrope_section): the model takes images. */
  mrope: boolean;
  /** Key of the nested text model's config (multimodal checkpoints), or null: the text fields are at the top. */
  textConfig: 'text_config' | null;
  /** Tensor name prefix of the decoder; the untied lm_head sits beside it ("lm_head", "language_model.lm_head"). */
  prefix: 'model.' | 'language_model.model.';
  /** The family's own config.json fields, as transformers writes them (the model maker); under textConfig where it has one. */
  configFields(shape: FamilyShape): Record<string, unknown>;
}

/** The entries every dense, non-Gemma family shares. */
const PLAIN = {
  defaultContextLength: 2048, mlp: 'dense', moeLayout: null, gemmaNorms: false, sandwichNorms: false,
  activation: 'silu', textConfig: null, prefix: 'model.', mrope: false,
} as const;

/** Gemma3TextConfig's fields (a multimodal checkpoint writes them under text_config). */
const gemma3TextFields = (s: FamilyShape): Record<string, unknown> => ({
  attention_bias: false,
  attn_logit_softcapping: s.attnLogitSoftcapping ?? null,
  cache_implementation: 'hybrid',
  final_logit_softcapping: s.finalLogitSoftcapping ?? null,
  hidden_activation: 'gelu_pytorch_tanh',
  query_pre_attn_scalar: s.queryPreAttnScalar,
  rope_local_base_freq: s.ropeLocalBaseFreq,
  sliding_window: s.slidingWindow,
  sliding_window_pattern: s.slidingWindowPattern,
});

const GEMMA3 = {
  qkvBias: false, qkNorm: true, slidingWindowBy: 'layer_types', defaultContextLength: 131072, mlp: 'dense',
  moeLayout: null, gemmaNorms: true, sandwichNorms: true, activation: 'gelu_pytorch_tanh', mrope: false,
} as const;

export const ARCHITECTURES = {
  LlamaForCausalLM: {
    ...PLAIN, modelType: 'llama', qkvBias: false, qkNorm: false, slidingWindowBy: 'use_sliding_window',
    configFields: () => ({ attention_bias: false, mlp_bias: false, pretraining_tp: 1 }),
  },
  MistralForCausalLM: {
    ...PLAIN, modelType: 'mistral', qkvBias: false, qkNorm: false, slidingWindowBy: 'sliding_window',
    configFields: (s) => ({ sliding_window: s.slidingWindow }),
  },
  Qwen2ForCausalLM: {
    ...PLAIN, modelType: 'qwen2', qkvBias: true, qkNorm: false, slidingWindowBy: 'use_sliding_window',
    configFields: (s) => ({ max_window_layers: s.numLayers, sliding_window: s.maxPositionEmbeddings, use_sliding_window: false }),
  },
  Qwen3ForCausalLM: {
    ...PLAIN, modelType: 'qwen3', qkvBias: false, qkNorm: true, slidingWindowBy: 'use_sliding_window',
    configFields: (s) => ({ attention_bias: false, max_window_layers: s.numLayers, sliding_window: null, use_sliding_window: false }),
  },
  Qwen3MoeForCausalLM: {
    ...PLAIN, modelType: 'qwen3_moe', qkvBias: false, qkNorm: true, slidingWindowBy: 'use_sliding_window',
    mlp: 'moe', moeLayout: 'qwen3_moe',
    configFields: (s) => ({
      attention_bias: false, decoder_sparse_step: s.decoderSparseStep ?? 1, max_window_layers: s.numLayers,
      mlp_only_layers: [...(s.mlpOnlyLayers ?? [])], moe_intermediate_size: s.moeIntermediateSize,
      norm_topk_prob: s.normTopkProb ?? true, num_experts: s.numExperts, num_experts_per_tok: s.numExpertsPerTok,
      output_router_logits: false, router_aux_loss_coef: 0.001, sliding_window: null, use_sliding_window: false,
    }),
  },
  MixtralForCausalLM: {
    ...PLAIN, modelType: 'mixtral', qkvBias: false, qkNorm: false, slidingWindowBy: 'sliding_window',
    mlp: 'moe', moeLayout: 'mixtral',
    configFields: (s) => ({
      num_experts_per_tok: s.numExpertsPerTok, num_local_experts: s.numExperts, output_router_logits: false,
      router_aux_loss_coef: 0.02, sliding_window: s.slidingWindow ?? null,
    }),
  },
  Gemma3ForCausalLM: {
    ...GEMMA3, modelType: 'gemma3_text', textConfig: null, prefix: 'model.',
    configFields: gemma3TextFields,
  },
  // The text part of the multimodal checkpoints (gemma-3-4b and up); vision tensors are not read.
  Gemma3ForConditionalGeneration: {
    ...GEMMA3, modelType: 'gemma3', textConfig: 'text_config', prefix: 'language_model.model.',
    configFields: (s) => ({ text_config: { ...gemma3TextFields(s), model_type: 'gemma3_text' } }),
  },
  // Qwen2.5-VL's language model: Qwen2 layers with M-RoPE (rope_scaling.mrope_section), text
  // fields at the top level as published; the vision tower (visual.*) feeds it image rows.
  Qwen2_5_VLForConditionalGeneration: {
    ...PLAIN, modelType: 'qwen2_5_vl', qkvBias: true, qkNorm: false, slidingWindowBy: 'use_sliding_window', mrope: true,
    configFields: (s) => ({ max_window_layers: s.numLayers, sliding_window: s.maxPositionEmbeddings, use_sliding_window: false }),
  },
  // gpt-oss: attention with biases and sinks, sliding and full layers alternating, YaRN rope, and
  // MXFP4 experts routed by top-k logits (softmax over those) through a clamped SwiGLU.
  GptOssForCausalLM: {
    ...PLAIN, modelType: 'gpt_oss', qkvBias: false, qkNorm: false, slidingWindowBy: 'layer_types',
    defaultContextLength: 131072, mlp: 'moe', moeLayout: 'gpt_oss',
    configFields: (s) => ({
      attention_bias: true, experts_per_token: s.numExpertsPerTok, initial_context_length: s.initialContextLength ?? 4096,
      layer_types: Array.from({ length: s.numLayers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention')),
      num_experts_per_tok: s.numExpertsPerTok, num_local_experts: s.numExperts, output_router_logits: false,
      router_aux_loss_coef: 0.9, sliding_window: s.slidingWindow ?? 128, swiglu_limit: s.swigluLimit ?? 7,
    }),
  },
} as const satisfies Record<string, ArchitectureSpec>;

export type Architecture = keyof typeof ARCHITECTURES;

export const SUPPORTED_ARCHITECTURES = Object.keys(ARCHITECTURES) as Architecture[];

/** The spec of an architecture name from config.json, or undefined when sluice does not serve it. */
export function architectureSpec(name: unknown): ArchitectureSpec | undefined {
  return typeof name === 'string' && Object.hasOwn(ARCHITECTURES, name) ? ARCHITECTURES[name as Architecture] : undefined;
}

/** The spec of the family whose model_type this is (config.json without `architectures`). */
export function specOfModelType(modelType: unknown): ArchitectureSpec | undefined {
  return Object.values(ARCHITECTURES).find((a) => a.modelType === modelType);
}

/** The family of a config.json as the native reader finds it: by architectures[0], else by model_type. */
export function specOfConfig(config: Record<string, unknown>): ArchitectureSpec | undefined {
  const architectures = config['architectures'];
  return architectureSpec(Array.isArray(architectures) ? architectures[0] : undefined) ?? specOfModelType(config['model_type']);
}

/**
 * Whether config.json turns sliding-window attention on, read the way the family spells it
 * (`config` is the text model's config: under text_config where the family nests it). Gemma 3:
 * whether any layer is a windowed one.
 */
export function usesSlidingWindow(spec: ArchitectureSpec | undefined, config: Record<string, unknown>): boolean {
  switch (spec?.slidingWindowBy) {
    case 'sliding_window':
      return config['sliding_window'] !== undefined && config['sliding_window'] !== null;
    case 'layer_types': {
      const types = config['layer_types'];
      if (Array.isArray(types)) return types.includes('sliding_attention');
      const pattern = config['sliding_window_pattern'];
      return (typeof pattern === 'number' ? pattern : 6) !== 1;
    }
    default:
      return config['use_sliding_window'] === true;
  }
}

/** Whether the engine serves this config's sliding window by capping the context at it (every family but Gemma 3). */
export function windowCapsContext(spec: ArchitectureSpec | undefined, config: Record<string, unknown>): boolean {
  return spec?.slidingWindowBy !== 'layer_types' && usesSlidingWindow(spec, config);
}

/** The text model's fields of a config.json: the nested text_config of multimodal families, else the file itself. */
export function textConfigOf(spec: ArchitectureSpec | undefined, config: Record<string, unknown>): Record<string, unknown> | undefined {
  if (!spec?.textConfig) return config;
  const text = config[spec.textConfig];
  return text !== null && typeof text === 'object' && !Array.isArray(text) ? text as Record<string, unknown> : undefined;
}
