// The full TypeScript path beside the native-only loop, on CPU:
//   npm run bench:engine -- --path ts [--preset qwen2.5-0.5b] [--model DIR] [--dtype bf16]
//   [--batch 1,64,256] [--prompt 16] [--decode 32] [--warmup 1] [--rounds 1] [--threads N]
//   [--precision bf16] [--kv-gib 2] [--native-bin build/sluice_bench] [--backend cpu|cuda]
//   [--out bench/results/engine-ts-path.json]
// For each batch size, in this one run, with the same model, threads, precision, KV pool, prompts
// (distinct per sequence) and lengths:
//   native  build/sluice_bench (no Node): `decode` decode steps after one warm-up step; tok/s =
//           batch * decode / their time.
//   ts      Engine.load (prefix caching and deferrals off, every request admitted and prefilled in
//           one step), a warm-up pass of `batch` 8-token requests (warm JIT, as in a running
//           server), then `batch` concurrent engine.stream requests (greedy, maxTokens = 1 + warmup
//           + decode); tok/s = tokens received after the moment every request has its
//           (1 + warmup)-th token, over the time from that moment to the last token. --warmup 1
//           (default) skips one decode step as the native loop does; --warmup 0 measures from the
//           first tokens (also recorded in the JSON as tsTokensPerSFromFirstToken either way).
//   JS ms/step = the Engine.schedulerStats() loopMs delta over that window / the `decode` steps
//           whose results land in it: what the JavaScript step loop spent planning and applying
//           results per step. (The numSteps delta, in the JSON as windowSteps, is one less: with
//           overlap, the step in flight when the window opens was counted before it.)
// Each measurement runs in its own child process; with --rounds N the pair runs N times,
// alternating, and the best of each is kept (this machine's memory bandwidth drifts). Prints a
// table against the target (TS >= 0.97 x native) and writes JSON.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { machineInfo } from './machine.js';
import { Engine, type SchedulerStats } from '../src/engine/engine.js';
import type { MatmulPrecision } from '../src/native/native-types.js';

const { values: args } = parseArgs({
  options: {
    path: { type: 'string' },
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    model: { type: 'string' },
    dtype: { type: 'string', default: 'bf16' },
    batch: { type: 'string', default: '1,64,256' },
    prompt: { type: 'string', default: '16' },
    decode: { type: 'string', default: '32' },
    warmup: { type: 'string', default: '1' },
    rounds: { type: 'string', default: '1' },
    threads: { type: 'string', default: '0' },
    precision: { type: 'string', default: 'bf16' },
    backend: { type: 'string', default: 'cpu' },
    'kv-gib': { type: 'string', default: '2' },
    'native-bin': { type: 'string' },
    out: { type: 'string', default: 'bench/results/engine-ts-path.json' },
    'ts-worker': { type: 'string' },
  },
  strict: false,
});

const TARGET = 0.97;
const promptLen = Number(args.prompt);
const decodeSteps = Number(args.decode);
const warmupSteps = Number(args.warmup);
const rounds = Number(args.rounds);
const threads = Number(args.threads);
const precision = String(args.precision) as MatmulPrecision;
const kvBytes = Math.round(Number(args['kv-gib']) * 2 ** 30);
const backend = String(args.backend) as 'cpu' | 'cuda';
if (backend !== 'cpu' && backend !== 'cuda') throw new Error(`--backend must be cpu or cuda, got ${String(backend)}`);

const promptOf = (b: number, vocab: number) => Array.from({ length: promptLen }, (_, t) => (t * 31 + b * 7 + 11) % vocab);

interface NativeResult {
  decodeTokensPerS: number;
  decodeStepMs: number;
  prefillTokensPerS: number;
  peakRssBytes: number;
  memoryBandwidthBytesPerS: number;
}

