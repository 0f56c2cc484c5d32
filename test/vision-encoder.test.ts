// The native Qwen2.5-VL vision encoder (native/src/vision/qwen2_vl_encoder.cpp, issue 34) against
// the float64 reference's visionEncode on the tiny model: every output value of images whose
// windows do and do not divide the merged grid evenly, the token count and width, and its refusals
// (rows that do not fit the grid, a model without a vision tower).

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { patternRgb, relMaxDiff } from './helpers/vision.js';
import { makeModel } from '../models/make-model.js';
import { type NativeVisionEncoder, cudaUnavailableReason, nativeAddon } from '../src/native/native.js';
import { VisionModel } from '../src/vision/vision-model.js';
import { type Qwen2VlPreprocessorConfig, type VisionPatches, qwen2VlPatches, qwen2VlPatchesOfResized, qwen2VlPreprocessorConfig, qwen2VlTables } from '../src/vision/qwen2-vl-preprocess.js';
import { type Qwen25VlReference, loadQwen25VlReference, visionEncode, visionWindowIndex } from './reference/qwen2-5-vl.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-vision-encoder-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

// [width, height]: 90x60 resizes to a 4x6 patch grid (2x3 merged tokens: windows of 2x2 leave a
// 2x1 column), 60x150 to 10x4 (5x2: a 1x2 row left), 112x112 to 8x8 (4x4: windows divide evenly).
const IMAGES: [number, number][] = [[90, 60], [60, 150], [112, 112]];

// Tolerances on relMaxDiff: f32 against f64 through 4 blocks (the reference reads the same rounded
// weights) measures about 5e-7 with f32 or f16 weights and 1e-5 with bf16 ones (bf16 products on
// AVX512-BF16 hardware carry activations in ~16 bits); the bounds leave a wide margin.
describe.each([
  ['f32', 1e-4],
  ['bf16', 1e-3],
  ['f16', 1e-3],
] as const)('the native Qwen2.5-VL vision encoder, %s weights', (dtype, tolerance) => {
  const dir = join(root, `vl-${dtype}`);
  let ref: Qwen25VlReference;
  let enc: NativeVisionEncoder;
  let patches: VisionPatches[];
  let pre: Qwen2VlPreprocessorConfig;

  beforeAll(async () => {
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir, dtype });
    ref = loadQwen25VlReference(dir);
    enc = await nativeAddon().loadVisionEncoder(dir, 2);
    pre = qwen2VlPreprocessorConfig(JSON.parse(readFileSync(join(dir, 'preprocessor_config.json'), 'utf8')) as Record<string, unknown>);
    patches = IMAGES.map(([w, h], i) => qwen2VlPatches(patternRgb(w, h, i), w, h, pre));
  }, 60_000);
  afterAll(() => enc?.dispose());

  it('matches visionEncode on every value, windows dividing the grid evenly or not', async () => {
    const vc = ref.visionConfig;
    expect(enc.outHidden).toBe(vc.outHiddenSize);
    expect(patches.map((p) => p.grid)).toEqual([[1, 4, 6], [1, 10, 4], [1, 8, 8]]);
    // Uneven, uneven, even: the window counts the grids give.
    expect(patches.map((p) => visionWindowIndex(p.grid, vc).cuWindowSeqlens.length - 1)).toEqual([2, 3, 4]);
    for (const p of patches) {
      const t0 = performance.now();
      const out = await enc.encode(p.pixelValues, p.grid);
      const ms = performance.now() - t0;
      const [t, h, w] = p.grid;
      expect(out.length).toBe(((t * h * w) / 4) * vc.outHiddenSize);
      expect(out.length / vc.outHiddenSize).toBe(p.numTokens);
      const expected = visionEncode(ref.vision, vc, p.pixelValues, p.grid);
      const { rel, scale } = relMaxDiff(out, expected);
      console.log(`vision encoder ${dtype} grid ${p.grid.join('x')}: max |diff| ${(rel * scale).toExponential(2)} = ${rel.toExponential(2)} of max |ref| ${scale.toFixed(3)}, encode ${ms.toFixed(1)} ms`);
      expect(rel).toBeLessThan(tolerance);
    }
  });

  it('gives the same output for an image encoded alone, twice and concurrently', async () => {
    const p = patches[1]!;
    const [a, b, c] = await Promise.all([p, p, patches[0]!].map((q) => enc.encode(q.pixelValues, q.grid)));
    expect(b).toEqual(a);
    expect(await enc.encode(p.pixelValues, p.grid)).toEqual(a);
    expect(c!.length).toBe(patches[0]!.numTokens * enc.outHidden);
  });

  it('encodes a native image as the patch rows TypeScript lays out of it, value for value', async () => {
    for (const [k, [w, h]] of IMAGES.entries()) {
      const p = patches[k]!;
      const [, gh, gw] = p.grid;
      const image = await nativeAddon().resizeImage(patternRgb(w, h, k), w, h, gw * 14, gh * 14, 'bicubic');
      const rows = qwen2VlPatchesOfResized(image.pixels(), image.width, image.height, pre);
      expect(rows.pixelValues).toEqual(p.pixelValues);
      expect(await enc.encodeImage(image, qwen2VlTables(pre))).toEqual(await enc.encode(p.pixelValues, p.grid));
    }
    // Every image in one pass: the same values as one at a time.
    const all = await Promise.all(IMAGES.map(([w, h], k) =>
      nativeAddon().resizeImage(patternRgb(w, h, k), w, h, patches[k]!.grid[2] * 14, patches[k]!.grid[1] * 14, 'bicubic')));
    const batched = await enc.encodeImages([...all, all[0]!], qwen2VlTables(pre));
    expect(batched).toEqual(await Promise.all([...all, all[0]!].map((im) => enc.encodeImage(im, qwen2VlTables(pre)))));
    expect(() => enc.encodeImages([], qwen2VlTables(pre))).toThrow(/1 to 256 images/);
    expect(() => enc.encodeImages([all[0]!, {} as never], qwen2VlTables(pre))).toThrow(/each image must be an image from resizeImage/);
    const image = await nativeAddon().resizeImage(patternRgb(30, 30, 0), 30, 30, 30, 28, 'bicubic');
    expect(() => enc.encodeImage(image, qwen2VlTables(pre))).toThrow(/multiples of patch \* merge \(28\)/);
    expect(() => enc.encodeImage({ width: 28, height: 28 } as never, qwen2VlTables(pre))).toThrow(/image from resizeImage/);
    expect(() => enc.encodeImage(enc as never, qwen2VlTables(pre))).toThrow(/image from resizeImage/);
    expect(() => enc.encodeImage(image, new Float32Array(3))).toThrow(/768 values/);
  });

  it('rejects rows that do not fit the grid with INVALID_ARGUMENT', async () => {
    const p = patches[0]!;
    const [t, h, w] = p.grid;
    // Grid not matching the rows (values divide into whole rows of another width).
    await expect(enc.encode(p.pixelValues, [t, h, w + 2])).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /patch rows hold|rows for grid/ });
    // Rows of the wrong width (patch_dim 1176 expected).
    await expect(enc.encode(p.pixelValues.subarray(0, t * h * w * 588), p.grid))
      .rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /hold 588 values, the model takes 1176/ });
    // A length that is no whole number of rows.
    await expect(enc.encode(p.pixelValues.subarray(1), p.grid)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    // A grid that is not a multiple of the merge size.
    await expect(enc.encode(p.pixelValues.subarray(0, 1 * 3 * 8 * 1176), [1, 3, 8]))
      .rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /not a multiple of spatial_merge_size 2/ });
    expect(() => enc.encode(p.pixelValues, [1, 2] as never)).toThrow(/grid must be \[t, h, w\]/);
    expect(() => enc.encode(new Float64Array(4) as never, p.grid)).toThrow(/Float32Array/);
  });
});

