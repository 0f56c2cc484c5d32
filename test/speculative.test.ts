// Speculative decoding end to end (issue 35): drafts planned by the scheduler
// (src/scheduler/speculator.ts) and verified by the engine.
//   - The Engine facade with prompt lookup: greedy output is the same text, tokens and logprobs with
//     and without speculation, alone, batched, under preemption, with stop strings and max_tokens,
//     and for structured-output requests (drafts verified under the grammar's mask after each). The project's random models
//     rarely repeat themselves, so few drafts are accepted here;
//   - hence the Batcher with an oracle speculator proposing a token-by-token run's own continuation
//     (right, or right then wrong) on four families: many drafts accepted, the same tokens alone,
//     batched and preempted, and a sink's stop and max_tokens cutting inside an accepted run.
// Sampled rows' distribution: native/tests/test_speculative.cpp.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import { nativeAvailable } from '../src/native/native.js';
import { Speculator, speculativeOptions } from '../src/scheduler/speculator.js';
import { Sequence } from '../src/scheduler/sequence.js';
import { Batcher, type SequenceOutcome } from '../src/scheduler/batcher.js';
import { loadNativeEngine } from '../src/native/native.js';
import { writePerturbedDraft } from '../models/draft-checkpoint.js';
import { speculativeFlags } from '../src/cli/args.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-speculative-facade-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

// Prompts that repeat themselves, so that prompt lookup finds matches from the first decode step.
const PROMPTS = [
  'the cat sat on the mat and the cat sat on the mat and the cat',
  'one two three four one two three four one two three',
  'a b c d e f g a b c d e f g a b c',
  'hello world hello world hello world hello',
];

const same = (a: GenerateResult, b: GenerateResult) => {
  expect(a.tokenIds).toEqual(b.tokenIds);
  expect(a.text).toEqual(b.text);
  expect(a.finishReason).toEqual(b.finishReason);
  expect(a.logprobs!.map((l) => l.logprob)).toEqual(b.logprobs!.map((l) => l.logprob));
};

