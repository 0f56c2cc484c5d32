// Gemma 3's image processor (Gemma3ImageProcessor): every image resized to the one square size
// (896 x 896 as published, bilinear, aspect not kept), rescaled and normalised, channels first;
// it becomes mm_tokens_per_image prompt tokens (256) whatever its size. `detail` changes nothing.

import { nativeAddon, type NativeImage } from '../native/native.js';
import { gemma3PixelsOfResized, gemma3PreprocessorConfig, gemma3Tables, type Gemma3PreprocessorConfig } from './gemma3-preprocess.js';
import type { DecodedImage } from './image-decode.js';
import type { EncoderInput, ImagePlan, ImageProcessor } from './image-processor.js';

export class Gemma3Processor implements ImageProcessor {
  private readonly side: number;
  readonly tables: Float32Array;

  constructor(readonly config: Gemma3PreprocessorConfig, readonly tokensPerImage: number, readonly patchSize: number) {
    this.side = Math.round(Math.sqrt(tokensPerImage));
    this.tables = gemma3Tables(config);
  }

  plan(): ImagePlan {
    return { gridH: this.side, gridW: this.side, numTokens: this.tokensPerImage, pixels: this.config.height * this.config.width };
  }

  resize(image: DecodedImage): Promise<NativeImage> {
    return nativeAddon().resizeImage(image.rgb, image.width, image.height, this.config.width, this.config.height, 'bilinear');
  }

  encoderInput(resized: NativeImage): EncoderInput {
    return { pixelValues: gemma3PixelsOfResized(resized.pixels(), this.config), grid: [1, this.config.height / this.patchSize, this.config.width / this.patchSize] };
  }
}

/** The processor of a Gemma 3 checkpoint: its preprocessor_config.json and config.json's token count and patch size. */
export function gemma3Processor(raw: Record<string, unknown>, config: Record<string, unknown>, source: string): Gemma3Processor {
  const tokens = config['mm_tokens_per_image'];
  const vision = (config['vision_config'] ?? {}) as Record<string, unknown>;
  const patch = vision['patch_size'] ?? 14;
  if (typeof tokens !== 'number' || !Number.isInteger(tokens) || tokens < 1 || !Number.isInteger(Math.sqrt(tokens))) {
    throw new Error(`config.json mm_tokens_per_image must be a square number of tokens, got ${JSON.stringify(tokens)}`);
  }
  if (typeof patch !== 'number' || !Number.isInteger(patch) || patch < 1) throw new Error(`config.json vision_config.patch_size must be a positive integer`);
  const pre = gemma3PreprocessorConfig(raw, source);
  if (pre.height % patch !== 0 || pre.width % patch !== 0) throw new Error(`${source}: size must be a multiple of the patch size ${patch}`);
  return new Gemma3Processor(pre, tokens, patch);
}
