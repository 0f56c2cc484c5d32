// Engine.observe and what the service builds on it: a report per step (tokens computed and sampled,
// preemptions by window) and per request (outcome, tokens, latencies), schedulerStats' per-window
// counts and KV pool, and the periodic engine log line (ticked by hand with an injected clock, so
// nothing here depends on time). Real native engine, CPU backend, tiny model.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/index.js';
import type { EngineObserver, RequestReport, StepReport } from '../src/engine/engine-events.js';
import { EngineStatsLog, checkEngineLogInterval } from '../src/metrics/engine-log.js';
import type { ModelRegistry } from '../src/serving/model-registry.js';

let root: string;
let tinyDir: string;
const engines: Engine[] = [];

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-observer-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 3 });
});
afterAll(async () => {
  for (const engine of engines) await engine.dispose();
  rmSync(root, { recursive: true, force: true });
});

const BLOCK_SIZE = 16;
// tiny: 4 layers x 2 KV heads x 64 dims, K and V in f32 = 4096 bytes a token.
const KV_BLOCK_BYTES = 4 * 2 * 64 * 2 * 4 * BLOCK_SIZE;

async function load(numKvBlocks = 256): Promise<Engine> {
  const engine = await Engine.load({
    model: tinyDir, backend: 'cpu', threads: 2, blockSize: BLOCK_SIZE, kvCacheBytes: numKvBlocks * KV_BLOCK_BYTES,
    maxNumSeqs: 64, maxBatchedTokens: 256,
  });
  engines.push(engine);
  return engine;
}

const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 100 + ((i * 37 + salt * 101) % 1800));

