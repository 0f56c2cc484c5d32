// Rewriting a written f32 checkpoint in a quantized layout (the FP8 and AWQ / GPTQ writers): each
// safetensors file (model.safetensors or the shards of its index) is read whole, every tensor is
// mapped to the tensors that replace it, and the file and the index are rewritten in place.
// NOTE: one f32 shard is held in memory at a time: fine for the test presets, heavy for real shapes.

import { closeSync, existsSync, openSync, readFileSync, readSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** The projections quantized releases quantize: attention, MLP and expert matrices, not routers or norms. */
export const QUANTIZED_PROJECTION = /\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$/;

/** A tensor as stored: safetensors dtype name and little-endian bytes. */
export interface StoredTensor {
  name: string;
  dtype: string;
  shape: number[];
  bytes: Uint8Array;
}

interface HeaderEntry { dtype: string; shape: number[]; data_offsets: [number, number] }

function readHeader(fd: number): { header: Record<string, HeaderEntry>; dataStart: number } {
  const lenBuf = Buffer.alloc(8);
  readSync(fd, lenBuf, 0, 8, 0);
  const headerLen = Number(lenBuf.readBigUInt64LE(0));
  const headerBuf = Buffer.alloc(headerLen);
  readSync(fd, headerBuf, 0, headerLen, 8);
  const header = JSON.parse(headerBuf.toString('utf8')) as Record<string, HeaderEntry>;
  delete header['__metadata__'];
  return { header, dataStart: 8 + headerLen };
}

function readStoredSafetensors(path: string): StoredTensor[] {
  const fd = openSync(path, 'r');
  try {
    const { header, dataStart } = readHeader(fd);
    const out: StoredTensor[] = [];
    for (const [name, info] of Object.entries(header)) {
      const bytes = new Uint8Array(info.data_offsets[1] - info.data_offsets[0]);
      readSync(fd, bytes, 0, bytes.length, dataStart + info.data_offsets[0]);
      out.push({ name, dtype: info.dtype, shape: info.shape, bytes });
    }
    return out;
  } finally {
    closeSync(fd);
  }
}

function writeStoredSafetensors(path: string, tensors: StoredTensor[]): number {
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.bytes.length] };
    offset += t.bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, Buffer.concat([len, Buffer.from(json, 'utf8'), ...tensors.map((t) => t.bytes)]));
  renameSync(tmp, path);
  return offset;
}

/** The safetensors files of a checkpoint directory, and whether an index lists them. */
function checkpointFiles(dir: string): { files: string[]; indexPath: string; sharded: boolean } {
  const indexPath = join(dir, 'model.safetensors.index.json');
  const sharded = existsSync(indexPath);
  const files = sharded
    ? [...new Set(Object.values((JSON.parse(readFileSync(indexPath, 'utf8')) as { weight_map: Record<string, string> }).weight_map))].sort()
    : ['model.safetensors'];
  return { files, indexPath, sharded };
}

/** Name and shape of every tensor of a checkpoint directory, from the headers only. */
export function checkpointShapes(dir: string): Array<{ name: string; shape: number[] }> {
  const out: Array<{ name: string; shape: number[] }> = [];
  for (const file of checkpointFiles(dir).files) {
    const fd = openSync(join(dir, file), 'r');
    try {
      for (const [name, info] of Object.entries(readHeader(fd).header)) out.push({ name, shape: info.shape });
    } finally {
      closeSync(fd);
    }
  }
  return out;
}

/**
 * Rewrites every tensor of the f32 checkpoint in `dir` as `convert` maps it (values: its f32
 * values), one file at a time, and the index's weight map with the new names. `inputs`: the
 * stored dtypes accepted (BF16 ones are widened to their exact f32 values).
 */
export function rewriteF32Checkpoint(dir: string, writer: string, convert: (t: StoredTensor, values: Float32Array) => StoredTensor[],
  inputs: readonly ('F32' | 'BF16')[] = ['F32'], keepOthers = false): void {
  const { files, indexPath, sharded } = checkpointFiles(dir);
  const weightMap: Record<string, string> = {};
  let total = 0;
  for (const file of files) {
    const out: StoredTensor[] = [];
    for (const t of readStoredSafetensors(join(dir, file))) {
      // keepOthers: tensors of other dtypes (packed MXFP4 experts, their scales) are copied as they are.
      if (keepOthers && !(inputs as readonly string[]).includes(t.dtype)) out.push(t);
      else out.push(...convert(t, f32Values(t, writer, inputs)));
    }
    total += writeStoredSafetensors(join(dir, file), out);
    for (const t of out) weightMap[t.name] = file;
  }
  if (sharded) {
    const sorted = Object.fromEntries(Object.entries(weightMap).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    writeFileSync(indexPath, JSON.stringify({ metadata: { total_size: total }, weight_map: sorted }, null, 2) + '\n');
  }
}

/** A stored F32 or BF16 tensor's values as f32 (BF16 widened exactly); other dtypes are refused. */
function f32Values(t: StoredTensor, writer: string, inputs: readonly ('F32' | 'BF16')[]): Float32Array {
  if (!(inputs as readonly string[]).includes(t.dtype)) {
    throw new Error(`${writer}: ${t.name} is ${t.dtype}, expected ${inputs.join(' or ')}`);
  }
  if (t.dtype === 'F32') return new Float32Array(t.bytes.buffer, t.bytes.byteOffset, t.bytes.length / 4);
  const bits = new Uint16Array(t.bytes.buffer.slice(t.bytes.byteOffset, t.bytes.byteOffset + t.bytes.length));
  const wide = new Uint32Array(bits.length);
  for (let i = 0; i < bits.length; i++) wide[i] = bits[i]! << 16;
  return new Float32Array(wide.buffer);
}

/** Every F32 / BF16 tensor of one safetensors file, with its values as f32. */
export function readF32Tensors(path: string, writer: string): Array<{ tensor: StoredTensor; values: Float32Array }> {
  return readStoredSafetensors(path).map((t) => ({ tensor: t, values: f32Values(t, writer, ['F32', 'BF16']) }));
}

/** The bytes of a typed array (sharing its memory). */
export const bytesOf = (v: Float32Array | Int32Array | Uint16Array) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
