// Engine throughput on CPU (with --backend cuda, on a GPU: see engine-cuda.ts; with --path ts,
// the full TypeScript path through Engine beside the native loop: see engine-ts-path.ts):
//   npm run bench:engine -- [--preset qwen2.5-0.5b] [--model DIR]
//   [--dtype bf16] [--batch 1,8,32] [--prompt 512] [--decode 32] [--threads N]
//   [--precision f32,bf16] [--quantization none,int8] [--onnx fp32,int4] [--llama-cpp DIR]
//   [--pairs 3] [--out FILE]
// This default mode drives the native handle directly (plan adds / frees, no scheduler).
// Each (precision, batch size) runs in its own child process so peak RSS is per configuration.
// Memory bandwidth is sampled in that same process before the first round of decode steps and
// after each (this machine's bandwidth drifts with its neighbours). At batch 1, 16 short rounds
// of 8 steps follow, with a probe read (its buffer kept: about 70 ms) before the first and after
// each; the batch-1 roofline ratio is the median over them of each round against the higher of
// the two reads around it (also printed: the best round against the best sample, and the
// medians). At batch 1 the plain streaming read runs right after the first and the last probe
// sample of the long rounds, to show the two agree.
// The roofline is bandwidth / bytes streamed per token (bench/roofline.ts: the probe, its
// independent check build/sluice_stream_read, the bytes). With --llama-cpp DIR (or
// SLUICE_NODE_LLAMA_CPP=DIR; DIR = an installed node-llama-cpp package, not a dependency of
// sluice) llama.cpp runs the same model as a GGUF, batch 1, same prompt, steps and threads
// (bench/peer-llama-cpp.ts), alternating with sluice batch-1 runs: --pairs N (default 3, at least 2) pairs
// of (llama.cpp, sluice), one before sluice's table and the rest after, so that the load of a
// shared machine falls on both; the best and the median run of each are compared. With
// --onnx fp32,int4 (default none) ONNX Runtime runs the same bench checkpoint exported to ONNX
// (bench/engine-onnx.ts: the exports, written once into the model cache beside the checkpoint,
// and its worker, one child process per run): batch 1 with the same prompt, steps and threads in
// every side pass after llama.cpp and sluice, and once at each --batch size after sluice's rows.
// Side passes run whenever llama.cpp or ONNX is benched (sluice's batch-1 runs in them too).
// The end of the output is one side-by-side table of the side-pass runs: llama.cpp bf16 and Q8_0,
// sluice bf16 and int8 (Q8_0), ONNX Runtime fp32 and int4, best and median across the passes.
// Prints the tables and writes JSON (default bench/results/engine-cpu.json; sideBySide holds
// the side-by-side rows, onnx the ONNX runs).
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { machineInfo } from './machine.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { llamaCppPackage, runLlamaCppPeer, type PeerRow } from './peer-llama-cpp.js';
import type { GgufWeightType } from './gguf.js';
import type { OnnxWorkerResult } from './engine-onnx.js';
import type { OnnxQuantization } from '../models/onnx-export.js';
import { checkBenchStep, median } from './bench-step.js';
import { PROBE_BYTES, decodeBytesPerToken, streamReadCheck, tiedEmbeddings, type DecodeShape, type StreamReadCheck } from './roofline.js';
import { loadNativeEngine, measureMemoryBandwidth, nativeAddon } from '../src/native/native.js';
import { type MatmulPrecision, type NativeSequenceAdd, type NativeStepResult, type Quantization } from '../src/native/native-types.js';

/** The llama.cpp GGUF weights benched beside sluice's rows of a quantization. */
const peerWeights = (quantization: Quantization): GgufWeightType => (quantization === 'int8' ? 'q8_0' : 'bf16');

const { values: args } = parseArgs({
  options: {
    backend: { type: 'string', default: 'cpu' },
    peer: { type: 'string' },
    'gpu-memory-utilization': { type: 'string' },
    // --backend cuda (engine-cuda.ts): who runs GEMMs of over 8 tokens, and the CPU f32 reference run.
    'cuda-gemm': { type: 'string' },
    'cuda-attention': { type: 'string' },
    'cuda-sampler': { type: 'string' },
    'cpu-reference': { type: 'string' },
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    model: { type: 'string' },
    dtype: { type: 'string', default: 'bf16' },
    batch: { type: 'string', default: '1,8,32' },
    prompt: { type: 'string', default: '512' },
    decode: { type: 'string', default: '32' },
    threads: { type: 'string', default: '0' },
    'kv-gib': { type: 'string', default: '2' },
    precision: { type: 'string', default: 'f32,bf16' },
    // Weights as stored (none) and/or quantized at load to Q8_0 (int8); every precision runs each.
    quantization: { type: 'string', default: 'none' },
    'kv-cache-dtype': { type: 'string' },  // --backend cuda only (engine-cuda.ts)
    out: { type: 'string', default: 'bench/results/engine-cpu.json' },
    worker: { type: 'string' },
    // --path ts (engine-ts-path.ts; its own defaults): the full TypeScript path beside sluice_bench.
    path: { type: 'string' },
    warmup: { type: 'string' },
    rounds: { type: 'string' },
    'native-bin': { type: 'string' },
    // The llama.cpp peer: an installed node-llama-cpp package directory (else SLUICE_NODE_LLAMA_CPP).
    'llama-cpp': { type: 'string' },
    pairs: { type: 'string', default: '3' },
    // --backend onnx (engine-onnx.ts): which exports to run.
    'onnx-quantization': { type: 'string' },
    // ONNX Runtime beside llama.cpp and sluice in the side passes: which exports (fp32, int4); empty = none.
    onnx: { type: 'string', default: '' },
  },
});

