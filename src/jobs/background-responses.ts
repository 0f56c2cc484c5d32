// Background responses (background=true): stored in_progress with their job, run through the
// scheduler after the HTTP reply, and finished exactly once: completed / incomplete, failed (an
// error, or `timeout` when the window's deadline passes), or cancelled (POST .../cancel).
//
// Leases (store/leases.ts), kept by the leased queue (jobs/leased-queue.ts): every job is leased
// to the replica running it. start() stores the job leased to this process and runs it; every
// ttl/3 the queue renews this process's leases (one UPDATE per table, in-progress idempotency keys
// included) and stops, WITHOUT storing anything, a run whose job it no longer holds (cancelled on
// another replica, or taken over after the lease ran out while this process stalled). After each
// renewal it claims jobs whose lease is free or expired (a dead replica's, or those handed back),
// asap before standard before flex, while this process runs fewer than maxRuns; a draining process
// claims nothing new and finishes what it runs. Every end is fenced: it is written only while this
// process still holds the job (RequestEndCommit backgroundLeaseLost otherwise), so a job is
// finished in one place, once. Each run goes through the request lifecycle (serving/lifecycle.ts)
// with the Responses surface's rendering (surfaces/responses/surface.ts).
//
// Restarts lose nothing: the job row (the GenerationRequest) lives until the response is terminal.
// On shutdown running work is aborted WITHOUT storing an outcome and its leases are handed back, so
// another replica (or the next start) takes it at once, from the beginning: the KV of a stopped
// process is gone. A process killed without a shutdown leaves its leases to expire (ttl). With
// SQLite (a store one process owns), the leases the previous process left are released at start.
// A claimed job past its deadline fails with `timeout`; one whose request no longer prepares (its
// model left the catalog) fails with that error.
//
// A run's end is one write (the lifecycle's end): the terminal response, the deletion of its job, its
// ledger row when it ended with a result, and its completion webhook delivery. A run whose end
// cannot be written stays in_progress with its job (and unbilled); the next renewal hands its
// lease back, and it runs again (here or on another replica). The job's stored request is the only
// place besides the pending delivery that holds metadata.webhook_token; it goes with the job.

import { leaseConfig, type LeaseConfig, type LeaseTerm } from '../store/leases.js';
import { CLOSED, LEASE_LOST, LeasedQueue, type QueueLog } from './leased-queue.js';
import { isSluiceError } from '../errors.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { GenerationRequest, PreparedGeneration } from '../serving/generation-request.js';
import type { RequestLifecycle } from '../serving/lifecycle.js';
import type { BackgroundJob, ResponseBody, Store } from '../store/store.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import { cancelledResponse, failedResponse } from '../surfaces/responses/adapter.js';
import { responseRendering } from '../surfaces/responses/surface.js';
import { nowSeconds } from '../surfaces/content.js';

/** Seconds a background response may stay in_progress, per completion window. */
export type WindowDeadlines = Record<CompletionWindow, number>;

export const DEFAULT_WINDOW_DEADLINES: WindowDeadlines = { asap: 10 * 60, standard: 60 * 60, flex: 24 * 60 * 60 };

/** Abort reasons besides the queue's (CLOSED, LEASE_LOST): why a run stopped early decides what is stored. */
const TIMEOUT = Symbol('timeout');
const CANCELLED = Symbol('cancelled');

/** A background response this process runs: its job, prepared. */
interface BackgroundRun {
  orgId: string;
  /** The in_progress response as stored. */
  running: ResponseBody;
  prepared: PreparedGeneration;
  /** Unix seconds. */
  deadlineAt: number;
}

export interface BackgroundOptions {
  store: Store;
  /** Each run goes through it: run, usage, the fenced end with its ledger row and webhook delivery. */
  lifecycle: RequestLifecycle;
  deadlines: WindowDeadlines;
  log: QueueLog & { info(obj: object, msg: string): void };
  /** This process's replica id and lease length (default: a new id, DEFAULT_LEASE_TTL_MS). */
  lease?: LeaseConfig;
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
  /** The runs of this process, by response id, under their leases. */
  private readonly queue: LeasedQueue<BackgroundRun>;
  private readonly lease: LeaseConfig;
  private closed = false;

  constructor(private readonly opts: BackgroundOptions) {
    this.lease = opts.lease ?? leaseConfig();
    const { store } = opts;
    this.queue = new LeasedQueue<BackgroundRun>({
      name: 'background responses', lease: this.lease, shared: store.shared, log: opts.log, claimOnRenew: true,
      maxJobs: opts.maxRuns ?? maxRunsFor(opts.lifecycle.service.registry),
      ...(opts.draining && { draining: opts.draining }),
      store: {
        key: (run) => run.running.id,
        claim: (term, room, closing) => this.claim(term, room, closing),
        // One UPDATE per table: in-progress idempotency keys of this process are renewed with the jobs.
        renew: (term) => store.renewLeases(term),
        // A job whose end could not be stored (or whose takeover failed) runs again, here or elsewhere.
        releaseUnrun: async (owner, ids) => {
          for (const id of ids) await store.releaseBackgroundJob(id, owner);
        },
        handBack: (owner) => store.releaseLeases(owner),
        releaseAll: () => store.releaseAllLeases(),
      },
      work: (run, lease) => this.execute(run, lease.signal),
    });
  }

