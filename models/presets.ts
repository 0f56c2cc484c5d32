// Model presets for the generator: the exact shapes of published checkpoints plus small
// variants for correctness tests. Shapes only; weights are random (see make-model.ts).

import { ARCHITECTURES, architectureSpec, type Architecture, type FamilyShape } from '../src/engine/architectures.js';

export type { Architecture };

export type Dtype = 'f32' | 'f16' | 'bf16';

/** rope_scaling exactly as transformers' config.json spells it. */
export type RopeScaling =
  | {
      rope_type: 'llama3';
      factor: number;
      low_freq_factor: number;
      high_freq_factor: number;
      original_max_position_embeddings: number;
    }
  | { rope_type: 'linear'; factor: number }
  | {
      // gpt-oss: YaRN over the first original_max_position_embeddings positions.
      beta_fast: number;
      beta_slow: number;
      factor: number;
      original_max_position_embeddings: number;
      rope_type: 'yarn';
      /** Round the ramp's ends to whole dimensions (transformers' default true; gpt-oss false). */
      truncate?: boolean;
      /** Scale of cos and sin; default 0.1 * ln(factor) + 1. */
      attention_factor?: number;
    };

/**
 * Tokenizer family written next to the weights.
 * - 'chatml': byte-level BPE + <|endoftext|>, <|im_start|>, <|im_end|> (Qwen style).
 * - 'qwen3': chatml plus Qwen3's text tokens <think> </think> <tool_call> </tool_call>
 *   <tool_response> </tool_response> (added, not special) and a template with thinking and tools.
 * - 'llama3': byte-level BPE + the 256 Llama 3 special tokens (<|begin_of_text|>, ... <|eot_id|>).
 * - 'harmony': byte-level BPE + gpt-oss's nine named special tokens (<|startoftext|>, <|endoftext|>,
 *   <|return|>, ... <|call|>; consecutive ids, not o200k_harmony's) and the harmony template.
 * - 'qwen2-vl': chatml plus the vision tokens <|vision_start|> <|vision_end|> <|vision_pad|>
 *   <|image_pad|> <|video_pad|> (special, in Qwen2-VL's order) and a template with image and video parts.
 * - 'gemma3-vl': chatml plus Gemma 3's image tokens <start_of_image> <end_of_image> <image_soft_token>
 *   (special) and a template writing each image part as <start_of_image> (the processor expands it).
 */
export type TokenizerFamily = 'chatml' | 'qwen3' | 'llama3' | 'harmony' | 'qwen2-vl' | 'gemma3-vl';

/**
 * The vision tower and processor of a vision-language checkpoint, with the fields its config.json
 * adds to the decoder's; `architecture` tells the kinds apart.
 */
export type VisionShape = Qwen25VisionShape | Gemma3VisionShape;

/**
 * Qwen2.5-VL's. Named as vision_config and preprocessor_config.json spell them; sizes in patches
 * unless said otherwise.
 */
export interface Qwen25VisionShape {
  /** architectures[0] of the checkpoint; the engine does not serve it (the decoder's family it does). */
  architecture: 'Qwen2_5_VLForConditionalGeneration';
  /** Vision blocks (depth). */
  depth: number;
  hiddenSize: number;
  /** The blocks' gated MLP (gate_proj, up_proj, down_proj, with biases). */
  intermediateSize: number;
  numHeads: number;
  /** Side of a patch in pixels (patch_size). */
  patchSize: number;
  /** Frames per patch (temporal_patch_size); an image is repeated to fill them. */
  temporalPatchSize: number;
  /** The merger concatenates spatialMergeSize^2 neighbouring patches into one decoder token. */
  spatialMergeSize: number;
  /** Side of an attention window in pixels (window_size); a multiple of patchSize * spatialMergeSize. */
  windowSize: number;
  /** Blocks that attend over the whole image; the others within windows. */
  fullattBlockIndexes: number[];
  /** Video: temporal position ids per second (tokens_per_second). */
  tokensPerSecond: number;
  /** rope_scaling.mrope_section: the decoder's rotary pairs given to time, height, width (sums to headDim / 2). */
  mropeSection: [number, number, number];
  /** max_window_layers of the decoder's config (published 70 for 3B, the text model's depth for 7B). */
  maxWindowLayers: number;
  /** The processor's resize bounds in pixels (min_pixels, max_pixels). */
  minPixels: number;
  maxPixels: number;
}

