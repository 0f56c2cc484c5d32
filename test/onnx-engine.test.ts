// The ONNX Runtime backend against the native engine and the float64 reference, on every
// architecture variant engine-reference.test.ts covers: the export's logits (fp32, and int4 against
// the reference run on the same dequantized weights), greedy and seeded generations through the
// step contract, batching, and the facade's automatic choice of the backend.
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { exportOnnx, INT4_BLOCK, quantizeInt4, type OnnxQuantization } from '../models/onnx-export.js';
import { runMakeModel } from '../src/cli/make-model.js';
import { Engine } from '../src/engine/engine.js';
import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { loadOnnxHandle } from '../src/native/onnx/onnx-backend.js';
import { runNative, type NativeRun } from './helpers/native-run.js';
import { LOGPROB_TOL, NEAR_TIE_GAP, REFERENCE_VARIANTS, compareWithReference, promptFor } from './helpers/reference-compare.js';
import {
  loadReferenceModel, logSoftmax, referenceGreedyDetailed, referenceLogits, type Linear, type ReferenceModel,
} from './reference/reference-model.js';

// Tolerances. Observed worst cases over VARIANTS on these models (logits std ~6, |logit| up to ~27)
// in brackets.
// - Logits of the fp32 export vs the float64 reference, every position of an 11-token prompt:
//   max abs diff 1e-3 [6.1e-5]: f32 arithmetic in another order than the native kernels.
// - Logprobs (chosen token and top 5) of the ONNX backend vs the native engine on the same greedy
//   tokens: 5e-4 [6.5e-5] for f32/f16 checkpoints; bf16 checkpoints 5e-3 [6.3e-4], as the native
//   engine's bf16 tolerance against the reference (its AVX512-BF16 products; ONNX widens to f32).
// - int4 export vs the float64 reference run on the dequantized int4 weights: 2e-3 [6.7e-5] on the
//   logits of the export, and on the logprobs the backend serves along its greedy continuation
//   [4.8e-5]: MatMulNBits dequantizes exactly but accumulates in f32 in its own order. That
//   continuation must equal the dequantized reference's outright, as for f32 checkpoints.
const LOGIT_TOL = 1e-3;
const INT4_LOGIT_TOL = 2e-3;
const INT4_GENERATE = 40;

const VARIANTS = REFERENCE_VARIANTS;

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-onnx-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function exportLogits(path: string, ref: ReferenceModel, tokens: number[]): Promise<Float32Array> {
  const session = await ort.InferenceSession.create(path);
  const c = ref.config;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(tokens, BigInt), [1, tokens.length]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(tokens.length).fill(1n), [1, tokens.length]),
    position_ids: new ort.Tensor('int64', BigInt64Array.from(tokens, (_, i) => BigInt(i)), [1, tokens.length]),
  };
  for (let l = 0; l < c.numLayers; l++) {
    for (const kv of ['key', 'value']) {
      feeds[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, c.numKvHeads, 0, c.headDim]);
    }
  }
  const out = await session.run(feeds);
  expect(out.logits!.dims).toEqual([1, tokens.length, c.vocabSize]);
  expect(out['present.0.key']!.dims).toEqual([1, c.numKvHeads, tokens.length, c.headDim]);
  await session.release();
  return out.logits!.data as Float32Array;
}

function maxAbsDiff(got: Float32Array, want: Float64Array[]): number {
  let worst = 0;
  want.forEach((row, t) => row.forEach((w, j) => { worst = Math.max(worst, Math.abs(got[t * row.length + j]! - w)); }));
  return worst;
}

function compareRuns(got: NativeRun, want: NativeRun, tol: number): number {
  let worst = 0;
  got.tokens.forEach((_, i) => {
    worst = Math.max(worst, Math.abs(got.logprobs[i]! - want.logprobs[i]!));
    got.topLogprobs[i]!.forEach((lp, k) => { worst = Math.max(worst, Math.abs(lp - want.topLogprobs[i]![k]!)); });
  });
  expect(worst).toBeLessThan(tol);
  return worst;
}

