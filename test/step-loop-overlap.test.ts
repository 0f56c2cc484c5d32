// The step loop's two promises: one plan in and one result out per step (the native contract,
// through the addon), and an overlapped loop (step N+1 planned and submitted while step N runs)
// whose outputs are token for token those of the serial loop, with preemptions, cancellations,
// stop strings and prefix-cache hits in flight. On the fake engine (exact control) and on the real
// one (tiny model, CPU).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, type GenerateRequest } from '../src/index.js';
import { loadNativeEngine } from '../src/native/native.js';
import {
  ADD_ADMITTED, ADD_FAILED, ADD_NO_KV_BLOCKS, ROW_FAILED, ROW_NO_KV_BLOCKS, ROW_RAN, type NativeSamplingParams,
} from '../src/native/native-types.js';
import { Batcher, type SequenceOutcome } from '../src/scheduler/batcher.js';
import { WindowPriorityPolicy, windowPriority, type SchedulingWindow } from '../src/scheduler/window-policy.js';
import { FakeHandle } from './helpers/fake-native-handle.js';

const GREEDY: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

let root: string;
let tinyDir: string;
beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-overlap-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 21 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('one plan in, one result out (the addon)', () => {
  it('frees, adds and rows in one plan; every outcome is a value, with the counts the next plan needs', async () => {
    // 8 blocks of 4 tokens.
    const probe = await loadNativeEngine({ modelDir: tinyDir, backend: 'cpu', kvCacheBytes: 1 << 20, blockSize: 4, numThreads: 1 });
    const perBlock = probe.info().kvCacheBytes / probe.info().numBlocks;
    probe.dispose();
    const handle = await loadNativeEngine({
      modelDir: tinyDir, backend: 'cpu', kvCacheBytes: 8 * perBlock, blockSize: 4, numThreads: 1, prefixCaching: true,
    });
    try {
      expect(handle.info().numBlocks).toBe(8);
      const empty = { seqIds: new Uint32Array(0), numTokens: new Uint32Array(0) };
      const prompt = Int32Array.from(range(13, 10));
      // Two adds: 1 (13 tokens, 4 blocks) fits; 2 (4 more blocks) fits too; 3 (a token outside the vocabulary) fails.
      const r1 = await handle.step({
        seqIds: Uint32Array.of(1, 2, 3), numTokens: Uint32Array.of(100, 5, 1),
        adds: [
          { seqId: 1, promptTokens: prompt, sampling: GREEDY },
          { seqId: 2, promptTokens: Int32Array.from(range(16, 40)), sampling: GREEDY },
          { seqId: 3, promptTokens: Int32Array.of(1 << 30), sampling: GREEDY },
        ],
      });
      expect([...r1.addStatus]).toEqual([ADD_ADMITTED, ADD_ADMITTED, ADD_FAILED]);
      expect([...r1.addCached]).toEqual([0, 0, -1]);
      expect(r1.errors.map((e) => [e.seqId, e.code])).toEqual([[3, 'INVALID_ARGUMENT'], [3, 'SEQ_UNKNOWN']]);
      expect([...r1.rowStatus]).toEqual([ROW_RAN, ROW_RAN, ROW_FAILED]);
      // The bound 100 computed the 13 tokens there were (and sampled); 2 computed 5 of 16.
      expect([...r1.rowComputed]).toEqual([13, 5, 0]);
      expect([...r1.rowPending]).toEqual([1, 11, 0]);
      expect([...r1.rowBlocks]).toEqual([4, 2, 0]);
      expect([...r1.seqIds]).toEqual([1]);
      expect(r1.numFreeBlocks).toBe(2);
      // 2's 11 remaining tokens claim the 2 free blocks; the add of 6 comes after them and does not
      // fit: refused, and its row with it. Values, not exceptions.
      const r2 = await handle.step({
        seqIds: Uint32Array.of(2, 6), numTokens: Uint32Array.of(11, 4),
        adds: [{ seqId: 6, promptTokens: Int32Array.from(range(4, 90)), sampling: GREEDY }],
      });
      expect([...r2.addStatus]).toEqual([ADD_NO_KV_BLOCKS]);
      expect([...r2.rowStatus]).toEqual([ROW_RAN, ROW_NO_KV_BLOCKS]);
      expect([...r2.rowComputed]).toEqual([11, 0]);
      expect(r2.numFreeBlocks).toBe(0);
      // 2 sampled; decoding it needs a fifth block and the pool is full: the row is skipped.
      const r2b = await handle.step({ seqIds: Uint32Array.of(2), numTokens: Uint32Array.of(1) });
      expect([...r2b.rowStatus]).toEqual([ROW_NO_KV_BLOCKS]);
      // Freeing 1 and 2 leaves their full blocks cached (3 + 4, evictable, counted free); the same
      // prompt as 1 hits its 12 first tokens.
      const r3 = await handle.step({
        ...empty, frees: Uint32Array.of(1, 2, 99), adds: [{ seqId: 4, promptTokens: prompt, sampling: GREEDY }],
      });
      expect([...r3.addStatus]).toEqual([ADD_ADMITTED]);
      expect([...r3.addCached]).toEqual([12]);
      expect(r3.numCachedBlocks).toBe(7);
      expect(r3.numFreeBlocks).toBe(5);
      expect(r3.numEvictableBlocks).toBe(4);
      // A prompt whose blocks cannot fit even in an empty pool is refused as a value, nothing kept.
      const r4 = await handle.step({ ...empty, adds: [{ seqId: 5, promptTokens: Int32Array.from(range(40, 300)), sampling: GREEDY }] });
      expect([...r4.addStatus]).toEqual([ADD_NO_KV_BLOCKS]);
      const r5 = await handle.step({ ...empty, frees: Uint32Array.of(4, 5) });
      expect(r5.numFreeBlocks).toBe(8);
    } finally {
      handle.dispose();
    }
  });

  it('queues a step submitted while another runs and runs them in order', async () => {
    const handle = await loadNativeEngine({ modelDir: tinyDir, backend: 'cpu', kvCacheBytes: 4 << 20, blockSize: 4, numThreads: 1 });
    try {
      const first = handle.step({
        seqIds: Uint32Array.of(1), numTokens: Uint32Array.of(64),
        adds: [{ seqId: 1, promptTokens: Int32Array.from(range(20, 5)), sampling: GREEDY }],
      });
      // Submitted before the first settles: it decodes the token the first samples.
      const second = handle.step({ seqIds: Uint32Array.of(1), numTokens: Uint32Array.of(64) });
      const [r1, r2] = await Promise.all([first, second]);
      expect([...r1.rowComputed, ...r2.rowComputed]).toEqual([20, 1]);
      expect(r1.seqIds.length + r2.seqIds.length).toBe(2);
      await handle.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.of(1) });
    } finally {
      handle.dispose();
    }
  });
});

