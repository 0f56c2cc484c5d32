// Gemma 3 with images on the CPU engine (issue 34): the SigLIP tower and projector in the native
// engine, each image's rows at its <image_soft_token>s (the processor's "\n\n<start_of_image>...
// <end_of_image>\n\n" text), and attention that is bidirectional within an image on every layer,
// sliding ones included, against the float64 reference (test/reference/gemma3-vl.ts)
// teacher-forced on the engine's greedy output. Prefill chunks smaller than an image are cut
// before it or stretched over it (an image is never split), and a prefix hit that ends inside an
// image is completed by the next chunk.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import type { ChatMessage } from '../src/text/chat-template.js';
import type { PreparedImage } from '../src/vision/vision-model.js';
import { nativeAvailable } from '../src/native/native.js';
import { expectTeacherForced, patternImage, prepareForReference, referenceInput } from './helpers/vision.js';
import { type Gemma3VlReference, Gemma3VlSession, loadGemma3VlReference } from './reference/gemma3-vl.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-engine-gemma3-vl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

// f32 engine against the float64 reference: logprobs within float rounding, the same token unless
// the reference's best two are within NEAR_TIE.
const NEAR_TIE = 1e-3;
const LOGPROB_TOL = 2e-3;
function expectReference(ref: Gemma3VlReference, result: GenerateResult, images: PreparedImage[]): number {
  const session = new Gemma3VlSession(ref);
  const prefill = session.prefill(result.promptTokenIds, images.map(referenceInput));
  return expectTeacherForced(prefill.at(-1)!, (token) => session.step(token), result, { nearTie: NEAR_TIE, logprobTol: LOGPROB_TOL });
}

describe.skipIf(!nativeAvailable())('Gemma 3 with images on the CPU engine', () => {
  const dir = join(root, 'gemma3-vl');
  let ref: Gemma3VlReference;
  let images: PreparedImage[];
  const engines: Engine[] = [];
  const load = async (maxBatchedTokens: number) => {
    const e = await Engine.load({ model: dir, backend: 'cpu', kvCacheBytes: 16 << 20, maxBatchedTokens, maxNumSeqs: Math.min(4, maxBatchedTokens), threads: 2 });
    engines.push(e);
    return e;
  };

  beforeAll(async () => {
    await makeModel({ preset: 'test-gemma3-vl', out: dir, dtype: 'f32' });
    ref = loadGemma3VlReference(dir);
    const e = await load(64);
    images = await Promise.all([patternImage(90, 60, 1), patternImage(56, 56, 2), patternImage(300, 120, 3)].map((im) => prepareForReference(e.vision!, im)));
  }, 120_000);
  afterAll(async () => { for (const e of engines) await e.dispose(); });

  const ask = (content: ChatMessage['content']): ChatMessage[] => [{ role: 'user', content }];
  const run = (engine: Engine, messages: ChatMessage[], imgs: PreparedImage[], maxTokens = 12) =>
    engine.generate({ messages, images: imgs, maxTokens, temperature: 0, logprobs: 0 });

  it('takes images: a fixed number of tokens each, in the processor\'s text', async () => {
    const engine = engines[0]!;
    expect(engine.info.imageInput).toBe(true);
    expect(images.map((im) => im.numTokens)).toEqual([4, 4, 4]);
    const result = await run(engine, ask([{ type: 'text', text: 'See:' }, { type: 'image' }]), [images[0]!]);
    const ids = result.promptTokenIds;
    const image = ref.imageTokenId;
    const first = ids.indexOf(image);
    expect(ids.slice(first, first + 4)).toEqual([image, image, image, image]);
    expect(ids[first - 1]).toBe(ref.boiTokenId);
    expect(ids[first + 4]).toBe(ref.eoiTokenId);
    const diff = expectReference(ref, result, [images[0]!]);
    console.log(`gemma3-vl one image: ${result.tokenIds.length} tokens, max |logprob diff| ${diff.toExponential(2)}`);
  });

  it('spells images the same on the prompt workers (long inputs) as inline', async () => {
    const engine = engines[0]!;
    const messages = ask([{ type: 'text', text: 'word '.repeat(600) }, { type: 'image' }, { type: 'text', text: 'Now?' }]);
    const inline = engine.promptTokenIds({ messages });
    expect(inline.filter((t) => t === ref.imageTokenId)).toHaveLength(4);
    expect(await engine.preparePrompt({ messages })).toEqual(inline);
  });

  it('encodes an image once per tenant while it is cached', async () => {
    const engine = engines[0]!;
    const encode = vi.spyOn(engine.vision!, 'encodeMany');
    try {
      const image = await engine.vision!.prepare(patternImage(40, 70, 11));
      const messages = ask([{ type: 'image' }, { type: 'text', text: 'Again?' }]);
      const ask1 = (tenant: string) => engine.generate({ messages, images: [image], maxTokens: 3, temperature: 0, tenant });
      const first = await ask1('org-a');
      expect(encode).toHaveBeenCalledTimes(1);
      expect((await ask1('org-a')).tokenIds).toEqual(first.tokenIds);
      expect(encode).toHaveBeenCalledTimes(1);
      // Another organization's request encodes it for itself.
      expect((await ask1('org-b')).tokenIds).toEqual(first.tokenIds);
      expect(encode).toHaveBeenCalledTimes(2);
    } finally {
      encode.mockRestore();
    }
  });

  it('matches the reference with several images, prefill chunks cut or stretched around them, and batched', async () => {
    // Chunks of 3 tokens: every image (4 tokens) lies across a chunk boundary.
    const engine = await load(3);
    const messages = ask([{ type: 'image' }, { type: 'text', text: 'and' }, { type: 'image' }, { type: 'text', text: 'then' },
      { type: 'image' }, { type: 'text', text: 'Which differs?' }]);
    const results = await Promise.all([images, [images[2]!, images[0]!, images[1]!]].map((imgs) => run(engine, messages, imgs)));
    results.forEach((r, k) => expectReference(ref, r, k === 0 ? images : [images[2]!, images[0]!, images[1]!]));
    expect(results[0]!.tokenIds).not.toEqual(results[1]!.tokenIds);
  });

  it('completes an image a prefix hit ended inside of', async () => {
    // Blocks of 16 tokens: the cached prefix of the second request ends inside its image, whose
    // rest the next chunk computes attending over all of it.
    const engine = engines[0]!;
    // An opening long enough that a 16-token block boundary falls inside the image's 4 tokens.
    const withOpening = (n: number) => ask([{ type: 'text', text: `Look${' closely'.repeat(n)}:` }, { type: 'image' }, { type: 'text', text: 'Now?' }]);
    let n = 0;
    while (n < 40 && engine.promptTokenIds({ messages: withOpening(n) }).indexOf(ref.imageTokenId) % 16 < 13) n++;
    const messages = withOpening(n);
    const first = await run(engine, messages, [images[2]!], 4);
    const again = await run(engine, messages, [images[2]!], 4);
    const start = again.promptTokenIds.indexOf(ref.imageTokenId);
    console.log(`gemma3-vl prefix hit: ${again.usage.cachedTokens} cached, image at ${start}..${start + 3}`);
    expect(again.usage.cachedTokens).toBeGreaterThan(start);
    expect(again.usage.cachedTokens).toBeLessThan(start + 4);
    expect(again.tokenIds).toEqual(first.tokenIds);
    expectReference(ref, again, [images[2]!]);
  });
});
