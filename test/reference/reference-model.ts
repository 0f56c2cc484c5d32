// A plain, slow, float64 forward pass of Llama / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral /
// Gemma 3 / gpt-oss decoder models, following transformers' semantics. Independent of models/ and
// src/: it reads config.json and the safetensors files itself. Meant for small test models (all
// weights live as Float64Array). The math is in math.ts, the mixture-of-experts MLP in moe.ts,
// gpt-oss's config and MXFP4 experts in gpt-oss.ts, FP8 and AWQ / GPTQ checkpoints' dequantization
// in fp8.ts and int4.ts.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  type Linear,
  type RefActivation,
  type RefRopeScaling,
  applyRope,
  argmax,
  gatedMlp,
  logSoftmax,
  logitsTopGap,
  matvec,
  rmsNorm,
  ropeAttentionFactor,
  ropeInvFreq,
  softcap,
  softmax,
} from './math.js';
import { GPT_OSS_ARCHITECTURE, loadGptOssMoe, parseGptOssConfig } from './gpt-oss.js';
import { type MoeArchitecture, type RefMoeConfig, type ReferenceMoe, isMoeArchitecture, loadMoe, moeForward, parseMoeConfig } from './moe.js';
import { dequantizeFp8 } from './fp8.js';
import { dequantizeAwqGptq } from './int4.js';
import { type RefTensor, readSafetensorsDir } from './safetensors-reader.js';

export type { GatedMlp, Linear, RefActivation, RefRopeScaling } from './math.js';
export type { RefMoeConfig, ReferenceMoe } from './moe.js';
export {
  applyRope, argmax, clampedSwigluMlp, geluTanh, gatedMlp, logSoftmax, logitsTopGap, matvec, rmsNorm, ropeAttentionFactor, ropeInvFreq,
  silu, softcap, softmax,
} from './math.js';
export { routeTopK, routeTopKThenSoftmax } from './moe.js';
export { FP4_E2M1_VALUES, unpackMxfp4 } from './gpt-oss.js';

export interface ReferenceConfig {
  architecture: string;
  modelType: string;
  hiddenSize: number;
  /** The dense MLP's intermediate size (Mixtral: each expert's). */
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  /** Rope base (Gemma: of the full-attention layers; rope_scaling applies there only). */
  ropeTheta: number;
  ropeScaling: RefRopeScaling | null;
  /** Gemma: rope base of the sliding layers (rope_local_base_freq, never scaled); null elsewhere. */
  ropeLocalTheta: number | null;
  tieWordEmbeddings: boolean;
  /** Per layer: attention window (keys j with j > i - window), or null for full causal. */
  slidingWindow: (number | null)[];
  /** Attention scores are q.k * attnScale: 1 / sqrt(head_dim); Gemma: query_pre_attn_scalar ** -0.5. */
  attnScale: number;
  /** Every RMSNorm multiplies by (normOffset + w): 0, or 1 for Gemma's (1 + w). */
  normOffset: number;
  /** The embedding row is multiplied by this: 1; Gemma: sqrt(hidden_size). */
  embedScale: number;
  hiddenAct: RefActivation;
  /** Gemma: scores = tanh(scores / cap) * cap before the softmax; null = none. */
  attnSoftcap: number | null;
  /** Gemma: logits = tanh(logits / cap) * cap; null = none. */
  finalSoftcap: number | null;
  qkvBias: boolean;
  oBias: boolean;
  mlpBias: boolean;
  /** q and k RMS-normalised per head before rope (Qwen3, Qwen3-MoE, Gemma 3). */
  qkNorm: boolean;
  /**
   * gpt-oss: each head has a learned sink logit (self_attn.sinks) that joins its softmax and whose
   * probability is dropped, so the weights on the values sum to less than 1.
   */
  attnSinks: boolean;
  /** Qwen3-MoE, Mixtral and gpt-oss; null for dense families. */
  moe: RefMoeConfig | null;
}

