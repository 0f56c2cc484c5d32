// Planning one step: who is admitted, who is preempted, and how many tokens each running sequence
// computes. Pure scheduling decisions on the scheduler's own state: it calls nothing native. The
// counts it plans with are the engine's, as its last result reported them, plus what the steps in
// flight will most likely do (Sequence.predicted); the engine enforces the truth (a row or add that
// does not fit comes back as a value and is planned again).
//
// Each step carries, within maxBatchedTokens tokens and maxNumSeqs sequences, priority by priority
// (most urgent first):
//   1. the running sequences of that priority, oldest admission first: 1 token if decoding, the
//      next prompt chunk if still prefilling (chunked prefill);
//   2. then waiting sequences of that priority (policy order), each with its first prompt chunk.
// So less urgent work only gets the budget that more urgent work leaves. A running sequence that
// cannot get a block for even one token preempts the policy's victim (its KV is freed; it is
// requeued with prompt + generated tokens as its new prompt and recomputed later). A waiting
// sequence is admitted only when its whole prompt's blocks are free; when it does not fit (blocks
// or maxNumSeqs) it preempts running sequences of a less urgent priority (or of a tenant over its
// fair share) when that makes it fit, never those of its own or a more urgent one.
//
// Before all of that comes the window floor (tenant-share.ts): a tenant running fewer sequences
// than its floor while another tenant has more urgent work has its waiting requests admitted first
// (preempting tenants above their floor if need be) and its running rows planned first; and a more
// urgent window preempts another tenant's sequences only above that tenant's floor. So one
// organization's flood of a more urgent window delays another's request by a bounded share, never
// until the flood is over.

import { SluiceError } from '../errors.js';
import type { NativeStepPlan } from '../native/native-types.js';
import type { Speculator } from './speculator.js';
import type { Roster } from './roster.js';
import type { Sequence } from './sequence.js';
import { runningByTenant, TenantShare, tenantKey, WindowFloor, type TenantDeferral } from './tenant-share.js';

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

export interface PlannerOptions {
  maxBatchedTokens: number;
  maxNumSeqs: number;
  deferral?: DeferralGuard | undefined;
  tenantDeferral?: TenantDeferral | undefined;
  /** TenantShareOptions.floorShare (default DEFAULT_WINDOW_FLOOR_SHARE; 0: windows strict between tenants). */
  windowFloorShare?: number | undefined;
  /** Speculative decoding: decode rows may carry drafts (speculator.ts); the engine must verify them. */
  speculator?: Speculator | undefined;
  now: () => number;
}

/** One row of a planned step. */
export interface PlannedRow {
  seq: Sequence;
  /** The row's token bound (the engine computes at most this many). */
  numTokens: number;
  /** Estimated new KV blocks the row takes. */
  numNewBlocks: number;
  /** Speculative decoding: tokens proposed to follow the pending one (numTokens = 1 + drafts). */
  drafts?: number[];
}

/** A planned step, ready to submit. */
export interface PlannedStep {
  plan: NativeStepPlan;
  /** [n] plan row i's sequence. */
  rows: PlannedRow[];
  /** [a] plan add i's sequence. */
  adds: Sequence[];
  /** Estimated blocks the step takes from the pool (new blocks minus freed ones). */
  netBlocks: number;
  /** [p] priority of each running sequence this plan preempted (its KV freed, requeued). */
  preempted: number[];
}

/** A step while it is being planned. */
interface StepDraft {
  rows: Map<Sequence, PlannedRow>;
  /** Sequences admitted by this step (their adds). */
  admitted: Set<Sequence>;
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
  /** Priorities of the sequences preempted while planning this step. */
  preempted: number[];
  /** The window floor of this step (tenant-share.ts). */
  floor: WindowFloor;
  /** Draft tokens the step's rows may still carry (0: no speculation this step). */
  numDraftTokens: number;
}

/** Whether a planned row prefills (computes more than its one pending token and its drafts). */
function isPrefill(row: PlannedRow | undefined): boolean {
  return row !== undefined && row.numTokens - (row.drafts?.length ?? 0) > 1;
}

