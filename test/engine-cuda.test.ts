// The CUDA backend against the independent float64 reference and against the CPU backend, on
// the small generated models of every supported variant. Runs only where a CUDA device is
// usable (skipped, and reported as skipped, elsewhere); the native CUDA tests (ctest) check the
// kernels one by one.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel, type QuantizeOptions } from '../models/make-model.js';
import { writeLoraAdapter } from '../models/lora-checkpoint.js';
import { declaredAdapterBytes } from '../src/engine/adapter-set.js';
import { cudaUnavailableReason, loadNativeEngine, nativeAddon } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { GREEDY, runNative } from './helpers/native-run.js';
import { type PublishedFamily, writePublishedCheckpoint } from './helpers/published-checkpoints.js';
import { compareWithReference, promptFor } from './helpers/reference-compare.js';
import { roundToE4m3 } from './reference/fp8.js';
import type { Linear } from './reference/math.js';
import { type ReferenceModel, loadReferenceModel } from './reference/reference-model.js';
import { Qwen25VlSession, loadQwen25VlReference } from './reference/qwen2-5-vl.js';
import { Engine } from '../src/engine/engine.js';
import { expectTeacherForced, patternImage, prepareForReference, referenceInput } from './helpers/vision.js';
import { Gemma3VlSession, loadGemma3VlReference } from './reference/gemma3-vl.js';

const cudaReady = nativeAddon().cudaCompiled && cudaUnavailableReason() === undefined;

// Tolerances (the same for every family): the CUDA backend rounds activations to bf16 before every product (f16 for f16
// models), as vLLM does, and keeps K/V in bf16. On these deliberately sharp random models that
// moves logprobs as the CPU's matmul precision 'bf16' does (up to ~0.35): logprobs within 0.6 of
// the reference, and continuations equal until the first reference top-2 gap under 1.0. f32
// checkpoints are rounded to bf16 on upload, which doubles that [observed 0.86]: 1.2.
const LOGPROB_TOL = { f32: 1.2, f16: 0.6, bf16: 0.6 };
const NEAR_TIE_GAP = 1.0;

const VARIANTS: Array<[string, 'f32' | 'f16' | 'bf16']> = [
  ['test-llama', 'bf16'],
  ['test-llama', 'f32'],
  ['test-llama-linear', 'bf16'],
  ['test-qwen2', 'bf16'],
  ['test-qwen3', 'bf16'],
  ['test-mistral', 'f16'],
  // The families of the architecture table beyond the dense ones: mixture of experts (grouped
  // GEMM), Gemma 3 (sandwich norms, GELU-tanh, windows, local rope, soft cap), gpt-oss (MXFP4
  // experts unpacked at load, sinks, clamped SwiGLU, YaRN).
  ['test-qwen3-moe', 'bf16'],
  ['test-mixtral', 'bf16'],
  ['test-gemma3', 'bf16'],
  ['test-gpt-oss', 'bf16'],
];

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-cuda-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe.skipIf(!cudaReady).each(VARIANTS)('CUDA: %s in %s', (preset, dtype) => {
  let dir: string;
  let gpu: NativeEngineHandle;
  let cpu: NativeEngineHandle;
  beforeAll(async () => {
    dir = join(root, `${preset}-${dtype}`);
    await makeModel({ preset, out: dir, dtype, seed: 7 });
    gpu = await loadNativeEngine({ modelDir: dir, backend: 'cuda', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 0 });
    cpu = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 2 });
  });
  afterAll(() => {
    gpu?.dispose();
    cpu?.dispose();
  });

  it('greedy continuation and logprobs track the float64 reference', async () => {
    expect(gpu.info().backend).toBe('cuda');
    await compareWithReference(gpu, dir, `cuda ${preset}/${dtype}`, LOGPROB_TOL[dtype], NEAR_TIE_GAP);
  });

  it('agrees with the CPU backend alone, in a batch of 16 and prefilled in chunks', async () => {
    const vocab = gpu.info().vocabSize;
    const prompt = promptFor(vocab, 29, 2);
    const companions = Array.from({ length: 15 }, (_, i) => promptFor(vocab, 3 + ((i * 7) % 40), i + 10));
    const want = await runNative(cpu, prompt, 32);
    for (const opts of [{}, { companions }, { chunk: 5 }, { companions, chunk: 3 }]) {
      const got = await runNative(gpu, prompt, 32, opts);
      const diverged = got.tokens.findIndex((t, i) => t !== want.tokens[i]);
      const upTo = diverged < 0 ? got.tokens.length : diverged;
      if (diverged >= 0) {
        const gap = want.topLogprobs[diverged]![0]! - want.topLogprobs[diverged]![1]!;
        expect(gap, `diverged from the CPU backend at step ${diverged}`).toBeLessThan(NEAR_TIE_GAP);
        console.warn(`cuda ${preset}/${dtype} ${JSON.stringify(Object.keys(opts))}: near tie at step ${diverged} (CPU gap ${gap.toFixed(3)})`);
      }
      for (let i = 0; i < upTo; i++) expect(Math.abs(got.logprobs[i]! - want.logprobs[i]!)).toBeLessThan(LOGPROB_TOL[dtype]);
    }
  });
});

