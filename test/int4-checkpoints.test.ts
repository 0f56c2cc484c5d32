// AWQ and GPTQ checkpoints in their published layouts (written by `make-model --quantize awq|gptq|
// gptq-act-order|gptq-8bit`): the packing of each layout, the float64 reference's dequantizer on
// hand-built tensors, written checkpoints against the f32 weights they were quantized from, and
// the writer's refusals. Also ggml's Q4_0 blocks of the llama.cpp bench peer's GGUF.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { quantizeQ4_0 } from '../bench/gguf.js';
import {
  AWQ_ORDER, type IntQuantOptions, type IntQuantParams, packAwq, packGptqCols, packGptqRows, quantizeIntMatrix, unpackAwq, unpackGptqCols,
  unpackGptqRows,
} from '../models/int4-checkpoint.js';
import { makeModel, type QuantizeOptions } from '../models/make-model.js';
import { dequantizeAwqGptq } from './reference/int4.js';
import { type RefTensor, readSafetensorsDir } from './reference/safetensors-reader.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-int4-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Deterministic pseudo-random integers in [0, n). */
function randomInts(count: number, n: number, seed: number): Uint8Array {
  let s = seed >>> 0;
  return Uint8Array.from({ length: count }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s >>> 16) % n;
  });
}

describe('packing', () => {
  it('AWQ: nibble i of a word holds output 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]', () => {
    expect(AWQ_ORDER).toEqual([0, 2, 4, 6, 1, 3, 5, 7]);
    // Outputs 0..7 hold 1..8: nibbles (low first) 1, 3, 5, 7, 2, 4, 6, 8.
    expect(packAwq([1, 2, 3, 4, 5, 6, 7, 8], 1, 8)[0]! >>> 0).toBe(0x86427531);
    const values = randomInts(6 * 24, 16, 1);
    const words = packAwq(values, 6, 24);
    expect(words.length).toBe(6 * 3);
    expect(unpackAwq(words, 6, 24)).toEqual(values);
  });

  it('GPTQ qweight: value i of word [r, j] is input r * 32 / bits + i of output j', () => {
    // One output, inputs 0..7 holding 1..8 (4 bits) and inputs 0..3 holding 1, 2, 3, 255 (8 bits).
    expect(packGptqRows([1, 2, 3, 4, 5, 6, 7, 8], 8, 1, 4)[0]! >>> 0).toBe(0x87654321);
    expect(packGptqRows([1, 2, 3, 255], 4, 1, 8)[0]! >>> 0).toBe(0xff030201);
    // Two outputs: the words of a row are one per output.
    expect([...packGptqRows([1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 8, 0], 8, 2, 4)].map((w) => w >>> 0)).toEqual([0x87654321, 0x0fedcba9]);
    for (const bits of [4, 8] as const) {
      const values = randomInts(32 * 5, 2 ** bits, bits);
      const words = packGptqRows(values, 32, 5, bits);
      expect(words.length).toBe((32 * bits / 32) * 5);
      expect(unpackGptqRows(words, 32, 5, bits)).toEqual(values);
    }
  });

  it('GPTQ qzeros: value i of word [g, c] is output c * 32 / bits + i', () => {
    expect(packGptqCols([1, 2, 3, 4, 5, 6, 7, 15], 1, 8, 4)[0]! >>> 0).toBe(0xf7654321);
    expect(packGptqCols([127, 127, 0, 255], 1, 4, 8)[0]! >>> 0).toBe(0xff007f7f);
    for (const bits of [4, 8] as const) {
      const values = randomInts(3 * 16, 2 ** bits, 10 + bits);
      const words = packGptqCols(values, 3, 16, bits);
      expect(words.length).toBe(3 * (16 * bits / 32));
      expect(unpackGptqCols(words, 3, 16, bits)).toEqual(values);
    }
  });
});

// ---------------------------------------------------------------- the reference's dequantizer