export class Planner {
  /**
   * Estimated blocks an allocation can get once every submitted step has run: the last result's
   * count minus what the steps submitted since will take (the Batcher keeps it).
   */
  freeBlocks: number;
  private readonly tenantShare: TenantShare;
  /** When urgent work (priority below deferral.fromPriority) was last running or waiting. */
  private lastUrgentMs = -Infinity;

  constructor(private readonly roster: Roster, private readonly opts: PlannerOptions, numBlocks: number) {
    this.freeBlocks = numBlocks;
    const td = opts.tenantDeferral;
    if (td && !(Number.isInteger(td.rowsPerStep) && td.rowsPerStep >= 1 && td.holdMs >= 0)) {
      throw new SluiceError('invalid_argument', 'tenantDeferral.rowsPerStep must be an integer >= 1 and holdMs >= 0', { param: 'tenantDeferral' });
    }
    const d = opts.deferral;
    if (d && !(Number.isInteger(d.rowsPerStep) && d.rowsPerStep >= 1 && d.holdMs >= 0)) {
      throw new SluiceError('invalid_argument', 'deferral.rowsPerStep must be an integer >= 1 and deferral.holdMs >= 0', { param: 'deferral' });
    }
    const share = opts.windowFloorShare;
    if (share !== undefined && !(share >= 0 && share <= 1)) {
      throw new SluiceError('invalid_argument', `windowFloorShare must be between 0 and 1, got ${share}`, { param: 'windowFloorShare' });
    }
    this.tenantShare = new TenantShare(opts.maxNumSeqs, td, opts.now, {
      ...(share !== undefined && { floorShare: share }), deferrableFrom: d?.fromPriority ?? Infinity,
    });
  }