describe.skipIf(!nativeAvailable()).each(['test-llama', 'test-qwen2'])('speculative decoding through the engine: %s', (preset) => {
  let plain: Engine;
  let spec: Engine;
  let tight: Engine;
  let tightSpec: Engine;
  beforeAll(async () => {
    const dir = join(root, preset);
    await makeModel({ preset, out: dir, dtype: 'f32' });
    const base = { model: dir, backend: 'cpu' as const, threads: 2, kvCacheBytes: 8 << 20, blockSize: 4 };
    plain = await Engine.load(base);
    spec = await Engine.load({ ...base, speculative: { method: 'ngram', numSpeculativeTokens: 4 } });
    // A pool of a few blocks: concurrent requests preempt each other.
    const blockBytes = plain.info.kvCacheBytes / plain.info.numBlocks;
    const small = { ...base, kvCacheBytes: Math.floor(blockBytes * 40), maxNumSeqs: 4, maxBatchedTokens: 64 };
    tight = await Engine.load(small);
    tightSpec = await Engine.load({ ...small, speculative: { method: 'ngram', numSpeculativeTokens: 3 } });
  }, 120_000);
  afterAll(async () => {
    for (const e of [plain, spec, tight, tightSpec]) await e?.dispose();
  });

  const ask = (engine: Engine, prompt: string, extra: Record<string, unknown> = {}) =>
    engine.generate({ prompt, maxTokens: 100, temperature: 0, logprobs: 0, ...extra });

  it('gives the same greedy output alone and batched, and verifies drafts', async () => {
    expect(spec.info.backend).toBe('cpu');
    for (const prompt of PROMPTS) same(await ask(spec, prompt), await ask(plain, prompt));
    const [a, b] = await Promise.all([Promise.all(PROMPTS.map((p) => ask(spec, p))), Promise.all(PROMPTS.map((p) => ask(plain, p)))]);
    a.forEach((r, i) => same(r, b[i]!));
    const stats = spec.schedulerStats().speculation!;
    console.log(`${preset}: ${stats.numAcceptedTokens} of ${stats.numDraftTokens} drafts accepted`);
    expect(stats.numDraftTokens).toBeGreaterThan(0);
    expect(plain.schedulerStats().speculation).toBeUndefined();
  });

  it('cuts at stop strings and max_tokens exactly where a token-by-token run does', async () => {
    for (const prompt of PROMPTS) {
      const reference = await ask(plain, prompt);
      // A stop string made of text the model writes in the middle of its output.
      const mid = reference.text.slice(Math.floor(reference.text.length / 2), Math.floor(reference.text.length / 2) + 3);
      if (mid.trim().length > 0) same(await ask(spec, prompt, { stop: [mid] }), await ask(plain, prompt, { stop: [mid] }));
      for (const maxTokens of [1, 2, 5, 13]) same(await ask(spec, prompt, { maxTokens }), await ask(plain, prompt, { maxTokens }));
    }
  });

  it('gives the same output when sequences are preempted and recomputed', async () => {
    const prompts = [...PROMPTS, ...PROMPTS.map((p) => `${p} again`)];
    const [a, b] = await Promise.all([Promise.all(prompts.map((p) => ask(tightSpec, p, { maxTokens: 48 }))),
      Promise.all(prompts.map((p) => ask(tight, p, { maxTokens: 48 })))]);
    a.forEach((r, i) => same(r, b[i]!));
  });

  it('drafts for a structured-output request under the mask after each draft, whose output stays the same', async () => {
    // A schema whose output repeats itself, so prompt lookup finds its drafts in the output so far.
    const schema = {
      type: 'object', required: ['words'], additionalProperties: false,
      properties: {
        words: {
          type: 'array', minItems: 4, maxItems: 4,
          items: { type: 'object', properties: { word: { const: 'sluice gate' } }, required: ['word'], additionalProperties: false },
        },
      },
    };
    const before = spec.schedulerStats().speculation!;
    const json = (engine: Engine) => engine.generate({ prompt: PROMPTS[0]!, maxTokens: 400, temperature: 0, logprobs: 0,
      responseFormat: { type: 'json_schema', schema, strict: true } });
    const [a, b] = [await json(spec), await json(plain)];
    same(a, b);
    expect((JSON.parse(a.text) as { words: unknown[] }).words).toHaveLength(4);
    const after = spec.schedulerStats().speculation!;
    console.log(`${preset} structured: ${after.numAcceptedTokens - before.numAcceptedTokens} of ` +
      `${after.numDraftTokens - before.numDraftTokens} drafts accepted`);
    expect(after.numAcceptedTokens - before.numAcceptedTokens).toBeGreaterThan(0);
    // Beside unconstrained requests in the same steps, still the same.
    const [c, d] = await Promise.all([Promise.all([json(spec), ask(spec, PROMPTS[1]!)]), Promise.all([json(plain), ask(plain, PROMPTS[1]!)])]);
    c.forEach((r, i) => same(r, d[i]!));
  });
});

/** Proposes what a token-by-token run of the same prompt generated: `right` tokens of it, then changed ones. */
class OracleSpeculator extends Speculator {
  constructor(private readonly continuations: Map<string, number[]>, private readonly right: number, k: number, private readonly vocab: number) {
    super({ method: 'ngram', numSpeculativeTokens: k });
  }
  protected override lookup(seq: Sequence, k: number): number[] {
    const ref = this.continuations.get(seq.request.promptTokenIds.join(','));
    if (ref === undefined) return [];
    const at = seq.numGeneratedTokens;
    return ref.slice(at, at + k).map((t, j) => (j < this.right ? t : (t + 1) % this.vocab));
  }
}

interface Run { tokens: number[]; outcome: Promise<SequenceOutcome> }
function submitTo(batcher: Batcher, prompt: number[], maxTokens: number, stopAfter?: number): Run {
  const run = { tokens: [] as number[] } as Run;
  run.outcome = new Promise((resolve) => {
    batcher.submit({
      promptTokenIds: prompt, maxTokens, sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 },
      sink: {
        onToken: (t) => { run.tokens.push(t.tokenId); return stopAfter !== undefined && run.tokens.length >= stopAfter; },
        onEnd: resolve,
      },
    });
  });
  return run;
}