describe.each(VARIANTS)('%s in %s, fp32 ONNX export', (preset, dtype) => {
  let dir: string;
  let native: NativeEngineHandle;
  let onnx: NativeEngineHandle;
  beforeAll(async () => {
    dir = join(root, `${preset}-${dtype}`);
    await makeModel({ preset, out: dir, dtype, seed: 7 });
    await exportOnnx({ modelDir: dir, quantization: 'fp32' });
    const opts = { modelDir: dir, kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 2 };
    native = await loadNativeEngine({ ...opts, backend: 'cpu' });
    onnx = await loadOnnxHandle({ ...opts, maxNumSeqs: 16 });
  });
  afterAll(() => {
    native?.dispose();
    onnx?.dispose();
  });

  it('writes the optimum layout with logits matching the float64 reference', async () => {
    expect(readdirSync(join(dir, 'onnx')).sort()).toEqual(['model.onnx', 'model.onnx_data']);
    const ref = loadReferenceModel(dir);
    const tokens = promptFor(ref.config.vocabSize, 11, 1);
    const worst = maxAbsDiff(await exportLogits(join(dir, 'onnx', 'model.onnx'), ref, tokens), referenceLogits(ref, tokens));
    console.log(`${preset}/${dtype}: fp32 export logits, max abs diff vs float64 ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(LOGIT_TOL);
  });

  it('generates greedily as the native engine does, with the same logprobs', async () => {
    const prompt = promptFor(onnx.info().vocabSize, 11, 1);
    const got = await runNative(onnx, prompt, 40);
    const want = await runNative(native, prompt, 40);
    if (NEAR_TIE_GAP[dtype] === 0) expect(got.tokens).toEqual(want.tokens);
    else await compareWithReference(onnx, dir, `${preset}/${dtype} onnx`, LOGPROB_TOL[dtype], NEAR_TIE_GAP[dtype]);
    const same = got.tokens.findIndex((t, i) => t !== want.tokens[i]);
    const upTo = same < 0 ? got.tokens.length : same;
    const worst = compareRuns(
      { ...got, tokens: got.tokens.slice(0, upTo) }, { ...want, tokens: want.tokens.slice(0, upTo) }, LOGPROB_TOL[dtype]);
    console.log(`${preset}/${dtype}: onnx vs native, ${upTo} greedy tokens agree, worst logprob diff ${worst.toExponential(2)}`);
  });

  it('tracks the float64 reference within the native engine tolerances', async () => {
    await compareWithReference(onnx, dir, `${preset}/${dtype} onnx`, LOGPROB_TOL[dtype], NEAR_TIE_GAP[dtype]);
  });

  it('gives the same tokens alone, in a padded decode batch of 16, and prefilled in chunks', async () => {
    const vocab = onnx.info().vocabSize;
    const prompt = promptFor(vocab, 29, 2);
    const companions = Array.from({ length: 15 }, (_, i) => promptFor(vocab, 3 + ((i * 7) % 40), i + 10));
    const alone = await runNative(onnx, prompt, 24);
    for (const other of [await runNative(onnx, prompt, 24, { companions }), await runNative(onnx, prompt, 24, { chunk: 5 })]) {
      expect(other.tokens).toEqual(alone.tokens);
      compareRuns(other, alone, 1e-4);
    }
  });

  it('draws the same seeded samples as the native engine', async () => {
    const prompt = promptFor(onnx.info().vocabSize, 9, 4);
    for (const sampling of [
      { temperature: 0.8, topP: 1, topK: 0, seed: 42n, logprobs: 2 },
      { temperature: 1.2, topP: 0.9, topK: 50, seed: 7n, logprobs: 0 },
      // min_p: 1 at a high temperature is greedy only where minP is honoured; 0.05 cuts the tail.
      { temperature: 2, topP: 1, topK: 0, minP: 1, seed: 5n, logprobs: 0 },
      { temperature: 1.5, topP: 0.95, topK: 40, minP: 0.05, seed: 9n, logprobs: 0 },
    ]) {
      const got = await runNative(onnx, prompt, 16, { sampling });
      const want = await runNative(native, prompt, 16, { sampling });
      expect(got.tokens).toEqual(want.tokens);
    }
  });
});

/** The reference model with every linear weight (lm_head included) replaced by its int4 round trip. */
function dequantizedReference(dir: string): ReferenceModel {
  const ref = loadReferenceModel(dir);
  const roundTrip = (l: Linear): Linear => {
    if (l.in % INT4_BLOCK !== 0) return l;
    const { packed, scales } = quantizeInt4(Float32Array.from(l.w), l.out, l.in);
    const w = new Float64Array(l.w.length);
    for (let i = 0; i < w.length; i++) {
      const nibble = (packed[i >> 1]! >> ((i & 1) * 4)) & 15;
      w[i] = (nibble - 8) * scales[Math.floor(i / INT4_BLOCK)]!;
    }
    // The quantizer itself, against the unquantized weights: each block's scale is its max |w| / 7
    // (as an f32) and every weight rounds to the nearest of its 16 levels, within half a scale.
    for (let b = 0; b < scales.length; b++) {
      let amax = 0;
      for (let j = 0; j < INT4_BLOCK; j++) amax = Math.max(amax, Math.abs(l.w[b * INT4_BLOCK + j]!));
      if (scales[b] !== Math.fround(amax / 7)) expect.fail(`int4 block ${b}: scale ${scales[b]} for max |w| ${amax}`);
      for (let j = 0; j < INT4_BLOCK; j++) {
        const i = b * INT4_BLOCK + j;
        if (Math.abs(w[i]! - l.w[i]!) > scales[b]! * (0.5 + 1e-6)) expect.fail(`int4 weight ${i}: ${l.w[i]} -> ${w[i]}, scale ${scales[b]}`);
      }
    }
    return { ...l, w };
  };
  for (const L of ref.layers) {
    for (const k of ['q', 'k', 'v', 'o', 'gate', 'up', 'down'] as const) L[k] = roundTrip(L[k]);
  }
  ref.lmHead = roundTrip(ref.lmHead);
  return ref;
}

// Every (preset, dtype) pair of VARIANTS: the int4 export quantizes the checkpoint's weights as
// widened to f32, so an f16 or bf16 checkpoint reaches MatMulNBits through its own read path.
describe.each(VARIANTS)('%s in %s, int4 ONNX export (MatMulNBits)', (preset, dtype) => {
  it('computes the logits of its dequantized weights, and serves its greedy text and logprobs', async () => {
    const dir = join(root, `${preset}-${dtype}-int4`);
    await makeModel({ preset, out: dir, dtype, seed: 7 });
    const quantization: OnnxQuantization = 'int4';
    await exportOnnx({ modelDir: dir, quantization });
    const ref = dequantizedReference(dir);
    const tokens = promptFor(ref.config.vocabSize, 11, 1);
    const worst = maxAbsDiff(await exportLogits(join(dir, 'onnx', 'model.onnx'), ref, tokens), referenceLogits(ref, tokens));
    console.log(`${preset}/${dtype}: int4 export logits, max abs diff vs float64 on the dequantized weights ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(INT4_LOGIT_TOL);
    const handle = await loadOnnxHandle({ modelDir: dir, kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 2, maxNumSeqs: 4 });
    try {
      expect(handle.info().simd).toContain('int4');
      const run = await runNative(handle, tokens, INT4_GENERATE);
      expect(run.tokens).toHaveLength(INT4_GENERATE);
      // Served through the backend (prefill, then decode steps on the KV cache): the dequantized
      // reference's greedy continuation outright, and its logprobs teacher-forced on those tokens.
      expect(run.tokens).toEqual(referenceGreedyDetailed(ref, tokens, INT4_GENERATE).tokens);
      const logits = referenceLogits(ref, [...tokens, ...run.tokens.slice(0, -1)]);
      let worstLp = 0;
      run.tokens.forEach((id, i) => {
        const lsm = logSoftmax(logits[tokens.length - 1 + i]!);
        worstLp = Math.max(worstLp, Math.abs(run.logprobs[i]! - lsm[id]!));
        run.topIds[i]!.forEach((top, k) => { worstLp = Math.max(worstLp, Math.abs(run.topLogprobs[i]![k]! - lsm[top]!)); });
      });
      console.log(`${preset}/${dtype}: int4 served, ${INT4_GENERATE} greedy tokens as the dequantized reference, worst logprob diff ${worstLp.toExponential(2)}`);
      expect(worstLp).toBeLessThan(INT4_LOGIT_TOL);
    } finally {
      handle.dispose();
    }
  });
});

describe('the facade on an export without safetensors', () => {
  let exportDir: string;
  let nativeDir: string;
  beforeAll(async () => {
    nativeDir = join(root, 'tiny');
    exportDir = join(root, 'tiny-onnx');
    await makeModel({ preset: 'tiny', out: nativeDir, seed: 3 });
    await exportOnnx({ modelDir: nativeDir, out: exportDir });
  });

  it('picks onnx under backend auto, and generates what the native engine does (stops, logprobs)', async () => {
    const onnx = await Engine.load({ model: exportDir, threads: 2, kvCacheBytes: 32 << 20 });
    const native = await Engine.load({ model: nativeDir, backend: 'cpu', threads: 2, kvCacheBytes: 32 << 20 });
    try {
      expect(onnx.info.backend).toBe('onnx');
      expect(onnx.info.prefixCaching).toBe(false);
      expect(onnx.info.weightBytes).toBeGreaterThan(0);
      const req = { messages: [{ role: 'user' as const, content: 'Tell me about rivers.' }], maxTokens: 24, logprobs: 3, temperature: 0 };
      const [got, want] = await Promise.all([onnx.generate(req), native.generate(req)]);
      expect(got.tokenIds).toEqual(want.tokenIds);
      expect(got.text).toEqual(want.text);
      expect(got.finishReason).toEqual(want.finishReason);
      got.logprobs!.forEach((lp, i) => expect(Math.abs(lp.logprob - want.logprobs![i]!.logprob)).toBeLessThan(LOGPROB_TOL.bf16));
      // A stop string cuts the same text on both.
      const stop = want.text.slice(4, 7);
      if (stop.trim().length > 0) {
        const [a, b] = await Promise.all([onnx.generate({ ...req, stop: [stop] }), native.generate({ ...req, stop: [stop] })]);
        expect(a.text).toEqual(b.text);
        expect(a.finishReason).toBe('stop');
      }
    } finally {
      await onnx.dispose();
      await native.dispose();
    }
  });

  it('refuses backend onnx on a directory without an export', async () => {
    const bare = join(root, 'bare');
    await makeModel({ preset: 'tiny', out: bare, seed: 3 });
    await expect(Engine.load({ model: bare, backend: 'onnx' })).rejects.toMatchObject({ code: 'model_file_missing' });
  });
});

describe('sluice make-model --onnx', () => {
  it('writes the export beside the checkpoint, and refuses an unknown quantization', async () => {
    const out = join(root, 'cli-int4');
    await runMakeModel(['--preset', 'test-qwen2', '--out', out, '--onnx', 'int4']);
    expect(existsSync(join(out, 'model.safetensors'))).toBe(true);
    expect(readdirSync(join(out, 'onnx')).sort()).toEqual(['model.onnx', 'model.onnx_data']);
    await expect(runMakeModel(['--preset', 'test-qwen2', '--out', join(root, 'cli-bad'), '--onnx', 'int8']))
      .rejects.toMatchObject({ code: 'invalid_argument' });
  });
});
