// min_p (vLLM's meaning) through the library and `sluice generate` on the CPU engine: after
// temperature, a token less likely than minP times the most likely one is never drawn. The
// sampler's distribution against a reference is native/tests/test_sampler.cpp's; here the kept set
// is checked from the logprobs the engine reports, with the raw logits as the reference.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';

const run = promisify(execFile);
const CLI = join(import.meta.dirname, '..', 'dist', 'src', 'cli.js');
const PROMPT = 'The river runs';
const SEEDS = [1, 2, 3, 4, 5, 6];

let root: string;
let tinyDir: string;
let engine: Engine;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-min-p-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 3 });
  engine = await Engine.load({ model: tinyDir, backend: 'cpu', kvCacheBytes: 32 << 20 });
});
afterAll(async () => {
  await engine?.dispose();
  rmSync(root, { recursive: true, force: true });
});

describe('minP', () => {
  it('with 1 and a temperature, always picks the argmax (the greedy continuation)', async () => {
    const greedy = await engine.generate({ prompt: PROMPT, maxTokens: 24, temperature: 0 });
    let leftGreedy = 0;
    for (const seed of SEEDS) {
      const kept = await engine.generate({ prompt: PROMPT, maxTokens: 24, temperature: 1.5, minP: 1, seed });
      expect(kept.tokenIds).toEqual(greedy.tokenIds);
      // The same draws without minP leave the greedy path: the temperature alone does not explain it.
      const free = await engine.generate({ prompt: PROMPT, maxTokens: 24, temperature: 1.5, seed });
      if (free.tokenIds.join() !== greedy.tokenIds.join()) leftGreedy++;
    }
    expect(leftGreedy).toBeGreaterThan(0);
  });

  it('draws only tokens at least minP times as likely as the best', async () => {
    // At temperature 1 the sampled distribution is the logprobs' own (log-softmax of the raw
    // logits), so a token is kept iff logprob >= best logprob + log(minP). Logprobs are f32 and
    // the cut is computed from the logits in double: 1e-4 of slack.
    const minP = 0.2;
    const floor = Math.log(minP);
    let wouldCut = 0;
    for (const seed of SEEDS) {
      const out = await engine.generate({ prompt: PROMPT, maxTokens: 24, temperature: 1, minP, seed, logprobs: 1 });
      expect(out.tokenIds.length).toBeGreaterThan(0);
      for (const lp of out.logprobs!) expect(lp.logprob - lp.top[0]!.logprob).toBeGreaterThanOrEqual(floor - 1e-4);
      // Without minP the same seeds draw tokens below the cut: the check above has teeth.
      const free = await engine.generate({ prompt: PROMPT, maxTokens: 24, temperature: 1, seed, logprobs: 1 });
      wouldCut += free.logprobs!.filter((lp) => lp.logprob - lp.top[0]!.logprob < floor).length;
    }
    expect(wouldCut).toBeGreaterThan(0);
  });

  it('0 changes nothing: the same seed draws the same tokens as without it', async () => {
    const a = await engine.generate({ prompt: PROMPT, maxTokens: 16, temperature: 1, seed: 9 });
    const b = await engine.generate({ prompt: PROMPT, maxTokens: 16, temperature: 1, seed: 9, minP: 0 });
    expect(b.tokenIds).toEqual(a.tokenIds);
  });

  it.each([-0.01, 1.01, Number.NaN, Number.POSITIVE_INFINITY, '0.5'])('refuses %s, naming minP', async (minP) => {
    const err = await engine.generate({ prompt: PROMPT, maxTokens: 4, minP: minP as number }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SluiceError);
    expect(err).toMatchObject({ code: 'invalid_request', param: 'minP' });
    expect((err as Error).message).toMatch(/^minP must be a number in \[0, 1\]/);
  });
});

describe('sluice generate --min-p', () => {
  it('passes the flag to the engine: --min-p 1 at temperature 1.5 prints the greedy tokens', async () => {
    const greedy = await engine.generate({ prompt: 'Hello', maxTokens: 8, temperature: 0 });
    const { stdout } = await run(process.execPath, [CLI, 'generate', '--model', tinyDir, '--prompt', 'Hello',
      '--max-tokens', '8', '--temperature', '1.5', '--min-p', '1', '--seed', '4', '--backend', 'cpu', '--json']);
    expect(JSON.parse(stdout).token_ids).toEqual(greedy.tokenIds);
  });

  it('exits 1 naming --min-p on a value outside [0, 1]', async () => {
    const err = await run(process.execPath, [CLI, 'generate', '--model', tinyDir, '--prompt', 'x', '--min-p', '1.5'])
      .catch((e: { code: number; stderr: string }) => e);
    expect((err as { code: number }).code).toBe(1);
    expect((err as { stderr: string }).stderr).toMatch(/--min-p must be a number in \[0, 1\], got "1\.5"/);
    expect((err as { stderr: string }).stderr).not.toMatch(/at .*\.js:\d+/);
  });
});
