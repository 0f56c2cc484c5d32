// A batch row's own work, run by the replica holding the row's lease (store/leases.ts; the runner
// claims it): validating the input and splitting it into chunks, splitting a batch from before
// chunks, and the end (completed, expired, cancelled or failed, with the result files). The lines
// themselves run in chunks (chunk-run.ts), on whichever replicas claim them.
//
// Exactly once: the move to in_progress and the chunk rows are one transaction (a compare-and-set
// on the status and on this lease), and every end is a compare-and-set on the status, so each
// happens once whoever races. Claiming the row lease for an end is a barrier: a line commit holds
// its batch row until it commits, and the fence refuses every line commit once the row is leased
// (store.ts, RequestEnd.batchResult), so the result files written after the claim hold every
// counted line.

import { setMaxListeners } from 'node:events';
import type { CompletionWindow } from '../config/catalog.js';
import type { FileStorage } from '../files/file-storage.js';
import type { BatchClaim, BatchErrorItem, BatchPatch, BatchRecord, BatchStatus } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { splitIntoChunks } from './chunks.js';
import { writeResultFiles } from './result-files.js';
import { checkBatchInput } from './validate-input.js';

/** The logger calls jobs and the runner make (fastify's logger fits). */
export interface BatchLog {
  error(obj: object, msg: string): void;
  info?(obj: object, msg: string): void;
}

export interface JobDeps {
  store: Store;
  storage: FileStorage;
  log: BatchLog;
  /** This replica's id: the owner of the row lease the job runs under. */
  owner: string;
  /** Lines per chunk (chunks.ts). */
  chunkLines: number;
}

const now = () => Math.floor(Date.now() / 1000);
/** setTimeout's longest delay (about 24.8 days); a later deadline is re-armed when it fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** OpenAI's "24h" window runs as flex. */
export function runWindow(completionWindow: string): CompletionWindow {
  return completionWindow === '24h' ? 'flex' : (completionWindow as CompletionWindow);
}

/** The error a batch whose input file vanished fails with. */
export function inputMissingError(batch: BatchRecord, when: 'before' | 'while'): BatchErrorItem {
  const message = when === 'before' ? `the input file ${batch.inputFileId} no longer exists`
    : `the input file ${batch.inputFileId} was deleted while the batch ran`;
  return { code: 'file_not_found', message, line: null, param: 'input_file_id' };
}

export class BatchJob {
  private readonly controller = new AbortController();
  private expiryTimer: NodeJS.Timeout | undefined;
  private expired = false;

  private readonly batch: BatchRecord;

  /** `claim`: the batch as its row lease was claimed by this replica. */
  constructor(private readonly deps: JobDeps, private readonly claim: BatchClaim) {
    this.batch = claim.batch;
    setMaxListeners(0, this.controller.signal);
  }

  get batchId(): string {
    return this.batch.id;
  }

  /** Stops the job where it is (shutdown, a lost lease, a cancel of a validating batch): nothing more is written. */
  stop(): void {
    this.controller.abort();
  }

  /** Resolves false when a step failed (a store or file error, logged): it is tried again at a later poll. */
  async run(): Promise<boolean> {
    const batch = this.batch;
    try {
      this.armExpiry(batch.expiresAt);
      if (batch.status === 'validating' && !this.expired) {
        if (await this.validate(batch)) return true;
      } else if (batch.status === 'in_progress' && !this.claim.chunked && !this.expired && batch.errors === null) {
        if (await this.split(batch)) return true;
      }
      if (!this.controller.signal.aborted || this.expired) await this.end();
      return true;
    } catch (err) {
      this.deps.log.error({ err, batch_id: batch.id }, 'batch step failed; it is tried again at a later poll');
      return false;
    } finally {
      clearTimeout(this.expiryTimer);
    }
  }

  private armExpiry(expiresAt: number): void {
    const ms = expiresAt * 1000 - Date.now();
    if (ms <= 0) {
      this.expired = true;
      return;
    }
    this.expiryTimer = setTimeout(() => {
      if (ms > MAX_TIMER_MS) return this.armExpiry(expiresAt);
      this.expired = true;
      this.controller.abort();
    }, Math.min(ms, MAX_TIMER_MS));
    this.expiryTimer.unref();
  }

