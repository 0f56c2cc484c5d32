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
// The leased queue (jobs/leased-queue.ts) keeps the leases of both, keyed by batch id and chunkKey:
// every replica renews what it holds every ttl/3 (one UPDATE per table), stops the runs whose lease
// it lost, then polls for claimable work (one cheap query each for rows and chunks); it polls
// again right after a chunk, a job or a create ends. Lines of all batches share one pool of slots
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
import { leaseConfig, type LeaseConfig, type LeaseTerm } from '../store/leases.js';
import { CLOSED, LeasedQueue, type JobLease, type WorkEnd } from '../jobs/leased-queue.js';
import { FileStorage } from '../files/file-storage.js';
import type { RequestLifecycle } from '../serving/lifecycle.js';
import { chunkKey, type BatchRecord } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { BatchJob, runWindow, type BatchLog } from './batch-job.js';
import { ChunkRun } from './chunk-run.js';
import { BATCH_CHUNK_LINES } from './chunks.js';
import { Slots } from './slots.js';

/** Seconds from creation until a batch expires, per window it runs at. */
export interface BatchDeadlines {
  asap: number;
  standard: number;
  flex: number;
}

export const DEFAULT_BATCH_DEADLINES: BatchDeadlines = { asap: 3600, standard: 24 * 3600, flex: 24 * 3600 };

export interface BatchRunnerOptions {
  store: Store;
  /** The request lifecycle every line runs through (the runtime's: the same limits, ledger and models as the API's). */
  lifecycle: RequestLifecycle;
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

/** Batch work held here: a row's own work or one chunk's lines, keyed by batch id or chunkKey. */
type BatchWork = BatchJob | ChunkRun;

const workKey = (work: BatchWork): string => (work instanceof BatchJob ? work.batchId : chunkKey(work.batch.id, work.claim.chunk.chunkNo));

export class BatchRunner {
  readonly deadlines: BatchDeadlines;
  readonly lease: LeaseConfig;
  private readonly slots: Slots;
  private readonly log: BatchLog;
  private readonly chunkLines: number;
  /** The rows' work and the chunks claimed here, under their leases. */
  private readonly queue: LeasedQueue<BatchWork>;
  private paused = false;
  private draining = false;
  private storage: FileStorage | undefined;

  constructor(private readonly opts: BatchRunnerOptions) {
    this.deadlines = { ...DEFAULT_BATCH_DEADLINES, ...opts.deadlines };
    this.lease = opts.lease ?? leaseConfig();
    const engineSeqs = opts.lifecycle.service.registry.models.map((m) => m.engine.info.maxNumSeqs);
    this.slots = new Slots(opts.maxLinesInFlight ?? 2 * Math.max(1, ...engineSeqs));
    this.log = opts.log ?? stderrLog;
    this.chunkLines = opts.chunkLines ?? BATCH_CHUNK_LINES;
    const { store } = opts;
    this.queue = new LeasedQueue<BatchWork>({
      name: 'batches', lease: this.lease, shared: store.shared, log: this.log, claimOnRenew: true,
      store: {
        key: workKey,
        claim: (term, _room, closing) => this.claim(term, closing),
        renew: async (term) => {
          const held = await store.renewBatchLeases(term);
          return [...held.batchIds, ...held.chunkKeys];
        },
        releaseUnrun: async (owner, keys) => {
          for (const key of keys) {
            const colon = key.lastIndexOf(':');
            if (colon === -1) await store.releaseBatchLease(key, owner);
            else await store.releaseBatchLease(key.slice(0, colon), owner, Number(key.slice(colon + 1)));
          }
        },
        handBack: async (owner) => { await store.releaseBatchLeases(owner); },
        releaseAll: async () => { await store.releaseBatchLeases(); },
      },
      work: (work, lease) => this.work(work, lease),
    });
  }

  /**
   * Opens the file storage and starts polling for batch work. A store this process owns alone
   * first gets back the leases of the process before; the unfinished batches are logged.
   */
  async start(): Promise<void> {
    const { store } = this.opts;
    this.storage ??= await FileStorage.open(this.opts.dataDir, this.opts.filesDir !== undefined ? { filesDir: this.opts.filesDir } : {});
    await this.queue.start();
    const unfinished = await store.listUnfinishedBatches();
    if (unfinished.length > 0) {
      const ids = { batches: unfinished.map((b) => b.id) };
      if (store.shared) this.log.info?.(ids, `unfinished batches in the shared database, run by whichever replicas claim them: ${unfinished.length}`);
      else this.log.info?.(ids, `batches left unfinished by the previous process resume: ${unfinished.length}`);
    }
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
      for (const work of this.queue.jobs()) if ((work instanceof BatchJob ? work.batchId : work.batch.id) === id) work.stop();
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
    this.queue.drain();
  }

