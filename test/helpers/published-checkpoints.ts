// Random-weight checkpoints in the published layouts of Qwen3-MoE, Mixtral, Gemma 3 and gpt-oss:
// config.json with the published field set (dimensions shrunk) and model.safetensors with seeded
// random weights (gpt-oss: its experts MXFP4-packed in U8 tensors, as published).
// Written here from the published files' description, on purpose independent of the project's model
// maker (models/) and of src/: a checkpoint that code did not write, for its readers and the float64
// reference to meet. No tokenizer: tests feed token ids.

import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export type PublishedFamily = 'qwen3-moe' | 'mixtral' | 'gemma3' | 'gemma3-multimodal' | 'gpt-oss';

export const PUBLISHED_FAMILIES: readonly PublishedFamily[] = ['qwen3-moe', 'mixtral', 'gemma3', 'gemma3-multimodal', 'gpt-oss'];

export interface PublishedCheckpointOptions {
  /** vocab_size (default 2051, the project's small tokenizer); bos/eos ids sit at its top. */
  vocabSize?: number;
  /**
   * Stored dtype of the float tensors (default 'bf16', as published; bf16 is f32 rounded to nearest
   * even). gpt-oss's MXFP4 blocks and scales are U8 either way.
   */
  dtype?: 'f32' | 'bf16';
  /** PRNG seed (default 1); each tensor's values depend only on the seed and its name. */
  seed?: number;
  /**
   * Fields merged over the family's config (over text_config for gemma3-multimodal) before the
   * tensors are drawn, so shapes follow: e.g. { mlp_only_layers: [], decoder_sparse_step: 2 },
   * { layer_types: [...] }, { attn_logit_softcapping: 50 }. A field set to undefined is removed.
   */
  config?: Record<string, unknown>;
}

export interface PublishedCheckpoint {
  dir: string;
  /** config.json as written. */
  config: Record<string, any>;
  /** Every tensor name in model.safetensors, sorted. */
  tensorNames: string[];
}

/**
 * A tensor to write; data row-major, rounded to f32 first (then to bf16 when asked). dtype, when
 * set, overrides the file's float dtype for this tensor; 'u8' stores bytes (integers 0..255).
 */
export interface WrittenTensor {
  name: string;
  shape: number[];
  data: ArrayLike<number>;
  dtype?: 'f32' | 'bf16' | 'u8';
}

type Tensor = WrittenTensor;

/**
 * Write config.json and model.safetensors of a small random `family` model into `dir` (created if
 * needed). Deterministic: the same arguments give the same bytes.
 */
export function writePublishedCheckpoint(dir: string, family: PublishedFamily, opts: PublishedCheckpointOptions = {}): PublishedCheckpoint {
  const vocab = opts.vocabSize ?? 2051;
  const dtype = opts.dtype ?? 'bf16';
  const seed = opts.seed ?? 1;
  const ids = { bos: vocab - 3, eos: vocab - 1 };
  let config: Record<string, any>;
  let tensors: Tensor[];
  const draw = new Drawer(seed);
  if (family === 'qwen3-moe') {
    config = withOverrides(qwen3MoeConfig(vocab, ids), opts.config);
    tensors = qwen3MoeTensors(config, draw);
  } else if (family === 'mixtral') {
    config = withOverrides(mixtralConfig(vocab, ids), opts.config);
    tensors = mixtralTensors(config, draw);
  } else if (family === 'gemma3') {
    config = withOverrides(gemma3TextConfig(vocab, ids), opts.config);
    tensors = gemma3Tensors(config, 'model', draw);
  } else if (family === 'gemma3-multimodal') {
    config = gemma3MultimodalConfig(vocab, ids);
    config.text_config = withOverrides(config.text_config, opts.config);
    tensors = [...gemma3Tensors(config.text_config, 'language_model.model', draw), ...visionTensors(config.text_config.hidden_size, draw)];
  } else if (family === 'gpt-oss') {
    config = withOverrides(gptOssConfig(vocab, ids), opts.config);
    tensors = gptOssTensors(config, draw);
  } else {
    throw new Error(`writePublishedCheckpoint: unknown family ${family as string}`);
  }
  config.torch_dtype = dtype === 'bf16' ? 'bfloat16' : 'float32';
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2) + '\n');
  writeSafetensorsFile(join(dir, 'model.safetensors'), tensors, dtype);
  return { dir, config, tensorNames: tensors.map((t) => t.name).sort() };
}

