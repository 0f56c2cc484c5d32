// Compares a native engine's greedy continuation and logprobs with the independent float64
// reference (test/reference), shared by the CPU and CUDA suites.
import { expect } from 'vitest';

import type { NativeEngineHandle } from '../../src/engine/native-types.js';
import { type ReferenceModel, loadReferenceModel, logSoftmax, referenceGreedyDetailed, referenceLogits } from '../reference/reference-model.js';
import { runNative } from './native-run.js';

export const GENERATE = 40;

export function promptFor(vocab: number, len: number, salt: number): number[] {
  return Array.from({ length: len }, (_, i) => (i * 37 + salt * 101 + 5) % Math.min(vocab, 2000));
}

/**
 * Generates greedily with the engine and compares with the reference: the continuation must
 * match up to the first near tie (reported), and every logprob the engine reports must be
 * within `tol` of the reference's, teacher-forced on the engine's own tokens.
 */
export async function compareWithReference(engine: NativeEngineHandle, dir: string, label: string, tol: number, nearTie: number) {
  const ref = loadReferenceModel(dir);
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
