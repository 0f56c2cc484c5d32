// One batch's work in this process: validate the input, run its lines, and end it (completed,
// expired, cancelled or failed) with its result files. A job that is stopped for shutdown leaves
// the batch as it is; the next process starts a new job for it, which resumes where the store
// says it got to.
//
// Exactly once: a line counts as done only when its result row is committed (the store's
// commitRequestEnd, in the same transaction as the line's ledger row when it ended with a result:
// a line is billed exactly when its result is kept), and the progress recorded with it never
// passes a line whose row is not committed yet: a line
// leaves `inFlight` only after its own row is stored, and every progress value is the start of the
// lowest line still in `inFlight` (or the read position when none is). So a restart re-runs exactly
// the lines without a row: those from progress.nextLine on, minus the rows already there.

import { setMaxListeners } from 'node:events';
import type { CompletionWindow } from '../config/catalog.js';
import type { FileStorage } from '../files/file-storage.js';
import type { GenerationService } from '../serving/generation-service.js';
import type { BatchErrorItem, BatchPatch, BatchProgress, BatchRecord, BatchStatus } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { jsonlLines, type JsonlLine } from './jsonl-lines.js';
import { executeLine } from './line-executor.js';
import { writeResultFiles } from './result-files.js';
import type { Slots } from './slots.js';
import type { Billing } from '../billing/ledger.js';
import { checkBatchInput } from './validate-input.js';

/** Why a job stops before its lines are done. `shutdown` keeps the batch's state for a restart. */
export type StopReason = 'cancel' | 'expire' | 'shutdown';

/** The logger calls jobs and the runner make (fastify's logger fits). */
export interface BatchLog {
  error(obj: object, msg: string): void;
  info?(obj: object, msg: string): void;
}

export interface JobDeps {
  store: Store;
  storage: FileStorage;
  service: GenerationService;
  slots: Slots;
  log: BatchLog;
  /** The usage ledger: each line that ends with a result is billed once, with its result row. */
  billing?: Billing;
  /** Told when a line's result row is stored (metrics). */
  onLineDone?: (outcome: 'completed' | 'failed') => void;
}

const now = () => Math.floor(Date.now() / 1000);
/** setTimeout's longest delay (about 24.8 days); a later deadline is re-armed when it fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** OpenAI's "24h" window runs as flex. */
export function runWindow(completionWindow: string): CompletionWindow {
  return completionWindow === '24h' ? 'flex' : (completionWindow as CompletionWindow);
}

export class BatchJob {
  private readonly controller = new AbortController();
  private stopReason: StopReason | undefined;
  private expiryTimer: NodeJS.Timeout | undefined;
  /** Set when the input file vanished mid-run: the batch fails, keeping its finished lines. */
  private inputMissing = false;

  constructor(private readonly deps: JobDeps, readonly batchId: string, private readonly orgId: string) {
    // Every line in flight (and each of a line's choices) listens on this one signal: up to the
    // slot count and more, by design, so the default warning at 10 listeners does not apply.
    setMaxListeners(0, this.controller.signal);
  }

  /** Stops starting lines and aborts those running. The first reason other than shutdown wins. */
  stop(reason: StopReason): void {
    if (this.stopReason === undefined || reason === 'shutdown') this.stopReason = reason;
    this.controller.abort();
  }

  async run(): Promise<void> {
    try {
      let batch = await this.deps.store.getBatch(this.orgId, this.batchId);
      if (!batch) return;
      this.armExpiry(batch.expiresAt);
      if (batch.status === 'validating') batch = await this.validate(batch);
      if (batch?.status === 'in_progress' && !this.controller.signal.aborted) await this.runLines(batch);
      await this.end();
    } catch (err) {
      this.deps.log.error({ err, batch_id: this.batchId }, 'batch job failed; it resumes at the next start');
    } finally {
      clearTimeout(this.expiryTimer);
      this.controller.abort(); // releases any slot waiter
    }
  }

  private armExpiry(expiresAt: number): void {
    const ms = expiresAt * 1000 - Date.now();
    if (ms <= 0) return this.stop('expire');
    this.expiryTimer = setTimeout(() => (ms > MAX_TIMER_MS ? this.armExpiry(expiresAt) : this.stop('expire')), Math.min(ms, MAX_TIMER_MS));
    this.expiryTimer.unref();
  }

  private async validate(batch: BatchRecord): Promise<BatchRecord | undefined> {
    const { store, storage } = this.deps;
    const opened = await storage.openRead(batch.inputFileId);
    const fail = (errors: BatchErrorItem[], total = 0) =>
      store.transitionBatch(batch.id, ['validating'], { status: 'failed', errors, total, failedAt: now() });
    if (!opened) {
      return fail([{ code: 'file_not_found', message: `the input file ${batch.inputFileId} no longer exists`, line: null, param: 'input_file_id' }]);
    }
    const check = await checkBatchInput(opened.stream, batch.endpoint, this.controller.signal);
    opened.stream.destroy();
    if (this.controller.signal.aborted) return batch;
    if (check.errors.length > 0) return fail(check.errors, check.numRequests);
    return store.transitionBatch(batch.id, ['validating'], { status: 'in_progress', total: check.numRequests, inProgressAt: now() });
  }