/**
 * One decoder layer. post_attention_layernorm (postNorm) has two roles: without sandwich norms it
 * is the MLP's input norm; with them (Gemma: preFeedforwardNorm and postFeedforwardNorm set) it
 * normalises the attention output before the residual add, and preFeedforwardNorm feeds the MLP.
 */
export interface ReferenceLayer {
  inputNorm: Float64Array;
  q: Linear;
  k: Linear;
  v: Linear;
  o: Linear;
  qNorm: Float64Array | null;
  kNorm: Float64Array | null;
  postNorm: Float64Array;
  preFeedforwardNorm: Float64Array | null;
  postFeedforwardNorm: Float64Array | null;
  /** The dense MLP; on a sparse layer (moe set) a zero-width one, unused. */
  gate: Linear;
  up: Linear;
  down: Linear;
  moe: ReferenceMoe | null;
  /** Rope inverse frequencies of this layer (Gemma: local on sliding layers, global on full ones). */
  invFreq: Float64Array;
  /** What rope multiplies cos and sin by on this layer: ropeAttentionFactor, 1 outside YaRN. */
  ropeScale: number;
  /** gpt-oss: the sink logit of each query head [numHeads]; null elsewhere. */
  sinks: Float64Array | null;
}

export interface ReferenceModel {
  config: ReferenceConfig;
  /** config.json as read. */
  raw: Record<string, unknown>;
  embed: Float64Array; // [vocab, hidden]
  layers: ReferenceLayer[];
  norm: Float64Array;
  lmHead: Linear;
  /** The global rope frequencies (every layer's outside Gemma). */
  invFreq: Float64Array;
  /**
   * A KV cache that rounds what it stores (an fp8 cache): layer l's post-rope key or value vector
   * as the cache holds it. Absent: kept exact.
   */
  kvRound?: (layer: number, which: 'k' | 'v', x: Float64Array) => Float64Array;
}

// ---------------------------------------------------------------- loading

const DENSE = ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'];
const GEMMA3 = ['Gemma3ForCausalLM', 'Gemma3ForConditionalGeneration'];

/** Gemma3TextConfig's defaults: gemma-3-4b-it's text_config, for one, leaves most fields out. */
const GEMMA3_TEXT_DEFAULTS = {
  vocab_size: 262208, hidden_size: 2304, intermediate_size: 9216, num_hidden_layers: 26, num_attention_heads: 8,
  num_key_value_heads: 4, head_dim: 256, hidden_activation: 'gelu_pytorch_tanh', rms_norm_eps: 1e-6,
  tie_word_embeddings: true, rope_theta: 1_000_000, attention_bias: false, query_pre_attn_scalar: 256,
  sliding_window: 4096, sliding_window_pattern: 6, layer_types: null, final_logit_softcapping: null,
  attn_logit_softcapping: null, rope_scaling: null, rope_local_base_freq: 10_000,
};