/** A workload on the fake engine: tokens and outcomes per request, in the given loop mode. */
async function fakeWorkload(overlap: boolean) {
  const handle = new FakeHandle(14, 2);  // small: preemptions
  const batcher = new Batcher(handle, { maxBatchedTokens: 12, maxNumSeqs: 5, overlap, policy: new WindowPriorityPolicy() });
  const windows: SchedulingWindow[] = ['flex', 'asap', 'standard', 'flex', 'asap', 'flex', 'standard'];
  const runs = windows.map((window, i) => {
    const tokens: number[] = [];
    const controller = new AbortController();
    const outcome = new Promise<SequenceOutcome>((resolve) => batcher.submit({
      promptTokenIds: range(3 + (i * 5) % 9, 10 * i), maxTokens: 6 + i, sampling: GREEDY, priority: windowPriority(window),
      signal: controller.signal,
      sink: {
        onToken: (t) => {
          tokens.push(t.tokenId);
          if (i === 2 && tokens.length === 3) controller.abort();   // cancelled mid-way
          return i === 4 && tokens.length === 4;                     // a stop condition
        },
        onEnd: resolve,
      },
    }));
    return { tokens, outcome };
  });
  const outcomes = await Promise.all(runs.map((r) => r.outcome));
  await batcher.idle();
  return { tokens: runs.map((r) => r.tokens), outcomes, handle };
}

