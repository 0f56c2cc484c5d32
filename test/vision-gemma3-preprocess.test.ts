// Gemma 3's image preprocessing against Pillow 9.4 and a numpy transcription of the published
// processor (fixtures written by `scripts/vision-golden.py --gemma3`): the bilinear resize byte for
// byte (896 x 896 by digest, small sizes in full), the float32 pixel values channels first, and
// the config's refusals of what the processor does not implement.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { resizeBilinearRgb } from '../src/vision/pil-resize.js';
import { GEMMA3_DEFAULTS, gemma3Pixels, gemma3PixelsAsync, gemma3PreprocessorConfig } from '../src/vision/gemma3-preprocess.js';
import { nativeAddon, nativeAvailable } from '../src/native/native.js';

interface Golden {
  pillow: string;
  large: Array<{ width: number; height: number; seed: number; size: number; inputSha256: string; resizedSha256: string; pixelValuesSha256: string }>;
  small: Array<{ width: number; height: number; seed: number; outWidth: number; outHeight: number; inputSha256: string; resized: string; pixelValues: string }>;
  normalized: string;
}
const golden = JSON.parse(readFileSync(join(import.meta.dirname, 'fixtures', 'vision', 'gemma3-golden.json'), 'utf8')) as Golden;
const bytes = (b64: string) => new Uint8Array(Buffer.from(b64, 'base64'));
const sha256 = (a: ArrayBufferView) => createHash('sha256').update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength)).digest('hex');

/** scripts/vision-golden.py's pattern(w, h, seed): [h, w, 3] bytes (every product below 2^53, so exact in doubles). */
function pattern(w: number, h: number, seed: number): Uint8Array {
  const out = new Uint8Array(w * h * 3);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const o = (y * w + x) * 3;
      out[o] = (Math.floor((x * 255) / Math.max(1, w - 1)) + seed * 17) % 256;
      out[o + 1] = (Math.floor((y * 255) / Math.max(1, h - 1)) + seed * 29) % 256;
      out[o + 2] = Math.floor(((x * 131 + y * 71 + seed * 13) * 2654435761) / 128) % 256;
    }
  }
  return out;
}

const PUBLISHED = {
  do_convert_rgb: null, do_normalize: true, do_pan_and_scan: null, do_rescale: true, do_resize: true, image_mean: [0.5, 0.5, 0.5],
  image_processor_type: 'Gemma3ImageProcessor', image_seq_length: 256, image_std: [0.5, 0.5, 0.5], pan_and_scan_max_num_crops: null,
  pan_and_scan_min_crop_size: null, pan_and_scan_min_ratio_to_activate: null, processor_class: 'Gemma3Processor', resample: 2,
  rescale_factor: 0.00392156862745098, size: { height: 896, width: 896 },
};