const int32 = (u: number) => u | 0;
const tensor = (dtype: string, shape: number[], values: number[]): RefTensor => ({ dtype, shape, data: Float64Array.from(values) });
/** The reference's [out, in] weight of module `m` from hand-built tensors and a quantization_config. */
function dequantized(parts: Record<string, RefTensor>, q: Record<string, unknown>): number[][] {
  const tensors = new Map(Object.entries(parts).map(([k, v]) => [`m.${k}`, v]));
  dequantizeAwqGptq(tensors, { quantization_config: q });
  expect([...tensors.keys()]).toEqual(['m.weight']);
  const w = tensors.get('m.weight')!;
  const [out, inp] = w.shape as [number, number];
  return Array.from({ length: out }, (_, j) => [...w.data.subarray(j * inp, (j + 1) * inp)]);
}

describe('the reference dequantizes hand-built AWQ and GPTQ tensors', () => {
  const AWQ = { quant_method: 'awq', bits: 4, group_size: 2, zero_point: true, version: 'gemm', modules_to_not_convert: null };
  const GPTQ = { quant_method: 'gptq', bits: 4, group_size: 4, desc_act: false, sym: true, checkpoint_format: 'gptq' };

  it('AWQ: codes and zeros in the interleaved order, scales per output', () => {
    // 2 inputs x 8 outputs, one group. Input 0: output j has code j; input 1: code 15 everywhere.
    // Zeros: output j has zero j + 8. Scales 0.5, output 1's 2.
    const w = dequantized({
      qweight: tensor('I32', [2, 1], [int32(0x75316420), int32(0xffffffff)]),
      qzeros: tensor('I32', [1, 1], [int32(0xfdb9eca8)]),
      scales: tensor('F16', [1, 8], [0.5, 2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]),
    }, AWQ);
    expect(w.map((row) => row[0])).toEqual([-4, -16, -4, -4, -4, -4, -4, -4]);
    expect(w.map((row) => row[1])).toEqual([3.5, 12, 2.5, 2, 1.5, 1, 0.5, 0]);
  });

  // 8 inputs x 8 outputs, groups of 4: output 0's codes are 0..7 (word 0x76543210), the others 8.
  // Zeros stored 7 (v1: 8), but group 1's output 0 stores 15 (v1: 16, the format's quirk); scales
  // 1, group 1's output 0 0.25.
  const gptq = (gIdx: number[] | null) => ({
    qweight: tensor('I32', [1, 8], [0x76543210, ...Array(7).fill(int32(0x88888888))]),
    qzeros: tensor('I32', [2, 1], [0x77777777, 0x7777777f]),
    scales: tensor('F16', [2, 8], [...Array(8).fill(1), 0.25, ...Array(7).fill(1)]),
    ...(gIdx && { g_idx: tensor('I32', [8], gIdx) }),
  });

  it('GPTQ v1: the zero is the stored value + 1, unmasked (a stored 15 is 16)', () => {
    const w = dequantized(gptq([0, 0, 0, 0, 1, 1, 1, 1]), GPTQ);
    expect(w[0]).toEqual([-8, -7, -6, -5, 0.25 * (4 - 16), 0.25 * (5 - 16), 0.25 * (6 - 16), 0.25 * (7 - 16)]);
    for (let j = 1; j < 8; j++) expect(w[j]).toEqual(Array(8).fill(0));
  });

  it('GPTQ v2 (checkpoint_format gptq_v2): the zero as stored', () => {
    const w = dequantized(gptq([0, 0, 0, 0, 1, 1, 1, 1]), { ...GPTQ, checkpoint_format: 'gptq_v2' });
    expect(w[0]).toEqual([-7, -6, -5, -4, 0.25 * (4 - 15), 0.25 * (5 - 15), 0.25 * (6 - 15), 0.25 * (7 - 15)]);
    for (let j = 1; j < 8; j++) expect(w[j]).toEqual(Array(8).fill(1));
  });

  it('GPTQ act-order: each input takes the scale and zero of its g_idx group', () => {
    const w = dequantized(gptq([1, 0, 1, 0, 1, 0, 1, 0]), { ...GPTQ, desc_act: true });
    expect(w[0]).toEqual([-4, -7, -3.5, -5, -3, -3, -2.5, -1]);
  });

  it('GPTQ group_size -1: one group over all inputs (g_idx absent: k / G)', () => {
    const parts = gptq(null);
    parts.qzeros = tensor('I32', [1, 1], [0x7777777f]);
    parts.scales = tensor('F16', [1, 8], [0.25, ...Array(7).fill(1)]);
    const w = dequantized(parts, { ...GPTQ, group_size: -1 });
    expect(w[0]).toEqual([0, 1, 2, 3, 4, 5, 6, 7].map((k) => 0.25 * (k - 16)));
  });

  it('GPTQ 8 bits: 4 values a word, zero stored + 1 up to 256', () => {
    // 4 inputs x 4 outputs: output 0's codes 0, 1, 128, 255, the others 128; stored zeros 127,
    // 127, 0, 255 (v1: 128, 128, 1, 256); scales 1, output 2's 0.5.
    const w = dequantized({
      qweight: tensor('I32', [1, 4], [int32(0xff800100), int32(0x80808080), int32(0x80808080), int32(0x80808080)]),
      qzeros: tensor('I32', [1, 1], [int32(0xff007f7f)]),
      scales: tensor('F16', [1, 4], [1, 1, 0.5, 1]),
      g_idx: tensor('I32', [4], [0, 0, 0, 0]),
    }, { ...GPTQ, bits: 8, group_size: -1 });
    expect(w).toEqual([[-128, -127, 0, 127], [0, 0, 0, 0], [63.5, 63.5, 63.5, 63.5], [-128, -128, -128, -128]]);
  });

  it('refuses missing tensors, wrong shapes, g_idx out of range and unknown variants, naming them', () => {
    const run = (parts: Record<string, RefTensor>, q: Record<string, unknown>) => () => dequantized(parts, q);
    const { scales: _, ...noScales } = gptq([0, 0, 0, 0, 1, 1, 1, 1]);
    expect(run(noScales, GPTQ)).toThrow(/m\.qweight has no m\.scales/);
    expect(run(gptq([0, 0, 0, 0, 1, 1, 1, 1]), { ...GPTQ, group_size: 2 })).toThrow(/m\.scales has shape \[2,8\], expected \[4,8\]/);
    expect(run(gptq([0, 0, 0, 0, 1, 1, 1, 2]), GPTQ)).toThrow(/m\.g_idx\[7\] is 2, not a group of 2/);
    expect(run(gptq(null), { ...GPTQ, checkpoint_format: 'marlin' })).toThrow(/checkpoint_format marlin/);
    expect(run(gptq(null), { quant_method: 'awq', version: 'gemv' })).toThrow(/AWQ version gemv/);
    expect(run(gptq(null), { quant_method: 'fp8' })).toThrow(/m\.qweight but quant_method is fp8/);
  });
});

