// Loading without surprises: a checkpoint's context length read from config.json as the native
// loader reads it (what `sluice models` shows without loading), the weight files read ahead of the
// load with progress (large checkpoints), and backend auto choosing the CPU without a message.
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel, type MakeModelOptions } from '../models/make-model.js';
import { checkpointContextLength } from '../src/engine/checkpoint-config.js';
import { Engine } from '../src/engine/engine.js';
import { cudaUnavailableReason, nativeAddon } from '../src/native/native.js';
import { readWeightsAhead, weightFiles } from '../src/engine/weight-files.js';
import { ModelRegistry } from '../src/serving/model-registry.js';

let root: string;
let tinyDir: string;
let n = 0;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-load-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function model(opts: Omit<MakeModelOptions, 'out'>, editConfig?: (c: Record<string, unknown>) => void): Promise<string> {
  const out = join(root, `m${n++}`);
  await makeModel({ ...opts, out });
  if (editConfig) {
    const file = join(out, 'config.json');
    const config = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
    editConfig(config);
    writeFileSync(file, JSON.stringify(config));
  }
  return out;
}

async function nativeContextLength(dir: string): Promise<number> {
  const engine = await Engine.load({ model: dir, backend: 'cpu', kvCacheBytes: 8 << 20, threads: 1 });
  try {
    return engine.info.contextLength;
  } finally {
    await engine.dispose();
  }
}

describe('checkpointContextLength', () => {
  it('agrees with the native loader on max_position_embeddings, its default and sliding windows', async () => {
    const cases: Array<[string, string, number]> = [
      ['llama', tinyDir, 2048],
      ['mistral, window below the context', await model({ preset: 'test-mistral', overrides: { slidingWindow: 512 } }), 512],
      ['mistral, window above the context', await model({ preset: 'test-mistral', overrides: { slidingWindow: 4096 } }), 2048],
      ['qwen2 with use_sliding_window', await model({ preset: 'test-qwen2' }, (c) => { c['use_sliding_window'] = true; c['sliding_window'] = 300; }), 300],
      ['qwen2 with a window it does not use', await model({ preset: 'test-qwen2' }, (c) => { c['sliding_window'] = 300; }), 2048],
      ['no max_position_embeddings, no model_type', await model({ preset: 'test-mistral', overrides: { slidingWindow: 700 } }, (c) => {
        delete c['max_position_embeddings'];
        delete c['model_type'];
      }), 700],
      ['max_position_embeddings null', await model({ preset: 'test-llama' }, (c) => { c['max_position_embeddings'] = null; }), 2048],
      ['max_position_embeddings 1000', await model({ preset: 'test-llama' }, (c) => { c['max_position_embeddings'] = 1000; }), 1000],
    ];
    for (const [what, dir, expected] of cases) {
      expect(await checkpointContextLength(dir), what).toBe(expected);
      expect(await nativeContextLength(dir), what).toBe(expected);
    }
  });

  it('names the file when config.json is missing or malformed', async () => {
    await expect(checkpointContextLength(join(root, 'none'))).rejects.toThrow(/none\/config\.json does not exist/);
    const bad = await model({ preset: 'test-llama' }, (c) => { c['max_position_embeddings'] = -1; });
    await expect(checkpointContextLength(bad)).rejects.toThrow(/config\.json: field "max_position_embeddings" must be a non-negative integer/);
  });
});

describe('reading weights ahead', () => {
  it('lists the files the native loader opens: one, or the shards of the index', async () => {
    expect(await weightFiles(tinyDir)).toEqual([{ path: join(tinyDir, 'model.safetensors'), bytes: statSync(join(tinyDir, 'model.safetensors')).size }]);
    const sharded = await model({ preset: 'test-llama', shardBytes: 64 * 1024 });
    const files = await weightFiles(sharded);
    expect(files.length).toBeGreaterThan(1);
    expect(files.map((f) => f.path)).toEqual(files.map((f) => f.path).sort());
    expect(files.every((f) => /model-\d{5}-of-\d{5}\.safetensors$/.test(f.path))).toBe(true);
    expect(await weightFiles(join(root, 'none'))).toEqual([]);
  });

  it('reports progress from 0 to the total, in order; nothing below the size threshold', async () => {
    const sharded = await model({ preset: 'test-llama', shardBytes: 64 * 1024 });
    const total = (await weightFiles(sharded)).reduce((s, f) => s + f.bytes, 0);
    const calls: Array<[number, number]> = [];
    expect(await readWeightsAhead(sharded, (done, all) => calls.push([done, all]), 0)).toBe(total);
    expect(calls[0]).toEqual([0, total]);
    expect(calls.at(-1)).toEqual([total, total]);
    for (let i = 1; i < calls.length; i++) expect(calls[i]![0]).toBeGreaterThanOrEqual(calls[i - 1]![0]);
    const none: unknown[] = [];
    expect(await readWeightsAhead(sharded, (...a) => none.push(a), total + 1)).toBe(0);
    expect(none).toEqual([]);
  });

  it('Engine.load reads ahead with onLoadProgress; the registry turns it into a line per 10%', async () => {
    const calls: Array<[number, number]> = [];
    const engine = await Engine.load({
      model: tinyDir, backend: 'cpu', kvCacheBytes: 8 << 20, readAheadMinBytes: 0, onLoadProgress: (d, t) => calls.push([d, t]),
    });
    await engine.dispose();
    const size = statSync(join(tinyDir, 'model.safetensors')).size;
    expect(calls.at(-1)).toEqual([size, size]);

    const lines: string[] = [];
    const registry = await ModelRegistry.load({ models: [{ id: 'tiny', checkpoint: tinyDir }] }, {
      engineDefaults: { backend: 'cpu', kvCacheBytes: 8 << 20, readAheadMinBytes: 0 }, onProgress: (m) => lines.push(m),
    });
    await registry.dispose();
    const reading = lines.filter((l) => l.startsWith('reading the weights of tiny:'));
    expect(reading[0]).toMatch(/^reading the weights of tiny: 0% \(0 B \/ [\d.]+ MiB\)$/);
    expect(reading.at(-1)).toMatch(/: 100% \(([\d.]+ MiB) \/ \1\)$/);
    expect(reading.length).toBeLessThanOrEqual(11);
  });
});

describe('backend auto', () => {
  it('runs where it can without a message, and keeps the reason CUDA was not used', async () => {
    const messages: string[] = [];
    const engine = await Engine.load({ model: tinyDir, kvCacheBytes: 8 << 20, onMessage: (m) => messages.push(m) });
    try {
      expect(messages).toEqual([]);
      const usable = nativeAddon().cudaCompiled && cudaUnavailableReason() === undefined;
      expect(engine.info.backend).toBe(usable ? 'cuda' : 'cpu');
      if (usable) expect(engine.info.cudaUnavailableReason).toBeUndefined();
      else expect(engine.info.cudaUnavailableReason).toBe(nativeAddon().cudaCompiled ? cudaUnavailableReason() : 'this build has no CUDA backend');
    } finally {
      await engine.dispose();
    }
    const cpu = await Engine.load({ model: tinyDir, backend: 'cpu', kvCacheBytes: 8 << 20 });
    expect(cpu.info.cudaUnavailableReason).toBeUndefined();
    await cpu.dispose();
  });
});
