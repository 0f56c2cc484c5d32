// Prefix caching through the facade on the real native engine: greedy outputs are the same with
// and without a cache hit, usage.cachedTokens counts the whole shared blocks, and a pool far too
// small for the concurrent requests (preemption, eviction) changes no output.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/index.js';

const BLOCK_SIZE = 4;
let root: string;
let tinyDir: string;
let off: Engine;
const engines: Engine[] = [];

async function load(opts: { prefixCaching: boolean; numBlocks?: number }): Promise<Engine> {
  const kvCacheBytes = opts.numBlocks === undefined ? 16 << 20 : opts.numBlocks * off.info.kvCacheBytes / off.info.numBlocks;
  const engine = await Engine.load({
    model: tinyDir, backend: 'cpu', blockSize: BLOCK_SIZE, threads: 2, kvCacheBytes, prefixCaching: opts.prefixCaching,
    maxBatchedTokens: 64, maxNumSeqs: 16,
  });
  engines.push(engine);
  return engine;
}

/** Deterministic token ids below the vocabulary (no special meaning needed: prompts are ids). */
function tokens(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (i * 7 + salt * 13 + 5) % 200 + 3);
}

/** What the cache can serve of `prompt` after `cached` was computed: whole blocks, one token left. */
function expectedCached(sharedPrefix: number, promptLength: number): number {
  return Math.min(Math.floor(sharedPrefix / BLOCK_SIZE), Math.floor((promptLength - 1) / BLOCK_SIZE)) * BLOCK_SIZE;
}

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-prefix-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 5 });
  off = await Engine.load({ model: tinyDir, backend: 'cpu', blockSize: BLOCK_SIZE, threads: 2, kvCacheBytes: 16 << 20, prefixCaching: false });
  engines.push(off);
});
afterAll(async () => {
  for (const engine of engines) await engine.dispose();
  rmSync(root, { recursive: true, force: true });
});

describe('prefix caching', () => {
  it('serves whole shared blocks from the cache with outputs identical to a cache-off engine', async () => {
    const on = await load({ prefixCaching: true });
    expect(on.info.prefixCaching).toBe(true);
    expect(off.info.prefixCaching).toBe(false);
    const a = tokens(30, 1);
    const b = [...a.slice(0, 22), ...tokens(9, 2)];
    const gen = (engine: Engine, promptTokenIds: number[]) => engine.generate({ promptTokenIds, maxTokens: 16, temperature: 0 });

    const first = await gen(on, a);
    expect(first.usage.cachedTokens).toBe(0);
    const hit = await gen(on, b);
    expect(hit.usage.cachedTokens).toBe(expectedCached(22, b.length));  // 20
    expect(hit.tokenIds).toEqual((await gen(off, b)).tokenIds);
    const again = await gen(on, a);
    expect(again.usage.cachedTokens).toBe(expectedCached(30, a.length));  // 28: the last block is computed
    expect(again.tokenIds).toEqual(first.tokenIds);
    expect(again.tokenIds).toEqual((await gen(off, a)).tokenIds);
    expect((await gen(off, a)).usage.cachedTokens).toBe(0);
    // Streaming reports usage on its last chunk; all of b was computed before now.
    let last;
    for await (const chunk of on.stream({ promptTokenIds: b, maxTokens: 4, temperature: 0 })) last = chunk;
    expect(last?.usage?.cachedTokens).toBe(expectedCached(b.length, b.length));  // 28
  });

  it('keeps a keyed prefix (promptCacheKey) under pressure where an unkeyed one is evicted', async () => {
    // 12 blocks. Two 9-token prompts cache 2 blocks each (the first released first); a 33-token
    // prompt then needs 9 blocks with 8 free, so one cached block is evicted: with plain LRU the
    // first prompt's leaf, with the first prompt keyed the unkeyed one's.
    const first = tokens(9, 6), second = tokens(9, 7), filler = tokens(33, 8);
    const gen = (engine: Engine, promptTokenIds: number[], promptCacheKey?: string) =>
      engine.generate({ promptTokenIds, maxTokens: 1, temperature: 0, ...(promptCacheKey && { promptCacheKey }) });
    const want = [await gen(off, first), await gen(off, second)].map((r) => r.tokenIds);
    const cachedAfterPressure = async (firstKey?: string) => {
      const engine = await load({ prefixCaching: true, numBlocks: 12 });
      expect(engine.info.numBlocks).toBe(12);
      await gen(engine, first, firstKey);
      await gen(engine, second);
      await gen(engine, filler);
      // Probing allocates too (a 4-token hit needs 2 new blocks with 1 free, evicting again), so
      // the prompt expected intact is probed first.
      const [a, b] = firstKey
        ? [await gen(engine, first, firstKey), await gen(engine, second)]
        : [await gen(engine, second), await gen(engine, first)].reverse();
      expect([a!.tokenIds, b!.tokenIds]).toEqual(want);
      return [a!.usage.cachedTokens, b!.usage.cachedTokens];
    };
    expect(await cachedAfterPressure()).toEqual([4, 8]);          // LRU: the first prompt lost its leaf
    expect(await cachedAfterPressure('tenant-a')).toEqual([8, 4]);  // keyed: kept; the unkeyed one lost its leaf
    await expect(gen(off, first, 'k'.repeat(257))).rejects.toMatchObject({ code: 'invalid_request', param: 'promptCacheKey' });
  });

  it('keeps every output under eviction pressure with concurrent shared-prefix requests', async () => {
    const small = await load({ prefixCaching: true, numBlocks: 40 });
    const prefixes = [tokens(20, 3), tokens(13, 4), tokens(26, 5)];
    const prompts = Array.from({ length: 24 }, (_, i) => [...prefixes[i % 3]!, ...tokens(i % 6, 10 + i)]);
    const run = (engine: Engine) => Promise.all(prompts.map((promptTokenIds, i) =>
      engine.generate({ promptTokenIds, maxTokens: 6 + (i % 7), temperature: 0 })));
    const want = await run(off);
    for (let round = 0; round < 2; round++) {
      const got = await run(small);
      got.forEach((out, i) => {
        expect(out.tokenIds).toEqual(want[i]!.tokenIds);
        expect(out.usage.cachedTokens % BLOCK_SIZE).toBe(0);
        expect(out.usage.cachedTokens).toBeLessThan(prompts[i]!.length);
      });
      expect(got.some((out) => out.usage.cachedTokens > 0)).toBe(true);
    }
  });
});
