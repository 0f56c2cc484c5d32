// Continuous batching: the loop that turns queued sequences into native steps.
//
// Mechanism (this file's Batcher): plan a step (planner.ts), submit it, apply the step's result
// (route sampled tokens to their sequences, end finished ones), repeat while there is work. Policy
// (who is admitted next, who is preempted when KV blocks run out) is a SchedulingPolicy; FcfsPolicy
// is the default here, the Engine uses the completion-window policy (window-policy.ts).
//
// One plan in, one result out: each step is one NativeStepPlan (frees, adds, rows) and one
// NativeStepResult (samples, per-row and per-add status, the pool's counts). Nothing native is
// called while planning.
//
// Overlap (default): step N+1 is planned and submitted while step N runs, assuming N's sequences
// continue; the engine queues it and starts it as soon as N ends, without waiting for this thread.
// Then N's result is applied. What N+1 could not know is corrected by the engine or the next plan:
//   - a sequence that stopped in N (a stop string, a sink's stop, a cancellation) has one more row
//     in N+1; its token is dropped and the next plan frees it;
//   - a row bound is an upper bound: the engine computes what is actually left (a prefix hit);
//   - an add or row that did not fit comes back as a value: the sequence waits or is re-planned;
//   - a sequence preempted while its row is in flight loses that row's token, and samples the
//     same one again when recomputed (the draw depends only on the seed and the position).
// So outputs are the same as the serial loop's (overlap: false), token for token.
//
// Failure isolation: whatever goes wrong with one sequence ends that sequence only: an add the
// engine refuses, a row it reports as failed, an exception in its sink. A step that fails as a
// whole fails its sequences; a device fault breaks the engine for good: every sequence ends with
// engine_broken and later submissions are refused.

import type { NativeEngineHandle, NativeStepResult } from '../native/native-types.js';
import { ADD_ADMITTED, ADD_NO_KV_BLOCKS, ROW_FAILED, ROW_RAN } from '../native/native-types.js';
import { SluiceError } from '../errors.js';
import { Planner, type DeferralGuard, type PlannedStep } from './planner.js';
import { FcfsPolicy, type SchedulingPolicy } from './policy.js';
import { Roster } from './roster.js';
import { Sequence, type SampledToken, type SequenceOutcome, type SequenceRequest } from './sequence.js';
import type { TenantDeferral } from './tenant-share.js';
import { Speculator, type SpeculativeOptions, type SpeculationStats } from './speculator.js';
import { Eagle3Speculator } from './eagle3-speculator.js';

export { FcfsPolicy, type SchedulingPolicy, type SequenceView } from './policy.js';
export type { DeferralGuard } from './planner.js';
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
  /**
   * Fraction of its even share of maxNumSeqs that each tenant keeps running against other tenants'
   * more urgent windows (tenant-share.ts; default 0.25). 0: windows are strict priority between tenants.
   */
  windowFloorShare?: number;
  /** Milliseconds clock (tests inject one). */
  now?: () => number;
  /** Told once when a device fault puts the engine out of service (the facade logs it). */
  onBroken?: (reason: string) => void;
  /** Plan step N+1 while step N runs (default true); false: plan only after each step's result. */
  overlap?: boolean;
  /**
   * Speculative decoding (speculator.ts): decode rows carry drafts the engine verifies. The engine
   * must verify drafts (info().draftVerification), else invalid_argument. Default: off.
   */
  speculative?: SpeculativeOptions;
  /**
   * Speculative decoding with this speculator (its proposals), instead of one made from
   * `speculative` (a draft model's: draft-speculator.ts). The batcher disposes it.
   */
  speculator?: Speculator;
  /**
   * Told after each step's result is applied (metrics, the engine's periodic log line). Called on
   * this thread between steps; it must be cheap, and what it throws is ignored.
   */
  onStep?: (report: StepReport) => void;
}

/** What one step did, as the step loop saw it. */
export interface StepReport {
  /**
   * Milliseconds from when the engine could start the step (its submission, or the end of the step
   * before it) to its result reaching this thread.
   */
  durationMs: number;
  /** Rows the plan sent. */
  numRows: number;
  /** Tokens the engine computed: prompt chunks and decodes. */
  numComputedTokens: number;
  /** Of those, the tokens of rows that were prefilling (a prompt, or a recompute after a preemption). */
  numPrefillTokens: number;
  /** Tokens sampled (a verifying row's accepted drafts and its own token included). */
  numSampledTokens: number;
  /** Speculative decoding: rows that verified drafts, the drafts, and of those, accepted. */
  numVerifyingRows: number;
  numDraftTokens: number;
  numAcceptedTokens: number;
  /** [p] priority of each running sequence the step's plan preempted. */
  preempted: readonly number[];
  /** False when the step failed as a whole (its token counts are then 0). */
  ok: boolean;
}