// Quantized checkpoints as published: FP8 projections kept e4m3 on the GPU (W8A8: activations
// quantized per token, or per token per 128 columns for block scales) except MoE experts and the
// lm_head (bf16); AWQ / GPTQ 4-bit projections kept 4-bit (W4A16: GEMVs for decode, dequantized for
// larger steps) except MoE experts (bf16); GPTQ 8-bit handed to the GPU as bf16. The reference is
// the float64 model of the dequantized weights; the 4-bit kernels use those weights exactly (or
// rounded to bf16 once), so the tolerances are the bf16 ones above; FP8 adds the activations'
// rounding to 3 mantissa bits, hence its wider logprob tolerance. weightDtype reports layer 0's q
// projection.
const FP8_LOGPROB_TOL = 1.2;
const QUANTIZED: Array<[string, QuantizeOptions, string, number]> = [
  ['test-qwen3', { layout: 'fp8-block' }, 'f8_e4m3', FP8_LOGPROB_TOL],
  ['test-llama', { layout: 'fp8-compressed-tensors' }, 'f8_e4m3', FP8_LOGPROB_TOL],
  ['test-qwen3-moe', { layout: 'fp8-modelopt' }, 'f8_e4m3', FP8_LOGPROB_TOL],  // attention FP8, experts bf16
  ['test-qwen2', { layout: 'awq' }, 'q4', LOGPROB_TOL.bf16],
  ['test-qwen3', { layout: 'gptq-act-order' }, 'q4', LOGPROB_TOL.bf16],
  ['test-mistral', { layout: 'gptq-8bit' }, 'bf16', LOGPROB_TOL.bf16],
  ['test-mixtral', { layout: 'awq' }, 'q4', LOGPROB_TOL.bf16],  // attention Q4, experts bf16
];

describe.skipIf(!cudaReady).each(QUANTIZED)('CUDA: %s quantized %j', (preset, quantize, weightDtype, logprobTol) => {
  it('greedy continuation and logprobs track the float64 reference of its dequantized weights', async () => {
    const dir = join(root, `${preset}-${quantize.layout}`);
    await makeModel({ preset, out: dir, dtype: 'bf16', seed: 7, quantize });
    const gpu = await loadNativeEngine({ modelDir: dir, backend: 'cuda', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 0 });
    try {
      expect(gpu.info().weightDtype).toBe(weightDtype);
      await compareWithReference(gpu, dir, `cuda ${preset}/${quantize.layout}`, logprobTol, NEAR_TIE_GAP);
    } finally {
      gpu.dispose();
    }
  });
});

