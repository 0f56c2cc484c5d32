// Image preprocessing for Qwen2-VL-family models against Pillow 9.4 and a numpy transcription of
// the published processor (fixtures written by scripts/vision-golden.py): the bicubic resize byte
// for byte, smart_resize's sizes, and the patch rows' float32 values and order.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { createHash } from 'node:crypto';
import { resizeBicubicRgb, resizeBilinearRgb } from '../src/vision/pil-resize.js';
import { QWEN2_VL_DEFAULTS, qwen2VlPatches, qwen2VlPatchesAsync, qwen2VlPreprocessorConfig, smartResize } from '../src/vision/qwen2-vl-preprocess.js';
import { nativeAddon } from '../src/native/native.js';

interface Golden {
  pillow: string;
  resizes: Array<{ width: number; height: number; outWidth: number; outHeight: number; input: string; output: string }>;
  smart_resize: Array<{ height: number; width: number; minPixels: number; maxPixels: number; resized: [number, number] }>;
  qwen2_vl: Array<{ width: number; height: number; minPixels: number; maxPixels: number; input: string; resized: [number, number];
    grid: [number, number, number]; patchDim: number; rows: number[]; pixelValues: string }>;
  normalized: string[];
}
const golden = JSON.parse(readFileSync(join(import.meta.dirname, 'fixtures', 'vision', 'qwen2-vl-golden.json'), 'utf8')) as Golden;
const bytes = (b64: string) => new Uint8Array(Buffer.from(b64, 'base64'));
const floats = (b64: string) => {
  const b = Buffer.from(b64, 'base64');
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
};