/** The KV pool as the last step result reported it (the engine's counts; never recounted here). */
export interface KvPoolCounts {
  numTotalBlocks: number;
  /** Blocks an allocation can get: empty ones and evictable cached ones. */
  numFreeBlocks: number;
  /** Cached prefix blocks no sequence holds (counted in numFreeBlocks too). */
  numEvictableBlocks: number;
  /** Every block in the prefix cache, held or not. */
  numCachedBlocks: number;
}

/** What the step loop has done so far. */
export interface LoopStats {
  /** Steps submitted. */
  numSteps: number;
  /** Milliseconds this thread spent planning, submitting and applying results (not waiting for steps). */
  loopMs: number;
  /** Speculative decoding: drafts verified and accepted so far (absent without it). */
  speculation?: SpeculationStats;
}

/** A submitted step and its outcome once it settles. */
interface Submitted {
  serial: number;
  /** When it was submitted (the engine starts it then, or when the step before it ends). */
  submittedAtMs: number;
  planned: PlannedStep;
  /** atMs: when the outcome reached this thread. */
  settled: Promise<({ result: NativeStepResult } | { error: unknown }) & { atMs: number }>;
  /** Its constrained rows, whose token masks it waits for (provideMasks). */
  constrained?: { seq: Sequence; seqId: number; drafts: readonly number[] }[];
}

const NO_IDS = new Int32Array(0);
const NO_LOGPROBS = new Float32Array(0);

/** Native codes after which the engine serves nothing more (a sticky device fault). */
const BROKEN_CODES = new Set(['DEVICE_FAULT', 'ENGINE_BROKEN']);

