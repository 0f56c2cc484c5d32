// Engine throughput on a CUDA GPU: npm run bench:engine -- --backend cuda
//   [--preset qwen2.5-0.5b,llama-3.1-8b] [--batch 1,8,64,256] [--prompt 512] [--decode 32]
//   [--gpu-memory-utilization 0.9] [--cuda-gemm auto|native|cublaslt] [--cuda-attention paged|flash]
//   [--cuda-sampler block|wide] [--quantization none|fp8] [--kv-cache-dtype auto|fp8] [--peer transformers]
//   [--cpu-reference=false] [--out bench/results/engine-cuda.json]
// Each preset runs in its own process (bf16 weights, made on first use): device-to-device copy
// bandwidth and the batch-1 decode roofline (weight bytes / bandwidth), then per batch size the
// prefill and decode throughput and the device memory held. With --peer transformers, Hugging
// Face transformers runs the same checkpoint, prompts and lengths (bench/peer_transformers.py),
// and its logits on a fixed prompt are compared with sluice's logprobs (a second reference).
// --quantization fp8 quantizes the bf16 checkpoint's layer projections at load to e4m3 (per-row
// scales, FP8 GEMMs) and --kv-cache-dtype fp8 holds the KV cache in e4m3 (twice the blocks per
// byte): issue 33's FP8 figures from the bf16 bench model, without an FP8 checkpoint. The CPU f32
// reference stays unquantized with its KV in f32 (the CPU has no FP8 GEMMs, and the reference is
// the unrounded answer FP8's error is measured against).
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { checkBenchStep, median } from './bench-step.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { loadNativeEngine, measureDeviceBandwidth } from '../src/native/native.js';
import { type CudaAttention, type CudaGemm, type CudaSampler, type NativeEngineHandle, type NativeSequenceAdd, type NativeStepResult } from '../src/native/native-types.js';

const { values: args } = parseArgs({
  options: {
    backend: { type: 'string', default: 'cuda' },
    preset: { type: 'string', default: 'qwen2.5-0.5b,llama-3.1-8b' },
    model: { type: 'string' },
    batch: { type: 'string', default: '1,8,64,256' },
    prompt: { type: 'string', default: '512' },
    decode: { type: 'string', default: '32' },
    'gpu-memory-utilization': { type: 'string', default: '0.9' },
    'cuda-gemm': { type: 'string', default: 'auto' },
    'cuda-attention': { type: 'string', default: 'paged' },
    'cuda-sampler': { type: 'string', default: 'block' },
    quantization: { type: 'string', default: 'none' },
    'kv-cache-dtype': { type: 'string', default: 'auto' },
    peer: { type: 'string' },
    'cpu-reference': { type: 'boolean', default: true },
    out: { type: 'string', default: 'bench/results/engine-cuda.json' },
    worker: { type: 'string' },
  },
  strict: false,
});

const promptLen = Number(args.prompt);
const decodeSteps = Number(args.decode);
const PREFILL_CHUNK = 8192;  // batched tokens per prefill step
const DECODE_ROUNDS = 3;
const REF_PROMPT = 32;
const REF_STEPS = 16;

interface Row {
  batch: number;
  prefillTokensPerS: number;
  decodeTokensPerS: number;       // best of DECODE_ROUNDS rounds
  decodeTokensPerSMedian: number;
  decodeStepMs: number;
}
interface RefStep { token: number; top_ids: number[]; top_logprobs: number[] }
interface WorkerResult {
  info: Record<string, unknown> & { weightBytes: number; deviceBytes: number; kvCacheBytes: number; vocabSize: number };
  bandwidthBytesPerS: number;
  rows: Row[];
  reference: RefStep[];
  cpuReference?: RefStep[];
}

