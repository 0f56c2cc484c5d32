// AWQ and GPTQ integer checkpoints in their published layouts, made from a written f32 checkpoint:
// each linear projection "<m>.weight" [out, in] is replaced by packed int32 codes, packed zero
// points and f16 scales ("<m>.qweight", "<m>.qzeros", "<m>.scales", GPTQ also "<m>.g_idx"); the
// embeddings, lm_head, norms, MoE routers and biases stay in the checkpoint's dtype. G: group size.
// - awq (AutoAWQ, version "gemm", 4 bits, zero_point): qweight I32 [in, out / 8] and qzeros I32
//   [in / G, out / 8] packed along the outputs in AWQ's order (nibble i of word c holds output
//   c * 8 + AWQ_ORDER[i]), scales F16 [in / G, out];
// - gptq (AutoGPTQ / optimum): qweight I32 [in * bits / 32, out] packed along the inputs (value i
//   of word r is input r * 32 / bits + i), qzeros I32 [groups, out * bits / 32] packed along the
//   outputs, scales F16 [groups, out], g_idx I32 [in] (each input's group). checkpoint_format
//   "gptq" (v1) stores zero - 1 and its dequantizers add 1 back; "gptq_v2" stores the zero.
//   gptq-act-order: desc_act, each group a set of inputs taken in decreasing order of their
//   weights' column norm (g_idx[perm[i]] = i / G); gptq-8bit: 8 bits, 4 values a word.
// Dequantized: w[j, k] = scales[g(k), j] * (q[k, j] - zero[g(k), j]).

import { bytesOf, checkpointShapes, QUANTIZED_PROJECTION, rewriteF32Checkpoint, type StoredTensor } from './checkpoint-rewrite.js';
import { type Dtype, safetensorsDtype } from './presets.js';
import { toStoredBytes } from './weights.js';

export const INT_LAYOUTS = ['awq', 'gptq', 'gptq-act-order', 'gptq-8bit'] as const;
export type IntLayout = (typeof INT_LAYOUTS)[number];

export interface IntQuantOptions {
  layout: IntLayout;
  /** Inputs sharing a scale and zero. Default: 128, or the largest of 64, 32, 16 that divides the
   * inputs of every quantized matrix. GPTQ also takes -1: one group over all of a matrix's inputs. */
  groupSize?: number;
  /** GPTQ: symmetric, zero 2^(bits - 1) (default); false: asymmetric min/max with a zero per group. */
  sym?: boolean;
  /** GPTQ: act-order groups (desc_act); true for gptq-act-order, default false for gptq. */
  descAct?: boolean;
  /** GPTQ: bits per weight, 4 or 8; 8 for gptq-8bit, default 4 for gptq. */
  bits?: 4 | 8;
  /** GPTQ: 'gptq' (v1, zero - 1 stored; default) or 'gptq_v2' (GPTQModel, the zero as is). */
  checkpointFormat?: 'gptq' | 'gptq_v2';
}

/** The options resolved against the checkpoint: what the writer does and config.json says. */
export interface IntQuantParams {
  method: 'awq' | 'gptq';
  bits: 4 | 8;
  /** > 0, or -1 (GPTQ): one group per matrix. */
  groupSize: number;
  sym: boolean;
  descAct: boolean;
  checkpointFormat: 'gptq' | 'gptq_v2';
}

const GPTQ_ONLY = ['sym', 'descAct', 'bits', 'checkpointFormat'] as const;

