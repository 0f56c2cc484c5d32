// The batch-1 decode roofline of bench:engine: memory bandwidth / bytes streamed per token.
//
// Bandwidth: the native probe (sluice::measure_memory_bandwidth) streams PROBE_BYTES =
// max(1 GiB, 8 x the last-level cache) with the engine's thread count, each thread its
// contiguous slice, as the batch-1 GEMV streams its slice of the weights, from the kind of memory
// the CPU backend keeps its weights in (anonymous, huge pages advised: native/src/util/
// host_memory.h); it is sampled in the bench worker around each round of decode. An independent
// check, build/sluice_stream_read (native/bench/stream_read.cpp: plain threads summing their
// slices of a huge-page buffer of the same size, no sluice code), runs beside each worker in the
// same sitting; both are reported.
// Bytes per token: every weight a decode step reads (the projections and the lm_head; the
// embedding table only when it is the lm_head) plus the K and V the step's attention reads.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** Bytes of the largest CPU cache sysfs reports (0 when unknown). */
export function lastLevelCacheBytes(): number {
  const dir = '/sys/devices/system/cpu/cpu0/cache';
  if (!existsSync(dir)) return 0;
  let largest = 0;
  for (const index of readdirSync(dir).filter((d) => d.startsWith('index'))) {
    try {
      const m = /^(\d+)([KMG]?)/.exec(readFileSync(join(dir, index, 'size'), 'utf8').trim());
      if (m) largest = Math.max(largest, Number(m[1]) * ({ '': 1, K: 1024, M: 2 ** 20, G: 2 ** 30 } as Record<string, number>)[m[2]!]!);
    } catch {
      // an index without a size: skip it
    }
  }
  return largest;
}

/** The probe's buffer: far larger than any cache, as native/src/cpu/kernels.cpp's probe_bytes(). */
export const PROBE_BYTES = Math.max(2 ** 30, 8 * lastLevelCacheBytes());

export interface StreamReadCheck {
  threads: number;
  bytes: number;
  bestBytesPerS: number;
  samplesBytesPerS: number[];
}

/** Runs build/sluice_stream_read (a dev build's; null when it was not built). */
export function streamReadCheck(root: string, threads: number, repeats = 3): StreamReadCheck | null {
  const bin = join(root, 'build', 'sluice_stream_read');
  if (!existsSync(bin)) return null;
  const child = spawnSync(bin, ['--threads', String(threads), '--bytes', String(PROBE_BYTES), '--repeats', String(repeats), '--pages', 'huge'], { encoding: 'utf8' });
  if (child.status !== 0) throw new Error(`sluice_stream_read failed (exit ${child.status}): ${child.stderr}`);
  return JSON.parse(child.stdout.trim()) as StreamReadCheck;
}

export interface DecodeShape {
  weightBytes: number;
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  weightDtype: string;
}

/**
 * Bytes one batch-1 decode step streams at `contextTokens` of context. weightBytes counts every
 * tensor once; the embedding table is read whole only when it is the lm_head (tied embeddings
 * with the weights as stored), else one row, so it is left out. KV: K and V of every layer over
 * the context, in the cache dtype (bf16 under precision bf16, else f32).
 */
export function decodeBytesPerToken(shape: DecodeShape, opts: { tiedLmHead: boolean; kvBytesPerValue: number; contextTokens: number }): number {
  const dtypeBytes = shape.weightDtype === 'f32' ? 4 : 2;
  const embedding = opts.tiedLmHead ? 0 : shape.vocabSize * shape.hiddenSize * dtypeBytes;
  const kv = shape.numLayers * 2 * opts.contextTokens * shape.numKvHeads * shape.headDim * opts.kvBytesPerValue;
  return shape.weightBytes - embedding + kv;
}

/** Whether the checkpoint in modelDir ties the lm_head to the embedding. */
export function tiedEmbeddings(modelDir: string): boolean {
  const config = JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8')) as { tie_word_embeddings?: boolean };
  return config.tie_word_embeddings === true;
}
