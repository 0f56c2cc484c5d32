// Background responses (background=true): stored in_progress with their job, run through the
// scheduler after the HTTP reply, and finished exactly once: completed / incomplete, failed (an
// error, or `timeout` when the window's deadline passes), or cancelled (POST .../cancel).
//
// Leases (store/leases.ts): every job is leased to the replica running it. start() stores the job
// leased to this process and runs it; a keeper renews this process's leases every ttl/3 (one UPDATE
// per table, in-progress idempotency keys included) and stops, WITHOUT storing anything, a run
// whose job it no longer holds (cancelled on another replica, or taken over after the lease ran
// out while this process stalled). The same tick claims jobs whose lease is free or expired (a
// dead replica's, or those handed back), asap before standard before flex, while this process
// runs fewer than maxRuns; a draining process claims nothing new and finishes what it runs. Every
// end is fenced: it is written only while this process still holds the job (RequestEndCommit
// backgroundLeaseLost otherwise), so a job is finished in one place, once.
//
// Restarts lose nothing: the job row (the GenerationRequest) lives until the response is terminal.
// On shutdown running work is aborted WITHOUT storing an outcome and its leases are handed back, so
// another replica (or the next start) takes it at once, from the beginning: the KV of a stopped
// process is gone. A process killed without a shutdown leaves its leases to expire (ttl). With
// SQLite (a store one process owns), the leases the previous process left are released at start.
// A claimed job past its deadline fails with `timeout`; one whose request no longer prepares (its
// model left the catalog) fails with that error.
//
// A run's end is one write (request-end.ts): the terminal response, the deletion of its job, its
// ledger row when it ended with a result, and its completion webhook delivery. A run whose end
// cannot be written stays in_progress with its job (and unbilled); the next renewal hands its
// lease back, and it runs again (here or on another replica). The job's stored request is the only place besides the pending delivery that holds
// metadata.webhook_token; it goes with the job.

import { leaseConfig, leaseTerm, type LeaseConfig } from '../store/leases.js';
import type { FastifyBaseLogger } from 'fastify';
import { isSluiceError, SluiceError } from '../errors.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { GenerationRequest, PreparedGeneration } from '../serving/generation-request.js';
import type { GenerationService } from '../serving/generation-service.js';
import type { BackgroundJob, ResponseBody, Store, UsageRecord } from '../store/store.js';
import type { ModelRegistry } from '../serving/model-registry.js';
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
/** Its job is gone or leased to another replica: nothing is stored (the fence would refuse it anyway). */
const LEASE_LOST = Symbol('lease lost');

interface Running {
  orgId: string;
  controller: AbortController;
  timer: NodeJS.Timeout | undefined;
  done: Promise<void>;
  /** Until when (Unix ms) this process's last write of the job's lease holds it. */
  leaseUntilMs: number;
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
  /** True while the process drains before shutting down: no job is claimed, runs go on. */
  draining?: () => boolean;
  /**
   * Claims stop while this process runs this many background responses (default: maxRunsFor the
   * registry, twice the largest engine's max_num_seqs). Responses created here always run here.
   */
  maxRuns?: number;
}

/**
 * Background runs a process claims up to: twice the largest engine's max_num_seqs, so that its
 * engines stay full (half the runs decode while the other half wait their turn in the scheduler)
 * without holding much more work than they can start, which other replicas could run sooner.
 */
export function maxRunsFor(registry: ModelRegistry): number {
  return 2 * Math.max(1, ...registry.models.map((m) => m.engine.info.maxNumSeqs));
}

export class BackgroundResponses {
  private readonly running = new Map<string, Running>();
  /** Jobs this process holds but does not run yet: being stored (start) or taken over (claim). */
  private readonly pending = new Set<string>();
  private closed = false;
  private readonly lease: LeaseConfig;
  private readonly maxRuns: number;
  /** The keeper: renews leases and claims jobs every ttl/3 (started by recover()). */
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;

  constructor(private readonly opts: BackgroundOptions) {
    this.lease = opts.lease ?? leaseConfig();
    this.maxRuns = opts.maxRuns ?? maxRunsFor(opts.service.registry);
  }

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

  /** Stores the in_progress response with its job, leased to this process, and starts it. */
  async start(orgId: string, running: ResponseBody, prepared: PreparedGeneration): Promise<void> {
    const createdAt = running['created_at'] as number;
    const deadlineAt = this.deadlineFor(prepared.window, createdAt);
    const term = leaseTerm(this.lease);
    this.pending.add(running.id);
    try {
      await this.opts.store.insertBackgroundResponse(running, {
        responseId: running.id,
        orgId,
        deadlineAt,
        request: prepared.request as unknown as Record<string, unknown>,
        createdAt,
        window: prepared.window,
      }, term);
      this.launch(orgId, running, prepared, deadlineAt, term.untilMs);
    } finally {
      this.pending.delete(running.id);
    }
  }