interface TsResult {
  decodeTokensPerS: number;
  /** The issue's literal window: from the moment every request has its first token. */
  tsTokensPerSFromFirstToken: number;
  decodeStepMs: number;
  /** numSteps delta over the window (null: the engine does not report it). */
  windowSteps: number | null;
  /** loopMs delta over the window / decode steps (null: the engine does not report loopMs). */
  jsMsPerStep: number | null;
  tokensInWindow: number;
  windowMs: number;
  /** Submission -> every request has its first token. */
  prefillMs: number;
  /** Latest minus earliest first token: about 0 when every request was prefilled in the same step. */
  firstTokenSpreadMs: number;
  /** Requests that ended before maxTokens (an eos token): their tokens are counted as received. */
  numEndedEarly: number;
  tokensReceived: number;
  peakRssBytes: number;
  info: Record<string, unknown>;
}

type LoopStats = SchedulerStats & { numSteps?: number; loopMs?: number };

async function runTsWorker(modelDir: string, batch: number): Promise<TsResult> {
  const engine = await Engine.load({
    model: modelDir, backend, threads, matmulPrecision: precision, prefixCaching: false,
    maxNumSeqs: batch, maxBatchedTokens: Math.max(batch * promptLen, batch), kvCacheBytes: kvBytes,
    flexDeferral: false, tenantDeferral: false,
  });
  const vocab = engine.info.vocabSize;
  const maxTokens = 1 + warmupSteps + decodeSteps;
  const startToken = 1 + warmupSteps;  // the window opens once every request has this many tokens
  const arrivals: number[][] = Array.from({ length: batch }, () => []);  // [batch][tokens] ms
  let numStarted = 0;
  let numEndedEarly = 0;
  let window: { t: number; stats: LoopStats } | undefined;
  let end: { t: number; stats: LoopStats } | undefined;
  // A long-running server runs warm JavaScript: one short pass first (same batch, 8 tokens each) so
  // that V8's optimizing compiles and the first collections are not counted against the engine.
  // The native loop's process runs its own warm-up step.
  await Promise.all(Array.from({ length: batch }, (_, b) =>
    engine.generate({ promptTokenIds: promptOf(b + batch, vocab), maxTokens: 8, temperature: 0 })));
  const t0 = performance.now();
  await Promise.all(arrivals.map(async (times, b) => {
    for await (const chunk of engine.stream({ promptTokenIds: promptOf(b, vocab), maxTokens, temperature: 0 })) {
      const now = performance.now();
      const before = times.length;
      for (let i = 0; i < chunk.tokenIds.length; i++) times.push(now);
      const ended = chunk.finishReason !== undefined;
      if (ended && times.length < maxTokens) numEndedEarly++;
      if ((before < startToken && times.length >= startToken) || (ended && times.length < startToken)) {
        if (++numStarted === batch) window = { t: now, stats: engine.schedulerStats() };
      }
      if (ended) end = { t: now, stats: engine.schedulerStats() };  // the last request to end wins
    }
  }));
  const info = engine.info;
  await engine.dispose();
  if (!window || !end) throw new Error('ts worker: no decode window (every request ended before its first tokens)');

  const firsts = arrivals.filter((a) => a.length > 0).map((a) => a[0]!);
  const firstAll = Math.max(...firsts);
  const rate = (from: number) => {
    const tokens = arrivals.reduce((n, a) => n + a.filter((t) => t > from).length, 0);
    return { tokens, ms: end!.t - from, perS: tokens / ((end!.t - from) / 1000) };
  };
  const win = rate(window.t);
  const steps = end.stats.numSteps !== undefined && window.stats.numSteps !== undefined ? end.stats.numSteps - window.stats.numSteps : null;
  const loopMs = end.stats.loopMs !== undefined && window.stats.loopMs !== undefined ? end.stats.loopMs - window.stats.loopMs : null;
  return {
    decodeTokensPerS: win.perS,
    tsTokensPerSFromFirstToken: rate(firstAll).perS,
    decodeStepMs: win.ms / decodeSteps,
    windowSteps: steps,
    jsMsPerStep: loopMs !== null ? loopMs / decodeSteps : null,
    tokensInWindow: win.tokens,
    windowMs: win.ms,
    prefillMs: firstAll - t0,
    firstTokenSpreadMs: firstAll - Math.min(...firsts),
    numEndedEarly,
    tokensReceived: arrivals.reduce((n, a) => n + a.length, 0),
    peakRssBytes: process.resourceUsage().maxRSS * 1024,
    info: {
      architecture: info.architecture, weightDtype: info.weightDtype, weightBytes: info.weightBytes, kvCacheBytes: info.kvCacheBytes,
      simd: info.simd, numThreads: info.numThreads, matmulPrecision: info.matmulPrecision,
      maxBatchedTokens: info.maxBatchedTokens, maxNumSeqs: info.maxNumSeqs,
    },
  };
}

