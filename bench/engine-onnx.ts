// bench:engine -- --backend onnx: the engine table (prefill, decode at batch 1/8/32) for the ONNX
// Runtime backend, driving its handle (src/native/onnx/onnx-handle.ts) with the same plans the
// native bench sends. The export (fp32 and/or int4) is written once from the preset's bench
// checkpoint into the model cache ($SLUICE_HOME/models/<preset>-<dtype>-onnx-<q>).
//   npm run bench:engine -- --backend onnx [--preset qwen2.5-0.5b] [--onnx-quantization fp32,int4]
//   [--batch 1,8,32] [--prompt 512] [--decode 32] [--threads N] [--out FILE]
// Each (quantization, batch) runs in its own child process (peak RSS per configuration).
// bench/engine.ts --onnx fp32,int4 runs the same exports and the same worker (runOnnxWorker)
// inside its alternating side passes, beside llama.cpp and sluice.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { checkBenchStep, median } from './bench-step.js';
import { machineInfo } from './machine.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { exportOnnx, type OnnxQuantization } from '../models/onnx-export.js';
import { loadOnnxHandle } from '../src/native/onnx/onnx-backend.js';
import { type NativeStepResult } from '../src/native/native-types.js';

const { values: args } = parseArgs({
  options: {
    backend: { type: 'string', default: 'onnx' },
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    dtype: { type: 'string', default: 'bf16' },
    'onnx-quantization': { type: 'string', default: 'fp32,int4' },
    batch: { type: 'string', default: '1,8,32' },
    prompt: { type: 'string', default: '512' },
    decode: { type: 'string', default: '32' },
    threads: { type: 'string', default: '0' },
    'kv-gib': { type: 'string', default: '2' },
    out: { type: 'string' },
    worker: { type: 'string' },
    model: { type: 'string' },
  },
  strict: false,
});

export interface OnnxWorkerResult {
  quantization: OnnxQuantization;
  /** The chart series (bench/chart-families-engine.ts reads rows' precision): 'onnx fp32', 'onnx int4'. */
  precision: string;
  batch: number;
  prefillTokensPerS: number;
  prefillMs: number;
  decodeTokensPerS: number;
  decodeTokensPerSMedian: number;
  decodeStepMs: number;
  peakRssBytes: number;
  loadavg1: number;
}

const promptLen = Number(args.prompt);
const decodeSteps = Number(args.decode);
const threads = Number(args.threads);
const DECODE_ROUNDS = 3;

const checkStep = (res: NativeStepResult) => checkBenchStep(res, '--kv-gib');

type WorkerResult = OnnxWorkerResult;

async function runWorker(modelDir: string, batch: number, quantization: OnnxQuantization): Promise<WorkerResult> {
  const handle = await loadOnnxHandle({ modelDir, kvCacheBytes: Number(args['kv-gib']) * 2 ** 30, blockSize: 16, numThreads: threads, maxNumSeqs: batch });
  const info = handle.info();
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
  const seqIds = Uint32Array.from({ length: batch }, (_, i) => i + 1);
  // Prefill: every prompt added in one step, each computed whole (the backend runs a prefill row per session run).
  let t0 = performance.now();
  checkStep(await handle.step({
    seqIds, numTokens: new Uint32Array(batch).fill(promptLen),
    adds: Array.from(seqIds, (id) => ({ seqId: id, sampling, promptTokens: Int32Array.from({ length: promptLen }, (_, t) => (t * 31 + id * 7 + 11) % info.vocabSize) })),
  }));
  const prefillMs = performance.now() - t0;
  const decodePlan = { seqIds, numTokens: new Uint32Array(batch).fill(1) };
  checkStep(await handle.step(decodePlan));  // warm-up
  const roundTokensPerS: number[] = [];
  for (let round = 0; round < DECODE_ROUNDS; round++) {
    t0 = performance.now();
    for (let s = 0; s < decodeSteps; s++) checkStep(await handle.step(decodePlan));
    roundTokensPerS.push((batch * decodeSteps) / ((performance.now() - t0) / 1000));
  }
  handle.dispose();
  return {
    quantization, precision: `onnx ${quantization}`, batch,
    prefillTokensPerS: (batch * promptLen) / (prefillMs / 1000),
    prefillMs,
    decodeTokensPerS: Math.max(...roundTokensPerS),
    decodeTokensPerSMedian: median(roundTokensPerS),
    decodeStepMs: (1000 * batch) / Math.max(...roundTokensPerS),
    peakRssBytes: process.resourceUsage().maxRSS * 1024,
    loadavg1: os.loadavg()[0]!,
  };
}

/** The export of `checkpoint` at `quantization` (written on first use beside it in the model cache); its directory. */
export async function ensureExport(checkpoint: string, quantization: OnnxQuantization): Promise<string> {
  const dir = `${checkpoint}-onnx-${quantization}`;
  if (existsSync(join(dir, 'onnx', 'model.onnx'))) return dir;
  process.stderr.write(`writing the ${quantization} ONNX export of ${checkpoint} to ${dir}...\n`);
  await exportOnnx({ modelDir: checkpoint, out: dir, quantization, onProgress: (d, n) => process.stderr.write(`\r  layer ${d}/${n}`) });
  process.stderr.write('\n');
  return dir;
}