describe.skipIf(!nativeAvailable()).each(['test-llama', 'test-qwen3', 'test-gemma3', 'test-gpt-oss'])('verified drafts through the batcher: %s', (preset) => {
  let handle: NativeEngineHandle;
  let tightHandle: NativeEngineHandle;
  const prompts = Array.from({ length: 6 }, (_, i) => Array.from({ length: 5 + 3 * i }, (_, j) => (j * 37 + i * 101 + 11) % 500));
  const reference = new Map<string, number[]>();
  beforeAll(async () => {
    const dir = join(root, `batcher-${preset}`);
    await makeModel({ preset, out: dir, dtype: 'f32' });
    handle = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 8 << 20, blockSize: 4, numThreads: 2 });
    const blockBytes = handle.info().kvCacheBytes / handle.info().numBlocks;
    tightHandle = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: Math.floor(blockBytes * 36), blockSize: 4, numThreads: 2 });
    const plain = new Batcher(handle, { overlap: false });
    const runs = prompts.map((p) => submitTo(plain, p, 40));
    await Promise.all(runs.map((r) => r.outcome));
    await plain.dispose();
    prompts.forEach((p, i) => reference.set(p.join(','), runs[i]!.tokens));
  }, 120_000);
  afterAll(() => {
    handle?.dispose();
    tightHandle?.dispose();
  });

  it('gains the reference tokens with right and half-right drafts, alone and batched', async () => {
    const vocab = handle.info().vocabSize;
    for (const [right, k] of [[4, 4], [2, 4], [0, 3]] as const) {
      const speculator = new OracleSpeculator(reference, right, k, vocab);
      const batcher = new Batcher(handle, { overlap: false, speculator });
      const alone = submitTo(batcher, prompts[0]!, 40);
      await alone.outcome;
      expect(alone.tokens).toEqual(reference.get(prompts[0]!.join(',')));
      const runs = prompts.map((p) => submitTo(batcher, p, 40));
      await Promise.all(runs.map((r) => r.outcome));
      runs.forEach((r, i) => expect(r.tokens, `prompt ${i}, ${right} of ${k} right`).toEqual(reference.get(prompts[i]!.join(','))));
      const { numDraftTokens, numAcceptedTokens } = batcher.stats.speculation!;
      if (right === 0) expect(numAcceptedTokens).toBe(0);
      else expect(numAcceptedTokens).toBeGreaterThan(numDraftTokens / 4);
      await batcher.dispose();
    }
  });

  it('stops and ends at max_tokens inside an accepted run', async () => {
    const speculator = new OracleSpeculator(reference, 4, 4, handle.info().vocabSize);
    const batcher = new Batcher(handle, { overlap: false, speculator });
    const ref = reference.get(prompts[1]!.join(','))!;
    for (const n of [1, 2, 3, 6, 7, 11]) {
      const stopped = submitTo(batcher, prompts[1]!, 40, n);
      const capped = submitTo(batcher, prompts[1]!, n);
      await Promise.all([stopped.outcome, capped.outcome]);
      expect(stopped.tokens).toEqual(ref.slice(0, n));
      expect(capped.tokens).toEqual(ref.slice(0, n));
      expect(await capped.outcome).toEqual({ kind: 'finished' });
    }
    await batcher.dispose();
  });

  it('gains the reference tokens when sequences are preempted and recomputed', async () => {
    const speculator = new OracleSpeculator(reference, 3, 4, handle.info().vocabSize);
    const events: number[] = [];
    const batcher = new Batcher(tightHandle, { overlap: false, speculator, maxNumSeqs: 6, onStep: (r) => events.push(r.preempted.length) });
    const runs = prompts.map((p) => submitTo(batcher, p, 40));
    await Promise.all(runs.map((r) => r.outcome));
    runs.forEach((r, i) => expect(r.tokens, `prompt ${i}`).toEqual(reference.get(prompts[i]!.join(','))));
    expect(events.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    expect(batcher.stats.speculation!.numAcceptedTokens).toBeGreaterThan(0);
    await batcher.dispose();
  });
});

