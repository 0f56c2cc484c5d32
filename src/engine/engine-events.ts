// What an Engine tells its observers: one report per step and one per request that reached the
// scheduler. The service's metrics and its periodic engine log line are built on these; a library
// user can subscribe too (Engine.observe). Observers run on the JS thread between steps, so they
// must be cheap; what one throws is swallowed, never the step's or the request's problem.

import type { StepReport } from '../scheduler/batcher.js';
import type { SchedulingWindow } from '../scheduler/window-policy.js';
import type { FinishReason } from '../text/stops.js';

export type { KvPoolCounts, StepReport } from '../scheduler/batcher.js';

/** One request that reached the scheduler, when it ended. */
export interface RequestReport {
  window: SchedulingWindow;
  /** The tenant it ran as (an organization id; '' for none). */
  tenant: string;
  /** finished: a stop or its token limit; cancelled: its signal fired or its reader left; failed: an error. */
  outcome: 'finished' | 'cancelled' | 'failed';
  /** Why a finished request stopped. */
  finishReason?: FinishReason;
  numPromptTokens: number;
  numGeneratedTokens: number;
  /** Prompt tokens served from the prefix cache. */
  numCachedTokens: number;
  /** Submission -> first scheduled step, ms; undefined when it never ran. */
  queuedMs?: number;
  /** Submission -> first generated token, ms; undefined without a token. */
  firstTokenMs?: number;
  /** First generated token -> last, ms (0 with fewer than two tokens). */
  decodeMs: number;
  /** Submission -> end, ms. */
  e2eMs: number;
}

export interface EngineObserver {
  onStep?(report: StepReport): void;
  onRequestEnd?(report: RequestReport): void;
}

/** An engine's observers; each call reaches every one of them, whatever the others throw. */
export class EngineObservers {
  private readonly observers = new Set<EngineObserver>();

  /** Adds one; returns the function that removes it. */
  add(observer: EngineObserver): () => void {
    this.observers.add(observer);
    return () => { this.observers.delete(observer); };
  }

  step(report: StepReport): void {
    for (const o of this.observers) {
      try {
        o.onStep?.(report);
      } catch {
        // An observer's failure is its own.
      }
    }
  }

  requestEnd(report: RequestReport): void {
    for (const o of this.observers) {
      try {
        o.onRequestEnd?.(report);
      } catch {
        // An observer's failure is its own.
      }
    }
  }
}
