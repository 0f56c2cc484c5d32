// FP8 checkpoints in the three published layouts (written by `make-model --quantize`): the CPU
// dequantizes them to bf16 at load. Each must match the float64 reference of its dequantized
// weights, the dequantization must be exact (the same logits as a bf16 checkpoint of the
// reference's dequantized weights), and malformed or unsupported ones are refused by name.
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { e4m3Encode, e4m3Value, fp8QuantizationConfig } from '../models/fp8-checkpoint.js';
import { type Fp8Options, makeModel } from '../models/make-model.js';
import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { type WrittenTensor, writeSafetensorsFile } from './helpers/published-checkpoints.js';
import { runNative } from './helpers/native-run.js';
import { LOGPROB_TOL, NEAR_TIE_GAP, compareWithReference, promptFor } from './helpers/reference-compare.js';
import { dequantizeFp8, roundToBf16, roundToE4m3 } from './reference/fp8.js';
import { e4m3ToNumber, readSafetensorsDir } from './reference/safetensors-reader.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-fp8-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const load = (dir: string) => loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 32 << 20, blockSize: 16, numThreads: 2 });

describe('the e4m3 encoder of the checkpoint writer', () => {
  it('decodes to the reference value for every code and encodes each value back to its code', () => {
    for (let code = 0; code < 256; code++) {
      const v = e4m3ToNumber(code);
      if (Number.isNaN(v)) {
        expect(code & 0x7f).toBe(0x7f);
        continue;
      }
      expect(e4m3Value(code)).toBe(v);
      expect(e4m3Encode(v)).toBe(code);
    }
  });

  it('rounds to nearest even and saturates at ±448', () => {
    expect(e4m3Encode(1 + 1 / 16)).toBe(0x38); // the tie between 1 and 1.125 goes to even (1)
    expect(e4m3Encode(1 + 3 / 16)).toBe(0x3a); // between 1.125 and 1.25: to 1.25 (even)
    expect(e4m3Encode(1 + 1 / 16 + 1e-9)).toBe(0x39);
    expect(e4m3Encode(2 ** -10)).toBe(0); // half the smallest subnormal: ties to 0
    expect(e4m3Encode(3 * 2 ** -10)).toBe(0x02);
    expect(e4m3Encode(15.5)).toBe(0x58); // the tie between 15 (mantissa 7) and 16 goes to 16 (mantissa 0)
    expect(e4m3Encode(1e6)).toBe(0x7e);
    expect(e4m3Encode(-460)).toBe(0xfe);
    expect(e4m3Encode(-0)).toBe(0x80);
  });

  it("the reference's e4m3 rounding (the fp8 KV cache's model) agrees with the writer's encoder", () => {
    // Two implementations written apart: the reference rounds by binade spacing, the writer builds codes.
    let seed = 12345;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let i = 0; i < 20000; i++) {
      const x = (rand() - 0.5) * 2 ** Math.floor(rand() * 24 - 14);
      expect(roundToE4m3(x, 1)).toBe(e4m3Value(e4m3Encode(x)));
    }
    for (let code = 0; code < 0x7e; code++) {
      const mid = (e4m3Value(code) + e4m3Value(code + 1)) / 2;
      expect(roundToE4m3(mid, 1)).toBe(e4m3Value(e4m3Encode(mid)));
    }
    expect(roundToE4m3(1000, 1)).toBe(448);
    expect(roundToE4m3(-1000 * 0.5, 0.5)).toBe(-224);
    expect(roundToE4m3(0.3, 0.01)).toBeCloseTo(e4m3Value(e4m3Encode(30)) * 0.01, 15);
  });

  it("the reference's bf16 rounding is to nearest even, once", () => {
    expect(roundToBf16(1 + 2 ** -8)).toBe(1);
    expect(roundToBf16(1 + 2 ** -8 + 2 ** -30)).toBe(1 + 2 ** -7);
    expect(roundToBf16(1 + 3 * 2 ** -8)).toBe(1 + 2 ** -6);
    expect(roundToBf16(-3 * 2 ** -134)).toBe(-(2 ** -132));
  });
});

