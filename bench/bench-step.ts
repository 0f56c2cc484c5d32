// What the engine benches (bench/engine.ts, engine-onnx.ts, engine-cuda.ts) share about driving a
// handle's steps and summarizing rounds.
import { ADD_ADMITTED, ROW_RAN, type NativeStepResult } from '../src/native/native-types.js';

/**
 * Throws unless every row ran and every add was admitted: a bench's KV pool must hold all of its
 * sequences. `raise` names the setting that grows the pool (e.g. '--kv-gib').
 */
export function checkBenchStep(res: NativeStepResult, raise: string): NativeStepResult {
  if (res.errors.length > 0) throw new Error(`bench step: ${res.errors.map((e) => `${e.seqId} ${e.code}: ${e.message}`).join('; ')}`);
  if (res.addStatus.some((s) => s !== ADD_ADMITTED) || res.rowStatus.some((s) => s !== ROW_RAN)) {
    throw new Error(`bench step: the KV pool is too small (raise ${raise})`);
  }
  return res;
}

/** The upper middle value (the middle one of an odd count). */
export const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
