// The completion-window scheduling policy: asap before standard before flex, first come first
// served within a window. It only orders; the Batcher (src/engine/batcher.ts) plans steps, admits
// by free KV blocks, spends the step's token budget in priority order and preempts lower windows
// to admit a higher one. See the README's "Scheduling" section for the whole picture.

import type { SchedulingPolicy, SequenceView } from '../engine/batch-policy.js';

/** Completion windows, most urgent first. Mirrors COMPLETION_WINDOWS of the catalog. */
export const SCHEDULING_WINDOWS = ['asap', 'standard', 'flex'] as const;
export type SchedulingWindow = (typeof SCHEDULING_WINDOWS)[number];

/** SequenceView.priority of a window: 0 = asap, 1 = standard, 2 = flex. */
export function windowPriority(window: SchedulingWindow): number {
  return SCHEDULING_WINDOWS.indexOf(window);
}

/** How far into a window's queue a request sharing a hot prompt cache key may be moved up. */
export const CO_SCHEDULE_LOOKAHEAD = 16;
/** How many times a waiting request may be overtaken by such moves before it pins its queue. */
export const MAX_OVERTAKES = 16;

/**
 * Waiting order: by priority (most urgent first), then by arrival. Any integer priority >= 0
 * works; the engine uses the three windows'.
 *
 * Co-scheduling by prompt cache key: within one window's queue, among its first
 * CO_SCHEDULE_LOOKAHEAD requests, those whose key is hot (a running sequence has it, so its prefix
 * blocks are cached now) go first, in arrival order, so a keyed group runs while its prefix is in
 * the cache. Never across windows. Starvation-free: a request overtaken MAX_OVERTAKES times stops
 * any further moves in its queue until it is admitted.
 *
 * Invariant: each priority's queue is sorted by arrivalOrder. New sequences arrive in increasing
 * order (push); a preempted sequence is inserted at its arrival position, which is at the front
 * of its queue unless older sequences of the same priority were preempted before it (those then
 * stay ahead of it, as first come first served asks).
 */
export class WindowPriorityPolicy implements SchedulingPolicy {
  /** priority -> waiting sequences of that priority, sorted by arrivalOrder */
  private readonly queues = new Map<number, SequenceView[]>();
  /** waiting() as last built; undefined after any change. */
  private ordered: SequenceView[] | undefined;
  private hotKeys: ReadonlySet<string> = new Set();
  /** Times each waiting sequence was overtaken by a co-scheduled one. */
  private readonly overtaken = new WeakMap<SequenceView, number>();

  setHotKeys(keys: ReadonlySet<string>): void {
    if (sameKeys(keys, this.hotKeys)) return;
    this.hotKeys = new Set(keys);
    this.ordered = undefined;
  }

  enqueue(seq: SequenceView, preempted: boolean): void {
    let queue = this.queues.get(seq.priority);
    if (queue === undefined) {
      queue = [];
      this.queues.set(seq.priority, queue);
    }
    let index = queue.length;
    if (preempted) while (index > 0 && queue[index - 1]!.arrivalOrder > seq.arrivalOrder) index--;
    queue.splice(index, 0, seq);
    this.ordered = undefined;
  }

  remove(seq: SequenceView): void {
    const queue = this.queues.get(seq.priority);
    const index = queue?.indexOf(seq) ?? -1;
    if (index < 0) return;
    // Leaving from behind others (co-scheduled ahead of them) counts as overtaking them.
    for (let i = 0; i < index; i++) this.overtaken.set(queue![i]!, (this.overtaken.get(queue![i]!) ?? 0) + 1);
    queue!.splice(index, 1);
    this.ordered = undefined;
  }

  waiting(): readonly SequenceView[] {
    if (this.ordered === undefined) {
      const priorities = [...this.queues.keys()].sort((a, b) => a - b);
      this.ordered = priorities.flatMap((p) => this.coScheduled(this.queues.get(p)!));
    }
    return this.ordered;
  }

  /** A queue (arrival order) with its hot-key requests in the lookahead moved to the front. */
  private coScheduled(queue: SequenceView[]): SequenceView[] {
    if (this.hotKeys.size === 0) return queue;
    const window = queue.slice(0, CO_SCHEDULE_LOOKAHEAD);
    if (window.some((s) => (this.overtaken.get(s) ?? 0) >= MAX_OVERTAKES)) return queue;
    const isHot = (s: SequenceView) => s.promptCacheKey !== undefined && this.hotKeys.has(s.promptCacheKey);
    if (!window.some(isHot)) return queue;
    return [...window.filter(isHot), ...window.filter((s) => !isHot(s)), ...queue.slice(CO_SCHEDULE_LOOKAHEAD)];
  }

  /** The least urgent; among those the most recently admitted (usually the least computed work to lose). */
  pickVictim(running: readonly SequenceView[]): SequenceView {
    let victim = running[0]!;
    for (const seq of running) {
      if (seq.priority > victim.priority || (seq.priority === victim.priority && seq.admittedOrder > victim.admittedOrder)) {
        victim = seq;
      }
    }
    return victim;
  }
}

function sameKeys(a: ReadonlySet<string>, b: ReadonlySet<string>): boolean {
  if (a.size !== b.size) return false;
  for (const k of a) if (!b.has(k)) return false;
  return true;
}
