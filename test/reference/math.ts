// Float64 math of the reference forward pass: norms, projections, activations, softmax, rope.

export interface RefRopeScaling {
  rope_type?: string;
  type?: string;
  factor?: number;
  low_freq_factor?: number;
  high_freq_factor?: number;
  original_max_position_embeddings?: number;
}

export interface Linear {
  w: Float64Array; // [out, in] row-major
  b: Float64Array | null;
  out: number;
  in: number;
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
