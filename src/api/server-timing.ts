// The engine's timings as a Server-Timing header, for the generation routes that do not stream.

import type { Timings } from '../engine/request.js';

/**
 * queue (submitted until the first scheduled step), prefill (until the first token: queue +
 * prefill = time to first token) and decode, in ms. Benchmarks and operators read TTFT from it.
 * Several choices (n > 1) report the first one's TTFT (the earliest first token) and the longest
 * decode.
 */
export function serverTiming(timings: Timings[]): string {
  let first = timings[0]!;
  let decodeMs = 0;
  for (const t of timings) {
    if (t.queuedMs + t.prefillMs < first.queuedMs + first.prefillMs) first = t;
    decodeMs = Math.max(decodeMs, t.decodeMs);
  }
  return `queue;dur=${first.queuedMs.toFixed(2)}, prefill;dur=${first.prefillMs.toFixed(2)}, decode;dur=${decodeMs.toFixed(2)}`;
}
