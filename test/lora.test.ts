// LoRA adapters through the engine facade (issue 36): adapters written in PEFT's layout
// (models/lora-checkpoint.ts) and served beside the base model give what the base model with the
// adapter merged into its weights gives (mergeLoraAdapter: W + scale * B A in float64), on six
// families; requests of several adapters and of the base model batched together gain exactly what
// they gain alone. The float64 reference of the merged weights, adapters the engine did not write
// and the prefix cache's separation: native/tests/test_lora.cpp.
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { mergeLoraAdapter, writeLoraAdapter } from '../models/lora-checkpoint.js';
import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import { nativeAvailable } from '../src/native/native.js';
import { runMakeModel } from '../src/cli/make-model.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-lora-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const PROMPTS = ['the cat sat on the mat', 'one two three four', 'a b c d e f g', 'hello world'];

/** Greedy continuations equal until the reference's first near tie, logprobs within 1e-3 before it. */
function sameUntilNearTie(got: GenerateResult, ref: GenerateResult): number {
  let compared = 0;
  for (let i = 0; i < ref.tokenIds.length; i++) {
    const top = ref.logprobs![i]!.top;
    if (top.length >= 2 && top[0]!.logprob - top[1]!.logprob < 1e-2) break;
    expect(got.tokenIds[i]).toBe(ref.tokenIds[i]);
    expect(Math.abs(got.logprobs![i]!.logprob - ref.logprobs![i]!.logprob)).toBeLessThan(1e-3);
    compared++;
  }
  return compared;
}

describe.skipIf(!nativeAvailable()).each(['test-llama', 'test-qwen2', 'test-gemma3', 'test-qwen2.5-vl', 'test-gpt-oss', 'test-mistral'])('LoRA adapters: %s', (preset) => {
  let served: Engine;
  const merged: Engine[] = [];
  let plain: Engine;
  beforeAll(async () => {
    const dir = join(root, preset);
    await makeModel({ preset, out: dir, dtype: 'f32' });
    const adapters = { all: join(root, `${preset}-all`), attn: join(root, `${preset}-attn`) };
    await writeLoraAdapter(dir, adapters.all, { rank: 8, seed: 1 });
    await writeLoraAdapter(dir, adapters.attn, { rank: 16, alpha: 8, rslora: true, dtype: 'BF16', modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj'], seed: 2 });
    const base = { backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20, blockSize: 4 };
    served = await Engine.load({ ...base, model: dir, loraAdapters: adapters });
    for (const [name, adapterDir] of Object.entries(adapters)) {
      mergeLoraAdapter(dir, adapterDir, join(root, `${preset}-merged-${name}`));
      merged.push(await Engine.load({ ...base, model: join(root, `${preset}-merged-${name}`) }));
    }
    plain = await Engine.load({ ...base, model: dir });
  }, 120_000);
  afterAll(async () => {
    for (const e of [served, plain, ...merged]) await e?.dispose();
  });

  const ask = (engine: Engine, prompt: string, adapter?: string) =>
    engine.generate({ prompt, maxTokens: 16, temperature: 0, logprobs: 2, ...(adapter !== undefined && { adapter }) });

  it('serves each adapter as its weights merged into the base model would', async () => {
    expect(served.info.loraAdapters).toEqual([
      { name: 'all', rank: 8, bytes: expect.any(Number) }, { name: 'attn', rank: 16, bytes: expect.any(Number) }]);
    let compared = 0;
    for (const prompt of PROMPTS) {
      compared += sameUntilNearTie(await ask(served, prompt, 'all'), await ask(merged[0]!, prompt));
      compared += sameUntilNearTie(await ask(served, prompt, 'attn'), await ask(merged[1]!, prompt));
      // The base model is the base model.
      const base = await ask(served, prompt);
      const ref = await ask(plain, prompt);
      expect(base.tokenIds).toEqual(ref.tokenIds);
      expect(base.logprobs!.map((l) => l.logprob)).toEqual(ref.logprobs!.map((l) => l.logprob));
    }
    expect(compared).toBeGreaterThan(PROMPTS.length * 2 * 8);
    // The adapters change the output.
    expect((await ask(served, PROMPTS[0]!, 'all')).tokenIds).not.toEqual((await ask(served, PROMPTS[0]!)).tokenIds);
  });

  it('batches requests of several adapters and of the base model, each gaining what it gains alone', async () => {
    const jobs = PROMPTS.flatMap((p) => [[p, 'all'], [p, 'attn'], [p, undefined]] as const);
    const alone: GenerateResult[] = [];
    for (const [p, a] of jobs) alone.push(await ask(served, p, a));
    const together = await Promise.all(jobs.map(([p, a]) => ask(served, p, a)));
    together.forEach((r, i) => {
      expect(r.tokenIds).toEqual(alone[i]!.tokenIds);
      expect(r.logprobs!.map((l) => l.logprob)).toEqual(alone[i]!.logprobs!.map((l) => l.logprob));
    });
  });

  it('refuses an adapter it has not loaded', async () => {
    await expect(ask(served, PROMPTS[0]!, 'nope')).rejects.toMatchObject({ code: 'invalid_request', param: 'adapter' });
    await expect(ask(plain, PROMPTS[0]!, 'all')).rejects.toMatchObject({ code: 'invalid_request', param: 'adapter' });
  });
});

describe.skipIf(!nativeAvailable())('make-model --lora', () => {
  it('writes an adapter the engine serves, and checks its flags', async () => {
    const dir = join(root, 'cli-model');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'f32' });
    const out = join(root, 'cli-adapter');
    await runMakeModel(['--lora', '4', '--model', dir, '--out', out, '--seed', '3']);
    const engine = await Engine.load({ model: dir, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, loraAdapters: { mine: out } });
    try {
      expect(engine.info.loraAdapters).toMatchObject([{ name: 'mine', rank: 4 }]);
      const r = await engine.generate({ prompt: 'hello', maxTokens: 4, temperature: 0, adapter: 'mine' });
      expect(r.tokenIds).toHaveLength(4);
    } finally {
      await engine.dispose();
    }
    await expect(runMakeModel(['--lora', '65', '--model', dir, '--out', join(root, 'x')])).rejects.toThrow(/--lora/);
    await expect(runMakeModel(['--lora', '4', '--out', join(root, 'y')])).rejects.toThrow(/--model/);
    await expect(runMakeModel(['--lora', '4', '--model', join(root, 'absent'), '--out', join(root, 'z')]))
      .rejects.toMatchObject({ code: 'model_file_missing' });
    await expect(runMakeModel(['--lora', '4', '--model', dir, '--out', out])).rejects.toThrow(/--force/);
    await expect(runMakeModel(['--preset', 'test-llama', '--model', dir, '--out', join(root, 'w')])).rejects.toThrow(/--model goes with --lora/);
  });
});

