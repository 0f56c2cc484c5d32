// Float64 math of the reference forward pass: norms, projections, activations, softmax, rope.

export interface RefRopeScaling {
  rope_type?: string;
  type?: string;
  factor?: number;
  low_freq_factor?: number;
  high_freq_factor?: number;
  original_max_position_embeddings?: number;
  /** yarn: rotations per context that bound the ramp (defaults 32 and 1). */
  beta_fast?: number;
  beta_slow?: number;
  /** yarn: round the ramp's ends outwards to whole dimensions (default true; gpt-oss: false). */
  truncate?: boolean;
  /** yarn: the cos/sin multiplier; default 0.1 ln(factor) + 1, or the mscale ratio when both are given. */
  attention_factor?: number;
  mscale?: number;
  mscale_all_dim?: number;
}

export interface Linear {
  w: Float64Array; // [out, in] row-major
  b: Float64Array | null;
  out: number;
  in: number;
  /**
   * Set where the engine multiplies int8-quantized activations (Q8_0 and Q4 weights): x is cut
   * into blocks of 32 (taken in `order` when given: block j holds x[order[32j..32j+31]]), each
   * rounded as the engine rounds it (f32: d = amax / 127, q = round_half_even(x * (127 / amax))),
   * and the product uses q * d.
   */
  inputQ8?: { order?: Int32Array };
}

/** x as the engine's int8 activation quantization leaves it (Linear.inputQ8). */
export function q8Activations(x: Float64Array, order?: Int32Array): Float64Array {
  const out = new Float64Array(x.length);
  const at = (j: number) => (order ? order[j]! : j);
  for (let b = 0; b < x.length; b += 32) {
    const end = Math.min(x.length, b + 32);
    let amax = 0;
    for (let j = b; j < end; j++) amax = Math.max(amax, Math.abs(Math.fround(x[at(j)]!)));
    const id = amax > 0 ? Math.fround(127 / amax) : 0;
    const d = Math.fround(amax / 127);
    for (let j = b; j < end; j++) {
      const v = Math.fround(Math.fround(x[at(j)]!) * id);
      const f = Math.floor(v), r = v - f > 0.5 || (v - f === 0.5 && f % 2 !== 0) ? f + 1 : f;
      out[at(j)] = r * d;
    }
  }
  return out;
}

/** x / sqrt(mean(x^2) + eps) * (offset + w): offset 0, or 1 for Gemma's (1 + w). */
export function rmsNorm(x: Float64Array, w: Float64Array, eps: number, offset = 0): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i]! * x[i]!;
  const r = 1 / Math.sqrt(ss / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i]! * r * (offset + w[i]!);
  return out;
}

export function matvec(l: Linear, x: Float64Array): Float64Array {
  if (x.length !== l.in) throw new Error(`matvec: input ${x.length} != ${l.in}`);
  if (l.inputQ8) x = q8Activations(x, l.inputQ8.order);
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

/** GELU, tanh approximation (transformers' gelu_pytorch_tanh). */
export const geluTanh = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x)));

export type RefActivation = 'silu' | 'gelu_tanh';

export const ACTIVATIONS: Record<RefActivation, (x: number) => number> = { silu, gelu_tanh: geluTanh };

/** Gemma's soft cap: tanh(x / cap) * cap, smooth and bounded by +-cap. */
export const softcap = (x: number, cap: number) => Math.tanh(x / cap) * cap;

/** A gated MLP (a dense layer's, or one expert's): down(act(gate(x)) * up(x)). */
export interface GatedMlp {
  gate: Linear; // [intermediate, hidden]
  up: Linear; // [intermediate, hidden]
  down: Linear; // [hidden, intermediate]
}

export function gatedMlp(m: GatedMlp, x: Float64Array, act: RefActivation): Float64Array {
  const f = ACTIVATIONS[act];
  const g = matvec(m.gate, x);
  const u = matvec(m.up, x);
  for (let i = 0; i < g.length; i++) g[i] = f(g[i]!) * u[i]!;
  return matvec(m.down, g);
}

