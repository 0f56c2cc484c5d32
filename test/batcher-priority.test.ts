// The Batcher with priorities (the completion-window policy), against the fake native handle:
// step budget in priority order, preemption of less urgent work to admit more urgent work (and
// never of equal or more urgent work), no vain preemption, head-of-line order by priority.
// Assertions are on plans and event order, never on time.

import { describe, expect, it } from 'vitest';
import { Batcher, type BatcherOptions, type SequenceOutcome } from '../src/scheduler/batcher.js';
import type { NativeSamplingParams } from '../src/native/native-types.js';
import { WindowPriorityPolicy, windowPriority, type SchedulingWindow } from '../src/scheduler/window-policy.js';
import { FakeHandle } from './helpers/fake-native-handle.js';

const SAMPLING: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

interface Run {
  tokens: number[];
  outcome: Promise<SequenceOutcome>;
}

/**
 * A batcher with the window policy and an event log ("name:scheduled", "name:end"). Serial loop:
 * these tests place arrivals at exact steps (the overlapped loop sees an arrival one step later;
 * its equivalence with the serial loop is tested in step-loop-overlap.test.ts).
 */
function setup(handle: FakeHandle, options: BatcherOptions = {}) {
  const batcher = new Batcher(handle, { overlap: false, ...options, policy: new WindowPriorityPolicy() });
  const events: string[] = [];
  const submit = (name: string, window: SchedulingWindow, prompt: number[], maxTokens: number): Run => {
    const tokens: number[] = [];
    let resolveOutcome!: (outcome: SequenceOutcome) => void;
    const outcome = new Promise<SequenceOutcome>((resolve) => { resolveOutcome = resolve; });
    batcher.submit({
      promptTokenIds: prompt, maxTokens, sampling: SAMPLING, priority: windowPriority(window),
      sink: {
        onScheduled: () => events.push(`${name}:scheduled`),
        onToken: (t) => { tokens.push(t.tokenId); return false; },
        onEnd: (o) => { events.push(`${name}:end`); resolveOutcome(o); },
      },
    });
    return { tokens, outcome };
  };
  return { batcher, events, submit };
}

/** Tokens of a sequence run alone in a roomy pool. */
async function alone(prompt: number[], maxTokens: number): Promise<number[]> {
  const { submit } = setup(new FakeHandle(1000, 4));
  const run = submit('x', 'asap', prompt, maxTokens);
  await run.outcome;
  return run.tokens;
}

