// A family's published image processor, as the vision model uses it: what an image of some size
// becomes in the prompt, and the encoder's input. Qwen2-VL's here; Gemma 3's in gemma3-processor.ts.

import { nativeAddon, type NativeImage } from '../native/native.js';
import type { DecodedImage } from './image-decode.js';
import { qwen2VlPatchesOfResized, qwen2VlTables, smartResize, type Qwen2VlPreprocessorConfig } from './qwen2-vl-preprocess.js';

/** How closely to look at an image: the OpenAI `detail` field. */
export type ImageDetail = 'auto' | 'low' | 'high';

/**
 * `detail: low`: the image is resized within this many pixels (OpenAI's low detail looks at a
 * 512 x 512 rendition), or the model's own max_pixels when that is smaller.
 */
export const LOW_DETAIL_MAX_PIXELS = 512 * 512;

/** What the vision tower reads of one image, as floats, and its shape in patches ([frames, rows, columns]). */
export interface EncoderInput {
  pixelValues: Float32Array;
  grid: [number, number, number];
}

/** What an image of some size becomes: prompt tokens (rows x columns) and the pixels it is resized to. */
export interface ImagePlan {
  gridH: number;
  gridW: number;
  numTokens: number;
  pixels: number;
}

/** A family's published image processor. */
export interface ImageProcessor {
  /** Without the pixels; throws for a size the processor refuses (an extreme aspect ratio). */
  plan(width: number, height: number, detail: ImageDetail): ImagePlan;
  /** The image resized as the processor does it, held natively and hashed (on the libuv pool). */
  resize(image: DecodedImage, detail: ImageDetail): Promise<NativeImage>;
  /** Each 8-bit value rescaled and normalised, per channel: [3 * 256] float32 (the tower's input values). */
  readonly tables: Float32Array;
  /** The tower's float input of a resized image, computed here in TypeScript: references and tests. */
  encoderInput(resized: NativeImage): EncoderInput;
}

/** Qwen2-VL / Qwen2.5-VL: dynamic resolution within min/max pixels, patch 14, 2x2 merge. */
export class Qwen2VlProcessor implements ImageProcessor {
  readonly tables: Float32Array;

  constructor(readonly config: Qwen2VlPreprocessorConfig) {
    this.tables = qwen2VlTables(config);
  }

  /** The budget of pixels an image is resized within for `detail`. */
  maxPixelsFor(detail: ImageDetail = 'auto'): number {
    return detail === 'low' ? Math.max(this.config.minPixels, Math.min(this.config.maxPixels, LOW_DETAIL_MAX_PIXELS))
      : this.config.maxPixels;
  }

  plan(width: number, height: number, detail: ImageDetail = 'auto'): ImagePlan {
    const { patchSize: p, mergeSize: m, minPixels } = this.config;
    const [h, w] = smartResize(height, width, p * m, minPixels, this.maxPixelsFor(detail));
    const gridH = h / (p * m), gridW = w / (p * m);
    return { gridH, gridW, numTokens: gridH * gridW, pixels: h * w };
  }

  resize(image: DecodedImage, detail: ImageDetail = 'auto'): Promise<NativeImage> {
    const { patchSize: p, mergeSize: m } = this.config;
    const { gridH, gridW } = this.plan(image.width, image.height, detail);
    return nativeAddon().resizeImage(image.rgb, image.width, image.height, gridW * p * m, gridH * p * m, 'bicubic');
  }

  encoderInput(resized: NativeImage): EncoderInput {
    const patches = qwen2VlPatchesOfResized(resized.pixels(), resized.width, resized.height, this.config);
    return { pixelValues: patches.pixelValues, grid: patches.grid };
  }
}