function withOverrides(base: Record<string, any>, overrides: Record<string, unknown> = {}): Record<string, any> {
  const out = { ...base, ...overrides };
  for (const [k, v] of Object.entries(out)) if (v === undefined) delete out[k];
  return out;
}

// ---------------------------------------------------------------- configs (published field sets)

/** Qwen/Qwen3-30B-A3B's fields; 3 layers with layer 1 dense (mlp_only_layers), 8 experts, top 2. */
function qwen3MoeConfig(vocab: number, ids: { bos: number; eos: number }): Record<string, any> {
  return {
    architectures: ['Qwen3MoeForCausalLM'], attention_bias: false, attention_dropout: 0.0, bos_token_id: ids.bos,
    decoder_sparse_step: 1, eos_token_id: ids.eos, head_dim: 16, hidden_act: 'silu', hidden_size: 64,
    initializer_range: 0.02, intermediate_size: 96, max_position_embeddings: 4096, max_window_layers: 3,
    mlp_only_layers: [1], model_type: 'qwen3_moe', moe_intermediate_size: 32, norm_topk_prob: true,
    num_attention_heads: 4, num_experts: 8, num_experts_per_tok: 2, num_hidden_layers: 3, num_key_value_heads: 2,
    output_router_logits: false, rms_norm_eps: 1e-6, rope_scaling: null, rope_theta: 1000000.0,
    router_aux_loss_coef: 0.001, sliding_window: null, tie_word_embeddings: false, torch_dtype: 'bfloat16',
    transformers_version: '4.51.0', use_cache: true, use_sliding_window: false, vocab_size: vocab,
  };
}

/** mistralai/Mixtral-8x7B-v0.1's fields (no head_dim: hidden / heads = 16); 2 layers, 4 experts, top 2. */
function mixtralConfig(vocab: number, ids: { bos: number; eos: number }): Record<string, any> {
  return {
    architectures: ['MixtralForCausalLM'], attention_dropout: 0.0, bos_token_id: ids.bos, eos_token_id: ids.eos,
    hidden_act: 'silu', hidden_size: 64, initializer_range: 0.02, intermediate_size: 64, max_position_embeddings: 4096,
    model_type: 'mixtral', num_attention_heads: 4, num_experts_per_tok: 2, num_hidden_layers: 2, num_key_value_heads: 2,
    num_local_experts: 4, output_router_logits: false, rms_norm_eps: 1e-5, rope_theta: 1000000.0,
    router_aux_loss_coef: 0.02, sliding_window: null, tie_word_embeddings: false, torch_dtype: 'bfloat16',
    transformers_version: '4.36.0.dev0', use_cache: true, vocab_size: vocab,
  };
}

/**
 * google/gemma-3-1b-it's fields (Gemma3ForCausalLM), layer_types absent: 4 layers, every 2nd full
 * attention (layers 1 and 3), the others a window of 8.
 */
function gemma3TextConfig(vocab: number, ids: { bos: number; eos: number }): Record<string, any> {
  return {
    architectures: ['Gemma3ForCausalLM'], attention_bias: false, attention_dropout: 0.0, attn_logit_softcapping: null,
    bos_token_id: ids.bos, cache_implementation: 'hybrid', eos_token_id: [ids.bos, ids.eos], final_logit_softcapping: null,
    head_dim: 16, hidden_activation: 'gelu_pytorch_tanh', hidden_size: 64, initializer_range: 0.02, intermediate_size: 128,
    max_position_embeddings: 4096, model_type: 'gemma3_text', num_attention_heads: 4, num_hidden_layers: 4,
    num_key_value_heads: 1, pad_token_id: 0, query_pre_attn_scalar: 16, rms_norm_eps: 1e-6, rope_local_base_freq: 10000,
    rope_scaling: null, rope_theta: 1000000, sliding_window: 8, sliding_window_pattern: 2, torch_dtype: 'bfloat16',
    transformers_version: '4.50.0.dev0', use_cache: true, vocab_size: vocab,
  };
}