/** Throws naming the field when `opts` is not valid IntQuantOptions (the library API takes it unchecked). */
export function checkIntQuantOptions(opts: unknown): asserts opts is IntQuantOptions {
  const o = opts as Partial<IntQuantOptions> | null;
  if (typeof o !== 'object' || o === null || !(INT_LAYOUTS as readonly unknown[]).includes(o.layout)) {
    throw new Error(`quantize must be { layout: ${INT_LAYOUTS.map((l) => `'${l}'`).join(' | ')}, ... }, got ${JSON.stringify(opts)}`);
  }
  const awq = o.layout === 'awq';
  if (awq) {
    for (const k of GPTQ_ONLY) {
      if (o[k] !== undefined) throw new Error(`quantize.${k} applies to the GPTQ layouts; AWQ ("gemm") is 4 bits with a zero per group`);
    }
  }
  if (o.groupSize !== undefined && !(Number.isInteger(o.groupSize) && (o.groupSize > 0 || (o.groupSize === -1 && !awq)))) {
    throw new Error(`quantize.groupSize must be a positive integer${awq ? '' : ' or -1 (one group per matrix)'}, got ${JSON.stringify(o.groupSize)}`);
  }
  if (o.sym !== undefined && typeof o.sym !== 'boolean') throw new Error(`quantize.sym must be a boolean, got ${JSON.stringify(o.sym)}`);
  if (o.descAct !== undefined && typeof o.descAct !== 'boolean') throw new Error(`quantize.descAct must be a boolean, got ${JSON.stringify(o.descAct)}`);
  if (o.descAct === false && o.layout === 'gptq-act-order') throw new Error('quantize.descAct cannot be false for layout gptq-act-order');
  if (o.bits !== undefined && o.bits !== 4 && o.bits !== 8) throw new Error(`quantize.bits must be 4 or 8, got ${JSON.stringify(o.bits)}`);
  if (o.bits === 4 && o.layout === 'gptq-8bit') throw new Error('quantize.bits cannot be 4 for layout gptq-8bit');
  if (o.checkpointFormat !== undefined && o.checkpointFormat !== 'gptq' && o.checkpointFormat !== 'gptq_v2') {
    throw new Error(`quantize.checkpointFormat must be 'gptq' or 'gptq_v2', got ${JSON.stringify(o.checkpointFormat)}`);
  }
}

/** Whether the writer quantizes this tensor: a 2-D linear projection (not lm_head, embeddings or routers). */
export const isIntQuantized = (name: string, shape: number[]) => shape.length === 2 && QUANTIZED_PROJECTION.test(name);

/**
 * The parameters for a checkpoint's tensors (name and shape; the unquantized ones are skipped):
 * resolves the default group size and throws naming the first matrix the layout cannot pack.
 */
export function planIntQuantization(tensors: Array<{ name: string; shape: number[] }>, opts: IntQuantOptions): IntQuantParams {
  checkIntQuantOptions(opts);
  const method = opts.layout === 'awq' ? 'awq' : 'gptq';
  const matrices = tensors.filter((t) => isIntQuantized(t.name, t.shape)).map((t) => ({ name: t.name, out: t.shape[0]!, inp: t.shape[1]! }));
  let groupSize = opts.groupSize;
  if (groupSize === undefined) {
    groupSize = [128, 64, 32, 16].find((g) => matrices.every((m) => m.inp % g === 0));
    if (groupSize === undefined) {
      const m = matrices.find((x) => x.inp % 16 !== 0)!;
      throw new Error(`${method} writer: no default group size: ${m.name} [${m.out}, ${m.inp}] has ${m.inp} inputs, not a multiple of 16; give quantize.groupSize`);
    }
  }
  const p: IntQuantParams = {
    method,
    bits: opts.bits ?? (opts.layout === 'gptq-8bit' ? 8 : 4),
    groupSize,
    sym: method === 'gptq' && (opts.sym ?? true),
    descAct: opts.descAct ?? opts.layout === 'gptq-act-order',
    checkpointFormat: opts.checkpointFormat ?? 'gptq',
  };
  const perWord = 32 / p.bits;
  for (const { name, out, inp } of matrices) {
    const at = `${method} writer: ${name} [${out}, ${inp}]`;
    if (groupSize !== -1 && inp % groupSize !== 0) throw new Error(`${at}: ${inp} inputs are not a multiple of the group size ${groupSize}`);
    if (method === 'awq' && out % 8 !== 0) throw new Error(`${at}: ${out} outputs are not a multiple of 8 (AWQ packs 8 outputs a word)`);
    if (method === 'gptq' && inp % perWord !== 0) throw new Error(`${at}: ${inp} inputs are not a multiple of ${perWord} (GPTQ packs ${perWord} inputs a word)`);
    if (method === 'gptq' && out % perWord !== 0) throw new Error(`${at}: ${out} outputs are not a multiple of ${perWord} (GPTQ packs ${perWord} zeros a word)`);
  }
  return p;
}