interface WorkerResult {
  precision: MatmulPrecision;
  quantization: Quantization;
  /** Bytes of the weights as the engine holds them (int8: the Q8_0 copies). */
  weightBytes: number;
  batch: number;
  /** Read bandwidth samples (bytes/s): one before the first decode round and one after each. */
  bandwidthSamples: number[];
  /** Decode tokens/s of each round (round i ran between bandwidthSamples[i] and [i + 1]). */
  roundTokensPerS: number[];
  /**
   * Batch 1, after the rounds above: FINE_ROUNDS short rounds of FINE_STEPS steps, the probe read
   * (its buffer kept, about 70 ms) before the first and after each: fine.tokensPerS[i] ran between
   * fine.bandwidth[i] and [i + 1]. Null at larger batches.
   */
  fine: { steps: number; tokensPerS: number[]; bandwidth: number[] } | null;
  /** Batch 1: plain streaming reads (build/sluice_stream_read) each taken right after a probe sample (before the first round, after the last). */
  streamReadBesideProbe: Array<{ probeBytesPerS: number; plainBytesPerS: number }>;
  prefillTokensPerS: number;
  prefillMs: number;
  /** Best of DECODE_ROUNDS rounds of decodeSteps steps. */
  decodeTokensPerS: number;
  decodeTokensPerSMedian: number;
  decodeStepMs: number;
  peakRssBytes: number;
  info: Record<string, unknown>;
}

const promptLen = Number(args.prompt);
const decodeSteps = Number(args.decode);
const threads = Number(args.threads);
const kvBytes = Number(args['kv-gib']) * 2 ** 30;

const DECODE_ROUNDS = 3;
// Batch 1 is compared with the roofline round by round (each round against the bandwidth sampled
// right before and after it), so it runs more, shorter-lived rounds than the other batch sizes.
const BATCH1_DECODE_ROUNDS = 6;
const roundsFor = (batch: number) => (batch === 1 ? BATCH1_DECODE_ROUNDS : DECODE_ROUNDS);
// The roofline ratio's rounds (batch 1): short, each between two probe reads a fraction of a
// second apart, because this machine's bandwidth changes from one second to the next.
const FINE_ROUNDS = 16;
const FINE_STEPS = 8;

const checkStep = (res: NativeStepResult) => checkBenchStep(res, '--kv-gib');

async function runWorker(modelDir: string, batch: number, precision: MatmulPrecision, quantization: Quantization): Promise<WorkerResult> {
  const engine = await loadNativeEngine({ modelDir, backend: 'cpu', kvCacheBytes: kvBytes, blockSize: 16, numThreads: threads, matmulPrecision: precision,
    quantization, prefixCaching: false });
  const info = engine.info();
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
  const seqIds = Uint32Array.from({ length: batch }, (_, i) => i + 1);
  const prompts = Array.from(seqIds, (id) => Int32Array.from({ length: promptLen }, (_, t) => (t * 31 + id * 7 + 11) % info.vocabSize));
  // Prefill all prompts with at most 2048 batched tokens per step (chunked across steps). A
  // sequence is added (plan.adds) in the step that computes its first chunk.
  const remaining = new Array<number>(batch).fill(promptLen);
  let t0 = performance.now();
  for (;;) {
    const ids: number[] = [];
    const counts: number[] = [];
    const adds: NativeSequenceAdd[] = [];
    let budget = 2048;
    for (let i = 0; i < batch && budget > 0; i++) {
      if (remaining[i] === 0) continue;
      const n = Math.min(remaining[i], budget);
      if (remaining[i] === promptLen) adds.push({ seqId: seqIds[i], promptTokens: prompts[i], sampling });
      ids.push(seqIds[i]);
      counts.push(n);
      remaining[i] -= n;
      budget -= n;
    }
    if (ids.length === 0) break;
    checkStep(await engine.step({ seqIds: Uint32Array.from(ids), numTokens: Uint32Array.from(counts), adds }));
  }
  const prefillMs = performance.now() - t0;
  const decodePlan = { seqIds, numTokens: new Uint32Array(batch).fill(1) };
  checkStep(await engine.step(decodePlan)); // warm-up
  // Decode in rounds, with a bandwidth sample before each round and after the last: on a
  // machine whose bandwidth drifts, the best round is compared with the best bandwidth sample.
  // Peak RSS of the engine: taken before the first bandwidth sample maps the probe's buffer.
  const peakRssBytes = process.resourceUsage().maxRSS * 1024;
  // The probe and the independent plain read, back to back (batch 1 only): do they agree?
  const streamReadBesideProbe: WorkerResult['streamReadBesideProbe'] = [];
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const besideProbe = (probeBytesPerS: number) => {
    const plain = batch === 1 ? streamReadCheck(root, info.numThreads, 3) : null;
    if (plain) streamReadBesideProbe.push({ probeBytesPerS, plainBytesPerS: plain.bestBytesPerS });
  };
  const bandwidthSamples = [await measureMemoryBandwidth(threads, PROBE_BYTES, 3)];
  besideProbe(bandwidthSamples[0]!);
  const roundTokensPerS: number[] = [];
  for (let round = 0; round < roundsFor(batch); round++) {
    t0 = performance.now();
    for (let s = 0; s < decodeSteps; s++) checkStep(await engine.step(decodePlan));
    roundTokensPerS.push((batch * decodeSteps) / ((performance.now() - t0) / 1000));
    bandwidthSamples.push(await measureMemoryBandwidth(threads, PROBE_BYTES, 3));
  }
  besideProbe(bandwidthSamples[bandwidthSamples.length - 1]!);
  let fine: WorkerResult['fine'] = null;
  if (batch === 1) {
    fine = { steps: FINE_STEPS, tokensPerS: [], bandwidth: [await measureMemoryBandwidth(threads, PROBE_BYTES, 2, true)] };
    for (let round = 0; round < FINE_ROUNDS; round++) {
      t0 = performance.now();
      for (let s = 0; s < FINE_STEPS; s++) checkStep(await engine.step(decodePlan));
      fine.tokensPerS.push(FINE_STEPS / ((performance.now() - t0) / 1000));
      fine.bandwidth.push(await measureMemoryBandwidth(threads, PROBE_BYTES, 2, round < FINE_ROUNDS - 1));  // the last frees the buffer
    }
  }
  await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: seqIds });
  engine.dispose();
  return {
    precision,
    quantization,
    weightBytes: info.weightBytes,
    batch,
    bandwidthSamples,
    roundTokensPerS,
    fine,
    streamReadBesideProbe,
    prefillTokensPerS: (batch * promptLen) / (prefillMs / 1000),
    prefillMs,
    decodeTokensPerS: Math.max(...roundTokensPerS),
    decodeTokensPerSMedian: median(roundTokensPerS),
    decodeStepMs: (1000 * batch) / Math.max(...roundTokensPerS),
    peakRssBytes,
    info: info as unknown as Record<string, unknown>,
  };
}

