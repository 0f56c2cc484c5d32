// The BatchRunner: creates and cancels batches, and runs batch work under leases (store/leases.ts)
// so that replicas sharing one database share it, each piece in one place at a time:
//
// - A batch row's own work (validation and the split into chunks, a batch from before chunks
//   split from its progress, the end) runs as a BatchJob on the replica that claimed the row's
//   lease (batch-job.ts).
// - Its lines run in chunks of BATCH_CHUNK_LINES (chunks.ts), each a ChunkRun (chunk-run.ts) on the
//   replica that claimed the chunk's lease: asap before standard before flex, then the oldest batch,
//   then file order.
//
// Every replica polls for claimable work every ttl/3 (one cheap query each for rows and chunks)
// and right after a chunk, a job or a create ends; it renews what it holds every ttl/3 (one UPDATE
// per table) and stops the runs whose lease it lost. Lines of all batches share one pool of slots
// (about the engine's max_num_seqs, per-organization fairness): a chunk's lines wait for slots,
// and the next chunk is claimed as soon as the current one has handed out its last line, so the
// engine's queue never empties between chunks. One chunk per batch feeds at a time, at most
// MAX_FEEDING_BATCHES_PER_ORG batches of one organization and MAX_FEEDING_BATCHES in all: an
// organization with many batches cannot keep another's batch from being claimed (the slots then
// share the lines in flight between organizations).
//
// With SQLite (store.shared false) the process owns the store alone: the leases the previous
// process left are released at start. drain() claims nothing new and lets what runs finish;
// stop() aborts the lines still running (nothing of them is stored) and hands every lease back,
// so other replicas continue at once.

import { randomBytes } from 'node:crypto';
import { leaseConfig, leaseTerm, type LeaseConfig } from '../store/leases.js';
import { FileStorage } from '../files/file-storage.js';
import { ReasoningSeal } from '../serving/reasoning-seal.js';
import { GenerationService } from '../serving/generation-service.js';
import type { TenantLimiter } from '../serving/tenant-limits.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import { chunkKey, type BatchClaim, type BatchRecord, type ClaimedBatchChunk } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { BatchJob, runWindow, type BatchLog } from './batch-job.js';
import { ChunkRun } from './chunk-run.js';
import { BATCH_CHUNK_LINES } from './chunks.js';
import { Slots } from './slots.js';
import { Billing } from '../billing/ledger.js';

/** Seconds from creation until a batch expires, per window it runs at. */
export interface BatchDeadlines {
  asap: number;
  standard: number;
  flex: number;
}

export const DEFAULT_BATCH_DEADLINES: BatchDeadlines = { asap: 3600, standard: 24 * 3600, flex: 24 * 3600 };

export interface BatchRunnerOptions {
  store: Store;
  registry: ModelRegistry;
  dataDir: string;
  /** Where file bytes live when not `<dataDir>/files` (a volume replicas share). */
  filesDir?: string;
  deadlines?: Partial<BatchDeadlines>;
  /**
   * Lines in flight across all batches; default twice the largest max_num_seqs of the served
   * engines: the engine's queue then already holds the next lines when one ends, instead of
   * waiting while its successor is read, checked and tokenized (a batch alone ran at 0.94 of the
   * engine's throughput with one max_num_seqs of slots).
   */
  maxLinesInFlight?: number;
  /** This process's replica id and lease length for batch chunks (default: a new id, DEFAULT_LEASE_TTL_MS). */
  lease?: LeaseConfig;
  /** Lines per chunk of a new batch (default BATCH_CHUNK_LINES). */
  chunkLines?: number;
  /** Per-organization limits, shared with the API's requests (default: a limiter of its own). */
  limits?: TenantLimiter;
  log?: BatchLog;
  /** Told when a line is done (its result row stored): the service's metrics. Must not throw. */
  onLineDone?: (outcome: 'completed' | 'failed') => void;
}

export interface NewBatch {
  orgId: string;
  orgName: string;
  keyId: string;
  endpoint: string;
  inputFileId: string;
  completionWindow: string;
  metadata: Record<string, string> | null;
}

