// FP8 checkpoints in the three published layouts, made from a written f32 checkpoint: each linear
// projection weight becomes F8_E4M3 codes with f32 scales, everything else is stored in the
// checkpoint's dtype. Layouts (config.json quantization_config and tensor names as published):
// - fp8-block: quant_method "fp8" (Qwen3 / DeepSeek FP8 releases), weight_block_size [128, 128],
//   "<w>_scale_inv" [ceil(rows / 128), ceil(cols / 128)], lm_head kept unquantized;
// - fp8-compressed-tensors: llm-compressor's FP8_DYNAMIC, per-channel "<w>_scale" [rows, 1],
//   dynamic per-token activations, "ignore": ["lm_head"] (strategy 'tensor': FP8 with static
//   per-tensor weight and input scales, [1] each);
// - fp8-modelopt: NVIDIA ModelOpt FP8, per-tensor "<w>_scale" [] and a static "<module>.input_scale" [],
//   "exclude_modules": ["lm_head"].
// NOTE: the checkpoint is first written in f32 and a shard is rewritten in memory
// (checkpoint-rewrite.ts): fine for the test presets, heavy (4x the FP8 bytes on disk) for the real shapes.

import { bytesOf, QUANTIZED_PROJECTION, rewriteF32Checkpoint, type StoredTensor } from './checkpoint-rewrite.js';
import { type Dtype, safetensorsDtype } from './presets.js';
import { toStoredBytes } from './weights.js';

export const FP8_LAYOUTS = ['fp8-block', 'fp8-compressed-tensors', 'fp8-modelopt'] as const;
export type Fp8Layout = (typeof FP8_LAYOUTS)[number];

export interface Fp8Options {
  layout: Fp8Layout;
  /** fp8-block: [rows, cols] of a scale block (default [128, 128]). */
  blockSize?: [number, number];
  /** fp8-compressed-tensors: 'channel' (FP8_DYNAMIC, default) or 'tensor' (FP8, static scales). */
  strategy?: 'channel' | 'tensor';
  /** Quantize lm_head too (the published layouts keep it unquantized). */
  quantizeLmHead?: boolean;
  /**
   * fp8-compressed-tensors and fp8-modelopt: an fp8 KV cache calibration, as llm-compressor's
   * kv_cache_scheme and ModelOpt's kv_cache_quant_algo FP8 write it: every layer's per-tensor
   * k_scale and v_scale (compressed-tensors "self_attn.k_scale" [1], ModelOpt
   * "self_attn.k_proj.k_scale" []), here these two values for every layer.
   */
  kvCacheScales?: { k: number; v: number };
}

/** Throws naming the field when `opts` is not a valid Fp8Options (the library API takes it unchecked). */
export function checkFp8Options(opts: unknown): asserts opts is Fp8Options {
  const o = opts as Partial<Fp8Options> | null;
  if (typeof o !== 'object' || o === null || !(FP8_LAYOUTS as readonly unknown[]).includes(o.layout)) {
    throw new Error(`quantize must be { layout: ${FP8_LAYOUTS.map((l) => `'${l}'`).join(' | ')}, ... }, got ${JSON.stringify(opts)}`);
  }
  if (o.strategy !== undefined && o.strategy !== 'channel' && o.strategy !== 'tensor') {
    throw new Error(`quantize.strategy must be 'channel' or 'tensor', got ${JSON.stringify(o.strategy)}`);
  }
  if (o.kvCacheScales !== undefined) {
    if (o.layout === 'fp8-block') throw new Error('quantize.kvCacheScales: the block-wise fp8 layout has no KV cache scales');
    const { k, v } = o.kvCacheScales as { k?: unknown; v?: unknown };
    if (!(typeof k === 'number' && k > 0 && Number.isFinite(k) && typeof v === 'number' && v > 0 && Number.isFinite(v))) {
      throw new Error(`quantize.kvCacheScales must be { k, v } with finite positive numbers, got ${JSON.stringify(o.kvCacheScales)}`);
    }
  }
  if (o.blockSize !== undefined && !(Array.isArray(o.blockSize) && o.blockSize.length === 2 && o.blockSize.every((n) => Number.isInteger(n) && n > 0))) {
    throw new Error(`quantize.blockSize must be two positive integers, got ${JSON.stringify(o.blockSize)}`);
  }
}

