// FP8 checkpoints for the float64 reference: every F8_E4M3 tensor times its scale tensor, from the
// config's quantization_config, written from the formats' descriptions (independent of native/
// and models/). Block-wise "fp8": "<w>_scale_inv" [ceil(rows / bh), ceil(cols / bw)];
// compressed-tensors and ModelOpt: "<w>_scale", [] / [1] per tensor or [rows, 1] per channel.

import type { RefTensor } from './safetensors-reader.js';

/**
 * |v| rounded to the nearest value with `bits` significant bits (ties to even), in a binary format
 * whose normal exponents start at `minExponent` (below it, the fixed subnormal spacing): computed
 * in double, the spacing from v's binade, v / spacing rounded as an integer (exact: a power-of-two
 * division).
 */
function roundMagnitude(a: number, bits: number, minExponent: number): number {
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  const spacing = 2 ** (Math.max(e, minExponent) - (bits - 1));
  const m = a / spacing;
  const floor = Math.floor(m);
  return (m - floor > 0.5 || (m - floor === 0.5 && floor % 2 === 1) ? floor + 1 : floor) * spacing;
}

/** `v` rounded to the nearest bfloat16 (ties to even): 8 significant bits, normals from 2^-126. */
export function roundToBf16(v: number): number {
  if (v === 0 || !Number.isFinite(v)) return v;
  const out = roundMagnitude(Math.abs(v), 8, -126);
  // Past bf16's largest finite value (0x7f7f) the rounding goes to infinity.
  return Math.sign(v) * (out >= 2 ** 128 ? Infinity : out);
}

/**
 * `v / scale` rounded to the nearest OCP e4m3 value (ties to even; 4 significant bits, normals
 * from 2^-6), saturated to +-448, times `scale`: what an fp8 KV cache with that per-tensor scale
 * holds for v.
 */
export function roundToE4m3(v: number, scale: number): number {
  const x = v / scale;
  if (x === 0 || Number.isNaN(x)) return x * scale;
  const a = Math.abs(x);
  return Math.sign(x) * (a >= 448 ? 448 : Math.min(roundMagnitude(a, 4, -6), 448)) * scale;
}

interface QuantizationConfig {
  quant_method?: string;
  weight_block_size?: [number, number];
}

/**
 * Replaces each F8_E4M3 tensor of `tensors` (in place, as BF16) by its dequantized values:
 * e4m3 value times its scale in double (exact: 4 x 24 significant bits), then rounded once to
 * bf16. NOTE: the rounding is the checkpoint's definition of its dequantized weights as an engine
 * serving them in bf16 computes with them (the native engine dequantizes to bf16 at load, as
 * transformers and vLLM dequantize to the model's bf16 dtype): the reference then models the
 * weights the engine multiplies by, and the bf16 checkpoint tolerances apply unchanged.
 */
export function dequantizeFp8(tensors: Map<string, RefTensor>, raw: Record<string, any>): void {
  const q = (raw['quantization_config'] ?? raw['text_config']?.['quantization_config']) as QuantizationConfig | undefined;
  for (const [name, t] of tensors) {
    if (t.dtype !== 'F8_E4M3') continue;
    const method = q?.quant_method;
    if (method !== 'fp8' && method !== 'compressed-tensors' && method !== 'modelopt') {
      throw new Error(`reference: ${name} is F8_E4M3 but quant_method is ${String(method)}`);
    }
    if (t.shape.length !== 2) throw new Error(`reference: F8_E4M3 tensor ${name} is not a matrix`);
    const [rows, cols] = t.shape as [number, number];
    const scaleName = `${name}${method === 'fp8' ? '_scale_inv' : '_scale'}`;
    const scale = tensors.get(scaleName);
    if (!scale) throw new Error(`reference: ${name} has no ${scaleName}`);
    // Which scale multiplies element (r, c).
    let scaleAt: (r: number, c: number) => number;
    if (method === 'fp8') {
      const [bh, bw] = q!.weight_block_size ?? [128, 128];
      const scaleCols = Math.ceil(cols / bw);
      if (scale.data.length !== Math.ceil(rows / bh) * scaleCols) throw new Error(`reference: ${scaleName} has shape [${scale.shape}]`);
      scaleAt = (r, c) => scale.data[Math.floor(r / bh) * scaleCols + Math.floor(c / bw)]!;
    } else if (scale.data.length === rows && rows > 1) {
      scaleAt = (r) => scale.data[r]!;
    } else {
      if (scale.data.length !== 1) throw new Error(`reference: ${scaleName} has shape [${scale.shape}]`);
      scaleAt = () => scale.data[0]!;
    }
    const out = new Float64Array(rows * cols);
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const value = t.data[r * cols + c]!;
        if (Number.isNaN(value)) throw new Error(`reference: ${name} holds a NaN code at [${r}, ${c}]`);
        out[r * cols + c] = roundToBf16(value * scaleAt(r, c));
      }
    }
    tensors.set(name, { dtype: 'BF16', shape: t.shape, data: out });
  }
}
