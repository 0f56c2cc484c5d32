// The periodic engine line, as vLLM prints one: every interval in which an engine was busy (a step
// computed tokens, or sequences run or wait), one info line per engine with its throughput over the interval,
// the sequences running and waiting per completion window, and the KV pool. An idle engine writes
// nothing, so an idle server's log stays quiet.
//
// "prompt" throughput counts the tokens of prefilling rows the engine computed (prompt chunks, and
// recomputation after a preemption; prefix-cache hits are not computed and not counted);
// "generation" throughput counts sampled tokens.

import type { Engine } from '../engine/engine.js';
import type { StepReport } from '../engine/engine-events.js';
import { SluiceError } from '../errors.js';
import type { ModelRegistry } from '../serving/model-registry.js';

/** The pino-compatible subset the line is written with. */
export interface EngineLogSink {
  info(obj: object, msg: string): void;
}

export const DEFAULT_ENGINE_LOG_INTERVAL_MS = 10_000;
export const MIN_ENGINE_LOG_INTERVAL_MS = 10;
export const MAX_ENGINE_LOG_INTERVAL_MS = 3_600_000;

/** What an engine did since the last line. */
interface Interval {
  model: string;
  numSteps: number;
  numPrefillTokens: number;
  numSampledTokens: number;
  /** Speculative decoding: rows that verified drafts, the drafts, and those accepted. */
  numVerifyingRows: number;
  numDraftTokens: number;
  numAcceptedTokens: number;
  sinceMs: number;
}

/** Checks an interval option: 0 (off) or MIN..MAX milliseconds. */
export function checkEngineLogInterval(ms: number, param = 'engineLogIntervalMs'): number {
  if (!Number.isFinite(ms) || (ms !== 0 && (ms < MIN_ENGINE_LOG_INTERVAL_MS || ms > MAX_ENGINE_LOG_INTERVAL_MS))) {
    throw new SluiceError('invalid_argument',
      `${param} must be 0 (off) or ${MIN_ENGINE_LOG_INTERVAL_MS}..${MAX_ENGINE_LOG_INTERVAL_MS} ms, got ${ms}`, { param });
  }
  return ms;
}

export class EngineStatsLog {
  private readonly intervals = new Map<Engine, Interval>();
  private readonly unsubscribe: (() => void)[] = [];
  private timer: NodeJS.Timeout | undefined;

  /** `now`: milliseconds clock (tests inject one). */
  constructor(private readonly log: EngineLogSink, private readonly now: () => number = () => performance.now()) {}

  /** Starts a line every `intervalMs` for each engine of `models` (each engine once, named by its first id). */
  start(models: Pick<ModelRegistry, 'models'>, intervalMs: number): void {
    checkEngineLogInterval(intervalMs);
    if (intervalMs === 0 || this.timer !== undefined) return;
    for (const served of models.models) {
      if (this.intervals.has(served.engine)) continue;
      const interval: Interval = { model: served.id, ...EMPTY, sinceMs: this.now() };
      this.intervals.set(served.engine, interval);
      this.unsubscribe.push(served.engine.observe({ onStep: (report) => count(interval, report) }));
    }
    this.timer = setInterval(() => this.tick(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    for (const off of this.unsubscribe.splice(0)) off();
    this.intervals.clear();
  }

  /** Writes the line of every engine that was busy since the last tick, and starts a new interval. */
  tick(): void {
    const nowMs = this.now();
    for (const [engine, interval] of this.intervals) {
      const stats = engine.schedulerStats();
      const busy = interval.numSteps > 0 || stats.numRunning > 0 || stats.numWaiting > 0;
      if (busy) this.log.info(...engineLine(interval, stats, (nowMs - interval.sinceMs) / 1000));
      Object.assign(interval, { ...EMPTY, sinceMs: nowMs });
    }
  }
}

const EMPTY = { numSteps: 0, numPrefillTokens: 0, numSampledTokens: 0, numVerifyingRows: 0, numDraftTokens: 0, numAcceptedTokens: 0 };

function count(interval: Interval, report: StepReport): void {
  // A step that only frees ended sequences computes nothing: it does not make an interval busy.
  if (report.numRows === 0) return;
  interval.numSteps += 1;
  interval.numPrefillTokens += report.numPrefillTokens;
  interval.numSampledTokens += report.numSampledTokens;
  interval.numDraftTokens += report.numDraftTokens;
  interval.numAcceptedTokens += report.numAcceptedTokens;
  interval.numVerifyingRows += report.numVerifyingRows;
}

/** The structured fields and the readable message of one engine's line. */
function engineLine(interval: Interval, stats: ReturnType<Engine['schedulerStats']>, seconds: number): [object, string] {
  const perSecond = (n: number) => (seconds > 0 ? Math.round((n / seconds) * 10) / 10 : 0);
  const pool = stats.kvPool;
  const usedBlocks = pool.numTotalBlocks - pool.numFreeBlocks;
  const kvPct = pool.numTotalBlocks === 0 ? 0 : Math.round((usedBlocks / pool.numTotalBlocks) * 1000) / 10;
  const running: Record<string, number> = {};
  const waiting: Record<string, number> = {};
  for (const [window, n] of Object.entries(stats.byWindow)) {
    running[window] = n.numRunning;
    waiting[window] = n.numWaiting;
  }
  const fields = {
    model: interval.model,
    prompt_tokens_per_s: perSecond(interval.numPrefillTokens),
    generation_tokens_per_s: perSecond(interval.numSampledTokens),
    steps: interval.numSteps,
    running, waiting,
    kv_usage_pct: kvPct,
    kv_blocks: { used: usedBlocks, cached: pool.numEvictableBlocks, free: pool.numFreeBlocks - pool.numEvictableBlocks },
    ...(interval.numDraftTokens > 0 && {
      speculative: {
        acceptance: Math.round((interval.numAcceptedTokens / interval.numDraftTokens) * 1000) / 1000,
        // Tokens a verifying row gained on average: its own and the accepted drafts.
        tokens_per_step: Math.round((1 + interval.numAcceptedTokens / interval.numVerifyingRows) * 100) / 100,
      },
    }),
  };
  const perWindow = (counts: Record<string, number>) => Object.entries(counts).map(([w, n]) => `${w} ${n}`).join(', ');
  const msg = `engine ${interval.model}: prompt ${fields.prompt_tokens_per_s} tokens/s, generation ${fields.generation_tokens_per_s} tokens/s, `
    + `running ${stats.numRunning} (${perWindow(running)}), waiting ${stats.numWaiting} (${perWindow(waiting)}), `
    + `KV cache ${kvPct}% used, ${pool.numEvictableBlocks} blocks cached`;
  return [fields, msg];
}
