// Compares a native engine's greedy continuation and logprobs with the independent float64
// reference (test/reference), shared by the CPU and CUDA suites.
import { expect } from 'vitest';

import type { NativeEngineHandle } from '../../src/native/native-types.js';
import { type ReferenceModel, loadReferenceModel, logSoftmax, referenceGreedyDetailed, referenceLogits } from '../reference/reference-model.js';
import { runNative } from './native-run.js';

export const GENERATE = 40;

export type Dtype = 'f32' | 'f16' | 'bf16';

/** Every (preset, checkpoint dtype) the reference tests cover: the native engine's, int8's and the ONNX exports'. */
export const REFERENCE_VARIANTS: Array<[string, Dtype]> = [
  ['test-llama', 'f32'],
  ['test-llama', 'bf16'],
  ['test-llama-linear', 'f32'],
  ['test-llama-linear', 'bf16'],
  ['test-qwen2', 'f32'],
  ['test-qwen2', 'bf16'],
  ['test-qwen3', 'f32'],
  ['test-qwen3', 'bf16'],
  ['test-mistral', 'f16'],
];

// Tolerances on log-probabilities (natural log units) between the engine (default matmul
// precision 'f32') and the reference. Observed worst cases on these models are in brackets.
// - f32 / f16 weights: f32 arithmetic (f16 widens exactly): 5e-4 [4e-5].
// - bf16 weights: on AVX512-BF16 the activations enter vdpbf16ps as two bf16 terms (~16
//   mantissa bits): 5e-3 [6e-4]. Elsewhere the weights widen to f32 and f32 numbers apply.
export const LOGPROB_TOL: Record<Dtype, number> = { f32: 5e-4, f16: 5e-4, bf16: 5e-3 };
// A greedy step whose reference top-1/top-2 logit gap is below this is a near tie that rounding
// may legitimately decide; the test reports it instead of failing. 0 for f32 / f16: there the
// continuation must equal the reference's outright.
export const NEAR_TIE_GAP: Record<Dtype, number> = { f32: 0, f16: 0, bf16: 5e-3 };

export function promptFor(vocab: number, len: number, salt: number): number[] {
  return Array.from({ length: len }, (_, i) => (i * 37 + salt * 101 + 5) % Math.min(vocab, 2000));
}

/**
 * Generates greedily with the engine and compares with the reference: the continuation must
 * match up to the first near tie (reported), and every logprob the engine reports must be
 * within `tol` of the reference's, teacher-forced on the engine's own tokens.
 */
export async function compareWithReference(engine: NativeEngineHandle, dir: string, label: string, tol: number, nearTie: number,
  ref: ReferenceModel = loadReferenceModel(dir)) {
  const prompt = promptFor(engine.info().vocabSize, 11, 1);
  const got = await runNative(engine, prompt, GENERATE);
  const want = referenceGreedyDetailed(ref, prompt, GENERATE);

  const diverged = got.tokens.findIndex((t, i) => t !== want.tokens[i]);
  if (diverged >= 0) {
    const gap = want.gaps[diverged]!;
    expect(gap, `${label}: diverged at step ${diverged} with reference top-2 gap ${gap}`).toBeLessThan(nearTie);
    console.warn(`${label}: near tie at step ${diverged} (reference gap ${gap.toExponential(2)}); tokens agree before it`);
  } else {
    expect(got.tokens).toEqual(want.tokens);
  }
  const logits = referenceLogits(ref, [...prompt, ...got.tokens.slice(0, -1)]);
  let worst = 0;
  for (let i = 0; i < got.tokens.length; i++) {
    const lsm = logSoftmax(logits[prompt.length - 1 + i]!);
    worst = Math.max(worst, Math.abs(got.logprobs[i]! - lsm[got.tokens[i]!]!));
    got.topIds[i]!.forEach((id, k) => {
      worst = Math.max(worst, Math.abs(got.topLogprobs[i]![k]! - lsm[id]!));
    });
  }
  expect(worst, `${label}: worst logprob difference`).toBeLessThan(tol);
}


export interface AgreementStats {
  /** Next-token predictions compared. */
  positions: number;
  /** Positions where the engine's top-1 is the reference's. */
  agree: number;
  /** Disagreements at a reference top-1/top-2 logit gap under the near-tie threshold (excused). */
  nearTies: number;
  /** Largest and mean |engine - reference| over the logprobs the engine reports (its pick and top-5). */
  maxDiff: number;
  meanDiff: number;
}

/**
 * Teacher-forced agreement with a reference model: along the reference's own greedy
 * continuation of each prompt, the engine predicts every next token from the same prefix, so one
 * early difference does not decide the rest. For approximate engines (quantized weights), whose
 * continuation may legitimately part from the reference's.
 */
export async function teacherForcedAgreement(engine: NativeEngineHandle, ref: ReferenceModel, prompts: number[][], n: number,
  nearTie: number): Promise<AgreementStats> {
  const stats: AgreementStats = { positions: 0, agree: 0, nearTies: 0, maxDiff: 0, meanDiff: 0 };
  let sum = 0, count = 0;
  for (const prompt of prompts) {
    const want = referenceGreedyDetailed(ref, prompt, n);
    const logits = referenceLogits(ref, [...prompt, ...want.tokens.slice(0, -1)]);
    for (let i = 0; i < n; i++) {
      const got = await runNative(engine, [...prompt, ...want.tokens.slice(0, i)], 1);
      const lsm = logSoftmax(logits[prompt.length - 1 + i]!);
      stats.positions++;
      if (got.tokens[0] === want.tokens[i]) stats.agree++;
      else if (want.gaps[i]! < nearTie) stats.nearTies++;
      const diffs = [Math.abs(got.logprobs[0]! - lsm[got.tokens[0]!]!), ...got.topIds[0]!.map((id, k) => Math.abs(got.topLogprobs[0]![k]! - lsm[id]!))];
      for (const d of diffs) {
        stats.maxDiff = Math.max(stats.maxDiff, d);
        sum += d;
        count++;
      }
    }
  }
  stats.meanDiff = sum / count;
  return stats;
}