/**
 * Gemma 3's SigLIP tower (vision_config, a SiglipVisionConfig) and its projector: every image is
 * resized to imageSize x imageSize, cut into (imageSize / patchSize)^2 patches, encoded, average
 * pooled to mmTokensPerImage tokens and projected to the text width. The text model is the
 * preset's own (architecture Gemma3ForConditionalGeneration, under text_config).
 */
export interface Gemma3VisionShape {
  architecture: 'Gemma3ForConditionalGeneration';
  /** Encoder layers (num_hidden_layers). */
  numLayers: number;
  hiddenSize: number;
  /** The layers' MLP (fc1, fc2; gelu tanh). */
  intermediateSize: number;
  numHeads: number;
  /** Side of a patch in pixels. */
  patchSize: number;
  /** Side of the square every image is resized to, in pixels (image_size; the processor's size). */
  imageSize: number;
  /** Decoder tokens per image (a square number whose side divides imageSize / patchSize). */
  mmTokensPerImage: number;
  /** LayerNorm eps of the tower, and of the projector's RMSNorm (layer_norm_eps). */
  layerNormEps: number;
}

export interface PresetShape extends FamilyShape {
  architecture: Architecture;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  /** Rows of embed_tokens / lm_head; the tokenizer is padded (or trimmed) to exactly this size. */
  vocabSize: number;
  maxPositionEmbeddings: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  tieWordEmbeddings: boolean;
  /**
   * sliding_window in config.json: Mistral and Mixtral (null = full attention), Gemma 3 (the
   * window of its sliding layers; required). The other families ignore it.
   */
  slidingWindow: number | null;
  tokenizer: TokenizerFamily;
  defaultDtype: Dtype;
  /**
   * A vision-language checkpoint: `architecture` is its decoder's family (whose tensors and
   * attention it has), written under vision.architecture with the vision tower beside it.
   */
  vision?: VisionShape;
  // Mixture-of-experts, Gemma 3 and gpt-oss fields: FamilyShape (src/engine/architectures.ts).
}

/** Byte-level BPE entries of the small trained tokenizer (256 bytes + learned merges). */
export const SMALL_BPE_SIZE = 2048;
/** <|endoftext|>, <|im_start|>, <|im_end|>. */
export const CHATML_SPECIALS = 3;
/** Vocabulary of the tiny/test presets: trained BPE + ChatML specials = 2051. */
export const SMALL_VOCAB = SMALL_BPE_SIZE + CHATML_SPECIALS;
/** The same with Qwen3's six text tokens (<think>, <tool_call>, ...): 2057. */
const SMALL_QWEN3_VOCAB = SMALL_VOCAB + 6;
/** Trained BPE + gpt-oss's nine harmony specials: 2057. */
const SMALL_HARMONY_VOCAB = SMALL_BPE_SIZE + 9;
/** The tiny vocabulary with Qwen2-VL's five vision tokens: 2056. */
const SMALL_QWEN2_VL_VOCAB = SMALL_VOCAB + 5;
/** The tiny vocabulary with Gemma 3's three image tokens: 2054. */
const SMALL_GEMMA3_VL_VOCAB = SMALL_VOCAB + 3;

const llama3Scaling = (factor: number, orig: number): RopeScaling => ({
  rope_type: 'llama3',
  factor,
  low_freq_factor: 1,
  high_freq_factor: 4,
  original_max_position_embeddings: orig,
});

/** rope_scaling as gpt-oss publishes it (keys in its order), over `orig` trained positions. */
const gptOssYarn = (orig: number): RopeScaling => ({
  beta_fast: 32,
  beta_slow: 1,
  factor: 32,
  original_max_position_embeddings: orig,
  rope_type: 'yarn',
  truncate: false,
});

/** openai/gpt-oss-20b and -120b share all but their depth and expert count. */
const gptOss = (numLayers: number, numExperts: number): PresetShape => ({
  architecture: 'GptOssForCausalLM',
  hiddenSize: 2880,
  intermediateSize: 2880,
  numLayers,
  numHeads: 64,
  numKvHeads: 8,
  headDim: 64,
  vocabSize: 201088,
  maxPositionEmbeddings: 131072,
  rmsNormEps: 1e-5,
  ropeTheta: 150000,
  ropeScaling: gptOssYarn(4096),
  tieWordEmbeddings: false,
  slidingWindow: 128,
  tokenizer: 'harmony',
  defaultDtype: 'bf16',
  numExperts,
  numExpertsPerTok: 4,
  swigluLimit: 7,
  initialContextLength: 4096,
});