/**
 * google/gemma-3-4b-it's layout (Gemma3ForConditionalGeneration): a sparse text_config that leaves
 * rope_theta, rope_local_base_freq, sliding_window_pattern (6), rms_norm_eps and hidden_activation
 * to Gemma3TextConfig's defaults, linear rope scaling x8 on the full layers, and like 27b a
 * query_pre_attn_scalar (24) other than head_dim (16). 6 layers: 0-4 sliding (window 8), 5 full.
 */
function gemma3MultimodalConfig(vocab: number, ids: { bos: number; eos: number }): Record<string, any> {
  return {
    architectures: ['Gemma3ForConditionalGeneration'], boi_token_index: ids.bos, eoi_token_index: ids.bos + 1,
    eos_token_id: [ids.bos, ids.eos], image_token_index: ids.eos, initializer_range: 0.02, mm_tokens_per_image: 4,
    model_type: 'gemma3',
    text_config: {
      head_dim: 16, hidden_size: 64, intermediate_size: 128, model_type: 'gemma3_text', num_attention_heads: 4,
      num_hidden_layers: 6, num_key_value_heads: 2, query_pre_attn_scalar: 24,
      rope_scaling: { factor: 8.0, rope_type: 'linear' }, sliding_window: 8, vocab_size: vocab,
    },
    torch_dtype: 'bfloat16', transformers_version: '4.50.0.dev0',
    vision_config: {
      hidden_size: 8, image_size: 8, intermediate_size: 16, model_type: 'siglip_vision_model', num_attention_heads: 2,
      num_hidden_layers: 1, patch_size: 4, vision_use_head: false,
    },
  };
}

/**
 * openai/gpt-oss-20b's fields: 4 layers (layer_types alternating sliding / full, window 8), 4
 * experts, top 2, 4 heads over 2 kv heads of 16. YaRN as published (factor 32, beta 32 / 1,
 * truncate false) over original_max_position_embeddings 128: with head_dim 16 and base 150000 the
 * ramp then runs over the first three frequency pairs (pair 1 about half interpolated);
 * max_position_embeddings is factor * that, so the transformers versions that take the factor from
 * their ratio agree.
 */
