// Minimal safetensors reader for the float64 reference: decodes F64/F32/F16/BF16 exactly to f64,
// U8 (gpt-oss's packed MXFP4 blocks and their scale bytes) to its integer values 0..255, and
// F8_E4M3 (FP8 checkpoints' weights, scaled by reference/fp8.ts) to each code's exact value (NaN
// codes to NaN), and I32 (AWQ / GPTQ packed words and g_idx, unpacked by reference/int4.ts) to its
// signed integer value.
// Independent of models/ and src/ on purpose.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface RefTensor {
  dtype: string;
  shape: number[];
  data: Float64Array;
}

/** Exact value of an IEEE binary16 bit pattern. */
export function halfToNumber(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** Exact value of a bfloat16 bit pattern (the top 16 bits of an f32). */
export function bf16ToNumber(h: number): number {
  const buf = new DataView(new ArrayBuffer(4));
  buf.setUint32(0, (h & 0xffff) << 16);
  return buf.getFloat32(0);
}

/**
 * Exact value of an e4m3 ("e4m3fn") code: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent
 * field 0 is subnormal, no infinities, and S.1111.111 is NaN.
 */
export function e4m3ToNumber(code: number): number {
  const sign = code & 0x80 ? -1 : 1;
  const exp = (code >>> 3) & 0xf;
  const frac = code & 0x7;
  if (exp === 0xf && frac === 0x7) return NaN;
  if (exp === 0) return sign * (frac / 8) * 2 ** -6;
  return sign * (1 + frac / 8) * 2 ** (exp - 7);
}

let f16Table: Float64Array | undefined;
let bf16Table: Float64Array | undefined;

function decode(dtype: string, bytes: Buffer, n: number): Float64Array {
  const out = new Float64Array(n);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (dtype) {
    case 'F64':
      for (let i = 0; i < n; i++) out[i] = dv.getFloat64(i * 8, true);
      break;
    case 'F32':
      for (let i = 0; i < n; i++) out[i] = dv.getFloat32(i * 4, true);
      break;
    case 'F16': {
      const table = (f16Table ??= Float64Array.from({ length: 65536 }, (_, h) => halfToNumber(h)));
      for (let i = 0; i < n; i++) out[i] = table[dv.getUint16(i * 2, true)]!;
      break;
    }
    case 'BF16': {
      const table = (bf16Table ??= Float64Array.from({ length: 65536 }, (_, h) => bf16ToNumber(h)));
      for (let i = 0; i < n; i++) out[i] = table[dv.getUint16(i * 2, true)]!;
      break;
    }
    case 'U8':
      for (let i = 0; i < n; i++) out[i] = bytes[i]!;
      break;
    case 'F8_E4M3':
      for (let i = 0; i < n; i++) out[i] = e4m3ToNumber(bytes[i]!);
      break;
    case 'I32':
      for (let i = 0; i < n; i++) out[i] = dv.getInt32(i * 4, true);
      break;
    default:
      throw new Error(`reference reader: unsupported dtype ${dtype}`);
  }
  return out;
}

const DTYPE_SIZE: Record<string, number> = { F64: 8, F32: 4, F16: 2, BF16: 2, U8: 1, F8_E4M3: 1, I32: 4 };

/** All tensors of one .safetensors file, decoded to f64. */
export function readSafetensorsFile(path: string): Map<string, RefTensor> {
  const file = readFileSync(path);
  const headerLen = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + headerLen).toString('utf8')) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const base = 8 + headerLen;
  const out = new Map<string, RefTensor>();
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const n = info.shape.reduce((a, b) => a * b, 1);
    const [begin, end] = info.data_offsets;
    const size = DTYPE_SIZE[info.dtype];
    if (size === undefined) throw new Error(`${name}: unsupported dtype ${info.dtype}`);
    if (end - begin !== n * size) throw new Error(`${name}: data_offsets do not match shape`);
    if (base + end > file.length) throw new Error(`${name}: data beyond end of file`);
    out.set(name, { dtype: info.dtype, shape: info.shape, data: decode(info.dtype, file.subarray(base + begin, base + end), n) });
  }
  return out;
}

/** All tensors of a model directory: model.safetensors or the shards listed in the index. */
export function readSafetensorsDir(dir: string): Map<string, RefTensor> {
  const indexPath = join(dir, 'model.safetensors.index.json');
  if (existsSync(indexPath)) {
    const index = JSON.parse(readFileSync(indexPath, 'utf8')) as { weight_map: Record<string, string> };
    const files = [...new Set(Object.values(index.weight_map))].sort();
    const out = new Map<string, RefTensor>();
    for (const f of files) for (const [k, v] of readSafetensorsFile(join(dir, f))) out.set(k, v);
    for (const name of Object.keys(index.weight_map)) {
      if (!out.has(name)) throw new Error(`index lists ${name} but no shard holds it`);
    }
    return out;
  }
  return readSafetensorsFile(join(dir, 'model.safetensors'));
}
