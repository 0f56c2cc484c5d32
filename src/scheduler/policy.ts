// Scheduling policy: who is admitted next and who is preempted when KV blocks run out. The
// Planner (planner.ts) makes the decisions from it and the Batcher (batcher.ts) runs the steps; a
// policy only orders. FcfsPolicy is first come first served; the completion-window scheduler
// (window-policy.ts) implements the same interface.

/** What a policy may read about a sequence. Owned and mutated by the scheduler (roster, planner, batcher) only. */
export interface SequenceView {
  /** Submission order (0, 1, 2, ...): stable across preemptions. */
  readonly arrivalOrder: number;
  /**
   * Urgency, fixed at submission: 0 is the most urgent, larger numbers less (the window scheduler
   * maps asap, standard, flex to 0, 1, 2). The Batcher gives step budget to lower numbers first and
   * preempts only larger numbers to admit a sequence; a policy that ignores it orders as it likes.
   */
  readonly priority: number;
  /** Order of the latest admission (-1 before the first); grows with every (re-)admission. */
  readonly admittedOrder: number;
  readonly numPromptTokens: number;
  readonly numGeneratedTokens: number;
  /** The request's prompt cache key, if it had one (scoped to its tenant). */
  readonly promptCacheKey: string | undefined;
  /** Who the request belongs to (an organization id; '' for none). */
  readonly tenant: string;
}

export interface SchedulingPolicy {
  /**
   * Adds a sequence to the waiting set: a new submission (preempted = false) or a running
   * sequence that lost its KV blocks (preempted = true).
   */
  enqueue(seq: SequenceView, preempted: boolean): void;
  /**
   * Removes a waiting sequence; unknown sequences are ignored. `admitted`: it leaves to run (a
   * fair policy counts that as its tenant's turn), else it was cancelled or failed.
   */
  remove(seq: SequenceView, admitted?: boolean): void;
  /** The waiting sequences, next to admit first. The Batcher admits from the front while they fit. */
  waiting(): readonly SequenceView[];
  /**
   * Which of `running` (non-empty, oldest admission first) gives up its KV blocks. Must return a
   * member of `running`: the Batcher passes a subset when only some may be preempted.
   */
  pickVictim(running: readonly SequenceView[]): SequenceView;
  /**
   * Optional: the prompt cache keys whose prefixes are hot now (keys of running sequences). The
   * Batcher calls it before it admits; a policy may use it to co-schedule requests sharing a key.
   */
  setHotKeys?(keys: ReadonlySet<string>): void;
}

/**
 * First come first served, priority ignored: admits in arrival order; a preempted sequence goes back to the front
 * (it arrived before everything still waiting); the victim is the most recently admitted.
 */
export class FcfsPolicy implements SchedulingPolicy {
  private queue: SequenceView[] = [];

  enqueue(seq: SequenceView, preempted: boolean): void {
    if (preempted) this.queue.unshift(seq);
    else this.queue.push(seq);
  }

  remove(seq: SequenceView): void {
    const index = this.queue.indexOf(seq);
    if (index >= 0) this.queue.splice(index, 1);
  }

  waiting(): readonly SequenceView[] {
    return this.queue;
  }

  pickVictim(running: readonly SequenceView[]): SequenceView {
    let victim = running[0]!;
    for (const seq of running) if (seq.admittedOrder > victim.admittedOrder) victim = seq;
    return victim;
  }
}