// ---------------------------------------------------------------- the writer's quantizer

describe('the writer quantizes each group within half its scale', () => {
  const params = (over: Partial<IntQuantParams>): IntQuantParams =>
    ({ method: 'gptq', bits: 4, groupSize: 4, sym: true, descAct: false, checkpointFormat: 'gptq', ...over });
  // [2, 8]: row 0 groups all 0.3 and all 0; row 1 all -0.7 and mixed values.
  const w = Float32Array.from([0.3, 0.3, 0.3, 0.3, 0, 0, 0, 0, -0.7, -0.7, -0.7, -0.7, 0.1, -0.25, 0.5, 0.05]);

  it.each([
    ['awq', params({ method: 'awq', sym: false })],
    ['gptq sym', params({})],
    ['gptq asym v1', params({ sym: false })],
    ['gptq asym v2', params({ sym: false, checkpointFormat: 'gptq_v2' })],
    ['gptq 8-bit', params({ bits: 8 })],
  ])('%s: positive f16 scales, all-equal groups reproduced to f16 precision, all-zero groups exactly', (_, p) => {
    const m = quantizeIntMatrix(w, 2, 8, p);
    const zeroMin = p.method === 'gptq' && p.checkpointFormat === 'gptq' && !p.sym ? 1 : 0;
    for (let j = 0; j < 2; j++) {
      for (let k = 0; k < 8; k++) {
        const g = m.gIdx[k]!, scale = m.scales[g * 2 + j]!, zero = m.zeros[g * 2 + j]!;
        expect(scale).toBeGreaterThan(0);
        expect(zero).toBeGreaterThanOrEqual(zeroMin);
        const deq = scale * (m.codes[k * 2 + j]! - zero);
        const x = w[j * 8 + k]!;
        expect(Math.abs(deq - x)).toBeLessThanOrEqual(scale / 2);
        if (j === 0 || k < 4) expect(Math.abs(deq - x)).toBeLessThanOrEqual(Math.abs(x) * 2 ** -10);
      }
    }
  });
});