describe.skipIf(!nativeAvailable())('LoRA adapters loaded and unloaded while serving', () => {
  it('loses no request: an unload waits for its requests, later ones are refused, a reload serves the same', async () => {
    const dir = join(root, 'hot-model');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'f32' });
    const adapterDir = join(root, 'hot-adapter');
    await writeLoraAdapter(dir, adapterDir, { rank: 8, seed: 9 });
    const base = { model: dir, backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20 };
    const loadedAtStart = await Engine.load({ ...base, loraAdapters: { x: adapterDir } });
    const engine = await Engine.load(base);
    try {
      const ask = (e: Engine, prompt: string, adapter?: string) =>
        e.generate({ prompt, maxTokens: 24, temperature: 0, ...(adapter !== undefined && { adapter }) });
      const want = await Promise.all(PROMPTS.map((p) => ask(loadedAtStart, p, 'x')));
      // Loaded while base requests run.
      const baseRuns = Promise.all(PROMPTS.map((p) => ask(engine, p)));
      expect(await engine.loadAdapter('x', adapterDir)).toMatchObject({ name: 'x', rank: 8 });
      await baseRuns;
      expect(engine.info.loraAdapters).toMatchObject([{ name: 'x', rank: 8 }]);
      // Unloaded while its requests run: they all finish, as the adapter loaded at start gives them.
      const running = PROMPTS.map((p) => ask(engine, p, 'x'));
      const unloaded = engine.unloadAdapter('x');
      await expect(ask(engine, PROMPTS[0]!, 'x')).rejects.toMatchObject({ code: 'invalid_request', param: 'adapter' });
      const got = await Promise.all(running);
      await unloaded;
      got.forEach((r, i) => expect(r.tokenIds).toEqual(want[i]!.tokenIds));
      expect(engine.info.loraAdapters).toEqual([]);
      // Loaded again under the same name: the same adapter again.
      await engine.loadAdapter('x', adapterDir);
      expect((await ask(engine, PROMPTS[1]!, 'x')).tokenIds).toEqual(want[1]!.tokenIds);
      await expect(engine.loadAdapter('x', adapterDir)).rejects.toMatchObject({ code: 'invalid_argument' });
      await expect(engine.loadAdapter('y', join(root, 'absent'))).rejects.toMatchObject({ code: 'model_file_missing' });
      await expect(engine.unloadAdapter('nope')).rejects.toMatchObject({ code: 'invalid_request' });
    } finally {
      await engine.dispose();
      await loadedAtStart.dispose();
    }
  });
});