describe('Batcher with the completion-window policy (fake native engine)', () => {
  it('gives the step budget to more urgent sequences first; flex gets what is left', async () => {
    const handle = new FakeHandle(256, 4);
    const { submit, events } = setup(handle, { maxBatchedTokens: 8, maxNumSeqs: 4 });
    const f = submit('f', 'flex', range(20), 3);      // seqId 2: admitted after a
    const a = submit('a', 'asap', range(20, 100), 3); // seqId 1
    await Promise.all([f.outcome, a.outcome]);
    const plans = handle.plans.map((p) => p.map((r) => [r.seqId, r.numTokens]));
    expect(plans.slice(0, 4)).toEqual([[[1, 8]], [[1, 8]], [[1, 4], [2, 4]], [[1, 1], [2, 7]]]);
    for (const plan of handle.plans) if (plan.length === 2) expect(plan[0]!.seqId).toBe(1);
    expect(events.indexOf('a:end')).toBeLessThan(events.indexOf('f:end'));
  });

  it('admits an arriving asap sequence before a running flex prefill takes the budget', async () => {
    const handle = new FakeHandle(256, 4);
    const { submit } = setup(handle, { maxBatchedTokens: 8, maxNumSeqs: 4 });
    const runs: Run[] = [submit('f', 'flex', range(30), 2)];
    handle.onStep = (n) => { if (n === 1) runs.push(submit('a', 'asap', range(8, 100), 2)); };
    await runs[0]!.outcome;
    await runs[1]!.outcome;
    // Step 2: the whole budget goes to a's prompt; f's prefill waits a step.
    expect(handle.plans[1]!.map((r) => [r.seqId, r.numTokens])).toEqual([[2, 8]]);
    expect(handle.plans[2]!.map((r) => [r.seqId, r.numTokens])).toEqual([[2, 1], [1, 7]]);
  });

  it('preempts a running flex sequence when an asap one needs its KV blocks; flex is recomputed to the same tokens', async () => {
    const fPrompt = range(16);
    const expected = await alone(fPrompt, 12);
    const handle = new FakeHandle(8, 4);   // 32 tokens of KV
    const { submit, events, batcher } = setup(handle);
    const runs: Run[] = [submit('f', 'flex', fPrompt, 12)];
    // After f's second step it holds 5 blocks; a's prompt needs 4 of the 3 free.
    handle.onStep = (n) => { if (n === 2) runs.push(submit('a', 'asap', range(16, 200), 3)); };
    const [f] = runs;
    await f!.outcome;
    await runs[1]!.outcome;
    expect(events).toEqual(['f:scheduled', 'a:scheduled', 'a:end', 'f:end']);
    expect(f!.tokens).toEqual(expected);
    await batcher.idle();
    expect(handle.freedSeqIds[0]).toBe(1);   // f's first admission, freed before it finished
    expect(handle.numRejected).toBe(0);
    expect(handle.numFreeBlocks()).toBe(8);
  });

  it('never preempts a sequence of the same window to admit another', async () => {
    const handle = new FakeHandle(8, 4);
    const { submit, events, batcher } = setup(handle);
    const runs: Run[] = [submit('f1', 'flex', range(16), 12)];
    handle.onStep = (n) => { if (n === 2) runs.push(submit('f2', 'flex', range(16, 200), 3)); };
    await runs[0]!.outcome;
    await runs[1]!.outcome;
    await batcher.idle();
    expect(events).toEqual(['f1:scheduled', 'f1:end', 'f2:scheduled', 'f2:end']);
    expect(handle.freedSeqIds).toEqual([1, 2]);
  });

  it('preempts a less urgent sequence when maxNumSeqs is reached', async () => {
    const fPrompt = range(6);
    const expected = await alone(fPrompt, 10);
    const handle = new FakeHandle(256, 4);
    const { submit, events } = setup(handle, { maxNumSeqs: 1 });
    const runs: Run[] = [submit('f', 'flex', fPrompt, 10)];
    handle.onStep = (n) => { if (n === 3) runs.push(submit('s', 'standard', range(6, 50), 3)); };
    await runs[0]!.outcome;
    await runs[1]!.outcome;
    expect(events).toEqual(['f:scheduled', 's:scheduled', 's:end', 'f:end']);
    expect(runs[0]!.tokens).toEqual(expected);
    expect(handle.maxLiveSequences).toBe(1);
  });

  it('preempts nobody when freeing every less urgent sequence would still not make room', async () => {
    const handle = new FakeHandle(8, 4);
    const { submit, events, batcher } = setup(handle);
    // a1 holds 5 blocks, f 1-2 (at most 2); a2 needs 6, so preempting f alone cannot make room.
    const a1 = submit('a1', 'asap', range(16), 2);
    const f = submit('f', 'flex', range(4, 100), 5);
    const runs: Run[] = [a1, f];
    handle.onStep = (n) => { if (n === 1) runs.push(submit('a2', 'asap', range(24, 200), 1)); };
    await Promise.all([a1.outcome, f.outcome]);
    await runs[2]!.outcome;
    await batcher.idle();
    expect(events).toEqual(['a1:scheduled', 'f:scheduled', 'a1:end', 'a2:scheduled', 'a2:end', 'f:end']);
    // Three admissions, three frees: f was never preempted (a re-admission takes a fresh seqId).
    expect([...handle.freedSeqIds].sort()).toEqual([1, 2, 3]);
    expect(f.tokens).toHaveLength(5);
  });

  it('admits no flex sequence while a more urgent head is waiting for room', async () => {
    const handle = new FakeHandle(8, 4);
    const { submit, events } = setup(handle);
    const runs = [
      submit('a1', 'asap', range(20), 4),          // 5 blocks, 6 at the end
      submit('f', 'flex', range(4, 100), 2),       // would fit in the 3 left
      submit('a2', 'asap', range(16, 200), 2),     // 4 blocks: waits for a1
    ];
    await Promise.all(runs.map((r) => r.outcome));
    expect(events.filter((e) => e.endsWith(':scheduled'))).toEqual(['a1:scheduled', 'a2:scheduled', 'f:scheduled']);
    expect(events.indexOf('a2:scheduled')).toBeGreaterThan(events.indexOf('a1:end'));
  });
});
