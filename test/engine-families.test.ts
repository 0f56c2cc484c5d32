// The native engine on checkpoints of the mixture-of-experts and Gemma 3 families that the
// project's model maker did not write (test/helpers/published-checkpoints.ts: published config
// layouts, random weights), against the independent float64 reference, and the batch and chunk
// invariance the dense families have.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { type PublishedFamily, writePublishedCheckpoint } from './helpers/published-checkpoints.js';
import { runNative } from './helpers/native-run.js';
import { LOGPROB_TOL, NEAR_TIE_GAP, compareWithReference, promptFor } from './helpers/reference-compare.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-families-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const CASES: Array<[PublishedFamily, 'f32' | 'bf16', Record<string, unknown>?]> = [
  ['qwen3-moe', 'f32'],
  ['qwen3-moe', 'bf16'],
  // Every second layer sparse (decoder_sparse_step), top-k weights not renormalised.
  ['qwen3-moe', 'f32', { mlp_only_layers: [], decoder_sparse_step: 2, norm_topk_prob: false }],
  ['mixtral', 'f32'],
  ['mixtral', 'bf16'],
  ['gemma3', 'f32'],
  ['gemma3', 'bf16'],
  ['gemma3-multimodal', 'f32'],
  // A final-logit soft cap and explicit layer_types.
  ['gemma3', 'f32', { final_logit_softcapping: 3, layer_types: ['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention'] }],
];

describe.each(CASES)('%s in %s %j', (family, dtype, config) => {
  let dir: string;
  let engine: NativeEngineHandle;
  beforeAll(async () => {
    dir = join(root, `${family}-${dtype}-${config ? 'variant' : 'plain'}`);
    writePublishedCheckpoint(dir, family, { dtype, seed: 3, ...(config ? { config } : {}) });
    engine = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 2 });
  });
  afterAll(() => engine?.dispose());

  it('greedy continuation and logprobs match the float64 reference', async () => {
    await compareWithReference(engine, dir, `${family}/${dtype}`, LOGPROB_TOL[dtype], NEAR_TIE_GAP[dtype]);
  });

  it('gives the same tokens and logprobs alone, in a batch of 12, and prefilled in chunks', async () => {
    const vocab = engine.info().vocabSize;
    const prompt = promptFor(vocab, 29, 2);
    const companions = Array.from({ length: 11 }, (_, i) => promptFor(vocab, 3 + ((i * 7) % 40), i + 10));
    const alone = await runNative(engine, prompt, 24);
    const batched = await runNative(engine, prompt, 24, { companions });
    const chunked = await runNative(engine, prompt, 24, { chunk: 5 });
    for (const other of [batched, chunked]) {
      expect(other.tokens).toEqual(alone.tokens);
      expect(other.logprobs).toEqual(alone.logprobs);
    }
  });
});