/** config.json's quantization_config, with the fields and order of the published ones. */
export function intQuantizationConfig(p: IntQuantParams): Record<string, unknown> {
  if (p.method === 'awq') {
    return { quant_method: 'awq', bits: 4, group_size: p.groupSize, zero_point: true, version: 'gemm', modules_to_not_convert: null };
  }
  return {
    quant_method: 'gptq', bits: p.bits, group_size: p.groupSize, desc_act: p.descAct, sym: p.sym, damp_percent: 0.01,
    true_sequential: true, static_groups: false, checkpoint_format: p.checkpointFormat, model_name_or_path: null, model_file_base_name: null,
  };
}

// ---------------------------------------------------------------- packing

/** AutoAWQ's order of 8 outputs in a word: nibble i holds output AWQ_ORDER[i] of the 8. */
export const AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7] as const;

/** [rows, cols] 4-bit values -> [rows, cols / 8] words, along the columns in AWQ's order. */
export function packAwq(values: ArrayLike<number>, rows: number, cols: number): Int32Array {
  const words = new Int32Array(rows * (cols / 8));
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols / 8; c++) {
      let w = 0;
      for (let i = 0; i < 8; i++) w |= (values[r * cols + c * 8 + AWQ_ORDER[i]!]! & 15) << (4 * i);
      words[r * (cols / 8) + c] = w;
    }
  }
  return words;
}

export function unpackAwq(words: Int32Array, rows: number, cols: number): Uint8Array {
  const values = new Uint8Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols / 8; c++) {
      const w = words[r * (cols / 8) + c]!;
      for (let i = 0; i < 8; i++) values[r * cols + c * 8 + AWQ_ORDER[i]!] = (w >>> (4 * i)) & 15;
    }
  }
  return values;
}

/** [rows, cols] values of `bits` -> [rows * bits / 32, cols] words: value i of word [r, c] is row r * 32 / bits + i. */
export function packGptqRows(values: ArrayLike<number>, rows: number, cols: number, bits: 4 | 8): Int32Array {
  const per = 32 / bits, mask = (1 << bits) - 1;
  const words = new Int32Array((rows / per) * cols);
  for (let r = 0; r < rows; r++) {
    const shift = (r % per) * bits, row = Math.floor(r / per) * cols;
    for (let c = 0; c < cols; c++) words[row + c]! |= (values[r * cols + c]! & mask) << shift;
  }
  return words;
}

export function unpackGptqRows(words: Int32Array, rows: number, cols: number, bits: 4 | 8): Uint8Array {
  const per = 32 / bits, mask = (1 << bits) - 1;
  const values = new Uint8Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    const shift = (r % per) * bits, row = Math.floor(r / per) * cols;
    for (let c = 0; c < cols; c++) values[r * cols + c] = (words[row + c]! >>> shift) & mask;
  }
  return values;
}

/** [rows, cols] values of `bits` -> [rows, cols * bits / 32] words: value i of word [r, c] is column c * 32 / bits + i. */
export function packGptqCols(values: ArrayLike<number>, rows: number, cols: number, bits: 4 | 8): Int32Array {
  const per = 32 / bits, mask = (1 << bits) - 1;
  const words = new Int32Array(rows * (cols / per));
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) words[r * (cols / per) + Math.floor(c / per)]! |= (values[r * cols + c]! & mask) << ((c % per) * bits);
  }
  return words;
}