function runNative(bin: string, modelDir: string, batch: number): NativeResult {
  const dir = mkdtempSync(join(os.tmpdir(), 'sluice-bench-'));
  try {
    const json = join(dir, 'native.json');
    const child = spawnSync(bin, ['--model', modelDir, '--batch', String(batch), '--prompt', String(promptLen), '--decode', String(decodeSteps),
      '--threads', String(threads), '--precision', precision, '--kv-bytes', String(kvBytes), '--backend', backend, '--json', json],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (child.status !== 0) throw new Error(`${bin} failed for batch ${batch} (exit ${child.status}${child.error ? `: ${child.error.message}` : ''})`);
    const r = JSON.parse(readFileSync(json, 'utf8')) as {
      memory_bandwidth_bytes_per_s: number; peak_rss_bytes: number;
      rows: Array<{ batch: number; prefill_tokens_per_s: number; decode_tokens_per_s: number; decode_step_ms: number }>;
    };
    const row = r.rows[0]!;
    return { decodeTokensPerS: row.decode_tokens_per_s, decodeStepMs: row.decode_step_ms, prefillTokensPerS: row.prefill_tokens_per_s,
      peakRssBytes: r.peak_rss_bytes, memoryBandwidthBytesPerS: r.memory_bandwidth_bytes_per_s };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function runTsChild(modelDir: string, batch: number): TsResult {
  const self = fileURLToPath(import.meta.url);
  const child = spawnSync(process.execPath, [self, '--ts-worker', String(batch), '--model', modelDir, '--prompt', String(promptLen),
    '--decode', String(decodeSteps), '--warmup', String(warmupSteps), '--threads', String(threads), '--precision', precision,
    '--kv-gib', String(args['kv-gib']), '--backend', backend], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 24 });
  if (child.status !== 0) throw new Error(`ts bench worker for batch ${batch} failed (exit ${child.status})`);
  return JSON.parse(child.stdout.trim().split('\n').pop()!) as TsResult;
}

const best = <T extends { decodeTokensPerS: number }>(xs: T[]): T => xs.reduce((a, b) => (b.decodeTokensPerS > a.decodeTokensPerS ? b : a));

export async function main(): Promise<void> {
  if (args['ts-worker']) {
    process.stdout.write(JSON.stringify(await runTsWorker(String(args.model), Number(args['ts-worker']))) + '\n');
    return;
  }
  if (precision !== 'f32' && precision !== 'bf16') throw new Error(`--path ts takes one --precision, f32 or bf16, got ${precision}`);
  for (const [name, v] of [['prompt', promptLen], ['decode', decodeSteps], ['rounds', rounds]] as const) {
    if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be an integer >= 1`);
  }
  if (!Number.isInteger(warmupSteps) || warmupSteps < 0) throw new Error('--warmup must be an integer >= 0');
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');  // dist/bench -> the package root
  const nativeBin = args['native-bin'] ? resolve(String(args['native-bin'])) : join(root, 'build', 'sluice_bench');
  const modelDir = args.model ? resolve(String(args.model)) : await ensureBenchModel(String(args.preset), args.dtype as 'f32' | 'f16' | 'bf16');
  const batches = String(args.batch).split(',').map(Number);
  const started = performance.now();

  const rows = [];
  for (const batch of batches) {
    const native: NativeResult[] = [];
    const ts: TsResult[] = [];
    for (let r = 0; r < rounds; r++) {
      process.stderr.write(`batch ${batch}, round ${r + 1}/${rounds}: native loop (${batch}x${promptLen} prompt, ${decodeSteps} decode steps)...\n`);
      native.push(runNative(nativeBin, modelDir, batch));
      process.stderr.write(`batch ${batch}, round ${r + 1}/${rounds}: Engine.stream x ${batch}...\n`);
      ts.push(runTsChild(modelDir, batch));
    }
    const n = best(native);
    const t = best(ts);
    rows.push({ batch, native: n, ts: t, nativeRounds: native.map((x) => x.decodeTokensPerS), tsRounds: ts.map((x) => x.decodeTokensPerS),
      tsOverNative: t.decodeTokensPerS / n.decodeTokensPerS, jsMsPerStep: t.jsMsPerStep, meetsTarget: t.decodeTokensPerS / n.decodeTokensPerS >= TARGET });
  }
  const elapsedS = (performance.now() - started) / 1000;

  const info = rows[0]!.ts.info;
  const fmt = (x: number | null, digits: number) => (x === null ? 'n/a' : x.toFixed(digits));
  console.log(`model ${args.model ?? args.preset} (${info['architecture']}, ${info['weightDtype']}), ` +
    `${backend === 'cuda' ? `cuda ${info['simd']}` : `cpu ${info['simd']} x${info['numThreads']}, matmul precision ${precision}`}; ` +
    `${promptLen}-token prompts, ${decodeSteps} decode steps after ${warmupSteps} warm-up; best of ${rounds} round(s)`);
  console.log('');
  console.log('| batch | native tok/s | TS tok/s | TS / native | native step ms | TS step ms | JS ms/step | target |');
  console.log('|------:|-------------:|---------:|------------:|---------------:|-----------:|-----------:|-------:|');
  for (const r of rows) {
    console.log(`| ${r.batch} | ${r.native.decodeTokensPerS.toFixed(1)} | ${r.ts.decodeTokensPerS.toFixed(1)} | ${r.tsOverNative.toFixed(3)} | ` +
      `${r.native.decodeStepMs.toFixed(2)} | ${r.ts.decodeStepMs.toFixed(2)} | ${fmt(r.jsMsPerStep, 3)} | ${TARGET} ${r.meetsTarget ? 'met' : 'MISSED'} |`);
  }
  for (const r of rows) {
    if (r.ts.numEndedEarly > 0) console.log(`batch ${r.batch}: ${r.ts.numEndedEarly} request(s) ended early on an eos token; tok/s counts the tokens received`);
    if (r.ts.firstTokenSpreadMs > r.ts.decodeStepMs / 2) {
      console.log(`batch ${r.batch}: first tokens spread over ${r.ts.firstTokenSpreadMs.toFixed(1)} ms (not one prefill step: the window's last steps ran fewer rows)`);
    }
  }
  const big = rows.find((r) => r.batch === 256) ?? rows.at(-1)!;
  console.log(`\nJS time per step with ${big.batch} running sequences: ${fmt(big.jsMsPerStep, 3)} ms ` +
    `(of a ${big.ts.decodeStepMs.toFixed(2)} ms step; schedulerStats().loopMs over the decode window / its ${decodeSteps} steps)`);
  console.log(`run took ${elapsedS.toFixed(0)} s`);

  const result = {
    bench: 'engine-ts-path',
    date: new Date().toISOString(),
    machine: machineInfo(),
    model: { preset: args.model ? null : args.preset, dir: modelDir, ...info },
    settings: {
      backend, precision, threads, promptTokens: promptLen, decodeSteps, warmupSteps, rounds, kvCacheBytes: kvBytes,
      nativeBin, target: TARGET, elapsedS,
      engine: { prefixCaching: false, flexDeferral: false, tenantDeferral: false, maxNumSeqs: 'batch', maxBatchedTokens: 'batch * promptTokens' },
    },
    rows: rows.map((r) => ({ ...r, ts: { ...r.ts, info: undefined } })),
  };
  mkdirSync(dirname(resolve(String(args.out))), { recursive: true });
  writeFileSync(resolve(String(args.out)), JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(String(args.out)));
  console.log(`wrote ${args.out}`);
}

// Run directly (the workers are spawned this way); bench/engine.ts imports it for --path ts.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
