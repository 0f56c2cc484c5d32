// Failure isolation and tenant fairness in the continuous-batching loop (src/scheduler/batcher.ts),
// on the fake native engine: whatever goes wrong with one sequence ends that sequence alone, a
// device fault puts the engine out of service with a reason, and within a window tenants share
// the running slots (fair-share preemption) and take turns at admission.

import { describe, expect, it } from 'vitest';
import { Batcher, type SequenceOutcome, type SequenceRequest } from '../src/scheduler/batcher.js';
import type { NativeSamplingParams } from '../src/native/native-types.js';
import { WindowPriorityPolicy } from '../src/scheduler/window-policy.js';
import { FakeHandle } from './helpers/fake-native-handle.js';

const SAMPLING: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };

interface Run {
  tokens: number[];
  outcome: Promise<SequenceOutcome>;
  admittedAtStep: number | undefined;
}

function submit(batcher: Batcher, handle: FakeHandle, prompt: number[], maxTokens: number,
  extra: Partial<SequenceRequest> = {}): Run {
  const run = { tokens: [] as number[], admittedAtStep: undefined } as Run;
  let resolve!: (o: SequenceOutcome) => void;
  run.outcome = new Promise((r) => { resolve = r; });
  batcher.submit({
    promptTokenIds: prompt, maxTokens, sampling: SAMPLING, ...extra,
    sink: {
      onScheduled: () => { run.admittedAtStep = handle.plans.length + 1; },
      onToken: (t) => { run.tokens.push(t.tokenId); return false; },
      onEnd: resolve,
    },
  });
  return run;
}

const prompt = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

async function cleanRun(prompts: number[][]): Promise<number[][]> {
  const handle = new FakeHandle(256, 4);
  const batcher = new Batcher(handle, { maxNumSeqs: 8 });
  const runs = prompts.map((p) => submit(batcher, handle, p, 5));
  await Promise.all(runs.map((r) => r.outcome));
  return runs.map((r) => r.tokens);
}

describe('Batcher: one sequence\'s failure is its own', () => {
  const prompts = [prompt(6, 10), prompt(7, 100), prompt(5, 200), prompt(9, 300)];

  it('a sequence the engine refuses at admission fails alone (today: every other one failed)', async () => {
    const expected = await cleanRun(prompts);
    const handle = new FakeHandle(256, 4);
    handle.refuseAdd = (p) => (p[0] === 200
      ? { code: 'INVALID_ARGUMENT', message: 'top_k must be an integer in [0, 2147483647]' } : undefined);
    const batcher = new Batcher(handle, { maxNumSeqs: 8 });
    const runs = prompts.map((p) => submit(batcher, handle, p, 5));
    const outcomes = await Promise.all(runs.map((r) => r.outcome));
    expect(outcomes[2]).toMatchObject({ kind: 'failed', error: { code: 'invalid_request' } });
    for (const i of [0, 1, 3]) {
      expect(outcomes[i]).toEqual({ kind: 'finished' });
      expect(runs[i]!.tokens).toEqual(expected[i]);
    }
    // The loop lives on.
    const later = submit(batcher, handle, prompt(4, 500), 3);
    expect(await later.outcome).toEqual({ kind: 'finished' });
    await batcher.idle();
    expect(handle.sequences.size).toBe(0);
  });

  it('a row the step reports as failed ends its sequence only', async () => {
    const expected = await cleanRun(prompts);
    const handle = new FakeHandle(256, 4);
    let failures = 0;
    // Fails sequence 100's row once it has decoded two tokens (a row failure mid-generation).
    handle.failRow = (tokens) => (tokens[0] === 100 && tokens.length === 9 && failures++ === 0 ? 'injected sampler fault' : undefined);
    const batcher = new Batcher(handle, { maxNumSeqs: 8 });
    const runs = prompts.map((p) => submit(batcher, handle, p, 5));
    const outcomes = await Promise.all(runs.map((r) => r.outcome));
    expect(outcomes[1]).toMatchObject({ kind: 'failed', error: { code: 'engine_error' } });
    expect((outcomes[1] as { error: Error }).error.message).toContain('injected sampler fault');
    expect(runs[1]!.tokens).toEqual(expected[1]!.slice(0, 2));
    for (const i of [0, 2, 3]) expect(runs[i]!.tokens).toEqual(expected[i]);
    await batcher.idle();
    expect(handle.sequences.size).toBe(0);
  });

  it('a device fault fails everything with engine_broken, once, and refuses new work', async () => {
    const handle = new FakeHandle(256, 4);
    const reasons: string[] = [];
    const batcher = new Batcher(handle, { maxNumSeqs: 8, onBroken: (r) => reasons.push(r) });
    const runs = prompts.map((p) => submit(batcher, handle, p, 50));
    handle.onStep = (n) => {
      if (n === 2) handle.failNextStep = Object.assign(new Error('CUDA: cudaIllegalAddress'), { code: 'DEVICE_FAULT' });
    };
    const outcomes = await Promise.all(runs.map((r) => r.outcome));
    for (const o of outcomes) expect(o).toMatchObject({ kind: 'failed', error: { code: 'engine_broken' } });
    expect(reasons).toEqual(['CUDA: cudaIllegalAddress']);
    expect(batcher.brokenReason).toBe('CUDA: cudaIllegalAddress');
    expect(() => submit(batcher, handle, prompt(3, 1), 2)).toThrow(expect.objectContaining({ code: 'engine_broken' }));
  });
});

