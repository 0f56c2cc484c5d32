// The dashboard's plots of the last minutes: a bounded in-memory ring of samples, one every
// `intervalMs` (default 5 s), the newest `capacity` kept (default 180: 15 minutes). A sample holds
// what the engines did during its interval, counted from their own reports (Engine.observe), and
// the queues at its end, read from their schedulers:
//   - output tokens: tokens sampled, per step, as they are generated (so a long generation shows
//     while it runs, not all at its end as the token counters of /metrics do);
//   - requests: generations that ended (finished, cancelled or failed; each choice of an n-choice
//     request; foreground, background and batch lines alike);
//   - running / waiting: sequences holding KV blocks / queued for admission, over every model and
//     completion window.
//
// Ownership: one history per service, made, started and stopped with the app that serves the
// dashboard (api/dashboard-route.ts), so two services in one process keep their own, and each
// replica of a cluster its own. It names no organization (only sums over all of them, as the
// dashboard's throughput already shows) and leaves the process only through GET /dashboard/data,
// behind the dashboard's admin key. Nothing is stored: a restart begins an empty history.

import type { Engine } from '../engine/engine.js';
import { SluiceError } from '../errors.js';

export interface HistorySample {
  /** The end of the interval, ISO 8601. */
  time: string;
  /** The interval's length, seconds. */
  seconds: number;
  /** Tokens the engines sampled in the interval. */
  output_tokens: number;
  output_tokens_per_s: number;
  /** Generations that ended in the interval. */
  requests: number;
  requests_per_s: number;
  /** At the end of the interval, over every model and window. */
  running: number;
  waiting: number;
}

export interface HistoryOptions {
  /** Milliseconds between samples: 10..3,600,000, default 5,000. */
  intervalMs?: number;
  /** Samples kept (the oldest dropped first): 1..100,000, default 180. */
  capacity?: number;
}

export const DEFAULT_HISTORY_INTERVAL_MS = 5_000;
export const DEFAULT_HISTORY_CAPACITY = 180;

type EngineLike = Pick<Engine, 'observe' | 'schedulerStats'>;

function checkInteger(value: number, min: number, max: number, param: string): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new SluiceError('invalid_argument', `${param} must be an integer in ${min}..${max}, got ${value}`, { param });
  }
  return value;
}

export class DashboardHistory {
  readonly intervalMs: number;
  readonly capacity: number;
  // A ring: `ring[(first + i) % capacity]` is the i-th oldest of `size` samples.
  private readonly ring: HistorySample[] = [];
  private first = 0;
  private engines = new Set<EngineLike>();
  private readonly unsubscribe: (() => void)[] = [];
  private timer: NodeJS.Timeout | undefined;
  // The interval being counted: since `sinceMs` (the monotonic clock).
  private sinceMs: number;
  private outputTokens = 0;
  private requests = 0;

  /** `now`: a monotonic milliseconds clock; `wallNow`: Unix milliseconds (tests inject both). */
  constructor(opts: HistoryOptions = {}, private readonly now: () => number = () => performance.now(),
    private readonly wallNow: () => number = () => Date.now()) {
    this.intervalMs = checkInteger(opts.intervalMs ?? DEFAULT_HISTORY_INTERVAL_MS, 10, 3_600_000, 'intervalMs');
    this.capacity = checkInteger(opts.capacity ?? DEFAULT_HISTORY_CAPACITY, 1, 100_000, 'capacity');
    this.sinceMs = now();
  }

  /** Counts the engines of `models` (each once: ids that share a checkpoint share an engine). `timer`: sample every intervalMs. */
  watch(models: { models: readonly { engine: EngineLike }[] }, timer = true): void {
    for (const { engine } of models.models) {
      if (this.engines.has(engine)) continue;
      this.engines.add(engine);
      this.unsubscribe.push(engine.observe({
        onStep: (report) => { this.outputTokens += report.numSampledTokens; },
        onRequestEnd: () => { this.requests += 1; },
      }));
    }
    if (timer && this.timer === undefined) {
      this.sinceMs = this.now();
      this.timer = setInterval(() => this.tick(), this.intervalMs);
      this.timer.unref();
    }
  }

  /** Stops sampling and counting; the samples stay readable. Safe to call twice. */
  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    for (const off of this.unsubscribe.splice(0)) off();
    this.engines = new Set();
  }

  /** Closes the current interval as a sample (the timer calls it) and begins the next. */
  tick(): void {
    const nowMs = this.now();
    // To the millisecond; the rates are of this rounded value, so a reader can check one against the other.
    const seconds = Math.round(Math.max(nowMs - this.sinceMs, 0)) / 1000;
    let running = 0;
    let waiting = 0;
    for (const engine of this.engines) {
      const stats = engine.schedulerStats();
      running += stats.numRunning;
      waiting += stats.numWaiting;
    }
    const rate = (n: number) => (seconds > 0 ? Math.round((n / seconds) * 100) / 100 : 0);
    this.push({
      time: new Date(this.wallNow()).toISOString(),
      seconds,
      output_tokens: this.outputTokens, output_tokens_per_s: rate(this.outputTokens),
      requests: this.requests, requests_per_s: rate(this.requests),
      running, waiting,
    });
    this.sinceMs = nowMs;
    this.outputTokens = 0;
    this.requests = 0;
  }

  /** The samples, oldest first (copies: a reader cannot change the ring). */
  samples(): HistorySample[] {
    const out: HistorySample[] = [];
    for (let i = 0; i < this.ring.length; i++) out.push({ ...this.ring[(this.first + i) % this.ring.length]! });
    return out;
  }

  private push(sample: HistorySample): void {
    if (this.ring.length < this.capacity) {
      this.ring.push(sample);
      return;
    }
    this.ring[this.first] = sample;
    this.first = (this.first + 1) % this.capacity;
  }
}
