// Streaming safetensors writer: header first, then tensor data generated chunk by chunk, so a
// checkpoint of any size is written with a few MB of memory. Also plans shards the way
// transformers names them (model-00001-of-0000N.safetensors + model.safetensors.index.json).
// Float tensors are stored in the checkpoint's dtype; MXFP4 blocks and scales (gpt-oss's experts)
// as U8 whatever that dtype is, and explicit integer / boolean tensors (TensorData.stored: an
// EAGLE-3 head's d2t and t2d) in their own dtype.

import { open, rename, unlink } from 'node:fs/promises';
import { endianness } from 'node:os';
import { join } from 'node:path';
import { type Dtype, dtypeBytes, safetensorsDtype } from './presets.js';
import { type ChunkGenerator, type ChunkJob, inlineGenerator } from './weight-pool.js';
import { CHUNK_ELEMS, type InitSpec, toStoredBytes } from './weights.js';

/** One half of an MXFP4-packed matrix (values in blocks of 32 along its rows; see packMxfp4). */
export interface Mxfp4Part {
  /** Name of the unpacked matrix: its values are drawn under this name, so both halves agree. */
  of: string;
  /** blocks: [...rows, cols / 32, 16] bytes of two nibbles; scales: [...rows, cols / 32] exponent bytes. */
  part: 'blocks' | 'scales';
}

export interface TensorSpec {
  name: string;
  shape: number[];
  /** How the values are drawn (for an MXFP4 half: the unpacked matrix's values). */
  init: InitSpec;
  /** Set: a U8 tensor holding this half of a matrix drawn with `init` and packed MXFP4. */
  mxfp4?: Mxfp4Part;
}

/** Non-float safetensors dtypes a tensor may be stored in whatever the file's float dtype. */
export type IntegerDtype = 'U8' | 'I64' | 'BOOL';

const INTEGER_BYTES: Record<IntegerDtype, number> = { U8: 1, I64: 8, BOOL: 1 };

/** A tensor with explicit values (used by tests to hand-build models, and for index tensors). */
export interface TensorData {
  name: string;
  shape: number[];
  data: Float32Array | number[];
  /** Store as U8 (data: integers 0..255) instead of the file's float dtype (the same as stored: 'U8'). */
  u8?: boolean;
  /** Store in this dtype instead of the file's float dtype: U8 (integers 0..255), I64 (safe
   * integers, little-endian int64), BOOL (0 or 1, one byte each). */
  stored?: IntegerDtype;
}

/** What the header needs of a tensor. U8: MXFP4 halves and TensorData marked u8; else `stored` if set. */
type HeaderTensor = { name: string; shape: number[]; mxfp4?: Mxfp4Part; u8?: boolean; stored?: IntegerDtype };

export const numel = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

/** The non-float dtype a tensor is stored in, or undefined for the file's float dtype. */
function integerDtype(t: HeaderTensor): IntegerDtype | undefined {
  if (t.mxfp4 !== undefined || t.u8 === true) {
    if (t.stored !== undefined && t.stored !== 'U8') throw new Error(`${t.name}: stored ${t.stored} conflicts with U8`);
    return 'U8';
  }
  return t.stored;
}

/** Bytes a tensor takes in a file whose float tensors are `dtype`. */
export function storedBytes(t: HeaderTensor, dtype: Dtype): number {
  const int = integerDtype(t);
  return numel(t.shape) * (int ? INTEGER_BYTES[int] : dtypeBytes(dtype));
}

/** Values drawn for a tensor: its elements, or for an MXFP4 half the unpacked matrix's (2 a block byte, 32 a scale). */
export function drawnValues(t: TensorSpec): number {
  const n = numel(t.shape);
  return t.mxfp4 === undefined ? n : t.mxfp4.part === 'blocks' ? 2 * n : 32 * n;
}

export interface ShardPlan {
  file: string;
  tensors: TensorSpec[];
  bytes: number;
}

/**
 * Split tensors (kept in order) into shards of at most `shardBytes` of data each; a tensor
 * larger than the limit gets a shard of its own. One shard -> "model.safetensors".
 */
export function planShards(tensors: TensorSpec[], dtype: Dtype, shardBytes: number): ShardPlan[] {
  const groups: { tensors: TensorSpec[]; bytes: number }[] = [];
  let cur: { tensors: TensorSpec[]; bytes: number } | undefined;
  for (const t of tensors) {
    const b = storedBytes(t, dtype);
    if (!cur || (cur.tensors.length > 0 && cur.bytes + b > shardBytes)) {
      cur = { tensors: [], bytes: 0 };
      groups.push(cur);
    }
    cur.tensors.push(t);
    cur.bytes += b;
  }
  const n = groups.length;
  const pad = (i: number) => String(i).padStart(5, '0');
  return groups.map((g, i) => ({
    file: n === 1 ? 'model.safetensors' : `model-${pad(i + 1)}-of-${pad(n)}.safetensors`,
    tensors: g.tensors,
    bytes: g.bytes,
  }));
}