describe('Batcher: tenants share a window', () => {
  it('a tenant below its fair share preempts one holding more, in its own window', async () => {
    const handle = new FakeHandle(1024, 4);
    const batcher = new Batcher(handle, { maxNumSeqs: 4, policy: new WindowPriorityPolicy() });
    // Tenant B fills every running slot with long requests and queues more.
    const flood = Array.from({ length: 12 }, (_, i) => submit(batcher, handle, prompt(4, 1000 + 10 * i), 400, { tenant: 'B' }));
    // Wait for B to fill the slots (long requests: 40 tokens each could all finish before the check, a 1-in-5 flake).
    for (let waited = 0; batcher.numRunning < 4 && waited < 2000; waited += 5) await new Promise((r) => setTimeout(r, 5));
    expect(batcher.numRunning).toBe(4);
    const stepsBefore = handle.plans.length;
    const a = submit(batcher, handle, prompt(4, 50), 3, { tenant: 'A' });
    await a.outcome;
    // Admitted in the first step planned after it arrived (B's youngest was preempted), not after a
    // B request ended. The overlapped loop has up to two steps submitted when A arrives (the one
    // running and the next), so that is step stepsBefore + 3 at the latest; its onScheduled comes
    // with that step's result.
    expect(a.admittedAtStep).toBeLessThanOrEqual(stepsBefore + 4);
    expect(await Promise.all(flood.map((f) => f.outcome))).toEqual(flood.map(() => ({ kind: 'finished' })));
    // Preemption is recomputation: B's outputs are what they would have been.
    const expected = await cleanRun(flood.map((_, i) => prompt(4, 1000 + 10 * i)).slice(0, 1));
    expect(flood[0]!.tokens.slice(0, 5)).toEqual(expected[0]);
  });

  it('same-tenant requests never preempt each other (no fair-share move without a second tenant)', async () => {
    const handle = new FakeHandle(1024, 4);
    const batcher = new Batcher(handle, { maxNumSeqs: 2, policy: new WindowPriorityPolicy() });
    const runs = Array.from({ length: 5 }, (_, i) => submit(batcher, handle, prompt(4, 10 * i + 1), 6, { tenant: 'B' }));
    await Promise.all(runs.map((r) => r.outcome));
    // One native sequence id per request: nobody was preempted (that would re-admit under a new id).
    expect(new Set(handle.plans.flat().map((r) => r.seqId)).size).toBe(5);
  });

  it('passes each request\'s tenant to the engine as its prefix-cache scope', async () => {
    const handle = new FakeHandle(256, 4);
    const batcher = new Batcher(handle);
    await Promise.all([submit(batcher, handle, prompt(5, 1), 2, { tenant: 'org_a' }).outcome,
      submit(batcher, handle, prompt(5, 1), 2).outcome]);
    expect([...handle.scopes.values()].sort()).toEqual(['', 'org_a']);
  });
});
