// LoRA adapters under a memory budget on the real engine (issue 36): more adapters than fit stay
// known, the least recently used idle ones are retired to make room and loaded again when a
// request names them; every request gets what the engine with all adapters resident gives, and
// the resident bytes never exceed the budget. The residency rules alone: test/adapter-set.test.ts.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { writeLoraAdapter } from '../models/lora-checkpoint.js';
import { makeModel } from '../models/make-model.js';
import { declaredAdapterBytes } from '../src/engine/adapter-set.js';
import { Engine } from '../src/engine/engine.js';
import { nativeAvailable } from '../src/native/native.js';
import { parseCatalog } from '../src/config/catalog.js';
import { ModelRegistry } from '../src/serving/model-registry.js';

const PROMPTS = ['the cat sat on the mat', 'one two three four', 'a b c d e f g', 'hello world'];
const NAMES = ['t1', 't2', 't3', 't4', 't5'];

describe.skipIf(!nativeAvailable())('LoRA adapters under a memory budget', () => {
  let root: string;
  let model: string;
  const adapters: Record<string, string> = {};
  let adapterBytes: number;
  let everyResident: Engine;
  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-lora-budget-'));
    model = join(root, 'model');
    await makeModel({ preset: 'test-llama', out: model, dtype: 'f32' });
    for (const [i, name] of NAMES.entries()) {
      adapters[name] = join(root, name);
      await writeLoraAdapter(model, adapters[name], { rank: 8, seed: 20 + i, dtype: 'BF16' });
    }
    adapterBytes = await declaredAdapterBytes(adapters.t1!);
    everyResident = await Engine.load({ model, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, loraAdapters: adapters });
  }, 120_000);
  afterAll(async () => {
    await everyResident?.dispose();
    rmSync(root, { recursive: true, force: true });
  });

  const ask = (engine: Engine, prompt: string, adapter: string) =>
    engine.generate({ prompt, maxTokens: 12, temperature: 0, adapter });

  it('declares what the engine holds: the f32 bytes of the adapter, read from its header', () => {
    expect(everyResident.adapters().map((a) => a.bytes)).toEqual(NAMES.map(() => adapterBytes));
    expect(everyResident.adapterStats()).toMatchObject({ known: 5, resident: 5, budgetBytes: Infinity, evictions: 0 });
  });

  it('serves five adapters with room for two: each request as with all resident, within the budget', async () => {
    const budget = 2 * adapterBytes + adapterBytes / 2;
    const engine = await Engine.load({ model, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, loraAdapters: adapters, loraMemoryBytes: budget });
    let maxResident = 0;
    const watch = setInterval(() => { maxResident = Math.max(maxResident, engine.adapterStats().residentBytes); }, 1);
    try {
      // Each was checked at start, the first two loaded.
      expect(engine.adapters().map((a) => [a.name, a.resident])).toEqual([['t1', true], ['t2', true], ['t3', false], ['t4', false], ['t5', false]]);
      expect(engine.adapters().every((a) => a.rank === 8 && a.bytes === adapterBytes)).toBe(true);
      const jobs = PROMPTS.flatMap((p) => NAMES.map((n) => [p, n] as const));
      const want = await Promise.all(jobs.map(([p, n]) => ask(everyResident, p, n)));
      // All at once: adapters wait for room while others run, and are retired when idle.
      const together = await Promise.all(jobs.map(([p, n]) => ask(engine, p, n)));
      together.forEach((r, i) => expect(r.tokenIds).toEqual(want[i]!.tokenIds));
      // One by one, round robin: every request finds its adapter retired and loads it again.
      const before = engine.adapterStats().loads;
      for (const [i, [p, n]] of jobs.entries()) {
        if (i >= NAMES.length * 2) break;
        expect((await ask(engine, p, n)).tokenIds).toEqual(want[i]!.tokenIds);
      }
      const stats = engine.adapterStats();
      expect(stats.loads - before).toBeGreaterThanOrEqual(NAMES.length * 2 - 2);
      expect(stats.evictions).toBeGreaterThan(NAMES.length);
      expect(stats).toMatchObject({ known: 5, resident: 2, budgetBytes: budget });
      expect(Math.max(maxResident, stats.residentBytes)).toBeLessThanOrEqual(budget);
      expect(engine.adapters().every((a) => a.requests === 0)).toBe(true);

      // An unload of an adapter that is not resident forgets it; one too large for the budget is refused.
      await engine.unloadAdapter('t1');
      await expect(ask(engine, PROMPTS[0]!, 't1')).rejects.toMatchObject({ code: 'invalid_request', param: 'adapter' });
      await expect(engine.loadAdapter('big', join(root, 'big'))).rejects.toMatchObject({ code: 'model_file_missing', param: 'dir' });
      await writeLoraAdapter(model, join(root, 'big'), { rank: 64, seed: 3 });
      await expect(engine.loadAdapter('big', join(root, 'big'))).rejects.toMatchObject({ code: 'invalid_argument', param: 'dir' });
    } finally {
      clearInterval(watch);
      await engine.dispose();
    }
  }, 120_000);

  it('takes its budget from the catalog (engine.lora_memory_bytes) and lists residency per adapter model', async () => {
    const budget = adapterBytes + 1;
    const catalog = parseCatalog({
      models: [
        { id: 'base', checkpoint: model, engine: { backend: 'cpu', threads: 2, kv_cache_bytes: 8 << 20, lora_memory_bytes: budget } },
        { id: 'a1', checkpoint: model, lora: adapters.t1 },
        { id: 'a2', checkpoint: model, lora: adapters.t2 },
      ],
    }, 'test', root);
    const registry = await ModelRegistry.load(catalog);
    try {
      const engine = registry.models[0]!.engine;
      expect(engine.adapterStats()).toMatchObject({ budgetBytes: budget, known: 2, resident: 1 });
      expect(registry.adapters().map((a) => [a.id, a.resident])).toEqual([['a1', true], ['a2', false]]);
      const r = await engine.generate({ prompt: PROMPTS[0]!, maxTokens: 12, temperature: 0, adapter: 'a2' });
      expect(r.tokenIds).toEqual((await ask(everyResident, PROMPTS[0]!, 't2')).tokenIds);
      expect(registry.adapters().map((a) => [a.id, a.resident])).toEqual([['a1', false], ['a2', true]]);
    } finally {
      await registry.dispose();
    }
  }, 60_000);

  it('finds a retired adapter\'s prefix blocks again when it is loaded again (same content, same key), never another\'s', async () => {
    const engine = await Engine.load({ model, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, blockSize: 4, loraAdapters: adapters,
      loraMemoryBytes: adapterBytes + 1 });
    try {
      const prompt = 'the quick brown fox jumps over the lazy dog and then runs far away into the woods';
      const ask = (adapter: string) => engine.generate({ prompt, maxTokens: 4, temperature: 0, adapter });
      const first = await ask('t1');
      expect(first.usage.cachedTokens).toBe(0);
      // t2 takes t1's place (room for one), and its blocks are its own.
      expect((await ask('t2')).usage.cachedTokens).toBe(0);
      expect(engine.adapters().find((a) => a.name === 't1')!.resident).toBe(false);
      // t1 again: loaded anew, its blocks found.
      const again = await ask('t1');
      expect(engine.adapters().find((a) => a.name === 't1')!.resident).toBe(true);
      expect(again.usage.cachedTokens).toBeGreaterThan(0);
      expect(again.tokenIds).toEqual(first.tokenIds);
    } finally {
      await engine.dispose();
    }
  });

  it('checks the budget option', async () => {
    await expect(Engine.load({ model, backend: 'cpu', loraMemoryBytes: 0 })).rejects.toMatchObject({ code: 'invalid_argument', param: 'loraMemoryBytes' });
    await expect(Engine.load({ model, backend: 'cpu', loraMemoryBytes: 1.5 })).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(Engine.load({ model, backend: 'cpu', loraMemoryBytes: 1 << 20, overlapSteps: true }))
      .rejects.toMatchObject({ code: 'invalid_argument', param: 'loraMemoryBytes' });
    // An adapter at start that does not load fails the load, naming its directory.
    await expect(Engine.load({ model, backend: 'cpu', loraMemoryBytes: 1 << 20, loraAdapters: { gone: join(root, 'gone') } }))
      .rejects.toMatchObject({ code: 'model_file_missing', param: 'dir' });
  });
});