// Qwen/Qwen3-30B-A3B's shape (and its 8-layer cut).
const QWEN3_30B_A3B: PresetShape = {
  architecture: 'Qwen3MoeForCausalLM',
  hiddenSize: 2048,
  intermediateSize: 6144,
  numLayers: 48,
  numHeads: 32,
  numKvHeads: 4,
  headDim: 128,
  vocabSize: 151936,
  maxPositionEmbeddings: 40960,
  rmsNormEps: 1e-6,
  ropeTheta: 1000000,
  ropeScaling: null,
  tieWordEmbeddings: false,
  slidingWindow: null,
  tokenizer: 'qwen3',
  defaultDtype: 'bf16',
  numExperts: 128,
  numExpertsPerTok: 8,
  moeIntermediateSize: 768,
  normTopkProb: true,
  decoderSparseStep: 1,
  mlpOnlyLayers: [],
};

export const PRESETS: Record<string, PresetShape> = {
  // ~3.4M params demo model.
  tiny: {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 256,
    intermediateSize: 688,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  // The tiny shape as Qwen3, with Qwen3's tokenizer features: a model that thinks and calls tools.
  'tiny-qwen3': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 256,
    intermediateSize: 688,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: SMALL_QWEN3_VOCAB,
    maxPositionEmbeddings: 4096,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'qwen3',
    defaultDtype: 'bf16',
  },
  'qwen2.5-0.5b': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 896,
    intermediateSize: 4864,
    numLayers: 24,
    numHeads: 14,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: 151936,
    maxPositionEmbeddings: 32768,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  'qwen3-0.6b': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 1024,
    intermediateSize: 3072,
    numLayers: 28,
    numHeads: 16,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 151936,
    maxPositionEmbeddings: 40960,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  'llama-3.2-1b': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 2048,
    intermediateSize: 8192,
    numLayers: 16,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 64,
    vocabSize: 128256,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-5,
    ropeTheta: 500000,
    ropeScaling: llama3Scaling(32, 8192),
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'llama3',
    defaultDtype: 'bf16',
  },
  'llama-3.1-8b': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 4096,
    intermediateSize: 14336,
    numLayers: 32,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 128256,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-5,
    ropeTheta: 500000,
    ropeScaling: llama3Scaling(8, 8192),
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'llama3',
    defaultDtype: 'bf16',
  },
  // Mistral-7B-v0.3 shape.
  'mistral-7b': {
    architecture: 'MistralForCausalLM',
    hiddenSize: 4096,
    intermediateSize: 14336,
    numLayers: 32,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 32768,
    maxPositionEmbeddings: 32768,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  // Qwen/Qwen3-30B-A3B: 128 experts, 8 per token; ~30.5B parameters, ~3.3B active.
  'qwen3-30b-a3b': QWEN3_30B_A3B,
  // Qwen3-30B-A3B's layers, 8 of its 48 (~5.6B parameters, 0.9B active): its decode per layer
  // on a GPU beside transformers (bench:engine in the device check) without writing 61 GB.
  'qwen3-30b-a3b-8l': { ...QWEN3_30B_A3B, numLayers: 8 },
  // mistralai/Mixtral-8x7B-v0.1: 8 experts of intermediate 14336, 2 per token; ~46.7B parameters.
  'mixtral-8x7b': {
    architecture: 'MixtralForCausalLM',
    hiddenSize: 4096,
    intermediateSize: 14336,
    numLayers: 32,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 32000,
    maxPositionEmbeddings: 32768,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
    numExperts: 8,
    numExpertsPerTok: 2,
  },
  // google/gemma-3-4b-it's text model, in its multimodal checkpoint's layout (text_config,
  // language_model.model.*) without the vision tower; ~3.88B parameters.
  'gemma-3-4b': {
    architecture: 'Gemma3ForConditionalGeneration',
    hiddenSize: 2560,
    intermediateSize: 10240,
    numLayers: 34,
    numHeads: 8,
    numKvHeads: 4,
    headDim: 256,
    vocabSize: 262208,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: { rope_type: 'linear', factor: 8 },
    tieWordEmbeddings: true,
    slidingWindow: 1024,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
    queryPreAttnScalar: 256,
    slidingWindowPattern: 6,
    ropeLocalBaseFreq: 10000,
    finalLogitSoftcapping: null,
    attnLogitSoftcapping: null,
  },
  // google/gemma-3-27b-it's text model, as gemma-3-4b; ~27.0B parameters.
  'gemma-3-27b': {
    architecture: 'Gemma3ForConditionalGeneration',
    hiddenSize: 5376,
    intermediateSize: 21504,
    numLayers: 62,
    numHeads: 32,
    numKvHeads: 16,
    headDim: 128,
    vocabSize: 262208,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: { rope_type: 'linear', factor: 8 },
    tieWordEmbeddings: true,
    slidingWindow: 1024,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
    queryPreAttnScalar: 168,
    slidingWindowPattern: 6,
    ropeLocalBaseFreq: 10000,
    finalLogitSoftcapping: null,
    attnLogitSoftcapping: null,
  },
  // openai/gpt-oss-20b: 32 experts (MXFP4-packed, as published), 4 per token; ~20.9B parameters,
  // ~3.6B active besides the embedding table (OpenAI's count; activeParamCount adds the table's 0.58B).
  'gpt-oss-20b': gptOss(24, 32),
  // openai/gpt-oss-120b: 128 experts; ~116.8B parameters, ~5.1B active besides the embedding table.
  'gpt-oss-120b': gptOss(36, 128),

  // ---- A mixture of experts and a dense model reading the same weight bytes per token (benchmarks). ----
  // 16 experts of 512, 2 per token: each token reads 2 * 3 * 1024 * 512 expert weights a layer,
  // as bench-moe-dense's MLP of 1024 does; ~222M parameters in all against ~46M dense.
  'bench-moe': {
    architecture: 'Qwen3MoeForCausalLM',
    hiddenSize: 1024,
    intermediateSize: 1024,
    numLayers: 8,
    numHeads: 16,
    numKvHeads: 8,
    headDim: 64,
    vocabSize: SMALL_QWEN3_VOCAB,
    maxPositionEmbeddings: 4096,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'qwen3',
    defaultDtype: 'bf16',
    numExperts: 16,
    numExpertsPerTok: 2,
    moeIntermediateSize: 512,
    normTopkProb: true,
    decoderSparseStep: 1,
    mlpOnlyLayers: [],
  },
  'bench-moe-dense': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 1024,
    intermediateSize: 1024,
    numLayers: 8,
    numHeads: 16,
    numKvHeads: 8,
    headDim: 64,
    vocabSize: SMALL_QWEN3_VOCAB,
    maxPositionEmbeddings: 4096,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'qwen3',
    defaultDtype: 'bf16',
  },

  // ---- Small variants for the float64 correctness suite (2 layers, vocab = tiny tokenizer). ----
  // llama3 rope scaling with original_max_position_embeddings 64: with theta 1e4 and head_dim 32,
  // frequencies 0-1 stay, 2-4 are interpolated, 5-15 are divided by the factor.
  'test-llama': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 128,
    intermediateSize: 352,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: llama3Scaling(8, 64),
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // Linear rope scaling, tied embeddings, 3 query heads sharing 1 kv head (MQA).
  'test-llama-linear': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 96,
    intermediateSize: 256,
    numLayers: 2,
    numHeads: 3,
    numKvHeads: 1,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: { rope_type: 'linear', factor: 4 },
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // q/k/v biases, tied, GQA 8:2 with head_dim 16.
  'test-qwen2': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 128,
    intermediateSize: 384,
    numLayers: 2,
    numHeads: 8,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // q_norm/k_norm, head_dim 48 != hidden/heads (32), untied.
  'test-qwen3': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 128,
    intermediateSize: 384,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 48,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  'test-mistral': {
    architecture: 'MistralForCausalLM',
    hiddenSize: 128,
    intermediateSize: 448,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // 8 experts, top-2 renormalised; layer 1 dense (mlp_only_layers) between two sparse ones;
  // expert intermediate 48 != the dense 128; q/k norms with head_dim 16 != hidden/heads (8), GQA 4:1.
  'test-qwen3-moe': {
    architecture: 'Qwen3MoeForCausalLM',
    hiddenSize: 64,
    intermediateSize: 128,
    numLayers: 3,
    numHeads: 8,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: SMALL_QWEN3_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'qwen3',
    defaultDtype: 'f32',
    numExperts: 8,
    numExpertsPerTok: 2,
    moeIntermediateSize: 48,
    normTopkProb: true,
    decoderSparseStep: 1,
    mlpOnlyLayers: [1],
  },
  // 4 experts of intermediate 96, top-2; every layer sparse.
  'test-mixtral': {
    architecture: 'MixtralForCausalLM',
    hiddenSize: 64,
    intermediateSize: 96,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
    numExperts: 4,
    numExpertsPerTok: 2,
  },
  // Pattern 2: layers 0 and 2 slide (window 8, local rope base 1e4), 1 and 3 are global (rope
  // base 1e6 with linear scaling 4); query_pre_attn_scalar 24 != head_dim 32 != hidden/heads 16;
  // tied. Override architecture to Gemma3ForConditionalGeneration for the multimodal layout.
  'test-gemma3': {
    architecture: 'Gemma3ForCausalLM',
    hiddenSize: 64,
    intermediateSize: 160,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: { rope_type: 'linear', factor: 4 },
    tieWordEmbeddings: true,
    slidingWindow: 8,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
    queryPreAttnScalar: 24,
    slidingWindowPattern: 2,
    ropeLocalBaseFreq: 10000,
    finalLogitSoftcapping: null,
    attnLogitSoftcapping: null,
  },
  // gpt-oss shrunk: layers 0 and 2 slide (window 8), 1 and 3 are global; YaRN as published over
  // 64 original positions (max_position_embeddings = factor * 64): with head_dim 16 and base 150000,
  // frequency pair 0 stays, pair 1 is ~2/3 interpolated, pairs 2-7 are divided by the factor;
  // 4 experts MXFP4-packed, top-2; attention biases and sinks; untied.
  'test-gpt-oss': {
    architecture: 'GptOssForCausalLM',
    hiddenSize: 64,
    intermediateSize: 64,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: SMALL_HARMONY_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 150000,
    ropeScaling: gptOssYarn(64),
    tieWordEmbeddings: false,
    slidingWindow: 8,
    tokenizer: 'harmony',
    defaultDtype: 'f32',
    numExperts: 4,
    numExpertsPerTok: 2,
    swigluLimit: 7,
    initialContextLength: 64,
  },
};

