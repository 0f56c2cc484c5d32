// Continuous batching: the loop that turns queued sequences into native steps.
//
// Mechanism (this file's Batcher): plan a step, run it off the JS thread, route sampled tokens to
// their sequences, free finished ones, repeat while there is work. Policy (who is admitted next,
// who is preempted when KV blocks run out) is a separate SchedulingPolicy; FcfsPolicy is the
// default here (first come first served), the Engine uses the completion-window policy
// (src/scheduler/window-policy.ts). A priority scheduler replaces the policy, not the loop.
//
// Each sequence has a priority (0 most urgent; all equal unless the submitter says otherwise).
// Each step carries, within maxBatchedTokens tokens and maxNumSeqs sequences, priority by
// priority (most urgent first):
//   1. the running sequences of that priority, oldest admission first: 1 token if decoding, the
//      next prompt chunk if still prefilling (chunked prefill);
//   2. then waiting sequences of that priority (policy order), each with its first prompt chunk.
// So less urgent work only gets the budget that more urgent work leaves.
// KV accounting: a sequence computing n tokens needs ceil((numComputedTokens + n) / blockSize)
// blocks in all; the step never plans more new blocks than numFreeBlocks(). A running sequence
// that cannot get a block for even one token preempts the policy's victim (its KV is freed; it is
// requeued with prompt + generated tokens as its new prompt and recomputed later). A waiting
// sequence that does not fit (blocks or maxNumSeqs) preempts running sequences of a less urgent
// priority when that makes it fit, never those of its own or a more urgent one.
//
// Failure isolation: whatever goes wrong with one sequence ends that sequence only: a native
// refusal at admission (addSequence throws), a row the step reports as failed (result.errors), an
// exception in its sink. A step that fails as a whole fails its rows; a device fault breaks the
// engine for good: every sequence ends with engine_broken and later submissions are refused.

import type { NativeEngineHandle, NativeStepPlan, NativeStepResult } from './native-types.js';
import { SluiceError } from '../errors.js';
import { FcfsPolicy, type SchedulingPolicy } from './batch-policy.js';
import { Sequence, type SampledToken, type SequenceOutcome, type SequenceRequest } from './sequence.js';
import { TenantShare, tenantKey, type TenantDeferral } from './tenant-share.js';

export { FcfsPolicy, type SchedulingPolicy, type SequenceView } from './batch-policy.js';
export type { SampledToken, SequenceOutcome, SequenceRequest, SequenceSink } from './sequence.js';

export interface BatcherOptions {
  /** Tokens computed per step, prefill chunks and decodes together (default 512). */
  maxBatchedTokens?: number;
  /** Sequences running at once (default 64). */
  maxNumSeqs?: number;
  policy?: SchedulingPolicy;
  /** Keeps steps short for urgent work while background work runs (see DeferralGuard). Default: off. */
  deferral?: DeferralGuard;
  /** Keeps steps short for a light tenant while another floods its window (see tenant-share.ts). Default: off. */
  tenantDeferral?: TenantDeferral;
  /** Milliseconds clock (tests inject one). */
  now?: () => number;
  /** Told once when a device fault puts the engine out of service (the facade logs it). */
  onBroken?: (reason: string) => void;
}

/**
 * Deferral of background work. A step cannot be interrupted, so an urgent request that arrives
 * while a long step of background rows runs waits for it, and then shares its own step with them.
 * While any sequence more urgent than `fromPriority` is running or waiting, or was within the
 * last `holdMs`, sequences of priority >= `fromPriority`:
 *   - get no tokens at all in a step that prefills urgent work;
 *   - otherwise share `rowsPerStep` tokens per step (decode rows, oldest admission first, then
 *     admissions' prefill chunks), so a step never waits on a long background batch.
 * Per-row cost dominates a CPU decode step, so capping rows keeps steps short at little cost to
 * background throughput; once urgent work has been gone for `holdMs`, the caps lift.
 */
export interface DeferralGuard {
  fromPriority: number;
  rowsPerStep: number;
  holdMs: number;
}

/** One row of a step being planned. */
interface PlannedRow {
  seq: Sequence;
  numTokens: number;
  numNewBlocks: number;
}