interface InterleavedResult {
  precision: MatmulPrecision;
  /** Decode tokens/s of each round, alternating: rounds[2i] the unquantized engine's, rounds[2i + 1] int8's. */
  rounds: Array<{ quantization: Quantization; tokensPerS: number }>;
  /** int8 round / each neighbouring unquantized round (the one before and the one after). */
  int8OverUnquantized: number[];
}

/**
 * The unquantized and the int8 engine in one process, batch 1, decoding in alternating short
 * rounds (FINE_ROUNDS of FINE_STEPS steps each):
 * the machine's bandwidth drifts by 2x within a minute, so the int8 / unquantized ratio is taken
 * between neighbouring rounds, a few seconds apart, rather than between runs minutes apart.
 */
async function runInterleaved(modelDir: string, precision: MatmulPrecision): Promise<InterleavedResult> {
  const quantizations: Quantization[] = ['none', 'int8'];
  const engines = [];
  for (const quantization of quantizations) {
    engines.push(await loadNativeEngine({ modelDir, backend: 'cpu', kvCacheBytes: 2 ** 28, blockSize: 16, numThreads: threads, matmulPrecision: precision,
      quantization, prefixCaching: false }));
  }
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
  const vocab = engines[0]!.info().vocabSize;
  const prompt = Int32Array.from({ length: promptLen }, (_, t) => (t * 31 + 18) % vocab);
  const plan = { seqIds: Uint32Array.of(1), numTokens: Uint32Array.of(1) };
  for (const engine of engines) {
    checkStep(await engine.step({ seqIds: Uint32Array.of(1), numTokens: Uint32Array.of(promptLen), adds: [{ seqId: 1, promptTokens: prompt, sampling }] }));
    checkStep(await engine.step(plan));  // warm-up
  }
  const rounds: InterleavedResult['rounds'] = [];
  // Short rounds (as the roofline's): neighbours a fraction of a second apart.
  for (let round = 0; round < 2 * FINE_ROUNDS; round++) {
    const e = round % 2;
    const t0 = performance.now();
    for (let s = 0; s < FINE_STEPS; s++) checkStep(await engines[e]!.step(plan));
    rounds.push({ quantization: quantizations[e]!, tokensPerS: FINE_STEPS / ((performance.now() - t0) / 1000) });
  }
  for (const engine of engines) engine.dispose();
  const int8OverUnquantized: number[] = [];
  for (let i = 1; i < rounds.length; i += 2) {
    int8OverUnquantized.push(rounds[i]!.tokensPerS / rounds[i - 1]!.tokensPerS);
    if (rounds[i + 1]) int8OverUnquantized.push(rounds[i]!.tokensPerS / rounds[i + 1]!.tokensPerS);
  }
  return { precision, rounds, int8OverUnquantized };
}