/** The alpha of gpt-oss's SwiGLU: glu = gate * sigmoid(1.702 * gate). */
export const GPT_OSS_SWIGLU_ALPHA = 1.702;

/**
 * gpt-oss's expert MLP (transformers' GptOssExperts): gate and up with their biases, the gate
 * clamped from above at `limit` and up to [-limit, limit], then down((up + 1) * gate *
 * sigmoid(1.702 * gate)) plus down's bias.
 */
export function clampedSwigluMlp(m: GatedMlp, x: Float64Array, limit: number): Float64Array {
  const g = matvec(m.gate, x);
  const u = matvec(m.up, x);
  for (let i = 0; i < g.length; i++) {
    const gate = Math.min(g[i]!, limit);
    const up = Math.min(Math.max(u[i]!, -limit), limit);
    g[i] = (up + 1) * (gate / (1 + Math.exp(-GPT_OSS_SWIGLU_ALPHA * gate)));
  }
  return matvec(m.down, g);
}

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
 * interpolates smoothly in between; yarn, see yarnInvFreq (and ropeAttentionFactor).
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
  if (type === 'yarn') return yarnInvFreq(inv, headDim, theta, factor, scaling!);
  throw new Error(`reference: unsupported rope_type ${type}`);
}

/**
 * YaRN (transformers' _compute_yarn_parameters, taking rope_scaling.factor as given): dimension
 * pairs i below `low` keep their frequency (extrapolation), those above `high` are divided by
 * factor (interpolation), a linear ramp in i blends the two between; low and high are the pairs
 * that turn beta_fast and beta_slow times over original_max_position_embeddings positions.
 */
function yarnInvFreq(inv: Float64Array, dim: number, theta: number, factor: number, s: RefRopeScaling): Float64Array {
  const orig = s.original_max_position_embeddings;
  if (typeof orig !== 'number') throw new Error('rope_scaling.original_max_position_embeddings missing (yarn)');
  // transformers reads these with `or`: 0 falls back to the default too.
  const betaFast = s.beta_fast || 32;
  const betaSlow = s.beta_slow || 1;
  const correctionDim = (rotations: number) => (dim * Math.log(orig / (rotations * 2 * Math.PI))) / (2 * Math.log(theta));
  let low = correctionDim(betaFast);
  let high = correctionDim(betaSlow);
  if (s.truncate ?? true) {
    low = Math.floor(low);
    high = Math.ceil(high);
  }
  low = Math.max(low, 0);
  high = Math.min(high, dim - 1);
  if (low === high) high += 0.001;
  return inv.map((extrapolated, i) => {
    const ramp = Math.min(Math.max((i - low) / (high - low), 0), 1);
    return (extrapolated / factor) * ramp + extrapolated * (1 - ramp);
  });
}

/** The factor rope multiplies cos and sin by (so q.k by its square): 1 except under yarn. */
export function ropeAttentionFactor(scaling: RefRopeScaling | null): number {
  if (!scaling || (scaling.rope_type ?? scaling.type) !== 'yarn') return 1;
  if (scaling.attention_factor != null) return scaling.attention_factor;
  const factor = scaling.factor!;
  const mscale = (scale: number, m = 1) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
  if (scaling.mscale && scaling.mscale_all_dim) return mscale(factor, scaling.mscale) / mscale(factor, scaling.mscale_all_dim);
  return mscale(factor);
}

/**
 * Rotate-half RoPE of one head vector (x[off .. off+d)) in place at position `pos`, with cos and
 * sin multiplied by `scale` (ropeAttentionFactor).
 */
export function applyRope(x: Float64Array, off: number, d: number, pos: number, invFreq: Float64Array, scale = 1): void {
  const half = d / 2;
  for (let i = 0; i < half; i++) {
    const a = pos * invFreq[i]!;
    const c = Math.cos(a) * scale;
    const s = Math.sin(a) * scale;
    const x1 = x[off + i]!;
    const x2 = x[off + half + i]!;
    x[off + i] = x1 * c - x2 * s;
    x[off + half + i] = x2 * c + x1 * s;
  }
}
