// Background responses (background=true): stored in_progress with their job, run through the
// scheduler after the HTTP reply, and finished exactly once: completed / incomplete, failed (an
// error, or `timeout` when the window's deadline passes), or cancelled (POST .../cancel).
//
// Restarts lose nothing: the job row (the GenerationRequest) lives until the response is terminal.
// On shutdown running work is aborted WITHOUT storing an outcome, so the next start resumes it
// (from the beginning: the KV of a dead process is gone); at start, jobs past their deadline fail
// with `timeout`, and the rest run again. A job whose request no longer prepares (its model left
// the catalog) fails with that error.
//
// A run's end is one write (request-end.ts): the terminal response, the deletion of its job, its
// ledger row when it ended with a result, and its completion webhook delivery. A run whose end
// cannot be written stays in_progress with its job (and unbilled), and runs again at the next
// start. The job's stored request is the only place besides the pending delivery that holds
// metadata.webhook_token; it goes with the job.

import type { LeaseConfig } from '../store/leases.js';
import type { FastifyBaseLogger } from 'fastify';
import { isSluiceError, SluiceError } from '../errors.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { GenerationRequest, PreparedGeneration } from '../serving/generation-request.js';
import type { GenerationService } from '../serving/generation-service.js';
import type { ResponseBody, Store, UsageRecord } from '../store/store.js';
import type { WebhookDispatcher } from '../webhooks/dispatcher.js';
import { cancelledResponse, failedResponse, finishedResponse } from './adapters/responses.js';
import { nowSeconds } from './adapters/content.js';
import { commitRequestEnd } from './request-end.js';
import type { Billing } from '../billing/ledger.js';

/** Seconds a background response may stay in_progress, per completion window. */
export type WindowDeadlines = Record<CompletionWindow, number>;

export const DEFAULT_WINDOW_DEADLINES: WindowDeadlines = { asap: 10 * 60, standard: 60 * 60, flex: 24 * 60 * 60 };

/** Abort reasons: why a run stopped early decides what is stored. */
const SHUTDOWN = Symbol('shutdown');
const TIMEOUT = Symbol('timeout');
const CANCELLED = Symbol('cancelled');

interface Running {
  orgId: string;
  controller: AbortController;
  timer: NodeJS.Timeout | undefined;
  done: Promise<void>;
}

export interface BackgroundOptions {
  store: Store;
  service: GenerationService;
  deadlines: WindowDeadlines;
  log: FastifyBaseLogger;
  /** The usage ledger: a run that ends with a result is billed in the write that stores it. */
  billing?: Billing;
  /** This process's replica id and lease length (default: a new id, DEFAULT_LEASE_TTL_MS). */
  lease?: LeaseConfig;
  /** Completion webhooks: a terminal response's delivery is stored with it (absent: none are sent). */
  webhooks?: WebhookDispatcher;
}

export class BackgroundResponses {
  private readonly running = new Map<string, Running>();
  private closed = false;

  constructor(private readonly opts: BackgroundOptions) {}

  /** Deadline (Unix seconds) of a response created now in this window. */
  deadlineFor(window: CompletionWindow, createdAt: number): number {
    return createdAt + this.opts.deadlines[window];
  }

  /** Background responses of this organization in progress in this process (running or waiting their turn). */
  numInProgress(orgId: string): number {
    let n = 0;
    for (const run of this.running.values()) if (run.orgId === orgId) n++;
    return n;
  }

  /** Stores the in_progress response with its job and starts it. */
  async start(orgId: string, running: ResponseBody, prepared: PreparedGeneration): Promise<void> {
    const createdAt = running['created_at'] as number;
    await this.opts.store.insertBackgroundResponse(running, {
      responseId: running.id,
      orgId,
      deadlineAt: this.deadlineFor(prepared.window, createdAt),
      request: prepared.request as unknown as Record<string, unknown>,
      createdAt,
    });
    this.launch(orgId, running, prepared, this.deadlineFor(prepared.window, createdAt));
  }

  /**
   * Cancels an in_progress background response of this organization and returns the stored
   * result; undefined when this process is not running it (the caller reports why).
   */
  async cancel(orgId: string, id: string): Promise<ResponseBody | undefined> {
    const run = this.running.get(id);
    if (!run) return undefined;
    run.controller.abort(CANCELLED);
    await run.done;
    return this.opts.store.getResponse(orgId, id);
  }

