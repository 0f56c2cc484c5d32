// Deferral of background (flex) work while urgent work is present or recent, against the fake
// native handle with an injected clock: no background tokens in a step that prefills urgent work,
// a small shared token budget for background work otherwise, and the caps lifted once urgent work
// has been gone for holdMs. Assertions are on plans, never on time.

import { describe, expect, it } from 'vitest';
import { Batcher, type SequenceOutcome } from '../src/scheduler/batcher.js';
import type { NativeSamplingParams } from '../src/native/native-types.js';
import { WindowPriorityPolicy, windowPriority, type SchedulingWindow } from '../src/scheduler/window-policy.js';
import { FakeHandle } from './helpers/fake-native-handle.js';

const SAMPLING: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);
const FLEX = windowPriority('flex');

// Serial loop: arrivals are placed at exact steps (see batcher-priority.test.ts).
function setup(handle: FakeHandle, clock: { ms: number }, rowsPerStep = 2, holdMs = 100) {
  const batcher = new Batcher(handle, {
    overlap: false, maxBatchedTokens: 64, maxNumSeqs: 16, policy: new WindowPriorityPolicy(),
    deferral: { fromPriority: FLEX, rowsPerStep, holdMs }, now: () => clock.ms,
  });
  const submit = (window: SchedulingWindow, prompt: number[], maxTokens: number): Promise<SequenceOutcome> =>
    new Promise((resolve) => batcher.submit({
      promptTokenIds: prompt, maxTokens, sampling: SAMPLING, priority: windowPriority(window),
      sink: { onToken: () => false, onEnd: resolve },
    }));
  return { batcher, submit };
}

const planOf = (handle: FakeHandle, i: number) => handle.plans[i]!.map((r) => [r.seqId, r.numTokens]);

describe('Batcher deferral of flex work', () => {
  it('runs flex at full width when nothing urgent is around', async () => {
    const handle = new FakeHandle(256, 4);
    const { submit } = setup(handle, { ms: 0 });
    await Promise.all([submit('flex', range(4), 3), submit('flex', range(4, 10), 3), submit('flex', range(4, 20), 3)]);
    expect(planOf(handle, 0)).toEqual([[1, 4], [2, 4], [3, 4]]);
    expect(planOf(handle, 1)).toEqual([[1, 1], [2, 1], [3, 1]]);
  });

  it('gives flex no tokens in a step that prefills asap work, then a small shared budget while asap runs and for holdMs after', async () => {
    const handle = new FakeHandle(256, 4);
    const clock = { ms: 0 };
    const { submit } = setup(handle, clock, 2, 100);
    const flex = [submit('flex', range(4), 40), submit('flex', range(4, 10), 40), submit('flex', range(4, 20), 40)];
    let asap: Promise<SequenceOutcome> | undefined;
    handle.onStep = (n) => {
      if (n === 2) asap = submit('asap', range(6, 100), 3);   // arrives while flex decodes at full width
      if (n === 10) clock.ms = 50;                              // asap done; still within the hold
      if (n === 12) clock.ms = 500;                             // the hold has passed
    };
    await Promise.all(flex);
    await asap;
    expect(planOf(handle, 1)).toEqual([[1, 1], [2, 1], [3, 1]]);
    // Step 3: asap (seqId 4) is admitted and prefills alone.
    expect(planOf(handle, 2)).toEqual([[4, 6]]);
    // While asap decodes: asap first, then 2 flex tokens (oldest flex first).
    expect(planOf(handle, 3)).toEqual([[4, 1], [1, 1], [2, 1]]);
    // Asap gone but within the hold: still 2 flex rows per step.
    expect(handle.plans[10]!.length).toBe(2);
    // After the hold: all three flex sequences again.
    expect(handle.plans[12]!.length).toBe(3);
  });

  it('admits waiting flex work in small chunks during the hold, so a step is never empty', async () => {
    const handle = new FakeHandle(256, 4);
    const clock = { ms: 0 };
    const { submit } = setup(handle, clock, 4, 1000);
    await submit('asap', range(3), 2);
    // The hold is active (asap just ended) and only flex waits: it is admitted 4 tokens at a time.
    const flex = submit('flex', range(10, 200), 2);
    await flex;
    const flexPlans = handle.plans.filter((p) => p.some((r) => r.seqId === 2)).map((p) => p.map((r) => r.numTokens));
    expect(flexPlans.slice(0, 3)).toEqual([[4], [4], [2]]);
  });
});