describe.skipIf(!nativeAvailable())('speculative decoding with a draft model', () => {
  let target: string;
  let plain: Engine;
  beforeAll(async () => {
    target = join(root, 'draft-target');
    await makeModel({ preset: 'test-qwen2', out: target, dtype: 'f32' });
    plain = await Engine.load({ model: target, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, blockSize: 4 });
  }, 120_000);
  afterAll(async () => plain?.dispose());

  it('gives the same greedy output alone and batched, the draft agreeing often, and frees its engine', async () => {
    const draftDir = join(root, 'draft-perturbed');
    writePerturbedDraft(target, draftDir, { scale: 0.02, seed: 5 });
    const spec = await Engine.load({ model: target, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20, blockSize: 4,
      speculative: { method: 'draft', draftModel: draftDir, numSpeculativeTokens: 4 } });
    try {
      const ask = (engine: Engine, prompt: string) => engine.generate({ prompt, maxTokens: 48, temperature: 0, logprobs: 0 });
      for (const prompt of PROMPTS) same(await ask(spec, prompt), await ask(plain, prompt));
      const [a, b] = await Promise.all([Promise.all(PROMPTS.map((p) => ask(spec, p))), Promise.all(PROMPTS.map((p) => ask(plain, p)))]);
      a.forEach((r, i) => same(r, b[i]!));
      const stats = spec.schedulerStats().speculation!;
      console.log(`perturbed draft (scale 0.02): ${stats.numAcceptedTokens} of ${stats.numDraftTokens} drafts accepted`);
      expect(stats.numAcceptedTokens).toBeGreaterThan(stats.numDraftTokens * 0.3);
    } finally {
      await spec.dispose();
    }
  });

  it('refuses a draft with another tokenizer, and a draft with no tokenizer.json', async () => {
    // The target's own files but a tokenizer.json that differs (a token renamed).
    const other = join(root, 'draft-other');
    writePerturbedDraft(target, other, { scale: 0 });
    const tok = JSON.parse(readFileSync(join(other, 'tokenizer.json'), 'utf8')) as { model: { vocab: Record<string, number> } };
    const [first] = Object.keys(tok.model.vocab);
    tok.model.vocab[`${first!}x`] = tok.model.vocab[first!]!;
    delete tok.model.vocab[first!];
    writeFileSync(join(other, 'tokenizer.json'), JSON.stringify(tok));
    await expect(Engine.load({ model: target, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20,
      speculative: { method: 'draft', draftModel: other, numSpeculativeTokens: 4 } })).rejects.toThrow(/another tokenizer/);
    await expect(Engine.load({ model: target, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20,
      speculative: { method: 'draft', draftModel: join(root, 'absent'), numSpeculativeTokens: 4 } })).rejects.toThrow(/no tokenizer.json/);
    await expect(Engine.load({ model: target, backend: 'cpu', threads: 2, kvCacheBytes: 8 << 20,
      speculative: { method: 'draft', numSpeculativeTokens: 4 } })).rejects.toThrow(/draftModel/);
  });

  it('reads --speculative and --num-speculative-tokens', () => {
    expect(speculativeFlags(undefined, undefined)).toBeUndefined();
    expect(speculativeFlags('ngram', undefined)).toEqual({ method: 'ngram', numSpeculativeTokens: 4 });
    expect(speculativeFlags('draft:/m/d', '6')).toEqual({ method: 'draft', draftModel: '/m/d', numSpeculativeTokens: 6 });
    expect(speculativeFlags('eagle3:/m/e', '3')).toEqual({ method: 'eagle3', draftModel: '/m/e', numSpeculativeTokens: 3 });
    expect(() => speculativeFlags('eagle3:', undefined)).toThrow(/--speculative/);
    expect(() => speculativeFlags('medusa', undefined)).toThrow(/--speculative/);
    expect(() => speculativeFlags(undefined, '4')).toThrow(/needs --speculative/);
    expect(() => speculativeFlags('ngram', '17')).toThrow(/--num-speculative-tokens/);
  });
});

