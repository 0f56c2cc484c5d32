// Unit tests of the continuous-batching mechanism (src/scheduler/batcher.ts) against a fake of
// NativeEngineHandle (test/helpers/fake-native-handle.ts: exact block accounting, tokens that
// depend only on the sequence's tokens). The real engine is tested end to end elsewhere;
// priorities are tested in batcher-priority.test.ts.

import { describe, expect, it } from 'vitest';
import {
  Batcher, FcfsPolicy, type SequenceOutcome, type SequenceRequest, type SequenceView,
} from '../src/scheduler/batcher.js';
import type { NativeSamplingParams } from '../src/native/native-types.js';
import { SluiceError } from '../src/errors.js';
import { FakeHandle } from './helpers/fake-native-handle.js';

const SAMPLING: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };

interface Collected {
  tokens: number[];
  outcome: Promise<SequenceOutcome>;
  scheduled: boolean;
}

function submit(
  batcher: Batcher, prompt: number[], maxTokens: number,
  extra: Partial<SequenceRequest> & { stopAfter?: number } = {},
): Collected {
  const collected = { tokens: [] as number[], scheduled: false } as Collected;
  let resolveOutcome!: (outcome: SequenceOutcome) => void;
  collected.outcome = new Promise((resolve) => { resolveOutcome = resolve; });
  batcher.submit({
    promptTokenIds: prompt, maxTokens, sampling: SAMPLING, signal: extra.signal,
    sink: {
      onScheduled: () => { collected.scheduled = true; },
      onToken: (t) => {
        collected.tokens.push(t.tokenId);
        return extra.stopAfter !== undefined && collected.tokens.length >= extra.stopAfter;
      },
      onEnd: (outcome) => resolveOutcome(outcome),
    },
  });
  return collected;
}

const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