/** Qwen2.5-VL's vision tower and processor: the same in the 3B and 7B checkpoints (and 72B). */
const QWEN2_5_VL_VISION: Qwen25VisionShape = {
  architecture: 'Qwen2_5_VLForConditionalGeneration',
  depth: 32,
  hiddenSize: 1280,
  intermediateSize: 3420,
  numHeads: 16,
  patchSize: 14,
  temporalPatchSize: 2,
  spatialMergeSize: 2,
  windowSize: 112,
  fullattBlockIndexes: [7, 15, 23, 31],
  tokensPerSecond: 2,
  mropeSection: [16, 24, 24],
  maxWindowLayers: 28,
  minPixels: 3136,
  maxPixels: 12845056,
};

/** google/gemma-3-4b-it's SigLIP tower (So400m/14 at 896 pixels, without its pooling head) and projector. */
const GEMMA3_VISION: Gemma3VisionShape = {
  architecture: 'Gemma3ForConditionalGeneration',
  numLayers: 27,
  hiddenSize: 1152,
  intermediateSize: 4304,
  numHeads: 16,
  patchSize: 14,
  imageSize: 896,
  mmTokensPerImage: 256,
  layerNormEps: 1e-6,
};

/**
 * Vision-language checkpoints. Apart from PRESETS, which are the text checkpoints of the families
 * the engine serves (src/engine/architectures.ts): the maker writes these (make-model.ts's PRESETS
 * lists both), the engine refuses their architecture until it has a vision encoder.
 */
