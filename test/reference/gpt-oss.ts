// gpt-oss (GptOssForCausalLM) in the float64 reference, following transformers' modeling_gpt_oss:
// its config (GptOssConfig's defaults, layer_types, YaRN rope), and its experts as published:
// MXFP4-packed gate_up and down matrices, unpacked here exactly. The forward pass itself is the
// shared one of reference-model.ts (attention biases, sinks) and moe.ts (routing, clamped SwiGLU).

import type { RefRopeScaling } from './math.js';
import type { RefMoeConfig, ReferenceMoe } from './moe.js';
import type { ReferenceConfig } from './reference-model.js';
import type { RefTensor } from './safetensors-reader.js';

export const GPT_OSS_ARCHITECTURE = 'GptOssForCausalLM';

/** FP4 e2m1 value of each nibble 0..15 (bit 3 the sign, then 2 exponent bits and 1 mantissa bit). */
export const FP4_E2M1_VALUES: readonly number[] = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

/** Values per MXFP4 block, sharing one scale; a block is 16 bytes of two nibbles each. */
export const MXFP4_BLOCK = 32;

/** GptOssConfig's defaults, for fields a config.json leaves out. */
const DEFAULTS = {
  num_hidden_layers: 36, num_local_experts: 128, vocab_size: 201088, hidden_size: 2880, intermediate_size: 2880,
  head_dim: 64, num_attention_heads: 64, num_key_value_heads: 8, sliding_window: 128, rope_theta: 150000,
  tie_word_embeddings: false, max_position_embeddings: 131072, rms_norm_eps: 1e-5, num_experts_per_tok: 4,
  rope_scaling: { rope_type: 'yarn', factor: 32.0, beta_fast: 32.0, beta_slow: 1.0, truncate: false } as RefRopeScaling,
  layer_types: null as string[] | null,
  // transformers' GptOssExperts hard-codes 7.0; published configs carry it as swiglu_limit.
  swiglu_limit: 7.0,
};