// Issue 32's kernels behind their flags (EngineOptions::cuda_attention / cuda_sampler).
function cudaKernelOptions(): { cudaAttention: CudaAttention; cudaSampler: CudaSampler } {
  const cudaAttention = String(args['cuda-attention']), cudaSampler = String(args['cuda-sampler']);
  if (cudaAttention !== 'paged' && cudaAttention !== 'flash') throw new Error(`--cuda-attention must be paged or flash, got ${cudaAttention}`);
  if (cudaSampler !== 'block' && cudaSampler !== 'wide') throw new Error(`--cuda-sampler must be block or wide, got ${cudaSampler}`);
  return { cudaAttention, cudaSampler };
}

function cudaGemmOption(): CudaGemm {
  const value = String(args['cuda-gemm']);
  if (value !== 'native' && value !== 'cublaslt' && value !== 'auto') throw new Error(`--cuda-gemm must be native, cublaslt or auto, got ${value}`);
  return value;
}

/** Issue 33's FP8 options: weights quantized at load and the KV cache's element type (CUDA engine only). */
function fp8Options(): { quantization: 'none' | 'fp8'; kvCacheDtype: 'auto' | 'fp8' } {
  const quantization = String(args.quantization), kvCacheDtype = String(args['kv-cache-dtype']);
  if (quantization !== 'none' && quantization !== 'fp8') {
    throw new Error(`--quantization must be none or fp8 with --backend cuda (int8 is the CPU bench's), got ${quantization}`);
  }
  if (kvCacheDtype !== 'auto' && kvCacheDtype !== 'fp8') throw new Error(`--kv-cache-dtype must be auto or fp8, got ${kvCacheDtype}`);
  return { quantization, kvCacheDtype };
}

const promptOf = (b: number, len: number, vocab: number) => Int32Array.from({ length: len }, (_, t) => (t * 31 + b * 7 + 11) % vocab);

async function runWorker(modelDir: string): Promise<WorkerResult> {
  const bandwidth = await measureDeviceBandwidth();
  const engine = await loadNativeEngine({
    modelDir, backend: 'cuda', kvCacheBytes: 0, blockSize: 16, numThreads: 0,
    gpuMemoryUtilization: Number(args['gpu-memory-utilization']), prefixCaching: false,
    cudaGemm: cudaGemmOption(), ...cudaKernelOptions(), ...fp8Options(),
  });
  const info = engine.info();
  const greedy = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
  const rows: Row[] = [];
  let nextId = 1;
  for (const batch of String(args.batch).split(',').map(Number)) {
    const ids = Uint32Array.from({ length: batch }, () => nextId++);
    // Prefill; a sequence is added (plan.adds) in the step that computes its first chunk.
    const remaining = new Array<number>(batch).fill(promptLen);
    let t0 = performance.now();
    for (;;) {
      const seqs: number[] = [];
      const counts: number[] = [];
      const adds: NativeSequenceAdd[] = [];
      let budget = PREFILL_CHUNK;
      for (let i = 0; i < batch && budget > 0; i++) {
        if (remaining[i] === 0) continue;
        const n = Math.min(remaining[i]!, budget);
        if (remaining[i] === promptLen) adds.push({ seqId: ids[i]!, promptTokens: promptOf(i, promptLen, info.vocabSize), sampling: greedy });
        seqs.push(ids[i]!);
        counts.push(n);
        remaining[i]! -= n;
        budget -= n;
      }
      if (seqs.length === 0) break;
      checkStep(await engine.step({ seqIds: Uint32Array.from(seqs), numTokens: Uint32Array.from(counts), adds }));
    }
    const prefillMs = performance.now() - t0;
    const plan = { seqIds: ids, numTokens: new Uint32Array(batch).fill(1) };
    for (let i = 0; i < 2; i++) checkStep(await engine.step(plan));  // warm-up (captures the decode graph)
    const rounds: number[] = [];
    for (let r = 0; r < DECODE_ROUNDS; r++) {
      t0 = performance.now();
      for (let s = 0; s < decodeSteps; s++) checkStep(await engine.step(plan));
      rounds.push((batch * decodeSteps) / ((performance.now() - t0) / 1000));
    }
    await freeAll(engine, ids);
    const best = Math.max(...rounds);
    rows.push({ batch, prefillTokensPerS: (batch * promptLen) / (prefillMs / 1000), decodeTokensPerS: best,
      decodeTokensPerSMedian: median(rounds), decodeStepMs: (1000 * batch) / best });
    process.stderr.write(`  batch ${batch}: prefill ${rows.at(-1)!.prefillTokensPerS.toFixed(0)} tok/s, decode ${best.toFixed(1)} tok/s\n`);
  }
  const reference = await referenceSteps(engine, nextId);
  const finalInfo = engine.info();
  engine.dispose();
  // The same continuation on the CPU backend in f32 precision: sluice's own arithmetic without
  // bf16 activations, against which transformers' float32 logits should agree closely. Unquantized
  // and with its KV in f32 whatever --quantization / --kv-cache-dtype say (see the header).
  let cpuReference: RefStep[] | undefined;
  if (args['cpu-reference'] !== false && args['cpu-reference'] !== 'false') {  // --cpu-reference=false turns it off
    const cpu = await loadNativeEngine({ modelDir, backend: 'cpu', kvCacheBytes: 1 << 30, blockSize: 16, numThreads: 0, matmulPrecision: 'f32', prefixCaching: false });
    cpuReference = await referenceSteps(cpu, 1);
    cpu.dispose();
  }
  return { info: finalInfo as unknown as WorkerResult['info'], bandwidthBytesPerS: bandwidth, rows, reference, cpuReference };
}