  /** Validates and moves to in_progress with the chunks; true when that (or a failure) ended this job's part. */
  private async validate(batch: BatchRecord): Promise<boolean> {
    const { store, storage, owner } = this.deps;
    const signal = this.controller.signal;
    const opened = await storage.openRead(batch.inputFileId);
    const fail = async (errors: BatchErrorItem[], total = 0) => {
      await store.transitionBatch(batch.id, ['validating'], { status: 'failed', errors, total, failedAt: now() });
      return true;
    };
    if (!opened) return fail([inputMissingError(batch, 'before')]);
    let check;
    try {
      check = await checkBatchInput(opened.stream, batch.endpoint, signal, this.deps.chunkLines);
    } finally {
      opened.stream.destroy();
    }
    if (signal.aborted) return false;
    if (check.errors.length > 0) return fail(check.errors, check.numRequests);
    const started = await store.startBatchChunks(batch.id, owner, ['validating'],
      { status: 'in_progress', total: check.numRequests, inProgressAt: now() }, check.chunks);
    return started !== undefined; // else a cancel landed meanwhile: end it
  }

  /** A batch in_progress from before chunks: its lines from the recorded progress on, split into chunks. */
  private async split(batch: BatchRecord): Promise<boolean> {
    const { store, storage, owner } = this.deps;
    const opened = await storage.openRead(batch.inputFileId, { start: batch.progress.nextOffset });
    if (!opened) {
      await store.transitionBatch(batch.id, ['in_progress'], { errors: [inputMissingError(batch, 'while')] });
      return false; // ends it as failed
    }
    let chunks;
    try {
      chunks = await splitIntoChunks(opened.stream, batch.progress.nextOffset, batch.progress.nextLine, this.controller.signal, this.deps.chunkLines);
    } finally {
      opened.stream.destroy();
    }
    if (!chunks) return false;
    return (await store.startBatchChunks(batch.id, owner, ['in_progress'], {}, chunks)) !== undefined;
  }

  /**
   * Ends the batch per its stored status. Every end is a compare-and-set; losing one (a cancel
   * landed meanwhile) re-reads the batch and ends it the new way.
   */
  private async end(): Promise<void> {
    const { store } = this.deps;
    for (;;) {
      if (this.controller.signal.aborted && !this.expired) return;
      const batch = await store.getBatch(this.batch.orgId, this.batch.id);
      if (!batch) return;
      const t = now();
      let from: BatchStatus;
      let patch: BatchPatch;
      switch (batch.status) {
        case 'cancelling':
          from = 'cancelling'; patch = { status: 'cancelled', cancelledAt: t };
          break;
        case 'validating':
        case 'in_progress':
          if (this.expired || t >= batch.expiresAt) {
            from = batch.status; patch = { status: 'expired', expiredAt: t };
          } else if (batch.status === 'in_progress' && (batch.errors !== null || (this.claim.chunked && this.claim.undoneChunks === 0))) {
            // Every chunk is done (none gets done while the row is ours), or the input vanished
            // (errors): on to finalizing, then the end.
            await store.transitionBatch(batch.id, ['in_progress'], { status: 'finalizing', finalizingAt: t });
            continue;
          } else {
            return; // lines remain to run, or validation goes on: nothing to end (the runner hands the row back)
          }
          break;
        case 'finalizing':
          from = 'finalizing';
          patch = batch.errors !== null ? { status: 'failed', failedAt: t } : { status: 'completed', completedAt: t };
          break;
        default:
          return; // already terminal
      }
      const written = await writeResultFiles(store, this.deps.storage, batch);
      const ended = await store.finishBatch(batch.id, [from], { ...patch, outputFileId: written.outputFileId, errorFileId: written.errorFileId }, written.files);
      if (ended) {
        // The batch's result rows were dropped: give their pages back to the file system.
        await store.reclaimSpace().catch((err: unknown) => this.deps.log.error({ err, batch_id: batch.id }, 'could not reclaim database space'));
        return;
      }
      // Lost the race: the files stay on disk under the batch's fixed ids and are rewritten next turn.
    }
  }
}
