// Failure isolation on the real native engine, through the Batcher: a fault injected into one row
// of a busy step (while it is prepared, or while it is sampled) fails that request alone and the
// others generate exactly what they generate without the fault; a device fault puts the engine
// out of service (engine_broken) and its reason is reported; tenants never share prefix blocks.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { Batcher, type SequenceOutcome } from '../src/scheduler/batcher.js';
import { Engine } from '../src/engine/engine.js';
import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle, NativeFaultPoint, NativeSamplingParams } from '../src/native/native-types.js';

let root: string;
let modelDir: string;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-isolation-'));
  modelDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 11 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const load = (prefixCaching = false) => loadNativeEngine({
  modelDir, backend: 'cpu', kvCacheBytes: 32 << 20, blockSize: 4, numThreads: 2, prefixCaching,
});

const prompts = Array.from({ length: 6 }, (_, i) => Array.from({ length: 9 + 3 * i }, (_, j) => (j * 11 + i * 17 + 3) % 1900 + 5));
const sampling = (i: number): NativeSamplingParams => ({ temperature: 0.9, topP: 0.95, topK: 0, seed: BigInt(100 + i), logprobs: 0 });

/** Runs the six prompts together (one busy step at a time); optionally faults request `faulty`. */
async function runBusy(handle: NativeEngineHandle, fault?: { index: number; point: NativeFaultPoint }) {
  const batcher = new Batcher(handle, { maxNumSeqs: 8 });
  const tokens = prompts.map(() => [] as number[]);
  const outcomes = prompts.map((prompt, i) => new Promise<SequenceOutcome>((resolve) => {
    batcher.submit({
      promptTokenIds: prompt, maxTokens: 8, sampling: sampling(i),
      sink: {
        onScheduled: () => {
          // The batcher gives native ids in admission order from 1; all six are admitted in step 1.
          if (fault?.index === i) handle.injectFault!(i + 1, fault.point);
        },
        onToken: (t) => { tokens[i]!.push(t.tokenId); return false; },
        onEnd: resolve,
      },
    });
  }));
  const done = await Promise.all(outcomes);
  await batcher.idle();  // every sequence freed in the engine (the next run reuses the ids)
  return { tokens, outcomes: done };
}

/** KV blocks an allocation can get now, as the engine reports it after an empty step. */
async function numFreeBlocks(handle: NativeEngineHandle): Promise<number> {
  return (await handle.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0) })).numFreeBlocks;
}

describe('one row\'s fault on the real engine', () => {
  for (const point of ['prepare', 'sample'] as const) {
    it(`a fault while one row is ${point === 'prepare' ? 'prepared' : 'sampled'} fails that request only`, async () => {
      const handle = await load();
      try {
        const clean = await runBusy(handle);
        expect(clean.outcomes.every((o) => o.kind === 'finished')).toBe(true);
        const faulted = await runBusy(handle, { index: 3, point });
        expect(faulted.outcomes[3]).toMatchObject({ kind: 'failed', error: { code: 'engine_error' } });
        expect((faulted.outcomes[3] as { error: Error }).error.message).toContain('injected');
        for (const i of [0, 1, 2, 4, 5]) {
          expect(faulted.outcomes[i]).toEqual({ kind: 'finished' });
          expect(faulted.tokens[i]).toEqual(clean.tokens[i]);
        }
        // The engine serves on, and nothing leaked.
        expect((await runBusy(handle)).tokens).toEqual(clean.tokens);
        expect(await numFreeBlocks(handle)).toBe(handle.info().numBlocks);
      } finally {
        handle.dispose();
      }
    });
  }

  it('a device fault breaks the engine: every request fails engine_broken, the reason is reported', async () => {
    const messages: string[] = [];
    const engine = await Engine.load({ model: modelDir, backend: 'cpu', threads: 1, kvCacheBytes: 16 << 20, onMessage: (m) => messages.push(m) });
    try {
      engine.injectDeviceFault();
      const results = await Promise.allSettled([0, 1, 2].map((i) => engine.generate({ prompt: `hello ${i}`, maxTokens: 4 })));
      for (const r of results) expect(r).toMatchObject({ status: 'rejected', reason: { code: 'engine_broken' } });
      expect(engine.brokenReason).toContain('injected device fault');
      expect(messages.some((m) => m.includes('out of service') && m.includes('injected device fault'))).toBe(true);
      await expect(engine.generate({ prompt: 'again', maxTokens: 2 })).rejects.toMatchObject({ code: 'engine_broken' });
    } finally {
      await engine.dispose();
    }
  });

  it('a topK the engine cannot hold is refused for that request alone', async () => {
    const engine = await Engine.load({ model: modelDir, backend: 'cpu', threads: 1, kvCacheBytes: 16 << 20 });
    try {
      const [bad, good] = await Promise.allSettled([
        engine.generate({ prompt: 'one', maxTokens: 3, topK: 2 ** 31 }),
        engine.generate({ prompt: 'two', maxTokens: 3, temperature: 0 }),
      ]);
      expect(bad).toMatchObject({ status: 'rejected', reason: { code: 'invalid_request', param: 'topK' } });
      expect(good).toMatchObject({ status: 'fulfilled' });
    } finally {
      await engine.dispose();
    }
  });
});

describe('prefix cache scopes on the real engine', () => {
  it('a tenant never hits another tenant\'s cached prefix; its own repeat does', async () => {
    const engine = await Engine.load({ model: modelDir, backend: 'cpu', threads: 1, kvCacheBytes: 16 << 20, blockSize: 4 });
    try {
      const promptTokenIds = prompts[5]!;
      const run = async (tenant: string | undefined) => (await engine.generate({
        promptTokenIds, maxTokens: 2, temperature: 0, ...(tenant !== undefined && { tenant }) })).usage.cachedTokens;
      expect(await run('org_a')).toBe(0);
      expect(await run('org_b')).toBe(0);
      expect(await run(undefined)).toBe(0);
      expect(await run('org_a')).toBe(Math.floor((promptTokenIds.length - 1) / 4) * 4);
    } finally {
      await engine.dispose();
    }
  });
});
