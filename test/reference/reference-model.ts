// A plain, slow, float64 forward pass of Llama / Mistral / Qwen2 / Qwen3 decoder models,
// following transformers' semantics. Independent of models/ and src/: it reads config.json and
// the safetensors files itself. Meant for small test models (all weights live as Float64Array).

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type RefTensor, readSafetensorsDir } from './safetensors-reader.js';

export interface RefRopeScaling {
  rope_type?: string;
  type?: string;
  factor?: number;
  low_freq_factor?: number;
  high_freq_factor?: number;
  original_max_position_embeddings?: number;
}

export interface ReferenceConfig {
  architecture: string;
  modelType: string;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RefRopeScaling | null;
  tieWordEmbeddings: boolean;
  /** Per layer: attention window (keys j with j > i - window), or null for full causal. */
  slidingWindow: (number | null)[];
}

export interface Linear {
  w: Float64Array; // [out, in] row-major
  b: Float64Array | null;
  out: number;
  in: number;
}

export interface ReferenceLayer {
  inputNorm: Float64Array;
  q: Linear;
  k: Linear;
  v: Linear;
  o: Linear;
  qNorm: Float64Array | null;
  kNorm: Float64Array | null;
  postNorm: Float64Array;
  gate: Linear;
  up: Linear;
  down: Linear;
}

export interface ReferenceModel {
  config: ReferenceConfig;
  /** config.json as read. */
  raw: Record<string, unknown>;
  embed: Float64Array; // [vocab, hidden]
  layers: ReferenceLayer[];
  norm: Float64Array;
  lmHead: Linear;
  invFreq: Float64Array;
}

// ---------------------------------------------------------------- math helpers

export function rmsNorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i]! * x[i]!;
  const r = 1 / Math.sqrt(ss / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i]! * r * w[i]!;
  return out;
}

export function matvec(l: Linear, x: Float64Array): Float64Array {
  if (x.length !== l.in) throw new Error(`matvec: input ${x.length} != ${l.in}`);
  const y = new Float64Array(l.out);
  for (let o = 0; o < l.out; o++) {
    let acc = l.b ? l.b[o]! : 0;
    const row = o * l.in;
    for (let i = 0; i < l.in; i++) acc += l.w[row + i]! * x[i]!;
    y[o] = acc;
  }
  return y;
}

export const silu = (x: number) => x / (1 + Math.exp(-x));

export function softmax(xs: ArrayLike<number>): Float64Array {
  let m = -Infinity;
  for (let i = 0; i < xs.length; i++) m = Math.max(m, xs[i]!);
  const out = new Float64Array(xs.length);
  let s = 0;
  for (let i = 0; i < xs.length; i++) s += out[i] = Math.exp(xs[i]! - m);
  for (let i = 0; i < xs.length; i++) out[i]! /= s;
  return out;
}

export function logSoftmax(xs: ArrayLike<number>): Float64Array {
  let m = -Infinity;
  for (let i = 0; i < xs.length; i++) m = Math.max(m, xs[i]!);
  let s = 0;
  for (let i = 0; i < xs.length; i++) s += Math.exp(xs[i]! - m);
  const lse = m + Math.log(s);
  const out = new Float64Array(xs.length);
  for (let i = 0; i < xs.length; i++) out[i] = xs[i]! - lse;
  return out;
}

/** Index of the largest value; ties go to the lowest index (like torch.argmax). */
export function argmax(xs: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i]! > xs[best]!) best = i;
  return best;
}

/** Largest minus second largest logit: small gaps mean a near tie, where greedy may differ. */
export function logitsTopGap(xs: ArrayLike<number>): number {
  let a = -Infinity;
  let b = -Infinity;
  for (let i = 0; i < xs.length; i++) {
    const v = xs[i]!;
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) b = v;
  }
  return a - b;
}

/**
 * RoPE inverse frequencies: 1 / theta^(2i/d), then transformers' rope scaling:
 * linear divides every frequency by factor; llama3 keeps high frequencies (wavelen < orig /
 * high_freq_factor), divides low ones (wavelen > orig / low_freq_factor) by factor and
 * interpolates smoothly in between.
 */