export type CancelOutcome =
  | { state: 'cancelling'; batch: BatchRecord }
  /** Already cancelling or cancelled: returned as it is. */
  | { state: 'unchanged'; batch: BatchRecord }
  /** Finalizing or terminal otherwise: a cancel cannot apply. */
  | { state: 'not_cancellable'; batch: BatchRecord }
  | { state: 'not_found' };

const stderrLine = (obj: object, msg: string) => process.stderr.write(`sluice: ${msg} ${JSON.stringify(obj, (_k, v) => (v instanceof Error ? v.stack : v))}\n`);
const stderrLog: BatchLog = { error: stderrLine, info: stderrLine };

/** Batches of one organization whose lines feed the slots at once here (one chunk each). */
export const MAX_FEEDING_BATCHES_PER_ORG = 2;
/**
 * Batches whose lines feed the slots at once here, all organizations together: a feeding chunk
 * holds a lease and an open input stream, and its lines wait for slots.
 */
export const MAX_FEEDING_BATCHES = 64;

interface Running<T> {
  run: T;
  done: Promise<void>;
  /** The runner's event count when it was claimed: a renewal that began later must find it held. */
  claimedAt: number;
}

export class BatchRunner {
  readonly deadlines: BatchDeadlines;
  readonly lease: LeaseConfig;
  private readonly service: GenerationService;
  private readonly slots: Slots;
  private readonly log: BatchLog;
  private readonly billing: Billing;
  private readonly chunkLines: number;
  /** batch id -> the job doing its row's work here. */
  private readonly jobs = new Map<string, Running<BatchJob>>();
  /** chunkKey -> the run of a chunk claimed here. */
  private readonly chunks = new Map<string, Running<ChunkRun>>();
  /** Orders claims and renewals (see Running.claimedAt). */
  private events = 0;
  private paused = false;
  private draining = false;
  private stopped = false;
  private storage: FileStorage | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** The poll in progress, and whether another was asked for meanwhile. */
  private polling: Promise<void> | undefined;
  private pollAgain = false;
  private renewing: Promise<void> | undefined;

  constructor(private readonly opts: BatchRunnerOptions) {
    this.deadlines = { ...DEFAULT_BATCH_DEADLINES, ...opts.deadlines };
    this.lease = opts.lease ?? leaseConfig();
    this.service = new GenerationService(opts.registry, opts.limits, ReasoningSeal.open(opts.dataDir));
    this.billing = new Billing(opts.registry);
    const engineSeqs = opts.registry.models.map((m) => m.engine.info.maxNumSeqs);
    this.slots = new Slots(opts.maxLinesInFlight ?? 2 * Math.max(1, ...engineSeqs));
    this.log = opts.log ?? stderrLog;
    this.chunkLines = opts.chunkLines ?? BATCH_CHUNK_LINES;
  }

  /**
   * Opens the file storage and starts polling for batch work. A store this process owns alone
   * first gets back the leases of the process before; the unfinished batches are logged.
   */
  async start(): Promise<void> {
    const { store } = this.opts;
    this.storage ??= await FileStorage.open(this.opts.dataDir, this.opts.filesDir !== undefined ? { filesDir: this.opts.filesDir } : {});
    if (!store.shared) await store.releaseBatchLeases();
    const unfinished = await store.listUnfinishedBatches();
    if (unfinished.length > 0) {
      const ids = { batches: unfinished.map((b) => b.id) };
      if (store.shared) this.log.info?.(ids, `unfinished batches in the shared database, run by whichever replicas claim them: ${unfinished.length}`);
      else this.log.info?.(ids, `batches left unfinished by the previous process resume: ${unfinished.length}`);
    }
    const every = Math.max(1, Math.floor(this.lease.ttlMs / 3));
    this.timer = setInterval(() => this.tick(), every);
    this.timer.unref();
    this.kick();
  }

