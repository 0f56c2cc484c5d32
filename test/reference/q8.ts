// Q8_0 quantization, written independently of native/ for the float64 reference: each row of a
// [out, in] weight is cut into blocks of 32 (the last one zero padded), each block stored as
// d = f16(max|w| / 127) and q = round_half_even(w / d) clamped to [-127, 127]; the weight the
// quantized model computes with is q * d.

import type { GatedMlp, Linear, ReferenceModel } from './reference-model.js';

/** The nearest f16 value (ties to even), as a number; overflow saturates to the largest f16. */
export function roundToF16(v: number): number {
  if (v === 0 || !Number.isFinite(v)) return v;
  const a = Math.abs(v);
  if (a >= 65504) return Math.sign(v) * 65504;
  const e = Math.max(Math.floor(Math.log2(a)), -14);
  const ulp = 2 ** (e - 10);
  return Math.sign(v) * roundHalfEven(a / ulp) * ulp;
}

export function roundHalfEven(v: number): number {
  const f = Math.floor(v);
  const diff = v - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** Q8_0 round trip of a [rows, cols] matrix: the values q * d the quantized weights stand for. */
export function q8RoundTrip(w: Float64Array, rows: number, cols: number): Float64Array {
  const out = new Float64Array(w.length);
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < cols; b += 32) {
      const end = Math.min(cols, b + 32);
      let amax = 0;
      for (let k = b; k < end; k++) amax = Math.max(amax, Math.abs(w[r * cols + k]!));
      const d = roundToF16(Math.fround(amax / 127));
      for (let k = b; k < end; k++) {
        out[r * cols + k] = d === 0 ? 0 : Math.max(-127, Math.min(127, roundHalfEven(w[r * cols + k]! / d))) * d;
      }
    }
  }
  return out;
}

/**
 * The model with every projection (experts' included) and lm_head replaced by its Q8_0 round trip
 * (what sluice's --quantization int8 multiplies by); embeddings, norms, biases and MoE routers
 * unchanged, activations float64.
 */
export function quantizeReferenceQ8(model: ReferenceModel): ReferenceModel {
  const q = (l: Linear): Linear => ({ ...l, w: q8RoundTrip(l.w, l.out, l.in) });
  const mlp = (m: GatedMlp): GatedMlp => ({ gate: q(m.gate), up: q(m.up), down: q(m.down) });
  return {
    ...model,
    layers: model.layers.map((L) => ({
      ...L, q: q(L.q), k: q(L.k), v: q(L.v), o: q(L.o), ...mlp(L),
      moe: L.moe && { router: L.moe.router, experts: L.moe.experts.map(mlp) },
    })),
    lmHead: q(model.lmHead),
  };
}