export function parseGptOssConfig(raw: Record<string, any>): ReferenceConfig {
  const c = { ...DEFAULTS, ...raw } as Record<string, any>;
  if ((c.hidden_act ?? 'silu') !== 'silu') throw new Error(`reference: hidden_act ${c.hidden_act}`);
  const numLayers = c.num_hidden_layers as number;
  // Without layer_types, the even layers slide and the odd ones attend to everything.
  const layerTypes: string[] = c.layer_types ?? Array.from({ length: numLayers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention'));
  if (layerTypes.length !== numLayers) throw new Error(`reference: ${layerTypes.length} layer_types for ${numLayers} layers`);
  const window = layerTypes.map((type) => {
    if (type === 'full_attention') return null;
    if (type === 'sliding_attention') return c.sliding_window as number;
    throw new Error(`reference: layer type ${type}`);
  });
  // Without original_max_position_embeddings, transformers' YaRN counts rotations over max_position_embeddings.
  const rope: RefRopeScaling | null = c.rope_scaling
    ? { original_max_position_embeddings: c.max_position_embeddings, ...c.rope_scaling }
    : null;
  const moe: RefMoeConfig = {
    numExperts: c.num_local_experts,
    topK: c.num_experts_per_tok,
    normTopK: true,
    expertIntermediateSize: c.intermediate_size,
    sparseLayers: new Array<boolean>(numLayers).fill(true),
    routing: 'topk-softmax',
    swigluLimit: c.swiglu_limit,
  };
  const headDim = c.head_dim as number;
  return {
    architecture: GPT_OSS_ARCHITECTURE,
    modelType: c.model_type,
    hiddenSize: c.hidden_size,
    intermediateSize: c.intermediate_size,
    numLayers,
    numHeads: c.num_attention_heads,
    numKvHeads: c.num_key_value_heads,
    headDim,
    vocabSize: c.vocab_size,
    rmsNormEps: c.rms_norm_eps,
    ropeTheta: c.rope_theta,
    ropeScaling: rope,
    ropeLocalTheta: null,
    tieWordEmbeddings: c.tie_word_embeddings,
    slidingWindow: window,
    attnScale: 1 / Math.sqrt(headDim),
    normOffset: 0,
    embedScale: 1,
    hiddenAct: 'silu',
    attnSoftcap: null,
    finalSoftcap: null,
    // GptOssConfig sets attention_bias = True whatever config.json says.
    qkvBias: true,
    oBias: true,
    mlpBias: false,
    qkNorm: false,
    attnSinks: true,
    moe,
  };
}

/**
 * MXFP4 to values: blocks [...rows, G, 16] (U8) and scales [...rows, G] (U8, e8m0) give
 * [...rows, G * 32] row-major. In block g of a row, value 2j is byte j's low nibble and 2j+1 its
 * high nibble, each FP4_E2M1_VALUES[nibble] * 2^(scale - 127). Exact in float64.
 */
export function unpackMxfp4(blocks: RefTensor, scales: RefTensor): Float64Array {
  const rank = blocks.shape.length;
  if (rank < 2 || blocks.shape[rank - 1] !== MXFP4_BLOCK / 2) throw new Error(`mxfp4: blocks of shape [${blocks.shape}]`);
  if (scales.shape.length !== rank - 1 || scales.shape.some((d, i) => d !== blocks.shape[i])) {
    throw new Error(`mxfp4: scales [${scales.shape}] do not match blocks [${blocks.shape}]`);
  }
  if (blocks.dtype !== 'U8' || scales.dtype !== 'U8') throw new Error(`mxfp4: blocks ${blocks.dtype} and scales ${scales.dtype}, expected U8`);
  const numBlocks = scales.data.length;
  const out = new Float64Array(numBlocks * MXFP4_BLOCK);
  for (let b = 0; b < numBlocks; b++) {
    const scale = 2 ** (scales.data[b]! - 127);
    for (let j = 0; j < MXFP4_BLOCK / 2; j++) {
      const byte = blocks.data[b * (MXFP4_BLOCK / 2) + j]!;
      out[b * MXFP4_BLOCK + 2 * j] = FP4_E2M1_VALUES[byte & 0x0f]! * scale;
      out[b * MXFP4_BLOCK + 2 * j + 1] = FP4_E2M1_VALUES[byte >> 4]! * scale;
    }
  }
  return out;
}

/** Reads a tensor by name, checking its shape. */
export type TensorGetter = (name: string, shape: number[]) => RefTensor;

/**
 * One layer's router and experts from model.layers.{i}.mlp.*: gate_up unpacked is [E, 2I, H]
 * ([out, in]) with gate rows at even indices and up rows at odd ones (its bias likewise), down
 * [E, H, I]; the experts come back with gate and up split apart.
 */
export function loadGptOssMoe(get: TensorGetter, layerPrefix: string, cfg: RefMoeConfig, hidden: number): ReferenceMoe {
  const p = `${layerPrefix}.mlp`;
  const e = cfg.numExperts;
  const inter = cfg.expertIntermediateSize;
  if (hidden % MXFP4_BLOCK !== 0 || inter % MXFP4_BLOCK !== 0) throw new Error(`mxfp4: hidden ${hidden} and intermediate ${inter} must be multiples of 32`);
  const packed = (name: string, rows: number, cols: number) => {
    const blocks = get(`${p}.experts.${name}_blocks`, [e, rows, cols / MXFP4_BLOCK, MXFP4_BLOCK / 2]);
    return unpackMxfp4(blocks, get(`${p}.experts.${name}_scales`, [e, rows, cols / MXFP4_BLOCK]));
  };
  const gateUp = packed('gate_up_proj', 2 * inter, hidden); // [E, 2I, H]
  const gateUpBias = get(`${p}.experts.gate_up_proj_bias`, [e, 2 * inter]).data;
  const down = packed('down_proj', hidden, inter); // [E, H, I]
  const downBias = get(`${p}.experts.down_proj_bias`, [e, hidden]).data;
  const rowsOf = (expert: number, parity: 0 | 1) => {
    const w = new Float64Array(inter * hidden);
    const b = new Float64Array(inter);
    for (let r = 0; r < inter; r++) {
      const src = expert * 2 * inter + 2 * r + parity;
      w.set(gateUp.subarray(src * hidden, (src + 1) * hidden), r * hidden);
      b[r] = gateUpBias[src]!;
    }
    return { w, b, out: inter, in: hidden };
  };
  const experts = Array.from({ length: e }, (_, x) => ({
    gate: rowsOf(x, 0),
    up: rowsOf(x, 1),
    down: { w: down.subarray(x * hidden * inter, (x + 1) * hidden * inter), b: downBias.subarray(x * hidden, (x + 1) * hidden), out: hidden, in: inter },
  }));
  const router = { w: get(`${p}.router.weight`, [e, hidden]).data, b: get(`${p}.router.bias`, [e]).data, out: e, in: hidden };
  return { router, experts };
}
