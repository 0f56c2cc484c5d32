// Qwen2.5-VL served end to end on the CPU engine (issue 34): images prepared by the model's own
// preprocessor, encoded by the native vision tower, their rows placed at the placeholders and the
// language model run with M-RoPE positions, against the float64 reference (test/reference/qwen2-5-vl.ts)
// teacher-forced on the engine's greedy output: the same token at every position, logprobs within
// float rounding. Also: text-only prompts, several images in chunked prefill, batching, and a
// prefix cache that shares blocks only between identical images.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import type { ChatMessage } from '../src/text/chat-template.js';
import { placeImages, type PreparedImage } from '../src/vision/vision-model.js';
import { nativeAvailable } from '../src/native/native.js';
import { expectTeacherForced, patternImage, prepareForReference, referenceInput } from './helpers/vision.js';
import { type Qwen25VlReference, Qwen25VlSession, loadQwen25VlReference } from './reference/qwen2-5-vl.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-engine-vl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/**
 * The engine's greedy tokens against the reference fed the same tokens: at each position the
 * engine's token is the reference's best (or within NEAR_TIE of it: f32 against f64 may break an
 * exact tie either way), and its logprob is the reference's to LOGPROB_TOL. f32 weights and
 * activations against float64 through 2 layers: differences measured around 1e-5.
 */
const NEAR_TIE = 1e-3;
const LOGPROB_TOL = 2e-3;
function expectReference(ref: Qwen25VlReference, result: GenerateResult, images: PreparedImage[]): number {
  const session = new Qwen25VlSession(ref);
  const prefill = session.prefill(result.promptTokenIds, images.map(referenceInput));
  return expectTeacherForced(prefill.at(-1)!, (token) => session.step(token), result, { nearTie: NEAR_TIE, logprobTol: LOGPROB_TOL });
}