// --kv-cache-dtype fp8: K/V as e4m3 codes (scale 1 here), written by qkv_post and read by each
// attention kernel (paged, and the flash prefill / decode pair). The CPU backend with the same
// cache rounds K/V the same way (test/kv-fp8.test.ts checks it against the float64 reference),
// so the GPU must agree with it within the bf16 tolerances, and hold twice its bf16 blocks.
describe.skipIf(!cudaReady).each(['test-llama', 'test-qwen3', 'test-gemma3', 'test-gpt-oss'])('CUDA: %s with an fp8 KV cache', (preset) => {
  it('holds twice the bf16 blocks and agrees with the CPU backend\'s fp8 cache, paged and flash', async () => {
    const dir = join(root, `${preset}-kv-fp8`);
    await makeModel({ preset, out: dir, dtype: 'bf16', seed: 7 });
    const opts = { modelDir: dir, kvCacheBytes: 64 << 20, blockSize: 16 } as const;
    const bf16 = await loadNativeEngine({ ...opts, backend: 'cuda', numThreads: 0 });
    const bf16Blocks = bf16.info().numBlocks;
    expect(bf16.info().kvCacheDtype).toBe('bf16');
    bf16.dispose();
    const cpu = await loadNativeEngine({ ...opts, backend: 'cpu', numThreads: 2, kvCacheDtype: 'fp8' });
    try {
      const vocab = cpu.info().vocabSize;
      const prompt = promptFor(vocab, 29, 3);
      const companions = Array.from({ length: 7 }, (_, i) => promptFor(vocab, 5 + ((i * 11) % 40), i + 20));
      const want = await runNative(cpu, prompt, 24);
      for (const cudaAttention of ['paged', 'flash'] as const) {
        const gpu = await loadNativeEngine({ ...opts, backend: 'cuda', numThreads: 0, kvCacheDtype: 'fp8', cudaAttention });
        try {
          expect(gpu.info().kvCacheDtype).toBe('f8_e4m3');
          expect(gpu.info().numBlocks).toBeGreaterThanOrEqual(2 * bf16Blocks - 2);
          for (const runOpts of [{}, { companions, chunk: 7 }]) {
            const got = await runNative(gpu, prompt, 24, runOpts);
            const diverged = got.tokens.findIndex((t, i) => t !== want.tokens[i]);
            const upTo = diverged < 0 ? got.tokens.length : diverged;
            if (diverged >= 0) {
              const gap = want.topLogprobs[diverged]![0]! - want.topLogprobs[diverged]![1]!;
              expect(gap, `${cudaAttention}: diverged from the CPU's fp8 cache at step ${diverged}`).toBeLessThan(NEAR_TIE_GAP);
            }
            for (let i = 0; i < upTo; i++) expect(Math.abs(got.logprobs[i]! - want.logprobs[i]!)).toBeLessThan(LOGPROB_TOL.bf16);
          }
        } finally {
          gpu.dispose();
        }
      }
    } finally {
      cpu.dispose();
    }
  });
});

/** `model` with every layer's q/k/v/o and MLP projections as --quantization fp8 leaves them. */
function withFp8Weights(model: ReferenceModel): ReferenceModel {
  // Per output row: scale = f32(amax / 448), each weight the e4m3 value nearest f32(w / scale).
  const q = (l: Linear): Linear => {
    const w = new Float64Array(l.w.length);
    for (let r = 0; r < l.out; r++) {
      let amax = 0;
      for (let c = 0; c < l.in; c++) amax = Math.max(amax, Math.abs(l.w[r * l.in + c]!));
      const scale = amax > 0 ? Math.fround(amax / 448) : 1;
      for (let c = 0; c < l.in; c++) w[r * l.in + c] = roundToE4m3(Math.fround(l.w[r * l.in + c]! / scale), 1) * scale;
    }
    return { ...l, w };
  };
  return { ...model, layers: model.layers.map((L) => ({ ...L, q: q(L.q), k: q(L.k), v: q(L.v), o: q(L.o), gate: q(L.gate), up: q(L.up), down: q(L.down) })) };
}