/** A checkpoint beside `dir` holding the reference's dequantized weights as BF16, config without quantization. */
function resaveDequantized(dir: string, out: string): void {
  mkdirSync(out, { recursive: true });
  for (const f of readdirSync(dir)) if (!f.endsWith('.safetensors') && f !== 'config.json') copyFileSync(join(dir, f), join(out, f));
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  const tensors = readSafetensorsDir(dir);
  dequantizeFp8(tensors, raw);
  const written: WrittenTensor[] = [];
  for (const [name, t] of tensors) {
    if (/_scale(_inv)?$|input_scale$/.test(name)) continue;
    written.push({ name, shape: t.shape, data: t.data, dtype: t.dtype === 'F32' ? 'f32' : 'bf16' });
  }
  writeSafetensorsFile(join(out, 'model.safetensors'), written, 'bf16');
  delete raw['quantization_config'];
  writeFileSync(join(out, 'config.json'), JSON.stringify(raw));
}

const LAYOUTS: Array<[string, 'f32' | 'bf16', Fp8Options]> = [
  ['test-qwen3', 'bf16', { layout: 'fp8-block' }],
  // Partial blocks along both dimensions, and lm_head quantized too.
  ['test-qwen3', 'f32', { layout: 'fp8-block', blockSize: [48, 40], quantizeLmHead: true }],
  ['test-llama', 'bf16', { layout: 'fp8-compressed-tensors' }],
  ['test-llama', 'f32', { layout: 'fp8-compressed-tensors', strategy: 'tensor' }],
  ['test-qwen3-moe', 'bf16', { layout: 'fp8-modelopt' }],
];

describe.each(LAYOUTS)('%s with %s elsewhere, %j', (preset, dtype, quantize) => {
  let dir: string;
  let engine: NativeEngineHandle;
  beforeAll(async () => {
    dir = join(root, `${preset}-${dtype}-${quantize.layout}-${quantize.blockSize?.join('x') ?? quantize.strategy ?? 'default'}`);
    await makeModel({ preset, out: dir, dtype, seed: 5, quantize });
    engine = await load(dir);
  });
  afterAll(() => engine?.dispose());

  it('is written as published: F8_E4M3 projections with their scales and quantization_config', () => {
    const header = (file: string) => {
      const buf = readFileSync(join(dir, file));
      return JSON.parse(buf.subarray(8, 8 + Number(buf.readBigUInt64LE(0))).toString('utf8')) as Record<string, { dtype: string; shape: number[] }>;
    };
    const h = header('model.safetensors');
    const q = h['model.layers.0.self_attn.q_proj.weight']!;
    expect(q.dtype).toBe('F8_E4M3');
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
    const [rows, cols] = q.shape as [number, number];
    if (quantize.layout === 'fp8-block') {
      const [bh, bw] = quantize.blockSize ?? [128, 128];
      expect(config['quantization_config']).toMatchObject({ quant_method: 'fp8', fmt: 'e4m3', weight_block_size: [bh, bw] });
      expect(h['model.layers.0.self_attn.q_proj.weight_scale_inv']).toMatchObject({ dtype: 'F32', shape: [Math.ceil(rows / bh), Math.ceil(cols / bw)] });
    } else if (quantize.layout === 'fp8-compressed-tensors') {
      expect(config['quantization_config']).toMatchObject({ quant_method: 'compressed-tensors', format: 'float-quantized', ignore: ['lm_head'] });
      expect(h['model.layers.0.self_attn.q_proj.weight_scale']!.shape).toEqual(quantize.strategy === 'tensor' ? [1] : [rows, 1]);
    } else {
      expect(config['quantization_config']).toMatchObject({ quant_method: 'modelopt', quant_algo: 'FP8' });
      expect(h['model.layers.0.self_attn.q_proj.weight_scale']!.shape).toEqual([]);
      expect(h['model.layers.0.self_attn.q_proj.input_scale']!.shape).toEqual([]);
    }
    expect(h['lm_head.weight']!.dtype).toBe(quantize.quantizeLmHead ? 'F8_E4M3' : dtype.toUpperCase());
    expect(h['model.norm.weight']!.dtype).toBe(dtype.toUpperCase());
  });

  it('dequantizes exactly: the same logprobs as a bf16 checkpoint of the reference-dequantized weights', async () => {
    const plain = `${dir}-dequantized`;
    resaveDequantized(dir, plain);
    const other = await load(plain);
    try {
      const prompt = promptFor(engine.info().vocabSize, 13, 4);
      const got = await runNative(engine, prompt, 12);
      const want = await runNative(other, prompt, 12);
      expect(got.tokens).toEqual(want.tokens);
      expect(got.logprobs).toEqual(want.logprobs);
      expect(got.topLogprobs).toEqual(want.topLogprobs);
    } finally {
      other.dispose();
    }
  });

  it('greedy continuation and logprobs match the float64 reference of its dequantized weights', async () => {
    await compareWithReference(engine, dir, `${preset}/${quantize.layout}`, LOGPROB_TOL.bf16, NEAR_TIE_GAP.bf16);
  });
});