describe('Batcher mechanism (fake native engine)', () => {
  it('prefills a prompt in one step, then decodes one token per step, and frees the sequence', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle);
    const a = submit(batcher, range(10), 5);
    expect(await a.outcome).toEqual({ kind: 'finished' });
    expect(a.tokens).toHaveLength(5);
    expect(a.scheduled).toBe(true);
    expect(handle.plans.map((p) => p.map((r) => r.numTokens))).toEqual([[10], [1], [1], [1], [1]]);
    await batcher.idle();  // the next plan frees it
    expect(handle.sequences.size).toBe(0);
    expect(handle.numFreeBlocks()).toBe(64);
  });

  it('splits a long prompt across steps (chunked prefill) under maxBatchedTokens', async () => {
    const handle = new FakeHandle(64, 4);
    const a = submit(new Batcher(handle, { maxBatchedTokens: 8, maxNumSeqs: 4 }), range(20), 2);
    await a.outcome;
    expect(handle.plans.map((p) => p.map((r) => r.numTokens))).toEqual([[8], [8], [4], [1]]);
  });

  it('mixes decodes and prefill chunks within the token budget, decodes first', async () => {
    const handle = new FakeHandle(256, 4);
    const batcher = new Batcher(handle, { maxBatchedTokens: 8, maxNumSeqs: 4 });
    const outs = [submit(batcher, range(6), 6), submit(batcher, range(12, 50), 6), submit(batcher, range(9, 80), 6)];
    await Promise.all(outs.map((o) => o.outcome));
    for (const plan of handle.plans) {
      expect(plan.reduce((n, r) => n + r.numTokens, 0)).toBeLessThanOrEqual(8);
    }
    // Step 2: the first sequence decodes (1) while the second continues its prefill (7).
    expect(handle.plans[0]!.map((r) => r.numTokens)).toEqual([6, 2]);
    expect(handle.plans[1]!.map((r) => r.numTokens)).toEqual([1, 7]);
    expect(outs.every((o) => o.tokens.length === 6)).toBe(true);
  });

  it('runs at most maxNumSeqs sequences at once', async () => {
    const handle = new FakeHandle(256, 4);
    const batcher = new Batcher(handle, { maxNumSeqs: 2 });
    const outs = range(5).map((i) => submit(batcher, range(5, i * 10), 4));
    await Promise.all(outs.map((o) => o.outcome));
    expect(handle.maxLiveSequences).toBe(2);
  });

  it('preempts the most recently admitted sequence when blocks run out and recomputes it later', async () => {
    const prompts = [range(6, 1), range(6, 20), range(6, 40)];
    const reference = new FakeHandle(1000, 2);
    const refBatcher = new Batcher(reference);
    const expected = await Promise.all(prompts.map(async (p) => {
      const c = submit(refBatcher, p, 10);
      await c.outcome;
      return c.tokens;
    }));

    // 16 tokens of KV per sequence at the end (6 + 10): three need 24 blocks; the pool has 12.
    const handle = new FakeHandle(12, 2);
    const batcher = new Batcher(handle);
    const outs = prompts.map((p) => submit(batcher, p, 10));
    const outcomes = await Promise.all(outs.map((o) => o.outcome));
    expect(outcomes.every((o) => o.kind === 'finished')).toBe(true);
    expect(outs.map((o) => o.tokens)).toEqual(expected);   // output kept across preemption
    expect(handle.numRejected).toBe(0);                    // never planned past the free blocks
    expect(handle.freedSeqIds.length).toBeGreaterThan(3);  // someone was preempted (fresh ids on re-admission)
    // The first admitted sequence (seq 1) is never the victim.
    expect(handle.freedSeqIds.indexOf(1)).toBeGreaterThanOrEqual(0);
    expect(handle.plans.filter((p) => p.some((r) => r.seqId === 1)).length).toBe(10);
    await batcher.idle();
    expect(handle.numFreeBlocks()).toBe(12);
  });

  it('admits only when the whole prompt fits in the free blocks', async () => {
    const handle = new FakeHandle(6, 4);   // 24 tokens of KV
    const batcher = new Batcher(handle);
    const a = submit(batcher, range(12), 4);   // 3 blocks now, 4 at the end
    const b = submit(batcher, range(12, 30), 4);
    await Promise.all([a.outcome, b.outcome]);
    // b's prompt (3 blocks) fits next to a's 3 blocks: both run in the first step.
    expect(handle.plans[0]!.map((r) => r.numTokens)).toEqual([12, 12]);
    expect(a.tokens).toHaveLength(4);
    expect(b.tokens).toHaveLength(4);
  });

  it('rejects a request that can never fit in the pool', () => {
    const batcher = new Batcher(new FakeHandle(4, 4));   // 16 tokens
    expect(() => submit(batcher, range(10), 8)).toThrow(SluiceError);
    try {
      submit(batcher, range(10), 8);
    } catch (err) {
      expect((err as SluiceError).code).toBe('request_too_large');
      expect((err as Error).message).toMatch(/17 tokens .* 16 tokens/);
    }
    // Exactly fitting: 10 + 7 - 1 = 16 tokens of KV.
    expect(() => submit(batcher, range(10), 7)).not.toThrow();
  });

  it('finishes a sequence when its sink asks to stop, and frees it', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle);
    const a = submit(batcher, range(4), 50, { stopAfter: 3 });
    expect(await a.outcome).toEqual({ kind: 'finished' });
    expect(a.tokens).toHaveLength(3);
    await batcher.idle();
    expect(handle.sequences.size).toBe(0);
  });

  it('cancels through the AbortSignal: the sequence is freed and ends as cancelled', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle);
    const controller = new AbortController();
    const a = submit(batcher, range(4), 200, { signal: controller.signal });
    const b = submit(batcher, range(4, 9), 5);
    while (a.tokens.length < 3) await new Promise((r) => setImmediate(r));
    controller.abort();
    expect(await a.outcome).toEqual({ kind: 'cancelled' });
    expect(await b.outcome).toEqual({ kind: 'finished' });
    await batcher.idle();
    expect(handle.sequences.size).toBe(0);
    expect(handle.numFreeBlocks()).toBe(64);
  });

  it('ends an already-aborted request without running it', async () => {
    const handle = new FakeHandle(64, 4);
    const a = submit(new Batcher(handle), range(4), 5, { signal: AbortSignal.abort() });
    expect(await a.outcome).toEqual({ kind: 'cancelled' });
    expect(handle.plans).toHaveLength(0);
  });

  it('stops stepping when idle and restarts on new work', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle);
    await submit(batcher, range(4), 2).outcome;
    const numSteps = handle.plans.length;
    for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
    expect(handle.plans.length).toBe(numSteps);
    await submit(batcher, range(4), 2).outcome;
    expect(handle.plans.length).toBe(numSteps + 2);
  });

  it('fails the planned sequences when a native step fails, and keeps serving', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle);
    handle.failNextStep = new Error('device lost');
    const a = submit(batcher, range(4), 3);
    const outcome = await a.outcome;
    expect(outcome.kind).toBe('failed');
    expect(((outcome as { error: SluiceError }).error).code).toBe('engine_error');
    await batcher.idle();
    expect(handle.sequences.size).toBe(0);
    expect((await submit(batcher, range(4), 3).outcome).kind).toBe('finished');
  });

  it('dispose fails waiting and running sequences with engine_disposed', async () => {
    const handle = new FakeHandle(64, 4);
    const batcher = new Batcher(handle, { maxNumSeqs: 1 });
    const a = submit(batcher, range(4), 200);
    const b = submit(batcher, range(4), 200);
    while (a.tokens.length < 2) await new Promise((r) => setImmediate(r));
    await batcher.dispose();
    for (const o of [await a.outcome, await b.outcome]) {
      expect(o.kind).toBe('failed');
      expect(((o as { error: SluiceError }).error).code).toBe('engine_disposed');
    }
    expect(handle.sequences.size).toBe(0);
    expect(() => submit(batcher, range(4), 2)).toThrow(/disposed/);
  });

  it('takes admission order from a pluggable policy (here: shortest prompt first)', async () => {
    class ShortestFirst extends FcfsPolicy {
      override waiting(): readonly SequenceView[] {
        return [...super.waiting()].sort((a, b) => a.numPromptTokens - b.numPromptTokens);
      }
    }
    const handle = new FakeHandle(256, 4);
    const batcher = new Batcher(handle, { maxNumSeqs: 1, policy: new ShortestFirst() });
    const order: string[] = [];
    const track = (name: string, c: Collected) => c.outcome.then(() => order.push(name));
    await Promise.all([
      track('long', submit(batcher, range(30), 2)),
      track('short', submit(batcher, range(3), 2)),
      track('medium', submit(batcher, range(10), 2)),
    ]);
    expect(order).toEqual(['short', 'medium', 'long']);
  });
});