  /**
   * Cancels an in_progress background response of this organization wherever it runs, and returns
   * the stored response after the attempt (undefined: no such response). Running here: its run is
   * stopped and stores the cancelled response. Elsewhere (another replica, or a dead one): the store
   * cancels it in one transaction (response, job, webhook delivery); the replica running it stops at
   * its next renewal without writing. A response that ended meanwhile is returned as it ended.
   */
  async cancel(orgId: string, id: string): Promise<ResponseBody | undefined> {
    const run = this.running.get(id);
    if (run?.orgId === orgId) {
      run.controller.abort(CANCELLED);
      await run.done;
    }
    const stored = await this.opts.store.getResponse(orgId, id);
    if (stored?.status !== 'in_progress') return stored;
    // Not here, or this run's end was refused (it lost its lease meanwhile): cancel it in the store.
    const job = await this.opts.store.getBackgroundJob(orgId, id);
    if (!job) return this.opts.store.getResponse(orgId, id);
    const cancelled = cancelledResponse(stored);
    const delivery = this.opts.webhooks?.deliveryFor(orgId, (job.request as { metadata?: unknown }).metadata, cancelled);
    if (!(await this.opts.store.cancelBackgroundResponse(orgId, cancelled, delivery))) return this.opts.store.getResponse(orgId, id);
    if (delivery) this.opts.webhooks?.wake();
    return cancelled;
  }

  /**
   * When the app is ready: with a store this process owns alone (SQLite), hands back the leases the
   * previous process left; then claims at once what is free (work left by a previous process or a
   * dead replica), and starts the keeper that renews and claims every ttl/3.
   */
  async recover(): Promise<void> {
    if (this.closed) return;
    if (!this.opts.store.shared) await this.opts.store.releaseAllLeases();
    await this.tick();
    if (this.closed) return;
    this.timer = setInterval(() => void this.tick(), Math.max(1, Math.floor(this.lease.ttlMs / 3)));
    this.timer.unref();
  }

