// Unit tests of the completion-window policy (src/scheduler/window-policy.ts) on plain
// SequenceView objects: waiting order, preempted sequences' place, victim choice.

import { describe, expect, it } from 'vitest';
import type { SequenceView } from '../src/scheduler/policy.js';
import { WindowPriorityPolicy, windowPriority, type SchedulingWindow } from '../src/scheduler/window-policy.js';

interface FakeView extends SequenceView {
  name: string;
  admittedOrder: number;
}

let numArrivals = 0;
function view(name: string, window: SchedulingWindow, admittedOrder = -1, tenant = ''): FakeView {
  return {
    name, arrivalOrder: numArrivals++, admittedOrder, priority: windowPriority(window),
    numPromptTokens: 4, numGeneratedTokens: 0, promptCacheKey: undefined, tenant,
  };
}
const names = (views: readonly SequenceView[]) => views.map((v) => (v as FakeView).name);

describe('WindowPriorityPolicy', () => {
  it('maps windows to priorities, most urgent lowest', () => {
    expect(['asap', 'standard', 'flex'].map((w) => windowPriority(w as SchedulingWindow))).toEqual([0, 1, 2]);
  });

  it('orders waiting sequences asap, then standard, then flex, first come first served within each', () => {
    const policy = new WindowPriorityPolicy();
    for (const v of [view('f1', 'flex'), view('s1', 'standard'), view('a1', 'asap'), view('f2', 'flex'),
      view('a2', 'asap'), view('s2', 'standard')]) policy.enqueue(v, false);
    expect(names(policy.waiting())).toEqual(['a1', 'a2', 's1', 's2', 'f1', 'f2']);
  });

  it('puts a preempted sequence back at the front of its own window, not ahead of more urgent ones', () => {
    const policy = new WindowPriorityPolicy();
    const f1 = view('f1', 'flex', 0);          // arrived first, was running
    const a1 = view('a1', 'asap');
    const f2 = view('f2', 'flex');
    policy.enqueue(a1, false);
    policy.enqueue(f2, false);
    policy.enqueue(f1, true);
    expect(names(policy.waiting())).toEqual(['a1', 'f1', 'f2']);
  });

  it('keeps arrival order among several preempted sequences of one window, whatever the preemption order', () => {
    const policy = new WindowPriorityPolicy();
    const s1 = view('s1', 'standard', 0);
    const s2 = view('s2', 'standard', 1);
    const s3 = view('s3', 'standard');
    policy.enqueue(s3, false);
    policy.enqueue(s2, true);   // the youngest admission is preempted first
    policy.enqueue(s1, true);
    expect(names(policy.waiting())).toEqual(['s1', 's2', 's3']);
  });

  it('removes waiting sequences and ignores unknown ones', () => {
    const policy = new WindowPriorityPolicy();
    const a = view('a', 'asap');
    const f = view('f', 'flex');
    policy.enqueue(a, false);
    policy.enqueue(f, false);
    expect(names(policy.waiting())).toEqual(['a', 'f']);
    policy.remove(a);
    policy.remove(view('stranger', 'standard'));
    expect(names(policy.waiting())).toEqual(['f']);
    policy.remove(f);
    expect(policy.waiting()).toHaveLength(0);
  });

  it('takes tenants in turns within a window: a flood of one tenant does not push another back', () => {
    const policy = new WindowPriorityPolicy();
    const b = Array.from({ length: 5 }, (_, i) => view(`b${i}`, 'asap', -1, 'B'));
    for (const v of b) policy.enqueue(v, false);
    const a1 = view('a1', 'asap', -1, 'A');
    const c1 = view('c1', 'asap', -1, 'C');
    const s1 = view('s1', 'standard', -1, 'A');
    for (const v of [a1, c1, s1]) policy.enqueue(v, false);
    // B came first, then A and C (never served: in arrival order of their queues), one each in turn.
    expect(names(policy.waiting())).toEqual(['b0', 'a1', 'c1', 'b1', 'b2', 'b3', 'b4', 's1']);
    policy.remove(b[0]!, true);  // B's turn used: B goes to the back of the rotation
    expect(names(policy.waiting())).toEqual(['a1', 'c1', 'b1', 'b2', 'b3', 'b4', 's1']);
    policy.remove(a1, true);
    const a2 = view('a2', 'asap', -1, 'A');
    policy.enqueue(a2, false);  // A was served after B: behind B now
    expect(names(policy.waiting())).toEqual(['c1', 'b1', 'a2', 'b2', 'b3', 'b4', 's1']);
    policy.remove(c1);  // a cancellation is not a turn
    expect(names(policy.waiting())).toEqual(['b1', 'a2', 'b2', 'b3', 'b4', 's1']);
  });

  it('picks the least urgent running sequence as victim, the most recently admitted among those', () => {
    const policy = new WindowPriorityPolicy();
    const running = [view('a', 'asap', 0), view('f-old', 'flex', 1), view('s', 'standard', 2), view('f-new', 'flex', 3),
      view('a-new', 'asap', 4)];
    expect((policy.pickVictim(running) as FakeView).name).toBe('f-new');
    expect((policy.pickVictim(running.filter((v) => v.priority < 2)) as FakeView).name).toBe('s');
    expect((policy.pickVictim(running.filter((v) => v.priority === 0)) as FakeView).name).toBe('a-new');
  });
});