describe("Pillow's bicubic resize", () => {
  it.each(golden.resizes.map((r) => [`${r.width}x${r.height} -> ${r.outWidth}x${r.outHeight}`, r] as const))('%s: the same bytes', (_, r) => {
    const got = resizeBicubicRgb(bytes(r.input), r.width, r.height, r.outWidth, r.outHeight);
    const want = bytes(r.output);
    expect(got.length).toBe(want.length);
    let differing = 0;
    for (let i = 0; i < want.length; i++) differing += got[i] !== want[i] ? 1 : 0;
    expect(differing, `bytes differing from Pillow ${golden.pillow}`).toBe(0);
  });

  it('returns a copy at the same size and refuses a buffer of the wrong length', () => {
    const img = new Uint8Array([1, 2, 3, 4, 5, 6]);
    const same = resizeBicubicRgb(img, 2, 1, 2, 1);
    expect(Array.from(same)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(same).not.toBe(img);
    expect(() => resizeBicubicRgb(img, 3, 1, 2, 1)).toThrow(/6 bytes for a 3x1 RGB image/);
  });
});

describe('smart_resize', () => {
  it.each(golden.smart_resize.map((s) => [`${s.height}x${s.width} in [${s.minPixels}, ${s.maxPixels}]`, s] as const))('%s', (_, s) => {
    expect(smartResize(s.height, s.width, 28, s.minPixels, s.maxPixels)).toEqual(s.resized);
  });

  it('rounds halves to even as Python does, and refuses aspect ratios over 200', () => {
    // 42 / 28 = 1.5 -> 2 (even), 70 / 28 = 2.5 -> 2 (even): 56 either way.
    expect(smartResize(42, 70, 28, 1, 1e9)).toEqual([56, 56]);
    expect(smartResize(98, 98, 28, 1, 1e9)).toEqual([112, 112]);  // 3.5 -> 4
    expect(() => smartResize(10, 2001, 28, 3136, 1e9)).toThrow(/aspect ratio 2001x10 is over 200:1/);
  });
});

describe('Qwen2-VL patch rows', () => {
  it("normalises each 8-bit value to numpy's float32", () => {
    const p = qwen2VlPatches(new Uint8Array(56 * 56 * 3).map((_, i) => i % 256), 56, 56, QWEN2_VL_DEFAULTS);
    // Every value of channel c is table_c[byte]; checked through the rows below, and here directly:
    const table = golden.normalized.map(floats);
    const values = new Set(Array.from(p.pixelValues));
    for (const t of table) for (const v of t) values.delete(v);
    expect(values.size, 'values outside the normalisation tables').toBe(0);
  });

  it.each(golden.qwen2_vl.map((q) => [`${q.width}x${q.height}, max ${q.maxPixels}`, q] as const))('%s: size, grid and rows as the processor makes them', (_, q) => {
    const config = { ...QWEN2_VL_DEFAULTS, minPixels: q.minPixels, maxPixels: q.maxPixels };
    const p = qwen2VlPatches(bytes(q.input), q.width, q.height, config);
    expect([p.resized.height, p.resized.width]).toEqual(q.resized);
    expect(p.grid).toEqual(q.grid);
    expect(p.patchDim).toBe(q.patchDim);
    expect(p.pixelValues.length).toBe(q.grid[1] * q.grid[2] * q.patchDim);
    expect(p.numTokens).toBe((q.grid[1] * q.grid[2]) / 4);
    const want = floats(q.pixelValues);
    q.rows.forEach((row, i) => {
      const got = p.pixelValues.subarray(row * q.patchDim, (row + 1) * q.patchDim);
      const expected = want.subarray(i * q.patchDim, (i + 1) * q.patchDim);
      let differing = 0;
      for (let k = 0; k < q.patchDim; k++) differing += got[k] !== expected[k] ? 1 : 0;
      expect(differing, `patch row ${row}`).toBe(0);
    });
  });

  it('a smaller pixel budget (detail: low) shrinks the grid, never below min_pixels', () => {
    const rgb = new Uint8Array(640 * 480 * 3);
    const full = qwen2VlPatches(rgb, 640, 480, QWEN2_VL_DEFAULTS);
    const low = qwen2VlPatches(rgb, 640, 480, QWEN2_VL_DEFAULTS, { maxPixels: 256 * 28 * 28 });
    expect(full.resized).toEqual({ width: 644, height: 476 });
    expect(low.numTokens).toBeLessThanOrEqual(256);
    expect(low.numTokens).toBeLessThan(full.numTokens);
    const tiny = qwen2VlPatches(rgb, 640, 480, QWEN2_VL_DEFAULTS, { maxPixels: 1 });
    expect(tiny.resized.width * tiny.resized.height).toBeGreaterThanOrEqual(QWEN2_VL_DEFAULTS.minPixels * 0.5);
  });
});

describe('the native path (resize and layout in C++, on the libuv pool)', () => {
  it.each(golden.qwen2_vl.map((q) => [`${q.width}x${q.height}`, q] as const))('%s: the golden rows', async (_, q) => {
    const config = { ...QWEN2_VL_DEFAULTS, minPixels: q.minPixels, maxPixels: q.maxPixels };
    const p = await qwen2VlPatchesAsync(bytes(q.input), q.width, q.height, config);
    const want = floats(q.pixelValues);
    q.rows.forEach((row, i) => {
      expect(Array.from(p.pixelValues.subarray(row * q.patchDim, (row + 1) * q.patchDim))).toEqual(Array.from(want.subarray(i * q.patchDim, (i + 1) * q.patchDim)));
    });
  });

  it('gives the TypeScript reference\'s values at every pixel, up- and downscaling, any budget', async () => {
    let seed = 99;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (const [w, h, maxPixels] of [[45, 30, undefined], [640, 480, undefined], [97, 300, 40000], [1200, 50, 200000], [300, 300, 3136]] as const) {
      const rgb = new Uint8Array(w * h * 3);
      for (let i = 0; i < rgb.length; i++) rgb[i] = (rand() * 256) | 0;
      const ref = qwen2VlPatches(rgb, w, h, QWEN2_VL_DEFAULTS, { maxPixels });
      const got = await qwen2VlPatchesAsync(rgb, w, h, QWEN2_VL_DEFAULTS, { maxPixels });
      expect(got.grid).toEqual(ref.grid);
      expect(got.pixelValues.length).toBe(ref.pixelValues.length);
      let differing = 0;
      for (let i = 0; i < ref.pixelValues.length; i++) differing += got.pixelValues[i] !== ref.pixelValues[i] ? 1 : 0;
      expect(differing, `${w}x${h}`).toBe(0);
    }
  });

  it('refuses arguments the native side cannot hold', async () => {
    const tables = new Float32Array(768);
    const addon = nativeAddon();
    expect(() => addon.qwen2VlPatches(new Uint8Array(11), 2, 2, 28, 28, 14, 2, 2, tables)).toThrow(/width \* height \* 3 bytes/);
    expect(() => addon.qwen2VlPatches(new Uint8Array(12), 2, 2, 30, 28, 14, 2, 2, tables)).toThrow(/multiples of patch \* merge/);
    expect(() => addon.qwen2VlPatches(new Uint8Array(12), 2, 2, 28, 28, 14, 2, 2, new Float32Array(10))).toThrow(/768 values/);
    expect(() => addon.qwen2VlPatches(new Uint8Array(12), 2.5, 2, 28, 28, 14, 2, 2, tables)).toThrow(/width must be an integer/);
  });
});

describe('native images (resizeImage: the pixels kept in C++, hashed there)', () => {
  /** SHA-256 of width and height (u32 little-endian) and the pixels, by node:crypto. */
  const hashOf = (rgb: Uint8Array, width: number, height: number) => {
    const dims = Buffer.alloc(8);
    dims.writeUInt32LE(width, 0);
    dims.writeUInt32LE(height, 4);
    return createHash('sha256').update(dims).update(rgb).digest('hex');
  };

  it("holds Pillow's resize byte for byte, bicubic and bilinear, with node:crypto's SHA-256 of it", async () => {
    let seed = 5;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (const [w, h, ow, oh] of [[45, 30, 56, 28], [640, 480, 644, 476], [97, 300, 28, 84], [300, 300, 300, 300], [1, 1, 3, 2]] as const) {
      const rgb = new Uint8Array(w * h * 3);
      for (let i = 0; i < rgb.length; i++) rgb[i] = (rand() * 256) | 0;
      for (const filter of ['bicubic', 'bilinear'] as const) {
        const image = await nativeAddon().resizeImage(rgb, w, h, ow, oh, filter);
        const want = (filter === 'bicubic' ? resizeBicubicRgb : resizeBilinearRgb)(rgb, w, h, ow, oh);
        expect([image.width, image.height, image.byteLength]).toEqual([ow, oh, ow * oh * 3]);
        expect(Buffer.from(image.pixels()).equals(Buffer.from(want)), `${w}x${h} -> ${ow}x${oh} ${filter}`).toBe(true);
        expect(Buffer.from(image.hash).toString('hex')).toBe(hashOf(want, ow, oh));
      }
    }
    // Same bytes, other shape: another hash.
    const a = await nativeAddon().resizeImage(new Uint8Array(12), 2, 2, 4, 1, 'bilinear');
    const b = await nativeAddon().resizeImage(new Uint8Array(12), 2, 2, 1, 4, 'bilinear');
    expect(Buffer.from(a.pixels()).equals(Buffer.from(b.pixels()))).toBe(true);
    expect(Buffer.from(a.hash).equals(Buffer.from(b.hash))).toBe(false);
  });

  it('refuses arguments that do not describe the image', () => {
    const addon = nativeAddon();
    expect(() => addon.resizeImage(new Uint8Array(11), 2, 2, 4, 4, 'bicubic')).toThrow(/width \* height \* 3 bytes/);
    expect(() => addon.resizeImage(new Uint8Array(12), 2, 2, 0, 4, 'bicubic')).toThrow(/outWidth must be an integer/);
    expect(() => addon.resizeImage(new Uint8Array(12), 2, 2, 4, 4, 'lanczos' as never)).toThrow(/filter must be/);
    expect(() => addon.resizeImage([1, 2, 3] as never, 1, 1, 4, 4, 'bicubic')).toThrow(/Uint8Array/);
  });
});

describe('preprocessor_config.json', () => {
  it('reads the published fields and the newer size form', () => {
    const published = { min_pixels: 3136, max_pixels: 12845056, patch_size: 14, temporal_patch_size: 2, merge_size: 2,
      image_mean: [0.48145466, 0.4578275, 0.40821073], image_std: [0.26862954, 0.26130258, 0.27577711],
      image_processor_type: 'Qwen2VLImageProcessor', processor_class: 'Qwen2_5_VLProcessor' };
    expect(qwen2VlPreprocessorConfig(published)).toEqual(QWEN2_VL_DEFAULTS);
    expect(qwen2VlPreprocessorConfig({ size: { shortest_edge: 1000, longest_edge: 2000 } })).toMatchObject({ minPixels: 1000, maxPixels: 2000 });
  });

  it.each([
    [{ resample: 2 }, /resample 2 is not supported/],
    [{ do_normalize: false }, /do_normalize false is not supported/],
    [{ patch_size: 0 }, /patch_size must be a positive integer/],
    [{ min_pixels: 5000, max_pixels: 4000 }, /min_pixels \(5000\) exceeds max_pixels \(4000\)/],
    [{ image_std: [1, 0, 1] }, /image_std must be positive/],
    [{ image_mean: [1, 2] }, /image_mean must be three numbers/],
  ])('refuses %j', (raw, message) => {
    expect(() => qwen2VlPreprocessorConfig(raw)).toThrow(message);
  });
});