export function ropeInvFreq(headDim: number, theta: number, scaling: RefRopeScaling | null): Float64Array {
  const half = headDim / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(theta, (2 * i) / headDim);
  const type = scaling ? scaling.rope_type ?? scaling.type ?? 'default' : 'default';
  if (type === 'default') return inv;
  const factor = scaling!.factor;
  if (typeof factor !== 'number') throw new Error('rope_scaling.factor missing');
  if (type === 'linear') return inv.map((f) => f / factor);
  if (type === 'llama3') {
    const low = scaling!.low_freq_factor!;
    const high = scaling!.high_freq_factor!;
    const orig = scaling!.original_max_position_embeddings!;
    const lowWavelen = orig / low;
    const highWavelen = orig / high;
    return inv.map((f) => {
      const wavelen = (2 * Math.PI) / f;
      if (wavelen < highWavelen) return f;
      if (wavelen > lowWavelen) return f / factor;
      const smooth = (orig / wavelen - low) / (high - low);
      return (1 - smooth) * (f / factor) + smooth * f;
    });
  }
  throw new Error(`reference: unsupported rope_type ${type}`);
}

/** Rotate-half RoPE of one head vector (x[off .. off+d)) in place at position `pos`. */
export function applyRope(x: Float64Array, off: number, d: number, pos: number, invFreq: Float64Array): void {
  const half = d / 2;
  for (let i = 0; i < half; i++) {
    const a = pos * invFreq[i]!;
    const c = Math.cos(a);
    const s = Math.sin(a);
    const x1 = x[off + i]!;
    const x2 = x[off + half + i]!;
    x[off + i] = x1 * c - x2 * s;
    x[off + half + i] = x2 * c + x1 * s;
  }
}

// ---------------------------------------------------------------- loading

function parseConfig(raw: Record<string, any>): ReferenceConfig {
  const arch = (raw.architectures?.[0] ?? '') as string;
  const supported = ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'];
  if (!supported.includes(arch)) throw new Error(`reference: unsupported architecture ${arch}`);
  if ((raw.hidden_act ?? 'silu') !== 'silu') throw new Error(`reference: hidden_act ${raw.hidden_act}`);
  const numHeads = raw.num_attention_heads as number;
  const numLayers = raw.num_hidden_layers as number;
  const window: (number | null)[] = [];
  for (let i = 0; i < numLayers; i++) {
    let w: number | null = null;
    if (arch === 'MistralForCausalLM') w = raw.sliding_window ?? null;
    else if (arch === 'Qwen2ForCausalLM' || arch === 'Qwen3ForCausalLM') {
      if (raw.use_sliding_window && i >= (raw.max_window_layers ?? numLayers)) w = raw.sliding_window ?? null;
    } else if (raw.sliding_window != null) {
      throw new Error('reference: sliding_window not supported for llama');
    }
    window.push(w);
  }
  return {
    architecture: arch,
    modelType: raw.model_type,
    hiddenSize: raw.hidden_size,
    intermediateSize: raw.intermediate_size,
    numLayers,
    numHeads,
    numKvHeads: raw.num_key_value_heads ?? numHeads,
    headDim: raw.head_dim ?? raw.hidden_size / numHeads,
    vocabSize: raw.vocab_size,
    rmsNormEps: raw.rms_norm_eps ?? 1e-6,
    ropeTheta: raw.rope_theta ?? 10000,
    ropeScaling: raw.rope_scaling ?? null,
    tieWordEmbeddings: raw.tie_word_embeddings ?? false,
    slidingWindow: window,
  };
}