  /**
   * Stops polling and renewing, aborts every run (lines still running are not stored), waits for
   * them, and hands back every lease this replica holds: other replicas claim them at once.
   */
  async stop(): Promise<void> {
    await this.queue.close();
  }

  /** Waits until nothing runs here (tests). */
  async idle(): Promise<void> {
    await this.queue.idle();
  }

  /** Polls for work now (again right after, when a poll is running). */
  private kick(): void {
    void this.queue.poke();
  }

  /**
   * One poll: the batch rows' own work, then chunks while the caps on feeding batches (per
   * organization, in all) leave room. The queue runs what it returns.
   */
  private async claim(term: LeaseTerm, closing: AbortSignal): Promise<BatchWork[]> {
    const { store } = this.opts;
    const storage = this.storage;
    if (!storage) throw new Error('BatchRunner.start() was not called');
    const claimed: BatchWork[] = [];
    const stopping = () => closing.aborted || this.draining;
    for (const batch of await store.listBatchWork(this.lease.owner, term.nowMs)) {
      if (stopping()) return claimed;
      if (this.queue.holds(batch.id) || (this.paused && batch.status === 'validating')) continue;
      const claim = await store.claimBatch(batch.id, term);
      if (claim) claimed.push(new BatchJob({ store, storage, log: this.log, owner: this.lease.owner, chunkLines: this.chunkLines }, claim));
    }
    // The batches feeding the slots here: those of chunks running here whose lines are not all
    // handed out, and of the chunks this poll claims.
    const feeding = [...this.queue.jobs()].filter((w): w is ChunkRun => w instanceof ChunkRun && w.feeding).map((c) => c.batch);
    for (;;) {
      if (stopping() || feeding.length >= MAX_FEEDING_BATCHES) return claimed;
      const perOrg = new Map<string, number>();
      for (const b of feeding) perOrg.set(b.orgId, (perOrg.get(b.orgId) ?? 0) + 1);
      const fullOrgs = [...perOrg].filter(([, n]) => n >= MAX_FEEDING_BATCHES_PER_ORG).map(([org]) => org);
      const [chunk] = await store.claimBatchChunks(term, 1, feeding.map((b) => b.id), fullOrgs);
      if (!chunk) return claimed;
      claimed.push(new ChunkRun({
        store, storage, lifecycle: this.opts.lifecycle, slots: this.slots, log: this.log, owner: this.lease.owner,
        ...(this.opts.onLineDone && { onLineDone: this.opts.onLineDone }),
      }, chunk, () => this.kick()));
      feeding.push(chunk.batch);
    }
  }

  /**
   * The queue's worker: runs a row's work or a chunk, stopped when its lease is lost or at close.
   * Afterwards the lease goes back (a row's always: it may still be ours; a chunk's when it failed)
   * unless closing (the queue then hands back everything at once). After a failure the next renewal
   * polls again (no tight loop); otherwise the next poll comes at once.
   */
  private async work(work: BatchWork, lease: JobLease): Promise<WorkEnd> {
    const { store } = this.opts;
    if (lease.signal.aborted) work.stop();
    else lease.signal.addEventListener('abort', () => work.stop(), { once: true });
    const closing = () => lease.signal.reason === CLOSED;
    let ok = true;
    try {
      if (work instanceof BatchJob) {
        ok = await work.run();
        if (!closing()) await store.releaseBatchLease(work.batchId, lease.owner);
      } else {
        ok = (await work.run()) !== 'failed';
        if (!ok && !closing()) await store.releaseBatchLease(work.batch.id, lease.owner, work.claim.chunk.chunkNo);
      }
    } catch (err) {
      const [id, what] = work instanceof BatchJob ? [work.batchId, 'a batch lease'] : [work.batch.id, 'a chunk lease'];
      this.log.error({ err, batch_id: id }, `could not hand back ${what}; it expires on its own`);
    }
    return ok ? 'claim-next' : undefined;
  }
}