// --quantization fp8 on a bf16 checkpoint: per-channel e4m3 weights run by the FP8 GEMMs, against
// the float64 model of exactly those weights (activation rounding unmodelled, as for the FP8
// checkpoints above).
describe.skipIf(!cudaReady).each(['test-llama', 'test-qwen2'])('CUDA: %s with --quantization fp8', (preset) => {
  it('holds f8_e4m3 projections and tracks the reference of its quantized weights', async () => {
    const dir = join(root, `${preset}-quantize-fp8`);
    await makeModel({ preset, out: dir, dtype: 'bf16', seed: 7 });
    const gpu = await loadNativeEngine({ modelDir: dir, backend: 'cuda', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 0, quantization: 'fp8' });
    try {
      expect(gpu.info().weightDtype).toBe('f8_e4m3');
      await compareWithReference(gpu, dir, `cuda ${preset} --quantization fp8`, FP8_LOGPROB_TOL, NEAR_TIE_GAP, withFp8Weights(loadReferenceModel(dir)));
    } finally {
      gpu.dispose();
    }
  });
});

describe.skipIf(cudaReady)('CUDA unavailable', () => {
  it('says why, and the cuda backend refuses to load with BACKEND_UNAVAILABLE', async () => {
    // Only a host without a device may skip the CUDA tests: with a device the runtime cannot use
    // (a driver older than it needs, a broken install) the reason differs, and this fails.
    if (nativeAddon().cudaCompiled) expect(cudaUnavailableReason()).toMatch(/^no CUDA device found/);
    const dir = join(root, 'no-cuda');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'bf16', seed: 7 });
    await expect(loadNativeEngine({ modelDir: dir, backend: 'cuda', kvCacheBytes: 0, blockSize: 16, numThreads: 0 }))
      .rejects.toMatchObject({ code: 'BACKEND_UNAVAILABLE' });
  });
});

// The device check (scripts/device-check.sh) sets SLUICE_REQUIRE_CUDA=1 on a GPU host: there every
// CUDA case above must run, so an addon built without CUDA or an unusable device fails here.
describe.runIf(process.env.SLUICE_REQUIRE_CUDA === '1')('CUDA required', () => {
  it('is compiled in and usable', () => {
    expect(nativeAddon().cudaCompiled).toBe(true);
    expect(cudaUnavailableReason()).toBeUndefined();
  });
});

// Checkpoints in the published layouts that the model maker did not write (random weights), one
// per family and the variants the CPU's engine-families test runs, on the GPU.
const PUBLISHED: Array<[PublishedFamily, Record<string, unknown>?]> = [
  ['qwen3-moe'],
  ['qwen3-moe', { mlp_only_layers: [], decoder_sparse_step: 2, norm_topk_prob: false }],
  ['mixtral'],
  ['gemma3'],
  ['gemma3-multimodal'],
  ['gemma3', { final_logit_softcapping: 3, layer_types: ['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention'] }],
  ['gpt-oss'],
];

describe.skipIf(!cudaReady).each(PUBLISHED)('CUDA: published %s %j', (family, config) => {
  it('greedy continuation and logprobs track the float64 reference', async () => {
    const dir = join(root, `published-${family}-${config ? 'variant' : 'plain'}`);
    writePublishedCheckpoint(dir, family, { dtype: 'bf16', seed: 3, ...(config ? { config } : {}) });
    const gpu = await loadNativeEngine({ modelDir: dir, backend: 'cuda', kvCacheBytes: 64 << 20, blockSize: 16, numThreads: 0 });
    try {
      await compareWithReference(gpu, dir, `cuda published ${family}`, LOGPROB_TOL.bf16, NEAR_TIE_GAP);
    } finally {
      gpu.dispose();
    }
  });
});

