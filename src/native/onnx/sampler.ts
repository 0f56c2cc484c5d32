// Token sampling for engines that compute logits outside the native library (the ONNX Runtime
// backend): the same rules, order and random stream as native/src/sample/sampler.cpp, so that a
// seeded request draws the same tokens from the same logits. Greedy takes the lowest id on ties;
// logprobs are log-softmax of the (masked) raw logits, temperature aside.

import type { NativeSamplingParams } from '../native-types.js';

const MASK64 = (1n << 64n) - 1n;
const GOLDEN = 0x9e3779b97f4a7c15n;

/** xoshiro256** seeded through splitmix64 (native Rng). */
class Rng {
  private readonly s: bigint[] = [];

  constructor(seed: bigint) {
    let x = seed & MASK64;
    for (let i = 0; i < 4; i++) {
      x = (x + GOLDEN) & MASK64;
      let z = x;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
      this.s.push(z ^ (z >> 31n));
    }
  }

  private static rotl(x: bigint, k: bigint): bigint {
    return ((x << k) | (x >> (64n - k))) & MASK64;
  }

  nextDouble(): number {
    const s = this.s;
    const result = (Rng.rotl((s[1]! * 5n) & MASK64, 7n) * 9n) & MASK64;
    const t = (s[1]! << 17n) & MASK64;
    s[2] = s[2]! ^ s[0]!;
    s[3] = s[3]! ^ s[1]!;
    s[1] = s[1]! ^ s[2]!;
    s[0] = s[0]! ^ s[3]!;
    s[2] = s[2]! ^ t;
    s[3] = Rng.rotl(s[3]!, 45n);
    return Number(result >> 11n) * 2 ** -53;
  }
}

/** The seed of a row's draw: the sequence's seed and its length at the draw (native engine.cpp). */
export function streamSeed(seed: bigint, numTokens: number): bigint {
  return (seed ^ ((GOLDEN * BigInt(numTokens)) & MASK64)) & MASK64;
}

export interface Sampled {
  token: number;
  logprob: number;
}

/**
 * Applies a token mask in place (bit v of `allow` = token v allowed; others become -inf); false
 * when it allows no token.
 */
export function applyMask(logits: Float32Array, allow: Uint32Array): boolean {
  let any = false;
  for (let v = 0; v < logits.length; v++) {
    if ((allow[v >>> 5]! >>> (v & 31)) & 1) any = true;
    else logits[v] = -Infinity;
  }
  return any;
}

/** Samples one token from `logits` [vocab]; fills topIds / topLogprobs [topN] when topN > 0. */
export function sampleToken(logits: Float32Array, params: NativeSamplingParams, seed: bigint, topN: number,
  topIds: Int32Array, topLogprobs: Float32Array): Sampled {
  const vocab = logits.length;
  let best = 0;
  let max = -Infinity;
  for (let v = 0; v < vocab; v++) if (logits[v]! > max) { max = logits[v]!; best = v; }
  let sum = 0;
  for (let v = 0; v < vocab; v++) sum += Math.exp(logits[v]! - max);
  const lse = Math.fround(max + Math.log(sum));
  const byLogit = (a: number, b: number) => logits[b]! - logits[a]! || a - b;

  let token = best;
  if (!(params.temperature <= 0 || params.topK === 1)) {
    const invT = 1 / Math.fround(params.temperature);
    const weight = (id: number) => (logits[id] === -Infinity ? 0 : Math.exp((logits[id]! - max) * invT));
    let keep = params.topK > 0 && params.topK < vocab ? params.topK : vocab;
    const minP = Math.fround(params.minP ?? 0);
    if (minP > 0) {
      // p >= minP * p_max, i.e. (logit - max) / T >= log(minP): a prefix of the sorted order.
      const logMinP = Math.log(minP);
      let above = 0;
      for (let v = 0; v < vocab; v++) if ((logits[v]! - max) * invT >= logMinP) above++;
      keep = Math.min(keep, above);
    }
    const nucleus = Math.fround(params.topP) < 1;
    const sorted = keep < vocab || nucleus;
    let order: number[] = [];
    if (sorted) {
      order = Array.from({ length: vocab }, (_, i) => i);
      order.sort(byLogit);
    }
    const probs: number[] = [];
    let total = 0;
    if (nucleus) {
      let all = 0;
      for (let i = 0; i < keep; i++) all += weight(order[i]!);
      const target = Math.fround(params.topP) * all;
      let cum = 0;
      let cut = keep;
      for (let i = 0; i < keep; i++) {
        probs.push(Math.fround(weight(order[i]!)));
        cum += probs[i]!;
        if (cum >= target) { cut = i + 1; break; }
      }
      keep = cut;
    } else {
      for (let i = 0; i < keep; i++) probs.push(Math.fround(weight(sorted ? order[i]! : i)));
    }
    for (let i = 0; i < keep; i++) total += probs[i]!;
    const u = new Rng(seed).nextDouble() * total;
    let acc = 0;
    let pick = keep - 1;
    for (let i = 0; i < keep; i++) {
      acc += probs[i]!;
      if (u < acc) { pick = i; break; }
    }
    token = sorted ? order[pick]! : pick;
  }

  if (topN > 0) {
    // The top N by a partial selection (N is small; the vocabulary is not).
    const top: number[] = [];
    for (let v = 0; v < vocab; v++) {
      if (top.length === topN && byLogit(v, top[top.length - 1]!) >= 0) continue;
      let at = top.length;
      while (at > 0 && byLogit(v, top[at - 1]!) < 0) at--;
      top.splice(at, 0, v);
      if (top.length > topN) top.pop();
    }
    for (let i = 0; i < topN; i++) {
      topIds[i] = i < top.length ? top[i]! : -1;
      topLogprobs[i] = i < top.length ? logits[top[i]!]! - lse : -Infinity;
    }
  }
  return { token, logprob: Math.fround(logits[token]! - lse) };
}
