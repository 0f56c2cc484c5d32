// HTTP API throughput and overhead on the tiny model (CPU backend):
//   npm run bench:http -- [--duration 10] [--connections 64] [--warmup 300] [--serial 5] [--rounds 3]
//   [--threads N] [--preset tiny] [--dtype bf16] [--model DIR] [--out bench/results/http.json]
//
// Three measurements (and a fourth, optional), in one run, on one server process:
//   1. GET /v1/models at --connections concurrent keep-alive connections (autocannon);
//   2. POST /v1/responses generating 1 token ({"input": "Hello", "max_output_tokens": 1,
//      "temperature": 0}) at the same concurrency (autocannon);
//   3. the same 1-token generation called directly through Engine.generate by --connections
//      concurrent callers in a closed loop, for the same duration. overhead_p50_ms / p99_ms are
//      (2) minus (3): what the HTTP layer (fastify, auth, validation, the stored response rows,
//      serialization, the sockets) adds on top of the engine. With 64 requests in flight in a
//      closed loop, latency is about concurrency / throughput, so this difference is mostly the
//      throughput the HTTP layer's CPU time costs the engine on a small machine;
//   4. (--serial SECONDS, 0 to skip) (2) and (3) again with 1 connection / 1 caller: the
//      per-request cost of the HTTP layer without queueing.
//
// Design. The server runs in a child process (this file with --serve-child, forked with an IPC
// channel) and autocannon runs here in the parent: a load generator in the server's own event
// loop would take the server's thread. The raw-engine measurement must run inside the server
// process, on the engine object the service uses (service.registry.models[0].engine), so the
// parent asks the child for it over the IPC channel (nothing is added to the HTTP surface), after
// the HTTP runs, when no HTTP load is running. The prompt tokens come from the route's own path
// (toGenerationRequest + GenerationService.prepare), and the parent checks that a real
// POST /v1/responses reports the same number of input tokens and 1 output token. Engine.generate
// is given those tokens, so the chat template and tokenizer the route runs per request count as
// the HTTP layer's overhead.
//
// Latency percentiles are computed here from every response's time (autocannon's 'response'
// event, fractional ms); autocannon's own histogram rounds to whole milliseconds, too coarse
// for a 2 ms budget. Requests/s is completed requests over the measured wall time. Any
// connection error, timeout or non-2xx response fails the bench. Each phase is preceded by
// --warmup requests (or engine calls) at the same concurrency that are not counted.
//
// Caveat: on a small machine the load generator shares the CPUs with the server during (1) and
// (2) but not during (3), which makes the reported overhead an upper bound; the engine's compute
// threads (default, as `sluice serve`: all CPUs but one) share the CPUs with the server's event loop.
// Prints a table and writes JSON (default bench/results/http.json).
import { fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import type autocannonType from 'autocannon';

import { machineInfo } from './machine.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { ServerChild } from './server-child.js';

const { values: args } = parseArgs({
  options: {
    duration: { type: 'string', default: '10' },
    connections: { type: 'string', default: '64' },
    warmup: { type: 'string', default: '300' },
    serial: { type: 'string', default: '5' },
    rounds: { type: 'string', default: '3' },
    threads: { type: 'string' },
    preset: { type: 'string', default: 'tiny' },
    dtype: { type: 'string', default: 'bf16' },
    model: { type: 'string' },
    out: { type: 'string', default: 'bench/results/http.json' },
    'serve-child': { type: 'boolean', default: false },
    'data-dir': { type: 'string' },
    'model-id': { type: 'string' },
  },
});

const PROMPT = 'Hello';

interface LatencyStats {
  count: number;
  perS: number;
  meanMs: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
}

function latencyStats(latenciesMs: number[], elapsedMs: number): LatencyStats {
  const xs = Float64Array.from(latenciesMs).sort();
  const pct = (q: number) => (xs.length === 0 ? NaN : xs[Math.min(xs.length - 1, Math.max(0, Math.ceil(q * xs.length) - 1))]!);
  let sum = 0;
  for (const x of xs) sum += x;
  return {
    count: xs.length,
    perS: xs.length / (elapsedMs / 1000),
    meanMs: sum / xs.length,
    p50Ms: pct(0.5),
    p90Ms: pct(0.9),
    p99Ms: pct(0.99),
    maxMs: xs.length ? xs[xs.length - 1]! : NaN,
  };
}

// ---------------------------------------------------------------------------------------------
// The server process.

type ChildRequest = { cmd: 'engine-bench'; seconds: number; concurrency: number; warmup: number } | { cmd: 'quit' };
type ChildReply =
  | { type: 'ready'; address: string; key: string; model: string; promptTokens: number; engineInfo: Record<string, unknown> }
  | { type: 'engine-bench'; stats: LatencyStats; failures: number }
  | { type: 'error'; message: string };

async function serveChild(): Promise<void> {
  const send = (msg: ChildReply) => process.send!(msg);
  const { openService, DEFAULT_ORGANIZATION } = await import('../src/service.js');
  const { singleModelCatalog } = await import('../src/config/catalog.js');
  const { createApiKey } = await import('../src/store/api-keys.js');
  const { GenerationService } = await import('../src/serving/generation-service.js');
  const { toGenerationRequest } = await import('../src/surfaces/responses/adapter.js');
  type Body = Parameters<typeof toGenerationRequest>[0];

  const service = await openService({
    catalog: singleModelCatalog(args.model!, args['model-id']!),
    dataDir: args['data-dir']!,
    engineDefaults: { backend: 'cpu', ...(args.threads !== undefined && { threads: Number(args.threads) }) },
    logger: { level: 'warn' },
    onProgress: () => {},
  });
  const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const created = service.firstKey ?? (await createApiKey(service.store, DEFAULT_ORGANIZATION));
  const served = service.registry.models[0]!;
  const engine = served.engine;

  // The prompt tokens exactly as POST /v1/responses makes them.
  const body = { model: served.id, input: PROMPT, max_output_tokens: 1, temperature: 0 } as Body;
  const caller = { orgId: created.info.orgId, orgName: created.info.orgName, keyId: created.info.id };
  const prepared = await new GenerationService(service.registry).prepare(toGenerationRequest(body, caller, served.supportsChat));
  // The fields GenerationService.run passes for this body.
  const request = { promptTokenIds: prepared.promptTokenIds, maxTokens: prepared.maxTokens, temperature: 0 };

  async function closedLoop(concurrency: number, until: { calls?: number; ms?: number }) {
    const latencies: number[] = [];
    let failures = 0;
    let started = 0;
    const t0 = performance.now();
    const deadline = until.ms !== undefined ? t0 + until.ms : Infinity;
    const caller = async () => {
      while (performance.now() < deadline && (until.calls === undefined || started < until.calls)) {
        started++;
        const t = performance.now();
        const result = await engine.generate(request);
        latencies.push(performance.now() - t);
        if (result.tokenIds.length !== 1) failures++;
      }
    };
    await Promise.all(Array.from({ length: concurrency }, caller));
    return { latencies, failures, elapsedMs: performance.now() - t0 };
  }

  process.on('message', (msg: ChildRequest) => {
    if (msg.cmd === 'quit') {
      service.close().then(() => process.exit(0), () => process.exit(1));
      return;
    }
    (async () => {
      await closedLoop(msg.concurrency, { calls: msg.warmup });
      const run = await closedLoop(msg.concurrency, { ms: msg.seconds * 1000 });
      send({ type: 'engine-bench', stats: latencyStats(run.latencies, run.elapsedMs), failures: run.failures });
    })().catch((err: unknown) => send({ type: 'error', message: (err as Error).stack ?? String(err) }));
  });

  send({
    type: 'ready', address, key: created.key, model: served.id, promptTokens: prepared.promptTokenIds.length,
    engineInfo: engine.info as unknown as Record<string, unknown>,
  });
}

// ---------------------------------------------------------------------------------------------
// The load generator.


interface HttpPhase {
  name: string;
  connections: number;
  method: 'GET' | 'POST';
  path: string;
  body?: string;
}

interface HttpResult {
  name: string;
  connections: number;
  stats: LatencyStats;
  autocannon: { requestsPerSAverage: number; latencyP50Ms: number; latencyP99Ms: number; totalRequests: number; durationS: number };
  errors: number;
  timeouts: number;
  non2xx: number;
}

async function main(): Promise<void> {
  if (args['serve-child']) return serveChild();

  const seconds = Number(args.duration);
  const connections = Number(args.connections);
  const warmup = Number(args.warmup);
  const serialSeconds = Number(args.serial);
  const numRounds = Number(args.rounds);
  if (!(seconds > 0) || !(connections >= 1) || !(warmup >= 0) || !(serialSeconds >= 0) || !(Number.isInteger(numRounds) && numRounds >= 1)) {
    throw new Error('--duration and --connections must be positive numbers, --warmup and --serial >= 0, --rounds an integer >= 1');
  }
  const modelDir = args.model ? resolve(args.model) : await ensureBenchModel(args.preset!, args.dtype as 'f32' | 'f16' | 'bf16');
  const modelId = args.model ? 'model' : args.preset!;
  const loadBefore = os.loadavg();

  const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-bench-http-'));
  const proc = fork(fileURLToPath(import.meta.url), [
    '--serve-child', '--model', modelDir, '--model-id', modelId, '--data-dir', dataDir, ...(args.threads !== undefined ? ['--threads', args.threads] : []),
  ], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const server = new ServerChild<ChildRequest, ChildReply>(proc);
  try {
    const ready = await server.next('ready');
    const headers = { authorization: `Bearer ${ready.key}`, 'content-type': 'application/json' };
    const postBody = JSON.stringify({ model: ready.model, input: PROMPT, max_output_tokens: 1, temperature: 0 });
    process.stderr.write(`server at ${ready.address} (pid ${proc.pid}), model ${ready.model}, prompt ${ready.promptTokens} tokens\n`);

    // The HTTP request runs the same prompt tokens as the engine measurement, and makes 1 token
    // (status incomplete: the 1-token limit ended it).
    const check = await fetch(`${ready.address}/v1/responses`, { method: 'POST', headers, body: postBody });
    const checked = (await check.json()) as { status?: string; usage?: { input_tokens: number; output_tokens: number } };
    if (check.status !== 200 || (checked.status !== 'completed' && checked.status !== 'incomplete') || checked.usage?.output_tokens !== 1) {
      throw new Error(`POST /v1/responses check failed: HTTP ${check.status} ${JSON.stringify(checked)}`);
    }
    if (checked.usage.input_tokens !== ready.promptTokens) {
      throw new Error(`POST /v1/responses used ${checked.usage.input_tokens} input tokens, the engine measurement ${ready.promptTokens}`);
    }

    const { default: autocannon } = await import('autocannon');
    type AcResult = autocannonType.Result;
    const runAutocannon = (phase: HttpPhase, opts: { amount?: number; duration?: number }) =>
      new Promise<{ result: AcResult; latencies: number[]; statuses: Map<number, number>; elapsedMs: number }>((res, rej) => {
        const latencies: number[] = [];
        const statuses = new Map<number, number>();
        const t0 = performance.now();
        const instance = autocannon({
          url: `${ready.address}${phase.path}`,
          method: phase.method,
          headers,
          ...(phase.body !== undefined && { body: phase.body }),
          connections: phase.connections,
          ...opts,
        }, (err, result) => {
          if (err) rej(err);
          else res({ result, latencies, statuses, elapsedMs: performance.now() - t0 });
        });
        instance.on('response', (_client, statusCode, _bytes, responseTime) => {
          latencies.push(responseTime);
          statuses.set(statusCode, (statuses.get(statusCode) ?? 0) + 1);
        });
      });
    const failIfErrors = (phase: HttpPhase, what: string, r: AcResult, statuses: Map<number, number>) => {
      const bad = [...statuses].filter(([code]) => code < 200 || code >= 300);
      if (r.errors > 0 || r.timeouts > 0 || r.non2xx > 0 || bad.length > 0) {
        throw new Error(`${phase.name} (${what}): ${r.errors} errors, ${r.timeouts} timeouts, ${r.non2xx} non-2xx responses ` +
          `(status counts ${JSON.stringify(Object.fromEntries(statuses))})`);
      }
    };
    const runHttp = async (phase: HttpPhase, phaseSeconds: number, phaseWarmup: number): Promise<HttpResult> => {
      process.stderr.write(`${phase.name}: ${phaseWarmup} warm-up requests, then ${phaseSeconds} s at ${phase.connections} connection(s)...\n`);
      if (phaseWarmup > 0) {
        // autocannon wants at least one request per connection.
        const w = await runAutocannon(phase, { amount: Math.max(phaseWarmup, phase.connections) });
        failIfErrors(phase, 'warm-up', w.result, w.statuses);
      }
      const { result, latencies, statuses, elapsedMs } = await runAutocannon(phase, { duration: phaseSeconds });
      failIfErrors(phase, 'measured', result, statuses);
      return {
        name: phase.name,
        connections: phase.connections,
        stats: latencyStats(latencies, elapsedMs),
        autocannon: {
          requestsPerSAverage: result.requests.average,
          latencyP50Ms: result.latency.p50,
          latencyP99Ms: result.latency.p99,
          totalRequests: result.requests.total,
          durationS: result.duration,
        },
        errors: result.errors,
        timeouts: result.timeouts,
        non2xx: result.non2xx,
      };
    };
    const runEngine = async (concurrency: number, phaseSeconds: number, phaseWarmup: number): Promise<LatencyStats> => {
      process.stderr.write(`Engine.generate (1 token) in the server process: ${phaseWarmup} warm-up calls, then ${phaseSeconds} s at ${concurrency} caller(s)...\n`);
      server.send({ cmd: 'engine-bench', seconds: phaseSeconds, concurrency, warmup: phaseWarmup });
      const run = await server.next('engine-bench');
      if (run.failures > 0) throw new Error(`Engine.generate: ${run.failures} calls did not make exactly 1 token`);
      return run.stats;
    };

    const models = await runHttp({ name: 'GET /v1/models', method: 'GET', path: '/v1/models', connections }, seconds, warmup);
    const responsesPhase: HttpPhase = { name: 'POST /v1/responses (1 token)', method: 'POST', path: '/v1/responses', body: postBody, connections };
    // The POST and engine phases alternate for --rounds rounds, and the round with the median p50
    // overhead is reported: the machine's background load drifts over a run, and pairing each
    // HTTP phase with the engine phase right after it keeps that drift out of the difference.
    const rounds: Array<{ responses: HttpResult; engine: LatencyStats; overheadP50: number }> = [];
    for (let i = 0; i < numRounds; i++) {
      const r = await runHttp(responsesPhase, seconds, i === 0 ? warmup : Math.min(warmup, connections));
      const e = await runEngine(connections, seconds, i === 0 ? warmup : Math.min(warmup, connections));
      rounds.push({ responses: r, engine: e, overheadP50: r.stats.p50Ms - e.p50Ms });
    }
    const median = [...rounds].sort((a, b) => a.overheadP50 - b.overheadP50)[Math.floor((rounds.length - 1) / 2)]!;
    const { responses, engine } = median;
    // One request at a time: the per-request cost of the HTTP layer without queueing behind others.
    const serialWarmup = Math.min(warmup, 50);
    const serial = serialSeconds > 0
      ? {
        responses: await runHttp({ ...responsesPhase, connections: 1 }, serialSeconds, serialWarmup),
        engine: await runEngine(1, serialSeconds, serialWarmup),
      }
      : undefined;

    server.send({ cmd: 'quit' });
    await server.exited.catch(() => {});

    const overheadP50 = responses.stats.p50Ms - engine.p50Ms;
    const overheadP99 = responses.stats.p99Ms - engine.p99Ms;
    const loadAfter = os.loadavg();

    const info = ready.engineInfo as { architecture?: string; weightDtype?: string; simd?: string; numThreads?: number };
    const cpus = os.cpus();
    console.log(`model ${modelId} (${info.architecture}, ${info.weightDtype}), backend cpu ${info.simd ?? ''} x${info.numThreads} threads; ` +
      `prompt "${PROMPT}" = ${ready.promptTokens} tokens, 1 output token, temperature 0`);
    console.log(`${connections} connections / callers, ${seconds} s per phase after ${warmup} warm-up requests` +
      `${serial ? ` (1 connection: ${serialSeconds} s after ${serialWarmup})` : ''}; ` +
      `${cpus[0]?.model} x${cpus.length}, node ${process.version}; load average before ${loadBefore[0]!.toFixed(2)}, after ${loadAfter[0]!.toFixed(2)}`);
    console.log('');
    console.log('| measurement | concurrency | count | per s | p50 ms | p90 ms | p99 ms | max ms | errors / non-2xx |');
    console.log('|-------------|------------:|------:|------:|-------:|-------:|-------:|-------:|-----------------:|');
    const row = (name: string, concurrency: number, s: LatencyStats, errs: string) =>
      console.log(`| ${name} | ${concurrency} | ${s.count} | ${s.perS.toFixed(0)} | ${s.p50Ms.toFixed(2)} | ${s.p90Ms.toFixed(2)} | ` +
        `${s.p99Ms.toFixed(2)} | ${s.maxMs.toFixed(2)} | ${errs} |`);
    const engineName = 'Engine.generate (1 token), in the server process';
    row(models.name, connections, models.stats, `${models.errors} / ${models.non2xx}`);
    row(responses.name, connections, responses.stats, `${responses.errors} / ${responses.non2xx}`);
    row(engineName, connections, engine, '0 / -');
    if (serial) {
      row(serial.responses.name, 1, serial.responses.stats, `${serial.responses.errors} / ${serial.responses.non2xx}`);
      row(engineName, 1, serial.engine, '0 / -');
    }
    console.log('');
    const verdict = (ok: boolean) => (ok ? 'met' : 'NOT met');
    const signed = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(2)}`;
    console.log(`GET /v1/models: ${models.stats.perS.toFixed(0)} req/s at ${connections} connections (target >= 5000: ${verdict(models.stats.perS >= 5000)})`);
    console.log(`POST /v1/responses over Engine.generate at ${connections}: p50 ${signed(overheadP50)} ms (target <= 2 ms: ${verdict(overheadP50 <= 2)}), ` +
      `p99 ${signed(overheadP99)} ms (median of ${rounds.length} rounds; p50 overheads ${rounds.map((r) => signed(r.overheadP50)).join(', ')} ms)`);
    if (serial) {
      console.log(`POST /v1/responses over Engine.generate at 1 (no queueing): p50 ${signed(serial.responses.stats.p50Ms - serial.engine.p50Ms)} ms, ` +
        `p99 ${signed(serial.responses.stats.p99Ms - serial.engine.p99Ms)} ms`);
    }

    const result = {
      bench: 'http',
      date: new Date().toISOString(),
      machine: {
        ...machineInfo(),
        loadAverage1mBefore: loadBefore[0], loadAverage1mAfter: loadAfter[0],
      },
      model: { preset: args.model ? null : args.preset, dir: modelDir, id: modelId, ...ready.engineInfo },
      settings: {
        durationS: seconds, rounds: numRounds, connections, warmupRequests: warmup, serialDurationS: serialSeconds, serialWarmupRequests: serialWarmup,
        backend: 'cpu', threads: args.threads === undefined ? 'serve default (all CPUs but one)' : Number(args.threads), request: JSON.parse(postBody) as unknown, promptTokens: ready.promptTokens,
        loadGenerator: 'autocannon in the parent process, the server in a child process; Engine.generate measured inside the server process',
        latency: 'percentiles over every response time (ms, fractional); per s = completed over the measured wall time',
      },
      models: models.stats,
      responses: responses.stats,
      engine,
      overhead_p50_ms: overheadP50,
      overhead_p99_ms: overheadP99,
      rounds: rounds.map((r) => ({
        responses: r.responses.stats, engine: r.engine, overhead_p50_ms: r.overheadP50, overhead_p99_ms: r.responses.stats.p99Ms - r.engine.p99Ms,
      })),
      serial: serial
        ? {
          responses: serial.responses.stats,
          engine: serial.engine,
          overhead_p50_ms: serial.responses.stats.p50Ms - serial.engine.p50Ms,
          overhead_p99_ms: serial.responses.stats.p99Ms - serial.engine.p99Ms,
        }
        : null,
      autocannon: Object.fromEntries([models, responses, ...(serial ? [serial.responses] : [])].map((r) =>
        [`${r.name} x${r.connections}`, { ...r.autocannon, errors: r.errors, timeouts: r.timeouts, non2xx: r.non2xx }])),
      targets: {
        modelsRequestsPerS: { target: '>= 5000', value: models.stats.perS, met: models.stats.perS >= 5000 },
        responsesOverheadP50Ms: { target: '<= 2', value: overheadP50, met: overheadP50 <= 2 },
      },
    };
    mkdirSync(dirname(resolve(args.out!)), { recursive: true });
    writeFileSync(resolve(args.out!), JSON.stringify(result, null, 2) + '\n');
    await chartsBesideResult(resolve(args.out!));
    console.log(`\nwrote ${args.out}`);
  } finally {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