  /** At start: fails jobs past their deadline with timeout and runs the rest again, and logs what it did. */
  async recover(): Promise<void> {
    const counts = { resumed: 0, timed_out: 0, failed: 0 };
    for (const job of await this.opts.store.listBackgroundJobs()) {
      const stored = await this.opts.store.getResponse(job.orgId, job.responseId);
      if (!stored || stored.status !== 'in_progress') {
        if (stored) await this.opts.store.finishBackgroundResponse(job.orgId, stored); // drop a stale job
        continue;
      }
      const metadata = (job.request as { metadata?: unknown }).metadata;
      if (nowSeconds() >= job.deadlineAt) {
        await this.finish(job.orgId, metadata, failedResponse(stored, 'timeout', timeoutMessage(stored)));
        counts.timed_out++;
        continue;
      }
      let prepared: PreparedGeneration;
      try {
        prepared = await this.opts.service.prepare(job.request as unknown as GenerationRequest);
      } catch (err) {
        const code = isSluiceError(err) ? err.code : 'server_error';
        await this.finish(job.orgId, metadata, failedResponse(stored, code, `the request could not be resumed after a restart: ${(err as Error).message}`));
        counts.failed++;
        continue;
      }
      this.launch(job.orgId, stored, prepared, job.deadlineAt);
      counts.resumed++;
    }
    if (counts.resumed + counts.timed_out + counts.failed > 0) {
      this.opts.log.info(counts, `background responses left by the previous process: ${counts.resumed} resumed, `
        + `${counts.timed_out} past their deadline (failed: timeout), ${counts.failed} no longer valid (failed)`);
    }
  }

  /** Stops every run without storing an outcome: they stay in_progress and resume at the next start. */
  async close(): Promise<void> {
    this.closed = true;
    const runs = [...this.running.values()];
    for (const run of runs) run.controller.abort(SHUTDOWN);
    await Promise.all(runs.map((r) => r.done));
  }

  private launch(orgId: string, running: ResponseBody, prepared: PreparedGeneration, deadlineAt: number): void {
    const controller = new AbortController();
    const delayMs = Math.max(0, deadlineAt * 1000 - Date.now());
    const timer = setTimeout(() => controller.abort(TIMEOUT), delayMs);
    timer.unref();
    const entry: Running = { orgId, controller, timer, done: Promise.resolve() };
    this.running.set(running.id, entry);
    entry.done = this.execute(orgId, running, prepared, controller.signal).finally(() => {
      clearTimeout(timer);
      this.running.delete(running.id);
    });
  }

  private async execute(orgId: string, running: ResponseBody, prepared: PreparedGeneration, signal: AbortSignal): Promise<void> {
    let final: ResponseBody;
    let usage: UsageRecord | undefined;
    try {
      const result = await this.opts.service.run(prepared, signal, 'background');
      final = finishedResponse(running, result, prepared, this.opts.service.reasoningSeal);
      usage = this.opts.billing?.usageRecord({ surface: 'responses', requestId: running.id, prepared, results: [result] });
    } catch (err) {
      const reason = signal.reason;
      if (reason === SHUTDOWN || (this.closed && isSluiceError(err) && err.code === 'engine_disposed')) return;
      if (reason === TIMEOUT) final = failedResponse(running, 'timeout', timeoutMessage(running));
      else if (reason === CANCELLED) final = cancelledResponse(running);
      else if (isSluiceError(err) && err.code !== 'engine_error') final = failedResponse(running, err.code, err.message);
      else {
        this.opts.log.error({ err, response_id: running.id }, 'background response failed');
        final = failedResponse(running, 'server_error', 'the engine failed while generating this response');
      }
    }
    try {
      await this.finish(orgId, prepared.request.metadata, final, usage);
    } catch (err) {
      if (!this.closed) this.opts.log.error({ err, response_id: running.id }, 'could not store a background response; it runs again at the next start');
    }
  }

  /** `metadata`: the request's, which names the webhook and holds its token. */
  private async finish(orgId: string, metadata: unknown, final: ResponseBody, usage?: UsageRecord): Promise<void> {
    await commitRequestEnd(this.opts.store, this.opts.webhooks,
      { response: { orgId, body: final, kind: 'background' }, ...(usage && { usage }) },
      { orgId, metadata, body: final });
  }
}

function timeoutMessage(running: ResponseBody): string {
  return `the response did not finish within the deadline of its completion window (${String(running['completion_window'])})`;
}

/** Thrown for a cancel that cannot be done; the route renders it. */
export function notCancellable(message: string): SluiceError {
  return new SluiceError('invalid_request', message, { param: 'response_id' });
}
