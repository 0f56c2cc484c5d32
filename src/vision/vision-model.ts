// The vision side of a vision-language checkpoint (Qwen2.5-VL, Gemma 3): its published preprocessor
// and the native vision tower. prepare() resizes a decoded image as the processor does and says how
// many prompt tokens it becomes (what count_tokens and billing need, without running the encoder);
// encodeMany() runs the tower. Both stay off the event loop: the resize and the SHA-256 of its pixels
// on the libuv pool, the layout and the tower on the vision thread. The resized pixels stay native
// until then (3 bytes a pixel, never a JS array: large arrays cost the event loop their collection).

import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SluiceError } from '../errors.js';
import { nativeAddon, type NativeImage, type NativeVisionEncoder } from '../native/native.js';
import type { DecodedImage } from './image-decode.js';
import { qwen2VlPreprocessorConfig } from './qwen2-vl-preprocess.js';
import { gemma3Processor } from './gemma3-processor.js';
import { Qwen2VlProcessor, type EncoderInput, type ImageDetail, type ImagePlan, type ImageProcessor } from './image-processor.js';

export const QWEN2_5_VL_ARCHITECTURE = 'Qwen2_5_VLForConditionalGeneration';
export const GEMMA3_ARCHITECTURE = 'Gemma3ForConditionalGeneration';

/** Where a vision tower runs: the CPU, or the CUDA device the engine decodes on (device 0). */
export type VisionDevice = 'cpu' | 'cuda';

export { LOW_DETAIL_MAX_PIXELS, type ImageDetail } from './image-processor.js';

/** An image ready for a prompt: the encoder's input and what it adds to the prompt. */
export interface PreparedImage {
  /** The image resized as the processor does it (the tower's input before its fixed normalisation). */
  resized: NativeImage;
  /** The image's prompt tokens as rows and columns (gridH * gridW = numTokens). */
  gridH: number;
  gridW: number;
  numTokens: number;
  /** SHA-256 of the resized pixels and their size (NativeImage.hash): keys the prefix and encoder caches. */
  hash: Uint8Array;
}

export class VisionModel {
  private constructor(
    readonly processor: ImageProcessor,
    /** The placeholder token an image's rows replace (config.json image_token_id / image_token_index). */
    readonly imageTokenId: number,
    private readonly encoder: NativeVisionEncoder,
  ) {}

  /**
   * The vision model of `modelDir` when its config.json names a vision-language architecture the
   * engine serves with its vision tower, else undefined. Throws SluiceError model_file_missing /
   * model_file_invalid for a checkpoint whose vision files do not hold together.
   */
  static async load(modelDir: string, config: Record<string, unknown>, numThreads: number,
    device: VisionDevice = 'cpu'): Promise<VisionModel | undefined> {
    const architectures = config['architectures'];
    const architecture = Array.isArray(architectures) ? architectures[0] : undefined;
    const family = architecture === QWEN2_5_VL_ARCHITECTURE ? 'qwen2_5_vl'
      // Gemma 3's multimodal checkpoints without a vision tower serve text only.
      : architecture === GEMMA3_ARCHITECTURE && config['vision_config'] !== undefined ? 'gemma3' : undefined;
    if (family === undefined) return undefined;
    const tokenKey = family === 'gemma3' ? 'image_token_index' : 'image_token_id';
    const imageTokenId = config[tokenKey];
    if (typeof imageTokenId !== 'number' || !Number.isInteger(imageTokenId) || imageTokenId < 0) {
      throw new SluiceError('model_file_invalid', `${modelDir}/config.json: ${tokenKey} must be a token id, got ${JSON.stringify(imageTokenId)}`);
    }
    const source = join(modelDir, 'preprocessor_config.json');
    let processor: ImageProcessor;
    try {
      const raw = JSON.parse(await readFile(source, 'utf8')) as unknown;
      if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Error('expected a JSON object');
      processor = family === 'qwen2_5_vl' ? qwen2VlProcessor(raw as Record<string, unknown>, config, source)
        : gemma3Processor(raw as Record<string, unknown>, config, source);
    } catch (err) {
      const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
      throw new SluiceError(missing ? 'model_file_missing' : 'model_file_invalid',
        `${modelDir}: preprocessor_config.json ${missing ? 'is missing' : `is invalid: ${(err as Error).message}`}`, { cause: err });
    }
    let encoder: NativeVisionEncoder;
    try {
      encoder = await nativeAddon().loadVisionEncoder(modelDir, numThreads, device === 'cuda' ? 0 : -1);
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      throw new SluiceError(typeof code === 'string' ? code.toLowerCase() : 'model_file_invalid',
        `cannot load the vision tower of ${modelDir}: ${(err as Error).message}`, { cause: err });
    }
    return new VisionModel(processor, imageTokenId, encoder);
  }