export function unpackGptqCols(words: Int32Array, rows: number, cols: number, bits: 4 | 8): Uint8Array {
  const per = 32 / bits, mask = (1 << bits) - 1;
  const values = new Uint8Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) values[r * cols + c] = (words[r * (cols / per) + Math.floor(c / per)]! >>> ((c % per) * bits)) & mask;
  }
  return values;
}

// ---------------------------------------------------------------- quantization

const F16_MAX = 65504;

/** The smallest f16 value >= x (x > 0): a scale rounded up keeps its group within the code range. */
export function f16AtLeast(x: number): number {
  let e = Math.floor(Math.log2(x));
  if (2 ** e > x) e--;
  if (2 ** (e + 1) <= x) e++;
  const spacing = 2 ** (Math.max(e, -14) - 10);  // 11 significant bits; subnormals below 2^-14
  const v = Math.ceil(x / spacing) * spacing;  // x / spacing is exact: a power-of-two division
  if (v > F16_MAX) throw new Error(`int writer: a scale of ${x} is past f16's largest value`);
  return v;
}

/** IEEE binary16 bits of a value that is exactly an f16 (>= 0). */
export function f16Bits(v: number): number {
  if (v < 2 ** -14) return v / 2 ** -24;
  const e = Math.floor(Math.log2(v));
  return ((e + 15) << 10) | (v / 2 ** (e - 10) - 1024);
}

/** One [out, in] matrix quantized: codes, zeros and scales as the layouts pack them. */
export interface IntMatrix {
  /** [in, out]: the code of input k for output j, 0..2^bits - 1. */
  codes: Uint8Array;
  /** [groups, out]: the zero the dequantizer subtracts (v1 GPTQ stores it minus 1). */
  zeros: Uint8Array;
  /** [groups, out]: the scales, each exactly an f16 value. */
  scales: Float64Array;
  /** [in]: each input's group. */
  gIdx: Int32Array;
  groups: number;
}

/**
 * Round-to-nearest codes against the stored (f16) scales. Each group covers [lo, hi] = [min(x, 0),
 * max(x, 0)] without clamping, so every element is within half its scale of its value:
 * symmetric: scale = max(hi / (2^(b-1) - 1), -lo / 2^(b-1)), zero 2^(b-1) (AutoGPTQ's 2 * absmax /
 * maxq would clamp the largest positive value); asymmetric: scale = (hi - lo) / maxq, zero =
 * round(-lo / scale). Scales are rounded up to f16. v1 GPTQ's zeros are 1..maxq (stored minus 1
 * in `bits`), so a group that would take zero 0 has its scale widened to put hi at code maxq - 1.
 * An all-zero group gets scale 1 and codes equal to its zero.
 */
