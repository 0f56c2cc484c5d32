// Throughput of the whole server against the engine alone, in the manner of vLLM's
// benchmark_throughput (offline: every request at once) and benchmark_serving (online: Poisson
// arrivals), on a seeded ShareGPT-like workload (bench/sharegpt-workload.ts):
//   npm run bench:throughput -- [--preset tiny] [--backend cpu|cuda] [--dtype bf16] [--model DIR]
//     [--requests N] [--length-scale F] [--seed 1] [--rounds N] [--rates auto|R1,R2,...] [--poisson-requests N]
//     [--phases engine,chat,batch,poisson] [--batch-window standard] [--threads N] [--max-num-seqs N]
//     [--max-batched-tokens N] [--kv-cache-mib N] [--gpu-memory-utilization F]
//     [--quantization none|fp8] [--kv-cache-dtype auto|fp8] [--out FILE]
// Defaults by backend: cuda 1,000 requests at ShareGPT's lengths, one round (the issue's figure:
// --preset llama-3.1-8b --backend cuda); cpu 400 requests at a quarter of them on the tiny preset,
// three rounds (a 2-core machine serves a few thousand of its tokens a second, so a phase takes
// about 6 s and a neighbour's load moves one by 10%; each offline phase reports its best round).
//
// Phases, in one run, on one server process and one engine (a GPU holds one engine):
//   engine   every request handed to Engine.generate at once inside the server process, with the
//            prompt tokens, lengths, window and seeds the chat route would use: the engine-only
//            figure, no HTTP, no store.
//   chat     every request sent at once as POST /v1/chat/completions (one connection each).
//   batch    the same requests as one Batches API batch (JSONL upload, create, poll, results).
//   poisson  the requests sent as a Poisson process at each rate (exponential inter-arrival times,
//            seeded); rates `auto` are 0.25, 0.5, 0.75, 1.0 and 1.5 x the engine phase's request rate,
//            i.e. up to and past saturation.
// Every request asks for exactly its drawn output length (max_tokens) at temperature 1 with its own
// seed, so the engine and HTTP phases generate the same tokens; a random-weight model may still end
// a request early at its end-of-sequence token (the same one in every phase); output tokens are
// counted from usage. Prompts are words of the model's vocabulary, one token each, sized so that the
// chat template's prompt has the drawn input length (checked per request).
//
// Metrics (as benchmark_serving): output tokens/s and requests/s over the phase's wall time (first
// send to last completion); per request TTFT = queue + prefill (engine timings; over HTTP the
// route's server-timing header, since these endpoints do not stream), TPOT = decode / (output
// tokens - 1), end-to-end (engine: the call; HTTP: client-measured); p50 / p90 / p99. The batch
// phase has throughput only (its lines carry no timings) and is timed to the poll that saw it end
// (100 ms polls). Reported: chat and batch output tokens/s over the engine phase's (target >= 0.95).
// --quantization fp8 (CUDA only) quantizes the checkpoint's layer projections at load to e4m3 and
// --kv-cache-dtype fp8 holds the KV cache in e4m3 (issue 33; the engine's own options, recorded
// in the JSON's engine with the weights and KV as held and the KV pool's blocks).
// Prints a table and writes bench/results/throughput-<device>.json.
import { fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { machineInfo } from './machine.js';
import { ServerChild } from './server-child.js';
import { lengthSummary, mulberry32, sharegptWorkload, type WorkloadRequest } from './sharegpt-workload.js';
import { childMain, type ChildReply, type ChildRequest, type RequestRecord } from './throughput-child.js';
import { runBatch, runChat, type HttpRun } from './throughput-http.js';

const { values: args } = parseArgs({
  options: {
    preset: { type: 'string', default: 'tiny' },
    backend: { type: 'string', default: 'cpu' },
    dtype: { type: 'string', default: 'bf16' },
    model: { type: 'string' },
    requests: { type: 'string' },
    'length-scale': { type: 'string' },
    seed: { type: 'string', default: '1' },
    rates: { type: 'string', default: 'auto' },
    rounds: { type: 'string' },
    'poisson-requests': { type: 'string' },
    phases: { type: 'string', default: 'engine,chat,batch,poisson' },
    'batch-window': { type: 'string', default: 'standard' },
    threads: { type: 'string' },
    'max-num-seqs': { type: 'string' },
    'max-batched-tokens': { type: 'string' },
    'kv-cache-mib': { type: 'string' },
    'gpu-memory-utilization': { type: 'string' },
    quantization: { type: 'string', default: 'none' },
    'kv-cache-dtype': { type: 'string', default: 'auto' },
    out: { type: 'string' },
    'serve-child': { type: 'boolean', default: false },
    'data-dir': { type: 'string' },
    'model-id': { type: 'string' },
  },
});

interface Percentiles { p50: number; p90: number; p99: number; mean: number }

function percentiles(xs: number[]): Percentiles | null {
  if (xs.length === 0) return null;
  const s = Float64Array.from(xs).sort();
  const at = (q: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), mean: s.reduce((a, b) => a + b, 0) / s.length };
}