  /** Records a new batch (validating); its validation is claimed at once (here, unless paused). */
  async create(input: NewBatch): Promise<BatchRecord> {
    const createdAt = Math.floor(Date.now() / 1000);
    const batch: BatchRecord = {
      id: `batch_${randomBytes(16).toString('hex')}`,
      ...input,
      status: 'validating',
      errors: null,
      outputFileId: null,
      errorFileId: null,
      requestCounts: { total: 0, completed: 0, failed: 0 },
      progress: { nextLine: 1, nextOffset: 0 },
      createdAt,
      expiresAt: createdAt + this.deadlines[runWindow(input.completionWindow)],
      inProgressAt: null, finalizingAt: null, completedAt: null, failedAt: null,
      expiredAt: null, cancellingAt: null, cancelledAt: null,
    };
    await this.opts.store.insertBatch(batch);
    this.kick();
    return batch;
  }

  async cancel(orgId: string, id: string): Promise<CancelOutcome> {
    const { store } = this.opts;
    const current = await store.getBatch(orgId, id);
    if (!current) return { state: 'not_found' };
    const moved = await store.transitionBatch(id, ['validating', 'in_progress'], { status: 'cancelling', cancellingAt: Math.floor(Date.now() / 1000) });
    if (moved) {
      // Lines running here stop now; other replicas' are refused by the fence and stop at their
      // next renewal. Whoever claims the row next ends it as cancelled.
      this.jobs.get(id)?.run.stop();
      for (const { run } of this.chunks.values()) if (run.batch.id === id) run.stop();
      this.kick();
      return { state: 'cancelling', batch: moved };
    }
    const now = (await store.getBatch(orgId, id)) ?? current;
    if (now.status === 'cancelling' || now.status === 'cancelled') return { state: 'unchanged', batch: now };
    return { state: 'not_cancellable', batch: now };
  }