const checkStep = (res: NativeStepResult) => checkBenchStep(res, '--gpu-memory-utilization');

/** A step with only frees: releases the sequences' KV blocks. */
async function freeAll(engine: NativeEngineHandle, ids: Uint32Array): Promise<void> {
  await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: ids });
}

/** Greedy continuation of the fixed reference prompt with the top 20 logprobs per step. */
async function referenceSteps(engine: NativeEngineHandle, id: number): Promise<RefStep[]> {
  const steps: RefStep[] = [];
  const adds: NativeSequenceAdd[] = [{ seqId: id, promptTokens: promptOf(0, REF_PROMPT, engine.info().vocabSize),
    sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 20 } }];
  for (let s = 0; s < REF_STEPS; s++) {
    const r = checkStep(await engine.step({ seqIds: Uint32Array.of(id), numTokens: Uint32Array.of(s === 0 ? REF_PROMPT : 1), ...(s === 0 && { adds }) }));
    steps.push({ token: r.tokens[0]!, top_ids: [...r.topIds], top_logprobs: [...r.topLogprobs] });
  }
  await freeAll(engine, Uint32Array.of(id));
  return steps;
}

/** Greedy agreement with the peer's reference and the largest logprob gap before any divergence. */
function compareReference(ours: RefStep[], theirs: RefStep[]) {
  let agree = 0;
  let maxAbsDiff = 0;
  let nearTie: number | null = null;
  for (let i = 0; i < Math.min(ours.length, theirs.length); i++) {
    const a = theirs[i]!;
    const b = ours[i]!;
    for (let k = 0; k < a.top_ids.length; k++) {
      const j = b.top_ids.indexOf(a.top_ids[k]!);
      if (j >= 0) maxAbsDiff = Math.max(maxAbsDiff, Math.abs(a.top_logprobs[k]! - b.top_logprobs[j]!));
    }
    if (a.token !== b.token) {
      nearTie = a.top_logprobs[0]! - a.top_logprobs[1]!;
      break;
    }
    agree++;
  }
  return { steps: Math.min(ours.length, theirs.length), greedyAgree: agree, divergedAtGap: nearTie, maxAbsLogprobDiff: maxAbsDiff };
}