async function main(): Promise<void> {
  if (args.path === 'ts') return (await import('./engine-ts-path.js')).main();  // its own defaults and output (cpu or cuda)
  if (args.backend === 'cuda') return (await import('./engine-cuda.js')).main();  // its own options and output
  if (args.backend === 'onnx') return (await import('./engine-onnx.js')).main();  // its own options and output
  if (args.backend !== 'cpu') throw new Error(`--backend must be cpu, cuda or onnx, got ${args.backend}`);
  if (args.path !== undefined && args.path !== 'native') throw new Error(`--path must be native or ts, got ${args.path}`);
  if (args['kv-cache-dtype'] !== undefined) throw new Error('--kv-cache-dtype is a --backend cuda option here (sluice_bench --kv-cache-dtype fp8 measures the CPU)');
  if (args.worker === 'interleaved') {
    process.stdout.write(JSON.stringify(await runInterleaved(args.model!, args.precision as MatmulPrecision)) + '\n');
    return;
  }
  if (args.worker) {
    const result = await runWorker(args.model!, Number(args.worker), args.precision as MatmulPrecision, args.quantization as Quantization);
    process.stdout.write(JSON.stringify(result) + '\n');
    return;
  }
  const modelDir = args.model ? resolve(args.model) : await ensureBenchModel(args.preset!, args.dtype as 'f32' | 'f16' | 'bf16');
  const batches = args.batch!.split(',').map(Number);
  const precisions = args.precision!.split(',') as MatmulPrecision[];
  const quantizations = args.quantization!.split(',') as Quantization[];
  const onnxQuantizations = args.onnx!.split(',').map((q) => q.trim()).filter((q) => q.length > 0) as OnnxQuantization[];
  for (const q of onnxQuantizations) if (q !== 'fp32' && q !== 'int4') throw new Error(`--onnx takes fp32 and/or int4, got ${q}`);
  // The ONNX exports of the same checkpoint (written once into the model cache) and engine-onnx.ts's worker.
  const onnxBench = onnxQuantizations.length > 0 ? await import('./engine-onnx.js') : null;
  const onnxDirs = new Map<OnnxQuantization, string>();
  if (onnxBench) for (const q of onnxQuantizations) onnxDirs.set(q, await onnxBench.ensureExport(modelDir, q));
  const onnxSettings = { promptTokens: promptLen, decodeSteps, threads, kvGib: args['kv-gib']! };
  const onnxVersion = onnxBench ? onnxBench.onnxRuntimeNodeVersion() : null;
  const onnxSide: OnnxWorkerResult[] = [];  // batch 1, in the side passes
  const onnxRows: OnnxWorkerResult[] = [];  // each --batch size, once after sluice's rows
  const rows: WorkerResult[] = [];
  // The plain streaming-read check and the llama.cpp peer run before and after sluice's rows.
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const peerThreads = threads > 0 ? threads : os.cpus().length;
  const llamaCpp = llamaCppPackage(args['llama-cpp']);
  const loadAtStart = os.loadavg()[0];
  const streamChecks: StreamReadCheck[] = [];
  const peers: PeerRow[] = [];
  // sluice's batch-1 runs paired with the peer's (precision bf16 when it is benched).
  const pairedPrecision: MatmulPrecision = precisions.includes('bf16') ? 'bf16' : precisions[0]!;
  const paired: WorkerResult[] = [];
  // Side passes (with llama.cpp and/or ONNX): every engine's batch-1 runs, so a shared machine's load falls on all alike.
  const sideBySideWanted = llamaCpp !== undefined || onnxQuantizations.length > 0;
  const sidePass = () => {
    const check = streamReadCheck(root, peerThreads);
    if (check) streamChecks.push(check);
    if (!sideBySideWanted) return;
    // Each weight format benched has its peer: bf16 GGUF beside unquantized rows, Q8_0 beside int8.
    for (const quantization of quantizations) {
      if (llamaCpp) {
        const weights = peerWeights(quantization);
        process.stderr.write(`llama.cpp peer (${weights}, batch 1, ${peerThreads} threads)...\n`);
        peers.push(runLlamaCppPeer(llamaCpp, modelDir, weights, { promptTokens: promptLen, decodeSteps, rounds: DECODE_ROUNDS, threads: peerThreads }));
      }
      process.stderr.write(`sluice beside it (precision ${pairedPrecision}, quantization ${quantization}, batch 1)...\n`);
      const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--worker', '1', '--model', modelDir, '--prompt', String(promptLen),
        '--decode', String(decodeSteps), '--threads', String(threads), '--kv-gib', String(args['kv-gib']), '--precision', pairedPrecision,
        '--quantization', quantization], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
      if (child.status !== 0) throw new Error(`bench worker for the paired batch-1 run failed (exit ${child.status})`);
      const row = JSON.parse(child.stdout.trim().split('\n').pop()!) as WorkerResult;
      delete (row as Partial<WorkerResult>).info;
      paired.push(row);
    }
    for (const q of onnxQuantizations) {
      process.stderr.write(`ONNX Runtime beside them (${q}, batch 1)...\n`);
      onnxSide.push(onnxBench!.runOnnxWorker(onnxDirs.get(q)!, 1, q, onnxSettings));
    }
  };
  const pairs = sideBySideWanted ? Math.max(1, Number(args.pairs)) : 1;
  sidePass();
  const self = fileURLToPath(import.meta.url);
  for (const quantization of quantizations) {
    for (const precision of precisions) {
      for (const batch of batches) {
        process.stderr.write(`precision ${precision}, quantization ${quantization}, batch ${batch}: prefill ${batch}x${promptLen} tokens, ${decodeSteps} decode steps...\n`);
        const child = spawnSync(process.execPath, [self, '--worker', String(batch), '--model', modelDir, '--prompt', String(promptLen),
          '--decode', String(decodeSteps), '--threads', String(threads), '--kv-gib', String(args['kv-gib']), '--precision', precision,
          '--quantization', quantization], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
        if (child.status !== 0) throw new Error(`bench worker for batch ${batch} failed (exit ${child.status})`);
        rows.push(JSON.parse(child.stdout.trim().split('\n').pop()!) as WorkerResult);
      }
    }
  }
  for (const q of onnxQuantizations) {
    for (const batch of batches) {
      process.stderr.write(`ONNX Runtime ${q}, batch ${batch}: prefill ${batch}x${promptLen} tokens, ${decodeSteps} decode steps...\n`);
      onnxRows.push(onnxBench!.runOnnxWorker(onnxDirs.get(q)!, batch, q, onnxSettings));
    }
  }
  for (let i = 1; i < Math.max(2, pairs); i++) sidePass();
  // int8 against the unquantized weights in alternating rounds of one process (runInterleaved).
  let interleaved: InterleavedResult | null = null;
  if (quantizations.includes('none') && quantizations.includes('int8')) {
    process.stderr.write(`unquantized and int8 engines in one process, alternating rounds of ${FINE_STEPS} decode steps (batch 1, precision ${pairedPrecision})...\n`);
    const child = spawnSync(process.execPath, [self, '--worker', 'interleaved', '--model', modelDir, '--prompt', String(promptLen), '--decode', String(decodeSteps),
      '--threads', String(threads), '--precision', pairedPrecision], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (child.status !== 0) throw new Error(`bench worker for the interleaved int8 run failed (exit ${child.status})`);
    interleaved = JSON.parse(child.stdout.trim().split('\n').pop()!) as InterleavedResult;
  }
  // Model facts from an unquantized row where there is one (int8 rows report their Q8_0 weights).
  const baseRow = rows.find((r) => r.quantization === 'none') ?? rows[0]!;
  const info = baseRow.info as { weightBytes: number; kvCacheBytes: number; architecture: string; weightDtype: string; simd: string; numThreads: number };
  const bandwidth = Math.max(...rows.flatMap((r) => r.bandwidthSamples));
  const rssLimit = 1.3 * info.weightBytes + info.kvCacheBytes;
  // The batch-1 roofline of each batch-1 row: its bandwidth samples / the bytes its step streams
  // (bench/roofline.ts decodeBytesPerToken: weights read, the lm_head once, KV at the mean context).
  // The one roofline definition: targets and the top-level field use these rows.
  const shape = baseRow.info as unknown as DecodeShape;
  const tied = tiedEmbeddings(modelDir);
  const contextTokens = promptLen + 1 + Math.floor((BATCH1_DECODE_ROUNDS * decodeSteps) / 2);  // mean over the decode rounds
  const fineContextTokens = promptLen + 1 + BATCH1_DECODE_ROUNDS * decodeSteps + Math.floor((FINE_ROUNDS * FINE_STEPS) / 2);
  const rooflineOf = (r: WorkerResult) => {
    const q = r.quantization ?? 'none';
    const bytesPerToken = decodeBytesPerToken({ ...shape, weightBytes: r.weightBytes ?? shape.weightBytes },
      { tiedLmHead: tied && q === 'none', kvBytesPerValue: r.precision === 'bf16' ? 2 : 4, contextTokens });
    const probeBest = Math.max(...r.bandwidthSamples), probeMedian = median(r.bandwidthSamples);
    // Round by round over the short rounds: each round's bytes/s against the higher of the probe
    // reads taken right before and right after it (a fraction of a second each way). This
    // machine's bandwidth changes by 2x from one second to the next with its neighbours, so a
    // best round set against the best sample of another moment says little.
    const fineBytesPerToken = r.fine ? decodeBytesPerToken({ ...shape, weightBytes: r.weightBytes ?? shape.weightBytes },
      { tiedLmHead: tied && q === 'none', kvBytesPerValue: r.precision === 'bf16' ? 2 : 4, contextTokens: fineContextTokens }) : bytesPerToken;
    const roundVsRoofline = (r.fine?.tokensPerS ?? []).map((tps, i) =>
      (tps * fineBytesPerToken) / Math.max(r.fine!.bandwidth[i]!, r.fine!.bandwidth[i + 1]!));
    return {
      precision: r.precision, quantization: q, bytesPerToken, contextTokens,
      probeBestBytesPerS: probeBest, probeMedianBytesPerS: probeMedian,
      rooflineTokensPerS: probeBest / bytesPerToken,
      decodeTokensPerS: r.decodeTokensPerS,
      decodeVsRoofline: r.decodeTokensPerS / (probeBest / bytesPerToken),
      decodeMedianVsMedianRoofline: r.decodeTokensPerSMedian / (probeMedian / bytesPerToken),
      roundVsRoofline,
      decodeVsRooflinePaired: roundVsRoofline.length ? median(roundVsRoofline) : null,
    };
  };
  const rooflines = rows.filter((r) => r.batch === 1).map(rooflineOf);
  const evaluate = (precision: MatmulPrecision, quantization: Quantization) => {
    const mine = rows.filter((r) => r.precision === precision && r.quantization === quantization);
    const b1 = mine.find((r) => r.batch === 1);
    const b32 = mine.find((r) => r.batch === 32);
    const unquantizedB1 = rows.find((r) => r.precision === precision && r.quantization === 'none' && r.batch === 1);
    const b1Roofline = b1 ? rooflineOf(b1) : null;
    const roofline = b1Roofline?.rooflineTokensPerS ?? null;
    return {
      precision,
      quantization,
      batch1DecodeOverUnquantized: quantization !== 'none' && b1 && unquantizedB1 ? b1.decodeTokensPerS / unquantizedB1.decodeTokensPerS : null,
      decodeRooflineTokensPerS: roofline,
      // Median over the rounds, each against the bandwidth sampled around it (rooflineOf).
      batch1DecodeVsRoofline: b1Roofline?.decodeVsRooflinePaired ?? null,
      batch32OverBatch1Decode: b1 && b32 ? b32.decodeTokensPerS / b1.decodeTokensPerS : null,
      prefillTokensPerS: b1?.prefillTokensPerS ?? null,
      peakRssOverLimit: Math.max(...mine.map((r) => r.peakRssBytes)) / rssLimit,
    };
  };
  const targets = quantizations.flatMap((q) => precisions.map((p) => evaluate(p, q)));

  const baseRooflineRow = rooflines.find((r) => r.precision === baseRow.precision && r.quantization === baseRow.quantization) ?? null;
  const checkSamples = streamChecks.flatMap((c) => c.samplesBytesPerS);

  console.log(`model ${args.model ?? args.preset} (${info.architecture}, ${info.weightDtype}), weights ${(info.weightBytes / 1e6).toFixed(1)} MB, ` +
    `KV pool ${(info.kvCacheBytes / 2 ** 20).toFixed(0)} MiB, cpu ${info.simd} x${info.numThreads}`);
  console.log(`memory read bandwidth ${(bandwidth / 1e9).toFixed(2)} GB/s (best of ${rows.length * (DECODE_ROUNDS + 1)} samples)`);
  console.log(`decode tok/s: best of ${BATCH1_DECODE_ROUNDS} rounds (batch 1) or ${DECODE_ROUNDS} (larger batches) of ${decodeSteps} steps; bandwidth sampled in the same process before the first round and after each`);
  console.log('');
  console.log('| weights | precision | batch | prefill tok/s | decode tok/s | decode step ms | bandwidth GB/s | peak RSS MB |');
  console.log('|---------|-----------|------:|--------------:|-------------:|---------------:|---------------:|------------:|');
  for (const r of rows) {
    console.log(`| ${r.quantization === 'int8' ? 'q8_0' : info.weightDtype} | ${r.precision} | ${r.batch} | ${r.prefillTokensPerS.toFixed(1)} | ${r.decodeTokensPerS.toFixed(1)} | ${r.decodeStepMs.toFixed(2)} | ` +
      `${(Math.max(...r.bandwidthSamples) / 1e9).toFixed(1)} | ${(r.peakRssBytes / 1e6).toFixed(0)} |`);
  }
  console.log('');
  const pct = (x: number | null) => (x === null ? 'n/a' : `${(100 * x).toFixed(0)}%`);
  if (interleaved) {
    const byQ = (q: Quantization) => interleaved!.rounds.filter((r) => r.quantization === q).map((r) => r.tokensPerS);
    console.log(`[${interleaved.precision}, int8] batch-1 decode in alternating rounds of one process: int8 / unquantized, median ` +
      `${median(interleaved.int8OverUnquantized).toFixed(2)}x over ${interleaved.int8OverUnquantized.length} neighbouring round pairs (target >= 1.7x); ` +
      `rounds: unquantized median ${median(byQ('none')).toFixed(1)}, int8 median ${median(byQ('int8')).toFixed(1)} tok/s`);
  }
  for (const t of targets) {
    if (t.batch1DecodeOverUnquantized !== null) {
      console.log(`[${t.precision}, ${t.quantization}] batch-1 decode = ${t.batch1DecodeOverUnquantized.toFixed(2)}x the unquantized weights' in the table's rows (separate processes; target >= 1.7x)`);
    }
    console.log(`[${t.precision}${t.quantization === 'none' ? '' : `, ${t.quantization}`}] batch-1 decode at ${pct(t.batch1DecodeVsRoofline)} of roofline (target >= 85%); ` +
      `batch-32 decode = ${t.batch32OverBatch1Decode?.toFixed(1) ?? 'n/a'}x batch 1 (target >= 8x); ` +
      `prefill of ${promptLen} tokens ${t.prefillTokensPerS?.toFixed(0) ?? 'n/a'} tok/s (target >= 250); ` +
      `peak RSS ${pct(t.peakRssOverLimit)} of 1.3 x weights + KV budget (target <= 100%)`);
  }

  console.log('');
  const gbs = (x: number) => (x / 1e9).toFixed(1);
  console.log(`memory bandwidth, ${peerThreads} threads, ${(PROBE_BYTES / 2 ** 30).toFixed(1)} GiB buffers: probe best ${gbs(Math.max(...rows.flatMap((r) => r.bandwidthSamples)))} / median ` +
    `${gbs(median(rows.flatMap((r) => r.bandwidthSamples)))} GB/s (around decode rounds); plain streaming read (sluice_stream_read) ` +
    (checkSamples.length ? `best ${gbs(Math.max(...checkSamples))} / median ${gbs(median(checkSamples))} GB/s (before and after the rows)` : 'not built (build/sluice_stream_read)'));
  const beside = rows.flatMap((r) => r.streamReadBesideProbe ?? []);
  if (beside.length > 0) {
    const ratios = beside.map((b) => b.probeBytesPerS / b.plainBytesPerS);
    console.log(`probe / plain streaming read taken back to back: median ${median(ratios).toFixed(2)} over ${ratios.length} pairs ` +
      `(${ratios.map((x) => x.toFixed(2)).join(', ')})`);
  }
  for (const r of rooflines) {
    console.log(`[${r.precision}${r.quantization === 'none' ? '' : `, ${r.quantization}`}] batch-1 decode in ${FINE_ROUNDS} rounds of ${FINE_STEPS} steps, each against the higher of the probe reads right before and after it: ` +
      `median ${pct(r.decodeVsRooflinePaired)} (${r.roundVsRoofline.map((x) => `${(100 * x).toFixed(0)}`).join(', ')}%) of the roofline; best round ${r.decodeTokensPerS.toFixed(1)} tok/s = ` +
      `${(100 * r.decodeVsRoofline).toFixed(0)}% of the best sample's roofline ${r.rooflineTokensPerS.toFixed(1)} tok/s; medians: ${(100 * r.decodeMedianVsMedianRoofline).toFixed(0)}% ` +
      `(${(r.bytesPerToken / 1e6).toFixed(1)} MB per token: weights + KV at ${r.contextTokens} tokens)`);
  }
  // Every run of the side passes (and sluice's and ONNX Runtime's main-pass rows), then one
  // side-by-side row per engine and weights: best and median across the side passes.
  const sluiceWeights = (q: Quantization) => (q === 'int8' ? 'q8_0' : shape.weightDtype);
  const onnxEngine = `ONNX Runtime (onnxruntime-node ${onnxVersion ?? '?'})`;
  const runLine = (engine: string, weights: string, batch: number, r: { prefillTokensPerS: number; decodeTokensPerS: number; decodeStepMs: number; peakRssBytes: number }) =>
    console.log(`| ${engine} | ${weights} | ${peerThreads} | ${batch} | ${r.prefillTokensPerS.toFixed(1)} | ${r.decodeTokensPerS.toFixed(1)} | ${r.decodeStepMs.toFixed(2)} | ${(r.peakRssBytes / 1e6).toFixed(0)} |`);
  interface Run { prefillTokensPerS: number; decodeTokensPerS: number; peakRssBytes: number }
  const sideBySide: {
    engine: string; version: string | null; weights: string; precision: string | null; quantization: string; threads: number; batch: 1; runs: number;
    prefillTokensPerSBest: number; prefillTokensPerSMedian: number; decodeTokensPerSBest: number; decodeTokensPerSMedian: number;
    decodeStepMsBest: number; peakRssBytesMax: number;
  }[] = [];
  const summarize = (engine: string, version: string | null, weights: string, precision: string | null, quantization: string, runs: Run[]) => {
    if (runs.length === 0) return;
    const decode = runs.map((x) => x.decodeTokensPerS), prefill = runs.map((x) => x.prefillTokensPerS);
    sideBySide.push({
      engine, version, weights, precision, quantization, threads: peerThreads, batch: 1, runs: runs.length,
      prefillTokensPerSBest: Math.max(...prefill), prefillTokensPerSMedian: median(prefill),
      decodeTokensPerSBest: Math.max(...decode), decodeTokensPerSMedian: median(decode),
      decodeStepMsBest: 1000 / Math.max(...decode), peakRssBytesMax: Math.max(...runs.map((x) => x.peakRssBytes)),
    });
  };
  for (const q of quantizations) summarize('llama.cpp', peers[0]?.version ?? null, peerWeights(q), null, peerWeights(q), peers.filter((p) => p.weights === peerWeights(q)));
  for (const q of quantizations) summarize('sluice', null, q === 'int8' ? 'int8 (q8_0)' : shape.weightDtype, pairedPrecision, q, paired.filter((r) => r.quantization === q));
  for (const q of onnxQuantizations) summarize('ONNX Runtime', onnxVersion, q, null, q, onnxSide.filter((r) => r.quantization === q));
  if (sideBySideWanted) {
    console.log('');
    console.log('| engine | weights | threads | batch | prefill tok/s | decode tok/s | decode step ms | peak RSS MB |');
    console.log('|--------|---------|--------:|------:|--------------:|-------------:|---------------:|------------:|');
    for (const p of peers) runLine(`llama.cpp (node-llama-cpp ${p.version})`, p.weights, 1, p);
    for (const r of rows.filter((x) => x.batch === 1)) runLine(`sluice (${r.precision})`, sluiceWeights(r.quantization), 1, r);
    for (const r of paired) runLine(`sluice (${r.precision}, paired)`, sluiceWeights(r.quantization), 1, r);
    for (const r of onnxRows) runLine(onnxEngine, `onnx ${r.quantization}`, r.batch, r);
    for (const r of onnxSide) runLine(`${onnxEngine}, paired`, `onnx ${r.quantization}`, 1, r);

    const passes = Math.max(2, pairs);
    console.log('');
    const machine = machineInfo();
    console.log(`side by side on ${machine.cpu ?? 'cpu'}, ${machine.cpuGeneration ?? 'generation unknown'} (${machine.cores} cores; ${machine.simdFlags.join(' ') || 'no AVX'}): batch 1, ${promptLen}-token prompt, ${DECODE_ROUNDS} rounds of ${decodeSteps} decode steps per run ` +
      `(best round); best / median across the runs of ${passes} alternating side passes; load average ${loadAtStart.toFixed(2)} at the start, ${os.loadavg()[0]!.toFixed(2)} now`);
    console.log('');
    console.log('| engine | weights | threads | batch | prefill tok/s (best / median) | decode tok/s (best / median) | decode step ms | peak RSS MB |');
    console.log('|--------|---------|--------:|------:|------------------------------:|-----------------------------:|---------------:|------------:|');
    for (const x of sideBySide) {
      const engine = x.engine === 'sluice' ? `sluice (${x.precision} matmul)` : x.version ? `${x.engine} (${x.engine === 'llama.cpp' ? 'node-llama-cpp' : 'onnxruntime-node'} ${x.version})` : x.engine;
      console.log(`| ${engine} | ${x.weights} | ${x.threads} | ${x.batch} | ${x.prefillTokensPerSBest.toFixed(1)} / ${x.prefillTokensPerSMedian.toFixed(1)} | ` +
        `${x.decodeTokensPerSBest.toFixed(1)} / ${x.decodeTokensPerSMedian.toFixed(1)} | ${x.decodeStepMsBest.toFixed(2)} | ${(x.peakRssBytesMax / 1e6).toFixed(0)} |`);
    }
    console.log('');
    const decodes = (xs: { decodeTokensPerS: number }[]) => xs.map((x) => x.decodeTokensPerS);
    const prefills = (xs: { prefillTokensPerS: number }[]) => xs.map((x) => x.prefillTokensPerS);
    const ratios = (mine: Run[], theirs: Run[]) =>
      `batch-1 decode, best ${(Math.max(...decodes(mine)) / Math.max(...decodes(theirs))).toFixed(2)}x / median ${(median(decodes(mine)) / median(decodes(theirs))).toFixed(2)}x`;
    const prefillRatios = (mine: Run[], theirs: Run[]) =>
      `prefill of ${promptLen} tokens, best ${(Math.max(...prefills(mine)) / Math.max(...prefills(theirs))).toFixed(2)}x / median ${(median(prefills(mine)) / median(prefills(theirs))).toFixed(2)}x`;
    for (const quantization of quantizations) {
      const mine = paired.filter((r) => r.quantization === quantization);
      const theirs = peers.filter((p) => p.weights === peerWeights(quantization));
      if (mine.length === 0 || theirs.length === 0) continue;
      const label = `${pairedPrecision}${quantization === 'none' ? '' : `, ${quantization} vs ${peerWeights(quantization)}`}`;
      console.log(`[${label}] over ${mine.length} alternating pairs: ${ratios(mine, theirs)} llama.cpp's (target >= 1x); ${prefillRatios(mine, theirs)}`);
      const pairedRoofline = rooflines.find((r) => r.precision === pairedPrecision && r.quantization === quantization);
      if (pairedRoofline) {
        const pct = (r: WorkerResult) => `${((100 * r.decodeTokensPerS * pairedRoofline.bytesPerToken) / Math.max(...r.bandwidthSamples)).toFixed(0)}%`;
        console.log(`[${label}] the paired sluice runs at ${mine.map(pct).join(' / ')} of their own rooflines (best bandwidth sample of each run)`);
      }
    }
    // sluice beside ONNX Runtime: unquantized weights beside the fp32 export, int8 beside int4.
    for (const quantization of quantizations) {
      const onnxQ: OnnxQuantization = quantization === 'int8' ? 'int4' : 'fp32';
      const mine = paired.filter((r) => r.quantization === quantization);
      const theirs = onnxSide.filter((r) => r.quantization === onnxQ);
      if (mine.length === 0 || theirs.length === 0) continue;
      console.log(`[${pairedPrecision}${quantization === 'none' ? '' : `, ${quantization}`} vs ONNX Runtime ${onnxQ}] over ${mine.length} side passes: ` +
        `${ratios(mine, theirs)} ONNX Runtime's; ${prefillRatios(mine, theirs)}`);
    }
  }

  const result = {
    bench: 'engine',
    date: new Date().toISOString(),
    machine: machineInfo(),
    // 1-minute load average when the run began and ended: other work on the machine shows here.
    loadAverage: { start: loadAtStart, end: os.loadavg()[0] },
    model: { preset: args.model ? null : args.preset, dir: modelDir, ...info },
    settings: { promptTokens: promptLen, decodeSteps, threads: info.numThreads, prefillChunkTokens: 2048 },
    memoryBandwidthBytesPerS: bandwidth,
    // The batch-1 roofline of the base row's precision and weights (its roofline.rows entry), null without a batch-1 row.
    decodeRooflineTokensPerS: baseRooflineRow?.rooflineTokensPerS ?? null,
    decodeRooflineOf: baseRooflineRow ? { precision: baseRooflineRow.precision, quantization: baseRooflineRow.quantization } : null,
    rows,
    targets,
    // bench/roofline.ts: per batch-1 row, bytes per token and the probe; the independent check.
    roofline: { probeBytes: PROBE_BYTES, rows: rooflines, streamReadChecks: streamChecks },
    // The side passes: llama.cpp runs and the sluice batch-1 runs alternating with them (pair i = peers[i], paired[i]
    // with one weight format; with several, each pass appends one per format in --quantization order).
    peers,
    paired,
    // The unquantized and the int8 engine decoding in alternating rounds of one process.
    interleaved,
    // ONNX Runtime (--onnx): batch-1 runs in the side passes (sidePass) and once per --batch size (rows).
    onnx: onnxBench ? { onnxruntimeNode: onnxVersion, quantizations: onnxQuantizations, exports: Object.fromEntries(onnxDirs), sidePass: onnxSide, rows: onnxRows } : null,
    // One row per engine and weights from the side passes: best and median across them.
    sideBySide,
    simd: nativeAddon().simdLevel(),
  };
  for (const r of result.rows) delete (r as Partial<WorkerResult>).info;
  mkdirSync(dirname(resolve(args.out!)), { recursive: true });
  writeFileSync(resolve(args.out!), JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(args.out!));
  console.log(`\nwrote ${args.out}`);
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
