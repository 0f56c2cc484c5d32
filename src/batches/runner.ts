// The BatchRunner: creates batches, runs one BatchJob per unfinished batch, cancels, and resumes
// every unfinished batch when the process starts. Lines of all batches share one pool of slots
// (about the engine's max_num_seqs), so batches never hold more lines in memory or in the engine
// than that, however long their files are.
//
// Ownership: the runner is the only writer of a batch's status, except for one transition: a
// cancel request moves validating/in_progress to cancelling (a compare-and-set) and then tells the
// job, which ends the batch as cancelled.

import type { LeaseConfig } from '../store/leases.js';
import { randomBytes } from 'node:crypto';
import { FileStorage } from '../files/file-storage.js';
import { ReasoningSeal } from '../serving/reasoning-seal.js';
import { GenerationService } from '../serving/generation-service.js';
import type { TenantLimiter } from '../serving/tenant-limits.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import { UNFINISHED_BATCH_STATUSES, type BatchRecord } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { BatchJob, runWindow, type BatchLog } from './batch-job.js';
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

export class BatchRunner {
  readonly deadlines: BatchDeadlines;
  private readonly service: GenerationService;
  private readonly slots: Slots;
  private readonly log: BatchLog;
  private readonly billing: Billing;
  /** batch id -> its job and the promise of its run. */
  private readonly jobs = new Map<string, { job: BatchJob; done: Promise<void> }>();
  /** Batches waiting while paused (tests hold batches in validating with this). */
  private held: BatchRecord[] = [];
  private paused = false;
  private storage: FileStorage | undefined;
  private stopped = false;

  constructor(private readonly opts: BatchRunnerOptions) {
    this.deadlines = { ...DEFAULT_BATCH_DEADLINES, ...opts.deadlines };
    this.service = new GenerationService(opts.registry, opts.limits, ReasoningSeal.open(opts.dataDir));
    this.billing = new Billing(opts.registry);
    const engineSeqs = opts.registry.models.map((m) => m.engine.info.maxNumSeqs);
    this.slots = new Slots(opts.maxLinesInFlight ?? 2 * Math.max(1, ...engineSeqs));
    this.log = opts.log ?? stderrLog;
  }

  /** Opens the file storage and resumes every unfinished batch (of the process before), saying how many. */
  async start(): Promise<void> {
    this.storage ??= await FileStorage.open(this.opts.dataDir, this.opts.filesDir !== undefined ? { filesDir: this.opts.filesDir } : {});
    const unfinished = await this.opts.store.listUnfinishedBatches();
    for (const batch of unfinished) this.launch(batch);
    if (unfinished.length > 0) {
      this.log.info?.({ batches: unfinished.map((b) => b.id) }, `batches left unfinished by the previous process resume: ${unfinished.length}`);
    }
  }

  /** Records a new batch (validating) and starts its job. */
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
    this.launch(batch);
    return batch;
  }

  async cancel(orgId: string, id: string): Promise<CancelOutcome> {
    const { store } = this.opts;
    const current = await store.getBatch(orgId, id);
    if (!current) return { state: 'not_found' };
    const moved = await store.transitionBatch(id, ['validating', 'in_progress'], { status: 'cancelling', cancellingAt: Math.floor(Date.now() / 1000) });
    if (moved) {
      const running = this.jobs.get(id);
      if (running) running.job.stop('cancel');
      else this.launch(moved); // e.g. held while paused: a job ends it as cancelled
      return { state: 'cancelling', batch: moved };
    }
    const now = (await store.getBatch(orgId, id)) ?? current;
    if (now.status === 'cancelling' || now.status === 'cancelled') return { state: 'unchanged', batch: now };
    return { state: 'not_cancellable', batch: now };
  }

  /** Holds new batches in their current status until resume() (for tests of early stages). */
  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
    const held = this.held;
    this.held = [];
    for (const batch of held) this.launch(batch);
  }

  /** Stops every job without ending its batch (the next start resumes them); waits for them. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.held = [];
    for (const { job } of this.jobs.values()) job.stop('shutdown');
    await Promise.all([...this.jobs.values()].map((j) => j.done));
  }

  /** Waits until no job runs (tests). */
  async idle(): Promise<void> {
    while (this.jobs.size > 0) await Promise.all([...this.jobs.values()].map((j) => j.done));
  }

  private launch(batch: BatchRecord): void {
    if (this.stopped || this.jobs.has(batch.id) || !UNFINISHED_BATCH_STATUSES.includes(batch.status)) return;
    // A cancelling batch is ended even while paused: only new work is held.
    if (this.paused && batch.status !== 'cancelling') {
      this.held.push(batch);
      return;
    }
    if (!this.storage) throw new Error('BatchRunner.start() was not called');
    this.held = this.held.filter((b) => b.id !== batch.id);
    const job = new BatchJob({
      store: this.opts.store, storage: this.storage, service: this.service, slots: this.slots, log: this.log, billing: this.billing,
      ...(this.opts.onLineDone && { onLineDone: this.opts.onLineDone }),
    }, batch.id, batch.orgId);
    const done = job.run().finally(() => {
      this.jobs.delete(batch.id);
    });
    this.jobs.set(batch.id, { job, done });
  }
}