  private async runLines(batch: BatchRecord): Promise<void> {
    const { store, storage, slots } = this.deps;
    const signal = this.controller.signal;
    const opened = await storage.openRead(batch.inputFileId, { start: batch.progress.nextOffset });
    if (!opened) {
      this.inputMissing = true;
      return;
    }
    // Rows past the progress point: lines that finished out of order before a restart (at most
    // the previous in-flight window), skipped as they are read.
    const finished = new Set(await store.listBatchResultLines(batch.id, batch.progress.nextLine));
    // line number -> its start offset; insertion (= line) order, so the first entry is the lowest.
    const inFlight = new Map<number, number>();
    let readPos: BatchProgress = { ...batch.progress };
    const progressWithout = (lineNo: number): BatchProgress => {
      for (const [n, start] of inFlight) if (n !== lineNo) return { nextLine: n, nextOffset: start };
      return readPos;
    };
    const running = new Set<Promise<void>>();
    const caller = { orgId: batch.orgId, orgName: batch.orgName, keyId: batch.keyId };
    const window = runWindow(batch.completionWindow);

    const runOne = async (line: JsonlLine) => {
      const outcome = await executeLine({ text: line.text, service: this.deps.service, caller, window, signal });
      // An aborted line stays in inFlight: no progress recorded after this may pass it.
      if (outcome.kind === 'aborted') return;
      if (outcome.kind === 'error' && outcome.internal !== undefined) {
        this.deps.log.error({ err: outcome.internal, batch_id: batch.id, line: line.lineNo }, 'batch line failed inside the service');
      }
      try {
        const usage = outcome.kind === 'ok'
          ? this.deps.billing?.usageRecord({ surface: 'batch', requestId: `${batch.id}:${line.lineNo}`, ...outcome.usage })
          : undefined;
        await store.commitRequestEnd({
          batchResult: { batchId: batch.id, result: { lineNo: line.lineNo, ok: outcome.kind === 'ok', line: outcome.line }, progress: progressWithout(line.lineNo) },
          ...(usage && { usage }),
        });
        inFlight.delete(line.lineNo);
        this.deps.onLineDone?.(outcome.kind === 'ok' ? 'completed' : 'failed');
      } catch (err) {
        this.deps.log.error({ err, batch_id: batch.id }, 'could not record a batch result; the batch stops until the next start');
        this.stop('shutdown');
      }
    };

    try {
      for await (const line of jsonlLines(opened.stream, batch.progress.nextOffset, batch.progress.nextLine)) {
        if (signal.aborted) break;
        const after = { nextLine: line.lineNo + 1, nextOffset: line.end };
        if (line.text.trim() === '' || finished.delete(line.lineNo)) {
          readPos = after;
          continue;
        }
        if (!(await slots.acquire(signal, batch.orgId))) break;
        // Taken together, synchronously: the read position never passes a line not yet in flight.
        inFlight.set(line.lineNo, line.start);
        readPos = after;
        const task: Promise<void> = runOne(line).finally(() => {
          slots.release();
          running.delete(task);
        });
        running.add(task);
      }
    } finally {
      opened.stream.destroy();
      await Promise.all(running);
    }
  }

  /**
   * Ends the batch per its stored status and why the job stopped. Every end is a compare-and-set;
   * losing one (a cancel landed meanwhile) re-reads the batch and ends it the new way.
   */
  private async end(): Promise<void> {
    const { store } = this.deps;
    for (;;) {
      if (this.stopReason === 'shutdown') return;
      const batch = await store.getBatch(this.orgId, this.batchId);
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
          if (this.stopReason === 'expire' || t >= batch.expiresAt) {
            from = batch.status; patch = { status: 'expired', expiredAt: t };
          } else if (this.inputMissing) {
            from = 'in_progress';
            patch = { status: 'failed', failedAt: t, errors: [{ code: 'file_not_found', message: `the input file ${batch.inputFileId} was deleted while the batch ran`, line: null, param: 'input_file_id' }] };
          } else if (batch.status === 'in_progress' && this.stopReason === undefined) {
            // Every line has a result: on to finalizing (the next turn of the loop completes it).
            await store.transitionBatch(batch.id, ['in_progress'], { status: 'finalizing', finalizingAt: t });
            continue;
          } else {
            return; // stopped for a cancel whose status change has not landed: nothing to end here
          }
          break;
        case 'finalizing':
          from = 'finalizing'; patch = { status: 'completed', completedAt: t };
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