describe('loading the vision encoder', () => {
  it('rejects a model without a vision tower (test-llama) with UNSUPPORTED_MODEL', async () => {
    const dir = join(root, 'llama');
    await makeModel({ preset: 'test-llama', out: dir });
    await expect(nativeAddon().loadVisionEncoder(dir, 1))
      .rejects.toMatchObject({ code: 'UNSUPPORTED_MODEL', message: /is not a Qwen2\.5-VL model \(architecture LlamaForCausalLM, no vision_config/ });
  });

  it('rejects a missing directory with MODEL_FILE_MISSING', async () => {
    await expect(nativeAddon().loadVisionEncoder(join(root, 'absent'), 1)).rejects.toMatchObject({ code: 'MODEL_FILE_MISSING' });
  });

  it('runs the tower on a CUDA device when asked, as the CPU tower does (a host without one: BACKEND_UNAVAILABLE)', async () => {
    const dir = join(root, 'vl-device');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir, dtype: 'bf16' });
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    const cpu = (await VisionModel.load(dir, config, 1, 'cpu'))!;
    try {
      expect(cpu.device).toBe('cpu');
      if (!(nativeAddon().cudaCompiled && cudaUnavailableReason() === undefined)) {
        await expect(nativeAddon().loadVisionEncoder(dir, 1, 0)).rejects.toMatchObject({ code: 'BACKEND_UNAVAILABLE', message: /CUDA/ });
        return;
      }
      const gpu = (await VisionModel.load(dir, config, 1, 'cuda'))!;
      try {
        expect(gpu.device).toBe('cuda');
        const images = await Promise.all(IMAGES.map(([w, h], i) => cpu.prepare({ rgb: patternRgb(w, h, i), width: w, height: h })));
        const [want, got] = await Promise.all([cpu.encodeMany(images), gpu.encodeMany(images)]);
        // bf16 activations on the device (native/tests/cuda/test_cuda_vision_tower.cpp's bound).
        got.forEach((g, i) => expect(relMaxDiff(g, Float64Array.from(want[i]!)).rel, `image ${i}`).toBeLessThan(0.03));
      } finally {
        gpu.dispose();
      }
    } finally {
      cpu.dispose();
    }
  });

  it('disposed: encode throws DISPOSED', async () => {
    const dir = join(root, 'vl-dispose');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir });
    const enc = await nativeAddon().loadVisionEncoder(dir, 1);
    enc.dispose();
    expect(() => enc.encode(new Float32Array(4 * 1176), [1, 2, 2])).toThrow(/disposed/);
  });
});