  /**
   * Stops the keeper, then every run without storing an outcome, then hands this process's leases
   * back so that another replica (or the next start) takes the work at once. Waits for the store
   * at most a lease's length at each step: an unreachable database must not hold the shutdown, and
   * the leases expire by then anyway.
   */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    if (this.ticking) await settledWithin(this.ticking, this.lease.ttlMs);
    const runs = [...this.running.values()];
    for (const run of runs) run.controller.abort(SHUTDOWN);
    await Promise.all(runs.map((r) => r.done));
    const handedBack = this.opts.store.releaseLeases(this.lease.owner).catch((err: unknown) => {
      this.opts.log.warn({ err }, 'background responses: could not hand back leases at close; they expire on their own');
    });
    await settledWithin(handedBack, this.lease.ttlMs);
  }

  /** One keeper tick: renew, then claim (never two at once). */
  private tick(): Promise<void> {
    if (this.closed) return this.ticking ?? Promise.resolve();
    this.ticking ??= this.renewAndClaim()
      .catch((err: unknown) => { if (!this.closed) this.opts.log.error({ err }, 'background responses: could not renew or claim leases; retrying'); })
      .finally(() => { this.ticking = undefined; });
    return this.ticking;
  }

  private async renewAndClaim(): Promise<void> {
    await this.renew();
    if (!this.closed && !this.opts.draining?.()) await this.claim();
  }

  /**
   * Extends every lease of this process; stops the runs whose job it no longer holds. A run started
   * after the renewal's UPDATE is not judged by it (the snapshot of ids is taken before). A job it
   * holds without running it (its end could not be stored, or taking it over failed) is handed
   * back, so that it runs again (here or elsewhere) instead of staying leased here for good.
   */
  private async renew(): Promise<void> {
    const checked = [...this.running.entries()];
    const term = leaseTerm(this.lease);
    let held: Set<string>;
    try {
      held = new Set(await this.opts.store.renewLeases(term));
    } catch (err) {
      // The store is unreachable: a run whose lease has run out may be taken over; stop it.
      for (const [, run] of checked) if (run.leaseUntilMs <= Date.now()) run.controller.abort(LEASE_LOST);
      throw err;
    }
    for (const [id, run] of checked) {
      if (held.has(id)) run.leaseUntilMs = term.untilMs;
      else run.controller.abort(LEASE_LOST);
    }
    for (const id of held) {
      if (!this.running.has(id) && !this.pending.has(id)) await this.opts.store.releaseBackgroundJob(id, this.lease.owner);
    }
  }

  /** Claims free or expired jobs while this process has room, and runs (or ends) each. */
  private async claim(): Promise<void> {
    const room = this.maxRuns - this.running.size;
    if (room <= 0) return;
    const term = leaseTerm(this.lease);
    const jobs = await this.opts.store.claimBackgroundJobs(term, room);
    if (jobs.length === 0) return;
    const counts = { resumed: 0, timed_out: 0, failed: 0 };
    for (const job of jobs) {
      this.pending.add(job.responseId);
      try {
        const outcome = await this.adopt(job, term.untilMs);
        if (outcome) counts[outcome]++;
      } catch (err) {
        // The next renewal hands it back, and it is claimed again (here or elsewhere).
        this.opts.log.error({ err, response_id: job.responseId }, 'background responses: could not take over a job');
      } finally {
        this.pending.delete(job.responseId);
      }
    }
    if (counts.resumed + counts.timed_out + counts.failed > 0) {
      const whose = this.opts.store.shared ? 'taken over from stopped replicas' : 'left by the previous process';
      this.opts.log.info(counts, `background responses ${whose}: ${counts.resumed} resumed, `
        + `${counts.timed_out} past their deadline (failed: timeout), ${counts.failed} no longer valid (failed)`);
    }
  }

  /** Runs a claimed job, or ends it when it is past its deadline or no longer prepares. */
  private async adopt(job: BackgroundJob, leaseUntilMs: number): Promise<'resumed' | 'timed_out' | 'failed' | undefined> {
    const stored = await this.opts.store.getResponse(job.orgId, job.responseId);
    if (!stored) {
      // A job without its response (removed behind the store's back): nothing to run. The fenced
      // end drops the job; the response update it carries finds no row.
      await this.opts.store.commitRequestEnd({
        response: { orgId: job.orgId, body: { id: job.responseId, status: 'failed' }, kind: 'background', leaseOwner: this.lease.owner },
      });
      return undefined;
    }
    if (stored.status !== 'in_progress') {
      await this.opts.store.finishBackgroundResponse(job.orgId, stored); // drop a stale job
      return undefined;
    }
    const metadata = (job.request as { metadata?: unknown }).metadata;
    if (this.closed) return undefined; // close() hands the lease back
    if (nowSeconds() >= job.deadlineAt) {
      return (await this.finish(job.orgId, metadata, failedResponse(stored, 'timeout', timeoutMessage(stored)))) ? 'timed_out' : undefined;
    }
    let prepared: PreparedGeneration;
    try {
      prepared = await this.opts.service.prepare(job.request as unknown as GenerationRequest);
    } catch (err) {
      const code = isSluiceError(err) ? err.code : 'server_error';
      const failed = failedResponse(stored, code, `the request could not be resumed after a restart: ${(err as Error).message}`);
      return (await this.finish(job.orgId, metadata, failed)) ? 'failed' : undefined;
    }
    if (this.closed) return undefined;
    this.launch(job.orgId, stored, prepared, job.deadlineAt, leaseUntilMs);
    return 'resumed';
  }

  private launch(orgId: string, running: ResponseBody, prepared: PreparedGeneration, deadlineAt: number, leaseUntilMs: number): void {
    const controller = new AbortController();
    const delayMs = Math.max(0, deadlineAt * 1000 - Date.now());
    const timer = setTimeout(() => controller.abort(TIMEOUT), delayMs);
    timer.unref();
    const entry: Running = { orgId, controller, timer, done: Promise.resolve(), leaseUntilMs };
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
      if (reason === LEASE_LOST) {
        this.opts.log.info({ response_id: running.id }, 'background response stopped: cancelled or taken over on another replica');
        return;
      }
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
      if (!this.closed) this.opts.log.error({ err, response_id: running.id }, 'could not store a background response; it runs again once its lease is handed back');
    }
  }

  /**
   * The fenced end: `metadata` is the request's, which names the webhook and holds its token.
   * False when this process no longer holds the job (nothing was written).
   */
  private async finish(orgId: string, metadata: unknown, final: ResponseBody, usage?: UsageRecord): Promise<boolean> {
    const committed = await commitRequestEnd(this.opts.store, this.opts.webhooks,
      { response: { orgId, body: final, kind: 'background', leaseOwner: this.lease.owner }, ...(usage && { usage }) },
      { orgId, metadata, body: final });
    if (committed.backgroundLeaseLost) {
      this.opts.log.info({ response_id: final.id }, 'background response not stored: cancelled or taken over on another replica');
      return false;
    }
    return true;
  }
}

/** Resolves once `work` settles or `ms` have passed, whichever comes first; never rejects. */
async function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<void>((resolve) => { timer = setTimeout(resolve, ms); });
  try {
    await Promise.race([work.then(() => {}, () => {}), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function timeoutMessage(running: ResponseBody): string {
  return `the response did not finish within the deadline of its completion window (${String(running['completion_window'])})`;
}

/** Thrown for a cancel that cannot be done; the route renders it. */
export function notCancellable(message: string): SluiceError {
  return new SluiceError('invalid_request', message, { param: 'response_id' });
}