  /**
   * Plans the next step: admits, preempts (the roster requeues victims and queues their frees),
   * and gives each running sequence its row. Returns undefined when there is nothing to send.
   */
  plan(): PlannedStep | undefined {
    const roster = this.roster;
    this.shareHotKeys();
    const step: StepDraft = {
      rows: new Map(), admitted: new Set(), numBudgetTokens: this.opts.maxBatchedTokens, numPlannedBlocks: 0,
      admissionBlocked: false, deferring: this.deferringNow(), urgentPrefill: false,
      numDeferredTokens: this.opts.deferral?.rowsPerStep ?? 0,
      heavy: this.tenantShare.heavyThisStep(roster.running, roster.waiting()), lightPrefill: false, heavyTokens: new Map(), preempted: [],
      floor: this.tenantShare.floorThisStep(roster.running, roster.waiting()),
      numDraftTokens: this.opts.speculator?.active(roster.running.length) ? this.opts.speculator.options.maxDraftTokensPerStep : 0,
    };
    const isHeavy = (s: Sequence) => step.heavy.size > 0 && step.heavy.has(tenantKey(s));
    // Tenants below their window floor first: their admissions, then their rows.
    this.admitBelowFloor(step);
    const numRunning = runningByTenant(roster.running);
    const belowFloor = step.floor.contested
      ? roster.running.filter((s) => numRunning.get(s.tenant)! <= step.floor.size && step.floor.outranked(s)) : [];
    for (const seq of belowFloor) {
      if (step.numBudgetTokens === 0) break;
      if (step.rows.has(seq) || seq.state !== 'running' || this.finishesInFlight(seq)) continue;
      if (this.deferrable(seq, step)) {
        this.withDeferredCap(step, () => this.planRunning(step, seq));
        continue;
      }
      this.planRunning(step, seq, true);
      if (isPrefill(step.rows.get(seq))) step.urgentPrefill = step.lightPrefill = true;
    }
    // Stable sort: with equal priorities this is admission order; a window's light tenants first.
    const byPriority = [...roster.running].sort((a, b) => a.priority - b.priority ||
      Number(isHeavy(a)) - Number(isHeavy(b)) || a.admittedOrder - b.admittedOrder);
    let lightAdmittedAt = -1;
    for (const seq of byPriority) {
      // More urgent waiting sequences come before this one (and may preempt it).
      this.admitWaiting(step, seq.priority);
      if (step.numBudgetTokens === 0) break;
      // A sequence preempted and re-admitted within this step already has its admission row.
      if (step.rows.has(seq) || seq.state !== 'running' || this.finishesInFlight(seq)) continue;
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
      this.planRunning(step, seq, true);
      if (isPrefill(step.rows.get(seq))) step.urgentPrefill = step.lightPrefill = true;
    }
    this.admitWaiting(step, Infinity);

    const rows = [...step.rows.values()].filter((row) => row.seq.state === 'running');
    const adds = rows.filter((row) => step.admitted.has(row.seq)).map((row) => row.seq);
    const frees = roster.pendingFrees;
    if (rows.length === 0 && frees.length === 0) return undefined;
    const netBlocks = step.numPlannedBlocks - roster.pendingFreedBlocks;
    roster.pendingFrees = [];
    roster.pendingFreedBlocks = 0;
    const plan: NativeStepPlan = {
      seqIds: Uint32Array.from(rows, (r) => r.seq.seqId),
      numTokens: Uint32Array.from(rows, (r) => r.numTokens),
    };
    if (frees.length > 0) plan.frees = Uint32Array.from(frees);
    if (rows.some((r) => r.drafts !== undefined)) {
      plan.numDrafts = Uint32Array.from(rows, (r) => r.drafts?.length ?? 0);
      plan.drafts = Int32Array.from(rows.flatMap((r) => r.drafts ?? []));
    }
    // An EAGLE-3 head drafts in the engine, during this step, for the next one.
    // Zeros included: a plan that carries it keeps the head's context; one without (under load)
    // skips the head altogether.
    const speculator = this.opts.speculator;
    if (speculator?.nextDrafts && speculator.active(roster.running.length)) {
      plan.numNextDrafts = Uint32Array.from(rows, (r) => speculator.nextDrafts!(r.seq));
    }
    if (adds.length > 0) {
      plan.adds = adds.map((seq) => ({
        seqId: seq.seqId, promptTokens: roster.promptOf(seq), sampling: seq.request.sampling,
        keyed: seq.request.keyed ?? false, cacheScope: seq.request.tenant ?? '',
        ...(seq.request.images !== undefined && seq.request.images.length > 0 && { images: seq.request.images }),
        ...(seq.request.adapter !== undefined && seq.request.adapter > 0 && { adapter: seq.request.adapter }),
      }));
    }
    return { plan, rows, adds, netBlocks, preempted: step.preempted };
  }

  /** Blocks a draft can still plan: the estimate, plus what its frees give back, minus what its rows take. */
  numFreeBlocks(step?: StepDraft): number {
    return this.freeBlocks + this.roster.pendingFreedBlocks - (step?.numPlannedBlocks ?? 0);
  }

  /** Whether the steps in flight will have sampled the sequence's last token (maxTokens). */
  private finishesInFlight(seq: Sequence): boolean {
    return seq.numGeneratedTokens + seq.predicted().samples >= seq.request.maxTokens;
  }

  /** Tells the policy which prompt cache keys are hot: those of running sequences. */
  private shareHotKeys(): void {
    const policy = this.roster.policy;
    if (!policy.setHotKeys) return;
    const keys = new Set<string>();
    for (const seq of this.roster.running) if (seq.promptCacheKey !== undefined) keys.add(seq.promptCacheKey);
    policy.setHotKeys(keys);
  }

  /** Whether background work is deferred this step; records urgent work seen now. */
  private deferringNow(): boolean {
    const deferral = this.opts.deferral;
    if (!deferral) return false;
    const from = deferral.fromPriority;
    const now = this.opts.now();
    const { running } = this.roster;
    const waiting = this.roster.waiting();
    if (running.some((s) => s.priority < from) || waiting.some((s) => s.priority < from)) this.lastUrgentMs = now;
    const anyDeferrable = running.some((s) => s.priority >= from) || waiting.some((s) => s.priority >= from);
    return anyDeferrable && now - this.lastUrgentMs <= deferral.holdMs;
  }

  private deferrable(seq: Sequence, step: StepDraft): boolean {
    return step.deferring && seq.priority >= this.opts.deferral!.fromPriority;
  }