/** A step while it is being planned. */
interface StepDraft {
  rows: Map<Sequence, PlannedRow>;
  numBudgetTokens: number;
  /** New blocks the rows will take; not yet taken from the pool. */
  numPlannedBlocks: number;
  /** The waiting head did not fit: nothing behind it is admitted this step (no starvation by smaller ones). */
  admissionBlocked: boolean;
  /** Deferral active this step (urgent work present or recent). */
  deferring: boolean;
  /** An urgent (not deferrable) row of this step prefills. */
  urgentPrefill: boolean;
  /** Tokens deferrable rows may still take this step (while deferring). */
  numDeferredTokens: number;
  /** tenantKeys of the tenants that are heavy in their window this step (tenant-share.ts). */
  heavy: ReadonlySet<string>;
  /** A row of a light tenant prefills in this step: heavy rows get no tokens. */
  lightPrefill: boolean;
  /** tenantKey -> tokens its heavy rows took this step. */
  heavyTokens: Map<string, number>;
}

const NO_KV_BLOCKS = 'NO_KV_BLOCKS';
/** Native codes after which the engine serves nothing more (a sticky device fault). */
const BROKEN_CODES = new Set(['DEVICE_FAULT', 'ENGINE_BROKEN']);

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
  /** Why the engine is out of service (a device fault); undefined while it works. */
  private broken: string | undefined;

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
    this.deferral = options.deferral;
    this.now = options.now ?? (() => performance.now());
    this.onBroken = options.onBroken;
    const td = options.tenantDeferral;
    if (td && !(Number.isInteger(td.rowsPerStep) && td.rowsPerStep >= 1 && td.holdMs >= 0)) {
      throw new SluiceError('invalid_argument', 'tenantDeferral.rowsPerStep must be an integer >= 1 and holdMs >= 0', { param: 'tenantDeferral' });
    }
    this.tenantShare = new TenantShare(this.maxNumSeqs, td, this.now);
    if (this.deferral && !(Number.isInteger(this.deferral.rowsPerStep) && this.deferral.rowsPerStep >= 1 && this.deferral.holdMs >= 0)) {
      throw new SluiceError('invalid_argument', 'deferral.rowsPerStep must be an integer >= 1 and deferral.holdMs >= 0', { param: 'deferral' });
    }
  }

  private readonly deferral: DeferralGuard | undefined;
  private readonly now: () => number;
  private readonly onBroken: ((reason: string) => void) | undefined;
  private readonly tenantShare: TenantShare;
  /** When urgent work (priority below deferral.fromPriority) was last running or waiting. */
  private lastUrgentMs = -Infinity;

  /** Whether background work is deferred this step; records urgent work seen now. */
  private deferringNow(): boolean {
    if (!this.deferral) return false;
    const from = this.deferral.fromPriority;
    const now = this.now();
    const waiting = this.policy.waiting() as readonly Sequence[];
    if (this.running.some((s) => s.priority < from) || waiting.some((s) => s.priority < from)) this.lastUrgentMs = now;
    const anyDeferrable = this.running.some((s) => s.priority >= from) || waiting.some((s) => s.priority >= from);
    return anyDeferrable && now - this.lastUrgentMs <= this.deferral.holdMs;
  }

  private deferrable(seq: Sequence, step: StepDraft): boolean {
    return step.deferring && seq.priority >= this.deferral!.fromPriority;
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
    if (this.broken !== undefined) throw this.brokenError();
    if (request.promptTokenIds.length === 0) {
      throw new SluiceError('invalid_request', 'the prompt must have at least one token', { param: 'prompt' });
    }
    if (request.priority !== undefined && !(Number.isInteger(request.priority) && request.priority >= 0)) {
      throw new SluiceError('invalid_request', `priority must be an integer >= 0, got ${String(request.priority)}`, { param: 'priority' });
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

  /** Why the engine is out of service after a device fault; undefined while it works. */
  get brokenReason(): string | undefined {
    return this.broken;
  }

  private brokenError(): SluiceError {
    return new SluiceError('engine_broken',
      'the model is out of service after an engine fault; the operator has been notified (retry later or use another model)');
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
    return !this.disposed && this.broken === undefined && (this.running.length > 0 || this.policy.waiting().length > 0);
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
  /** Tells the policy which prompt cache keys are hot: those of running sequences. */
  private shareHotKeys(): void {
    if (!this.policy.setHotKeys) return;
    const keys = new Set<string>();
    for (const seq of this.running) if (seq.promptCacheKey !== undefined) keys.add(seq.promptCacheKey);
    this.policy.setHotKeys(keys);
  }

  private planStep(): PlannedRow[] {
    this.shareHotKeys();
    const step: StepDraft = {
      rows: new Map(), numBudgetTokens: this.maxBatchedTokens, numPlannedBlocks: 0, admissionBlocked: false,
      deferring: this.deferringNow(), urgentPrefill: false, numDeferredTokens: this.deferral?.rowsPerStep ?? 0,
      heavy: this.tenantShare.heavyThisStep(this.running, this.policy.waiting()), lightPrefill: false, heavyTokens: new Map(),
    };
    const isHeavy = (s: Sequence) => step.heavy.size > 0 && step.heavy.has(tenantKey(s));
    // Stable sort: with equal priorities this is admission order; a window's light tenants first.
    const byPriority = [...this.running].sort((a, b) => a.priority - b.priority ||
      Number(isHeavy(a)) - Number(isHeavy(b)) || a.admittedOrder - b.admittedOrder);
    let lightAdmittedAt = -1;
    for (const seq of byPriority) {
      // More urgent waiting sequences come before this one (and may preempt it).
      this.admitWaiting(step, seq.priority);
      if (step.numBudgetTokens === 0) break;
      // A sequence preempted and re-admitted within this step already has its admission row.
      if (step.rows.has(seq) || seq.state !== 'running') continue;
      if (this.deferrable(seq, step)) {
        this.withDeferredCap(step, () => this.planRunning(step, seq));
        continue;
      }
      if (isHeavy(seq)) {
        // Light tenants' waiting requests of this window go before the heavy tenant's rows.
        if (lightAdmittedAt !== seq.priority) this.admitLight(step, seq.priority, isHeavy);
        lightAdmittedAt = seq.priority;
        this.withTenantCap(step, seq, () => this.planRunning(step, seq));
        continue;
      }
      this.planRunning(step, seq);
      if ((step.rows.get(seq)?.numTokens ?? 0) > 1) step.urgentPrefill = step.lightPrefill = true;
    }
    this.admitWaiting(step, Infinity);
    for (const row of step.rows.values()) {
      if (!row.seq.wasScheduled) {
        row.seq.wasScheduled = true;
        this.callSink(row.seq, () => row.seq.request.sink.onScheduled?.(row.seq.numCachedPromptTokens));
      }
    }
    return [...step.rows.values()].filter((row) => row.seq.state === 'running');
  }

  /** Plans a running sequence's next tokens; preempts the policy's victim while not even one token fits. */
  private planRunning(step: StepDraft, seq: Sequence): void {
    while (seq.state === 'running') {
      const numHeldBlocks = this.handle.numSequenceBlocks(seq.seqId);
      const numTokensByBlocks = (numHeldBlocks + this.numFreeBlocks(step)) * this.blockSize - seq.numComputedTokens;
      const numTokens = Math.min(seq.numKnownTokens - seq.numComputedTokens, step.numBudgetTokens, numTokensByBlocks);
      if (numTokens >= 1) {
        const numNewBlocks = Math.max(0, this.blocksFor(seq.numComputedTokens + numTokens) - numHeldBlocks);
        step.rows.set(seq, { seq, numTokens, numNewBlocks });
        step.numBudgetTokens -= numTokens;
        step.numPlannedBlocks += numNewBlocks;
        return;
      }
      // Not even one token fits: free the victim's KV and try again (the victim may be seq).
      const victim = this.policy.pickVictim(this.running) as Sequence;
      this.unplan(step, victim);
      this.preempt(victim);
    }
  }

  /**
   * Admits from the front of the waiting order while the head is more urgent than
   * `belowPriority` and fits; stops at the first that does not fit so none is starved by smaller
   * or less urgent requests behind it. NOTE: a sequence is admitted only when its whole prompt's
   * blocks are free now, so a running prefill rarely has to preempt anyone.
   */
  private admitWaiting(step: StepDraft, belowPriority: number): void {
    while (!step.admissionBlocked && step.numBudgetTokens > 0) {
      const seq = this.policy.waiting()[0] as Sequence | undefined;
      if (seq === undefined || seq.priority >= belowPriority) return;
      if (this.deferrable(seq, step)) {
        this.withDeferredCap(step, () => this.admitHead(step, seq));
        return;
      }
      if (step.heavy.size > 0 && step.heavy.has(tenantKey(seq))) {
        this.withTenantCap(step, seq, () => this.admitHead(step, seq));
        return;
      }
      if (!this.admitHead(step, seq)) return;
    }
  }

  /**
   * Admits the waiting requests of light tenants in `priority`, in the policy's order, while they
   * fit: before the heavy tenant's rows take the step (they may pass the heavy tenant's waiting
   * requests; that is the point of sharing the window).
   */
  private admitLight(step: StepDraft, priority: number, isHeavy: (s: Sequence) => boolean): void {
    for (const seq of [...this.policy.waiting()] as Sequence[]) {
      if (step.admissionBlocked || step.numBudgetTokens === 0) return;
      if (seq.priority !== priority || isHeavy(seq) || seq.state !== 'waiting') continue;
      if (!this.admitHead(step, seq)) return;
    }
  }

  /** Runs `plan` for a heavy tenant's row within its per-step allowance (none once a light row prefills). */
  private withTenantCap(step: StepDraft, seq: Sequence, plan: () => void): void {
    const key = tenantKey(seq);
    const allowance = this.tenantShare.rowsPerStep - (step.heavyTokens.get(key) ?? 0);
    const cap = step.lightPrefill ? 0 : Math.min(step.numBudgetTokens, allowance);
    if (cap <= 0) return;
    const saved = step.numBudgetTokens;
    step.numBudgetTokens = cap;
    plan();
    const used = cap - step.numBudgetTokens;
    step.numBudgetTokens = saved - used;
    step.heavyTokens.set(key, (step.heavyTokens.get(key) ?? 0) + used);
  }

  /**
   * Runs `plan` with the step's budget capped to what deferred work may still take (nothing once
   * urgent work prefills in this step), and charges what it used to both budgets.
   */
  private withDeferredCap(step: StepDraft, plan: () => void): void {
    const cap = step.urgentPrefill ? 0 : Math.min(step.numBudgetTokens, step.numDeferredTokens);
    if (cap === 0) return;
    const saved = step.numBudgetTokens;
    step.numBudgetTokens = cap;
    plan();
    const used = cap - step.numBudgetTokens;
    step.numBudgetTokens = saved - used;
    step.numDeferredTokens -= used;
  }

  /** Admits the waiting head with its first prompt chunk; false (and admission blocked) when it does not fit. */
  private admitHead(step: StepDraft, seq: Sequence): boolean {
    const promptTokenIds = [...seq.request.promptTokenIds, ...seq.generatedTokenIds];
    if (!this.makeRoom(step, seq, this.blocksFor(promptTokenIds.length))) {
      step.admissionBlocked = true;
      return false;
    }
    // Refused by the engine: that sequence has ended; admission goes on with the next.
    if (!this.admit(seq, promptTokenIds)) return true;
    if (seq.promptCacheKey !== undefined) this.shareHotKeys();
    // A prefix-cache hit starts the sequence after its cached blocks (already in its block table).
    const numTokens = Math.min(promptTokenIds.length - seq.numComputedTokens, step.numBudgetTokens);
    if (numTokens > 1 && !this.deferrable(seq, step)) {
      step.urgentPrefill = true;
      if (!step.heavy.has(tenantKey(seq))) step.lightPrefill = true;
    }
    const numNewBlocks = this.blocksFor(seq.numComputedTokens + numTokens) - this.handle.numSequenceBlocks(seq.seqId);
    step.rows.set(seq, { seq, numTokens, numNewBlocks });
    step.numBudgetTokens -= numTokens;
    step.numPlannedBlocks += numNewBlocks;
    return true;
  }

  /**
   * Whether `seq` (waiting) can be admitted with `numBlocks` blocks, after preempting running
   * sequences of a less urgent priority, or of another tenant holding more than its fair share of
   * seq's priority while seq's tenant holds less, if that makes it fit. Preempts nobody when even
   * all of them would not be enough: their recompute would buy nothing.
   */
  private makeRoom(step: StepDraft, seq: Sequence, numBlocks: number): boolean {
    const fits = () => this.running.length < this.maxNumSeqs && numBlocks <= this.numFreeBlocks(step);
    if (fits()) return true;
    const lessUrgent = () => this.running.filter((s) => s.priority > seq.priority ||
      this.tenantShare.overFairShare(s, seq, this.running, this.policy.waiting()));
    const candidates = lessUrgent();
    let numReclaimableBlocks = 0;
    for (const s of candidates) {
      numReclaimableBlocks += this.handle.numSequenceBlocks(s.seqId) + (step.rows.get(s)?.numNewBlocks ?? 0);
    }
    if (candidates.length === 0 || this.running.length - candidates.length >= this.maxNumSeqs ||
        numBlocks > this.numFreeBlocks(step) + numReclaimableBlocks) {
      return false;
    }
    for (let victims = candidates; !fits() && victims.length > 0; victims = lessUrgent()) {
      const victim = this.policy.pickVictim(victims) as Sequence;
      if (!victims.includes(victim)) throw new Error('SchedulingPolicy.pickVictim returned a sequence it was not offered');
      this.unplan(step, victim);
      this.preempt(victim);
    }
    return fits();
  }

  /** Takes a sequence's row (if any) out of the step, returning its tokens and blocks. */
  private unplan(step: StepDraft, seq: Sequence): void {
    const row = step.rows.get(seq);
    if (row === undefined) return;
    step.rows.delete(seq);
    step.numBudgetTokens += row.numTokens;
    step.numPlannedBlocks -= row.numNewBlocks;
  }

  private numFreeBlocks(step: StepDraft): number {
    return this.handle.numFreeBlocks() - step.numPlannedBlocks;
  }

  /** Routes a step's samples. Every planned sequence whose known tokens are now all computed must have sampled. */
  private applyStep(rows: readonly PlannedRow[], result: NativeStepResult): void {
    for (const row of rows) row.seq.numComputedTokens += row.numTokens;
    // Rows that failed on their own end their sequence only.
    for (const e of result.errors ?? []) {
      const seq = this.seqIdToSequence.get(e.seqId);
      if (seq === undefined) continue;
      this.end(seq, { kind: 'failed', error: new SluiceError('engine_error',
        `the native engine failed this sequence (${e.code}): ${e.message}`) });
    }
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
    const code = (err as { code?: unknown }).code;
    if (typeof code === 'string' && BROKEN_CODES.has(code)) {
      this.markBroken(String((err as Error).message));
      return;
    }
    if (code === NO_KV_BLOCKS && this.running.length > 1) {
      // Our block accounting disagreed with the pool (nothing was done): give up the victim's KV.
      this.preempt(this.policy.pickVictim(this.running) as Sequence);
      return;
    }
    const error = new SluiceError('engine_error', `the native engine failed a step: ${(err as Error).message}`, { cause: err });
    for (const row of rows) this.end(row.seq, { kind: 'failed', error });
  }

  /**
   * The engine cannot serve anything more: every sequence ends with engine_broken, the loop stops
   * and submit() refuses new work.
   */
  private markBroken(reason: string): void {
    this.broken = reason;
    this.onBroken?.(reason);
    const error = this.brokenError();
    // NOTE: freeSequence stays allowed on a broken engine (it only returns host bookkeeping).
    for (const seq of [...this.running, ...(this.policy.waiting() as Sequence[])]) this.end(seq, { kind: 'failed', error });
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

  /** Registers seq with the engine; false (seq ended as failed) when the engine refuses it. */
  private admit(seq: Sequence, promptTokenIds: readonly number[]): boolean {
    this.policy.remove(seq, true);
    while (this.seqIdToSequence.has(this.nextSeqId) || this.nextSeqId === 0) {
      this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    }
    seq.seqId = this.nextSeqId;
    this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    // NOTE: makeRoom checked blocksFor(whole prompt) <= free; a hit takes k cached blocks (at most
    // k of them from the free count) and saves k new ones, so the step still fits.
    let numCachedTokens: number;
    try {
      numCachedTokens = this.handle.addSequence(seq.seqId, Int32Array.from(promptTokenIds), seq.request.sampling,
        seq.request.keyed ?? false, seq.request.tenant ?? '');
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (typeof code === 'string' && BROKEN_CODES.has(code)) {
        this.markBroken(String((err as Error).message));
        this.end(seq, { kind: 'failed', error: this.brokenError() });
        return false;
      }
      const error = code === 'INVALID_ARGUMENT'
        ? new SluiceError('invalid_request', `the engine refused the request: ${(err as Error).message}`, { cause: err })
        : new SluiceError('engine_error', `the native engine refused the sequence: ${(err as Error).message}`, { cause: err });
      this.end(seq, { kind: 'failed', error });
      return false;
    }
    if (!seq.wasScheduled) seq.numCachedPromptTokens = numCachedTokens;
    seq.state = 'running';
    seq.admittedOrder = this.numAdmissions++;
    seq.numKnownTokens = promptTokenIds.length;
    seq.numComputedTokens = numCachedTokens;
    this.running.push(seq);
    this.seqIdToSequence.set(seq.seqId, seq);
    return true;
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
