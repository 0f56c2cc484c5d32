// Drives the native engine directly, step by step, for tests that need exact control over
// batching and chunking (the facade's batcher is tested separately).
import type { NativeEngineHandle, NativeSamplingParams } from '../../src/engine/native-types.js';

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
  // With the prefix cache on, a repeated prompt starts after its cached blocks.
  const remaining = prompts.map((p, i) => p.length - engine.addSequence(ids[i]!, Int32Array.from(p), sampling));
  const out: NativeRun = { tokens: [], logprobs: [], topIds: [], topLogprobs: [] };
  try {
    while (out.tokens.length < n) {
      const counts = remaining.map((r) => (r > 0 ? Math.min(r, chunk) : 1));
      counts.forEach((c, i) => (remaining[i] = Math.max(0, remaining[i]! - c)));
      const res = await engine.step({ seqIds: Uint32Array.from(ids), numTokens: Uint32Array.from(counts) });
      for (let j = 0; j < res.seqIds.length; j++) {
        if (res.seqIds[j] !== ids[0]) continue;
        out.tokens.push(res.tokens[j]!);
        out.logprobs.push(res.logprobs[j]!);
        out.topIds.push(Array.from(res.topIds.subarray(j * res.topN, (j + 1) * res.topN)));
        out.topLogprobs.push(Array.from(res.topLogprobs.subarray(j * res.topN, (j + 1) * res.topN)));
      }
    }
  } finally {
    ids.forEach((id) => engine.freeSequence(id));
  }
  return out;
}