function record(engine: Engine) {
  const steps: StepReport[] = [];
  const requests: RequestReport[] = [];
  const stop = engine.observe({ onStep: (r) => steps.push(r), onRequestEnd: (r) => requests.push(r) });
  return { steps, requests, stop };
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

/**
 * Waits for the step that frees the last ended sequences: a request resolves when it ends, and its
 * blocks go back to the pool in the next step (the pool counts are the last step's).
 */
async function drained(engine: Engine): Promise<void> {
  for (let i = 0; i < 400 && engine.schedulerStats().kvPool.numFreeBlocks < engine.info.numBlocks; i++) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

describe('Engine.observe', () => {
  it('reports each step and each request: tokens computed and sampled, outcome, latencies', async () => {
    const engine = await load();
    const { steps, requests, stop } = record(engine);
    const results = await Promise.all([
      engine.generate({ promptTokenIds: prompt(40, 1), maxTokens: 12, temperature: 0, completionWindow: 'asap', tenant: 'org_a' }),
      engine.generate({ promptTokenIds: prompt(20, 2), maxTokens: 5, temperature: 0 }),
    ]);
    stop();
    expect(requests).toHaveLength(2);
    const asap = requests.find((r) => r.window === 'asap')!;
    expect(asap).toMatchObject({
      tenant: 'org_a', outcome: 'finished', finishReason: 'length', numPromptTokens: 40, numGeneratedTokens: 12, numCachedTokens: 0,
    });
    expect(requests.find((r) => r.window === 'standard')).toMatchObject({ tenant: '', numPromptTokens: 20, numGeneratedTokens: 5 });
    for (const r of requests) {
      expect(r.queuedMs).toBeGreaterThanOrEqual(0);
      expect(r.firstTokenMs).toBeGreaterThanOrEqual(r.queuedMs!);
      expect(r.e2eMs).toBeGreaterThanOrEqual(r.firstTokenMs! + r.decodeMs);
    }
    // Every token sampled once; every prompt token computed once (no cache hit), and every
    // generated token but the last (the serial CPU loop sends no extra rows).
    expect(sum(steps.map((s) => s.numSampledTokens))).toBe(17);
    expect(sum(steps.map((s) => s.numPrefillTokens))).toBe(60);
    expect(sum(steps.map((s) => s.numComputedTokens))).toBe(60 + 11 + 4);
    expect(steps.every((s) => s.ok && s.durationMs >= 0 && s.preempted.length === 0)).toBe(true);
    expect(results.map((r) => r.usage.completionTokens)).toEqual([12, 5]);
  });

  it('reports the window of a preempted sequence, and per-window counts and the KV pool in schedulerStats', async () => {
    // 8 blocks = 128 tokens: flex holds 5 blocks from its first token, asap's 60-token prompt needs
    // 4 of the 3 left, so asap preempts flex (scheduler-engine.test.ts has the scenario).
    const engine = await load(8);
    const { steps, requests } = record(engine);
    let seen: ReturnType<Engine['schedulerStats']> | undefined;
    let asap: Promise<unknown> | undefined;
    const flex = (async () => {
      for await (const chunk of engine.stream({ promptTokenIds: prompt(70, 6), maxTokens: 40, temperature: 0, completionWindow: 'flex' })) {
        if (asap === undefined && chunk.tokenIds.length > 0) {
          asap = engine.generate({ promptTokenIds: prompt(60, 7), maxTokens: 8, temperature: 0, completionWindow: 'asap' });
          seen = engine.schedulerStats();
        }
      }
    })();
    await flex;
    await asap;
    await drained(engine);
    expect(seen!.byWindow).toEqual({
      asap: { numRunning: 0, numWaiting: 1 }, standard: { numRunning: 0, numWaiting: 0 }, flex: { numRunning: 1, numWaiting: 0 },
    });
    expect(seen!.kvPool.numTotalBlocks).toBe(8);
    expect(seen!.kvPool.numFreeBlocks).toBeLessThan(8);
    const preempted = steps.flatMap((s) => s.preempted);
    expect(preempted.length).toBeGreaterThanOrEqual(1);
    expect(new Set(preempted)).toEqual(new Set([2]));   // flex's priority; asap is never a victim here
    expect(requests.map((r) => [r.window, r.outcome, r.numGeneratedTokens])).toEqual([['asap', 'finished', 8], ['flex', 'finished', 40]]);
    const after = engine.schedulerStats();
    expect(after.numRunning + after.numWaiting).toBe(0);
    // Nothing is held: every block is free or cached-and-evictable.
    expect(after.kvPool.numFreeBlocks).toBe(8);
    expect(after.kvPool.numEvictableBlocks).toBe(after.kvPool.numCachedBlocks);
  });

  it('reports a cancelled request as cancelled; an observer that throws harms nothing; unsubscribed observers hear nothing', async () => {
    const engine = await load();
    engine.observe({ onStep: () => { throw new Error('observer bug'); }, onRequestEnd: () => { throw new Error('observer bug'); } });
    const { requests, stop } = record(engine);
    const controller = new AbortController();
    let n = 0;
    await expect((async () => {
      for await (const chunk of engine.stream({ promptTokenIds: prompt(10, 3), maxTokens: 200, signal: controller.signal })) {
        n += chunk.tokenIds.length;
        if (n === 3) controller.abort();
      }
    })()).rejects.toMatchObject({ code: 'cancelled' });
    const ok = await engine.generate({ promptTokenIds: prompt(10, 4), maxTokens: 3 });
    expect(ok.tokenIds).toHaveLength(3);
    expect(requests.map((r) => r.outcome)).toEqual(['cancelled', 'finished']);
    expect(requests[0]!.finishReason).toBeUndefined();
    stop();
    await engine.generate({ promptTokenIds: prompt(10, 5), maxTokens: 2 });
    expect(requests).toHaveLength(2);
  });
});

describe('the periodic engine line', () => {
  it('is written for an interval in which the engine worked, with its throughput; an idle interval writes nothing', async () => {
    const engine = await load();
    const lines: { obj: Record<string, any>; msg: string }[] = [];
    let nowMs = 0;
    const log = new EngineStatsLog({ info: (obj, msg) => lines.push({ obj: obj as Record<string, any>, msg }) }, () => nowMs);
    // A timer that never fires within the test: the ticks are the test's.
    log.start({ models: [{ id: 'tiny', engine }] } as unknown as Pick<ModelRegistry, 'models'>, 3_600_000);
    try {
      log.tick();
      expect(lines).toEqual([]);
      const { steps, stop } = record(engine);
      await Promise.all([
        engine.generate({ promptTokenIds: prompt(30, 8), maxTokens: 10, completionWindow: 'asap' }),
        engine.generate({ promptTokenIds: prompt(50, 9), maxTokens: 20 }),
      ]);
      await drained(engine);
      stop();
      nowMs += 2000;
      log.tick();
      expect(lines).toHaveLength(1);
      const { obj, msg } = lines[0]!;
      expect(obj).toMatchObject({
        model: 'tiny', prompt_tokens_per_s: 40, generation_tokens_per_s: 15, steps: steps.filter((st) => st.numRows > 0).length,
        running: { asap: 0, standard: 0, flex: 0 }, waiting: { asap: 0, standard: 0, flex: 0 }, kv_usage_pct: 0,
      });
      expect(obj.kv_blocks.used + obj.kv_blocks.cached + obj.kv_blocks.free).toBe(engine.info.numBlocks);
      expect(msg).toMatch(/^engine tiny: prompt 40 tokens\/s, generation 15 tokens\/s, running 0 \(asap 0, standard 0, flex 0\)/);
      nowMs += 2000;
      log.tick();
      expect(lines).toHaveLength(1);
    } finally {
      log.stop();
    }
  });

  it('does not count a step that only frees sequences as work', () => {
    // An engine stand-in: the log reads only observe() and schedulerStats().
    let observer: EngineObserver | undefined;
    const idle = { numRunning: 0, numWaiting: 0, byWindow: {}, kvPool: { numTotalBlocks: 8, numFreeBlocks: 8, numEvictableBlocks: 0, numCachedBlocks: 0 } };
    const engine = { observe: (o: EngineObserver) => { observer = o; return () => {}; }, schedulerStats: () => idle };
    const lines: Record<string, unknown>[] = [];
    let nowMs = 0;
    const log = new EngineStatsLog({ info: (obj) => lines.push(obj as Record<string, unknown>) }, () => nowMs);
    log.start({ models: [{ id: 'm', engine }] } as unknown as Pick<ModelRegistry, 'models'>, 3_600_000);
    try {
      const step = (numRows: number, numPrefillTokens: number, numSampledTokens: number, spec = [0, 0, 0]): StepReport => ({
        durationMs: 1, numRows, numComputedTokens: numPrefillTokens + numSampledTokens, numPrefillTokens, numSampledTokens, preempted: [], ok: true,
        numVerifyingRows: spec[0]!, numDraftTokens: spec[1]!, numAcceptedTokens: spec[2]!,
      });
      observer!.onStep!(step(0, 0, 0));
      nowMs = 1000;
      log.tick();
      expect(lines).toEqual([]);
      observer!.onStep!(step(2, 30, 2));
      observer!.onStep!(step(2, 0, 2));
      nowMs = 3000;
      log.tick();
      expect(lines).toMatchObject([{ model: 'm', steps: 2, prompt_tokens_per_s: 15, generation_tokens_per_s: 2 }]);
      expect(lines[0]).not.toHaveProperty('speculative');
      // Speculative decoding: 2 rows verified 8 drafts, 5 accepted, so a row gained 3.5 tokens.
      observer!.onStep!(step(2, 0, 7, [2, 8, 5]));
      nowMs = 4000;
      log.tick();
      expect(lines[1]).toMatchObject({ generation_tokens_per_s: 7, speculative: { acceptance: 0.625, tokens_per_step: 3.5 } });
    } finally {
      log.stop();
    }
  });

  it('takes 0 (off) or 10 ms .. 1 hour', () => {
    expect(checkEngineLogInterval(0)).toBe(0);
    expect(checkEngineLogInterval(10)).toBe(10);
    for (const bad of [5, -1, 3_600_001, Number.NaN]) expect(() => checkEngineLogInterval(bad)).toThrow(/engineLogIntervalMs/);
  });
});
