// The addon's pipelined step queue (cudaDeviceTokens): step N+1 is begun before step N's result
// is delivered, and the results are those of the serial queue, step for step. On the CPU the
// engine takes the same path with the sampled tokens resolved on the host; where a CUDA device is
// usable the same script runs there (tokens read on the device, decode graphs captured at load),
// where the same plans give the same batches and so the same bits.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { cudaUnavailableReason, loadNativeEngine, nativeAddon } from '../src/native/native.js';
import type { NativeSamplingParams, NativeStepPlan, NativeStepResult } from '../src/native/native-types.js';

const SEEDED: NativeSamplingParams = { temperature: 1, topP: 0.9, topK: 40, seed: 1234n, logprobs: 2 };
const STEPS = 28;
const MASK_STEP = 20;  // sequence 1 may sample only token 5 there
const cudaReady = nativeAddon().cudaCompiled && cudaUnavailableReason() === undefined;
const range = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

let root: string;
let tinyDir: string;
beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-pipelined-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 5 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

// Plans made without any result: five sequences prefilled in chunks of 7, then decoding; at step
// 6 sequence 2 ends and 100 arrives, at step 12 100 ends and 2 comes back with another prompt.
function script(): NativeStepPlan[] {
  const remaining = new Map<number, number>();
  const plans: NativeStepPlan[] = [];
  for (let k = 0; k < STEPS; k++) {
    const plan: NativeStepPlan = { seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), adds: [] };
    const add = (seqId: number, prompt: number[]) => {
      remaining.set(seqId, prompt.length);
      plan.adds!.push({ seqId, promptTokens: Int32Array.from(prompt), sampling: SEEDED });
    };
    const drop = (seqId: number) => {
      remaining.delete(seqId);
      plan.frees = Uint32Array.of(seqId);
    };
    if (k === 0) for (let s = 1; s <= 5; s++) add(s, range(9 + 4 * s, 3 * s));
    if (k === 6) drop(2), add(100, range(23, 60));
    if (k === 12) drop(100), add(2, range(11, 90));
    const ids: number[] = [];
    const counts: number[] = [];
    for (const [seqId, left] of remaining) {
      const count = left > 0 ? Math.min(left, 7) : 1;
      remaining.set(seqId, Math.max(0, left - count));
      ids.push(seqId);
      counts.push(count);
    }
    plan.seqIds = Uint32Array.from(ids);
    plan.numTokens = Uint32Array.from(counts);
    if (k === MASK_STEP) plan.constrained = Uint32Array.of(1), plan.maskSlot = 1;
    plans.push(plan);
  }
  return plans;
}

// Submits step k+1 before awaiting step k (as the overlapped batcher does); the masks of the
// constrained step go in once the step before it has returned.
async function run(pipelined: boolean, backend: 'cpu' | 'cuda' = 'cpu'): Promise<NativeStepResult[]> {
  const handle = await loadNativeEngine({
    modelDir: tinyDir, backend, kvCacheBytes: 4 << 20, blockSize: backend === 'cpu' ? 4 : 16, numThreads: 1,
    gpuMemoryUtilization: 0.45, cudaDeviceTokens: pipelined, cudaGraphsAtLoad: pipelined,
  });
  try {
    const words = Math.ceil(handle.info().vocabSize / 32);
    const mask = new Uint32Array(words);
    mask[0] = 1 << 5;
    const plans = script();
    const results: NativeStepResult[] = [];
    let pending = handle.step(plans[0]!);
    for (let k = 1; k < STEPS; k++) {
      const next = handle.step(plans[k]!);
      results.push(await pending);
      if (k === MASK_STEP) handle.provideMasks(1, mask);
      pending = next;
    }
    results.push(await pending);
    return results;
  } finally {
    handle.dispose();
  }
}

const view = (r: NativeStepResult) => ({
  seqIds: [...r.seqIds], tokens: [...r.tokens], logprobs: [...r.logprobs], errors: r.errors.map((e) => e.seqId),
  rowStatus: [...r.rowStatus], rowComputed: [...r.rowComputed], rowPending: [...r.rowPending],
});

describe('pipelined steps through the addon', () => {
  it('give the serial queue results, step for step, with churn and a token mask mid-run', async () => {
    const serial = await run(false);
    const piped = await run(true);
    expect(piped.map(view)).toEqual(serial.map(view));
    const masked = piped[MASK_STEP]!;
    expect(masked.tokens[[...masked.seqIds].indexOf(1)]).toBe(5);
    expect(serial.every((r) => r.errors.length === 0)).toBe(true);
  });

  it.skipIf(!cudaReady)('on CUDA, with device tokens and graphs captured at load, give the serial results', async () => {
    const serial = await run(false, 'cuda');
    const piped = await run(true, 'cuda');
    expect(piped.map(view)).toEqual(serial.map(view));
    const masked = piped[MASK_STEP]!;
    expect(masked.tokens[[...masked.seqIds].indexOf(1)]).toBe(5);
  });
});