export const E4M3_MAX = 448;

/** The e4m3 ("e4m3fn") code nearest to x, ties to even, saturating to ±448. */
export function e4m3Encode(x: number): number {
  if (Number.isNaN(x)) throw new Error('e4m3Encode: NaN has no finite encoding');
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  if (a >= E4M3_MAX) return sign | 0x7e;
  if (a === 0) return sign;
  let e = Math.floor(Math.log2(a));
  while (2 ** e > a) e--;
  while (2 ** (e + 1) <= a) e++;
  e = Math.max(e, -6); // below 2^-6: subnormals, quantum 2^-9
  const quantum = 2 ** (e - 3);
  const m = a / quantum; // exact: a power-of-two division
  const floor = Math.floor(m);
  const r = m - floor > 0.5 || (m - floor === 0.5 && floor % 2 === 1) ? floor + 1 : floor;
  if (r === 0) return sign;
  // r in 1..16: 16 carries into the next binade (mantissa 0, exponent + 1).
  if (r < 8) return sign | r; // subnormal (e is -6 here)
  const exp = r === 16 ? e + 1 : e;
  const mant = r === 16 ? 0 : r - 8;
  return sign | ((exp + 7) << 3) | mant;
}

/** The value of an e4m3 code (NaN for 0x7f and 0xff). */
export function e4m3Value(code: number): number {
  const e = (code >> 3) & 15, m = code & 7;
  const v = e === 15 && m === 7 ? NaN : e === 0 ? m * 2 ** -9 : (8 + m) * 2 ** (e - 10);
  return code & 0x80 ? -v : v;
}

/** config.json's quantization_config for a layout. */
export function fp8QuantizationConfig(opts: Fp8Options): Record<string, unknown> {
  const head = opts.quantizeLmHead ? [] : ['lm_head'];
  if (opts.layout === 'fp8-block') {
    return { activation_scheme: 'dynamic', fmt: 'e4m3', quant_method: 'fp8', weight_block_size: opts.blockSize ?? [128, 128] };
  }
  if (opts.layout === 'fp8-modelopt') {
    return { exclude_modules: head, kv_cache_quant_algo: opts.kvCacheScales ? 'FP8' : null, quant_algo: 'FP8', quant_method: 'modelopt' };
  }
  const channel = (opts.strategy ?? 'channel') === 'channel';
  return {
    config_groups: {
      group_0: {
        input_activations: channel
          ? { actorder: null, block_structure: null, dynamic: true, group_size: null, num_bits: 8, observer: null, observer_kwargs: {}, strategy: 'token', symmetric: true, type: 'float' }
          : { actorder: null, block_structure: null, dynamic: false, group_size: null, num_bits: 8, observer: 'minmax', observer_kwargs: {}, strategy: 'tensor', symmetric: true, type: 'float' },
        output_activations: null,
        targets: ['Linear'],
        weights: { actorder: null, block_structure: null, dynamic: false, group_size: null, num_bits: 8, observer: 'minmax', observer_kwargs: {}, strategy: channel ? 'channel' : 'tensor', symmetric: true, type: 'float' },
      },
    },
    format: 'float-quantized',
    global_compression_ratio: null,
    ignore: head,
    kv_cache_scheme: opts.kvCacheScales
      ? { dynamic: false, group_size: null, num_bits: 8, observer: 'minmax', strategy: 'tensor', symmetric: true, type: 'float' }
      : null,
    quant_method: 'compressed-tensors',
    quantization_status: 'compressed',
  };
}