function parseConfig(raw: Record<string, any>): ReferenceConfig {
  const arch = (raw.architectures?.[0] ?? '') as string;
  if (GEMMA3.includes(arch)) return parseGemma3(arch, raw);
  if (arch === GPT_OSS_ARCHITECTURE) return parseGptOssConfig(raw);
  if (!DENSE.includes(arch) && !isMoeArchitecture(arch)) throw new Error(`reference: unsupported architecture ${arch}`);
  if ((raw.hidden_act ?? 'silu') !== 'silu') throw new Error(`reference: hidden_act ${raw.hidden_act}`);
  const numHeads = raw.num_attention_heads as number;
  const numLayers = raw.num_hidden_layers as number;
  const window: (number | null)[] = [];
  for (let i = 0; i < numLayers; i++) {
    let w: number | null = null;
    if (arch === 'MistralForCausalLM' || arch === 'MixtralForCausalLM') w = raw.sliding_window ?? null;
    else if (arch === 'Qwen2ForCausalLM' || arch === 'Qwen3ForCausalLM' || arch === 'Qwen3MoeForCausalLM') {
      if (raw.use_sliding_window && i >= (raw.max_window_layers ?? numLayers)) w = raw.sliding_window ?? null;
    } else if (raw.sliding_window != null) {
      throw new Error('reference: sliding_window not supported for llama');
    }
    window.push(w);
  }
  const headDim = raw.head_dim ?? raw.hidden_size / numHeads;
  const noBias = arch === 'MistralForCausalLM' || arch === 'MixtralForCausalLM';
  return {
    architecture: arch,
    modelType: raw.model_type,
    hiddenSize: raw.hidden_size,
    intermediateSize: raw.intermediate_size,
    numLayers,
    numHeads,
    numKvHeads: raw.num_key_value_heads ?? numHeads,
    headDim,
    vocabSize: raw.vocab_size,
    rmsNormEps: raw.rms_norm_eps ?? 1e-6,
    ropeTheta: raw.rope_theta ?? 10000,
    ropeScaling: raw.rope_scaling ?? null,
    ropeLocalTheta: null,
    tieWordEmbeddings: raw.tie_word_embeddings ?? false,
    slidingWindow: window,
    attnScale: 1 / Math.sqrt(headDim),
    normOffset: 0,
    embedScale: 1,
    hiddenAct: 'silu',
    attnSoftcap: null,
    finalSoftcap: null,
    qkvBias: arch === 'Qwen2ForCausalLM' || (!noBias && raw.attention_bias === true),
    oBias: arch !== 'Qwen2ForCausalLM' && !noBias && raw.attention_bias === true,
    mlpBias: arch === 'LlamaForCausalLM' && raw.mlp_bias === true,
    qkNorm: arch === 'Qwen3ForCausalLM' || arch === 'Qwen3MoeForCausalLM',
    attnSinks: false,
    moe: isMoeArchitecture(arch) ? parseMoeConfig(arch, raw, numLayers) : null,
  };
}

/** Gemma3ForCausalLM, or the text part of Gemma3ForConditionalGeneration (under text_config). */
function parseGemma3(arch: string, raw: Record<string, any>): ReferenceConfig {
  const given = arch === 'Gemma3ForConditionalGeneration' ? raw.text_config : raw;
  if (!given || typeof given !== 'object') throw new Error('reference: Gemma3ForConditionalGeneration without text_config');
  const t = { ...GEMMA3_TEXT_DEFAULTS, ...given } as Record<string, any>;
  if (t.hidden_activation !== 'gelu_pytorch_tanh') throw new Error(`reference: hidden_activation ${t.hidden_activation}`);
  const numLayers = t.num_hidden_layers as number;
  // Without layer_types, every sliding_window_pattern-th layer is full attention.
  const layerTypes: string[] = t.layer_types ??
    Array.from({ length: numLayers }, (_, i) => ((i + 1) % t.sliding_window_pattern === 0 ? 'full_attention' : 'sliding_attention'));
  if (layerTypes.length !== numLayers) throw new Error(`reference: ${layerTypes.length} layer_types for ${numLayers} layers`);
  const window = layerTypes.map((type) => {
    if (type === 'full_attention') return null;
    if (type === 'sliding_attention') return t.sliding_window as number;
    throw new Error(`reference: layer type ${type}`);
  });
  return {
    architecture: arch,
    modelType: raw.model_type,
    hiddenSize: t.hidden_size,
    intermediateSize: t.intermediate_size,
    numLayers,
    numHeads: t.num_attention_heads,
    numKvHeads: t.num_key_value_heads,
    headDim: t.head_dim,
    vocabSize: t.vocab_size,
    rmsNormEps: t.rms_norm_eps,
    ropeTheta: t.rope_theta,
    ropeScaling: t.rope_scaling,
    ropeLocalTheta: t.rope_local_base_freq,
    tieWordEmbeddings: t.tie_word_embeddings,
    slidingWindow: window,
    attnScale: 1 / Math.sqrt(t.query_pre_attn_scalar),
    normOffset: 1,
    embedScale: Math.sqrt(t.hidden_size),
    hiddenAct: 'gelu_tanh',
    attnSoftcap: t.attn_logit_softcapping,
    finalSoftcap: t.final_logit_softcapping,
    qkvBias: t.attention_bias === true,
    oBias: t.attention_bias === true,
    mlpBias: false,
    qkNorm: true,
    attnSinks: false,
    moe: null,
  };
}