function runPeer(modelDir: string) {
  const child = spawnSync('python3', [join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'bench', 'peer_transformers.py'),
    '--model', modelDir, '--batch', String(args.batch), '--prompt', String(promptLen), '--decode', String(decodeSteps),
    '--ref-prompt', String(REF_PROMPT), '--ref-steps', String(REF_STEPS)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 26 });
  if (child.status !== 0) throw new Error(`the transformers peer failed (exit ${child.status})`);
  return JSON.parse(child.stdout.trim().split('\n').pop()!) as {
    rows: Array<{ batch: number; prefill_tokens_per_s: number; decode_tokens_per_s: number }>;
    reference: { steps: RefStep[] };
    reference_bf16: { steps: RefStep[] };
  } & Record<string, unknown>;
}

export async function main(): Promise<void> {
  const self = fileURLToPath(import.meta.url);
  if (args.worker) {
    process.stdout.write(JSON.stringify(await runWorker(String(args.worker))) + '\n');
    return;
  }
  const fp8 = fp8Options();  // validated before any model is made or worker spawned
  const targets = args.model ? [{ preset: null, dir: resolve(String(args.model)) }]
    : await Promise.all(String(args.preset).split(',').map(async (p) => ({ preset: p, dir: await ensureBenchModel(p, 'bf16') })));
  const models = [];
  for (const { preset, dir } of targets) {
    process.stderr.write(`${preset ?? dir}: sluice (cuda)\n`);
    const child = spawnSync(process.execPath, [self, ...process.argv.slice(2).filter((a) => !a.startsWith('--worker')), '--worker', dir],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 26 });
    if (child.status !== 0) throw new Error(`bench worker for ${dir} failed (exit ${child.status})`);
    const w = JSON.parse(child.stdout.trim().split('\n').pop()!) as WorkerResult;
    let peer: ReturnType<typeof runPeer> | undefined;
    if (args.peer === 'transformers') {
      process.stderr.write(`${preset ?? dir}: transformers\n`);
      peer = runPeer(dir);
    }
    const roofline = w.bandwidthBytesPerS / w.info.weightBytes;
    const b1 = w.rows.find((r) => r.batch === 1);
    const b256 = w.rows.find((r) => r.batch === 256);
    models.push({
      preset, dir, info: w.info, bandwidthBytesPerS: w.bandwidthBytesPerS, decodeRooflineTokensPerS: roofline, rows: w.rows,
      targets: {
        batch1DecodeVsRoofline: b1 ? b1.decodeTokensPerS / roofline : null,
        batch256OverBatch1Decode: b1 && b256 ? b256.decodeTokensPerS / b1.decodeTokensPerS : null,
      },
      peer: peer ? { ...peer, reference: undefined, reference_bf16: undefined } : undefined,
      // sluice CUDA (bf16) against transformers in float32, transformers' own bf16 run against it,
      // and sluice's CPU backend in f32 against it (the same arithmetic without bf16 rounding).
      reference: peer ? compareReference(w.reference, peer.reference.steps) : undefined,
      transformersBf16VsF32: peer ? compareReference(peer.reference_bf16.steps, peer.reference.steps) : undefined,
      cpuF32VsTransformersF32: peer && w.cpuReference ? compareReference(w.cpuReference, peer.reference.steps) : undefined,
      cudaVsCpuF32: w.cpuReference ? compareReference(w.reference, w.cpuReference) : undefined,
    });
  }

  for (const m of models) {
    const peerRow = (b: number) => m.peer?.rows.find((r) => r.batch === b);
    console.log(`\n${m.preset ?? m.dir}: ${m.info['architecture']} ${m.info['weightDtype']} weights (--quantization ${fp8.quantization}), ` +
      `${(m.info.weightBytes / 1e9).toFixed(2)} GB, KV ${m.info['kvCacheDtype']} (--kv-cache-dtype ${fp8.kvCacheDtype}), ` +
      `${m.info['numBlocks']} blocks of ${m.info['blockSize']} tokens, ${m.info['simd']}`);
    console.log(`device-to-device copy ${(m.bandwidthBytesPerS / 1e9).toFixed(0)} GB/s -> batch-1 decode roofline ${m.decodeRooflineTokensPerS.toFixed(0)} tok/s; ` +
      `device memory held ${(m.info.deviceBytes / 1e9).toFixed(1)} GB (KV pool ${(m.info.kvCacheBytes / 1e9).toFixed(1)} GB)`);
    console.log('| batch | prefill tok/s | decode tok/s | decode step ms | transformers prefill | transformers decode |');
    console.log('|------:|--------------:|-------------:|---------------:|---------------------:|--------------------:|');
    for (const r of m.rows) {
      const p = peerRow(r.batch);
      console.log(`| ${r.batch} | ${r.prefillTokensPerS.toFixed(0)} | ${r.decodeTokensPerS.toFixed(1)} | ${r.decodeStepMs.toFixed(2)} | ` +
        `${p ? p.prefill_tokens_per_s.toFixed(0) : '-'} | ${p ? p.decode_tokens_per_s.toFixed(1) : '-'} |`);
    }
    const pct = (x: number | null) => (x === null ? 'n/a' : `${(100 * x).toFixed(0)}%`);
    console.log(`batch-1 decode at ${pct(m.targets.batch1DecodeVsRoofline)} of roofline (target >= 85%); ` +
      `batch-256 decode = ${m.targets.batch256OverBatch1Decode?.toFixed(1) ?? 'n/a'}x batch 1 (target >= 40x)`);
    const describe = (who: string, r: ReturnType<typeof compareReference>) =>
      console.log(`${who} vs transformers float32 logits (${REF_PROMPT}-token prompt, ${r.steps} greedy steps): ${r.greedyAgree} tokens agree` +
        `${r.divergedAtGap !== null ? ` (diverged at a reference top-2 gap of ${r.divergedAtGap.toFixed(3)})` : ''}, ` +
        `max |logprob difference| ${r.maxAbsLogprobDiff.toFixed(3)}`);
    const cudaWho = `sluice cuda (${m.info['weightDtype']} weights, ${m.info['kvCacheDtype']} KV)`;
    if (m.reference) describe(cudaWho, m.reference);
    if (m.transformersBf16VsF32) describe('transformers (bf16)', m.transformersBf16VsF32);
    if (m.cpuF32VsTransformersF32) describe('sluice cpu (f32)', m.cpuF32VsTransformersF32);
    if (m.cudaVsCpuF32) {
      const r = m.cudaVsCpuF32;
      console.log(`${cudaWho} vs sluice cpu f32 (unquantized): ${r.greedyAgree} of ${r.steps} tokens agree` +
        `${r.divergedAtGap !== null ? ` (diverged at a top-2 gap of ${r.divergedAtGap.toFixed(3)})` : ''}, max |logprob difference| ${r.maxAbsLogprobDiff.toFixed(3)}`);
    }
  }
  const result = {
    bench: 'engine-cuda',
    date: new Date().toISOString(),
    machine: { cpu: os.cpus()[0]?.model, cores: os.cpus().length, platform: `${os.platform()} ${os.release()}`, node: process.version },
    settings: { promptTokens: promptLen, decodeSteps, decodeRounds: DECODE_ROUNDS, prefillChunkTokens: PREFILL_CHUNK,
      gpuMemoryUtilization: Number(args['gpu-memory-utilization']), cudaGemm: cudaGemmOption(),
      ...cudaKernelOptions(), ...fp8 },
    models,
  };
  mkdirSync(dirname(resolve(String(args.out))), { recursive: true });
  writeFileSync(resolve(String(args.out)), JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(String(args.out)));
  console.log(`\nwrote ${args.out}`);
}

// Run directly (bench workers are spawned this way); bench/engine.ts imports it for --backend cuda.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