/** Codes and scales of a [rows, cols] matrix: scales [scaleRows, scaleCols] over blocks of [bh, bw]. */
function quantizeMatrix(w: Float32Array, rows: number, cols: number, bh: number, bw: number) {
  const scaleRows = Math.ceil(rows / bh), scaleCols = Math.ceil(cols / bw);
  const scales = new Float32Array(scaleRows * scaleCols);
  const codes = new Uint8Array(rows * cols);
  for (let sr = 0; sr < scaleRows; sr++) {
    for (let sc = 0; sc < scaleCols; sc++) {
      let amax = 0;
      for (let r = sr * bh; r < Math.min(rows, (sr + 1) * bh); r++)
        for (let c = sc * bw; c < Math.min(cols, (sc + 1) * bw); c++) amax = Math.max(amax, Math.abs(w[r * cols + c]!));
      const scale = amax > 0 ? Math.fround(amax / E4M3_MAX) : 1;
      scales[sr * scaleCols + sc] = scale;
      for (let r = sr * bh; r < Math.min(rows, (sr + 1) * bh); r++)
        for (let c = sc * bw; c < Math.min(cols, (sc + 1) * bw); c++) codes[r * cols + c] = e4m3Encode(w[r * cols + c]! / scale);
    }
  }
  return { codes, scales, scaleShape: [scaleRows, scaleCols] };
}

/**
 * Rewrites the f32 safetensors of `dir` (model.safetensors or the shards of its index) in an FP8
 * layout, the unquantized tensors in `dtype`. Returns quantization_config for config.json, which
 * the caller writes. Reads one shard at a time.
 */
export function quantizeFp8Checkpoint(dir: string, dtype: Dtype, opts: Fp8Options): Record<string, unknown> {
  const [bh, bw] = opts.layout === 'fp8-block' ? (opts.blockSize ?? [128, 128]) : [Infinity, Infinity];
  rewriteF32Checkpoint(dir, 'fp8 writer', (t, values): StoredTensor[] => {
    const quantize = t.shape.length === 2 && (QUANTIZED_PROJECTION.test(t.name) || (opts.quantizeLmHead === true && /(^|\.)lm_head\.weight$/.test(t.name)));
    if (!quantize) return [{ name: t.name, dtype: safetensorsDtype(dtype), shape: t.shape, bytes: toStoredBytes(values, values.length, dtype) }];
    const [rows, cols] = t.shape as [number, number];
    const perRow = opts.layout === 'fp8-compressed-tensors' && (opts.strategy ?? 'channel') === 'channel';
    const q = quantizeMatrix(values, rows, cols, perRow ? 1 : Math.min(bh, rows), Math.min(bw, cols));
    const out: StoredTensor[] = [{ name: t.name, dtype: 'F8_E4M3', shape: t.shape, bytes: q.codes }];
    const kv = opts.kvCacheScales;
    if (kv && t.name.endsWith('.self_attn.k_proj.weight')) {
      const attn = t.name.slice(0, -'k_proj.weight'.length);
      const modelopt = opts.layout === 'fp8-modelopt';
      for (const [which, value] of [['k', kv.k], ['v', kv.v]] as const) {
        out.push({ name: modelopt ? `${attn}${which}_proj.${which}_scale` : `${attn}${which}_scale`, dtype: 'F32',
          shape: modelopt ? [] : [1], bytes: bytesOf(Float32Array.of(value)) });
      }
    }
    if (opts.layout === 'fp8-block') {
      out.push({ name: `${t.name}_scale_inv`, dtype: 'F32', shape: q.scaleShape, bytes: bytesOf(q.scales) });
    } else if (opts.layout === 'fp8-compressed-tensors') {
      out.push({ name: `${t.name}_scale`, dtype: 'F32', shape: perRow ? [rows, 1] : [1], bytes: bytesOf(q.scales) });
      // A static activation scale as a calibration would give inputs of rms ~1 (unused on the CPU).
      if (!perRow) out.push({ name: t.name.replace(/weight$/, 'input_scale'), dtype: 'F32', shape: [1], bytes: bytesOf(Float32Array.of(4 / E4M3_MAX)) });
    } else {
      out.push({ name: `${t.name}_scale`, dtype: 'F32', shape: [], bytes: bytesOf(q.scales) });
      out.push({ name: t.name.replace(/weight$/, 'input_scale'), dtype: 'F32', shape: [], bytes: bytesOf(Float32Array.of(4 / E4M3_MAX)) });
    }
    return out;
  });
  return fp8QuantizationConfig(opts);
}