export const VISION_PRESETS: Record<string, PresetShape> = {
  // Qwen/Qwen2.5-VL-3B-Instruct: Qwen2.5-3B's decoder (tied) and the 32-block vision tower; ~3.75B parameters.
  'qwen2.5-vl-3b': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 2048,
    intermediateSize: 11008,
    numLayers: 36,
    numHeads: 16,
    numKvHeads: 2,
    headDim: 128,
    vocabSize: 151936,
    maxPositionEmbeddings: 128000,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: 32768,
    tokenizer: 'qwen2-vl',
    defaultDtype: 'bf16',
    vision: { ...QWEN2_5_VL_VISION, maxWindowLayers: 70 },
  },
  // Qwen/Qwen2.5-VL-7B-Instruct: Qwen2.5-7B's decoder (untied) and the same tower; ~8.29B parameters.
  'qwen2.5-vl-7b': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 3584,
    intermediateSize: 18944,
    numLayers: 28,
    numHeads: 28,
    numKvHeads: 4,
    headDim: 128,
    vocabSize: 152064,
    maxPositionEmbeddings: 128000,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: 32768,
    tokenizer: 'qwen2-vl',
    defaultDtype: 'bf16',
    vision: { ...QWEN2_5_VL_VISION, maxWindowLayers: 28 },
  },
  // Qwen2.5-VL shrunk: 4 vision blocks, block 1 full attention between windowed ones; windows of
  // 56 pixels = 2 x 2 merged tokens (4 x 4 patches), so an image of more than 56 x 56 pixels has
  // several; vision head_dim 16; decoder head_dim 32 with mrope_section [4, 6, 6]; GQA 4:2, untied;
  // images up to 50176 pixels (224 x 224: 256 patches, 64 decoder tokens).
  'test-qwen2.5-vl': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 128,
    intermediateSize: 384,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_QWEN2_VL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: 2048,
    tokenizer: 'qwen2-vl',
    defaultDtype: 'f32',
    vision: {
      ...QWEN2_5_VL_VISION,
      depth: 4,
      hiddenSize: 64,
      intermediateSize: 160,
      numHeads: 4,
      windowSize: 56,
      fullattBlockIndexes: [1],
      mropeSection: [4, 6, 6],
      maxWindowLayers: 2,
      maxPixels: 50176,
    },
  },
  // google/gemma-3-4b-it whole: gemma-3-4b's text model (with the image tokens in its tokenizer)
  // and the 27-layer SigLIP tower with its projector; ~4.30B parameters.
  'gemma-3-4b-vl': {
    ...PRESETS['gemma-3-4b']!,
    tokenizer: 'gemma3-vl',
    vision: GEMMA3_VISION,
  },
  // test-gemma3's text model (sliding layers with window 8, so an image of 4 tokens and its
  // markers cross a window edge) and a 2-layer tower of width 32 (head_dim 16): 56 x 56 pixel
  // images, 4 x 4 patches, pooled 2 x 2 into 4 tokens.
  'test-gemma3-vl': {
    ...PRESETS['test-gemma3']!,
    architecture: 'Gemma3ForConditionalGeneration',
    vocabSize: SMALL_GEMMA3_VL_VOCAB,
    tokenizer: 'gemma3-vl',
    vision: {
      ...GEMMA3_VISION,
      numLayers: 2,
      hiddenSize: 32,
      intermediateSize: 64,
      numHeads: 2,
      imageSize: 56,
      mmTokensPerImage: 4,
    },
  },
};

