// Streaming safetensors writer: header first, then tensor data generated chunk by chunk, so a
// checkpoint of any size is written with a few MB of memory. Also plans shards the way
// transformers names them (model-00001-of-0000N.safetensors + model.safetensors.index.json).

import { open, rename, unlink } from 'node:fs/promises';
import { endianness } from 'node:os';
import { join } from 'node:path';
import { type Dtype, dtypeBytes, safetensorsDtype } from './presets.js';
import { type ChunkGenerator, type ChunkJob, inlineGenerator } from './weight-pool.js';
import { CHUNK_ELEMS, type InitSpec, toStoredBytes } from './weights.js';

export interface TensorSpec {
  name: string;
  shape: number[];
  init: InitSpec;
}

/** A tensor with explicit values (used by tests to hand-build models). */
export interface TensorData {
  name: string;
  shape: number[];
  data: Float32Array | number[];
}

export const numel = (shape: number[]) => shape.reduce((a, b) => a * b, 1);

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
  const size = dtypeBytes(dtype);
  const groups: { tensors: TensorSpec[]; bytes: number }[] = [];
  let cur: { tensors: TensorSpec[]; bytes: number } | undefined;
  for (const t of tensors) {
    const b = numel(t.shape) * size;
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
export function safetensorsHeader(tensors: { name: string; shape: number[] }[], dtype: Dtype): Buffer {
  const size = dtypeBytes(dtype);
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  let offset = 0;
  for (const t of tensors) {
    const bytes = numel(t.shape) * size;
    header[t.name] = { dtype: safetensorsDtype(dtype), shape: t.shape, data_offsets: [offset, offset + bytes] };
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
        const total = numel(t.shape);
        for (let c = 0, done = 0; done < total; c++, done += CHUNK_ELEMS) {
          yield { name: t.name, chunk: c, n: Math.min(CHUNK_ELEMS, total - done), init: t.init };
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

/** Write explicit tensors (f32 values converted to `dtype`) into one safetensors file. */
export async function writeSafetensorsData(path: string, tensors: TensorData[], dtype: Dtype): Promise<void> {
  const parts: Uint8Array[] = [safetensorsHeader(tensors, dtype)];
  for (const t of tensors) {
    const n = numel(t.shape);
    if (t.data.length !== n) throw new Error(`${t.name}: ${t.data.length} values for shape [${t.shape}]`);
    parts.push(toStoredBytes(Float32Array.from(t.data), n, dtype));
  }
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