/** Load config.json + safetensors of a model directory, decoding every weight to f64. */
export function loadReferenceModel(dir: string): ReferenceModel {
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
  const cfg = parseConfig(raw);
  const tensors = readSafetensorsDir(dir);
  dequantizeFp8(tensors, raw);
  dequantizeAwqGptq(tensors, raw);
  const get = (name: string, shape: number[]): RefTensor => {
    const t = tensors.get(name);
    if (!t) throw new Error(`reference: missing tensor ${name}`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new Error(`reference: ${name} has shape [${t.shape}], expected [${shape}]`);
    }
    return t;
  };
  const linear = (prefix: string, out: number, inp: number, bias: boolean): Linear => ({
    w: get(`${prefix}.weight`, [out, inp]).data,
    b: bias ? get(`${prefix}.bias`, [out]).data : null,
    out,
    in: inp,
  });
  const h = cfg.hiddenSize;
  const qDim = cfg.numHeads * cfg.headDim;
  const kvDim = cfg.numKvHeads * cfg.headDim;
  // Gemma3ForConditionalGeneration keeps the text model under language_model.*; the vision tower's
  // tensors are never read.
  const root = cfg.architecture === 'Gemma3ForConditionalGeneration' ? 'language_model.' : '';
  const globalFreq = ropeInvFreq(cfg.headDim, cfg.ropeTheta, cfg.ropeScaling);
  const localFreq = cfg.ropeLocalTheta === null ? globalFreq : ropeInvFreq(cfg.headDim, cfg.ropeLocalTheta, null);
  const globalScale = ropeAttentionFactor(cfg.ropeScaling);
  const sandwich = GEMMA3.includes(cfg.architecture);
  const layers: ReferenceLayer[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const p = `${root}model.layers.${i}`;
    const sparse = cfg.moe?.sparseLayers[i] ?? false;
    // Gemma's sliding layers rope with their own, unscaled base; elsewhere localFreq is globalFreq.
    const local = cfg.ropeLocalTheta !== null && cfg.slidingWindow[i] !== null;
    const inter = sparse ? 0 : cfg.intermediateSize;
    const mlp = (name: string, out: number, inp: number): Linear =>
      sparse ? { w: new Float64Array(0), b: null, out, in: inp } : linear(`${p}.mlp.${name}`, out, inp, cfg.mlpBias);
    layers.push({
      inputNorm: get(`${p}.input_layernorm.weight`, [h]).data,
      q: linear(`${p}.self_attn.q_proj`, qDim, h, cfg.qkvBias),
      k: linear(`${p}.self_attn.k_proj`, kvDim, h, cfg.qkvBias),
      v: linear(`${p}.self_attn.v_proj`, kvDim, h, cfg.qkvBias),
      o: linear(`${p}.self_attn.o_proj`, h, qDim, cfg.oBias),
      qNorm: cfg.qkNorm ? get(`${p}.self_attn.q_norm.weight`, [cfg.headDim]).data : null,
      kNorm: cfg.qkNorm ? get(`${p}.self_attn.k_norm.weight`, [cfg.headDim]).data : null,
      postNorm: get(`${p}.post_attention_layernorm.weight`, [h]).data,
      preFeedforwardNorm: sandwich ? get(`${p}.pre_feedforward_layernorm.weight`, [h]).data : null,
      postFeedforwardNorm: sandwich ? get(`${p}.post_feedforward_layernorm.weight`, [h]).data : null,
      gate: mlp('gate_proj', inter, h),
      up: mlp('up_proj', inter, h),
      down: mlp('down_proj', h, inter),
      moe: !sparse
        ? null
        : cfg.architecture === GPT_OSS_ARCHITECTURE
          ? loadGptOssMoe(get, p, cfg.moe!, h)
          : loadMoe(cfg.architecture as MoeArchitecture, p, cfg.moe!, h, (n, o, k) => linear(n, o, k, false)),
      invFreq: local ? localFreq : globalFreq,
      ropeScale: local ? 1 : globalScale,
      sinks: cfg.attnSinks ? get(`${p}.self_attn.sinks`, [cfg.numHeads]).data : null,
    });
  }
  const embed = get(`${root}model.embed_tokens.weight`, [cfg.vocabSize, h]).data;
  const lmHead: Linear = cfg.tieWordEmbeddings
    ? { w: embed, b: null, out: cfg.vocabSize, in: h }
    : linear(`${root}lm_head`, cfg.vocabSize, h, false);
  return {
    config: cfg,
    raw,
    embed,
    layers,
    norm: get(`${root}model.norm.weight`, [h]).data,
    lmHead,
    invFreq: globalFreq,
  };
}

