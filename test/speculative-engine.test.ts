// Draft verification in the native engine through the addon (StepPlan drafts, issue 35) on every
// CPU family: a greedy sequence given drafts (right, wrong, and right then wrong) gains exactly the
// tokens and logprobs of a token-by-token run, alone and batched with sequences that draft too;
// sliding-window families (Gemma 3, gpt-oss) give back the window blocks of rejected drafts; every
// block returns to the pool. native/tests/test_speculative.cpp covers the sampled distribution,
// the prefix cache and failures.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { loadNativeEngine, nativeAvailable } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { GREEDY, runNative } from './helpers/native-run.js';
import { type PublishedFamily, writePublishedCheckpoint } from './helpers/published-checkpoints.js';
import { promptFor } from './helpers/reference-compare.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-speculative-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Drafts for a sequence that has generated `generated` tokens: up to k of `ref`'s next ones, the first `right` of them kept, the rest changed. */
type Proposer = (generated: number) => number[];
const fromReference = (ref: number[], k: number, right: number, vocab: number): Proposer => (generated) =>
  ref.slice(generated, generated + k).map((t, j) => (j < right ? t : (t + 1 + j) % vocab));

interface SpecRun {
  tokens: number[][];
  logprobs: number[][];
  drafted: number;
  accepted: number;
  steps: number;
}

/** Generates n tokens for each prompt, every sequence proposing drafts at its decode steps. */
async function runSpeculative(engine: NativeEngineHandle, prompts: number[][], n: number, proposers: Proposer[]): Promise<SpecRun> {
  const ids = prompts.map((_, i) => 5000 + i);
  const out: SpecRun = { tokens: prompts.map(() => []), logprobs: prompts.map(() => []), drafted: 0, accepted: 0, steps: 0 };
  let adds: Parameters<NativeEngineHandle['step']>[0]['adds'] = prompts.map((p, i) => ({ seqId: ids[i]!, promptTokens: Int32Array.from(p), sampling: GREEDY }));
  try {
    while (out.tokens.some((t) => t.length < n)) {
      const drafts = out.tokens.map((t, i) => (adds || t.length >= n ? [] : proposers[i]!(t.length)));
      const plan = {
        seqIds: Uint32Array.from(ids),
        numTokens: Uint32Array.from(drafts.map((d) => (adds ? 1 << 20 : 1 + d.length))),
        numDrafts: Uint32Array.from(drafts.map((d) => d.length)),
        drafts: Int32Array.from(drafts.flat()),
        adds,
      };
      adds = undefined;
      const res = await engine.step(plan);
      out.steps++;
      expect(res.errors).toEqual([]);
      expect(Array.from(res.rowStatus)).toEqual(ids.map(() => 0));
      for (let j = 0; j < res.seqIds.length; j++) {
        const i = ids.indexOf(res.seqIds[j]!);
        out.tokens[i]!.push(res.tokens[j]!);
        out.logprobs[i]!.push(res.logprobs[j]!);
      }
      for (const [i, d] of drafts.entries()) {
        expect(res.rowDrafted![i]).toBe(d.length);
        expect(res.rowComputed[i]).toBe(d.length > 0 ? 1 + res.rowAccepted![i]! : res.rowComputed[i]);
      }
      out.drafted += res.rowDrafted!.reduce((a, v) => a + v, 0);
      out.accepted += res.rowAccepted!.reduce((a, v) => a + v, 0);
    }
  } finally {
    await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.from(ids) });
  }
  out.tokens = out.tokens.map((t) => t.slice(0, n));
  out.logprobs = out.logprobs.map((l) => l.slice(0, n));
  return out;
}

const MADE = ['test-llama', 'test-qwen2', 'test-qwen2.5-vl'] as const;
const PUBLISHED: PublishedFamily[] = ['gemma3', 'gpt-oss', 'qwen3-moe'];
const FAMILIES: Array<['made', string] | ['published', PublishedFamily]> = [
  ...MADE.map((m) => ['made', m] as ['made', string]),
  ...PUBLISHED.map((f) => ['published', f] as ['published', PublishedFamily]),
];

describe.skipIf(!nativeAvailable()).each(FAMILIES)('draft verification: %s %s', (kind, name) => {
  let engine: NativeEngineHandle;
  beforeAll(async () => {
    const dir = join(root, name);
    if (kind === 'made') await makeModel({ preset: name, out: dir, dtype: 'f32' });
    else writePublishedCheckpoint(dir, name as PublishedFamily, { dtype: 'f32', seed: 3 });
    engine = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 32 << 20, blockSize: 4, numThreads: 2 });
  }, 120_000);
  afterAll(() => engine?.dispose());

  it('gains the tokens and logprobs of a token-by-token run, alone and batched, and gives back every block', async () => {
    expect(engine.info().draftVerification).toBe(true);
    const vocab = engine.info().vocabSize;
    const prompts = [promptFor(vocab, 19, 1), promptFor(vocab, 7, 2), promptFor(vocab, 30, 3)];
    const n = 20;
    const plain = await Promise.all(prompts.map(async (p) => runNative(engine, p, n)));
    const before = await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0) });
    const windowBefore = engine.info().windowBlocksInUse;

    const cases: Array<[string, number, number]> = [['right', 4, 4], ['wrong', 3, 0], ['right then wrong', 5, 2]];
    for (const [label, k, right] of cases) {
      const alone = await runSpeculative(engine, [prompts[0]!], n, [fromReference(plain[0]!.tokens, k, right, vocab)]);
      expect(alone.tokens[0], label).toEqual(plain[0]!.tokens);
      expect(alone.logprobs[0], label).toEqual(plain[0]!.logprobs);
      expect(alone.drafted, label).toBeGreaterThan(0);
      if (right === k) expect(alone.accepted, label).toBe(alone.drafted);
      if (right === 0) expect(alone.accepted, label).toBe(0);
    }
    // Batched, each sequence with drafts of its own quality.
    const batch = await runSpeculative(engine, prompts, n, [
      fromReference(plain[0]!.tokens, 4, 1, vocab), fromReference(plain[1]!.tokens, 2, 2, vocab), fromReference(plain[2]!.tokens, 3, 0, vocab),
    ]);
    batch.tokens.forEach((t, i) => {
      expect(t, `sequence ${i}`).toEqual(plain[i]!.tokens);
      expect(batch.logprobs[i], `sequence ${i}`).toEqual(plain[i]!.logprobs);
    });
    expect(batch.accepted).toBeGreaterThan(0);
    expect(batch.accepted).toBeLessThan(batch.drafted);

    const after = await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0) });
    expect(after.numFreeBlocks).toBe(before.numFreeBlocks);
    expect(engine.info().windowBlocksInUse).toBe(windowBefore);
  });
});