/** Preset merged with overrides, validated. Throws on unknown presets or inconsistent shapes. */
export function resolvePreset(preset: string, overrides: Partial<PresetShape> = {}): PresetShape {
  const base = Object.hasOwn(PRESETS, preset) ? PRESETS[preset] : Object.hasOwn(VISION_PRESETS, preset) ? VISION_PRESETS[preset] : undefined;
  if (!base) {
    throw new Error(`unknown preset "${preset}" (known: ${[...Object.keys(PRESETS), ...Object.keys(VISION_PRESETS)].join(', ')})`);
  }
  const s: PresetShape = { ...base, ...overrides };
  const positive: (keyof PresetShape)[] = [
    'hiddenSize', 'intermediateSize', 'numLayers', 'numHeads', 'numKvHeads', 'headDim',
    'vocabSize', 'maxPositionEmbeddings',
  ];
  for (const k of positive) {
    const v = s[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) {
      throw new Error(`preset field ${k} must be a positive integer, got ${String(v)}`);
    }
  }
  if (s.numHeads % s.numKvHeads !== 0) {
    throw new Error(`numHeads (${s.numHeads}) must be a multiple of numKvHeads (${s.numKvHeads})`);
  }
  if (s.headDim % 2 !== 0) throw new Error(`headDim must be even, got ${s.headDim}`);
  const spec = architectureSpec(s.architecture);
  if (!spec) throw new Error(`unknown architecture ${String(s.architecture)} (known: ${Object.keys(ARCHITECTURES).join(', ')})`);
  if (spec.mlp === 'moe') checkExperts(s, spec.moeLayout === 'qwen3_moe');
  if (spec.moeLayout === 'gpt_oss') checkGptOss(s);
  if (s.ropeScaling?.rope_type === 'yarn') checkYarn(s.ropeScaling);
  if (spec.gemmaNorms) {
    positiveInteger(s, 'slidingWindow');
    positiveInteger(s, 'slidingWindowPattern');
    for (const k of ['queryPreAttnScalar', 'ropeLocalBaseFreq'] as const) {
      if (typeof s[k] !== 'number' || !(s[k] > 0)) throw new Error(`preset field ${k} must be a positive number, got ${String(s[k])}`);
    }
  }
  if (s.vision) checkVision(s, s.vision);
  return s;
}