/** The settings a worker runs with (the parent's --prompt, --decode, --threads, --kv-gib). */
export interface OnnxWorkerSettings {
  promptTokens: number;
  decodeSteps: number;
  threads: number;
  kvGib: number | string;
}

/** Runs one (export, batch) in a child process of this file's worker mode; throws when it fails. */
export function runOnnxWorker(dir: string, batch: number, quantization: OnnxQuantization, s: OnnxWorkerSettings): OnnxWorkerResult {
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--worker', String(batch), '--model', dir, '--prompt', String(s.promptTokens),
    '--decode', String(s.decodeSteps), '--threads', String(s.threads), '--kv-gib', String(s.kvGib), '--onnx-quantization', quantization],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (child.status !== 0) throw new Error(`onnx bench worker for ${quantization} batch ${batch} failed (exit ${child.status})`);
  return JSON.parse(child.stdout.trim().split('\n').pop()!) as OnnxWorkerResult;
}

/** Version of the installed onnxruntime-node (its package.json; null when it cannot be read). */
export function onnxRuntimeNodeVersion(): string | null {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  try {
    return (JSON.parse(readFileSync(join(root, 'node_modules', 'onnxruntime-node', 'package.json'), 'utf8')) as { version?: string }).version ?? null;
  } catch {
    return null;
  }
}

export async function main(): Promise<void> {
  if (args.worker) {
    const result = await runWorker(args.model as string, Number(args.worker), args['onnx-quantization'] as OnnxQuantization);
    process.stdout.write(JSON.stringify(result) + '\n');
    return;
  }
  const checkpoint = await ensureBenchModel(args.preset as string, args.dtype as 'f32' | 'f16' | 'bf16');
  const batches = (args.batch as string).split(',').map(Number);
  const quantizations = (args['onnx-quantization'] as string).split(',') as OnnxQuantization[];
  const machine = machineInfo();
  const rows: WorkerResult[] = [];
  const loadBefore = os.loadavg()[0]!;
  for (const quantization of quantizations) {
    const dir = await ensureExport(checkpoint, quantization);
    for (const batch of batches) {
      process.stderr.write(`onnx ${quantization}, batch ${batch}: prefill ${batch}x${promptLen} tokens, ${DECODE_ROUNDS}x${decodeSteps} decode steps...\n`);
      rows.push(runOnnxWorker(dir, batch, quantization, { promptTokens: promptLen, decodeSteps, threads, kvGib: args['kv-gib'] as string }));
    }
  }
  const ort = await import('onnxruntime-node');
  console.log(`model ${args.preset} (${args.dtype} checkpoint) as ONNX exports, onnxruntime-node ${ort.env.versions.common} CPU EP, ` +
    `${threads || 'default'} threads; ${machine.cpu} x${machine.cores}; load average ${loadBefore.toFixed(2)} at the start`);
  console.log(`decode tok/s: best of ${DECODE_ROUNDS} rounds of ${decodeSteps} steps after a ${promptLen}-token prompt per sequence`);
  console.log('');
  console.log('| weights | batch | prefill tok/s | decode tok/s | decode step ms | peak RSS MB | load avg |');
  console.log('|---------|------:|--------------:|-------------:|---------------:|------------:|---------:|');
  for (const r of rows) {
    console.log(`| onnx ${r.quantization} | ${r.batch} | ${r.prefillTokensPerS.toFixed(1)} | ${r.decodeTokensPerS.toFixed(1)} | ` +
      `${r.decodeStepMs.toFixed(1)} | ${(r.peakRssBytes / 1e6).toFixed(0)} | ${r.loadavg1.toFixed(2)} |`);
  }
  const slug = `${(machine.cpu ?? 'cpu').toLowerCase().replace(/\(r\)|\(tm\)|processor|\d+-core/g, '').trim().split(/\s+/).slice(0, 2).join('-')}-${machine.cores}core`;
  const out = resolve((args.out as string | undefined) ?? `bench/results/engine-onnx-${slug}.json`);
  const result = {
    bench: 'engine',
    backend: 'onnx',
    date: new Date().toISOString(),
    machine,
    onnxruntime: ort.env.versions.common,
    model: { preset: args.preset, checkpointDtype: args.dtype, weightDtype: quantizations.join('/'), backend: 'onnx', simd: `onnxruntime ${ort.env.versions.common} cpu` },
    // threads 0 leaves onnxruntime's default: one intra-op thread per core.
    settings: { promptTokens: promptLen, decodeSteps, decodeRounds: DECODE_ROUNDS, threads: threads || machine.cores },
    loadavgAtStart: loadBefore,
    rows,
  };
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(out);
  console.log(`\nwrote ${out}`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
