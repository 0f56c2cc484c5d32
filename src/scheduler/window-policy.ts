// The completion-window scheduling policy: asap before standard before flex; within a window,
// tenants (organizations) take turns and each tenant's requests are first come first served. It
// only orders; the Planner (planner.ts) plans steps, admits by free KV blocks, spends
// the step's token budget in priority order, preempts lower windows to admit a higher one, and
// preempts a tenant holding more than its fair share of a window for one holding less. See the
// README's "Scheduling" section for the whole picture.

import type { SchedulingPolicy, SequenceView } from './policy.js';
import { Turns } from '../turns.js';

/** Completion windows, most urgent first. Mirrors COMPLETION_WINDOWS of the catalog. */
export const SCHEDULING_WINDOWS = ['asap', 'standard', 'flex'] as const;
export type SchedulingWindow = (typeof SCHEDULING_WINDOWS)[number];

/** SequenceView.priority of a window: 0 = asap, 1 = standard, 2 = flex. */
export function windowPriority(window: SchedulingWindow): number {
  return SCHEDULING_WINDOWS.indexOf(window);
}

/** How far into a tenant's queue a request sharing a hot prompt cache key may be moved up. */
export const CO_SCHEDULE_LOOKAHEAD = 16;
/** How many times a waiting request may be overtaken by such moves before it pins its queue. */
export const MAX_OVERTAKES = 16;

/**
 * Waiting order: by priority (most urgent first); within a priority, round-robin over tenants,
 * starting with the tenant whose turn came least recently (a tenant's turn is used when one of
 * its requests is admitted); within a tenant, by arrival. So however many requests one tenant
 * queues, another tenant's next request is at most one turn per other tenant away from the front.
 * Any integer priority >= 0 works; the engine uses the three windows'.
 *
 * Co-scheduling by prompt cache key: within one tenant's queue, among its first
 * CO_SCHEDULE_LOOKAHEAD requests, those whose key is hot (a running sequence has it, so its prefix
 * blocks are cached now) go first, in arrival order, so a keyed group runs while its prefix is in
 * the cache. Never across windows or tenants (keys are scoped to their tenant). Starvation-free:
 * a request overtaken MAX_OVERTAKES times stops any further moves in its queue until admitted.
 *
 * Invariant: each tenant queue is sorted by arrivalOrder. New sequences arrive in increasing order
 * (push); a preempted sequence is inserted at its arrival position.
 */
export class WindowPriorityPolicy implements SchedulingPolicy {
  /** priority -> tenant -> its waiting sequences by arrivalOrder; tenant iteration order = turn order. */
  private readonly queues = new Map<number, Map<string, SequenceView[]>>();
  /** priority -> the tenants' turns at admission in that window. */
  private readonly turns = new Map<number, Turns>();
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
    const tenants = this.tenantsOf(seq.priority);
    let queue = tenants.get(seq.tenant);
    if (queue === undefined) {
      queue = [];
      this.insertTenant(seq.priority, tenants, seq.tenant, queue);
    }
    let index = queue.length;
    if (preempted) while (index > 0 && queue[index - 1]!.arrivalOrder > seq.arrivalOrder) index--;
    queue.splice(index, 0, seq);
    this.ordered = undefined;
  }

  remove(seq: SequenceView, admitted = false): void {
    const tenants = this.queues.get(seq.priority);
    const queue = tenants?.get(seq.tenant);
    const index = queue?.indexOf(seq) ?? -1;
    if (index < 0) return;
    // Leaving from behind others (co-scheduled ahead of them) counts as overtaking them.
    for (let i = 0; i < index; i++) this.overtaken.set(queue![i]!, (this.overtaken.get(queue![i]!) ?? 0) + 1);
    queue!.splice(index, 1);
    if (admitted) {
      // Its turn is used: to the back of the rotation.
      this.turnsOf(seq.priority).take(seq.tenant);
      tenants!.delete(seq.tenant);
      if (queue!.length > 0) tenants!.set(seq.tenant, queue!);
    } else if (queue!.length === 0) {
      tenants!.delete(seq.tenant);
    }
    this.ordered = undefined;
  }

  waiting(): readonly SequenceView[] {
    if (this.ordered === undefined) {
      const priorities = [...this.queues.keys()].sort((a, b) => a - b);
      this.ordered = priorities.flatMap((p) => interleave([...this.queues.get(p)!.values()].map((q) => this.coScheduled(q))));
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

  private tenantsOf(priority: number): Map<string, SequenceView[]> {
    let tenants = this.queues.get(priority);
    if (tenants === undefined) this.queues.set(priority, (tenants = new Map()));
    return tenants;
  }

  private turnsOf(priority: number): Turns {
    let turns = this.turns.get(priority);
    if (turns === undefined) this.turns.set(priority, (turns = new Turns()));
    return turns;
  }

  /**
   * Puts a tenant's queue into the turn order by when its last turn was: a tenant that waited
   * longest since its turn goes first, a newcomer (never served) before everyone served.
   */
  private insertTenant(priority: number, tenants: Map<string, SequenceView[]>, tenant: string, queue: SequenceView[]): void {
    const turns = this.turnsOf(priority);
    const mine = turns.lastTurn(tenant);
    const entries = [...tenants];
    let at = entries.length;
    while (at > 0 && turns.lastTurn(entries[at - 1]![0]) > mine) at--;
    entries.splice(at, 0, [tenant, queue]);
    tenants.clear();
    for (const [t, q] of entries) tenants.set(t, q);
    // NOTE: turn records of tenants with nothing waiting are kept (one number per tenant seen).
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
}

/** [[a1, a2], [b1], [c1, c2, c3]] -> a1, b1, c1, a2, c2, c3. */
function interleave(queues: SequenceView[][]): SequenceView[] {
  if (queues.length === 1) return queues[0]!;
  const total = queues.reduce((n, q) => n + q.length, 0);
  const out: SequenceView[] = [];
  for (let i = 0; out.length < total; i++) {
    for (const q of queues) if (i < q.length) out.push(q[i]!);
  }
  return out;
}

function sameKeys(a: ReadonlySet<string>, b: ReadonlySet<string>): boolean {
  if (a.size !== b.size) return false;
  for (const k of a) if (!b.has(k)) return false;
  return true;
}