  /** Holds new batches in validating until resume() (for tests of early stages); cancels still end. */
  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
    this.kick();
  }

  /** Claims nothing new from now on; what runs here goes on to its end (stop() follows). */
  drain(): void {
    this.draining = true;
  }

  /**
   * Stops polling and renewing, aborts every run (lines still running are not stored), waits for
   * them, and hands back every lease this replica holds: other replicas claim them at once.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.polling; // launches nothing once stopped
    for (const { run } of this.jobs.values()) run.stop();
    for (const { run } of this.chunks.values()) run.stop();
    await Promise.all([this.renewing, ...[...this.jobs.values(), ...this.chunks.values()].map((r) => r.done)]);
    if (this.storage) {
      await this.opts.store.releaseBatchLeases(this.lease.owner)
        .catch((err: unknown) => this.log.error({ err }, 'could not hand back the batch leases; they expire on their own'));
    }
  }

  /** Waits until nothing runs here (tests). */
  async idle(): Promise<void> {
    while (this.jobs.size > 0 || this.chunks.size > 0 || this.polling) {
      await Promise.all([this.polling, ...[...this.jobs.values(), ...this.chunks.values()].map((r) => r.done)]);
    }
  }

  /** Every ttl/3: renew what is held, then look for work. */
  private tick(): void {
    if (this.stopped) return;
    if (!this.renewing) {
      this.renewing = this.renew()
        .catch((err: unknown) => this.log.error({ err }, 'could not renew the batch leases'))
        .finally(() => { this.renewing = undefined; });
    }
    this.kick();
  }

  /** Extends the leases held here; a run whose lease is no longer ours (or whose batch left in_progress) stops. */
  private async renew(): Promise<void> {
    const startedAt = ++this.events;
    const held = await this.opts.store.renewBatchLeases(leaseTerm(this.lease));
    const batchIds = new Set(held.batchIds);
    const chunkKeys = new Set(held.chunkKeys);
    for (const [id, job] of this.jobs) if (job.claimedAt < startedAt && !batchIds.has(id)) job.run.stop();
    for (const [key, chunk] of this.chunks) if (chunk.claimedAt < startedAt && !chunkKeys.has(key)) chunk.run.stop();
  }

  /** Polls for work now (again right after, when a poll is running). */
  private kick(): void {
    if (this.stopped || this.draining) return;
    if (this.polling) {
      this.pollAgain = true;
      return;
    }
    this.polling = (async () => {
      do {
        this.pollAgain = false;
        try {
          await this.poll();
        } catch (err) {
          this.log.error({ err }, 'could not claim batch work; trying again at the next poll');
        }
      } while (this.pollAgain && !this.stopped && !this.draining);
    })().finally(() => { this.polling = undefined; });
  }

  private async poll(): Promise<void> {
    const { store } = this.opts;
    if (!this.storage) throw new Error('BatchRunner.start() was not called');
    // The batch rows' own work.
    for (const batch of await store.listBatchWork(this.lease.owner, Date.now())) {
      if (this.stopped || this.draining) return;
      if (this.jobs.has(batch.id) || (this.paused && batch.status === 'validating')) continue;
      const claim = await store.claimBatch(batch.id, leaseTerm(this.lease));
      if (claim) this.launchJob(claim);
    }
    // Chunks, while the caps on feeding batches (per organization, in all) leave room.
    for (;;) {
      if (this.stopped || this.draining) return;
      const feeding = [...this.chunks.values()].filter((c) => c.run.feeding).map((c) => c.run.batch);
      if (feeding.length >= MAX_FEEDING_BATCHES) return;
      const perOrg = new Map<string, number>();
      for (const b of feeding) perOrg.set(b.orgId, (perOrg.get(b.orgId) ?? 0) + 1);
      const fullOrgs = [...perOrg].filter(([, n]) => n >= MAX_FEEDING_BATCHES_PER_ORG).map(([org]) => org);
      const [claimed] = await store.claimBatchChunks(leaseTerm(this.lease), 1, feeding.map((b) => b.id), fullOrgs);
      if (!claimed) return;
      this.launchChunk(claimed);
    }
  }

  private launchJob(claim: BatchClaim): void {
    const { store } = this.opts;
    const id = claim.batch.id;
    if (this.stopped) return; // its lease goes back with the others
    const job = new BatchJob({ store, storage: this.storage!, log: this.log, owner: this.lease.owner, chunkLines: this.chunkLines }, claim);
    let ok = true;
    const done = job.run()
      // The row goes back (it may still be ours: a job that ended nothing, or stopped early).
      .then(async (succeeded) => {
        ok = succeeded;
        if (!this.stopped) await store.releaseBatchLease(id, this.lease.owner);
      })
      .catch((err: unknown) => this.log.error({ err, batch_id: id }, 'could not hand back a batch lease; it expires on its own'))
      .finally(() => {
        this.jobs.delete(id);
        if (ok) this.kick(); // after a failure, the next tick tries again (no tight loop)
      });
    this.jobs.set(id, { run: job, done, claimedAt: ++this.events });
  }

  private launchChunk(claimed: ClaimedBatchChunk): void {
    const { store } = this.opts;
    const { batch, chunk } = claimed;
    const key = chunkKey(batch.id, chunk.chunkNo);
    if (this.stopped) return; // its lease goes back with the others
    const run = new ChunkRun({
      store, storage: this.storage!, service: this.service, slots: this.slots, log: this.log, owner: this.lease.owner, billing: this.billing,
      ...(this.opts.onLineDone && { onLineDone: this.opts.onLineDone }),
    }, claimed, () => this.kick());
    let ok = true;
    const done = run.run()
      .then(async (outcome) => {
        ok = outcome !== 'failed';
        if (!ok && !this.stopped) await store.releaseBatchLease(batch.id, this.lease.owner, chunk.chunkNo);
      })
      .catch((err: unknown) => this.log.error({ err, batch_id: batch.id }, 'could not hand back a chunk lease; it expires on its own'))
      .finally(() => {
        this.chunks.delete(key);
        if (ok) this.kick(); // after a failure, the next tick tries again (no tight loop)
      });
    this.chunks.set(key, { run, done, claimedAt: ++this.events });
  }
}