export function quantizeIntMatrix(w: Float32Array, out: number, inp: number, p: IntQuantParams): IntMatrix {
  const g = p.groupSize === -1 ? inp : p.groupSize;
  const groups = inp / g;
  const gIdx = new Int32Array(inp);
  if (p.descAct) {
    const norm = new Float64Array(inp);
    for (let j = 0; j < out; j++) for (let k = 0; k < inp; k++) norm[k]! += w[j * inp + k]! ** 2;
    const perm = Array.from({ length: inp }, (_, k) => k).sort((a, b) => norm[b]! - norm[a]! || a - b);
    perm.forEach((k, i) => (gIdx[k] = Math.floor(i / g)));
  } else {
    for (let k = 0; k < inp; k++) gIdx[k] = Math.floor(k / g);
  }
  const members: number[][] = Array.from({ length: groups }, () => []);
  for (let k = 0; k < inp; k++) members[gIdx[k]!]!.push(k);

  const maxq = 2 ** p.bits - 1, half = 2 ** (p.bits - 1);
  const zeroMin = p.method === 'gptq' && p.checkpointFormat === 'gptq' && !p.sym ? 1 : 0;
  const codes = new Uint8Array(inp * out), zeros = new Uint8Array(groups * out), scales = new Float64Array(groups * out);
  for (let gr = 0; gr < groups; gr++) {
    const ks = members[gr]!;
    for (let j = 0; j < out; j++) {
      let lo = 0, hi = 0;
      for (const k of ks) {
        const x = w[j * inp + k]!;
        if (x < lo) lo = x;
        if (x > hi) hi = x;
      }
      let scale = 1, zero = p.sym ? half : zeroMin;
      if (p.sym && (lo < 0 || hi > 0)) {
        scale = f16AtLeast(Math.max(hi / (half - 1), -lo / half));
      } else if (lo < 0 || hi > 0) {
        let exact = (hi - lo) / maxq;
        if (Math.round(-lo / exact) < zeroMin) exact = Math.max(exact, hi / (maxq - zeroMin));
        scale = f16AtLeast(exact);
        zero = Math.min(maxq, Math.max(zeroMin, Math.round(-lo / scale)));
      }
      scales[gr * out + j] = scale;
      zeros[gr * out + j] = zero;
      for (const k of ks) codes[k * out + j] = Math.min(maxq, Math.max(0, Math.round(w[j * inp + k]! / scale) + zero));
    }
  }
  return { codes, zeros, scales, gIdx, groups };
}

/** The tensors replacing "<base>.weight" [out, in] in a layout. */
export function intTensors(base: string, m: IntMatrix, out: number, inp: number, p: IntQuantParams): StoredTensor[] {
  const scales = { name: `${base}.scales`, dtype: 'F16', shape: [m.groups, out], bytes: bytesOf(Uint16Array.from(m.scales, f16Bits)) };
  if (p.method === 'awq') {
    return [
      { name: `${base}.qweight`, dtype: 'I32', shape: [inp, out / 8], bytes: bytesOf(packAwq(m.codes, inp, out)) },
      { name: `${base}.qzeros`, dtype: 'I32', shape: [m.groups, out / 8], bytes: bytesOf(packAwq(m.zeros, m.groups, out)) },
      scales,
    ];
  }
  const per = 32 / p.bits;
  // NOTE: v1 stores zero - 1 in `bits` bits (AutoGPTQ's pack); the writer's v1 zeros are >= 1.
  const stored = p.checkpointFormat === 'gptq' ? m.zeros.map((z) => z - 1) : m.zeros;
  return [
    { name: `${base}.qweight`, dtype: 'I32', shape: [inp / per, out], bytes: bytesOf(packGptqRows(m.codes, inp, out, p.bits)) },
    { name: `${base}.qzeros`, dtype: 'I32', shape: [m.groups, out / per], bytes: bytesOf(packGptqCols(stored, m.groups, out, p.bits)) },
    scales,
    { name: `${base}.g_idx`, dtype: 'I32', shape: [inp], bytes: bytesOf(m.gIdx) },
  ];
}

/**
 * Rewrites the f32 safetensors of `dir` (model.safetensors or the shards of its index) in an AWQ
 * or GPTQ layout, the unquantized tensors in `dtype` (scales F16 whatever it is, as published).
 * Returns quantization_config for config.json, which the caller writes.
 */
export function quantizeIntCheckpoint(dir: string, dtype: Dtype, opts: IntQuantOptions): Record<string, unknown> {
  const p = planIntQuantization(checkpointShapes(dir), opts);
  rewriteF32Checkpoint(dir, `${p.method} writer`, (t, values) => {
    if (!isIntQuantized(t.name, t.shape)) return [{ name: t.name, dtype: safetensorsDtype(dtype), shape: t.shape, bytes: toStoredBytes(values, values.length, dtype) }];
    const [out, inp] = t.shape as [number, number];
    return intTensors(t.name.slice(0, -'.weight'.length), quantizeIntMatrix(values, out, inp, p), out, inp, p);
  });
  return intQuantizationConfig(p);
}
