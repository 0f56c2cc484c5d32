// Continuous batching: the loop that turns queued sequences into native steps.
//
// Mechanism (this file's Batcher): plan a step, run it off the JS thread, route sampled tokens to
// their sequences, free finished ones, repeat while there is work. Policy (who is admitted next,
// who is preempted when KV blocks run out) is a separate SchedulingPolicy; FcfsPolicy is the
// default (first come first served). A priority scheduler replaces the policy, not the loop.
//
// Each step carries, within maxBatchedTokens tokens and maxNumSeqs sequences:
//   1. every running sequence, oldest admission first: 1 token if decoding, the next prompt chunk
//      if still prefilling (chunked prefill);
//   2. then newly admitted sequences (policy order), each with its first prompt chunk.
// KV accounting: a sequence computing n tokens needs ceil((numComputedTokens + n) / blockSize)
// blocks in all; the step never plans more new blocks than numFreeBlocks(). A running sequence
// that cannot get a block for even one token preempts the policy's victim (its KV is freed; it is
// requeued with prompt + generated tokens as its new prompt and recomputed later).

import type {
  NativeEngineHandle, NativeSamplingParams, NativeStepPlan, NativeStepResult,
} from './native-types.js';
import { SluiceError } from '../errors.js';
import { FcfsPolicy, type SchedulingPolicy, type SequenceView } from './batch-policy.js';

export { FcfsPolicy, type SchedulingPolicy, type SequenceView } from './batch-policy.js';

export interface BatcherOptions {
  /** Tokens computed per step, prefill chunks and decodes together (default 512). */
  maxBatchedTokens?: number;
  /** Sequences running at once (default 64). */
  maxNumSeqs?: number;
  policy?: SchedulingPolicy;
}

/** One sampled token as routed to its sequence. */
export interface SampledToken {
  tokenId: number;
  /** Logprob of the sampled token. */
  logprob: number;
  topIds: Int32Array;          // [topN] most likely ids, best first
  topLogprobs: Float32Array;   // [topN]
}

export type SequenceOutcome =
  | { kind: 'finished' }                 // the sink asked to stop, or maxTokens were generated
  | { kind: 'cancelled' }                // the request's AbortSignal fired
  | { kind: 'failed'; error: Error };    // engine failure, disposal, or an exception in the sink

/** Callbacks of one sequence. Called on the JS thread, between steps; never after onEnd. */
export interface SequenceSink {
  /** The sequence got its first step (called once, not again after a preemption). */
  onScheduled?(): void;
  /** A sampled token; return true to finish the sequence now (a stop condition was met). */
  onToken(token: SampledToken): boolean;
  /** Called exactly once. */
  onEnd(outcome: SequenceOutcome): void;
}

export interface SequenceRequest {
  promptTokenIds: readonly number[];
  /** Upper bound on generated tokens (>= 1); the sequence finishes when it is reached. */
  maxTokens: number;
  sampling: NativeSamplingParams;
  signal?: AbortSignal | undefined;
  sink: SequenceSink;
}

type SequenceState = 'waiting' | 'running' | 'done';

class Sequence implements SequenceView {
  state: SequenceState = 'waiting';
  /** Native id while running (a fresh id per admission). */
  seqId = 0;
  admittedOrder = -1;
  wasScheduled = false;
  cancelRequested = false;
  readonly generatedTokenIds: number[] = [];
  /** Tokens the native engine holds for this sequence (prompt at admission + samples since). */
  numKnownTokens = 0;
  /** Tokens whose KV has been computed. Invariant while running: numComputedTokens < numKnownTokens. */
  numComputedTokens = 0;
  removeAbortListener: () => void = () => {};

  constructor(readonly request: SequenceRequest, readonly arrivalOrder: number) {}

  get numPromptTokens(): number {
    return this.request.promptTokenIds.length;
  }
  get numGeneratedTokens(): number {
    return this.generatedTokenIds.length;
  }
}

/** One row of a step being planned. */
interface PlannedRow {
  seq: Sequence;
  numTokens: number;
  numNewBlocks: number;
}

const NO_KV_BLOCKS = 'NO_KV_BLOCKS';

