// One claimed chunk's lines run in this process (chunks.ts; the runner claims chunks and renews
// their leases). Its lines are read from the chunk's byte range, each takes a slot of the shared
// Slots (per-organization fairness) and runs like its endpoint would (line-executor.ts).
//
// Exactly once: a line counts as done only when its result row is committed, fenced (store.ts,
// RequestEnd.batchResult): only while this replica still holds the chunk and the batch is
// in_progress with nobody ending it, and with the line's ledger row in the same transaction. Lines
// that already have a row (a chunk taken over from a replica that died, or from before chunks)
// are skipped. The chunk is marked done, fenced too, once every one of its lines has a row.

import { setMaxListeners } from 'node:events';
import type { FileStorage } from '../files/file-storage.js';
import type { RequestLifecycle } from '../serving/lifecycle.js';
import type { BatchRecord, ClaimedBatchChunk } from '../store/batch-records.js';
import type { Store } from '../store/store.js';
import { inputMissingError, runWindow, type BatchLog } from './batch-job.js';
import { jsonlLines, type JsonlLine } from './jsonl-lines.js';
import { executeLine } from './line-executor.js';
import type { Slots } from './slots.js';

export interface ChunkDeps {
  store: Store;
  storage: FileStorage;
  /** The request lifecycle: each line runs through it, and its end (fenced by the chunk's lease) is written by it. */
  lifecycle: RequestLifecycle;
  slots: Slots;
  log: BatchLog;
  /** This replica's id: the chunk's lease owner. */
  owner: string;
  /** Told when a line's result row is stored (metrics). */
  onLineDone?: (outcome: 'completed' | 'failed') => void;
}

/**
 * How a run ended. `done`: every line has a row and the chunk is marked done; `stopped`: aborted
 * (shutdown, cancel, expiry, a lost lease), nothing more to do here; `failed`: a store error or a
 * vanished input, the chunk should be handed back.
 */
export type ChunkOutcome = 'done' | 'stopped' | 'failed';

const MAX_TIMER_MS = 2 ** 31 - 1;

export class ChunkRun {
  private readonly controller = new AbortController();
  /** True until every line of the chunk has been handed a slot (or the run stopped). */
  feeding = true;
  private failed = false;

  /** `onFed`: called once, when the last line got its slot (the runner then claims the next chunk). */
  constructor(private readonly deps: ChunkDeps, readonly claim: ClaimedBatchChunk, private readonly onFed: () => void) {
    // Every line in flight (and each of a line's choices) listens on this one signal.
    setMaxListeners(0, this.controller.signal);
  }

  get batch(): BatchRecord {
    return this.claim.batch;
  }

  /** Aborts the lines still running: nothing more of this chunk is written here. */
  stop(): void {
    this.controller.abort();
  }

  async run(): Promise<ChunkOutcome> {
    const expiry = this.armExpiry();
    try {
      return await this.runLines();
    } catch (err) {
      this.deps.log.error({ err, batch_id: this.batch.id, chunk: this.claim.chunk.chunkNo }, 'batch chunk failed; it is handed back');
      return 'failed';
    } finally {
      clearTimeout(expiry);
      this.controller.abort(); // releases any slot waiter
      this.fed();
    }
  }

  /** Lines stop at the batch's deadline (the end, as expired, is the batch row's work). */
  private armExpiry(): NodeJS.Timeout | undefined {
    const ms = this.batch.expiresAt * 1000 - Date.now();
    if (ms <= 0) {
      this.controller.abort();
      return undefined;
    }
    const timer = setTimeout(() => this.controller.abort(), Math.min(ms, MAX_TIMER_MS));
    timer.unref();
    return timer;
  }

  private fed(): void {
    if (!this.feeding) return;
    this.feeding = false;
    this.onFed();
  }

  private async runLines(): Promise<ChunkOutcome> {
    const { store, storage, slots, lifecycle } = this.deps;
    const { service } = lifecycle;
    const { chunk, batch } = this.claim;
    const signal = this.controller.signal;
    const opened = await storage.openRead(batch.inputFileId, { start: chunk.startOffset });
    if (!opened) {
      // The batch fails, keeping its finished lines: its row's errors tell whoever ends it.
      await store.transitionBatch(batch.id, ['in_progress'], { errors: [inputMissingError(batch, 'while')] });
      return 'stopped';
    }
    const finished = new Set(await store.listBatchResultLines(batch.id, chunk.firstLine, chunk.lastLine));
    let stored = finished.size;
    const running = new Set<Promise<void>>();
    const caller = { orgId: batch.orgId, orgName: batch.orgName, keyId: batch.keyId };
    const window = runWindow(batch.completionWindow);

    const runOne = async (line: JsonlLine) => {
      const outcome = await executeLine({ text: line.text, lifecycle, caller, window, signal, requestId: `${batch.id}:${line.lineNo}` });
      if (outcome.kind === 'aborted') return;
      if (outcome.kind === 'error' && outcome.internal !== undefined) {
        this.deps.log.error({ err: outcome.internal, batch_id: batch.id, line: line.lineNo }, 'batch line failed inside the service');
      }
      try {
        // Each line that ends with a result is billed once, with its result row.
        const usage = outcome.kind === 'ok' ? outcome.usage : undefined;
        const commit = await lifecycle.end({
          batchResult: {
            batchId: batch.id,
            result: { lineNo: line.lineNo, ok: outcome.kind === 'ok', line: outcome.line },
            // Progress stays where the split into chunks left it: the chunks carry it now.
            progress: { nextLine: 0, nextOffset: 0 },
            lease: { owner: this.deps.owner, chunkNo: chunk.chunkNo },
          },
          ...(usage && { usage }),
        });
        if (commit.batchLeaseLost) {
          this.stop(); // taken over, or the batch is ending: its other lines are not ours to write either
          return;
        }
        stored += 1;
        if (commit.batchResultRecorded) this.deps.onLineDone?.(outcome.kind === 'ok' ? 'completed' : 'failed');
      } catch (err) {
        this.deps.log.error({ err, batch_id: batch.id, line: line.lineNo }, 'could not record a batch result; the chunk is handed back');
        this.failed = true;
        this.stop();
      }
    };

    try {
      for await (const line of jsonlLines(opened.stream, chunk.startOffset, chunk.firstLine)) {
        if (signal.aborted || line.start >= chunk.endOffset) break;
        if (line.text.trim() === '' || finished.has(line.lineNo)) continue;
        // Batch lines count against their organization's limits: they wait while its tokens per
        // minute are spent, and hold at most its in-flight limit of slots (slots.ts).
        if (!(await service.waitForTokens(caller, signal).then(() => true, () => false))) break;
        if (!(await slots.acquire(signal, batch.orgId, service.limits.limitsFor(caller).maxInflightRequests))) break;
        const task: Promise<void> = runOne(line).finally(() => {
          slots.release(batch.orgId);
          running.delete(task);
        });
        running.add(task);
      }
    } finally {
      opened.stream.destroy();
      this.fed();
      await Promise.all(running);
    }
    if (signal.aborted && !this.failed) return 'stopped';
    // A line short (the file changed under the batch?) is a failure too: the chunk is handed back.
    if (this.failed || stored < chunk.numLines) return 'failed';
    return (await store.finishBatchChunk(batch.id, chunk.chunkNo, this.deps.owner)) ? 'done' : 'stopped';
  }
}
