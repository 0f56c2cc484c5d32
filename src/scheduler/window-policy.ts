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

/**
 * Waiting order: by priority (most urgent first), then by arrival. Any integer priority >= 0
 * works; the engine uses the three windows'.
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
    queue!.splice(index, 1);
    this.ordered = undefined;
  }

  waiting(): readonly SequenceView[] {
    if (this.ordered === undefined) {
      const priorities = [...this.queues.keys()].sort((a, b) => a - b);
      this.ordered = priorities.flatMap((p) => this.queues.get(p)!);
    }
    return this.ordered;
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