export interface PhaseResult {
  phase: string;
  rate?: number;
  requests: number;
  failed: number;
  wallS: number;
  outputTokens: number;
  inputTokens: number;
  requestsPerS: number;
  outputTokensPerS: number;
  ttftMs: Percentiles | null;
  tpotMs: Percentiles | null;
  e2eMs: Percentiles | null;
  /** Batch: when each status was first seen (ms after the create). */
  statusAtMs?: Record<string, number>;
}

/** One line per finished phase on stderr, so a run stopped part-way (a device check's cap) still shows it. */
function reportPhase<T extends PhaseResult>(r: T): T {
  process.stderr.write(`  ${r.phase}: ${r.outputTokensPerS.toFixed(1)} output tok/s, ${r.requestsPerS.toFixed(2)} req/s, ` +
    `${r.failed} failed, ${r.wallS.toFixed(1)} s\n`);
  return r;
}

export function summarize(phase: string, records: RequestRecord[], wallMs: number, rate?: number): PhaseResult {
  const ok = records.filter((r) => r.ok);
  const outputTokens = ok.reduce((n, r) => n + r.outputTokens, 0);
  const num = (xs: (number | undefined)[]) => xs.filter((x): x is number => x !== undefined && Number.isFinite(x));
  return {
    phase, ...(rate !== undefined && { rate }), requests: records.length, failed: records.length - ok.length,
    wallS: wallMs / 1000, outputTokens, inputTokens: ok.reduce((n, r) => n + r.inputTokens, 0),
    requestsPerS: ok.length / (wallMs / 1000), outputTokensPerS: outputTokens / (wallMs / 1000),
    ttftMs: percentiles(num(ok.map((r) => r.ttftMs))),
    tpotMs: percentiles(num(ok.map((r) => (r.outputTokens > 1 && r.decodeMs !== undefined ? r.decodeMs / (r.outputTokens - 1) : undefined)))),
    e2eMs: percentiles(num(ok.map((r) => r.e2eMs))),
  };
}

/** Arrival offsets (ms) of a Poisson process at `rate` requests/s, seeded. */
function poissonOffsets(n: number, rate: number, seed: number): number[] {
  const random = mulberry32(seed);
  let t = 0;
  return Array.from({ length: n }, (_, i) => {
    if (i > 0) t += (-Math.log(1 - random()) / rate) * 1000;
    return t;
  });
}

function printTable(results: PhaseResult[], engineTokensPerS: number | undefined): void {
  const f = (x: number | undefined, d = 0) => (x === undefined || !Number.isFinite(x) ? '-' : x.toFixed(d));
  const p = (q: Percentiles | null) => (q === null ? '-' : `${f(q.p50)}/${f(q.p90)}/${f(q.p99)}`);
  console.log(`\n${'phase'.padEnd(16)} ${'reqs'.padStart(5)} ${'fail'.padStart(4)} ${'wall s'.padStart(7)} ${'req/s'.padStart(7)} ` +
    `${'out tok/s'.padStart(10)} ${'vs engine'.padStart(9)}  ${'TTFT ms p50/p90/p99'.padEnd(22)} ${'TPOT ms p50/p90/p99'.padEnd(20)} e2e ms p50/p90/p99`);
  for (const r of results) {
    const name = r.rate !== undefined ? `poisson ${r.rate.toFixed(2)}/s` : r.phase;
    const ratio = engineTokensPerS && (r.phase === 'chat' || r.phase === 'batch') ? f(r.outputTokensPerS / engineTokensPerS, 3) : '';
    console.log(`${name.padEnd(16)} ${String(r.requests).padStart(5)} ${String(r.failed).padStart(4)} ${f(r.wallS, 1).padStart(7)} ` +
      `${f(r.requestsPerS, 2).padStart(7)} ${f(r.outputTokensPerS, 1).padStart(10)} ${ratio.padStart(9)}  ${p(r.ttftMs).padEnd(22)} ${p(r.tpotMs).padEnd(20)} ${p(r.e2eMs)}`);
  }
}

