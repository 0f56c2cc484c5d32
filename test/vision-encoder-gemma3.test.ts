// The native Gemma 3 vision tower (native/src/vision/siglip_encoder.cpp: SigLIP plus the
// multimodal projector) against the float64 reference's siglipEncode on the tiny model: every
// output value for a processed image and a synthetic one, the token count and width, the same
// output alone, twice and concurrently, and its refusals (values or a grid that are not one image).

import { existsSync, readFileSync, rmSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { patternRgb, relMaxDiff } from './helpers/vision.js';
import { makeModel } from '../models/make-model.js';
import { type NativeVisionEncoder, nativeAddon } from '../src/native/native.js';
import { GEMMA3_DEFAULTS, type Gemma3PreprocessorConfig, gemma3Pixels, gemma3PreprocessorConfig, gemma3Tables } from '../src/vision/gemma3-preprocess.js';
import { type Gemma3VlReference, loadGemma3VlReference, siglipEncode } from './reference/gemma3-vl.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-vision-encoder-gemma3-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Pixel values [3, S, S] in [-1, 1] without the processor: a smooth field plus a checkerboard. */
function syntheticPixels(side: number): Float32Array {
  const px = new Float32Array(3 * side * side);
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < side; y++) {
      for (let x = 0; x < side; x++) {
        px[(c * side + y) * side + x] = 0.6 * Math.sin((x * (c + 1) + 2 * y) / 7) + (((x >> 2) + (y >> 2) + c) & 1 ? 0.3 : -0.3);
      }
    }
  }
  return px;
}

describe.each([
  ['f32', 1e-4],
  ['bf16', 1e-3],
  ['f16', 1e-3],
] as const)('the native Gemma 3 vision encoder, %s weights', (dtype, tolerance) => {
  const dir = join(root, `vl-${dtype}`);
  let ref: Gemma3VlReference;
  let enc: NativeVisionEncoder;
  let images: { name: string; pixels: Float32Array }[];
  let side: number;
  let grid: [number, number, number];
  let pre: Gemma3PreprocessorConfig;

  beforeAll(async () => {
    await makeModel({ preset: 'test-gemma3-vl', out: dir, dtype });
    ref = loadGemma3VlReference(dir);
    enc = await nativeAddon().loadVisionEncoder(dir, 2);
    const vc = ref.visionConfig;
    side = vc.imageSize;
    grid = [1, side / vc.patchSize, side / vc.patchSize];
    const preFile = join(dir, 'preprocessor_config.json');
    pre = existsSync(preFile)
      ? gemma3PreprocessorConfig(JSON.parse(readFileSync(preFile, 'utf8')) as Record<string, unknown>)
      : { ...GEMMA3_DEFAULTS, height: side, width: side };
    images = [
      { name: 'processed 90x60', pixels: gemma3Pixels(patternRgb(90, 60, 1), 90, 60, pre) },
      { name: 'synthetic', pixels: syntheticPixels(side) },
    ];
  }, 60_000);
  afterAll(() => enc?.dispose());

  it('matches siglipEncode on every value', async () => {
    expect(enc.outHidden).toBe(ref.text.config.hiddenSize);
    expect(grid).toEqual([1, 4, 4]);
    for (const img of images) {
      expect(img.pixels.length).toBe(3 * side * side);
      const t0 = performance.now();
      const out = await enc.encode(img.pixels, grid);
      const ms = performance.now() - t0;
      expect(out.length).toBe(ref.mmTokensPerImage * enc.outHidden);
      const expected = siglipEncode(ref, img.pixels);
      const { rel, scale } = relMaxDiff(out, expected);
      console.log(`gemma3 vision encoder ${dtype} ${img.name}: max |diff| ${(rel * scale).toExponential(2)} = ${rel.toExponential(2)} of max |ref| ${scale.toFixed(3)}, encode ${ms.toFixed(1)} ms`);
      expect(rel).toBeLessThan(tolerance);
    }
  });

  it('gives the same output for an image encoded alone, twice and concurrently', async () => {
    const [p, q] = [images[0]!.pixels, images[1]!.pixels];
    const [a, b, c] = await Promise.all([p, p, q].map((x) => enc.encode(x, grid)));
    expect(b).toEqual(a);
    expect(await enc.encode(p, grid)).toEqual(a);
    expect(c).not.toEqual(a);
    expect(c!.length).toBe(ref.mmTokensPerImage * enc.outHidden);
  });

  it('encodes native images (bilinear resize in C++) as their TypeScript pixel values, in one pass or one at a time', async () => {
    const sizes = [[90, 60], [56, 56], [300, 120]] as const;
    const natives = await Promise.all(sizes.map(([w, h], k) => nativeAddon().resizeImage(patternRgb(w, h, k), w, h, side, side, 'bilinear')));
    const alone = await Promise.all(sizes.map(([w, h], k) => enc.encode(gemma3Pixels(patternRgb(w, h, k), w, h, pre), grid)));
    expect(await enc.encodeImages(natives, gemma3Tables(pre))).toEqual(alone);
    expect(await enc.encodeImage(natives[1]!, gemma3Tables(pre))).toEqual(alone[1]);
  });

  it('rejects values or a grid that are not one whole image with INVALID_ARGUMENT', async () => {
    const p = images[0]!.pixels;
    await expect(enc.encode(p.subarray(1), grid)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /9407 pixel values, the model takes 9408 \(3 x 56 x 56\)/ });
    await expect(enc.encode(p, [1, 4, 2])).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /grid \(1, 4, 2\) is not one image of \(1, 4, 4\) patches/ });
    await expect(enc.encode(p, [2, 4, 4])).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(() => enc.encode(p, [1, 4] as never)).toThrow(/grid must be \[t, h, w\]/);
    expect(() => enc.encode(new Float64Array(4) as never, grid)).toThrow(/Float32Array/);
  });
});

describe('loading the Gemma 3 vision encoder', () => {
  it('picks the encoder by architecture: Qwen2.5-VL keeps its own, others are refused', async () => {
    const dir = join(root, 'llama');
    await makeModel({ preset: 'test-llama', out: dir });
    await expect(nativeAddon().loadVisionEncoder(dir, 1))
      .rejects.toMatchObject({ code: 'UNSUPPORTED_MODEL', message: /supports Qwen2_5_VLForConditionalGeneration and Gemma3ForConditionalGeneration/ });
  });

  it('disposed: encode throws DISPOSED', async () => {
    const dir = join(root, 'vl-dispose');
    await makeModel({ preset: 'test-gemma3-vl', out: dir });
    const enc = await nativeAddon().loadVisionEncoder(dir, 1);
    enc.dispose();
    enc.dispose();
    expect(() => enc.encode(new Float32Array(3 * 56 * 56), [1, 4, 4])).toThrow(/disposed/);
  });
});