function gptOssConfig(vocab: number, ids: { bos: number; eos: number }): Record<string, any> {
  const layers = 4;
  return {
    architectures: ['GptOssForCausalLM'], attention_bias: true, attention_dropout: 0.0, eos_token_id: ids.eos,
    experts_per_token: 2, head_dim: 16, hidden_act: 'silu', hidden_size: 64, initial_context_length: 128,
    initializer_range: 0.02, intermediate_size: 64,
    layer_types: Array.from({ length: layers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention')),
    max_position_embeddings: 4096, model_type: 'gpt_oss', num_attention_heads: 4, num_experts_per_tok: 2,
    num_hidden_layers: layers, num_key_value_heads: 2, num_local_experts: 4, output_router_logits: false, pad_token_id: ids.eos - 1,
    quantization_config: {
      modules_to_not_convert: ['model.layers.*.self_attn', 'model.layers.*.mlp.router', 'model.embed_tokens', 'lm_head'],
      quant_method: 'mxfp4',
    },
    rms_norm_eps: 1e-5,
    rope_scaling: { beta_fast: 32.0, beta_slow: 1.0, factor: 32.0, original_max_position_embeddings: 128, rope_type: 'yarn', truncate: false },
    rope_theta: 150000, router_aux_loss_coef: 0.9, sliding_window: 8, swiglu_limit: 7.0, tie_word_embeddings: false,
    torch_dtype: 'bfloat16', transformers_version: '4.55.0.dev0', use_cache: true, vocab_size: vocab,
  };
}

// ---------------------------------------------------------------- tensors

function attention(c: Record<string, any>, p: string, draw: Drawer, qkNorm: 'none' | 'near-one' | 'near-zero'): Tensor[] {
  const h = c.hidden_size as number;
  const d = (c.head_dim ?? h / c.num_attention_heads) as number;
  const out = [
    draw.matrix(`${p}.self_attn.q_proj.weight`, c.num_attention_heads * d, h),
    draw.matrix(`${p}.self_attn.k_proj.weight`, c.num_key_value_heads * d, h),
    draw.matrix(`${p}.self_attn.v_proj.weight`, c.num_key_value_heads * d, h),
    draw.matrix(`${p}.self_attn.o_proj.weight`, h, c.num_attention_heads * d),
  ];
  if (qkNorm !== 'none') {
    out.push(draw.norm(`${p}.self_attn.q_norm.weight`, d, qkNorm === 'near-one' ? 1 : 0));
    out.push(draw.norm(`${p}.self_attn.k_norm.weight`, d, qkNorm === 'near-one' ? 1 : 0));
  }
  return out;
}

const gated = (p: string, names: [string, string, string], inter: number, h: number, draw: Drawer): Tensor[] => [
  draw.matrix(`${p}.${names[0]}.weight`, inter, h),
  draw.matrix(`${p}.${names[1]}.weight`, inter, h),
  draw.matrix(`${p}.${names[2]}.weight`, h, inter),
];

/** Embeddings, final norm and (untied) lm_head around the layers. */
function outer(c: Record<string, any>, prefix: string, draw: Drawer, normMean: number, embedStd: number): Tensor[] {
  const h = c.hidden_size as number;
  const out = [draw.normal(`${prefix}.embed_tokens.weight`, [c.vocab_size, h], 0, embedStd), draw.norm(`${prefix}.norm.weight`, h, normMean)];
  if (!(c.tie_word_embeddings ?? true)) out.push(draw.normal('lm_head.weight', [c.vocab_size, h], 0, LM_HEAD_GAIN / Math.sqrt(h)));
  return out;
}

/** lm_head (and Gemma's tied embedding) rows scaled up from 1/sqrt(hidden) so logits spread over a few units. */
const LM_HEAD_GAIN = 3;
/** Gemma's final norm weight, stored (the model multiplies by 1 + w): a gain of about 10. */
const GEMMA_FINAL_NORM = 9;

function qwen3MoeTensors(c: Record<string, any>, draw: Drawer): Tensor[] {
  const h = c.hidden_size as number;
  const out = outer(c, 'model', draw, 1, 1);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}`;
    out.push(draw.norm(`${p}.input_layernorm.weight`, h, 1), draw.norm(`${p}.post_attention_layernorm.weight`, h, 1));
    out.push(...attention(c, p, draw, 'near-one'));
    const sparse = !(c.mlp_only_layers ?? []).includes(i) && c.num_experts > 0 && (i + 1) % (c.decoder_sparse_step ?? 1) === 0;
    if (!sparse) {
      out.push(...gated(`${p}.mlp`, ['gate_proj', 'up_proj', 'down_proj'], c.intermediate_size, h, draw));
      continue;
    }
    out.push(draw.matrix(`${p}.mlp.gate.weight`, c.num_experts, h));
    for (let e = 0; e < c.num_experts; e++) {
      out.push(...gated(`${p}.mlp.experts.${e}`, ['gate_proj', 'up_proj', 'down_proj'], c.moe_intermediate_size, h, draw));
    }
  }
  return out;
}

function mixtralTensors(c: Record<string, any>, draw: Drawer): Tensor[] {
  const h = c.hidden_size as number;
  const out = outer(c, 'model', draw, 1, 1);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}`;
    out.push(draw.norm(`${p}.input_layernorm.weight`, h, 1), draw.norm(`${p}.post_attention_layernorm.weight`, h, 1));
    out.push(...attention(c, p, draw, 'none'));
    out.push(draw.matrix(`${p}.block_sparse_moe.gate.weight`, c.num_local_experts, h));
    for (let e = 0; e < c.num_local_experts; e++) {
      // w1: gate, w3: up, w2: down.
      out.push(...gated(`${p}.block_sparse_moe.experts.${e}`, ['w1', 'w3', 'w2'], c.intermediate_size, h, draw));
    }
  }
  return out;
}

/**
 * Gemma 3 text tensors under `prefix` (model, or language_model.model). Stored norm weights are
 * near 0, as the model multiplies by (1 + w), except the final norm's, near GEMMA_FINAL_NORM. The
 * tied embedding is small (about 0.3 per element after the sqrt(hidden) scale) so that a token's
 * own row does not dominate its logits; the final norm's gain then spreads them over a few units.
 */