/** Load config.json + safetensors of a model directory, decoding every weight to f64. */
export function loadReferenceModel(dir: string): ReferenceModel {
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
  const cfg = parseConfig(raw);
  const tensors = readSafetensorsDir(dir);
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
  const arch = cfg.architecture;
  const qkvBias = arch === 'Qwen2ForCausalLM' || (arch !== 'MistralForCausalLM' && raw.attention_bias === true);
  const oBias = arch !== 'Qwen2ForCausalLM' && arch !== 'MistralForCausalLM' && raw.attention_bias === true;
  const mlpBias = arch === 'LlamaForCausalLM' && raw.mlp_bias === true;
  const qkNorm = arch === 'Qwen3ForCausalLM';
  const layers: ReferenceLayer[] = [];
  for (let i = 0; i < cfg.numLayers; i++) {
    const p = `model.layers.${i}`;
    layers.push({
      inputNorm: get(`${p}.input_layernorm.weight`, [h]).data,
      q: linear(`${p}.self_attn.q_proj`, qDim, h, qkvBias),
      k: linear(`${p}.self_attn.k_proj`, kvDim, h, qkvBias),
      v: linear(`${p}.self_attn.v_proj`, kvDim, h, qkvBias),
      o: linear(`${p}.self_attn.o_proj`, h, qDim, oBias),
      qNorm: qkNorm ? get(`${p}.self_attn.q_norm.weight`, [cfg.headDim]).data : null,
      kNorm: qkNorm ? get(`${p}.self_attn.k_norm.weight`, [cfg.headDim]).data : null,
      postNorm: get(`${p}.post_attention_layernorm.weight`, [h]).data,
      gate: linear(`${p}.mlp.gate_proj`, cfg.intermediateSize, h, mlpBias),
      up: linear(`${p}.mlp.up_proj`, cfg.intermediateSize, h, mlpBias),
      down: linear(`${p}.mlp.down_proj`, h, cfg.intermediateSize, mlpBias),
    });
  }
  const embed = get('model.embed_tokens.weight', [cfg.vocabSize, h]).data;
  const lmHead: Linear = cfg.tieWordEmbeddings
    ? { w: embed, b: null, out: cfg.vocabSize, in: h }
    : linear('lm_head', cfg.vocabSize, h, false);
  return {
    config: cfg,
    raw,
    embed,
    layers,
    norm: get('model.norm.weight', [h]).data,
    lmHead,
    invFreq: ropeInvFreq(cfg.headDim, cfg.ropeTheta, cfg.ropeScaling),
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
    const { config: c, layers } = this.model;
    if (!Number.isInteger(token) || token < 0 || token >= c.vocabSize) throw new Error(`token ${token} out of range`);
    const pos = this.position++;
    const d = c.headDim;
    const group = c.numHeads / c.numKvHeads;
    const x = this.model.embed.slice(token * c.hiddenSize, (token + 1) * c.hiddenSize);
    for (let l = 0; l < layers.length; l++) {
      const L = layers[l]!;
      const hn = rmsNorm(x, L.inputNorm, c.rmsNormEps);
      const q = matvec(L.q, hn);
      const k = matvec(L.k, hn);
      const v = matvec(L.v, hn);
      for (let hd = 0; hd < c.numHeads; hd++) {
        if (L.qNorm) q.set(rmsNorm(q.subarray(hd * d, (hd + 1) * d), L.qNorm, c.rmsNormEps), hd * d);
        applyRope(q, hd * d, d, pos, this.model.invFreq);
      }
      for (let hd = 0; hd < c.numKvHeads; hd++) {
        if (L.kNorm) k.set(rmsNorm(k.subarray(hd * d, (hd + 1) * d), L.kNorm, c.rmsNormEps), hd * d);
        applyRope(k, hd * d, d, pos, this.model.invFreq);
      }
      this.keys[l]!.push(k);
      this.values[l]!.push(v);
      const window = c.slidingWindow[l] ?? null;
      const first = window === null ? 0 : Math.max(0, pos - window + 1);
      const attn = new Float64Array(c.numHeads * d);
      const scale = 1 / Math.sqrt(d);
      for (let hd = 0; hd < c.numHeads; hd++) {
        const kvh = Math.floor(hd / group);
        const scores = new Float64Array(pos + 1 - first);
        for (let j = first; j <= pos; j++) {
          const kj = this.keys[l]![j]!;
          let s = 0;
          for (let i = 0; i < d; i++) s += q[hd * d + i]! * kj[kvh * d + i]!;
          scores[j - first] = s * scale;
        }
        const p = softmax(scores);
        for (let j = first; j <= pos; j++) {
          const vj = this.values[l]![j]!;
          const w = p[j - first]!;
          for (let i = 0; i < d; i++) attn[hd * d + i]! += w * vj[kvh * d + i]!;
        }
      }
      const o = matvec(L.o, attn);
      for (let i = 0; i < x.length; i++) x[i]! += o[i]!;
      const hn2 = rmsNorm(x, L.postNorm, c.rmsNormEps);
      const g = matvec(L.gate, hn2);
      const u = matvec(L.up, hn2);
      for (let i = 0; i < g.length; i++) g[i] = silu(g[i]!) * u[i]!;
      const m = matvec(L.down, g);
      for (let i = 0; i < x.length; i++) x[i]! += m[i]!;
    }
    return matvec(this.model.lmHead, rmsNorm(x, this.model.norm, c.rmsNormEps));
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