  /** Deadline (Unix seconds) of a response created now in this window. */
  deadlineFor(window: CompletionWindow, createdAt: number): number {
    return createdAt + this.opts.deadlines[window];
  }

  /** Background responses of this organization in progress in this process (running or waiting their turn). */
  numInProgress(orgId: string): number {
    let n = 0;
    for (const run of this.queue.jobs()) if (run.orgId === orgId) n++;
    return n;
  }

  /** Stores the in_progress response with its input items and its job, leased to this process, and starts it. */
  async start(orgId: string, running: ResponseBody, prepared: PreparedGeneration, inputItems?: Record<string, unknown>[]): Promise<void> {
    const createdAt = running['created_at'] as number;
    const deadlineAt = this.deadlineFor(prepared.window, createdAt);
    // A queued run holds no image pixels (up to hundreds of MB a request, for as long as a flex run
    // waits): its images are prepared again when it starts (execute).
    const { images, ...held } = prepared;
    await this.queue.add({ orgId, running, prepared: held, deadlineAt }, (term) => this.opts.store.insertBackgroundResponse(running, {
      responseId: running.id,
      orgId,
      deadlineAt,
      request: prepared.request as unknown as Record<string, unknown>,
      createdAt,
      window: prepared.window,
    }, term, inputItems));
  }

  /**
   * Cancels an in_progress background response of this organization wherever it runs, and returns
   * the stored response after the attempt (undefined: no such response). Running here: its run is
   * stopped and stores the cancelled response. Elsewhere (another replica, or a dead one): the store
   * cancels it in one transaction (response, job, webhook delivery); the replica running it stops at
   * its next renewal without writing. A response that ended meanwhile is returned as it ended.
   */
  async cancel(orgId: string, id: string): Promise<ResponseBody | undefined> {
    if (this.queue.get(id)?.orgId === orgId) await this.queue.stop(id, CANCELLED);
    const stored = await this.opts.store.getResponse(orgId, id);
    if (stored?.status !== 'in_progress') return stored;
    // Not here, or this run's end was refused (it lost its lease meanwhile): cancel it in the store.
    const job = await this.opts.store.getBackgroundJob(orgId, id);
    if (!job) return this.opts.store.getResponse(orgId, id);
    const cancelled = cancelledResponse(stored);
    if (!(await this.opts.lifecycle.endCancelled(orgId, cancelled, (job.request as { metadata?: unknown }).metadata))) {
      return this.opts.store.getResponse(orgId, id);
    }
    return cancelled;
  }

  /**
   * When the app is ready: with a store this process owns alone (SQLite), hands back the leases the
   * previous process left; then claims at once what is free (work left by a previous process or a
   * dead replica); from then on the queue renews and claims every ttl/3.
   */
  async recover(): Promise<void> {
    await this.queue.start();
    await this.queue.poke();
  }

  /**
   * Stops renewing and claiming, then every run without storing an outcome, then hands this
   * process's leases back (its in-progress idempotency keys with them) so that another replica (or
   * the next start) takes the work at once.
   */
  async close(): Promise<void> {
    this.closed = true;
    await this.queue.close();
  }

  /** Claims free or expired jobs (up to `room`), ends those past their deadline or no longer valid, and returns the rest to run. */
  private async claim(term: LeaseTerm, room: number, closing: AbortSignal): Promise<BackgroundRun[]> {
    const jobs = await this.opts.store.claimBackgroundJobs(term, room);
    if (jobs.length === 0) return [];
    const runs: BackgroundRun[] = [];
    const counts = { resumed: 0, timed_out: 0, failed: 0 };
    for (const job of jobs) {
      try {
        const outcome = await this.adopt(job, closing);
        if (typeof outcome === 'object') {
          runs.push(outcome);
          counts.resumed++;
        } else if (outcome) counts[outcome]++;
      } catch (err) {
        // Held here without a run: the next renewal hands it back, and it is claimed again (here or elsewhere).
        this.opts.log.error({ err, response_id: job.responseId }, 'background responses: could not take over a job');
      }
    }
    if (counts.resumed + counts.timed_out + counts.failed > 0) {
      const whose = this.opts.store.shared ? 'taken over from stopped replicas' : 'left by the previous process';
      this.opts.log.info(counts, `background responses ${whose}: ${counts.resumed} resumed, `
        + `${counts.timed_out} past their deadline (failed: timeout), ${counts.failed} no longer valid (failed)`);
    }
    return runs;
  }