export class Batcher {
  readonly maxBatchedTokens: number;
  readonly maxNumSeqs: number;
  private readonly blockSize: number;
  private readonly numTotalBlocks: number;
  private readonly policy: SchedulingPolicy;
  /** Running sequences in admission order (oldest first). */
  private running: Sequence[] = [];
  /** native seqId -> running sequence */
  private readonly seqIdToSequence = new Map<number, Sequence>();
  private numArrivals = 0;
  private numAdmissions = 0;
  private nextSeqId = 1;
  private loop: Promise<void> | undefined;
  private disposed = false;

  constructor(private readonly handle: NativeEngineHandle, options: BatcherOptions = {}) {
    this.maxBatchedTokens = options.maxBatchedTokens ?? 512;
    this.maxNumSeqs = options.maxNumSeqs ?? 64;
    for (const [name, value] of [['maxBatchedTokens', this.maxBatchedTokens], ['maxNumSeqs', this.maxNumSeqs]] as const) {
      if (!Number.isInteger(value) || value < 1) {
        throw new SluiceError('invalid_argument', `${name} must be an integer >= 1, got ${value}`, { param: name });
      }
    }
    if (this.maxNumSeqs > this.maxBatchedTokens) {
      // Otherwise the youngest decoding sequences could wait forever for budget.
      throw new SluiceError('invalid_argument',
        `maxNumSeqs (${this.maxNumSeqs}) must not exceed maxBatchedTokens (${this.maxBatchedTokens})`, { param: 'maxNumSeqs' });
    }
    const info = handle.info();
    this.blockSize = info.blockSize;
    this.numTotalBlocks = info.numBlocks;
    this.policy = options.policy ?? new FcfsPolicy();
  }

  get numRunning(): number {
    return this.running.length;
  }
  get numWaiting(): number {
    return this.policy.waiting().length;
  }

  /** The most tokens one sequence can ever hold in the KV pool. */
  get maxSequenceTokens(): number {
    return this.numTotalBlocks * this.blockSize;
  }

  /**
   * Queues a sequence. Throws SluiceError request_too_large when it could never fit in the KV
   * pool (prompt + maxTokens - 1 tokens: the last sampled token is never computed), and
   * engine_disposed after dispose(). Everything after this is reported through the sink.
   */
  submit(request: SequenceRequest): void {
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
    if (request.promptTokenIds.length === 0) {
      throw new SluiceError('invalid_request', 'the prompt must have at least one token', { param: 'prompt' });
    }
    const numKvTokens = request.promptTokenIds.length + request.maxTokens - 1;
    if (this.blocksFor(numKvTokens) > this.numTotalBlocks) {
      throw new SluiceError('request_too_large',
        `the request needs KV cache for ${numKvTokens} tokens (${request.promptTokenIds.length} prompt + ` +
        `${request.maxTokens} max tokens) but the KV pool holds ${this.maxSequenceTokens} tokens ` +
        `(${this.numTotalBlocks} blocks of ${this.blockSize}); lower max tokens or raise kvCacheBytes`);
    }
    const seq = new Sequence(request, this.numArrivals++);
    const signal = request.signal;
    if (signal) {
      const onAbort = () => {
        seq.cancelRequested = true;
        this.kick();
      };
      if (signal.aborted) seq.cancelRequested = true;
      else {
        signal.addEventListener('abort', onAbort, { once: true });
        seq.removeAbortListener = () => signal.removeEventListener('abort', onAbort);
      }
    }
    this.policy.enqueue(seq, false);
    this.kick();
  }

  /**
   * Stops the loop after its in-flight step (never frees native sequences mid-step), then ends
   * every sequence as failed: engine_disposed. Safe to call twice.
   */
  async dispose(): Promise<void> {
    this.disposed = true;
    await this.loop;
    const error = new SluiceError('engine_disposed', 'the engine was disposed before the request finished');
    for (const seq of [...this.running, ...(this.policy.waiting() as Sequence[])]) {
      this.end(seq, { kind: 'failed', error });
    }
  }

  /** Starts the loop if it is not running. The loop exits when there is no work left. */
  private kick(): void {
    if (this.loop !== undefined || this.disposed) return;
    // NOTE: the first step waits one macrotask so that requests submitted in the same tick
    // (and abort events) are seen by the first plan together.
    this.loop = new Promise<void>((resolve) => setImmediate(resolve)).then(() => this.runLoop()).finally(() => {
      this.loop = undefined;
      // Work that arrived while the loop was winding down.
      if (this.hasWork()) this.kick();
    });
  }

  private hasWork(): boolean {
    return !this.disposed && (this.running.length > 0 || this.policy.waiting().length > 0);
  }