describe.skipIf(!nativeAvailable())('LoRA adapters with a draft model', () => {
  it('leaves the adapters to the target: a draft of other shapes drafts as its base model, output unchanged', async () => {
    const dir = join(root, 'spec-target');
    const draftDir = join(root, 'spec-draft');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'f32' });
    // One layer fewer: the target's adapter names a layer the draft does not have.
    await makeModel({ preset: 'test-llama', out: draftDir, dtype: 'f32', overrides: { numLayers: 1 }, seed: 5 });
    const adapterDir = join(root, 'spec-adapter');
    await writeLoraAdapter(dir, adapterDir, { rank: 8, seed: 13 });
    const base = { model: dir, backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20, loraAdapters: { x: adapterDir } };
    const plain = await Engine.load(base);
    const spec = await Engine.load({ ...base, speculative: { method: 'draft', draftModel: draftDir, numSpeculativeTokens: 3 } });
    try {
      for (const prompt of PROMPTS) {
        const ask = (e: Engine) => e.generate({ prompt, maxTokens: 16, temperature: 0, adapter: 'x' });
        expect((await ask(spec)).tokenIds).toEqual((await ask(plain)).tokenIds);
      }
      expect(spec.schedulerStats().speculation!.numDraftTokens).toBeGreaterThan(0);
    } finally {
      await spec.dispose();
      await plain.dispose();
    }
  });
});

describe.skipIf(!nativeAvailable())('LoRA adapters on a mixture-of-experts model (test-qwen3-moe)', () => {
  it('serves adapters of attention and of the dense MLP layers as their merged weights would, and refuses expert MLPs', async () => {
    const dir = join(root, 'moe');
    await makeModel({ preset: 'test-qwen3-moe', out: dir, dtype: 'f32' });
    // Every projection the checkpoint has as a plain matrix: attention in all layers, the MLP of
    // its dense layer (mlp_only_layers).
    const adapter = join(root, 'moe-adapter');
    await writeLoraAdapter(dir, adapter, { rank: 8, seed: 21 });
    mergeLoraAdapter(dir, adapter, join(root, 'moe-merged'));
    const base = { backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20 };
    const served = await Engine.load({ ...base, model: dir, loraAdapters: { x: adapter } });
    const merged = await Engine.load({ ...base, model: join(root, 'moe-merged') });
    try {
      let compared = 0;
      for (const prompt of PROMPTS) {
        const ask = (e: Engine, adapter?: string) =>
          e.generate({ prompt, maxTokens: 12, temperature: 0, logprobs: 2, ...(adapter !== undefined && { adapter }) });
        compared += sameUntilNearTie(await ask(served, 'x'), await ask(merged));
      }
      expect(compared).toBeGreaterThan(PROMPTS.length * 6);
      // The same adapter with its dense layer's MLP matrices renamed to layer 0, a layer of experts.
      const experts = join(root, 'moe-experts');
      mkdirSync(experts);
      copyFileSync(join(adapter, 'adapter_config.json'), join(experts, 'adapter_config.json'));
      const file = readFileSync(join(adapter, 'adapter_model.safetensors'));
      const headerEnd = 8 + Number(file.readBigUInt64LE(0));
      const header = file.subarray(8, headerEnd).toString('latin1')
        .replace(/layers\.1\.mlp\.(gate|up|down)_proj\.lora_A\.weight/g, 'layers.0.mlp.$1_proj.lora_A.weight')
        .replace(/layers\.1\.mlp\.(gate|up|down)_proj\.lora_B\.weight/g, 'layers.0.mlp.$1_proj.lora_B.weight');
      writeFileSync(join(experts, 'adapter_model.safetensors'), Buffer.concat([file.subarray(0, 8), Buffer.from(header, 'latin1'), file.subarray(headerEnd)]));
      await expect(served.loadAdapter('experts', experts)).rejects.toMatchObject({ code: 'unsupported_model', param: 'dir' });
    } finally {
      await served.dispose();
      await merged.dispose();
    }
  });
});
