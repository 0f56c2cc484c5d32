// Serving benchmark in the manner of vLLM's benchmark_serving: open-loop Poisson arrivals with a
// mix of completion windows against a real server process, on the tiny model (CPU backend; --backend
// cuda and --preset llama-3.1-8b for a GPU):
//   npm run bench:serve -- [--scenarios mixed,tiers] [--seed 1]
//     mixed: [--rate 8,16] [--duration 30] [--mix asap=0.2,standard=0.5,flex=0.3]
//            [--prompt-words 5-85] [--output-tokens 16-64]
//     tiers: [--tier-rate 2] [--tier-duration 20] [--tier-prompt-words 8-16] [--tier-output-tokens 16]
//            [--backlog 400] [--backlog-prompt-words 128] [--backlog-output-tokens 256] [--settle auto|SECONDS] [--settle-max 60]
//     tenants: [--flood 1000] [--flood-prompt-words 8-16] [--flood-output-tokens 256] (and the tier stream's settings)
//     hostile: [--hostile-rate 10] (and the tier stream's settings; bench/serve-hostile.ts, issue 27)
//     engine: [--backend cpu|cuda] [--threads N] [--max-num-seqs 64] [--max-batched-tokens 512] [--kv-cache-mib 256]
//            (CUDA defaults: 256 sequences, 8192 tokens, the KV pool the engine sizes)
//     [--poll-ms 40] [--drain-timeout 180] [--preset tiny] [--dtype bf16] [--model DIR] [--out bench/results/serve.json]
//
// Scenarios:
//   mixed  Requests arrive as a Poisson process at --rate req/s (exponential inter-arrival times)
//          for --duration seconds, one run per rate of the list (defaults: 8 req/s, about 60% of
//          this 2-core machine's engine time, and 16 req/s, past its capacity of about 12.5 req/s
//          with these lengths). Each request draws its window from --mix, a prompt of N words and
//          max_output_tokens from the ranges (uniform integers), temperature 0. asap and standard
//          are foreground POST /v1/responses; flex is background=true (flex requires it) and is
//          polled with GET /v1/responses/{id}. Then the bench waits for every request to end.
//   tiers  The case that proves the completion windows: (a) an asap stream alone at --tier-rate
//          (idle baseline); (b) a backlog of --backlog background flex requests is submitted first,
//          large enough to keep the engine busy for the whole phase, then the SAME asap stream
//          (same seed: same arrival times, prompts and lengths) runs against it, once the backlog
//          fills the engine (--settle auto: --max-num-seqs sequences running). Reported: asap TTFT
//          p50 under load / idle (target <= 1.5: printed met / NOT met, not asserted), how many flex
//          requests finished during the phase (they must still progress), and whether the backlog
//          outlasted the phase. The unfinished backlog is cancelled (POST .../cancel) at the end
//          so the server ends idle; the bench checks that it does.
//   tenants Fairness between organizations (bench/serve-tenants.ts): organization A's asap stream
//          (the tiers stream) alone, then while organization B floods the server with --flood
//          background asap requests; target: A's TTFT p50 under the flood <= 1.5 x idle.
//
// Metrics, per window (as benchmark_serving): completed and failed requests; throughput =
// completed / the phase's duration (first send to last completion) and output tokens / duration;
// TTFT = queue + prefill from the foreground response's `server-timing` header (the endpoint does
// not stream); TPOT = decode / (output_tokens - 1) (requests with one output token have none);
// e2e = client-measured, from sending the POST to reading the response. Background (flex)
// responses carry no server-timing and the stored object has no timings, so flex TTFT and TPOT
// are null; flex e2e runs from the POST to the poll that first sees a terminal status, so it is
// late by up to --poll-ms plus a sweep (polling every pending flex request once per sweep).
// The tiny model may end at eos before max_output_tokens; output tokens come from `usage`.
//
// Design. As bench/http.ts: the server runs in a child process (this file with --serve-child,
// forked with an IPC channel, calling openService) and the load runs here, in the parent. Arrival
// times, windows, prompts and lengths come from seeded generators, so runs are reproducible. For
// evidence of where TTFT goes, the child times the engine's native steps and splits each step's
// rows and tokens by window (it wraps the step method of the engine's native handle and reads the
// scheduler's roster: bench instrumentation reached through private fields, off when their shape
// changes: stepInstrumentation false in the JSON), and counts preemptions by window through the
// engine's public observer (Engine.observe); the parent asks for a step summary per phase over IPC.
//
// Caveat: on a 2-core machine the load generator shares the CPUs with the server's event loop and
// its compute threads (default, as `sluice serve`: all CPUs but one).
// Prints tables and writes JSON (default bench/results/serve.json).
import { fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { machineInfo } from './machine.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { ServerChild } from './server-child.js';
import { mulberry32 } from './sharegpt-workload.js';
import { runTenantsScenario } from './serve-tenants.js';
import { runHostileScenario } from './serve-hostile.js';

const { values: args } = parseArgs({
  options: {
    scenarios: { type: 'string', default: 'mixed,tiers,tenants' },
    flood: { type: 'string', default: '1000' },
    'hostile-rate': { type: 'string', default: '10' },
    'flood-prompt-words': { type: 'string', default: '8-16' },
    'flood-output-tokens': { type: 'string', default: '256' },
    seed: { type: 'string', default: '1' },
    rate: { type: 'string', default: '8,16' },
    duration: { type: 'string', default: '30' },
    mix: { type: 'string', default: 'asap=0.2,standard=0.5,flex=0.3' },
    'prompt-words': { type: 'string', default: '5-85' },
    'output-tokens': { type: 'string', default: '16-64' },
    'tier-rate': { type: 'string', default: '2' },
    'tier-duration': { type: 'string', default: '20' },
    'tier-prompt-words': { type: 'string', default: '8-16' },
    'tier-output-tokens': { type: 'string', default: '16' },
    backlog: { type: 'string', default: '400' },
    'backlog-prompt-words': { type: 'string', default: '128' },
    'backlog-output-tokens': { type: 'string', default: '256' },
    settle: { type: 'string', default: 'auto' },
    'settle-max': { type: 'string', default: '60' },
    'poll-ms': { type: 'string', default: '40' },
    'drain-timeout': { type: 'string', default: '180' },
    threads: { type: 'string' },
    // Defaults by backend: cpu 64 / 512 / 256 MiB; cuda 256 / 8192 / 0 (0: the engine sizes the KV pool).
    'max-num-seqs': { type: 'string' },
    'max-batched-tokens': { type: 'string' },
    'kv-cache-mib': { type: 'string' },
    backend: { type: 'string', default: 'cpu' },
    preset: { type: 'string', default: 'tiny' },
    dtype: { type: 'string', default: 'bf16' },
    model: { type: 'string' },
    out: { type: 'string', default: 'bench/results/serve.json' },
    'serve-child': { type: 'boolean', default: false },
    'data-dir': { type: 'string' },
    'model-id': { type: 'string' },
  },
});

export const WINDOWS = ['asap', 'standard', 'flex'] as const;
export type Window = (typeof WINDOWS)[number];

// ---------------------------------------------------------------------------------------------
// Statistics and seeded randomness.

/** Nearest-rank percentile (as bench/http.ts); null for an empty sample. */
export function percentiles(values: number[]): { p50: number | null; p90: number | null; p99: number | null; mean: number | null } {
  const xs = Float64Array.from(values).sort();
  const pct = (q: number) => (xs.length === 0 ? null : xs[Math.min(xs.length - 1, Math.max(0, Math.ceil(q * xs.length) - 1))]!);
  let sum = 0;
  for (const x of xs) sum += x;
  return { p50: pct(0.5), p90: pct(0.9), p99: pct(0.99), mean: xs.length ? sum / xs.length : null };
}

/** A small seeded generator of uniform numbers in [0, 1) (mulberry32). */
const rng = mulberry32;

function parseRange(text: string, name: string): [number, number] {
  const m = /^(\d+)(?:-(\d+))?$/.exec(text.trim());
  const lo = m ? Number(m[1]) : NaN;
  const hi = m ? Number(m[2] ?? m[1]) : NaN;
  if (!(lo >= 1 && hi >= lo)) throw new Error(`--${name} must be N or LO-HI with 1 <= LO <= HI, got "${text}"`);
  return [lo, hi];
}

function parseMix(text: string): Record<Window, number> {
  const mix: Record<Window, number> = { asap: 0, standard: 0, flex: 0 };
  for (const part of text.split(',').filter((p) => p.trim() !== '')) {
    const [name, value] = part.split('=').map((s) => s.trim());
    if (!(WINDOWS as readonly string[]).includes(name!) || !(Number(value) >= 0)) {
      throw new Error(`--mix must be like asap=0.2,standard=0.5,flex=0.3, got "${text}"`);
    }
    mix[name as Window] = Number(value);
  }
  const total = mix.asap + mix.standard + mix.flex;
  if (!(total > 0)) throw new Error('--mix must give some window a positive share');
  for (const w of WINDOWS) mix[w] /= total;
  return mix;
}

// Everyday words: prompts of N words, N drawn per request (the token count comes from usage; with
// the tiny model's tokenizer and chat template, N words are about 1.4 N + 9 tokens: 5-85 words are
// about 16-128 prompt tokens).
const WORDS = ('the of and to in is it that for on with as was at by be this from or have an they which one you ' +
  'were her all she there would their we him been has when who will more no if out so said what up its about into ' +
  'than them can only other new some could time these two may then do first any my now such like our over man me ' +
  'even most made after also did many before must through back years where much your way well down should because ' +
  'each just those people how too little state good very make world still own see men work long get here between both ' +
  'life being under never day same another know while last might us great old year off come since against go came ' +
  'right used take three river garden window music winter letter morning doctor station').split(' ');

export interface PlannedRequest {
  index: number;
  /** Seconds from the phase's start. */
  at: number;
  window: Window;
  input: string;
  maxOutputTokens: number;
  /** Sent with background=true (always for flex). */
  background?: boolean;
  /** A Responses text format (`text.format`), e.g. a json_schema. */
  format?: object;
  /** Function tools and `tool_choice` (e.g. 'required'). */
  tools?: object[];
  toolChoice?: unknown;
}

/** A Poisson arrival schedule (exponential gaps) over `seconds`, or `count` requests at time 0 (a backlog). */
export function planRequests(opts: {
  seed: number; rate?: number; seconds?: number; count?: number; mix: Record<Window, number>;
  promptWords: [number, number]; outputTokens: [number, number];
}): PlannedRequest[] {
  const arrivals = rng(opts.seed);
  const content = rng(opts.seed ^ 0x9e3779b9);
  const uniformInt = ([lo, hi]: [number, number]) => lo + Math.floor(content() * (hi - lo + 1));
  const plan: PlannedRequest[] = [];
  let t = 0;
  for (let i = 0; ; i++) {
    if (opts.count !== undefined) {
      if (i >= opts.count) break;
    } else {
      t += -Math.log(1 - arrivals()) / opts.rate!;
      if (t >= opts.seconds!) break;
    }
    const u = content();
    const window: Window = u < opts.mix.asap ? 'asap' : u < opts.mix.asap + opts.mix.standard ? 'standard' : 'flex';
    const numWords = uniformInt(opts.promptWords);
    const words = Array.from({ length: numWords }, () => WORDS[Math.floor(content() * WORDS.length)]!);
    plan.push({ index: i, at: opts.count !== undefined ? 0 : t, window, input: words.join(' '), maxOutputTokens: uniformInt(opts.outputTokens) });
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// The server process.

export interface StepSummary {
  steps: number;
  wallMs: number;
  /** Fraction of the wall time a native step was running. */
  busyFraction: number;
  stepMs: ReturnType<typeof percentiles>;
  tokensPerStep: ReturnType<typeof percentiles>;
  rowsPerStep: ReturnType<typeof percentiles>;
  totalTokens: number;
  /** Tokens computed per window (prefill chunks and decodes), and tokens sampled per window. */
  tokensByWindow: Record<string, number>;
  samplesByWindow: Record<string, number>;
  /** The steps that carried an asap row: how long they took and what else they carried. */
  asapSteps: {
    steps: number;
    stepMs: ReturnType<typeof percentiles>;
    tokensPerStep: ReturnType<typeof percentiles>;
    otherTokensPerStep: ReturnType<typeof percentiles>;
    otherRowsPerStep: ReturnType<typeof percentiles>;
  };
  /** Sequences preempted (KV freed, requeued), by window; null when the policy could not be reached. */
  preemptions: Record<string, number> | null;
}

type ChildRequest = { cmd: 'trace-start' } | { cmd: 'trace-stop' } | { cmd: 'engine-state' } | { cmd: 'quit' };
type ChildReply =
  | { type: 'ready'; address: string; key: string; keyB: string; model: string; engineInfo: Record<string, unknown>; instrumented: boolean }
  | { type: 'trace'; summary: StepSummary }
  | { type: 'engine-state'; running: number | null; waiting: number | null }
  | { type: 'error'; message: string };

async function serveChild(): Promise<void> {
  const send = (msg: ChildReply) => process.send!(msg);
  const { openService, DEFAULT_ORGANIZATION } = await import('../src/service.js');
  const { singleModelCatalog } = await import('../src/config/catalog.js');
  const { createApiKey } = await import('../src/store/api-keys.js');

  const service = await openService({
    // No pricing: the model offers all three windows.
    catalog: singleModelCatalog(args.model!, args['model-id']!),
    dataDir: args['data-dir']!,
    engineDefaults: {
      backend: args.backend === 'cuda' ? 'cuda' : 'cpu',
      ...(args.threads !== undefined && { threads: Number(args.threads) }),
      ...(Number(args['kv-cache-mib']) > 0 && { kvCacheBytes: Number(args['kv-cache-mib']) * 1024 * 1024 }),
      maxNumSeqs: Number(args['max-num-seqs']),
      maxBatchedTokens: Number(args['max-batched-tokens']),
    },
    logger: { level: 'warn' },
    onProgress: () => {},
  });
  const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const created = service.firstKey ?? (await createApiKey(service.store, DEFAULT_ORGANIZATION));
  const createdB = await createApiKey(service.store, 'tenant-b');  // the second organization of the tenants scenario
  const served = service.registry.models[0]!;
  const engine = served.engine;

  // Instrumentation through private fields (see the header): native step times, preemptions.
  interface StepRecord {
    startMs: number; ms: number; rows: number; tokens: number;
    /** [asap, standard, flex, unknown] */
    tokensBy: number[]; rowsBy: number[]; samplesBy: number[];
  }
  const steps: StepRecord[] = [];
  const preemptions: Record<string, number> = {};
  let tracing = false;
  let traceStartMs = 0;
  const priv = engine as unknown as {
    handle?: { step?: (plan: { seqIds: Uint32Array; numTokens: Uint32Array }) => Promise<unknown> };
    batcher?: { roster?: { bySeqId?: Map<number, { priority: number }> } };
  };
  let instrumented = false;
  const handle = priv.handle;
  const bySeqId = priv.batcher?.roster?.bySeqId;
  // Preemptions by the window of the sequence preempted, through the engine's observer API.
  engine.observe({
    onStep: (report) => {
      if (!tracing) return;
      for (const p of report.preempted) {
        const name = WINDOWS[p] ?? String(p);
        preemptions[name] = (preemptions[name] ?? 0) + 1;
      }
    },
  });
  if (handle && typeof handle.step === 'function' && bySeqId instanceof Map) {
    const step = handle.step.bind(handle);
    // defineProperty: the addon's methods are read-only on its prototype (plain assignment throws).
    const override = (obj: object, name: string, value: unknown) =>
      Object.defineProperty(obj, name, { value, writable: true, configurable: true, enumerable: false });
    const slot = (seqId: number) => {
      const p = bySeqId.get(seqId)?.priority;
      return p === 0 || p === 1 || p === 2 ? p : 3;
    };
    override(handle, 'step', async (plan: { seqIds: Uint32Array; numTokens: Uint32Array }) => {
      if (!tracing) return step(plan);
      const tokensBy = [0, 0, 0, 0];
      const rowsBy = [0, 0, 0, 0];
      const samplesBy = [0, 0, 0, 0];
      let tokens = 0;
      for (let i = 0; i < plan.seqIds.length; i++) {
        const k = slot(plan.seqIds[i]!);
        tokensBy[k] += plan.numTokens[i]!;
        rowsBy[k]++;
        tokens += plan.numTokens[i]!;
      }
      const startMs = performance.now();
      const result = (await step(plan)) as { seqIds?: Uint32Array };
      for (const id of result.seqIds ?? []) samplesBy[slot(id)]++;
      steps.push({ startMs, ms: performance.now() - startMs, rows: plan.seqIds.length, tokens, tokensBy, rowsBy, samplesBy });
      return result;
    });
    instrumented = true;
  }

  process.on('message', (msg: ChildRequest) => {
    if (msg.cmd === 'quit') {
      service.close().then(() => process.exit(0), () => process.exit(1));
    } else if (msg.cmd === 'trace-start') {
      steps.length = 0;
      for (const k of Object.keys(preemptions)) delete preemptions[k];
      tracing = true;
      traceStartMs = performance.now();
    } else if (msg.cmd === 'trace-stop') {
      tracing = false;
      const wallMs = performance.now() - traceStartMs;
      let busy = 0;
      let totalTokens = 0;
      for (const s of steps) {
        busy += s.ms;
        totalTokens += s.tokens;
      }
      const names = [...WINDOWS, 'unknown'];
      const sumBy = (f: (s: StepRecord) => number[]) => Object.fromEntries(names.map((n, k) => [n, steps.reduce((a, s) => a + f(s)[k]!, 0)]));
      const withAsap = steps.filter((s) => s.rowsBy[0]! > 0);
      send({
        type: 'trace',
        summary: {
          steps: steps.length,
          wallMs,
          busyFraction: wallMs > 0 ? busy / wallMs : 0,
          stepMs: percentiles(steps.map((s) => s.ms)),
          tokensPerStep: percentiles(steps.map((s) => s.tokens)),
          rowsPerStep: percentiles(steps.map((s) => s.rows)),
          totalTokens,
          tokensByWindow: sumBy((s) => s.tokensBy),
          samplesByWindow: sumBy((s) => s.samplesBy),
          asapSteps: {
            steps: withAsap.length,
            stepMs: percentiles(withAsap.map((s) => s.ms)),
            tokensPerStep: percentiles(withAsap.map((s) => s.tokens)),
            otherTokensPerStep: percentiles(withAsap.map((s) => s.tokens - s.tokensBy[0]!)),
            otherRowsPerStep: percentiles(withAsap.map((s) => s.rows - s.rowsBy[0]!)),
          },
          preemptions: { ...preemptions },
        },
      });
    } else if (msg.cmd === 'engine-state') {
      const stats = typeof engine.schedulerStats === 'function' ? engine.schedulerStats() : undefined;
      send({ type: 'engine-state', running: stats?.numRunning ?? null, waiting: stats?.numWaiting ?? null });
    }
  });

  send({
    type: 'ready', address, key: created.key, keyB: createdB.key, model: served.id,
    engineInfo: engine.info as unknown as Record<string, unknown>, instrumented,
  });
}

// ---------------------------------------------------------------------------------------------
// The load generator.

export class ServeChild extends ServerChild<ChildRequest, ChildReply> {
  async traced<T>(fn: () => Promise<T>): Promise<{ value: T; steps: StepSummary }> {
    this.send({ cmd: 'trace-start' });
    const value = await fn();
    this.send({ cmd: 'trace-stop' });
    return { value, steps: (await this.next('trace')).summary };
  }

  async engineState(): Promise<{ running: number | null; waiting: number | null }> {
    this.send({ cmd: 'engine-state' });
    const { running, waiting } = await this.next('engine-state');
    return { running, waiting };
  }
}

export interface RequestRecord {
  index: number;
  window: Window;
  /** ms from the phase's start. */
  sentMs: number;
  endMs: number | null;
  status: string;
  httpStatus: number | null;
  error: string | null;
  inputTokens: number | null;
  outputTokens: number | null;
  e2eMs: number | null;
  queueMs: number | null;
  prefillMs: number | null;
  decodeMs: number | null;
  ttftMs: number | null;
  tpotMs: number | null;
}

interface ResponseObject {
  id: string;
  status: string;
  error?: { code?: string; message?: string } | null;
  usage?: { input_tokens: number; output_tokens: number };
}

const TERMINAL_OK = new Set(['completed', 'incomplete']);

function parseServerTiming(header: string | null): { queue: number; prefill: number; decode: number } | null {
  if (!header) return null;
  const get = (name: string) => {
    const m = new RegExp(`(?:^|,)\\s*${name};dur=([0-9.]+)`).exec(header);
    return m ? Number(m[1]) : NaN;
  };
  const t = { queue: get('queue'), prefill: get('prefill'), decode: get('decode') };
  return Number.isFinite(t.queue) && Number.isFinite(t.prefill) && Number.isFinite(t.decode) ? t : null;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)));

/** Runs `fn` over `items` with at most `limit` at once. */
export async function pool<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

export class Client {
  constructor(readonly base: string, readonly headers: Record<string, string>, readonly model: string, readonly pollMs: number) {}

  private body(r: PlannedRequest): string {
    return JSON.stringify({
      model: this.model, input: r.input, max_output_tokens: r.maxOutputTokens, temperature: 0,
      metadata: { completion_window: r.window }, ...((r.window === 'flex' || r.background) && { background: true }),
      ...(r.format && { text: { format: r.format } }),
      ...(r.tools && { tools: r.tools, tool_choice: r.toolChoice ?? 'auto' }),
    });
  }

  /** One foreground POST /v1/responses of `fields` (model added); resolves to the HTTP status. */
  async postRaw(fields: { input: string; max_output_tokens: number; format?: object; tools?: object[]; tool_choice?: unknown }): Promise<number> {
    const { format, ...rest } = fields;
    const res = await fetch(`${this.base}/v1/responses`, {
      method: 'POST', headers: this.headers,
      body: JSON.stringify({ model: this.model, temperature: 0, ...rest, ...(format && { text: { format } }) }),
    });
    await res.arrayBuffer();
    return res.status;
  }

  /** Background submission only: the in_progress object's id (throws on failure). */
  async submitBackground(r: PlannedRequest): Promise<string> {
    const res = await fetch(`${this.base}/v1/responses`, { method: 'POST', headers: this.headers, body: this.body(r) });
    const obj = (await res.json()) as ResponseObject;
    if (res.status !== 200 || obj.status !== 'in_progress') throw new Error(`background POST: HTTP ${res.status} ${JSON.stringify(obj)}`);
    return obj.id;
  }

  async get(id: string): Promise<ResponseObject> {
    const res = await fetch(`${this.base}/v1/responses/${id}`, { headers: { authorization: this.headers['authorization']! } });
    const obj = (await res.json()) as ResponseObject;
    if (res.status !== 200) throw new Error(`GET /v1/responses/${id}: HTTP ${res.status} ${JSON.stringify(obj)}`);
    return obj;
  }

  /** POST .../cancel; a 409 (it finished meanwhile) is fine. Returns the status it ended with. */
  async cancel(id: string): Promise<string> {
    const res = await fetch(`${this.base}/v1/responses/${id}/cancel`, { method: 'POST', headers: { authorization: this.headers['authorization']! } });
    const obj = (await res.json()) as ResponseObject & { error?: { code?: string } };
    if (res.status === 200) return obj.status;
    if (res.status === 409) return (await this.get(id)).status;
    throw new Error(`cancel ${id}: HTTP ${res.status} ${JSON.stringify(obj)}`);
  }

  /**
   * Sends a plan open-loop (each request at its arrival time, whatever is still running) and
   * resolves when every request has ended. Flex requests are polled by one sweeper.
   */
  async runOpenLoop(plan: readonly PlannedRequest[], drainTimeoutS: number): Promise<{ records: RequestRecord[]; durationMs: number; lateSendMs: number }> {
    const t0 = performance.now();
    const records: RequestRecord[] = [];
    const inFlight: Array<Promise<void>> = [];
    const pendingFlex = new Map<string, RequestRecord>();
    let sending = true;
    /** Requests whose POST has not been answered yet. */
    let outstanding = 0;
    /** Aborts foreground requests still running at the drain timeout. */
    const abort = new AbortController();
    let lateSendMs = 0;

    const newRecord = (r: PlannedRequest): RequestRecord => ({
      index: r.index, window: r.window, sentMs: performance.now() - t0, endMs: null, status: 'pending', httpStatus: null, error: null,
      inputTokens: null, outputTokens: null, e2eMs: null, queueMs: null, prefillMs: null, decodeMs: null, ttftMs: null, tpotMs: null,
    });
    const finish = (rec: RequestRecord, obj: ResponseObject) => {
      rec.endMs = performance.now() - t0;
      rec.e2eMs = rec.endMs - rec.sentMs;
      rec.status = obj.status;
      rec.inputTokens = obj.usage?.input_tokens ?? null;
      rec.outputTokens = obj.usage?.output_tokens ?? null;
      if (!TERMINAL_OK.has(obj.status)) rec.error = obj.error?.message ?? obj.status;
    };
    const fail = (rec: RequestRecord, err: unknown) => {
      rec.endMs = performance.now() - t0;
      rec.status = 'error';
      rec.error = err instanceof Error ? err.message : String(err);
    };

    const foreground = async (r: PlannedRequest) => {
      const rec = newRecord(r);
      records.push(rec);
      try {
        const res = await fetch(`${this.base}/v1/responses`, { method: 'POST', headers: this.headers, body: this.body(r), signal: abort.signal });
        const obj = (await res.json()) as ResponseObject;
        rec.httpStatus = res.status;
        if (res.status !== 200) throw new Error(`HTTP ${res.status} ${JSON.stringify(obj)}`);
        finish(rec, obj);
        const t = parseServerTiming(res.headers.get('server-timing'));
        if (t) {
          rec.queueMs = t.queue;
          rec.prefillMs = t.prefill;
          rec.decodeMs = t.decode;
          rec.ttftMs = t.queue + t.prefill;
          if (rec.outputTokens !== null && rec.outputTokens > 1) rec.tpotMs = t.decode / (rec.outputTokens - 1);
        }
      } catch (err) {
        fail(rec, err);
      }
    };
    const background = async (r: PlannedRequest) => {
      const rec = newRecord(r);
      records.push(rec);
      try {
        const res = await fetch(`${this.base}/v1/responses`, { method: 'POST', headers: this.headers, body: this.body(r) });
        const obj = (await res.json()) as ResponseObject;
        rec.httpStatus = res.status;
        if (res.status !== 200) throw new Error(`HTTP ${res.status} ${JSON.stringify(obj)}`);
        if (obj.status === 'in_progress') pendingFlex.set(obj.id, rec);
        else finish(rec, obj);
      } catch (err) {
        fail(rec, err);
      }
    };

    // The sweeper: every pollMs (after the previous sweep), GET every pending flex response.
    const sweeper = (async () => {
      while (sending || outstanding > 0 || pendingFlex.size > 0) {
        await sleep(this.pollMs);
        if (performance.now() - t0 > (plan.at(-1)?.at ?? 0) * 1000 + drainTimeoutS * 1000) break;
        await pool([...pendingFlex], 32, async ([id, rec]) => {
          try {
            const obj = await this.get(id);
            if (obj.status !== 'in_progress') {
              pendingFlex.delete(id);
              finish(rec, obj);
            }
          } catch (err) {
            pendingFlex.delete(id);
            fail(rec, err);
          }
        });
      }
    })();

    for (const r of plan) {
      const wait = t0 + r.at * 1000 - performance.now();
      if (wait > 0) await sleep(wait);
      lateSendMs = Math.max(lateSendMs, performance.now() - (t0 + r.at * 1000));
      outstanding++;
      inFlight.push((r.window === 'flex' ? background(r) : foreground(r)).finally(() => { outstanding--; }));
    }
    sending = false;
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<'timeout'>((r) => {
      timer = setTimeout(() => r('timeout'), Math.max(0, (plan.at(-1)?.at ?? 0) * 1000 + drainTimeoutS * 1000 - (performance.now() - t0)));
    });
    const drained = await Promise.race([Promise.all(inFlight).then(() => sweeper).then(() => 'done' as const), deadline]);
    clearTimeout(timer);
    if (drained === 'timeout') abort.abort(new Error(`still running after the drain timeout (${drainTimeoutS} s)`));
    await Promise.all(inFlight);
    await sweeper;
    if (drained === 'timeout' || pendingFlex.size > 0) {
      for (const [id, rec] of pendingFlex) {
        fail(rec, new Error(`still in_progress after the drain timeout (${drainTimeoutS} s)`));
        await this.cancel(id).catch(() => {});
      }
    }
    const ends = records.map((r) => r.endMs ?? 0);
    return { records, durationMs: Math.max(0, ...ends), lateSendMs };
  }
}

export interface WindowStats {
  window: Window;
  requests: number;
  completed: number;
  failed: number;
  requestsPerS: number;
  outputTokensPerS: number;
  inputTokens: ReturnType<typeof percentiles>;
  outputTokens: ReturnType<typeof percentiles>;
  ttftMs: ReturnType<typeof percentiles>;
  queueMs: ReturnType<typeof percentiles>;
  prefillMs: ReturnType<typeof percentiles>;
  tpotMs: ReturnType<typeof percentiles>;
  e2eMs: ReturnType<typeof percentiles>;
  errors: string[];
}

export function windowStats(records: readonly RequestRecord[], durationMs: number): WindowStats[] {
  const out: WindowStats[] = [];
  for (const window of WINDOWS) {
    const rs = records.filter((r) => r.window === window);
    if (rs.length === 0) continue;
    const ok = rs.filter((r) => TERMINAL_OK.has(r.status));
    const nums = (f: (r: RequestRecord) => number | null) => ok.map(f).filter((x): x is number => x !== null);
    const outputTokens = nums((r) => r.outputTokens).reduce((a, b) => a + b, 0);
    out.push({
      window,
      requests: rs.length,
      completed: ok.length,
      failed: rs.length - ok.length,
      requestsPerS: ok.length / (durationMs / 1000),
      outputTokensPerS: outputTokens / (durationMs / 1000),
      inputTokens: percentiles(nums((r) => r.inputTokens)),
      outputTokens: percentiles(nums((r) => r.outputTokens)),
      ttftMs: percentiles(nums((r) => r.ttftMs)),
      queueMs: percentiles(nums((r) => r.queueMs)),
      prefillMs: percentiles(nums((r) => r.prefillMs)),
      tpotMs: percentiles(nums((r) => r.tpotMs)),
      e2eMs: percentiles(nums((r) => r.e2eMs)),
      errors: [...new Set(rs.filter((r) => r.error !== null).map((r) => r.error!))].slice(0, 5),
    });
  }
  return out;
}

async function main(): Promise<void> {
  if (args['serve-child']) return serveChild();

  const scenarios = new Set(args.scenarios!.split(',').map((s) => s.trim()).filter(Boolean));
  for (const s of scenarios) {
    if (s !== 'mixed' && s !== 'tiers' && s !== 'tenants' && s !== 'hostile') throw new Error(`--scenarios: unknown scenario "${s}" (mixed, tiers, tenants, hostile)`);
  }
  const num = (name: string, min: number) => {
    const v = Number((args as Record<string, unknown>)[name]);
    if (!(v >= min)) throw new Error(`--${name} must be a number >= ${min}`);
    return v;
  };
  const seed = num('seed', 0);
  const rates = args.rate!.split(',').map(Number);
  if (!rates.every((r) => r > 0)) throw new Error('--rate must be one or more positive numbers (comma-separated)');
  const duration = num('duration', Number.MIN_VALUE);
  const mix = parseMix(args.mix!);
  const promptWords = parseRange(args['prompt-words']!, 'prompt-words');
  const outputTokens = parseRange(args['output-tokens']!, 'output-tokens');
  const tierRate = num('tier-rate', Number.MIN_VALUE);
  const tierDuration = num('tier-duration', Number.MIN_VALUE);
  const tierPromptWords = parseRange(args['tier-prompt-words']!, 'tier-prompt-words');
  const tierOutputTokens = parseRange(args['tier-output-tokens']!, 'tier-output-tokens');
  const backlog = num('backlog', 1);
  const backlogPromptWords = parseRange(args['backlog-prompt-words']!, 'backlog-prompt-words');
  const backlogOutputTokens = parseRange(args['backlog-output-tokens']!, 'backlog-output-tokens');
  // auto: until the engine runs --max-num-seqs sequences (the backlog's steady state), at most --settle-max s.
  const settle = args.settle === 'auto' ? 'auto' as const : num('settle', 0);
  const settleMax = num('settle-max', 0);
  const pollMs = num('poll-ms', 1);
  const drainTimeout = num('drain-timeout', 1);
  const backend = args.backend === 'cuda' ? 'cuda' : 'cpu';
  const byBackend = backend === 'cuda' ? { seqs: '256', tokens: '8192', kv: '0' } : { seqs: '64', tokens: '512', kv: '256' };
  args['max-num-seqs'] ??= byBackend.seqs;
  args['max-batched-tokens'] ??= byBackend.tokens;
  args['kv-cache-mib'] ??= byBackend.kv;
  const maxNumSeqs = num('max-num-seqs', 1);
  const maxBatchedTokens = num('max-batched-tokens', 1);
  const kvCacheMiB = num('kv-cache-mib', backend === 'cuda' ? 0 : 1);

  const modelDir = args.model ? resolve(args.model) : await ensureBenchModel(args.preset!, args.dtype as 'f32' | 'f16' | 'bf16');
  const modelId = args.model ? 'model' : args.preset!;
  const loadBefore = os.loadavg();
  const startedAt = performance.now();

  const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-bench-serve-'));
  const proc = fork(fileURLToPath(import.meta.url), [
    '--serve-child', '--model', modelDir, '--model-id', modelId, '--data-dir', dataDir,
    '--max-num-seqs', String(maxNumSeqs), '--max-batched-tokens', String(maxBatchedTokens), '--kv-cache-mib', String(kvCacheMiB),
    '--backend', backend,
    ...(args.threads !== undefined ? ['--threads', args.threads] : []),
  ], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const server = new ServeChild(proc);
  try {
    const ready = await server.next('ready');
    const headers = { authorization: `Bearer ${ready.key}`, 'content-type': 'application/json' };
    const client = new Client(ready.address, headers, ready.model, pollMs);
    const info = ready.engineInfo as { architecture?: string; weightDtype?: string; simd?: string; numThreads?: number; maxNumSeqs?: number; maxBatchedTokens?: number; kvCacheBytes?: number; numBlocks?: number; blockSize?: number };
    process.stderr.write(`server at ${ready.address} (pid ${proc.pid}), model ${ready.model}, ${info.numThreads} threads, ` +
      `${info.maxNumSeqs} seqs, ${info.maxBatchedTokens} tokens/step, KV ${info.numBlocks} blocks of ${info.blockSize}` +
      `${ready.instrumented ? '' : ' (step instrumentation unavailable)'}\n`);

    // Warm-up, not counted: one request per window (flex waited for).
    const warm = planRequests({ seed: seed + 999, count: 3, mix: { asap: 1, standard: 0, flex: 0 }, promptWords, outputTokens });
    await client.runOpenLoop(warm.map((r, i) => ({ ...r, window: WINDOWS[i]! })), drainTimeout);

    const fmt = (x: number | null, digits = 1) => (x === null || !Number.isFinite(x) ? '-' : x.toFixed(digits));
    const header = '| phase | window | done / sent | req/s | out tok/s | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | e2e p50 / p90 / p99 ms |';
    const rule = '|-------|--------|------------:|------:|----------:|------------------------:|------------------------:|-----------------------:|';
    const rows: string[] = [];
    const addRows = (phase: string, stats: WindowStats[]) => {
      const p3 = (p: ReturnType<typeof percentiles>, d = 1) => `${fmt(p.p50, d)} / ${fmt(p.p90, d)} / ${fmt(p.p99, d)}`;
      for (const s of stats) {
        rows.push(`| ${phase} | ${s.window} | ${s.completed} / ${s.requests} | ${fmt(s.requestsPerS, 2)} | ${fmt(s.outputTokensPerS, 0)} | ` +
          `${p3(s.ttftMs)} | ${p3(s.tpotMs, 2)} | ${p3(s.e2eMs, 0)} |`);
      }
    };
    const notes: string[] = [];

    // ---- mixed: one run per rate
    const mixed: Array<Record<string, unknown>> = [];
    for (const rate of scenarios.has('mixed') ? rates : []) {
      const plan = planRequests({ seed, rate, seconds: duration, mix, promptWords, outputTokens });
      process.stderr.write(`mixed: ${plan.length} requests, Poisson at ${rate} req/s for ${duration} s ` +
        `(${WINDOWS.map((w) => `${w} ${plan.filter((r) => r.window === w).length}`).join(', ')}), then drain...\n`);
      const { value: run, steps } = await server.traced(() => client.runOpenLoop(plan, drainTimeout));
      const stats = windowStats(run.records, run.durationMs);
      const all = windowStats(run.records.map((r) => ({ ...r, window: 'asap' as Window })), run.durationMs)[0]!;
      addRows(`mixed @ ${rate}/s`, stats);
      const failed = run.records.filter((r) => !TERMINAL_OK.has(r.status));
      if (failed.length) notes.push(`mixed @ ${rate}/s: ${failed.length} requests failed: ${[...new Set(failed.map((r) => r.error))].slice(0, 3).join(' | ')}`);
      notes.push(`mixed @ ${rate}/s: ${plan.length} sent, total ${all.requestsPerS.toFixed(2)} req/s, ${all.outputTokensPerS.toFixed(0)} output tok/s ` +
        `over ${(run.durationMs / 1000).toFixed(1)} s (sending ${duration} s, then the drain); engine busy ${(100 * steps.busyFraction).toFixed(0)}%, ` +
        `${steps.steps} steps, p50 / p99 ${fmt(steps.stepMs.p50, 1)} / ${fmt(steps.stepMs.p99, 1)} ms, rows/step mean ${fmt(steps.rowsPerStep.mean, 1)}; ` +
        `preemptions ${JSON.stringify(steps.preemptions)}`);
      mixed.push({
        settings: { rate, durationS: duration, seed, mix, promptWords, maxOutputTokens: outputTokens, temperature: 0, pollMs },
        requests: plan.length,
        durationS: run.durationMs / 1000,
        maxLateSendMs: run.lateSendMs,
        total: { completed: all.completed, failed: all.failed, requestsPerS: all.requestsPerS, outputTokensPerS: all.outputTokensPerS },
        windows: stats,
        engineSteps: steps,
      });
    }

    // ---- tiers
    let tiers: Record<string, unknown> | null = null;
    if (scenarios.has('tiers')) {
      const asapOnly = { asap: 1, standard: 0, flex: 0 };
      const stream = planRequests({ seed: seed + 1, rate: tierRate, seconds: tierDuration, mix: asapOnly, promptWords: tierPromptWords, outputTokens: tierOutputTokens });

      process.stderr.write(`tiers (a) idle: ${stream.length} asap requests, Poisson at ${tierRate} req/s for ${tierDuration} s...\n`);
      const idle = await server.traced(() => client.runOpenLoop(stream, drainTimeout));
      const idleStats = windowStats(idle.value.records, idle.value.durationMs);

      const backlogPlan = planRequests({
        seed: seed + 2, count: backlog, mix: { asap: 0, standard: 0, flex: 1 }, promptWords: backlogPromptWords, outputTokens: backlogOutputTokens,
      });
      process.stderr.write(`tiers (b) load: submitting ${backlog} background flex requests (max_output_tokens ${backlogOutputTokens.join('-')}), ` +
        `${settle === 'auto' ? `until ${maxNumSeqs} run (at most ${settleMax} s)` : `${settle} s`} to settle, then the same asap stream...\n`);
      const loaded = await server.traced(async () => {
        const submitStart = performance.now();
        const ids: string[] = [];
        await pool(backlogPlan, 16, async (r) => {
          ids.push(await client.submitBackground(r));
        });
        const submitMs = performance.now() - submitStart;
        const settleStart = performance.now();
        if (settle === 'auto') {
          while (performance.now() - settleStart < settleMax * 1000) {
            const st = await server.engineState();
            if (st.running === null || st.running >= maxNumSeqs || st.waiting === 0) break;
            await sleep(250);
          }
        } else {
          await sleep(settle * 1000);
        }
        const settleMs = performance.now() - settleStart;
        const atStart = await server.engineState();
        const run = await client.runOpenLoop(stream, drainTimeout);
        const atEnd = await server.engineState();
        // Which flex requests finished by the end of the phase (one GET each, then cancel the rest).
        const statuses = new Map<string, number>();
        const unfinished: string[] = [];
        let flexOutputTokens = 0;
        await pool(ids, 32, async (id) => {
          const obj = await client.get(id);
          statuses.set(obj.status, (statuses.get(obj.status) ?? 0) + 1);
          if (obj.status === 'in_progress') unfinished.push(id);
          else flexOutputTokens += obj.usage?.output_tokens ?? 0;
        });
        return { run, ids, submitMs, settleMs, atStart, atEnd, statuses, unfinished, flexOutputTokens };
      });
      const l = loaded.value;
      const cancelStart = performance.now();
      const cancelled = new Map<string, number>();
      await pool(l.unfinished, 32, async (id) => {
        const status = await client.cancel(id);
        cancelled.set(status, (cancelled.get(status) ?? 0) + 1);
      });
      const cancelMs = performance.now() - cancelStart;
      await sleep(200);
      const afterCancel = await server.engineState();
      const loadStats = windowStats(l.run.records, l.run.durationMs);
      addRows('tiers: idle', idleStats);
      addRows('tiers: under flex backlog', loadStats);

      const idleAsap = idleStats.find((s) => s.window === 'asap');
      const loadAsap = loadStats.find((s) => s.window === 'asap');
      const idleP50 = idleAsap?.ttftMs.p50 ?? null;
      const loadP50 = loadAsap?.ttftMs.p50 ?? null;
      const ratio = idleP50 !== null && loadP50 !== null && idleP50 > 0 ? loadP50 / idleP50 : null;
      const finishedFlex = [...l.statuses].filter(([s]) => s !== 'in_progress').reduce((a, [, n]) => a + n, 0);
      const phaseS = (l.submitMs + l.settleMs + l.run.durationMs) / 1000;
      tiers = {
        settings: {
          seed, asapRate: tierRate, durationS: tierDuration, asapPromptWords: tierPromptWords, asapMaxOutputTokens: tierOutputTokens,
          backlog, backlogPromptWords, backlogMaxOutputTokens: backlogOutputTokens, settle, settleMaxS: settleMax, temperature: 0,
        },
        idle: { durationS: idle.value.durationMs / 1000, windows: idleStats, engineSteps: idle.steps },
        load: {
          durationS: l.run.durationMs / 1000,
          backlogSubmitS: l.submitMs / 1000,
          settleS: l.settleMs / 1000,
          windows: loadStats,
          engineSteps: loaded.steps,
          engineAtStreamStart: l.atStart,
          engineAtStreamEnd: l.atEnd,
          flexFinishedDuringPhase: finishedFlex,
          flexOutputTokensFinished: l.flexOutputTokens,
          flexStatusesAtPhaseEnd: Object.fromEntries(l.statuses),
          backlogOutlastedPhase: l.unfinished.length > 0,
          cancelled: Object.fromEntries(cancelled),
          cancelS: cancelMs / 1000,
          engineAfterCancel: afterCancel,
        },
        asapTtftP50IdleMs: idleP50,
        asapTtftP50LoadMs: loadP50,
        ratio,
        target: { target: 'asap TTFT p50 under a flex backlog <= 1.5 x idle', value: ratio, met: ratio !== null && ratio <= 1.5 },
      };
      notes.push(`tiers: asap TTFT p50 idle ${fmt(idleP50, 2)} ms (queue ${fmt(idleAsap?.queueMs.p50 ?? null, 2)} + prefill ${fmt(idleAsap?.prefillMs.p50 ?? null, 2)}), ` +
        `under the flex backlog ${fmt(loadP50, 2)} ms (queue ${fmt(loadAsap?.queueMs.p50 ?? null, 2)} + prefill ${fmt(loadAsap?.prefillMs.p50 ?? null, 2)}); ` +
        `ratio ${fmt(ratio, 2)} (target <= 1.5: ${ratio !== null && ratio <= 1.5 ? 'met' : 'NOT met'})`);
      notes.push(`tiers: engine steps idle ${idle.steps.steps} (busy ${(100 * idle.steps.busyFraction).toFixed(0)}%, step p50 ${fmt(idle.steps.stepMs.p50, 2)} ms), ` +
        `under load ${loaded.steps.steps} (busy ${(100 * loaded.steps.busyFraction).toFixed(0)}%, step p50 / p90 / p99 ${fmt(loaded.steps.stepMs.p50, 1)} / ` +
        `${fmt(loaded.steps.stepMs.p90, 1)} / ${fmt(loaded.steps.stepMs.p99, 1)} ms, tokens/step p50 ${fmt(loaded.steps.tokensPerStep.p50, 0)}, ` +
        `rows/step p50 ${fmt(loaded.steps.rowsPerStep.p50, 0)}; preemptions ${JSON.stringify(loaded.steps.preemptions)})`);
      const a = loaded.steps.asapSteps;
      notes.push(`tiers: under load, the ${a.steps} steps that carried asap rows took p50 / p90 ${fmt(a.stepMs.p50, 1)} / ${fmt(a.stepMs.p90, 1)} ms ` +
        `and carried p50 ${fmt(a.otherTokensPerStep.p50, 0)} other tokens in ${fmt(a.otherRowsPerStep.p50, 0)} other rows ` +
        `(idle: ${idle.steps.asapSteps.steps} steps, p50 ${fmt(idle.steps.asapSteps.stepMs.p50, 2)} ms, ${fmt(idle.steps.asapSteps.tokensPerStep.p50, 0)} tokens)`);
      notes.push(`tiers: ${finishedFlex} of ${backlog} flex requests finished during the ${phaseS.toFixed(1)} s loaded phase ` +
        `(submit ${(l.submitMs / 1000).toFixed(1)} s + settle ${(l.settleMs / 1000).toFixed(1)} s + asap stream ${(l.run.durationMs / 1000).toFixed(1)} s; ` +
        `${l.flexOutputTokens} output tokens in the finished ones; flex sampled ${loaded.steps.samplesByWindow['flex']} tokens and computed ` +
        `${loaded.steps.tokensByWindow['flex']} in the phase); backlog ${l.unfinished.length > 0 ? 'outlasted' : 'did NOT outlast'} the phase ` +
        `(engine at stream start: ${l.atStart.running} running / ${l.atStart.waiting} waiting); cancelled ${l.unfinished.length} ` +
        `in ${(cancelMs / 1000).toFixed(1)} s (${JSON.stringify(Object.fromEntries(cancelled))}); engine after: ${afterCancel.running} running / ${afterCancel.waiting} waiting`);
      if (afterCancel.running !== 0 || afterCancel.waiting !== 0) notes.push('tiers: WARNING: the engine did not end idle after the cancels');
    }

    // ---- tenants
    let tenants: Record<string, unknown> | null = null;
    if (scenarios.has('tenants')) {
      const clientB = new Client(ready.address, { authorization: `Bearer ${ready.keyB}`, 'content-type': 'application/json' }, ready.model, pollMs);
      const stream = planRequests({
        seed: seed + 1, rate: tierRate, seconds: tierDuration, mix: { asap: 1, standard: 0, flex: 0 }, promptWords: tierPromptWords, outputTokens: tierOutputTokens,
      });
      const flood = planRequests({
        seed: seed + 3, count: num('flood', 1), mix: { asap: 1, standard: 0, flex: 0 },
        promptWords: parseRange(args['flood-prompt-words']!, 'flood-prompt-words'), outputTokens: parseRange(args['flood-output-tokens']!, 'flood-output-tokens'),
      }).map((r) => ({ ...r, background: true }));
      const t = await runTenantsScenario({ server, clientA: client, clientB, stream, flood, drainTimeout, maxNumSeqs, settleMax, fmt });
      addRows('tenants: A idle', t.idleStats);
      addRows('tenants: A under B\'s flood', t.loadStats);
      notes.push(...t.notes);
      tenants = t.result;
    }

    // ---- hostile
    let hostile: Record<string, unknown> | null = null;
    if (scenarios.has('hostile')) {
      const clientB = new Client(ready.address, { authorization: `Bearer ${ready.keyB}`, 'content-type': 'application/json' }, ready.model, pollMs);
      const stream = planRequests({
        seed: seed + 5, rate: tierRate, seconds: tierDuration, mix: { asap: 1, standard: 0, flex: 0 }, promptWords: tierPromptWords, outputTokens: tierOutputTokens,
      });
      const h = await runHostileScenario({ server, serverPid: server.proc.pid, clientA: client, clientB, stream, rate: num('hostile-rate', Number.MIN_VALUE), drainTimeout, fmt });
      addRows('hostile: A idle', h.idleStats);
      addRows('hostile: A under B\'s schemas', h.loadStats);
      notes.push(...h.notes);
      hostile = h.result;
    }

    const finalState = await server.engineState();
    server.send({ cmd: 'quit' });
    await server.exited.catch(() => {});
    const loadAfter = os.loadavg();
    const cpus = os.cpus();

    console.log(`model ${modelId} (${info.architecture}, ${info.weightDtype}), backend ${backend} ${info.simd ?? ''} x${info.numThreads} threads; ` +
      `max ${info.maxNumSeqs} seqs, ${info.maxBatchedTokens} tokens/step, KV ${((info.kvCacheBytes ?? 0) / 2 ** 20).toFixed(0)} MiB (${info.numBlocks} blocks of ${info.blockSize}); ` +
      `${cpus[0]?.model} x${cpus.length}, node ${process.version}; load average before ${loadBefore[0]!.toFixed(2)}, after ${loadAfter[0]!.toFixed(2)}`);
    if (mixed.length) {
      console.log(`mixed: Poisson at ${rates.join(', ')} req/s for ${duration} s each, mix ${WINDOWS.map((w) => `${w}=${mix[w].toFixed(2)}`).join(',')}, ` +
        `prompts ${promptWords.join('-')} words, max_output_tokens ${outputTokens.join('-')}, temperature 0, seed ${seed}`);
    }
    console.log('TTFT = queue + prefill from server-timing (foreground only; flex is background: no TTFT/TPOT); e2e client-measured, flex to the poll that saw it end');
    console.log('');
    console.log(header);
    console.log(rule);
    for (const r of rows) console.log(r);
    console.log('');
    for (const n of notes) console.log(n);

    const result = {
      bench: 'serve',
      date: new Date().toISOString(),
      machine: {
        ...machineInfo(),
        loadAverage1mBefore: loadBefore[0], loadAverage1mAfter: loadAfter[0],
      },
      model: { preset: args.model ? null : args.preset, dir: modelDir, id: modelId, ...ready.engineInfo },
      settings: {
        scenarios: [...scenarios], seed, backend,
        threads: args.threads === undefined ? 'serve default (all CPUs but one)' : Number(args.threads),
        maxNumSeqs, maxBatchedTokens, kvCacheBytes: info.kvCacheBytes ?? kvCacheMiB * 1024 * 1024, pollMs, drainTimeoutS: drainTimeout,
        loadGenerator: 'open-loop Poisson arrivals (seeded) from the parent process with fetch; the server (openService) in a child process',
        metrics: 'TTFT = queue + prefill (server-timing, foreground); TPOT = decode / (output_tokens - 1); e2e client-measured; ' +
          'throughput = completed / (first send .. last completion); flex: background + polling, TTFT/TPOT null; percentiles nearest-rank',
        stepInstrumentation: ready.instrumented,
      },
      mixed: mixed.length ? mixed : null,
      tiers,
      tenants,
      hostile,
      engineAtEnd: finalState,
      benchSeconds: (performance.now() - startedAt) / 1000,
    };
    mkdirSync(dirname(resolve(args.out!)), { recursive: true });
    writeFileSync(resolve(args.out!), JSON.stringify(result, null, 2) + '\n');
    await chartsBesideResult(resolve(args.out!));
    console.log(`\nwrote ${args.out} (${((performance.now() - startedAt) / 1000).toFixed(0)} s)`);
  } finally {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err instanceof Error ? err.stack ?? err.message : err);
  process.exit(1);
});