// ---------------------------------------------------------------- forward

/** Incremental decoding state: one token per step, with a float64 KV cache. */
export class ReferenceSession {
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];
  position = 0;

  constructor(readonly model: ReferenceModel) {
    for (let l = 0; l < model.layers.length; l++) {
      this.keys.push([]);
      this.values.push([]);
    }
  }

  /** Feed one token at the next position; returns the logits for the following token. */
  step(token: number): Float64Array {
    const c = this.model.config;
    if (!Number.isInteger(token) || token < 0 || token >= c.vocabSize) throw new Error(`token ${token} out of range`);
    const x = this.model.embed.slice(token * c.hiddenSize, (token + 1) * c.hiddenSize); // [hidden]
    for (let i = 0; i < x.length; i++) x[i]! *= c.embedScale;
    const pos = this.position;
    return this.forward(x, (v, off, d, L) => applyRope(v, off, d, pos, L.invFreq, L.ropeScale));
  }

  /**
   * Feed one input vector x [hidden] (consumed) at the next cache position, each q and k head
   * rotated by `rotate` (the family's rope at that token's position: 1D, or M-RoPE's three
   * components); returns the logits for the following token.
   */
  forward(x: Float64Array, rotate: (v: Float64Array, off: number, headDim: number, layer: ReferenceLayer) => void): Float64Array {
    const { config: c, layers } = this.model;
    const pos = this.position++;
    const d = c.headDim;
    const group = c.numHeads / c.numKvHeads;
    const norm = (v: Float64Array, w: Float64Array) => rmsNorm(v, w, c.rmsNormEps, c.normOffset);
    for (let l = 0; l < layers.length; l++) {
      const L = layers[l]!;
      const hn = norm(x, L.inputNorm);
      const q = matvec(L.q, hn); // [numHeads * headDim]
      const k = matvec(L.k, hn); // [numKvHeads * headDim]
      const v = matvec(L.v, hn);
      for (let hd = 0; hd < c.numHeads; hd++) {
        if (L.qNorm) q.set(norm(q.subarray(hd * d, (hd + 1) * d), L.qNorm), hd * d);
        rotate(q, hd * d, d, L);
      }
      for (let hd = 0; hd < c.numKvHeads; hd++) {
        if (L.kNorm) k.set(norm(k.subarray(hd * d, (hd + 1) * d), L.kNorm), hd * d);
        rotate(k, hd * d, d, L);
      }
      const round = this.model.kvRound;
      this.keys[l]!.push(round ? round(l, 'k', k) : k);
      this.values[l]!.push(round ? round(l, 'v', v) : v);
      const window = c.slidingWindow[l] ?? null;
      const first = window === null ? 0 : Math.max(0, pos - window + 1);
      const attn = new Float64Array(c.numHeads * d);
      for (let hd = 0; hd < c.numHeads; hd++) {
        const kvh = Math.floor(hd / group);
        // With sinks, the head's sink logit is the last entry, in the softmax but never on a value.
        const scores = new Float64Array(pos + 1 - first + (L.sinks ? 1 : 0));
        if (L.sinks) scores[pos + 1 - first] = L.sinks[hd]!;
        for (let j = first; j <= pos; j++) {
          const kj = this.keys[l]![j]!;
          let s = 0;
          for (let i = 0; i < d; i++) s += q[hd * d + i]! * kj[kvh * d + i]!;
          s *= c.attnScale;
          scores[j - first] = c.attnSoftcap === null ? s : softcap(s, c.attnSoftcap);
        }
        const p = softmax(scores);
        for (let j = first; j <= pos; j++) {
          const vj = this.values[l]![j]!;
          const w = p[j - first]!;
          for (let i = 0; i < d; i++) attn[hd * d + i]! += w * vj[kvh * d + i]!;
        }
      }
      const o = matvec(L.o, attn);
      // See ReferenceLayer for the two roles of post_attention_layernorm.
      const sandwich = L.preFeedforwardNorm !== null;
      const a = sandwich ? norm(o, L.postNorm) : o;
      for (let i = 0; i < x.length; i++) x[i]! += a[i]!;
      const hn2 = norm(x, sandwich ? L.preFeedforwardNorm! : L.postNorm);
      const m = L.moe ? moeForward(L.moe, c.moe!, hn2, c.hiddenAct) : gatedMlp(L, hn2, c.hiddenAct);
      const mo = L.postFeedforwardNorm ? norm(m, L.postFeedforwardNorm) : m;
      for (let i = 0; i < x.length; i++) x[i]! += mo[i]!;
    }
    const logits = matvec(this.model.lmHead, norm(x, this.model.norm)); // [vocab]
    const cap = c.finalSoftcap;
    return cap === null ? logits : logits.map((z) => softcap(z, cap));
  }
}