// ---------------------------------------------------------------- written checkpoints

interface Variant {
  preset: string;
  dtype: 'f32' | 'bf16';
  quantize: IntQuantOptions;
  /** The group size config.json says (the default resolved). */
  groupSize: number;
  shardBytes?: number;
}

const VARIANTS: Variant[] = [
  { preset: 'test-qwen3', dtype: 'bf16', quantize: { layout: 'awq' }, groupSize: 64 },  // o_proj has 192 inputs
  { preset: 'test-qwen2', dtype: 'bf16', quantize: { layout: 'awq', groupSize: 128 }, groupSize: 128 },
  { preset: 'test-llama', dtype: 'f32', quantize: { layout: 'gptq', groupSize: 32 }, groupSize: 32 },
  { preset: 'test-qwen2', dtype: 'bf16', quantize: { layout: 'gptq-act-order' }, groupSize: 128 },
  { preset: 'test-mixtral', dtype: 'bf16', quantize: { layout: 'gptq-8bit', groupSize: -1 }, groupSize: -1 },
  // Asymmetric v1 (zeros stored minus 1), sharded.
  { preset: 'test-qwen3-moe', dtype: 'bf16', quantize: { layout: 'gptq', sym: false }, groupSize: 16, shardBytes: 100_000 },
  { preset: 'test-llama', dtype: 'bf16', quantize: { layout: 'gptq-act-order', sym: false, checkpointFormat: 'gptq_v2', groupSize: 32 }, groupSize: 32 },
];

function publishedConfig(v: Variant): Record<string, unknown> {
  if (v.quantize.layout === 'awq') {
    return { quant_method: 'awq', bits: 4, group_size: v.groupSize, zero_point: true, version: 'gemm', modules_to_not_convert: null };
  }
  return {
    quant_method: 'gptq', bits: v.quantize.layout === 'gptq-8bit' ? 8 : 4, group_size: v.groupSize,
    desc_act: v.quantize.layout === 'gptq-act-order', sym: v.quantize.sym ?? true, damp_percent: 0.01, true_sequential: true,
    static_groups: false, checkpoint_format: v.quantize.checkpointFormat ?? 'gptq', model_name_or_path: null, model_file_base_name: null,
  };
}

const PROJECTION = /\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)$/;

