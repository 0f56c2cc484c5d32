// Co-scheduling by prompt cache key in the window policy: requests whose key is hot move to the
// front of their window's lookahead, never across windows, and a request overtaken MAX_OVERTAKES
// times pins its queue.
import { describe, expect, it } from 'vitest';
import type { SequenceView } from '../src/scheduler/policy.js';
import { CO_SCHEDULE_LOOKAHEAD, MAX_OVERTAKES, WindowPriorityPolicy } from '../src/scheduler/window-policy.js';

let arrivals = 0;
function seq(priority: number, promptCacheKey?: string): SequenceView {
  return { arrivalOrder: arrivals++, priority, admittedOrder: -1, numPromptTokens: 4, numGeneratedTokens: 0, promptCacheKey };
}
const ids = (policy: WindowPriorityPolicy, all: SequenceView[]) => policy.waiting().map((s) => all.indexOf(s));

describe('co-scheduling by prompt cache key', () => {
  it('moves hot-key requests ahead within their window only, in arrival order', () => {
    const policy = new WindowPriorityPolicy();
    const all = [seq(1), seq(1, 'k'), seq(1), seq(1, 'k'), seq(0), seq(2, 'k')];
    for (const s of all) policy.enqueue(s, false);
    expect(ids(policy, all)).toEqual([4, 0, 1, 2, 3, 5]);
    policy.setHotKeys(new Set(['k']));
    expect(ids(policy, all)).toEqual([4, 1, 3, 0, 2, 5]);
    policy.setHotKeys(new Set(['other']));
    expect(ids(policy, all)).toEqual([4, 0, 1, 2, 3, 5]);
  });

  it('looks only CO_SCHEDULE_LOOKAHEAD deep', () => {
    const policy = new WindowPriorityPolicy();
    const all = [...Array.from({ length: CO_SCHEDULE_LOOKAHEAD }, () => seq(1)), seq(1, 'k')];
    for (const s of all) policy.enqueue(s, false);
    policy.setHotKeys(new Set(['k']));
    expect(policy.waiting()[0]).toBe(all[0]);
    expect(policy.waiting().at(-1)).toBe(all.at(-1));
  });

  it('stops moving requests past one overtaken MAX_OVERTAKES times', () => {
    const policy = new WindowPriorityPolicy();
    const head = seq(1);
    policy.enqueue(head, false);
    policy.setHotKeys(new Set(['k']));
    for (let i = 0; i < MAX_OVERTAKES; i++) {
      const keyed = seq(1, 'k');
      policy.enqueue(keyed, false);
      expect(policy.waiting()[0]).toBe(keyed);
      policy.remove(keyed); // admitted ahead of head
    }
    const late = seq(1, 'k');
    policy.enqueue(late, false);
    expect(policy.waiting()[0]).toBe(head);
  });
});
