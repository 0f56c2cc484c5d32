// Drives the native engine directly, step by step, for tests that need exact control over
// batching and chunking (the facade's batcher is tested separately).
import type { NativeEngineHandle, NativeSamplingParams, NativeStepPlan } from '../../src/native/native-types.js';

export const GREEDY: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 5 };

export interface NativeRun {
  tokens: number[];
  logprobs: number[];
  topIds: number[][];
  topLogprobs: number[][];
}

/**
 * Generates `n` tokens for `prompt` (sequence under test) alongside `companions` other prompts,
 * prefilling every prompt in chunks of at most `chunk` tokens per step.
 */
export async function runNative(
  engine: NativeEngineHandle,
  prompt: number[],
  n: number,
  opts: { companions?: number[][]; chunk?: number; sampling?: NativeSamplingParams } = {},
): Promise<NativeRun> {
  const prompts = [prompt, ...(opts.companions ?? [])];
  const chunk = opts.chunk ?? 1 << 20;
  const sampling = opts.sampling ?? GREEDY;
  const baseId = 1000 + Math.floor(Math.random() * 1e6);
  const ids = prompts.map((_, i) => baseId + i);
  // Every row asks for `chunk` tokens: the engine computes min(chunk, what is left), so a
  // prompt is prefilled in chunks (after its prefix-cache hit) and then decodes one per step.
  const counts = new Uint32Array(ids.length).fill(Math.min(chunk, 2 ** 32 - 1));
  const seqIds = Uint32Array.from(ids);
  let adds: NativeStepPlan['adds'] = prompts.map((p, i) => ({ seqId: ids[i]!, promptTokens: Int32Array.from(p), sampling }));
  const out: NativeRun = { tokens: [], logprobs: [], topIds: [], topLogprobs: [] };
  try {
    while (out.tokens.length < n) {
      const res = await engine.step({ seqIds, numTokens: counts, adds });
      adds = undefined;
      if (res.errors.length > 0) throw new Error(`runNative: ${res.errors.map((e) => `${e.seqId} ${e.code}: ${e.message}`).join('; ')}`);
      if (res.addStatus.some((s) => s !== 0) || res.rowStatus.some((s) => s !== 0)) throw new Error('runNative: the KV pool is too small');
      for (let j = 0; j < res.seqIds.length; j++) {
        if (res.seqIds[j] !== ids[0]) continue;
        out.tokens.push(res.tokens[j]!);
        out.logprobs.push(res.logprobs[j]!);
        out.topIds.push(Array.from(res.topIds.subarray(j * res.topN, (j + 1) * res.topN)));
        out.topLogprobs.push(Array.from(res.topLogprobs.subarray(j * res.topN, (j + 1) * res.topN)));
      }
    }
  } finally {
    await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: seqIds });
  }
  return out;
}