  private async runLoop(): Promise<void> {
    try {
      while (this.hasWork()) {
        this.reapCancelled();
        const rows = this.planStep();
        if (rows.length === 0) {
          this.failUnschedulableHead();
          continue;
        }
        const plan: NativeStepPlan = {
          seqIds: Uint32Array.from(rows, (r) => r.seq.seqId),
          numTokens: Uint32Array.from(rows, (r) => r.numTokens),
        };
        let result: NativeStepResult;
        try {
          result = await this.handle.step(plan);
        } catch (err) {
          this.onStepError(rows, err);
          continue;
        }
        this.applyStep(rows, result);
      }
    } catch (err) {
      // A bug in the mechanism: fail everything rather than spin or crash the process.
      const error = err instanceof Error ? err : new Error(String(err));
      for (const seq of [...this.running, ...(this.policy.waiting() as Sequence[])]) {
        this.end(seq, { kind: 'failed', error });
      }
    }
  }

  /** Builds one step. Mutates state: admits, preempts (frees KV, requeues). */
  private planStep(): PlannedRow[] {
    const rows = new Map<Sequence, PlannedRow>();
    let numBudgetTokens = this.maxBatchedTokens;
    let numPlannedBlocks = 0;
    const numFreeBlocks = () => this.handle.numFreeBlocks() - numPlannedBlocks;

    for (const seq of [...this.running]) {
      if (numBudgetTokens === 0) break;
      while (seq.state === 'running') {
        const numHeldBlocks = this.handle.numSequenceBlocks(seq.seqId);
        const numTokensByBlocks = (numHeldBlocks + numFreeBlocks()) * this.blockSize - seq.numComputedTokens;
        const numTokens = Math.min(seq.numKnownTokens - seq.numComputedTokens, numBudgetTokens, numTokensByBlocks);
        if (numTokens >= 1) {
          const numNewBlocks = Math.max(0, this.blocksFor(seq.numComputedTokens + numTokens) - numHeldBlocks);
          rows.set(seq, { seq, numTokens, numNewBlocks });
          numBudgetTokens -= numTokens;
          numPlannedBlocks += numNewBlocks;
          break;
        }
        // Not even one token fits: free the victim's KV and try again (the victim may be seq).
        const victim = this.policy.pickVictim(this.running) as Sequence;
        const victimRow = rows.get(victim);
        if (victimRow) {
          rows.delete(victim);
          numBudgetTokens += victimRow.numTokens;
          numPlannedBlocks -= victimRow.numNewBlocks;
        }
        this.preempt(victim);
      }
    }

    // Admission: policy order; stop at the first that does not fit so none is starved by
    // smaller requests behind it. NOTE: a sequence is admitted only when its whole prompt's
    // blocks are free now, so a running prefill rarely has to preempt anyone.
    while (numBudgetTokens > 0 && this.running.length < this.maxNumSeqs) {
      const seq = this.policy.waiting()[0] as Sequence | undefined;
      if (seq === undefined) break;
      const promptTokenIds = [...seq.request.promptTokenIds, ...seq.generatedTokenIds];
      if (this.blocksFor(promptTokenIds.length) > numFreeBlocks()) break;
      this.admit(seq, promptTokenIds);
      const numTokens = Math.min(promptTokenIds.length, numBudgetTokens);
      const numNewBlocks = this.blocksFor(numTokens);
      rows.set(seq, { seq, numTokens, numNewBlocks });
      numBudgetTokens -= numTokens;
      numPlannedBlocks += numNewBlocks;
    }
    for (const row of rows.values()) {
      if (!row.seq.wasScheduled) {
        row.seq.wasScheduled = true;
        this.callSink(row.seq, () => row.seq.request.sink.onScheduled?.());
      }
    }
    return [...rows.values()].filter((row) => row.seq.state === 'running');
  }