  /** A claimed job ready to run, or ended here when it is past its deadline or no longer prepares. */
  private async adopt(job: BackgroundJob, closing: AbortSignal): Promise<BackgroundRun | 'timed_out' | 'failed' | undefined> {
    const stored = await this.opts.store.getResponse(job.orgId, job.responseId);
    if (!stored) {
      // A job without its response (removed behind the store's back): nothing to run. The fenced
      // end drops the job; the response update it carries finds no row.
      await this.opts.lifecycle.end({
        response: { orgId: job.orgId, body: { id: job.responseId, status: 'failed' }, kind: 'background', leaseOwner: this.lease.owner },
      });
      return undefined;
    }
    if (stored.status !== 'in_progress') {
      await this.opts.store.finishBackgroundResponse(job.orgId, stored); // drop a stale job
      return undefined;
    }
    const metadata = (job.request as { metadata?: unknown }).metadata;
    if (closing.aborted) return undefined; // the queue hands the lease back
    if (nowSeconds() >= job.deadlineAt) {
      return (await this.finish(job.orgId, metadata, failedResponse(stored, 'timeout', timeoutMessage(stored)))) ? 'timed_out' : undefined;
    }
    let prepared: PreparedGeneration;
    try {
      prepared = await this.opts.lifecycle.prepare(job.request as unknown as GenerationRequest);
    } catch (err) {
      const code = isSluiceError(err) ? err.code : 'server_error';
      const failed = failedResponse(stored, code, `the request could not be resumed after a restart: ${(err as Error).message}`);
      return (await this.finish(job.orgId, metadata, failed)) ? 'failed' : undefined;
    }
    if (closing.aborted) return undefined;
    return { orgId: job.orgId, running: stored, prepared, deadlineAt: job.deadlineAt };
  }

  /** The queue's worker: runs one response to its end, stopped at its window's deadline (TIMEOUT) or by cancel(). */
  private async execute(run: BackgroundRun, signal: AbortSignal): Promise<void> {
    const { orgId, running } = run;
    let { prepared } = run;
    if (prepared.images === undefined && (prepared.request.images?.length ?? 0) > 0) {
      try {
        prepared = await this.opts.lifecycle.prepare(prepared.request, prepared.model);
      } catch (err) {
        const code = isSluiceError(err) ? err.code : 'server_error';
        await this.finish(orgId, prepared.request.metadata, failedResponse(running, code, `the request's images could not be prepared: ${(err as Error).message}`));
        return;
      }
    }
    const timer = setTimeout(() => void this.queue.stop(running.id, TIMEOUT), Math.max(0, run.deadlineAt * 1000 - Date.now()));
    timer.unref();
    const rendering = responseRendering(running, prepared, this.opts.lifecycle.service.reasoningSeal);
    try {
      const { committed } = await this.opts.lifecycle.run({
        prepared, mode: 'background', signal, billed: { surface: 'responses', requestId: running.id }, callback: true,
        rendering: {
          render: rendering.render,
          // Why the run stopped decides what is stored: nothing when this process closes or lost the
          // job (it runs again elsewhere, or was cancelled there); timeout and cancel have their own objects.
          failed: (err, stage) => {
            if (stage === 'end') return undefined; // stays in_progress with its job: it runs again
            const reason = signal.reason;
            if (reason === CLOSED || reason === LEASE_LOST || (this.closed && isSluiceError(err) && err.code === 'engine_disposed')) return undefined;
            if (reason === TIMEOUT) return failedResponse(running, 'timeout', timeoutMessage(running));
            if (reason === CANCELLED) return cancelledResponse(running);
            if (!isSluiceError(err) || err.code === 'engine_error') this.opts.log.error({ err, response_id: running.id }, 'background response failed');
            return rendering.failed(err, stage);
          },
        },
        end: (final) => ({ response: { orgId, body: final, kind: 'background', leaseOwner: this.lease.owner } }),
        onEndFailed: (err) => {
          if (!this.closed) this.opts.log.error({ err, response_id: running.id }, 'could not store a background response; it runs again once its lease is handed back');
        },
      });
      if (committed.backgroundLeaseLost) this.leaseLost(running.id);
    } catch {
      // Told above (onEndFailed), or a stop that writes nothing here (see failed).
      if (signal.reason === LEASE_LOST) {
        this.opts.log.info({ response_id: running.id }, 'background response stopped: cancelled or taken over on another replica');
      }
    } finally {
      clearTimeout(timer);
    }
  }

  private leaseLost(responseId: string): void {
    this.opts.log.info({ response_id: responseId }, 'background response not stored: cancelled or taken over on another replica');
  }

  /**
   * The fenced end of a response that does not run (past its deadline, no longer valid): `metadata`
   * is the request's, which names the webhook and holds its token. False when this process no
   * longer holds the job (nothing was written).
   */
  private async finish(orgId: string, metadata: unknown, final: ResponseBody): Promise<boolean> {
    const committed = await this.opts.lifecycle.end(
      { response: { orgId, body: final, kind: 'background', leaseOwner: this.lease.owner } },
      { orgId, metadata, body: final });
    if (committed.backgroundLeaseLost) {
      this.leaseLost(final.id);
      return false;
    }
    return true;
  }
}

function timeoutMessage(running: ResponseBody): string {
  return `the response did not finish within the deadline of its completion window (${String(running['completion_window'])})`;
}