  /**
   * Plans a running sequence's next tokens; preempts the policy's victim while not even one token
   * fits. mayDraft: a decode row may carry drafts (speculative decoding) within what the step's
   * budget and blocks leave after its own token.
   */
  private planRunning(step: StepDraft, seq: Sequence, mayDraft = false): void {
    const roster = this.roster;
    while (seq.state === 'running') {
      const { computed, pending } = seq.predicted();
      const numHeldBlocks = roster.predictedBlocks(seq);
      const numTokensByBlocks = (numHeldBlocks + this.numFreeBlocks(step)) * this.roster.blockSize - computed;
      let numTokens = Math.min(pending, step.numBudgetTokens, numTokensByBlocks);
      if (numTokens >= 1) {
        let drafts: number[] | undefined;
        if (mayDraft && pending === 1 && step.numDraftTokens > 0) {
          const room = Math.min(step.numDraftTokens, step.numBudgetTokens - 1, numTokensByBlocks - 1);
          const proposed = room > 0 ? this.opts.speculator!.propose(seq, room) : [];
          if (proposed.length > 0) {
            drafts = proposed;
            numTokens += drafts.length;
            step.numDraftTokens -= drafts.length;
          }
        }
        const numNewBlocks = Math.max(0, roster.blocksFor(computed + numTokens) - numHeldBlocks);
        step.rows.set(seq, { seq, numTokens, numNewBlocks, ...(drafts && { drafts }) });
        step.numBudgetTokens -= numTokens;
        step.numPlannedBlocks += numNewBlocks;
        return;
      }
      // Not even one token fits: free the victim's KV and try again (the victim may be seq).
      const victim = roster.policy.pickVictim(roster.running) as Sequence;
      this.preempt(step, victim);
    }
  }