// Gemma 3's window layers keep their KV in window blocks on the GPU too: at four times the window
// a sequence holds the window's blocks (plus the one it writes), and the continuation is the CPU's.
describe.skipIf(!cudaReady)('CUDA: sliding-window KV blocks (gemma3, window 8, blocks of 4)', () => {
  it('holds at most the window\'s blocks at four times the window, and agrees with the CPU backend', async () => {
    const WINDOW = 8, BLOCK = 4;
    const dir = join(root, 'gemma3-window-kv');
    writePublishedCheckpoint(dir, 'gemma3', { dtype: 'bf16', seed: 5 });
    const opts = { modelDir: dir, kvCacheBytes: 8 << 20, blockSize: BLOCK, maxNumSeqs: 4, maxBatchedTokens: 64 };
    const gpu = await loadNativeEngine({ ...opts, backend: 'cuda', numThreads: 0 });
    const cpu = await loadNativeEngine({ ...opts, backend: 'cpu', numThreads: 2 });
    try {
      expect(gpu.info().window).toBe(WINDOW);
      const prompt = promptFor(gpu.info().vocabSize, 5, 4);
      const held: number[] = [];
      let adds: Parameters<NativeEngineHandle['step']>[0]['adds'] = [{ seqId: 7, promptTokens: Int32Array.from(prompt), sampling: GREEDY }];
      const tokens: number[] = [];
      while (prompt.length + tokens.length < 4 * WINDOW + 1) {
        const res = await gpu.step({ seqIds: Uint32Array.of(7), numTokens: Uint32Array.of(3), adds });
        adds = undefined;
        expect(res.errors).toEqual([]);
        tokens.push(...res.tokens);
        held.push(gpu.info().windowBlocksInUse!);
      }
      const bound = Math.ceil(WINDOW / BLOCK) + 1;
      expect(Math.max(...held)).toBeLessThanOrEqual(bound + 1);  // during a 3-token prefill chunk
      expect(held.at(-1)).toBeLessThanOrEqual(bound);
      await gpu.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.of(7) });
      expect(gpu.info().windowBlocksInUse).toBe(0);
      const want = await runNative(cpu, prompt, tokens.length);
      const diverged = tokens.findIndex((t, i) => t !== want.tokens[i]);
      if (diverged >= 0) {
        const gap = want.topLogprobs[diverged]![0]! - want.topLogprobs[diverged]![1]!;
        expect(gap, `diverged from the CPU backend at step ${diverged}`).toBeLessThan(NEAR_TIE_GAP);
      }
    } finally {
      gpu.dispose();
      cpu.dispose();
    }
  });
});

// Qwen2.5-VL (issue 34): images encoded by the CUDA vision tower (cuda/vision_tower.h), their rows
// scattered over the embeddings on the device, M-RoPE positions through the rope table, prefill in
// chunks and batched; against the float64 reference teacher-forced on the CUDA engine's greedy
// output, at the bf16 tolerances above.
describe.skipIf(!cudaReady)('CUDA: test-qwen2.5-vl with images', () => {
  it('tracks the float64 reference with images in chunked prefill, alone and batched', async () => {
    const dir = join(root, 'qwen2.5-vl');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir, dtype: 'bf16' });
    const ref = loadQwen25VlReference(dir);
    const engine = await Engine.load({ model: dir, backend: 'cuda', maxBatchedTokens: 32, maxNumSeqs: 8, gpuMemoryUtilization: 0.2 });
    try {
      expect(engine.vision!.device).toBe('cuda');
      const pattern = (w: number, h: number, seed: number) => {
        const rgb = new Uint8Array(w * h * 3);
        for (let i = 0; i < rgb.length; i++) rgb[i] = (i * 7 + seed * 31 + Math.floor(i / (w * 3)) * 3) & 255;
        return { rgb, width: w, height: h };
      };
      const images = await Promise.all([pattern(90, 60, 1), pattern(224, 224, 2), pattern(60, 150, 3)].map((im) => prepareForReference(engine.vision!, im)));
      const results = await Promise.all(images.map((im) => engine.generate({
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Look:' }, { type: 'image' }, { type: 'text', text: 'What is it?' }] }],
        images: [im], maxTokens: 16, temperature: 0, logprobs: 0,
      })));
      results.forEach((r, k) => {
        const session = new Qwen25VlSession(ref);
        let logits = session.prefill(r.promptTokenIds, [referenceInput(images[k]!)]).at(-1)!;
        for (const [i, token] of r.tokenIds.entries()) {
          const max = Math.max(...logits);
          const lse = max + Math.log(logits.reduce((a, v) => a + Math.exp(v - max), 0));
          const sorted = [...logits].sort((a, b) => b - a);
          expect(Math.abs(r.logprobs![i]!.logprob - (logits[token]! - lse)), `image ${k} position ${i}`).toBeLessThan(LOGPROB_TOL.bf16);
          if (sorted[0]! - sorted[1]! < NEAR_TIE_GAP) break;  // a near tie: the continuations may part here
          expect(logits[token], `image ${k} position ${i}`).toBe(max);
          logits = session.step(token);
        }
      });
    } finally {
      await engine.dispose();
    }
  });
});

