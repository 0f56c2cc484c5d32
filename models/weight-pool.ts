// Parallel chunk generation on worker threads. Every chunk's bytes depend only on (seed, tensor
// name, chunk index), so the output is identical to single-threaded generation.

import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { Dtype } from './presets.js';
import {
  type InitSpec,
  chunkBytes,
  chunkSeed,
  e2m1Code,
  f32BitsToF16,
  f32ToBf16,
  f32ToF16,
  fillChunk,
  fmix32,
  hashString,
  mxfp4ScaleByte,
  packMxfp4,
  toStoredBytes,
} from './weights.js';

export interface ChunkJob {
  /** The tensor whose values are drawn (for MXFP4 halves: the matrix they pack). */
  name: string;
  chunk: number;
  /** Values drawn (the stored bytes are fewer when packed). */
  n: number;
  init: InitSpec;
  /** Store the chunk as this half of its MXFP4 packing instead of in the dtype. */
  pack?: 'blocks' | 'scales';
}

/** Produces the stored bytes of one chunk (f32 / bf16 / f16 little-endian, or MXFP4 bytes). */
export interface ChunkGenerator {
  generate(job: ChunkJob): Promise<Uint8Array>;
  close(): Promise<void>;
  readonly threads: number;
}

function generateInline(job: ChunkJob, dtype: Dtype, seed: number): Uint8Array {
  const f = new Float32Array(job.n);
  fillChunk(f, job.n, chunkSeed(seed, job.name, job.chunk), job.init);
  return chunkBytes(f, job.n, dtype, job.pack);
}

/** Same-thread generator. */
export function inlineGenerator(dtype: Dtype, seed: number): ChunkGenerator {
  return {
    threads: 0,
    async generate(job) {
      return generateInline(job, dtype, seed);
    },
    async close() {},
  };
}

// The worker body is assembled from the very functions of weights.ts
// (Function.prototype.toString), so both paths run the same code.
function workerSource(): string {
  const fns = [
    fmix32, hashString, chunkSeed, fillChunk, f32ToBf16, f32BitsToF16, f32ToF16, toStoredBytes, e2m1Code, mxfp4ScaleByte,
    packMxfp4, chunkBytes,
  ];
  return `
const IH_SCALE = ${1 / (65536 * Math.sqrt(1 / 3))};
const IH_CENTER = ${2 * 65535};
${fns.map((f) => f.toString()).join('\n')}
const { parentPort } = require('node:worker_threads');
parentPort.on('message', (m) => {
  try {
    const f = new Float32Array(m.n);
    fillChunk(f, m.n, chunkSeed(m.seed, m.name, m.chunk), m.init);
    const bytes = chunkBytes(f, m.n, m.dtype, m.pack);
    const copy = bytes.byteLength === bytes.buffer.byteLength ? bytes : bytes.slice();
    parentPort.postMessage({ id: m.id, buf: copy.buffer }, [copy.buffer]);
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: String(e) });
  }
});`;
}

/**
 * A pool of `threads` workers. Each worker is checked against inline generation first; if
 * workers cannot start or disagree (e.g. code instrumented by a test runner), generation falls
 * back to the calling thread.
 */
export async function createGenerator(dtype: Dtype, seed: number, threads = defaultThreads()): Promise<ChunkGenerator> {
  if (threads < 1) return inlineGenerator(dtype, seed);
  const workers: Worker[] = [];
  const pending = new Map<number, { resolve: (b: Uint8Array) => void; reject: (e: unknown) => void }>();
  let nextId = 0;
  let rr = 0;
  const run = (w: Worker, job: ChunkJob) =>
    new Promise<Uint8Array>((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject });
      w.postMessage({ id, seed, dtype, ...job });
    });
  const close = async () => {
    await Promise.all(workers.map((w) => w.terminate()));
  };
  try {
    const src = workerSource();
    for (let i = 0; i < threads; i++) {
      const w = new Worker(src, { eval: true });
      w.on('message', (m: { id: number; buf?: ArrayBuffer; error?: string }) => {
        const p = pending.get(m.id);
        pending.delete(m.id);
        if (m.buf) p?.resolve(new Uint8Array(m.buf));
        else p?.reject(new Error(`weight worker: ${m.error}`));
      });
      w.on('error', (e) => {
        for (const p of pending.values()) p.reject(e);
        pending.clear();
      });
      workers.push(w);
    }
    const probes: ChunkJob[] = [
      { name: '__probe__', chunk: 3, n: 64, init: { mean: 0.5, std: 2 } },
      { name: '__probe__', chunk: 4, n: 64, init: { mean: 0, std: 0.1 }, pack: 'blocks' },
    ];
    for (const probe of probes) {
      const want = generateInline(probe, dtype, seed);
      const got = await Promise.all(workers.map((w) => run(w, probe)));
      if (!got.every((g) => g.length === want.length && g.every((b, i) => b === want[i]))) throw new Error('mismatch');
    }
  } catch {
    await close();
    return inlineGenerator(dtype, seed);
  }
  return {
    threads,
    generate: (job) => run(workers[rr++ % workers.length]!, job),
    close,
  };
}

export function defaultThreads(): number {
  return Math.max(1, Math.min(8, availableParallelism()));
}
