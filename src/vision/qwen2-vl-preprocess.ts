// The Qwen2-VL / Qwen2.5-VL image processor (the published preprocessor_config.json's
// "Qwen2VLImageProcessor"): an RGB image becomes the vision encoder's patch rows. The size is
// chosen by smart_resize (both sides multiples of patch_size * merge_size, the pixel count within
// [min_pixels, max_pixels], the aspect ratio kept as nearly as that allows), the image resized with
// Pillow's bicubic (pil-resize.ts), rescaled by 1/255 and normalised with the config's mean and std
// in float32, repeated temporal_patch_size times (a still image is a clip of identical frames), and
// cut into patches of [channels, temporal, patch, patch] values, ordered so that each merge_size x
// merge_size group of neighbouring patches is consecutive (the encoder's merger folds them into one
// language-model token). Written from the processor's description; checked against Pillow and a
// numpy transcription (test/vision-preprocess.test.ts).

import { normalizeTables } from './normalize-tables.js';
import { nativeAddon } from '../native/native.js';
import { resizeBicubicRgb } from './pil-resize.js';

/** The fields of preprocessor_config.json this processor reads, with the published defaults. */
export interface Qwen2VlPreprocessorConfig {
  minPixels: number;
  maxPixels: number;
  patchSize: number;
  temporalPatchSize: number;
  mergeSize: number;
  imageMean: [number, number, number];
  imageStd: [number, number, number];
}

export const QWEN2_VL_DEFAULTS: Qwen2VlPreprocessorConfig = {
  minPixels: 56 * 56,
  maxPixels: 12845056,  // Qwen2.5-VL's published max_pixels (3584 x 3584)
  patchSize: 14,
  temporalPatchSize: 2,
  mergeSize: 2,
  imageMean: [0.48145466, 0.4578275, 0.40821073],
  imageStd: [0.26862954, 0.26130258, 0.27577711],
};

/** The most extreme aspect ratio smart_resize accepts (the published limit). */
export const MAX_ASPECT_RATIO = 200;

const positiveInteger = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v > 0;

/**
 * preprocessor_config.json (parsed) as a Qwen2VlPreprocessorConfig: `min_pixels` / `max_pixels`
 * (or `size.shortest_edge` / `size.longest_edge`, as newer exports write them), `patch_size`,
 * `temporal_patch_size`, `merge_size`, `image_mean`, `image_std`; absent fields take the
 * published defaults. Throws naming the field for a value the processor cannot use, and for a
 * resampling other than bicubic (3) or processing steps turned off, which this processor does not
 * implement.
 */
export function qwen2VlPreprocessorConfig(raw: Record<string, unknown>, source = 'preprocessor_config.json'): Qwen2VlPreprocessorConfig {
  const bad = (field: string, why: string): never => {
    throw new Error(`${source}: ${field} ${why}`);
  };
  const size = (raw['size'] ?? {}) as Record<string, unknown>;
  const out: Qwen2VlPreprocessorConfig = { ...QWEN2_VL_DEFAULTS, imageMean: [...QWEN2_VL_DEFAULTS.imageMean], imageStd: [...QWEN2_VL_DEFAULTS.imageStd] };
  const num = (field: string, value: unknown, fallback: number): number => {
    if (value === undefined || value === null) return fallback;
    if (!positiveInteger(value)) bad(field, `must be a positive integer, got ${JSON.stringify(value)}`);
    return value as number;
  };
  out.minPixels = num('min_pixels', raw['min_pixels'] ?? size['shortest_edge'], out.minPixels);
  out.maxPixels = num('max_pixels', raw['max_pixels'] ?? size['longest_edge'], out.maxPixels);
  out.patchSize = num('patch_size', raw['patch_size'], out.patchSize);
  out.temporalPatchSize = num('temporal_patch_size', raw['temporal_patch_size'], out.temporalPatchSize);
  out.mergeSize = num('merge_size', raw['merge_size'], out.mergeSize);
  if (out.minPixels > out.maxPixels) bad('min_pixels', `(${out.minPixels}) exceeds max_pixels (${out.maxPixels})`);
  for (const [field, key] of [['image_mean', 'imageMean'], ['image_std', 'imageStd']] as const) {
    const v = raw[field];
    if (v === undefined) continue;
    if (!Array.isArray(v) || v.length !== 3 || !v.every((x) => typeof x === 'number' && Number.isFinite(x))) bad(field, 'must be three numbers');
    if (field === 'image_std' && (v as number[]).some((x) => x <= 0)) bad(field, 'must be positive');
    out[key] = v as [number, number, number];
  }
  if (raw['resample'] !== undefined && raw['resample'] !== 3) bad('resample', `${JSON.stringify(raw['resample'])} is not supported (only 3, bicubic)`);
  for (const step of ['do_resize', 'do_rescale', 'do_normalize', 'do_convert_rgb']) {
    if (raw[step] === false) bad(step, 'false is not supported');
  }
  if (raw['rescale_factor'] !== undefined && raw['rescale_factor'] !== 1 / 255) bad('rescale_factor', 'must be 1/255');
  return out;
}

