// What the vision tests share: a deterministic test image, the encoder input a reference reads
// (computed in TypeScript from the original pixels), and the teacher-forced comparison of an
// engine's greedy output with a float64 reference session.

import { expect } from 'vitest';
import type { GenerateResult } from '../../src/engine/request.js';
import { Gemma3Processor } from '../../src/vision/gemma3-processor.js';
import { gemma3Pixels } from '../../src/vision/gemma3-preprocess.js';
import type { DecodedImage } from '../../src/vision/image-decode.js';
import { Qwen2VlProcessor, type EncoderInput, type ImageDetail } from '../../src/vision/image-processor.js';
import { qwen2VlPatches } from '../../src/vision/qwen2-vl-preprocess.js';
import type { PreparedImage, VisionModel } from '../../src/vision/vision-model.js';

/** A deterministic RGB pattern [height, width, 3] with edges and gradients. */
export function patternRgb(width: number, height: number, seed: number): Uint8Array {
  const rgb = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const o = (y * width + x) * 3;
      rgb[o] = (x * 7 + y * 3 + seed * 31) & 255;
      rgb[o + 1] = ((x ^ y) * 5 + seed * 17) & 255;
      rgb[o + 2] = Math.round(127.5 + 127.5 * Math.sin((x + 2 * y + seed) / 9));
    }
  }
  return rgb;
}

/** patternRgb as a decoded image. */
export const patternImage = (width: number, height: number, seed: number) => ({ rgb: patternRgb(width, height, seed), width, height });

const referenceInputs = new WeakMap<PreparedImage, EncoderInput>();

/**
 * `image` prepared by `vision` (the native resize), remembering the float input the TypeScript
 * processor computes from the original pixels: what referenceInput() gives the reference, so that
 * the reference never reads the engine's own preprocessing.
 */
export async function prepareForReference(vision: VisionModel, image: DecodedImage, detail: ImageDetail = 'auto'): Promise<PreparedImage> {
  const prepared = await vision.prepare(image, detail);
  const p = vision.processor;
  let input: EncoderInput;
  if (p instanceof Qwen2VlProcessor) {
    const patches = qwen2VlPatches(image.rgb, image.width, image.height, p.config, { maxPixels: p.maxPixelsFor(detail) });
    input = { pixelValues: patches.pixelValues, grid: patches.grid };
  } else if (p instanceof Gemma3Processor) {
    input = { pixelValues: gemma3Pixels(image.rgb, image.width, image.height, p.config), grid: [1, p.config.height / p.patchSize, p.config.width / p.patchSize] };
  } else {
    throw new Error('unknown image processor');
  }
  referenceInputs.set(prepared, input);
  return prepared;
}

/** The TypeScript processor's encoder input of an image from prepareForReference. */
export function referenceInput(image: PreparedImage): EncoderInput {
  const input = referenceInputs.get(image);
  if (input === undefined) throw new Error('the image was not prepared with prepareForReference');
  return input;
}

/** The largest difference of a native output from its float64 reference, relative to the reference's largest magnitude. */
export function relMaxDiff(native: Float32Array, ref: Float64Array): { rel: number; scale: number } {
  expect(native.length).toBe(ref.length);
  let scale = 0;
  let diff = 0;
  for (let i = 0; i < ref.length; i++) {
    expect(Number.isFinite(native[i]!), `value ${i}`).toBe(true);
    scale = Math.max(scale, Math.abs(ref[i]!));
    diff = Math.max(diff, Math.abs(native[i]! - ref[i]!));
  }
  return { rel: diff / scale, scale };
}

export function logSoftmax(logits: Float64Array): Float64Array {
  let max = -Infinity;
  for (const v of logits) max = Math.max(max, v);
  let sum = 0;
  for (const v of logits) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return logits.map((v) => v - lse);
}

/**
 * The engine's greedy tokens (with logprobs) against a reference fed the same tokens: `logits` are
 * the reference's after the prompt, `step` feeds it one token. At each position the engine's token
 * is the reference's best, or within `nearTie` of it, and its logprob is the reference's to
 * `logprobTol`. Returns the largest logprob difference.
 */
export function expectTeacherForced(logits: Float64Array, step: (token: number) => Float64Array, result: GenerateResult,
  tol: { nearTie: number; logprobTol: number }): number {
  let maxDiff = 0;
  result.tokenIds.forEach((token, i) => {
    const lp = logSoftmax(logits);
    let best = 0;
    for (let v = 1; v < lp.length; v++) if (lp[v]! > lp[best]!) best = v;
    expect(lp[best]! - lp[token]!, `position ${i}: engine ${token}, reference ${best}`).toBeLessThanOrEqual(tol.nearTie);
    const diff = Math.abs(result.logprobs![i]!.logprob - lp[token]!);
    maxDiff = Math.max(maxDiff, diff);
    expect(diff, `logprob at position ${i}`).toBeLessThan(tol.logprobTol);
    logits = step(token);
  });
  return maxDiff;
}