// Gemma 3 (issue 34): the SigLIP tower and projector on the device, attention bidirectional within
// each image in the decoder; against the float64 reference teacher-forced on the engine's output.
describe.skipIf(!cudaReady)('CUDA: test-gemma3-vl with images', () => {
  it('tracks the float64 reference with images, alone and batched', async () => {
    const dir = join(root, 'gemma3-vl');
    await makeModel({ preset: 'test-gemma3-vl', out: dir, dtype: 'bf16' });
    const ref = loadGemma3VlReference(dir);
    const engine = await Engine.load({ model: dir, backend: 'cuda', maxBatchedTokens: 64, maxNumSeqs: 4, gpuMemoryUtilization: 0.2 });
    try {
      expect(engine.vision!.device).toBe('cuda');
      const images = await Promise.all([patternImage(90, 60, 1), patternImage(56, 56, 2), patternImage(300, 120, 3)]
        .map((im) => prepareForReference(engine.vision!, im)));
      const results = await Promise.all(images.map((im) => engine.generate({
        messages: [{ role: 'user', content: [{ type: 'text', text: 'See:' }, { type: 'image' }, { type: 'text', text: 'Now?' }] }],
        images: [im], maxTokens: 12, temperature: 0, logprobs: 0,
      })));
      results.forEach((r, k) => {
        const session = new Gemma3VlSession(ref);
        const prefill = session.prefill(r.promptTokenIds, [referenceInput(images[k]!)]);
        expectTeacherForced(prefill.at(-1)!, (token) => session.step(token), r, { nearTie: NEAR_TIE_GAP, logprobTol: LOGPROB_TOL.bf16 });
      });
    } finally {
      await engine.dispose();
    }
  });
});

// Speculative decoding on CUDA (issue 35, phase 4): prompt lookup's drafts verified by the block
// sampler, greedy continuations the same as without them until the first near tie (a verification
// chunk runs the prefill kernels, a plain decode the decode ones), and structured output too.
describe.skipIf(!cudaReady)('CUDA: speculative decoding with prompt lookup', () => {
  it('verifies drafts and keeps greedy continuations until a near tie', async () => {
    const dir = join(root, 'spec-llama');
    await makeModel({ preset: 'test-llama', out: dir, dtype: 'bf16' });
    const base = { model: dir, backend: 'cuda' as const, maxNumSeqs: 8, gpuMemoryUtilization: 0.2 };
    const plain = await Engine.load(base);
    const spec = await Engine.load({ ...base, speculative: { method: 'ngram', numSpeculativeTokens: 4 } });
    try {
      expect(spec.info.backend).toBe('cuda');
      for (const prompt of ['a b c d a b c d a b c', 'one two one two one two one']) {
        const ask = (e: Engine) => e.generate({ prompt, maxTokens: 40, temperature: 0, logprobs: 2 });
        const [a, b] = [await ask(spec), await ask(plain)];
        for (let i = 0; i < b.tokenIds.length; i++) {
          const top = b.logprobs![i]!.top;
          if (top.length >= 2 && top[0]!.logprob - top[1]!.logprob < 0.1) break;  // a near tie: the runs may part
          expect(a.tokenIds[i]).toBe(b.tokenIds[i]);
        }
      }
      expect(spec.schedulerStats().speculation!.numDraftTokens).toBeGreaterThan(0);
    } finally {
      await spec.dispose();
      await plain.dispose();
    }
  });
});