describe("Pillow's bilinear resize", () => {
  it.each(golden.small.map((r) => [`${r.width}x${r.height} -> ${r.outWidth}x${r.outHeight}`, r] as const))('%s: the same bytes', (_, r) => {
    const input = pattern(r.width, r.height, r.seed);
    expect(sha256(input), 'the test pattern as the script drew it').toBe(r.inputSha256);
    const got = resizeBilinearRgb(input, r.width, r.height, r.outWidth, r.outHeight);
    const want = bytes(r.resized);
    expect(got.length).toBe(want.length);
    let differing = 0;
    for (let i = 0; i < want.length; i++) differing += got[i] !== want[i] ? 1 : 0;
    expect(differing, `bytes differing from Pillow ${golden.pillow}`).toBe(0);
  });

  it.each(golden.large.map((r) => [`${r.width}x${r.height} -> ${r.size}x${r.size}`, r] as const))('%s: the same bytes (digest)', (_, r) => {
    const input = pattern(r.width, r.height, r.seed);
    expect(sha256(input)).toBe(r.inputSha256);
    expect(sha256(resizeBilinearRgb(input, r.width, r.height, r.size, r.size))).toBe(r.resizedSha256);
  });

  it('returns a copy at the same size and refuses a buffer of the wrong length', () => {
    const img = new Uint8Array([1, 2, 3, 4, 5, 6]);
    const same = resizeBilinearRgb(img, 2, 1, 2, 1);
    expect(Array.from(same)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(same).not.toBe(img);
    expect(() => resizeBilinearRgb(img, 3, 1, 2, 2)).toThrow(/6 bytes for a 3x1/);
    expect(() => resizeBilinearRgb(img, 2, 1, 0, 2)).toThrow(/output size/);
  });
});

describe('Gemma 3 pixel values', () => {
  const published = gemma3PreprocessorConfig(PUBLISHED);

  it('reads the published preprocessor_config.json', () => {
    expect(published).toEqual({ height: 896, width: 896, imageMean: [0.5, 0.5, 0.5], imageStd: [0.5, 0.5, 0.5] });
    expect(gemma3PreprocessorConfig({})).toEqual(GEMMA3_DEFAULTS);
  });

  it.each(golden.small.filter((r) => r.outWidth === r.outHeight).map((r) => [`${r.width}x${r.height} at ${r.outWidth}`, r] as const))(
    '%s: numpy\'s float32 values, channels first', (_, r) => {
      const cfg = { ...published, height: r.outHeight, width: r.outWidth };
      const got = gemma3Pixels(pattern(r.width, r.height, r.seed), r.width, r.height, cfg);
      expect(got.length).toBe(3 * r.outWidth * r.outHeight);
      expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength).toString('base64')).toBe(r.pixelValues);
    });

  it.each(golden.large.map((r) => [`${r.width}x${r.height}`, r] as const))('%s at 896: numpy\'s float32 values (digest)', (_, r) => {
    const got = gemma3Pixels(pattern(r.width, r.height, r.seed), r.width, r.height, published);
    expect(got.length).toBe(3 * 896 * 896);
    expect(sha256(got)).toBe(r.pixelValuesSha256);
  });

  it('normalises each byte to (v / 255 - 0.5) / 0.5 in float32', () => {
    const b = Buffer.from(golden.normalized, 'base64');
    const want = new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    // A one-row image of every byte value, at its own size (no resampling).
    const rgb = new Uint8Array(256 * 3);
    for (let v = 0; v < 256; v++) rgb.fill(v, v * 3, v * 3 + 3);
    const got = gemma3Pixels(rgb, 256, 1, { ...published, width: 256, height: 1 });
    for (let ch = 0; ch < 3; ch++) expect(Array.from(got.subarray(ch * 256, (ch + 1) * 256))).toEqual(Array.from(want));
    expect(got[0]).toBe(-1);
    expect(got[255]).toBe(1);
  });

  it('refuses what the processor does not implement, naming the field', () => {
    const bad = (patch: Record<string, unknown>) => () => gemma3PreprocessorConfig({ ...PUBLISHED, ...patch }, 'x/preprocessor_config.json');
    expect(bad({ do_pan_and_scan: true })).toThrow(/x\/preprocessor_config.json: do_pan_and_scan/);
    expect(bad({ resample: 3 })).toThrow(/resample 3 is not supported/);
    expect(bad({ do_resize: false })).toThrow(/do_resize false/);
    expect(bad({ do_rescale: false })).toThrow(/do_rescale/);
    expect(bad({ do_normalize: false })).toThrow(/do_normalize/);
    expect(bad({ do_convert_rgb: false })).toThrow(/do_convert_rgb/);
    expect(bad({ rescale_factor: 1 })).toThrow(/rescale_factor/);
    expect(bad({ size: { height: 896 } })).toThrow(/size.width/);
    expect(bad({ size: { height: 0, width: 896 } })).toThrow(/size.height/);
    expect(bad({ size: 896 })).toThrow(/size must be/);
    expect(bad({ image_mean: [0.5, 0.5] })).toThrow(/image_mean/);
    expect(bad({ image_std: [0.5, 0, 0.5] })).toThrow(/image_std must be positive/);
    expect(gemma3PreprocessorConfig({ ...PUBLISHED, do_pan_and_scan: false, resample: null }).height).toBe(896);
  });
});

describe.skipIf(!nativeAvailable())('Gemma 3 pixel values on the native worker pool', () => {
  it('equal the TypeScript reference value for value (upscale, downscale, one axis, same size)', async () => {
    const c = GEMMA3_DEFAULTS;
    const rgbOf = (w: number, h: number, seed: number) => {
      const rgb = new Uint8Array(w * h * 3);
      for (let i = 0; i < rgb.length; i++) rgb[i] = (Math.imul(i + seed, 2654435761) >>> 24) & 255;
      return rgb;
    };
    for (const [w, h] of [[37, 21], [1920, 1080], [896, 300], [896, 896], [640, 1400], [1, 1]] as const) {
      const rgb = rgbOf(w, h, w + h);
      const native = await gemma3PixelsAsync(rgb, w, h, c);
      expect(native.length).toBe(3 * c.width * c.height);
      expect(Buffer.from(native.buffer, native.byteOffset, native.byteLength)
        .equals(Buffer.from(gemma3Pixels(rgb, w, h, c).buffer)), `${w}x${h}`).toBe(true);
    }
  });

  it('refuses arguments that do not describe the image', async () => {
    const addon = nativeAddon();
    const tables = new Float32Array(768);
    expect(() => addon.gemma3Pixels(new Uint8Array(10), 2, 2, 8, 8, tables)).toThrow(/width \* height \* 3/);
    expect(() => addon.gemma3Pixels(new Uint8Array(12), 2, 2, 8, 8, new Float32Array(3))).toThrow(/768/);
    expect(() => addon.gemma3Pixels(new Uint8Array(12), 2, 2, 0, 8, tables)).toThrow(/outWidth/);
  });
});