// ---------------------------------------------------------------- refusals

interface RawTensor { name: string; dtype: string; shape: number[]; bytes: Buffer }

function readRaw(path: string): RawTensor[] {
  const buf = readFileSync(path);
  const len = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + len).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  return Object.entries(header).filter(([n]) => n !== '__metadata__')
    .map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, bytes: Buffer.from(buf.subarray(8 + len + t.data_offsets[0], 8 + len + t.data_offsets[1])) }));
}

function writeRaw(path: string, tensors: RawTensor[]): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.bytes.length] };
    offset += t.bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(path, Buffer.concat([len, Buffer.from(json), ...tensors.map((t) => t.bytes)]));
}

describe('malformed and unsupported FP8 checkpoints are refused, naming the problem', () => {
  let base: string;
  let n = 0;
  beforeAll(async () => {
    base = join(root, 'refusals-base');
    await makeModel({ preset: 'test-qwen3', out: base, dtype: 'bf16', seed: 1, quantize: { layout: 'fp8-block' } });
  });
  /** A copy of the base checkpoint with its tensors and config.json's quantization_config edited. */
  const variant = (edit: { tensors?: (t: RawTensor[]) => RawTensor[]; quantization?: (q: Record<string, unknown>) => unknown }) => {
    const dir = join(root, `refusal-${n++}`);
    mkdirSync(dir);
    for (const f of readdirSync(base)) copyFileSync(join(base, f), join(dir, f));
    if (edit.tensors) writeRaw(join(dir, 'model.safetensors'), edit.tensors(readRaw(join(base, 'model.safetensors'))));
    if (edit.quantization) {
      const config = JSON.parse(readFileSync(join(base, 'config.json'), 'utf8')) as Record<string, unknown>;
      const q = edit.quantization(config['quantization_config'] as Record<string, unknown>);
      if (q === undefined) delete config['quantization_config'];
      else config['quantization_config'] = q;
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    }
    return dir;
  };
  const refused = async (dir: string, code: string, ...words: string[]) => {
    const err = await load(dir).then((e) => {
      e.dispose();
      return undefined;
    }, (e: unknown) => e as { code: string; message: string });
    expect(err, 'the engine loaded it').toBeDefined();
    expect(err!.code).toBe(code);
    for (const w of words) expect(err!.message).toContain(w);
  };

  it('a weight without its scale tensor', async () => {
    const dir = variant({ tensors: (ts) => ts.filter((t) => t.name !== 'model.layers.1.mlp.down_proj.weight_scale_inv') });
    await refused(dir, 'MODEL_FILE_INVALID', 'model.layers.1.mlp.down_proj.weight', 'model.layers.1.mlp.down_proj.weight_scale_inv');
  });

  it('a NaN code', async () => {
    const dir = variant({
      tensors: (ts) => ts.map((t) => {
        if (t.name === 'model.layers.0.self_attn.k_proj.weight') t.bytes[200] = 0xff;
        return t;
      }),
    });
    await refused(dir, 'MODEL_FILE_INVALID', 'model.layers.0.self_attn.k_proj.weight', 'NaN');
  });

  it('scales that do not fit the configured block size', async () => {
    const dir = variant({ quantization: (q) => ({ ...q, weight_block_size: [64, 64] }) });
    await refused(dir, 'MODEL_FILE_INVALID', 'weight_scale_inv', 'weight_block_size [64, 64]');
  });

  it('a malformed weight_block_size, and F8_E4M3 weights without a quantization_config', async () => {
    await refused(variant({ quantization: (q) => ({ ...q, weight_block_size: [128] }) }), 'MODEL_FILE_INVALID', 'weight_block_size');
    await refused(variant({ quantization: () => undefined }), 'MODEL_FILE_INVALID', 'F8_E4M3', 'quantization_config');
  });

  it.each([
    [{ quant_method: 'awq', bits: 4, group_size: 128, version: 'gemv', zero_point: true }, 'awq version "gemv"'],
    [{ quant_method: 'gptq', bits: 3, group_size: 128, desc_act: false }, 'gptq with 3 bits'],
    [{ quant_method: 'bitsandbytes', load_in_4bit: true }, 'quant_method "bitsandbytes"'],
    [{ quant_method: 'fp8', fmt: 'e5m2', weight_block_size: [128, 128] }, 'fmt "e5m2"'],
    [{ quant_method: 'modelopt', quant_algo: 'NVFP4' }, 'quant_algo "NVFP4"'],
    [{ quant_method: 'compressed-tensors', format: 'pack-quantized', config_groups: {} }, 'format "pack-quantized"'],
    // KV cache calibrations other than static per-tensor 8-bit float.
    [{ ...fp8QuantizationConfig({ layout: 'fp8-compressed-tensors' }), kv_cache_scheme: { type: 'int', num_bits: 8, strategy: 'tensor', dynamic: false } }, 'kv_cache_scheme (int, tensor)'],
    [{ ...fp8QuantizationConfig({ layout: 'fp8-compressed-tensors' }), kv_cache_scheme: { type: 'float', num_bits: 8, strategy: 'channel', dynamic: false } }, 'kv_cache_scheme (float, channel)'],
    [{ quant_method: 'modelopt', quant_algo: 'FP8', kv_cache_quant_algo: 'NVFP4' }, 'kv_cache_quant_algo "NVFP4"'],
  ])('quantization_config %j', async (q, names) => {
    await refused(variant({ quantization: () => q }), 'UNSUPPORTED_MODEL', names, 'supported: fp8');
  });
});