export class Batcher {
  readonly maxBatchedTokens: number;
  readonly maxNumSeqs: number;
  private readonly blockSize: number;
  private readonly numTotalBlocks: number;
  private readonly roster: Roster;
  private readonly planner: Planner;
  private readonly overlap: boolean;
  private readonly now: () => number;
  private readonly onBroken: ((reason: string) => void) | undefined;
  private readonly onStep: ((report: StepReport) => void) | undefined;
  /** When the last step's outcome arrived: the engine starts a step queued behind it then. */
  private lastStepEndMs = -Infinity;
  private pool: KvPoolCounts;
  private numArrivals = 0;
  private loop: Promise<void> | undefined;
  private disposed = false;
  /** Why the engine is out of service (a device fault); undefined while it works. */
  private broken: string | undefined;
  private numSteps = 0;
  private loopMs = 0;
  /** Estimated blocks taken by submitted steps that have not reported yet. */
  private inFlightNetBlocks = 0;
  /** Mask slots (step serials) of submitted steps still waiting for their token masks. */
  private readonly masksOwed = new Set<number>();
  /** Words of one token-mask row: ceil(vocab / 32). */
  private readonly maskWords: number;
  private readonly speculator: Speculator | undefined;

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
    this.maskWords = Math.ceil(info.vocabSize / 32);
    this.blockSize = info.blockSize;
    this.numTotalBlocks = info.numBlocks;
    this.now = options.now ?? (() => performance.now());
    this.onBroken = options.onBroken;
    this.onStep = options.onStep;
    this.pool = { numTotalBlocks: this.numTotalBlocks, numFreeBlocks: this.numTotalBlocks, numEvictableBlocks: 0, numCachedBlocks: 0 };
    this.overlap = options.overlap ?? true;
    this.roster = new Roster(options.policy ?? new FcfsPolicy(), this.blockSize);
    if (options.speculative !== undefined || options.speculator !== undefined) {
      if (!info.draftVerification) {
        throw new SluiceError('invalid_argument',
          `speculative decoding needs an engine that verifies drafts (the CPU backend, or CUDA with the block sampler and ` +
          `serial steps); this ${info.backend} engine does not`,
          { param: 'speculative' });
      }
      if (options.speculator === undefined && options.speculative?.method === 'draft') {
        throw new SluiceError('invalid_argument', 'a draft model speculates through Engine.load (or a DraftModelSpeculator given as speculator)',
          { param: 'speculative' });
      }
      if (options.speculator === undefined && options.speculative?.method === 'eagle3' && info.eagle3 === undefined) {
        throw new SluiceError('invalid_argument', 'EAGLE-3 speculation needs an engine loaded with its head (eagle3Dir)', { param: 'speculative' });
      }
      this.speculator = options.speculator ??
        (options.speculative!.method === 'eagle3' ? new Eagle3Speculator(options.speculative!) : new Speculator(options.speculative!));
    }
    this.planner = new Planner(this.roster, {
      maxBatchedTokens: this.maxBatchedTokens, maxNumSeqs: this.maxNumSeqs, deferral: options.deferral,
      tenantDeferral: options.tenantDeferral, windowFloorShare: options.windowFloorShare, speculator: this.speculator, now: this.now,
    }, this.numTotalBlocks);
  }

  get numRunning(): number {
    return this.roster.running.length;
  }
  get numWaiting(): number {
    return this.roster.waiting().length;
  }
  get stats(): LoopStats {
    return { numSteps: this.numSteps, loopMs: this.loopMs, ...(this.speculator && { speculation: { ...this.speculator.stats } }) };
  }

  /** The KV pool after the last step that reported (all blocks free before the first). */
  get kvPool(): KvPoolCounts {
    return { ...this.pool };
  }

  /** Running and waiting sequences per priority ([priority] -> count; absent priorities are 0). */
  countsByPriority(): { running: number[]; waiting: number[] } {
    const running: number[] = [];
    const waiting: number[] = [];
    for (const seq of this.roster.running) running[seq.priority] = (running[seq.priority] ?? 0) + 1;
    for (const seq of this.roster.waiting()) waiting[seq.priority] = (waiting[seq.priority] ?? 0) + 1;
    return { running, waiting };
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
    if (this.roster.blocksFor(numKvTokens) > this.numTotalBlocks) {
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
    this.roster.policy.enqueue(seq, false);
    this.kick();
  }

  /**
   * Stops the loop after the steps in flight (never frees native sequences mid-step), then ends
   * every sequence as failed: engine_disposed. Safe to call twice.
   */
  async dispose(): Promise<void> {
    this.disposed = true;
    await this.loop;
    this.speculator?.dispose();
    const error = new SluiceError('engine_disposed', 'the engine was disposed before the request finished');
    for (const seq of this.roster.all()) this.roster.end(seq, { kind: 'failed', error });
    // Leave no native sequence behind (an embedder may keep the handle).
    const frees = this.roster.pendingFrees;
    this.roster.pendingFrees = [];
    if (frees.length > 0 && this.broken === undefined) {
      await this.handle.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.from(frees) })
        .catch(() => {});
    }
  }

  /** Resolves once the loop has nothing left to do (every ended sequence freed in the engine). */
  async idle(): Promise<void> {
    while (this.loop !== undefined) await this.loop;
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
    return !this.disposed && this.broken === undefined &&
      (this.roster.running.length > 0 || this.roster.waiting().length > 0 || this.roster.pendingFrees.length > 0);
  }

  private async runLoop(): Promise<void> {
    let inFlight: Submitted | undefined;
    try {
      for (;;) {
        let next: Submitted | undefined;
        if (this.hasWork() && (this.overlap || inFlight === undefined)) {
          // A draft model proposes before the plan, from the tokens every step so far has given.
          if (inFlight === undefined && this.speculator?.prepare) await this.speculator.prepare(this.roster.running);
          const t0 = this.now();
          this.reapCancelled();
          const planned = this.planner.plan();
          if (planned !== undefined) next = this.submitStep(planned);
          // With nothing before it, the step's constrained rows already know their last token.
          if (next !== undefined && inFlight === undefined) this.provideMasks(next);
          this.loopMs += this.now() - t0;
        }
        if (inFlight !== undefined) {
          const outcome = await inFlight.settled;
          const t0 = this.now();
          this.finishStep(inFlight, outcome);
          // The step after it waits for masks that depend on the tokens just applied.
          if (next !== undefined) this.provideMasks(next);
          this.loopMs += this.now() - t0;
          inFlight = next;
          continue;
        }
        if (next !== undefined) {
          inFlight = next;
          continue;
        }
        if (!this.hasWork()) break;
        // Nothing could be planned and nothing runs: the waiting head cannot ever fit.
        if (!this.failUnschedulableHead()) await new Promise((resolve) => setImmediate(resolve));
      }
    } catch (err) {
      // A bug in the mechanism: fail everything rather than spin or crash the process.
      for (const slot of this.masksOwed) this.handle.provideMasks(slot, null);
      this.masksOwed.clear();
      if (inFlight !== undefined) await inFlight.settled;
      const error = err instanceof Error ? err : new Error(String(err));
      for (const seq of this.roster.all()) this.roster.end(seq, { kind: 'failed', error });
    }
  }

  private submitStep(planned: PlannedStep): Submitted {
    const serial = ++this.numSteps;
    for (const row of planned.rows) row.seq.inFlight.push({ step: serial, numTokens: row.numTokens });
    this.planner.freeBlocks -= planned.netBlocks;
    this.inFlightNetBlocks += planned.netBlocks;
    const constrained: { seq: Sequence; seqId: number; drafts: readonly number[] }[] = [];
    planned.rows.forEach((row, i) => {
      if (row.seq.request.constraint !== undefined) constrained.push({ seq: row.seq, seqId: planned.plan.seqIds[i]!, drafts: row.drafts ?? [] });
    });
    if (constrained.length > 0) {
      planned.plan.constrained = Uint32Array.from(constrained, (c) => c.seqId);
      planned.plan.maskSlot = serial;
    }
    let settled: Submitted['settled'];
    try {
      settled = this.handle.step(planned.plan).then((result) => ({ result, atMs: this.now() }), (error: unknown) => ({ error, atMs: this.now() }));
      if (constrained.length > 0) this.masksOwed.add(serial);
    } catch (error) {
      settled = Promise.resolve({ error, atMs: this.now() });
    }
    return { serial, submittedAtMs: this.now(), planned, settled, ...(constrained.length > 0 && { constrained }) };
  }

  /**
   * Computes the token masks of a submitted step's constrained rows (each sequence's grammar
   * after every token applied so far) and hands them to the engine, which waits for them after
   * its forward pass. Rows of sequences that ended meanwhile get an all-allowing mask (their
   * token is dropped). On any failure the engine is told that no masks come (those rows fail).
   */
  private provideMasks(step: Submitted): void {
    const rows = step.constrained;
    if (rows === undefined || !this.masksOwed.has(step.serial)) return;
    const words = this.maskWords;
    // A row verifying drafts takes one mask per logit row: after its pending token and each draft.
    const offsets: number[] = [];
    let total = 0;
    for (const row of rows) {
      offsets.push(total * words);
      total += 1 + row.drafts.length;
    }
    const masks = new Uint32Array(total * words);
    // All rows asked at once: the grammar engine answers a step's masks in one go.
    const fill = () => Promise.all(rows.map(({ seq, seqId, drafts }, i) => {
      const at = offsets[i]!;
      if (!this.owns(seq, seqId) || seq.cancelRequested) {
        masks.fill(0xffffffff, at, at + (1 + drafts.length) * words);
        return undefined;
      }
      const constraint = seq.request.constraint!;
      return drafts.length > 0 ? constraint.fillMasksAhead!(drafts, masks, at) : constraint.fillMask(masks, at);
    }));
    fill().then(() => this.settleMasks(step.serial, masks), () => this.settleMasks(step.serial, null));
  }

  private settleMasks(slot: number, masks: Uint32Array | null): void {
    if (!this.masksOwed.delete(slot)) return;
    try {
      this.handle.provideMasks(slot, masks);
    } catch {
      // The handle was disposed (its waiting steps were released) or refused the size: the step's
      // constrained rows fail on their own.
    }
  }

  private finishStep(step: Submitted, outcome: Awaited<Submitted['settled']>): void {
    for (const row of step.planned.rows) {
      const at = row.seq.inFlight.findIndex((r) => r.step === step.serial);
      if (at >= 0) row.seq.inFlight.splice(at, 1);
    }
    this.inFlightNetBlocks -= step.planned.netBlocks;
    const startMs = Math.max(step.submittedAtMs, this.lastStepEndMs);
    this.lastStepEndMs = outcome.atMs;
    const report: StepReport = {
      durationMs: Math.max(0, outcome.atMs - startMs), numRows: step.planned.rows.length, numComputedTokens: 0,
      numPrefillTokens: 0, numSampledTokens: 0, numVerifyingRows: 0, numDraftTokens: 0, numAcceptedTokens: 0, preempted: step.planned.preempted,
      ok: !('error' in outcome),
    };
    if ('error' in outcome) {
      this.onStepError(step.planned, outcome.error);
    } else {
      const { result } = outcome;
      Object.assign(report, this.applyStep(step.planned, result, step.submittedAtMs));
      report.numSampledTokens = result.seqIds.length;
      this.pool = {
        numTotalBlocks: this.numTotalBlocks, numFreeBlocks: result.numFreeBlocks,
        numEvictableBlocks: result.numEvictableBlocks, numCachedBlocks: result.numCachedBlocks,
      };
      // The engine's count, less what the steps submitted since will take.
      this.planner.freeBlocks = result.numFreeBlocks - this.inFlightNetBlocks;
    }
    try {
      this.onStep?.(report);
    } catch {
      // An observer's failure is not the step's.
    }
  }

  /** Whether the plan's row or add i still belongs to `seq` (not ended, preempted or re-admitted since). */
  private owns(seq: Sequence, seqId: number): boolean {
    return seq.state === 'running' && seq.seqId === seqId;
  }

  /** Applies a step's result: admissions, rows, then samples. Returns the tokens its rows computed. */
  private applyStep(planned: PlannedStep, result: NativeStepResult, submittedAtMs: number):
    { numComputedTokens: number; numPrefillTokens: number; numVerifyingRows: number; numDraftTokens: number; numAcceptedTokens: number } {
    let numComputedTokens = 0;
    let numPrefillTokens = 0;
    let numVerifyingRows = 0;
    let numDraftTokens = 0;
    let numAcceptedTokens = 0;
    const { plan } = planned;
    const errors = new Map<number, { code: string; message: string }>();
    for (const e of result.errors) if (!errors.has(e.seqId)) errors.set(e.seqId, e);
    const failWith = (seq: Sequence, what: string) => {
      const e = errors.get(seq.seqId);
      const error = e?.code === 'INVALID_ARGUMENT'
        ? new SluiceError('invalid_request', `the engine refused the request: ${e.message}`)
        : new SluiceError('engine_error', `the native engine failed this sequence${e ? ` (${e.code}): ${e.message}` : ` (${what})`}`);
      this.roster.end(seq, { kind: 'failed', error });
    };

    planned.adds.forEach((seq, a) => {
      if (!this.owns(seq, plan.adds![a]!.seqId)) return;
      const status = result.addStatus[a];
      if (status === ADD_ADMITTED) {
        const cached = result.addCached[a]!;
        seq.reportedComputed = cached;
        seq.reportedPending = plan.adds![a]!.promptTokens.length - cached;
        if (!seq.wasScheduled) {
          seq.wasScheduled = true;
          seq.numCachedPromptTokens = cached;
          this.callSink(seq, () => seq.request.sink.onScheduled?.(cached, submittedAtMs));
        }
      } else if (status === ADD_NO_KV_BLOCKS) {
        this.roster.requeue(seq);  // waits for room; the planner admits it again
      } else {
        failWith(seq, 'refused at admission');
      }
    });

    planned.rows.forEach((row, i) => {
      const seq = row.seq;
      const status = result.rowStatus[i];
      if (status === ROW_RAN) numComputedTokens += result.rowComputed[i]!;
      const drafted = result.rowDrafted?.[i] ?? 0, accepted = result.rowAccepted?.[i] ?? 0;
      if (drafted > 0) numVerifyingRows++;
      numDraftTokens += drafted;
      numAcceptedTokens += accepted;
      this.speculator?.record(seq, drafted, accepted);
      if (!this.owns(seq, plan.seqIds[i]!)) return;
      if (status === ROW_RAN) {
        // More than the one sampled token left to compute: the row was prefilling.
        if (seq.reportedPending > 1) numPrefillTokens += result.rowComputed[i]!;
        seq.reportedComputed += result.rowComputed[i]!;
        seq.reportedPending = result.rowPending[i]!;
        seq.reportedBlocks = result.rowBlocks[i]!;
      } else if (status === ROW_FAILED) {
        failWith(seq, 'row failed');
      }
      // ROW_NO_KV_BLOCKS: nothing was done; the next plan makes room (or preempts it).
    });

    const { topN } = result;
    for (let i = 0; i < result.seqIds.length; i++) {
      const seq = this.roster.bySeqId.get(result.seqIds[i]!);
      if (seq === undefined) continue;  // ended, preempted or refused meanwhile: its token is dropped
      const tokenId = result.tokens[i]!;
      seq.generatedTokenIds.push(tokenId);
      if (seq.cancelRequested) continue;  // reaped before the next step
      const constraint = seq.request.constraint;
      if (constraint !== undefined && !constraint.accept(tokenId)) {
        this.roster.end(seq, { kind: 'failed', error: constraint.failure ?? new SluiceError('engine_error',
          `the engine sampled token ${tokenId}, which the output grammar does not allow`) });
        continue;
      }
      const token: SampledToken = {
        tokenId,
        logprob: result.logprobs[i]!,
        // Views, not copies: a result's arrays are never reused, and 256 rows a step add up.
        topIds: topN === 0 ? NO_IDS : result.topIds.subarray(i * topN, (i + 1) * topN),
        topLogprobs: topN === 0 ? NO_LOGPROBS : result.topLogprobs.subarray(i * topN, (i + 1) * topN),
      };
      let stop = false;
      if (!this.callSink(seq, () => { stop = seq.request.sink.onToken(token); })) continue;
      if (stop || seq.numGeneratedTokens >= seq.request.maxTokens) this.roster.end(seq, { kind: 'finished' });
    }
    // EAGLE-3: the drafts the engine made for each row, to follow the tokens just applied.
    if (result.rowNextDrafts !== undefined && result.nextDrafts !== undefined && this.speculator?.receive) {
      let at = 0;
      planned.rows.forEach((row, i) => {
        const n = result.rowNextDrafts![i]!;
        if (n > 0 && this.owns(row.seq, plan.seqIds[i]!)) this.speculator!.receive!(row.seq, Array.from(result.nextDrafts!.subarray(at, at + n)));
        at += n;
      });
    }
    return { numComputedTokens, numPrefillTokens, numVerifyingRows, numDraftTokens, numAcceptedTokens };
  }

  private onStepError(planned: PlannedStep, err: unknown): void {
    const code = (err as { code?: unknown }).code;
    if (typeof code === 'string' && BROKEN_CODES.has(code)) {
      this.markBroken(String((err as Error).message));
      return;
    }
    const error = new SluiceError('engine_error', `the native engine failed a step: ${(err as Error).message}`, { cause: err });
    planned.rows.forEach((row, i) => {
      if (this.owns(row.seq, planned.plan.seqIds[i]!)) this.roster.end(row.seq, { kind: 'failed', error });
    });
  }

  /**
   * The engine cannot serve anything more: every sequence ends with engine_broken, the loop stops
   * and submit() refuses new work.
   */
  private markBroken(reason: string): void {
    if (this.broken !== undefined) return;
    this.broken = reason;
    this.onBroken?.(reason);
    const error = this.brokenError();
    for (const seq of this.roster.all()) this.roster.end(seq, { kind: 'failed', error });
  }

  /**
   * Nothing could be planned and nothing is in flight. With nothing running, the waiting head
   * cannot fit in the free pool (blocks held outside this batcher): fail it rather than wait
   * forever. Returns whether it failed one.
   */
  private failUnschedulableHead(): boolean {
    const seq = this.roster.waiting()[0];
    if (seq === undefined || this.roster.running.length > 0) return false;
    const numTokens = seq.numPromptTokens + seq.numGeneratedTokens;
    this.roster.end(seq, { kind: 'failed', error: new SluiceError('request_too_large',
      `the prompt needs ${this.roster.blocksFor(numTokens)} KV blocks but only ${this.planner.numFreeBlocks()} ` +
      `of ${this.numTotalBlocks} are free with nothing running`) });
    return true;
  }

  private reapCancelled(): void {
    for (const seq of this.roster.all()) {
      if (seq.cancelRequested) this.roster.end(seq, { kind: 'cancelled' });
    }
  }

  /** Runs a sink callback; an exception fails the sequence. Returns false if it threw. */
  private callSink(seq: Sequence, fn: () => void): boolean {
    try {
      fn();
      return true;
    } catch (err) {
      this.roster.end(seq, { kind: 'failed', error: err instanceof Error ? err : new Error(String(err)) });
      return false;
    }
  }
}