  /** Routes a step's samples. Every planned sequence whose known tokens are now all computed must have sampled. */
  private applyStep(rows: readonly PlannedRow[], result: NativeStepResult): void {
    for (const row of rows) row.seq.numComputedTokens += row.numTokens;
    const { topN } = result;
    for (let i = 0; i < result.seqIds.length; i++) {
      const seq = this.seqIdToSequence.get(result.seqIds[i]!);
      if (seq === undefined) continue;   // ended during the step (disposal)
      const tokenId = result.tokens[i]!;
      seq.numKnownTokens += 1;
      seq.generatedTokenIds.push(tokenId);
      if (seq.cancelRequested) continue;  // reaped before the next step
      const token: SampledToken = {
        tokenId,
        logprob: result.logprobs[i]!,
        topIds: result.topIds.slice(i * topN, (i + 1) * topN),
        topLogprobs: result.topLogprobs.slice(i * topN, (i + 1) * topN),
      };
      let stop = false;
      if (!this.callSink(seq, () => { stop = seq.request.sink.onToken(token); })) continue;
      if (stop || seq.numGeneratedTokens >= seq.request.maxTokens) this.end(seq, { kind: 'finished' });
    }
    for (const row of rows) {
      const seq = row.seq;
      if (seq.state === 'running' && seq.numComputedTokens >= seq.numKnownTokens) {
        this.end(seq, { kind: 'failed', error: new SluiceError('engine_error',
          `the native step computed all ${seq.numKnownTokens} tokens of sequence ${seq.seqId} but returned no sample`) });
      }
    }
  }

  private onStepError(rows: readonly PlannedRow[], err: unknown): void {
    if ((err as { code?: unknown }).code === NO_KV_BLOCKS && this.running.length > 1) {
      // Our block accounting disagreed with the pool (nothing was done): give up the victim's KV.
      this.preempt(this.policy.pickVictim(this.running) as Sequence);
      return;
    }
    const error = new SluiceError('engine_error', `the native engine failed a step: ${(err as Error).message}`, { cause: err });
    for (const row of rows) this.end(row.seq, { kind: 'failed', error });
  }

  /**
   * Nothing could be planned. With nothing running, the waiting head cannot fit in the free
   * pool (blocks held outside this batcher): fail it rather than wait forever.
   */
  private failUnschedulableHead(): void {
    const seq = this.policy.waiting()[0] as Sequence | undefined;
    if (seq === undefined || this.running.length > 0) return;  // a sink ended its sequence; re-plan
    const numTokens = seq.numPromptTokens + seq.numGeneratedTokens;
    this.end(seq, { kind: 'failed', error: new SluiceError('request_too_large',
      `the prompt needs ${this.blocksFor(numTokens)} KV blocks but only ${this.handle.numFreeBlocks()} ` +
      `of ${this.numTotalBlocks} are free with nothing running`) });
  }

  private admit(seq: Sequence, promptTokenIds: readonly number[]): void {
    this.policy.remove(seq);
    while (this.seqIdToSequence.has(this.nextSeqId) || this.nextSeqId === 0) {
      this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    }
    seq.seqId = this.nextSeqId;
    this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    this.handle.addSequence(seq.seqId, Int32Array.from(promptTokenIds), seq.request.sampling);
    seq.state = 'running';
    seq.admittedOrder = this.numAdmissions++;
    seq.numKnownTokens = promptTokenIds.length;
    seq.numComputedTokens = 0;
    this.running.push(seq);
    this.seqIdToSequence.set(seq.seqId, seq);
  }

  /** Frees a running sequence's KV and puts it back in the waiting set; its output is kept. */
  private preempt(seq: Sequence): void {
    this.release(seq);
    seq.state = 'waiting';
    this.policy.enqueue(seq, true);
  }

  /** Running -> not running: frees the native sequence. */
  private release(seq: Sequence): void {
    if (seq.state !== 'running') return;
    this.handle.freeSequence(seq.seqId);
    this.seqIdToSequence.delete(seq.seqId);
    this.running = this.running.filter((s) => s !== seq);
  }

  private reapCancelled(): void {
    for (const seq of [...this.running, ...(this.policy.waiting() as Sequence[])]) {
      if (seq.cancelRequested) this.end(seq, { kind: 'cancelled' });
    }
  }

  private end(seq: Sequence, outcome: SequenceOutcome): void {
    if (seq.state === 'done') return;
    if (seq.state === 'running') this.release(seq);
    else this.policy.remove(seq);
    seq.state = 'done';
    seq.removeAbortListener();
    try {
      seq.request.sink.onEnd(outcome);
    } catch {
      // NOTE: onEnd must not throw; if it does there is no one left to tell.
    }
  }

  /** Runs a sink callback; an exception fails the sequence. Returns false if it threw. */
  private callSink(seq: Sequence, fn: () => void): boolean {
    try {
      fn();
      return true;
    } catch (err) {
      this.end(seq, { kind: 'failed', error: err instanceof Error ? err : new Error(String(err)) });
      return false;
    }
  }

  private blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }
}