describe.skipIf(!nativeAvailable())('Qwen2.5-VL on the CPU engine', () => {
  const dir = join(root, 'vl');
  let ref: Qwen25VlReference;
  let engine: Engine;
  let images: PreparedImage[];

  beforeAll(async () => {
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir, dtype: 'f32' });
    ref = loadQwen25VlReference(dir);
    // Small prefill chunks: a prompt's images span several steps.
    engine = await Engine.load({ model: dir, backend: 'cpu', kvCacheBytes: 16 << 20, maxBatchedTokens: 24, maxNumSeqs: 8, threads: 2 });
    // 90x60 -> a 2x3 grid of merged tokens, 60x150 -> 5x2, 224x224 -> 8x8.
    images = await Promise.all([patternImage(90, 60, 1), patternImage(60, 150, 2), patternImage(224, 224, 3)].map((im) => prepareForReference(engine.vision!, im)));
  }, 120_000);
  afterAll(() => engine?.dispose());

  const ask = (content: ChatMessage['content']): ChatMessage[] => [{ role: 'user', content }];
  const run = (messages: ChatMessage[], imgs: PreparedImage[], extra: { maxTokens?: number } = {}) =>
    engine.generate({ messages, images: imgs, maxTokens: extra.maxTokens ?? 16, temperature: 0, logprobs: 0 });

  it('loads as an image-taking model', () => {
    expect(engine.info.imageInput).toBe(true);
    expect(engine.vision!.imageTokenId).toBe(ref.mrope.imageTokenId);
    expect(images.map((im) => [im.gridH, im.gridW, im.numTokens])).toEqual([[2, 3, 6], [5, 2, 10], [8, 8, 64]]);
  });

  it('matches the float64 reference token for token with one image', async () => {
    const result = await run(ask([{ type: 'text', text: 'What is in this picture?' }, { type: 'image' }]), [images[0]!]);
    expect(result.usage.promptTokens).toBe(result.promptTokenIds.length);
    // The placeholder became the image's six tokens.
    expect(result.promptTokenIds.filter((t) => t === ref.mrope.imageTokenId)).toHaveLength(6);
    expect(result.tokenIds.length).toBeGreaterThan(0);
    const diff = expectReference(ref, result, [images[0]!]);
    console.log(`qwen2.5-vl one image: ${result.tokenIds.length} tokens, max |logprob diff| ${diff.toExponential(2)}`);
  });

  it('matches the reference with three images across chunked prefill, and text only', async () => {
    const result = await run(ask([
      { type: 'image' }, { type: 'text', text: 'then' }, { type: 'image' }, { type: 'text', text: 'and last' }, { type: 'image' },
      { type: 'text', text: 'Compare them.' },
    ]), images, { maxTokens: 24 });
    expect(result.promptTokenIds.length).toBeGreaterThan(80);  // several 24-token chunks
    expectReference(ref, result, images);
    const text = await run(ask('Say something about nothing.'), []);
    expectReference(ref, text, []);
  });

  it('gives each of several batched requests its own image', async () => {
    const messages = ask([{ type: 'image' }, { type: 'text', text: 'Describe.' }]);
    const results = await Promise.all(images.map((im) => run(messages, [im])));
    results.forEach((r, k) => expectReference(ref, r, [images[k]!]));
    // Different images, different continuations (random weights still tell them apart).
    expect(new Set(results.map((r) => r.tokenIds.join(','))).size).toBeGreaterThan(1);
  });

  it('shares cached blocks between requests with the same image, never with a different one', async () => {
    // The 224x224 image's 64 tokens fill several 16-token blocks.
    const messages = ask([{ type: 'image' }, { type: 'text', text: 'What colour dominates?' }]);
    const first = await run(messages, [images[2]!], { maxTokens: 4 });
    const again = await run(messages, [images[2]!], { maxTokens: 4 });
    expect(again.usage.cachedTokens).toBeGreaterThanOrEqual(48);
    expect(again.tokenIds).toEqual(first.tokenIds);
    // The same size but other pixels: only the blocks before the image can be shared.
    const other = await prepareForReference(engine.vision!, patternImage(224, 224, 9));
    expect(other.numTokens).toBe(64);
    expect(Buffer.from(other.hash).equals(Buffer.from(images[2]!.hash))).toBe(false);
    const different = await run(messages, [other], { maxTokens: 4 });
    const imageStart = placeImages(different.promptTokenIds, [other], ref.mrope.imageTokenId).offsets[0]!;
    expect(different.usage.cachedTokens).toBeLessThanOrEqual(imageStart);
    expectReference(ref, different, [other]);
  });

  it('recomputes a preempted sequence with its image in place', async () => {
    // 16 blocks of 16 tokens: two of these 105-token prompts fit (7 blocks each; their text first,
    // so they share no cached block), their decodes to 153 tokens (10 blocks each) do not, so the scheduler preempts one and later re-adds it
    // (prompt + its output so far, images re-sent).
    const small = await Engine.load({ model: dir, backend: 'cpu', kvCacheBytes: 16 * 16 * 1024, maxBatchedTokens: 64, maxNumSeqs: 4, threads: 2 });
    let preempted = 0;
    small.observe({ onStep: (r) => { preempted += r.preempted.length; } });
    try {
      const results = await Promise.all(['first', 'second', 'third'].map((word) =>
        small.generate({ messages: ask([{ type: 'text', text: `The ${word} picture:` }, { type: 'image' }, { type: 'text', text: 'what is in it?' }]), images: [images[2]!],
          maxTokens: 48, temperature: 0, logprobs: 0 })));
      expect(preempted).toBeGreaterThan(0);
      for (const r of results) {
        expect(r.tokenIds.length).toBeGreaterThan(16);
        expectReference(ref, r, [images[2]!]);
      }
    } finally {
      await small.dispose();
    }
  });

  it('refuses placeholders that do not pair up with the images', async () => {
    const messages = ask([{ type: 'image' }, { type: 'text', text: 'two?' }]);
    await expect(run(messages, [])).rejects.toMatchObject({ code: 'invalid_request', message: /1 image part for 0 images/ });
    await expect(run(messages, [images[0]!, images[1]!])).rejects.toMatchObject({ code: 'invalid_request', message: /1 image part for 2 images/ });
    // Prompt tokens with a placeholder and no image.
    const ids = (await run(messages, [images[0]!], { maxTokens: 1 })).promptTokenIds;
    await expect(engine.generate({ promptTokenIds: ids, maxTokens: 1 })).rejects.toMatchObject({ code: 'invalid_request', message: /1 image placeholder for 0 images/ });
    // Text that spells the image token is no image.
    await expect(run(ask('<|image_pad|> hello'), [])).rejects.toMatchObject({ code: 'invalid_request' });
  });
});