/** Python's round(): to nearest, ties to even. */
function roundHalfEven(x: number): number {
  const f = Math.floor(x), d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * The [height, width] an image is resized to: each a multiple of `factor`, about the original
 * aspect ratio, the pixel count within [minPixels, maxPixels]. Throws for an aspect ratio over
 * MAX_ASPECT_RATIO.
 */
export function smartResize(height: number, width: number, factor: number, minPixels: number, maxPixels: number): [number, number] {
  if (Math.max(height, width) / Math.min(height, width) > MAX_ASPECT_RATIO) {
    throw new Error(`the image's aspect ratio ${width}x${height} is over ${MAX_ASPECT_RATIO}:1`);
  }
  let h = Math.max(factor, roundHalfEven(height / factor) * factor);
  let w = Math.max(factor, roundHalfEven(width / factor) * factor);
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels);
    h = Math.max(factor, Math.floor(height / beta / factor) * factor);
    w = Math.max(factor, Math.floor(width / beta / factor) * factor);
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return [h, w];
}

export interface VisionPatches {
  /** [gridT * gridH * gridW, 3 * temporalPatchSize * patchSize^2] float32, merge groups consecutive. */
  pixelValues: Float32Array;
  patchDim: number;
  /** image_grid_thw: frames / temporal patch, rows and columns of patches. */
  grid: [number, number, number];
  /** The size the image was resized to. */
  resized: { width: number; height: number };
  /** Language-model tokens the image becomes: patches / mergeSize^2. */
  numTokens: number;
}

/** rescale + normalise of each 8-bit value, per channel: [3 * 256] float32, as numpy computes it. */
export function qwen2VlTables(c: Qwen2VlPreprocessorConfig): Float32Array {
  return normalizeTables(c.imageMean, c.imageStd);
}

interface PatchPlan {
  resized: { width: number; height: number };
  grid: [number, number, number];
  patchDim: number;
  numTokens: number;
}

function patchPlan(width: number, height: number, c: Qwen2VlPreprocessorConfig, maxPixelsOverride: number | undefined): PatchPlan {
  const { patchSize: p, mergeSize: m, temporalPatchSize: tp } = c;
  const maxPixels = Math.max(c.minPixels, Math.min(c.maxPixels, maxPixelsOverride ?? c.maxPixels));
  const [rh, rw] = smartResize(height, width, p * m, c.minPixels, maxPixels);
  const gh = rh / p, gw = rw / p;
  return { resized: { width: rw, height: rh }, grid: [1, gh, gw], patchDim: 3 * tp * p * p, numTokens: (gh * gw) / (m * m) };
}

/**
 * The encoder input of one RGB image ([height, width, 3] bytes), computed here on the calling
 * thread: the reference the native path (qwen2VlPatchesAsync) is held to. `maxPixels` overrides
 * the config's budget (e.g. a request's detail: low), never going below its minPixels.
 */
export function qwen2VlPatches(rgb: Uint8Array, width: number, height: number, c: Qwen2VlPreprocessorConfig,
  opts: { maxPixels?: number } = {}): VisionPatches {
  const plan = patchPlan(width, height, c, opts.maxPixels);
  const { width: rw, height: rh } = plan.resized;
  return qwen2VlPatchesOfResized(resizeBicubicRgb(rgb, width, height, rw, rh), rw, rh, c);
}

/** The patch rows of an image already resized (to multiples of patch * merge on both sides). */
export function qwen2VlPatchesOfResized(img: Uint8Array, rw: number, rh: number, c: Qwen2VlPreprocessorConfig): VisionPatches {
  const { patchSize: p, mergeSize: m, temporalPatchSize: tp } = c;
  const tables = qwen2VlTables(c);
  const gh = rh / p, gw = rw / p, patchDim = 3 * tp * p * p;
  const pixelValues = new Float32Array(gh * gw * patchDim);
  // Row order: merge-group row, merge-group column, row within the group, column within it; each
  // row holds channel, then frame (identical here), then the patch's pixels row-major.
  let row = 0;
  for (let bh = 0; bh < gh / m; bh++) {
    for (let bw = 0; bw < gw / m; bw++) {
      for (let ih = 0; ih < m; ih++) {
        for (let iw = 0; iw < m; iw++) {
          const y0 = (bh * m + ih) * p, x0 = (bw * m + iw) * p;
          const base = row * patchDim;
          for (let ch = 0; ch < 3; ch++) {
            for (let f = 0; f < tp; f++) {
              const o = base + (ch * tp + f) * p * p;
              for (let y = 0; y < p; y++) {
                const src = ((y0 + y) * rw + x0) * 3 + ch;
                for (let x = 0; x < p; x++) pixelValues[o + y * p + x] = tables[ch * 256 + img[src + x * 3]!]!;
              }
            }
          }
          row++;
        }
      }
    }
  }
  return { pixelValues, patchDim, grid: [1, gh, gw], resized: { width: rw, height: rh }, numTokens: (gh * gw) / (m * m) };
}

/**
 * qwen2VlPatches on the native addon's worker pool (the resize and the layout in C++, off the
 * event loop; the same values, tested), or on this thread where the addon is not built.
 */
export async function qwen2VlPatchesAsync(rgb: Uint8Array, width: number, height: number, c: Qwen2VlPreprocessorConfig,
  opts: { maxPixels?: number } = {}): Promise<VisionPatches> {
  let addon;
  try {
    addon = nativeAddon();
  } catch {
    return qwen2VlPatches(rgb, width, height, c, opts);
  }
  const plan = patchPlan(width, height, c, opts.maxPixels);
  const pixelValues = await addon.qwen2VlPatches(rgb, width, height, plan.resized.width, plan.resized.height, c.patchSize,
    c.mergeSize, c.temporalPatchSize, qwen2VlTables(c));
  return { pixelValues, patchDim: plan.patchDim, grid: plan.grid, resized: plan.resized, numTokens: plan.numTokens };
}