function deviceSlug(backend: string, simd: string): string {
  const name = backend === 'cuda' ? simd : `${machineInfo().cpu ?? 'cpu'}-${os.cpus().length}core`;
  return name.toLowerCase().replace(/nvidia/g, '').replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
}

async function main(): Promise<void> {
  if (args['serve-child']) return childMain(args);
  const backend = args.backend === 'cuda' ? 'cuda' : 'cpu';
  const gpu = backend === 'cuda';
  const requests = Number(args.requests ?? (gpu ? 1000 : 400));
  const scale = Number(args['length-scale'] ?? (gpu ? 1 : 0.25));
  const seed = Number(args.seed);
  const phases = new Set(args.phases!.split(','));
  const numRounds = Number(args.rounds ?? (gpu ? 1 : 3));
  if (!Number.isInteger(numRounds) || numRounds < 1 || numRounds > 20) throw new Error('--rounds must be an integer in [1, 20]');
  if (!Number.isInteger(requests) || requests < 1 || requests > 100_000) throw new Error('--requests must be an integer in [1, 100000]');
  if (!(scale > 0 && scale <= 4)) throw new Error('--length-scale must be in (0, 4]');
  const quantization = args.quantization!, kvCacheDtype = args['kv-cache-dtype']!;
  if (quantization !== 'none' && quantization !== 'fp8') throw new Error(`--quantization must be none or fp8, got ${quantization}`);
  if (quantization === 'fp8' && !gpu) throw new Error('--quantization fp8 needs --backend cuda (the CPU has no FP8 GEMMs)');
  if (kvCacheDtype !== 'auto' && kvCacheDtype !== 'fp8') throw new Error(`--kv-cache-dtype must be auto or fp8, got ${kvCacheDtype}`);

  const modelDir = args.model ? resolve(args.model) : await ensureBenchModel(args.preset!, args.dtype as 'bf16');
  const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-bench-throughput-'));
  const proc = fork(fileURLToPath(import.meta.url), [
    '--serve-child', '--data-dir', dataDir, '--model', modelDir, '--model-id', 'bench', '--backend', backend,
    ...(['threads', 'max-num-seqs', 'max-batched-tokens', 'kv-cache-mib', 'gpu-memory-utilization', 'quantization', 'kv-cache-dtype'] as const)
      .flatMap((k) => (args[k] !== undefined ? [`--${k}`, args[k]!] : [])),
    '--requests', String(requests),
  ], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const child = new ServerChild<ChildRequest, ChildReply>(proc);
  try {
    const ready = await child.next('ready');
    const workload: WorkloadRequest[] = sharegptWorkload({ requests, seed, scale, maxTotal: ready.contextLength });
    process.stderr.write(`server ready (${ready.backend}, ${ready.device})\n`);
    // Each phase gets prompts of its own (same lengths, other words): a phase must not find the
    // previous phase's prompts in the prefix cache.
    const checked = { exact: 0, off: 0 };
    let salt = 0;
    const prepare = async (list: WorkloadRequest[]) => {
      child.send({ cmd: 'prepare', workload: list, salt: ++salt });
      const prepared = await child.next('prepared');
      checked.exact += prepared.checked.exact;
      checked.off += prepared.checked.off;
      return prepared.bodies;
    };
    const results: PhaseResult[] = [];
    let engineRate: number | undefined;
    let engineTokensPerS: number | undefined;
    const base = { baseUrl: `${ready.address}/v1`, key: ready.key };

    // The offline phases, in rounds (engine, chat, batch, engine, ...): each phase's best round is
    // reported, as a shared machine's noise slows one run, not all of them; every round is kept.
    const rounds: PhaseResult[][] = [];
    for (let round = 0; round < numRounds; round++) {
      const these: PhaseResult[] = [];
      if (phases.has('engine')) {
        await prepare(workload);
        process.stderr.write(`round ${round + 1}/${numRounds}: engine, every request at once...\n`);
        child.send({ cmd: 'engine-run' });
        const run = await child.next('engine-run');
        these.push(reportPhase(summarize('engine', run.records, run.wallMs)));
      }
      if (phases.has('chat')) {
        process.stderr.write(`round ${round + 1}/${numRounds}: chat, every request at once over HTTP...\n`);
        const bodies = await prepare(workload);
        const run: HttpRun = await runChat(base, bodies, bodies.map(() => 0));
        these.push(reportPhase(summarize('chat', run.records, run.wallMs)));
      }
      if (phases.has('batch')) {
        process.stderr.write(`round ${round + 1}/${numRounds}: batch, one Batches API batch...\n`);
        const run = await runBatch(base, await prepare(workload), args['batch-window']!);
        these.push(reportPhase({ ...summarize('batch', run.records, run.wallMs), statusAtMs: run.statusAtMs }));
      }
      rounds.push(these);
    }
    for (const phase of ['engine', 'chat', 'batch']) {
      const runs = rounds.flatMap((r) => r.filter((x) => x.phase === phase));
      if (runs.length === 0) continue;
      const best = runs.reduce((a, b) => (b.failed <= a.failed && b.outputTokensPerS > a.outputTokensPerS ? b : a));
      results.push(best);
      if (phase === 'engine') {
        engineRate = best.requestsPerS;
        engineTokensPerS = best.outputTokensPerS;
      }
    }
    if (phases.has('poisson')) {
      const rates = args.rates === 'auto'
        ? (engineRate !== undefined ? [0.25, 0.5, 0.75, 1, 1.5].map((x) => x * engineRate!) : [])
        : args.rates!.split(',').map(Number);
      if (rates.some((x) => !(x > 0))) throw new Error('--rates must be positive numbers (or auto, which needs the engine phase)');
      const n = Math.min(requests, Number(args['poisson-requests'] ?? requests));
      for (const [k, rate] of rates.entries()) {
        process.stderr.write(`poisson: ${n} requests at ${rate.toFixed(2)}/s...\n`);
        const run = await runChat(base, await prepare(workload.slice(0, n)), poissonOffsets(n, rate, seed * 1000 + k));
        results.push(reportPhase(summarize('poisson', run.records, run.wallMs, rate)));
      }
    }

    const inputs = lengthSummary(workload.map((w) => w.inputTokens));
    const outputs = lengthSummary(workload.map((w) => w.outputTokens));
    console.log(`\nthroughput: ${requests} requests, ShareGPT-like lengths x ${scale} (seed ${seed}): input tokens mean ${inputs.mean.toFixed(1)} ` +
      `(p50 ${inputs.p50}, p99 ${inputs.p99}, max ${inputs.max}), max output tokens mean ${outputs.mean.toFixed(1)} (p50 ${outputs.p50}, p99 ${outputs.p99}, max ${outputs.max})`);
    console.log(`model ${args.model ?? `${args.preset} (${args.dtype}, random weights)`}, ${ready.backend} on ${ready.device}, ` +
      `max ${ready.maxNumSeqs} sequences / ${ready.maxBatchedTokens} tokens a step, KV pool ${(ready.kvCacheBytes / 2 ** 20).toFixed(0)} MiB`);
    console.log(`weights ${ready.weightDtype} (--quantization ${quantization}), KV ${ready.kvCacheDtype} (--kv-cache-dtype ${kvCacheDtype}): ` +
      `${ready.numBlocks} blocks of ${ready.blockSize} tokens`);
    printTable(results, engineTokensPerS);
    if (engineTokensPerS !== undefined) {
      for (const r of results.filter((x) => x.phase === 'chat' || x.phase === 'batch')) {
        const ratio = r.outputTokensPerS / engineTokensPerS;
        console.log(`${r.phase} / engine output tokens/s: ${ratio.toFixed(3)} (target >= 0.95: ${ratio >= 0.95 ? 'met' : 'NOT met'})`);
      }
    }
    const out = args.out ?? `bench/results/throughput-${deviceSlug(ready.backend, ready.device)}.json`;
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, `${JSON.stringify({
      bench: 'throughput', machine: machineInfo(), backend: ready.backend, device: ready.device,
      model: args.model ?? { preset: args.preset, dtype: args.dtype, weights: 'random' },
      engine: { maxNumSeqs: ready.maxNumSeqs, maxBatchedTokens: ready.maxBatchedTokens, kvCacheBytes: ready.kvCacheBytes, threads: ready.threads,
        quantization, kvCacheDtypeOption: kvCacheDtype, weightDtype: ready.weightDtype, kvCacheDtype: ready.kvCacheDtype,
        numBlocks: ready.numBlocks, blockSize: ready.blockSize },
      workload: { requests, seed, lengthScale: scale, distribution: 'bench/sharegpt-workload.ts', input: inputs, maxOutput: outputs,
        promptTokensChecked: checked },
      targets: { httpOverEngineOutputTokensPerS: 0.95 },
      results,
      rounds: rounds.map((r) => r.map((x) => ({ phase: x.phase, wallS: x.wallS, outputTokensPerS: x.outputTokensPerS, failed: x.failed }))),
    }, null, 2)}\n`);
    await chartsBesideResult(out);
    console.log(`\nwrote ${out}`);
  } finally {
    try {
      child.send({ cmd: 'quit' });
    } catch {
      // already gone
    }
    await child.exited.catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }
}

await main();