function checkVision(s: PresetShape, v: VisionShape): void {
  if (v.architecture === 'Gemma3ForConditionalGeneration') checkGemma3Vision(s, v);
  else if (v.architecture === 'Qwen2_5_VLForConditionalGeneration') checkQwen25Vision(s, v);
  else throw new Error(`unknown vision architecture ${String((v as { architecture: unknown }).architecture)}`);
}

/** A Gemma 3 shape: its multimodal text layout, and a tower whose patch grid pools evenly into the image's tokens. */
function checkGemma3Vision(s: PresetShape, v: Gemma3VisionShape): void {
  if (s.architecture !== v.architecture) throw new Error(`${v.architecture}'s vision tower needs its text model in the same layout, got ${s.architecture}`);
  if (s.tokenizer !== 'gemma3-vl') throw new Error(`${v.architecture} with images needs the gemma3-vl tokenizer (its image tokens), got ${s.tokenizer}`);
  const positive: (keyof Gemma3VisionShape)[] = ['numLayers', 'hiddenSize', 'intermediateSize', 'numHeads', 'patchSize', 'imageSize', 'mmTokensPerImage'];
  for (const k of positive) {
    const x = v[k];
    if (typeof x !== 'number' || !Number.isInteger(x) || x <= 0) throw new Error(`vision field ${k} must be a positive integer, got ${String(x)}`);
  }
  if (!(v.layerNormEps > 0)) throw new Error(`vision field layerNormEps must be a positive number, got ${String(v.layerNormEps)}`);
  if (v.hiddenSize % v.numHeads !== 0) throw new Error(`vision hiddenSize (${v.hiddenSize}) must be a multiple of numHeads (${v.numHeads})`);
  if (v.imageSize % v.patchSize !== 0) throw new Error(`vision imageSize (${v.imageSize}) must be a multiple of patchSize (${v.patchSize})`);
  const side = v.imageSize / v.patchSize;
  const tokensSide = Math.round(Math.sqrt(v.mmTokensPerImage));
  if (tokensSide * tokensSide !== v.mmTokensPerImage || side % tokensSide !== 0) {
    throw new Error(`vision mmTokensPerImage (${v.mmTokensPerImage}) must be a square whose side divides the ${side} x ${side} patches`);
  }
}

/** A Qwen2.5-VL shape: a Qwen2 decoder whose config has no head_dim, and a tower that windows and merges whole patches. */
function checkQwen25Vision(s: PresetShape, v: Qwen25VisionShape): void {
  if (s.architecture !== 'Qwen2ForCausalLM') throw new Error(`${v.architecture} has a Qwen2ForCausalLM decoder, got ${s.architecture}`);
  if (s.tokenizer !== 'qwen2-vl') throw new Error(`${v.architecture} needs the qwen2-vl tokenizer (its vision tokens), got ${s.tokenizer}`);
  if (s.headDim * s.numHeads !== s.hiddenSize) {
    throw new Error(`headDim (${s.headDim}) must be hiddenSize / numHeads (${s.hiddenSize} / ${s.numHeads}): the config has no head_dim`);
  }
  const positive: (keyof Qwen25VisionShape)[] = [
    'depth', 'hiddenSize', 'intermediateSize', 'numHeads', 'patchSize', 'temporalPatchSize', 'spatialMergeSize', 'windowSize',
    'tokensPerSecond', 'maxWindowLayers', 'minPixels', 'maxPixels',
  ];
  for (const k of positive) {
    const x = v[k];
    if (typeof x !== 'number' || !Number.isInteger(x) || x <= 0) throw new Error(`vision field ${k} must be a positive integer, got ${String(x)}`);
  }
  // Each head rotates half its dimensions by the patch row and half by the column.
  if (v.hiddenSize % v.numHeads !== 0 || (v.hiddenSize / v.numHeads) % 4 !== 0) {
    throw new Error(`vision hiddenSize / numHeads must be a multiple of 4, got ${v.hiddenSize} / ${v.numHeads}`);
  }
  const unit = v.patchSize * v.spatialMergeSize;
  if (v.windowSize % unit !== 0) throw new Error(`vision windowSize (${v.windowSize}) must be a multiple of patchSize * spatialMergeSize (${unit})`);
  for (const b of v.fullattBlockIndexes) {
    if (!Number.isInteger(b) || b < 0 || b >= v.depth) throw new Error(`vision fullattBlockIndexes holds ${b}, not a block index`);
  }
  const [t, h, w] = v.mropeSection;
  if (v.mropeSection.length !== 3 || ![t, h, w].every((x) => Number.isInteger(x) && x > 0) || t + h + w !== s.headDim / 2) {
    throw new Error(`vision mropeSection must be three positive integers summing to headDim / 2 (${s.headDim / 2}), got ${JSON.stringify(v.mropeSection)}`);
  }
  if (v.minPixels > v.maxPixels || v.minPixels < unit * unit) {
    throw new Error(`vision minPixels (${v.minPixels}) must hold one merged patch (${unit * unit}) and not exceed maxPixels (${v.maxPixels})`);
  }
}