describe('the overlapped loop', () => {
  it('keeps the next step queued behind the running one', async () => {
    for (const overlap of [true, false]) {
      const { handle } = await fakeWorkload(overlap);
      expect(handle.maxQueuedSteps).toBe(overlap ? 2 : 1);
      expect(handle.sequences.size).toBe(0);
    }
  });

  it('gives the serial loop\'s outputs on the fake engine: preemption, cancellation and stops in flight', async () => {
    const serial = await fakeWorkload(false);
    const overlapped = await fakeWorkload(true);
    expect(serial.handle.freedSeqIds.length).toBeGreaterThan(7);  // someone was preempted
    expect(overlapped.handle.freedSeqIds.length).toBeGreaterThan(7);
    expect(overlapped.outcomes).toEqual(serial.outcomes);
    expect(overlapped.tokens).toEqual(serial.tokens);
    expect(serial.outcomes[2]).toEqual({ kind: 'cancelled' });
    expect(serial.tokens[2]).toHaveLength(3);
    expect(serial.tokens[4]).toHaveLength(4);
  });

  it('gives the serial loop\'s outputs on the real engine: sampling, stop strings, a tiny pool, prefix hits', async () => {
    const shared = range(24, 7);
    const requests: GenerateRequest[] = Array.from({ length: 8 }, (_, i) => ({
      promptTokenIds: i % 2 === 0 ? [...shared, ...range(3 + i, 100 + 9 * i)] : range(6 + 2 * i, 300 + 11 * i),
      maxTokens: 10 + i, temperature: 0.8, topP: 0.9, seed: 1000 + i,
      ...(i % 2 === 0 && { promptCacheKey: 'k' }),
      completionWindow: (['asap', 'standard', 'flex'] as const)[i % 3]!,
    }));
    const outputs = async (overlapSteps: boolean, prefixCaching: boolean) => {
      const probe = await Engine.load({ model: tinyDir, backend: 'cpu', threads: 2, blockSize: 4, kvCacheBytes: 1 << 20 });
      const perBlock = probe.info.kvCacheBytes / probe.info.numBlocks;
      await probe.dispose();
      const e = await Engine.load({
        // 24 blocks of 4 tokens for six sequences of up to 50 tokens: preemptions.
        model: tinyDir, backend: 'cpu', threads: 2, blockSize: 4, kvCacheBytes: 24 * perBlock, prefixCaching, overlapSteps,
        maxBatchedTokens: 32, maxNumSeqs: 6,
      });
      try {
        // The first text of every output is a stop string for the next run (found in the stream).
        const first = await Promise.all(requests.map((r) => e.generate(r)));
        const stops = first.map((r) => r.text.slice(2, 5)).filter((s) => s.trim().length === 3);
        const second = await Promise.all(requests.map((r, i) => e.generate(i % 3 === 0 ? { ...r, stop: stops.slice(0, 2) } : r)));
        return {
          out: [...first, ...second].map((r) => ({ ids: r.tokenIds, text: r.text, finish: r.finishReason })),
          cached: second.reduce((n, r) => n + r.usage.cachedTokens, 0),
        };
      } finally {
        await e.dispose();
      }
    };
    const serial = await outputs(false, true);
    const overlapped = await outputs(true, true);
    const uncached = await outputs(true, false);
    expect(overlapped.out).toEqual(serial.out);
    expect(uncached.out).toEqual(serial.out);
    expect(overlapped.cached).toBeGreaterThan(0);
    expect(serial.out.some((o) => o.finish === 'stop')).toBe(true);
  }, 120_000);
});
