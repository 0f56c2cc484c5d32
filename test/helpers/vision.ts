// What the vision tests share: a deterministic test image, and the teacher-forced comparison of an
// engine's greedy output with a float64 reference session.

import { expect } from 'vitest';
import type { GenerateResult } from '../../src/engine/request.js';

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