describe('the writer\'s options from the library API', () => {
  it.each([
    ['fp8-block', /quantize must be \{ layout: 'fp8-block' \| 'fp8-compressed-tensors' \| 'fp8-modelopt'/],
    [{ layout: 'fp8-awq' }, /quantize must be \{ layout:/],
    [{ layout: 'fp8-compressed-tensors', strategy: 'group' }, /quantize\.strategy must be 'channel' or 'tensor', got "group"/],
    [{ layout: 'fp8-block', blockSize: [128, 0] }, /quantize\.blockSize must be two positive integers/],
    [{ layout: 'fp8-block', kvCacheScales: { k: 0.1, v: 0.1 } }, /the block-wise fp8 layout has no KV cache scales/],
    [{ layout: 'fp8-modelopt', kvCacheScales: { k: 0, v: 0.1 } }, /quantize\.kvCacheScales must be \{ k, v \} with finite positive numbers/],
  ])('refuses %j before writing anything', async (quantize, message) => {
    const dir = join(root, `bad-options-${JSON.stringify(quantize).replace(/\W/g, '')}`);
    await expect(makeModel({ preset: 'test-llama', out: dir, dtype: 'bf16', quantize: quantize as unknown as Fp8Options })).rejects.toThrow(message);
    expect(() => readdirSync(dir)).toThrow();
  });
});