  /** Where the tower runs (the CUDA engine's device, or the CPU). */
  get device(): VisionDevice {
    return this.encoder.device;
  }

  /** Prompt tokens an image of this size becomes, and the pixels it is resized to (no pixels needed). */
  tokensFor(width: number, height: number, detail: ImageDetail = 'auto'): ImagePlan {
    return this.processor.plan(width, height, detail);
  }

  /** Resizes `image` as the processor does and hashes the result. */
  async prepare(image: DecodedImage, detail: ImageDetail = 'auto'): Promise<PreparedImage> {
    const plan = this.processor.plan(image.width, image.height, detail);
    const resized = await this.processor.resize(image, detail);
    return { resized, gridH: plan.gridH, gridW: plan.gridW, numTokens: plan.numTokens, hash: resized.hash };
  }

  /**
   * Each image's rows for the language model ([numTokens * hidden_size] float32), in one pass of
   * the tower (engines queue their images through encode-queue.ts).
   */
  encodeMany(images: readonly PreparedImage[]): Promise<Float32Array[]> {
    return this.encoder.encodeImages(images.map((im) => im.resized), this.processor.tables);
  }

  /** The float input the tower reads for `image`, computed in TypeScript (references and tests). */
  encoderInput(image: PreparedImage): EncoderInput {
    return this.processor.encoderInput(image.resized);
  }

  dispose(): void {
    this.encoder.dispose();
  }
}

/**
 * The processor of a Qwen2.5-VL checkpoint. The tower lays its input out with vision_config's patch,
 * merge and temporal sizes, so the processor's must be the same.
 */
function qwen2VlProcessor(raw: Record<string, unknown>, config: Record<string, unknown>, source: string): Qwen2VlProcessor {
  const pre = qwen2VlPreprocessorConfig(raw, source);
  const vision = (config['vision_config'] ?? {}) as Record<string, unknown>;
  // Qwen2_5_VLVisionConfig's defaults.
  const sizes = [['patch_size', 'patchSize', 14], ['spatial_merge_size', 'mergeSize', 2], ['temporal_patch_size', 'temporalPatchSize', 2]] as const;
  for (const [field, key, fallback] of sizes) {
    const tower = vision[field] ?? fallback;
    if (tower !== pre[key]) throw new Error(`${source}: ${key === 'mergeSize' ? 'merge_size' : field} ${pre[key]} differs from config.json vision_config.${field} ${JSON.stringify(tower)}`);
  }
  return new Qwen2VlProcessor(pre);
}

/**
 * The prompt with each image's placeholder expanded: a template renders an image as one image
 * token; the model reads numTokens of them. Tokens already expanded (a run of exactly numTokens)
 * are kept. Returns the tokens and where each image's run starts. Throws invalid_request when the
 * prompt's placeholders and the images do not pair up (text that spells the placeholder itself).
 */
export function placeImages(tokenIds: readonly number[], images: readonly PreparedImage[], imageTokenId: number,
  param = 'input'): { tokenIds: number[]; offsets: number[] } {
  const runs: [start: number, end: number][] = [];
  for (let i = 0; i < tokenIds.length; i++) {
    if (tokenIds[i] !== imageTokenId) continue;
    let end = i;
    while (end < tokenIds.length && tokenIds[end] === imageTokenId) end++;
    runs.push([i, end]);
    i = end;
  }
  const mismatch = runs.length !== images.length ||
    runs.some(([start, end], k) => end - start !== 1 && end - start !== images[k]!.numTokens);
  if (mismatch) {
    throw new SluiceError('invalid_request',
      `the prompt holds ${runs.length} image placeholder${runs.length === 1 ? '' : 's'} for ${images.length} ` +
      `image${images.length === 1 ? '' : 's'}: text may not spell the model's image token`, { param });
  }
  const out: number[] = [];
  const offsets: number[] = [];
  let at = 0;
  runs.forEach(([start, end], k) => {
    for (let i = at; i < start; i++) out.push(tokenIds[i]!);
    offsets.push(out.length);
    for (let n = 0; n < images[k]!.numTokens; n++) out.push(imageTokenId);
    at = end;
  });
  for (let i = at; i < tokenIds.length; i++) out.push(tokenIds[i]!);
  return { tokenIds: out, offsets };
}