  /**
   * Admits from the front of the waiting order while the head is more urgent than
   * `belowPriority` and fits; stops at the first that does not fit so none is starved by smaller
   * or less urgent requests behind it.
   */
  private admitWaiting(step: StepDraft, belowPriority: number): void {
    while (!step.admissionBlocked && step.numBudgetTokens > 0) {
      const seq = this.roster.waiting()[0];
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
   * Admits, in the policy's order, the waiting requests of tenants below their window floor while
   * another tenant has more urgent work (see the file comment), until each tenant reaches its floor.
   * One that does not fit even after makeRoom blocks admission for the step, as a waiting head does.
   */
  private admitBelowFloor(step: StepDraft): void {
    if (step.floor.size === 0 || !step.floor.contested) return;
    const numRunning = runningByTenant(this.roster.running);
    for (const seq of [...this.roster.waiting()]) {
      if (step.admissionBlocked || step.numBudgetTokens === 0) return;
      if (seq.state !== 'waiting' || (numRunning.get(seq.tenant) ?? 0) >= step.floor.size || !step.floor.outranked(seq)) continue;
      if (this.deferrable(seq, step)) {
        this.withDeferredCap(step, () => this.admitHead(step, seq));
        if ((seq.state as Sequence['state']) !== 'running') return;
      } else if (!this.admitHead(step, seq)) {
        return;
      }
      // Preemptions may have changed others' counts too.
      numRunning.clear();
      for (const [t, n] of runningByTenant(this.roster.running)) numRunning.set(t, n);
    }
  }

  /**
   * Whether running `victim` may be preempted to admit waiting `seq`. The same tenant: only a less
   * urgent window. Another tenant: a less urgent window, or the same window while the victim's
   * tenant is over its fair share there and seq's under it (TenantShare.overFairShare), or any
   * window while seq's tenant is below its floor; in every case only while the victim's tenant
   * stays above its window floor (the same window's fair share is at least the floor).
   */
  private mayPreempt(step: StepDraft, victim: Sequence, seq: Sequence, numRunning: ReadonlyMap<string, number>): boolean {
    if (victim.tenant === seq.tenant) return victim.priority > seq.priority;
    if (victim.priority === seq.priority && this.tenantShare.overFairShare(victim, seq, this.roster.running, this.roster.waiting())) return true;
    const floor = step.floor.size;
    if ((numRunning.get(victim.tenant) ?? 0) <= floor) return false;
    return victim.priority > seq.priority || ((numRunning.get(seq.tenant) ?? 0) < floor && step.floor.outranked(seq));
  }

  /**
   * Admits the waiting requests of light tenants in `priority`, in the policy's order, while they
   * fit: before the heavy tenant's rows take the step (they may pass the heavy tenant's waiting
   * requests; that is the point of sharing the window).
   */
  private admitLight(step: StepDraft, priority: number, isHeavy: (s: Sequence) => boolean): void {
    for (const seq of [...this.roster.waiting()]) {
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

  /**
   * Admits the waiting head with its first prompt chunk; false (and admission blocked) when it does
   * not fit. The prefix-cache hit is not known yet (the engine reports it with the step), so the
   * whole prompt is planned as uncomputed: a hit only makes the step do less.
   */
  private admitHead(step: StepDraft, seq: Sequence): boolean {
    const roster = this.roster;
    const numPromptTokens = seq.numPromptTokens + seq.numGeneratedTokens;
    if (!this.makeRoom(step, seq, roster.blocksFor(numPromptTokens))) {
      step.admissionBlocked = true;
      return false;
    }
    roster.startAdmission(seq);
    step.admitted.add(seq);
    if (seq.promptCacheKey !== undefined) this.shareHotKeys();
    const numTokens = Math.min(numPromptTokens, step.numBudgetTokens);
    if (numTokens > 1 && !this.deferrable(seq, step)) {
      step.urgentPrefill = true;
      if (!step.heavy.has(tenantKey(seq))) step.lightPrefill = true;
    }
    const numNewBlocks = roster.blocksFor(numTokens);
    step.rows.set(seq, { seq, numTokens, numNewBlocks });
    step.numBudgetTokens -= numTokens;
    step.numPlannedBlocks += numNewBlocks;
    return true;
  }

  /**
   * Whether `seq` (waiting) can be admitted with `numBlocks` blocks, after preempting the running
   * sequences mayPreempt allows (a less urgent window; a tenant over its fair share or above its
   * window floor), if that makes it fit. Preempts nobody when even all of them would not be
   * enough: their recompute would buy nothing.
   */
  private makeRoom(step: StepDraft, seq: Sequence, numBlocks: number): boolean {
    const roster = this.roster;
    const fits = () => roster.running.length < this.opts.maxNumSeqs && numBlocks <= this.numFreeBlocks(step);
    if (fits()) return true;
    const lessUrgent = () => {
      const numRunning = runningByTenant(roster.running);
      return roster.running.filter((s) => this.mayPreempt(step, s, seq, numRunning));
    };
    const candidates = lessUrgent();
    let numReclaimableBlocks = 0;
    for (const s of candidates) numReclaimableBlocks += roster.predictedBlocks(s) + (step.rows.get(s)?.numNewBlocks ?? 0);
    if (candidates.length === 0 || roster.running.length - candidates.length >= this.opts.maxNumSeqs ||
        numBlocks > this.numFreeBlocks(step) + numReclaimableBlocks) {
      return false;
    }
    for (let victims = candidates; !fits() && victims.length > 0; victims = lessUrgent()) {
      const victim = roster.policy.pickVictim(victims) as Sequence;
      if (!victims.includes(victim)) throw new Error('SchedulingPolicy.pickVictim returned a sequence it was not offered');
      this.preempt(step, victim);
    }
    return fits();
  }

  /** Takes the victim's row out of the step and requeues it; its frees go in this step's plan. */
  private preempt(step: StepDraft, victim: Sequence): void {
    const row = step.rows.get(victim);
    if (row !== undefined) {
      step.rows.delete(victim);
      step.numBudgetTokens += row.numTokens;
      step.numPlannedBlocks -= row.numNewBlocks;
    }
    // One admitted by this same plan never ran: taking its add back is no preemption.
    if (!step.admitted.delete(victim)) step.preempted.push(victim.priority);
    this.roster.requeue(victim);
  }
}