describe('the speculator', () => {
  const request = (maxTokens: number) => ({
    promptTokenIds: [1, 2, 3, 4, 1, 2, 3], maxTokens, sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 },
    sink: { onToken: () => false, onEnd: () => {} },
  });

  it('proposes from the prompt and output, within max_tokens, only for rows with nothing in flight', () => {
    const s = new Speculator({ method: 'ngram', numSpeculativeTokens: 3 });
    const seq = new Sequence(request(10), 0);
    expect(s.propose(seq, 8)).toEqual([]);  // no token generated yet: the row is not decoding
    seq.generatedTokenIds.push(4);  // ... 1 2 3 4: "3 4" was followed by "1 2 3"
    expect(s.propose(seq, 8)).toEqual([1, 2, 3]);
    expect(s.propose(seq, 2)).toEqual([1, 2]);
    seq.inFlight.push({ step: 1, numTokens: 1 });
    expect(s.propose(seq, 8)).toEqual([]);
    seq.inFlight.pop();
    const near = new Sequence(request(3), 1);
    near.generatedTokenIds.push(4);
    expect(s.propose(near, 8)).toEqual([1]);  // 1 generated + 1 pending... 3 - 1 - 1 = 1 draft at most
    near.generatedTokenIds.push(1);
    expect(s.propose(near, 8)).toEqual([]);
    // An output grammar: masks are one per row, so no drafts.
    const constrained = new Sequence({ ...request(10), constraint: {} as never }, 2);
    constrained.generatedTokenIds.push(4);
    expect(s.propose(constrained, 8)).toEqual([]);
  });

  it('drafts one token at a time for a sequence whose drafts keep failing, and stops drafting under load', () => {
    const s = new Speculator({ method: 'ngram', numSpeculativeTokens: 4, maxSpeculativeSeqs: 2 });
    const seq = new Sequence(request(100), 0);
    seq.generatedTokenIds.push(4, 1, 2, 3, 4);
    expect(s.propose(seq, 8).length).toBe(4);
    for (let i = 0; i < 8; i++) s.record(seq, 4, 0);
    expect(s.propose(seq, 8).length).toBe(1);
    for (let i = 0; i < 8; i++) s.record(seq, 1, 1);
    expect(s.propose(seq, 8).length).toBe(4);
    expect(s.stats).toEqual({ numDraftTokens: 40, numAcceptedTokens: 8 });
    expect(s.active(2)).toBe(true);
    expect(s.active(3)).toBe(false);
  });

  it('drafts once every PROBE_EVERY tokens for a sequence whose drafts almost never agree, and recovers', () => {
    class Always extends Speculator {
      protected override lookup(_seq: Sequence, k: number): number[] {
        return Array.from({ length: k }, () => 9);
      }
    }
    const s = new Always({ method: 'ngram', numSpeculativeTokens: 4 });
    const seq = new Sequence(request(100), 0);
    seq.generatedTokenIds.push(1);
    for (let i = 0; i < 20; i++) s.record(seq, 4, 0);  // acceptance 0.75^20: almost never
    const counts: number[] = [];
    for (let g = 2; g <= 17; g++) {
      seq.generatedTokenIds.push(1);  // g tokens generated
      counts.push(s.propose(seq, 8).length);
    }
    expect(counts.filter((c) => c > 0)).toEqual([1, 1]);  // at 8 and 16 generated tokens
    expect(counts[6]).toBe(1);
    // Probes that agree bring it back: one draft at a time, then K.
    for (let i = 0; i < 2; i++) s.record(seq, 1, 1);
    expect(s.propose(seq, 8).length).toBe(1);
    for (let i = 0; i < 8; i++) s.record(seq, 1, 1);
    expect(s.propose(seq, 8).length).toBe(4);
  });

  it('checks its options', () => {
    expect(() => speculativeOptions({ method: 'medusa' as never, numSpeculativeTokens: 4 })).toThrow(/'ngram', 'draft' or 'eagle3'/);
    expect(() => speculativeOptions({ method: 'eagle3', numSpeculativeTokens: 4 })).toThrow(/EAGLE-3 head's directory/);
    expect(() => speculativeOptions({ method: 'draft', numSpeculativeTokens: 4 })).toThrow(/draftModel/);
    expect(() => speculativeOptions({ method: 'ngram', numSpeculativeTokens: 0 })).toThrow(/numSpeculativeTokens/);
    expect(() => speculativeOptions({ method: 'ngram', numSpeculativeTokens: 17 })).toThrow(/numSpeculativeTokens/);
    expect(speculativeOptions({ method: 'ngram', numSpeculativeTokens: 2 })).toMatchObject({ maxSpeculativeSeqs: 8, maxDraftTokensPerStep: 32 });
  });
});