describe.skipIf(!cudaReady).each(['test-llama', 'test-qwen2', 'test-gemma3'])('CUDA: %s with LoRA adapters', (preset) => {
  it('agrees with the CPU backend per adapter, batched with the base model, and under a memory budget', async () => {
    const dir = join(root, `lora-${preset}`);
    await makeModel({ preset, out: dir, dtype: 'bf16' });
    const adapters = { all: join(root, `lora-${preset}-all`), attn: join(root, `lora-${preset}-attn`) };
    await writeLoraAdapter(dir, adapters.all, { rank: 8, seed: 1 });
    await writeLoraAdapter(dir, adapters.attn, { rank: 16, alpha: 8, rslora: true, dtype: 'BF16', modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj'], seed: 2 });
    const cuda = await Engine.load({ model: dir, backend: 'cuda', maxNumSeqs: 16, gpuMemoryUtilization: 0.2, loraAdapters: adapters });
    const cpu = await Engine.load({ model: dir, backend: 'cpu', threads: 4, kvCacheBytes: 32 << 20, loraAdapters: adapters });
    try {
      expect(cuda.info.backend).toBe('cuda');
      const jobs = ['the cat sat on the mat', 'one two three four five'].flatMap((p) => [[p, 'all'], [p, 'attn'], [p, undefined]] as const);
      const ask = (e: Engine, prompt: string, adapter: string | undefined) =>
        e.generate({ prompt, maxTokens: 16, temperature: 0, logprobs: 2, ...(adapter !== undefined && { adapter }) });
      const want = await Promise.all(jobs.map(([p, a]) => ask(cpu, p, a)));
      const alone: Awaited<ReturnType<typeof ask>>[] = [];
      for (const [p, a] of jobs) alone.push(await ask(cuda, p, a));
      const together = await Promise.all(jobs.map(([p, a]) => ask(cuda, p, a)));
      let compared = 0;
      for (const got of [alone, together]) {
        got.forEach((r, j) => {
          for (let i = 0; i < want[j]!.tokenIds.length; i++) {
            const top = want[j]!.logprobs![i]!.top;
            if (top.length >= 2 && top[0]!.logprob - top[1]!.logprob < NEAR_TIE_GAP) break;
            expect(r.tokenIds[i]).toBe(want[j]!.tokenIds[i]);
            expect(Math.abs(r.logprobs![i]!.logprob - want[j]!.logprobs![i]!.logprob)).toBeLessThan(LOGPROB_TOL.bf16);
            compared++;
          }
        });
      }
      expect(compared).toBeGreaterThan(jobs.length * 2 * 2);
      // The adapters change the output on the GPU too.
      expect(alone[0]!.tokenIds).not.toEqual(alone[2]!.tokenIds);
    } finally {
      await cuda.dispose();
      await cpu.dispose();
    }
    // Under a budget for one adapter (serial steps): each request loads its adapter on demand, the
    // answers those of the engine with both resident.
    const budgeted = await Engine.load({ model: dir, backend: 'cuda', maxNumSeqs: 16, gpuMemoryUtilization: 0.2, loraAdapters: adapters,
      loraMemoryBytes: Math.max(...(await Promise.all(Object.values(adapters).map((d) => declaredAdapterBytes(d))))) });
    try {
      const a = await budgeted.generate({ prompt: 'the cat sat on the mat', maxTokens: 16, temperature: 0, adapter: 'all' });
      const b = await budgeted.generate({ prompt: 'the cat sat on the mat', maxTokens: 16, temperature: 0, adapter: 'attn' });
      const a2 = await budgeted.generate({ prompt: 'the cat sat on the mat', maxTokens: 16, temperature: 0, adapter: 'all' });
      expect(a2.tokenIds).toEqual(a.tokenIds);
      expect(b.tokenIds).not.toEqual(a.tokenIds);
      expect(budgeted.adapterStats()).toMatchObject({ resident: 1 });
      expect(budgeted.adapterStats().evictions).toBeGreaterThanOrEqual(2);
    } finally {
      await budgeted.dispose();
    }
  });
});