function gemma3Tensors(c: Record<string, any>, prefix: string, draw: Drawer): Tensor[] {
  const h = c.hidden_size as number;
  const out = outer({ ...c, tie_word_embeddings: true }, prefix, draw, GEMMA_FINAL_NORM, 0.3 / Math.sqrt(h));
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `${prefix}.layers.${i}`;
    for (const n of ['input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm', 'post_feedforward_layernorm']) {
      out.push(draw.norm(`${p}.${n}.weight`, h, 0));
    }
    out.push(...attention(c, p, draw, 'near-zero'));
    out.push(...gated(`${p}.mlp`, ['gate_proj', 'up_proj', 'down_proj'], c.intermediate_size, h, draw));
  }
  return out;
}

/**
 * gpt-oss: attention with all four biases and per-head sinks, a biased router, and experts packed
 * MXFP4 (gptOssExperts). Sinks N(0, 0.5): a share of each head's attention, not most of it.
 */
function gptOssTensors(c: Record<string, any>, draw: Drawer): Tensor[] {
  const h = c.hidden_size as number;
  const heads = c.num_attention_heads as number;
  const out = outer(c, 'model', draw, 1, 1);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}`;
    out.push(draw.norm(`${p}.input_layernorm.weight`, h, 1), draw.norm(`${p}.post_attention_layernorm.weight`, h, 1));
    out.push(...attention(c, p, draw, 'none'));
    const kv = c.num_key_value_heads * c.head_dim;
    out.push(
      draw.normal(`${p}.self_attn.q_proj.bias`, [heads * c.head_dim], 0, 0.2),
      draw.normal(`${p}.self_attn.k_proj.bias`, [kv], 0, 0.2),
      draw.normal(`${p}.self_attn.v_proj.bias`, [kv], 0, 0.2),
      draw.normal(`${p}.self_attn.o_proj.bias`, [h], 0, 0.2),
      draw.normal(`${p}.self_attn.sinks`, [heads], 0, 0.5),
      draw.matrix(`${p}.mlp.router.weight`, c.num_local_experts, h),
      draw.normal(`${p}.mlp.router.bias`, [c.num_local_experts], 0, 0.5),
    );
    out.push(...gptOssExperts(c, `${p}.mlp.experts`, draw));
  }
  return out;
}

/**
 * MXFP4 experts: for each of gate_up [E, 2I, H] and down [E, H, I] (as [out, in]), blocks
 * [E, rows, cols / 32, 16] of uniformly random bytes (two FP4 e2m1 nibbles each, RMS about 2.9)
 * and one scale byte per block, 2^(s - 127). gate_up's scales (123..125) put the gate's and up's
 * spread near the clamp limit, so some values pass it; down's (119..121) keep its output near
 * unit size. Biases N(0, 0.5).
 */
function gptOssExperts(c: Record<string, any>, p: string, draw: Drawer): Tensor[] {
  const e = c.num_local_experts as number;
  const h = c.hidden_size as number;
  const inter = c.intermediate_size as number;
  if (h % 32 !== 0 || inter % 32 !== 0) throw new Error('gpt-oss: hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)');
  const packed = (name: string, rows: number, cols: number, scaleLo: number, scaleHi: number): Tensor[] => [
    draw.bytes(`${p}.${name}_blocks`, [e, rows, cols / 32, 16], 0, 255),
    draw.bytes(`${p}.${name}_scales`, [e, rows, cols / 32], scaleLo, scaleHi),
  ];
  return [
    ...packed('gate_up_proj', 2 * inter, h, 123, 125),
    draw.normal(`${p}.gate_up_proj_bias`, [e, 2 * inter], 0, 0.5),
    ...packed('down_proj', h, inter, 119, 121),
    draw.normal(`${p}.down_proj_bias`, [e, h], 0, 0.5),
  ];
}

/** A few small vision-side tensors of the multimodal layout, for readers to skip. */
function visionTensors(textHidden: number, draw: Drawer): Tensor[] {
  return [
    draw.normal('vision_tower.vision_model.embeddings.patch_embedding.weight', [8, 3, 4, 4], 0, 0.1),
    draw.normal('vision_tower.vision_model.embeddings.patch_embedding.bias', [8], 0, 0.1),
    draw.normal('vision_tower.vision_model.post_layernorm.weight', [8], 1, 0.1),
    draw.normal('multi_modal_projector.mm_input_projection_weight', [8, textHidden], 0, 0.1),
    draw.normal('multi_modal_projector.mm_soft_emb_norm.weight', [8], 0, 0.1),
  ];
}

// ---------------------------------------------------------------- seeded values

/** Normal values from mulberry32 streams, one stream per (seed, tensor name). */
class Drawer {
  constructor(private readonly seed: number) {}

  normal(name: string, shape: number[], mean: number, std: number): Tensor {
    const n = shape.reduce((a, b) => a * b, 1);
    const next = mulberry32(hashName(name, this.seed));
    const data = new Float32Array(n);
    for (let i = 0; i < n; i += 2) {
      // Box-Muller: two standard normals from two uniforms in (0, 1].
      const r = Math.sqrt(-2 * Math.log(1 - next()));
      const a = 2 * Math.PI * next();
      data[i] = mean + std * r * Math.cos(a);
      if (i + 1 < n) data[i + 1] = mean + std * r * Math.sin(a);
    }
    return { name, shape, data };
  }

  /** A [rows, cols] projection, N(0, 1 / sqrt(cols)). */
  matrix(name: string, rows: number, cols: number): Tensor {
    return this.normal(name, [rows, cols], 0, 1 / Math.sqrt(cols));
  }

  /** Uniform integers in [lo, hi], stored as U8. */
  bytes(name: string, shape: number[], lo: number, hi: number): Tensor {
    const n = shape.reduce((a, b) => a * b, 1);
    const next = mulberry32(hashName(name, this.seed));
    const data = new Uint8Array(n);
    for (let i = 0; i < n; i++) data[i] = lo + Math.floor(next() * (hi - lo + 1));
    return { name, shape, data, dtype: 'u8' };
  }

  /** A norm weight, N(mean, 0.1). */
  norm(name: string, size: number, mean: number): Tensor {
    return this.normal(name, [size], mean, 0.1);
  }
}

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** FNV-1a of the name's UTF-16 units, started from the seed. */
function hashName(name: string, seed: number): number {
  let h = (0x811c9dc5 ^ Math.imul(seed, 0x9e3779b1)) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

// ---------------------------------------------------------------- safetensors

/** f32 bits -> bf16 bits, rounding to nearest even (inputs are finite). */
function toBf16(v: Float32Array): Uint16Array {
  const bits = new Uint32Array(v.buffer, v.byteOffset, v.length);
  const out = new Uint16Array(v.length);
  for (let i = 0; i < v.length; i++) out[i] = (bits[i]! + 0x7fff + ((bits[i]! >>> 16) & 1)) >>> 16;
  return out;
}

/**
 * Write one .safetensors file: an 8-byte little-endian header length, a JSON header (name -> dtype,
 * shape, [begin, end) byte offsets into the data; names sorted; padded with spaces to a multiple
 * of 8 bytes), then the little-endian data of each tensor in header order. Float tensors are
 * stored as `dtype` unless they name their own; 'u8' tensors as U8 bytes.
 */
export function writeSafetensorsFile(path: string, tensors: WrittenTensor[], dtype: 'f32' | 'bf16'): void {
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  const chunks: Uint8Array[] = [];
  let offset = 0;
  for (const t of sorted) {
    if (Object.hasOwn(header, t.name)) throw new Error(`writeSafetensorsFile: duplicate tensor ${t.name}`);
    const numel = t.shape.reduce((a, b) => a * b, 1);
    if (t.data.length !== numel) throw new Error(`writeSafetensorsFile: ${t.name} has ${t.data.length} values for shape [${t.shape}]`);
    const stored = t.dtype ?? dtype;
    let bytes: Uint8Array;
    if (stored === 'u8') {
      for (let i = 0; i < numel; i++) {
        const v = t.data[i]!;
        if (!Number.isInteger(v) || v < 0 || v > 255) throw new Error(`writeSafetensorsFile: ${t.name}[${i}] = ${v} is not a byte`);
      }
      bytes = Uint8Array.from(t.data);
    } else {
      const f32 = Float32Array.from(t.data);
      const raw = stored === 'bf16' ? toBf16(f32) : f32;
      // Typed arrays are little-endian on every platform Node runs on.
      bytes = new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength);
    }
    const names = { u8: 'U8', bf16: 'BF16', f32: 'F32' } as const;
    header[t.name] = { dtype: names[stored], shape: t.shape, data_offsets: [offset, offset + bytes.length] };
    chunks.push(bytes);
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  writeFileSync(path, Buffer.concat([len, Buffer.from(json), ...chunks]));
}
