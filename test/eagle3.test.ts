// EAGLE-3 heads end to end (issue 35): a head in the published layout (models/eagle3-checkpoint.ts)
// loaded beside the target (Engine.load speculative {method: 'eagle3'}), drafting inside the engine
// from the target's hidden states, its drafts verified in the next step. Greedy output is the same
// tokens and logprobs as without it, alone, batched and cut by max_tokens, on three families; the
// head's numerics against a float64 reference are native/tests/test_eagle3.cpp's. A random head
// rarely agrees with a random target, so few drafts are accepted here: what is checked is that they
// are made, verified and never change the output.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { writeEagle3Head } from '../models/eagle3-checkpoint.js';
import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import { nativeAvailable } from '../src/native/native.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-eagle3-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const PROMPTS = ['the cat sat on the mat', 'one two three four', 'a b c d e f g', 'hello world'];

const same = (a: GenerateResult, b: GenerateResult) => {
  expect(a.tokenIds).toEqual(b.tokenIds);
  expect(a.text).toEqual(b.text);
  expect(a.finishReason).toEqual(b.finishReason);
  expect(a.logprobs!.map((l) => l.logprob)).toEqual(b.logprobs!.map((l) => l.logprob));
};

describe.skipIf(!nativeAvailable()).each(['test-llama', 'test-qwen2', 'test-gemma3'])('EAGLE-3 speculative decoding: %s', (preset) => {
  let plain: Engine;
  let spec: Engine;
  beforeAll(async () => {
    const dir = join(root, preset);
    const head = join(root, `${preset}-eagle3`);
    await makeModel({ preset, out: dir, dtype: 'f32' });
    writeEagle3Head(dir, head, { dtype: 'F32', draftVocabSize: 64 });
    const base = { model: dir, backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20, blockSize: 4 };
    plain = await Engine.load(base);
    spec = await Engine.load({ ...base, speculative: { method: 'eagle3', draftModel: head, numSpeculativeTokens: 3 } });
  }, 120_000);
  afterAll(async () => {
    for (const e of [plain, spec]) await e?.dispose();
  });

  const ask = (engine: Engine, prompt: string, extra: Record<string, unknown> = {}) =>
    engine.generate({ prompt, maxTokens: 48, temperature: 0, logprobs: 0, ...extra });

  it('gives the same greedy output alone and batched, and verifies the head\'s drafts', async () => {
    for (const prompt of PROMPTS) same(await ask(spec, prompt), await ask(plain, prompt));
    const [a, b] = await Promise.all([Promise.all(PROMPTS.map((p) => ask(spec, p))), Promise.all(PROMPTS.map((p) => ask(plain, p)))]);
    a.forEach((r, i) => same(r, b[i]!));
    const stats = spec.schedulerStats().speculation!;
    console.log(`${preset}: ${stats.numAcceptedTokens} of ${stats.numDraftTokens} EAGLE-3 drafts accepted`);
    expect(stats.numDraftTokens).toBeGreaterThan(0);
  });

  it('stops exactly at max_tokens and serves sampled requests', async () => {
    for (const maxTokens of [1, 2, 5]) same(await ask(spec, PROMPTS[0]!, { maxTokens }), await ask(plain, PROMPTS[0]!, { maxTokens }));
    const r = await ask(spec, PROMPTS[1]!, { temperature: 0.8, topP: 0.9, seed: 7 });
    expect(r.tokenIds.length).toBeGreaterThan(0);
    expect(r.tokenIds.length).toBeLessThanOrEqual(48);
  });
});

describe.skipIf(!nativeAvailable())('EAGLE-3 loading', () => {
  it('refuses a head that does not fit the target, and a missing one', async () => {
    const dir = join(root, 'load-target');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'f32' });
    const other = join(root, 'load-other');
    await makeModel({ preset: 'test-qwen2', out: other, dtype: 'f32' });
    const head = join(root, 'load-head');
    writeEagle3Head(dir, head, { dtype: 'F32', draftVocabSize: 32 });
    const config = JSON.parse(readFileSync(join(head, 'config.json'), 'utf8')) as { vocab_size: number };
    writeFileSync(join(head, 'config.json'), JSON.stringify({ ...config, vocab_size: config.vocab_size + 1 }));
    const base = { model: dir, backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20 };
    await expect(Engine.load({ ...base, speculative: { method: 'eagle3', draftModel: head, numSpeculativeTokens: 3 } }))
      .rejects.toThrow(/vocab_size \d+ is not the target's/);
    await expect(Engine.load({ ...base, speculative: { method: 'eagle3', draftModel: join(root, 'absent'), numSpeculativeTokens: 3 } }))
      .rejects.toMatchObject({ code: 'invalid_argument', param: 'speculative.draftModel' });
    // A target checkpoint is not a head.
    await expect(Engine.load({ ...base, speculative: { method: 'eagle3', draftModel: other, numSpeculativeTokens: 3 } }))
      .rejects.toThrow(/not an EAGLE-3 head/);
  });
});