/** Logits at every position of `tokenIds` (entry i predicts token i+1). */
export function referenceLogits(model: ReferenceModel, tokenIds: number[]): Float64Array[] {
  const s = new ReferenceSession(model);
  return tokenIds.map((t) => s.step(t));
}

export interface GreedyResult {
  tokens: number[];
  /** Top-1 minus top-2 logit at each generated token (near 0 = near tie). */
  gaps: number[];
  /** Log-probability of each generated token. */
  logprobs: number[];
}

/** Greedy continuation with per-step gap/logprob details. Stops early on a token in `stop`. */
export function referenceGreedyDetailed(
  model: ReferenceModel,
  promptIds: number[],
  n: number,
  stop: number[] = [],
): GreedyResult {
  if (promptIds.length === 0) throw new Error('referenceGreedy: empty prompt');
  const s = new ReferenceSession(model);
  let logits!: Float64Array;
  for (const t of promptIds) logits = s.step(t);
  const res: GreedyResult = { tokens: [], gaps: [], logprobs: [] };
  for (let i = 0; i < n; i++) {
    const t = argmax(logits);
    res.tokens.push(t);
    res.gaps.push(logitsTopGap(logits));
    res.logprobs.push(logSoftmax(logits)[t]!);
    if (stop.includes(t) || i === n - 1) break;
    logits = s.step(t);
  }
  return res;
}

/** The n greedy tokens after `promptIds`. */
export function referenceGreedy(model: ReferenceModel, promptIds: number[], n: number): number[] {
  return referenceGreedyDetailed(model, promptIds, n).tokens;
}