function positiveInteger(s: PresetShape, k: keyof PresetShape): void {
  const v = s[k];
  if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) {
    throw new Error(`preset field ${k} must be a positive integer, got ${String(v)}`);
  }
}

function checkExperts(s: PresetShape, qwen3Moe: boolean): void {
  positiveInteger(s, 'numExperts');
  positiveInteger(s, 'numExpertsPerTok');
  if (s.numExpertsPerTok! > s.numExperts!) {
    throw new Error(`numExpertsPerTok (${s.numExpertsPerTok}) must not exceed numExperts (${s.numExperts})`);
  }
  if (!qwen3Moe) return;
  positiveInteger(s, 'moeIntermediateSize');
  if (s.decoderSparseStep !== undefined) positiveInteger(s, 'decoderSparseStep');
  for (const l of s.mlpOnlyLayers ?? []) {
    if (!Number.isInteger(l) || l < 0 || l >= s.numLayers) throw new Error(`mlpOnlyLayers holds ${l}, not a layer index`);
  }
}

function checkGptOss(s: PresetShape): void {
  // MXFP4 packs rows in blocks of 32: gate_up's rows are hidden_size long, down's intermediate_size.
  for (const k of ['hiddenSize', 'intermediateSize'] as const) {
    if (s[k] % 32 !== 0) throw new Error(`preset field ${k} must be a multiple of 32 (MXFP4 blocks), got ${s[k]}`);
  }
  positiveInteger(s, 'slidingWindow');
  if (s.initialContextLength !== undefined) positiveInteger(s, 'initialContextLength');
  if (typeof s.swigluLimit !== 'number' || !(s.swigluLimit > 0)) {
    throw new Error(`preset field swigluLimit must be a positive number, got ${String(s.swigluLimit)}`);
  }
}

function checkYarn(r: Extract<RopeScaling, { rope_type: 'yarn' }>): void {
  const { factor, beta_fast: fast, beta_slow: slow, original_max_position_embeddings: orig } = r;
  if (!(factor > 0) || !(fast > 0) || !(slow > 0) || !Number.isInteger(orig) || orig <= 0) {
    throw new Error(`yarn rope_scaling needs a positive factor, beta_fast, beta_slow and original_max_position_embeddings, got ${JSON.stringify(r)}`);
  }
}

/**
 * Whether layer `i` of a shape routes its tokens to experts (else it has a dense MLP of
 * intermediateSize): every layer of Mixtral and gpt-oss; Qwen3-MoE's layers on the
 * decoder_sparse_step outside mlp_only_layers.
 */
export function isSparseLayer(s: PresetShape, i: number): boolean {
  const spec = ARCHITECTURES[s.architecture];
  if (spec.mlp !== 'moe') return false;
  if (spec.moeLayout !== 'qwen3_moe') return true;
  return !(s.mlpOnlyLayers ?? []).includes(i) && (s.numExperts ?? 0) > 0 && (i + 1) % (s.decoderSparseStep ?? 1) === 0;
}

export function dtypeBytes(dtype: Dtype): number {
  return dtype === 'f32' ? 4 : 2;
}

export function safetensorsDtype(dtype: Dtype): 'F32' | 'F16' | 'BF16' {
  return dtype === 'f32' ? 'F32' : dtype === 'f16' ? 'F16' : 'BF16';
}

export function torchDtype(dtype: Dtype): 'float32' | 'float16' | 'bfloat16' {
  return dtype === 'f32' ? 'float32' : dtype === 'f16' ? 'float16' : 'bfloat16';
}