describe.each(VARIANTS)('$preset $quantize.layout %#', (v) => {
  let dir: string;
  let plain: Map<string, RefTensor>;
  beforeAll(async () => {
    dir = join(root, `${v.preset}-${JSON.stringify(v.quantize).replace(/\W/g, '')}`);
    await makeModel({ preset: v.preset, out: dir, dtype: v.dtype, seed: 5, quantize: v.quantize, shardBytes: v.shardBytes });
    const f32 = `${dir}-f32`;
    await makeModel({ preset: v.preset, out: f32, dtype: 'f32', seed: 5 });
    plain = readSafetensorsDir(f32);
  });

  it('config.json carries the published quantization_config, in its field order', () => {
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    const expected = publishedConfig(v);
    expect(config['quantization_config']).toEqual(expected);
    expect(Object.keys(config['quantization_config'] as object)).toEqual(Object.keys(expected));
  });

  it('stores each projection as the layout publishes it and dequantizes it within half a scale of its f32 weights', () => {
    const tensors = readSafetensorsDir(dir);
    const gptq = v.quantize.layout !== 'awq';
    const bits = v.quantize.layout === 'gptq-8bit' ? 8 : 4;
    const per = 32 / bits;
    const modules = [...plain.keys()].map((n) => n.replace(/\.weight$/, '')).filter((n) => PROJECTION.test(n));
    expect(modules.length).toBeGreaterThan(0);
    // Scales and g_idx before the reference replaces them.
    const kept = new Map(modules.map((m) => [m, { scales: tensors.get(`${m}.scales`)!, gIdx: tensors.get(`${m}.g_idx`), qzeros: tensors.get(`${m}.qzeros`)! }]));
    for (const m of modules) {
      const [out, inp] = plain.get(`${m}.weight`)!.shape as [number, number];
      const groups = v.groupSize === -1 ? 1 : inp / v.groupSize;
      expect(tensors.has(`${m}.weight`), m).toBe(false);
      const shapes = Object.fromEntries(['qweight', 'qzeros', 'scales', 'g_idx'].map((s) => [s, tensors.get(`${m}.${s}`) && [tensors.get(`${m}.${s}`)!.dtype, tensors.get(`${m}.${s}`)!.shape]]));
      expect(shapes, m).toEqual(gptq
        ? { qweight: ['I32', [inp / per, out]], qzeros: ['I32', [groups, out / per]], scales: ['F16', [groups, out]], g_idx: ['I32', [inp]] }
        : { qweight: ['I32', [inp, out / 8]], qzeros: ['I32', [groups, out / 8]], scales: ['F16', [groups, out]], g_idx: undefined });
    }
    dequantizeAwqGptq(tensors, JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')));

    for (const [name, t] of plain) {
      const m = name.replace(/\.weight$/, '');
      const got = tensors.get(name)!;
      expect(got.shape, name).toEqual(t.shape);
      if (!kept.has(m)) {
        // Not quantized: stored in the checkpoint's dtype (embeddings, norms, routers, lm_head, biases).
        expect(got.dtype, name).toBe(v.dtype.toUpperCase());
        continue;
      }
      const { scales, gIdx } = kept.get(m)!;
      const [out, inp] = t.shape as [number, number];
      const g = v.groupSize === -1 ? inp : v.groupSize;
      // The worst error in units of its element's scale (plain loops: an expect per element is slow).
      let worst = 0, smallestScale = Infinity;
      for (let j = 0; j < out; j++) {
        for (let k = 0; k < inp; k++) {
          const scale = scales.data[(gIdx ? gIdx.data[k]! : Math.floor(k / g)) * out + j]!;
          smallestScale = Math.min(smallestScale, scale);
          worst = Math.max(worst, Math.abs(got.data[j * inp + k]! - t.data[j * inp + k]!) / scale);
        }
      }
      expect(smallestScale, name).toBeGreaterThan(0);
      expect(worst, name).toBeLessThanOrEqual(0.5 + 1e-9);
    }

    if (gptq && v.quantize.sym === false && (v.quantize.checkpointFormat ?? 'gptq') === 'gptq') {
      // v1: the writer never stores 15 (a zero of 16 the dequantizers would read).
      for (const [m, { qzeros, scales }] of kept) {
        const stored = unpackGptqCols(Int32Array.from(qzeros.data), scales.shape[0]!, scales.shape[1]!, bits);
        expect(Math.max(...stored), m).toBeLessThan(15);
      }
    }
    if (v.quantize.layout === 'gptq-act-order') {
      // Groups of G inputs taken in decreasing order of their weights' column norm.
      let permuted = 0;
      for (const [m, { gIdx }] of kept) {
        const w = plain.get(`${m}.weight`)!;
        const [out, inp] = w.shape as [number, number];
        const norm = Array.from({ length: inp }, (_, k) => {
          let s = 0;
          for (let j = 0; j < out; j++) s += w.data[j * inp + k]! ** 2;
          return s;
        });
        const perm = norm.map((_, k) => k).sort((a, b) => norm[b]! - norm[a]! || a - b);
        expect(perm.map((k) => gIdx!.data[k]), m).toEqual(perm.map((_, i) => Math.floor(i / v.groupSize)));
        if ([...gIdx!.data].some((gk, k) => gk !== Math.floor(k / v.groupSize))) permuted++;
      }
      expect(permuted, 'matrices whose g_idx is not k / G').toBeGreaterThan(0);
    }
  });
});

describe("the writer's refusals, before anything is written", () => {
  it.each<[string, unknown, RegExp, Record<string, unknown>?]>([
    ['test-llama', { layout: 'int4' }, /quantize must be \{ layout: 'fp8-block' \| 'fp8-compressed-tensors' \| 'fp8-modelopt' \| 'awq' \| 'gptq' \| 'gptq-act-order' \| 'gptq-8bit'/],
    ['test-llama', { layout: 'awq', groupSize: -1 }, /quantize\.groupSize must be a positive integer, got -1/],
    ['test-llama', { layout: 'gptq', groupSize: 0 }, /quantize\.groupSize must be a positive integer or -1/],
    ['test-llama', { layout: 'awq', sym: true }, /quantize\.sym applies to the GPTQ layouts/],
    ['test-llama', { layout: 'gptq', bits: 3 }, /quantize\.bits must be 4 or 8, got 3/],
    ['test-llama', { layout: 'gptq-8bit', bits: 4 }, /quantize\.bits cannot be 4 for layout gptq-8bit/],
    ['test-llama', { layout: 'gptq-act-order', descAct: false }, /quantize\.descAct cannot be false/],
    ['test-llama', { layout: 'gptq', checkpointFormat: 'marlin' }, /quantize\.checkpointFormat must be 'gptq' or 'gptq_v2'/],
    ['test-llama', { layout: 'gptq', groupSize: 128 }, /gptq writer: model\.layers\.0\.mlp\.down_proj\.weight \[128, 352\]: 352 inputs are not a multiple of the group size 128/],
    ['test-llama', { layout: 'awq', groupSize: 8 }, /awq writer: model\.layers\.0\.self_attn\.k_proj\.weight \[30, 128\]: 30 outputs are not a multiple of 8/,
      { numKvHeads: 1, headDim: 30, numHeads: 4 }],
    ['test-llama', { layout: 'awq' }, /no default group size: model\.layers\.0\.mlp\.down_proj\.weight \[128, 360\] has 360 inputs, not a multiple of 16; give quantize\.groupSize/,
      { intermediateSize: 360 }],
    ['test-gpt-oss', { layout: 'gptq' }, /test-gpt-oss: gpt-oss is published with MXFP4 experts; FP8, AWQ and GPTQ layouts are written for the other families/],
  ])('%s %j', async (preset, quantize, message, overrides) => {
    const dir = join(root, `refused-${preset}-${JSON.stringify(quantize).replace(/\W/g, '')}-${overrides ? 'o' : ''}`);
    await expect(makeModel({ preset, out: dir, quantize: quantize as QuantizeOptions, ...(overrides && { overrides }) })).rejects.toThrow(message);
    expect(() => readdirSync(dir)).toThrow();
  });
});

// ---------------------------------------------------------------- GGUF Q4_0 (bench/gguf.ts)

describe("ggml's Q4_0 blocks", () => {
  it('d = max / -8 with the sign of the largest magnitude, q = min(15, trunc(x / d + 8.5)), q[j] | q[j + 16] << 4', () => {
    const x = new Float32Array(96);
    // Block 0: max is -4 (d = 0.5): -4 -> 0, 3.9 -> 16.3 -> 15, 1.25 -> 11, 1.2 -> 10.9 -> 10,
    // -0.3 -> 7.9 -> 7, 0 -> 8, 2 -> 12.5 -> 12, -2.1 -> 4.3 -> 4, 0.26 -> 9.02 -> 9.
    x.set([-4, 3.9, 1.25, 1.2, -0.3], 0);
    x.set([2, -2.1], 16);
    x[31] = 0.26;
    // Block 1: 8 and -8 tie, the first wins: d = -1, 8 -> 0.5 -> 0, -8 -> 16.5 -> 15, 1 -> 7.5 -> 7.
    x.set([8, 0, 0, 0, 0, -8, 1], 32);
    // Block 2: all zero: d = -0 (f16 0x8000), every code 8.
    const b = quantizeQ4_0(x);
    expect(b.length).toBe(3 * 18);
    expect([...b.subarray(0, 18)]).toEqual([0x00, 0x38, 0xc0, 0x4f, 0x8b, 0x8a, 0x87, ...Array(10).fill(0x88), 0x98]);
    expect([...b.subarray(18, 36)]).toEqual([0x00, 0xbc, 0x80, 0x88, 0x88, 0x88, 0x88, 0x8f, 0x87, ...Array(9).fill(0x88)]);
    expect([...b.subarray(36, 54)]).toEqual([0x00, 0x80, ...Array(16).fill(0x88)]);
  });
});