/** The safetensors header bytes (8-byte length + JSON padded with spaces to a multiple of 8). */
export function safetensorsHeader(tensors: HeaderTensor[], dtype: Dtype): Buffer {
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  let offset = 0;
  for (const t of tensors) {
    const bytes = storedBytes(t, dtype);
    header[t.name] = { dtype: integerDtype(t) ?? safetensorsDtype(dtype), shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  const len = Buffer.byteLength(json);
  json += ' '.repeat((8 - (len % 8)) % 8);
  const jsonBuf = Buffer.from(json, 'utf8');
  const out = Buffer.alloc(8 + jsonBuf.length);
  out.writeBigUInt64LE(BigInt(jsonBuf.length), 0);
  jsonBuf.copy(out, 8);
  return out;
}

/**
 * Write one safetensors file of random tensors to `path` (via a temporary name, renamed at the
 * end). Chunks come from `gen` (in order, a few in flight); `onBytes` is called with the number
 * of data bytes written after every chunk.
 */
export async function writeRandomSafetensors(
  path: string,
  tensors: TensorSpec[],
  dtype: Dtype,
  seed: number,
  onBytes?: (bytes: number) => void,
  gen: ChunkGenerator = inlineGenerator(dtype, seed),
): Promise<void> {
  if (endianness() !== 'LE') throw new Error('safetensors writer needs a little-endian host');
  const tmp = `${path}.tmp-${process.pid}`;
  const fh = await open(tmp, 'w');
  const window = Math.max(2, 4 * gen.threads);
  const queue: Promise<Uint8Array>[] = [];
  let writing: Promise<unknown> = Promise.resolve();
  try {
    const header = safetensorsHeader(tensors, dtype);
    await fh.write(header, 0, header.length, 0);
    let pos = header.length;
    function* jobs(): Generator<ChunkJob> {
      for (const t of tensors) {
        // NOTE: both halves of an MXFP4 matrix draw the same values, chunk for chunk: the same name
        // and count, and chunks of CHUNK_ELEMS (a multiple of 32) never split a block.
        const total = drawnValues(t);
        const name = t.mxfp4?.of ?? t.name;
        const pack = t.mxfp4?.part;
        for (let c = 0, done = 0; done < total; c++, done += CHUNK_ELEMS) {
          yield { name, chunk: c, n: Math.min(CHUNK_ELEMS, total - done), init: t.init, ...(pack && { pack }) };
        }
      }
    }
    const it = jobs();
    let exhausted = false;
    for (;;) {
      while (!exhausted && queue.length < window) {
        const j = it.next();
        if (j.done) exhausted = true;
        else queue.push(gen.generate(j.value));
      }
      const next = queue.shift();
      if (!next) break;
      const bytes = await next;
      await writing;
      const at = pos;
      writing = fh.write(bytes, 0, bytes.length, at).then(() => onBytes?.(bytes.length));
      pos += bytes.length;
    }
    await writing;
  } catch (e) {
    await Promise.allSettled([writing, ...queue]);
    await fh.close();
    await unlink(tmp).catch(() => {});
    throw e;
  }
  await fh.close();
  await rename(tmp, path);
}

/** The stored bytes of an explicit tensor: f32 values converted to `dtype`, or its integer dtype's (checked). */
export function tensorDataBytes(t: TensorData, dtype: Dtype): Uint8Array {
  const n = numel(t.shape);
  if (t.data.length !== n) throw new Error(`${t.name}: ${t.data.length} values for shape [${t.shape}]`);
  const int = integerDtype(t);
  if (int === undefined) return toStoredBytes(Float32Array.from(t.data), n, dtype);
  const values = Array.from(t.data);
  if (int === 'U8') {
    if (!values.every((v) => Number.isInteger(v) && v >= 0 && v <= 255)) throw new Error(`${t.name}: U8 data must be integers 0..255`);
    return Uint8Array.from(values);
  }
  if (int === 'BOOL') {
    if (!values.every((v) => v === 0 || v === 1)) throw new Error(`${t.name}: BOOL data must be 0 or 1`);
    return Uint8Array.from(values);
  }
  if (!values.every((v) => Number.isSafeInteger(v))) throw new Error(`${t.name}: I64 data must be safe integers`);
  if (endianness() !== 'LE') throw new Error('safetensors writer needs a little-endian host');
  const out = BigInt64Array.from(values, (v) => BigInt(v));
  return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
}

/** Write explicit tensors (f32 values converted to `dtype`, or their integer dtype's bytes) into one safetensors file. */
export async function writeSafetensorsData(path: string, tensors: TensorData[], dtype: Dtype): Promise<void> {
  const parts: Uint8Array[] = [safetensorsHeader(tensors, dtype)];
  for (const t of tensors) parts.push(tensorDataBytes(t, dtype));
  const fh = await open(path, 'w');
  try {
    for (const p of parts) await fh.write(p);
  } finally {
    await fh.close();
  }
}

/** model.safetensors.index.json content for a sharded checkpoint (keys sorted like transformers). */
export function shardIndex(shards: ShardPlan[]): { metadata: { total_size: number }; weight_map: Record<string, string> } {
  const entries: [string, string][] = [];
  let total = 0;
  for (const s of shards) {
    total += s.bytes;
    for (const t of s.tensors) entries.push([t.name, s.file]);
  }
  entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return { metadata: { total_size: total }, weight_map: Object.fromEntries(entries) };
}

export const shardPath = (dir: string, shard: ShardPlan) => join(dir, shard.file);
