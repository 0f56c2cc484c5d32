// The Gemma 3 image processor (the published preprocessor_config.json's "Gemma3ImageProcessor"):
// an RGB image becomes the SigLIP tower's pixel_values. Every image is resized to the one square
// size (896 x 896 as published) with Pillow's BILINEAR, the aspect ratio not kept, rescaled by
// 1/255 and normalised with the config's mean and std in float32, channels first. Pan and scan
// (extra crops of wide images) is not implemented and refused. Written from the processor's
// description; checked against Pillow and a numpy transcription (test/vision-gemma3-preprocess.test.ts,
// fixtures from scripts/vision-golden.py --gemma3).

import { normalizeTables } from './normalize-tables.js';
import { nativeAddon } from '../native/native.js';
import { resizeBilinearRgb } from './pil-resize.js';

/** The fields of preprocessor_config.json this processor reads. */
export interface Gemma3PreprocessorConfig {
  /** The size every image is resized to, in pixels (size.height, size.width). */
  height: number;
  width: number;
  imageMean: [number, number, number];
  imageStd: [number, number, number];
}

/** Gemma3ImageProcessor's defaults where the published config leaves a field out (its size is 896). */
export const GEMMA3_DEFAULTS: Gemma3PreprocessorConfig = {
  height: 224,
  width: 224,
  imageMean: [0.5, 0.5, 0.5],
  imageStd: [0.5, 0.5, 0.5],
};

const positiveInteger = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v > 0;

/**
 * preprocessor_config.json (parsed) as a Gemma3PreprocessorConfig: `size` {height, width},
 * `image_mean`, `image_std`; absent (or null) fields take Gemma3ImageProcessor's defaults. Throws
 * naming the field for a value the processor cannot use, and for what it does not implement: pan
 * and scan turned on, a resampling other than 2 (bilinear), a rescale factor other than 1/255, or
 * a processing step turned off.
 */
export function gemma3PreprocessorConfig(raw: Record<string, unknown>, source = 'preprocessor_config.json'): Gemma3PreprocessorConfig {
  const bad = (field: string, why: string): never => {
    throw new Error(`${source}: ${field} ${why}`);
  };
  const out: Gemma3PreprocessorConfig = { ...GEMMA3_DEFAULTS, imageMean: [...GEMMA3_DEFAULTS.imageMean], imageStd: [...GEMMA3_DEFAULTS.imageStd] };
  const size = raw['size'];
  if (size !== undefined && size !== null) {
    if (typeof size !== 'object' || Array.isArray(size)) bad('size', `must be {"height", "width"}, got ${JSON.stringify(size)}`);
    const s = size as Record<string, unknown>;
    for (const k of ['height', 'width'] as const) {
      if (!positiveInteger(s[k])) bad(`size.${k}`, `must be a positive integer, got ${JSON.stringify(s[k])}`);
      out[k] = s[k] as number;
    }
  }
  for (const [field, key] of [['image_mean', 'imageMean'], ['image_std', 'imageStd']] as const) {
    const v = raw[field];
    if (v === undefined || v === null) continue;
    if (!Array.isArray(v) || v.length !== 3 || !v.every((x) => typeof x === 'number' && Number.isFinite(x))) bad(field, 'must be three numbers');
    if (field === 'image_std' && (v as number[]).some((x) => x <= 0)) bad(field, 'must be positive');
    out[key] = [...(v as number[])] as [number, number, number];
  }
  const resample = raw['resample'];
  if (resample !== undefined && resample !== null && resample !== 2) bad('resample', `${JSON.stringify(resample)} is not supported (only 2, bilinear)`);
  if (raw['do_pan_and_scan'] === true) bad('do_pan_and_scan', 'true is not supported (pan and scan crops are not implemented)');
  for (const step of ['do_resize', 'do_rescale', 'do_normalize', 'do_convert_rgb']) {
    if (raw[step] === false) bad(step, 'false is not supported');
  }
  const factor = raw['rescale_factor'];
  if (factor !== undefined && factor !== null && factor !== 1 / 255) bad('rescale_factor', `must be 1/255, got ${JSON.stringify(factor)}`);
  return out;
}

/** rescale + normalise of each 8-bit value, per channel: [3 * 256] float32, as numpy computes it. */
export function gemma3Tables(c: Gemma3PreprocessorConfig): Float32Array {
  return normalizeTables(c.imageMean, c.imageStd);
}

/**
 * The pixel_values of one RGB image ([height, width, 3] bytes, row-major): [3, c.height, c.width]
 * float32, channels first, rows then columns.
 */
export function gemma3Pixels(rgb: Uint8Array, width: number, height: number, c: Gemma3PreprocessorConfig): Float32Array {
  return gemma3PixelsOfResized(resizeBilinearRgb(rgb, width, height, c.width, c.height), c);
}

/** The pixel_values of an image already resized to [c.height, c.width, 3]. */
export function gemma3PixelsOfResized(img: Uint8Array, c: Gemma3PreprocessorConfig): Float32Array {
  const tables = gemma3Tables(c);
  const plane = c.width * c.height;
  const out = new Float32Array(3 * plane);
  for (let ch = 0; ch < 3; ch++) {
    const t = ch * 256, o = ch * plane;
    for (let i = 0; i < plane; i++) out[o + i] = tables[t + img[i * 3 + ch]!]!;
  }
  return out;
}

/**
 * gemma3Pixels on the native addon's worker pool (the resize and the layout in C++, off the event
 * loop; the same values, tested), or on this thread where the addon is not built.
 */
export async function gemma3PixelsAsync(rgb: Uint8Array, width: number, height: number, c: Gemma3PreprocessorConfig): Promise<Float32Array> {
  let addon;
  try {
    addon = nativeAddon();
  } catch {
    return gemma3Pixels(rgb, width, height, c);
  }
  return addon.gemma3Pixels(rgb, width, height, c.width, c.height, gemma3Tables(c));
}
