// A seeded, ShareGPT-like request workload for the throughput bench: input and output lengths
// in tokens drawn from clipped log-normal distributions whose means match the ShareGPT V3 sample
// that vLLM's and SGLang's throughput figures use (about 202 input and 179 output tokens per
// request on Llama-3 tokenizers), with the long right tail real conversations have.
//
// The distribution, stated here so that runs can be compared:
//   input  ~ LogNormal(mu_in, 1.0)  clipped to [4, 1024] tokens, mu_in chosen so the clipped mean is 202;
//   output ~ LogNormal(mu_out, 1.1) clipped to [4, 1024] tokens, mu_out chosen so the clipped mean is 179.
// (ShareGPT's own lengths have medians well under their means and a few conversations past 1,000
// tokens; these sigmas give medians of about 130 / 105 tokens, and just over 1% of requests reach
// the 1,024 clip on each side.)
// `scale` multiplies every length (the CPU runs use a quarter) and `maxTotal` bounds input + output
// (a model's context), cutting the output first.

/** A small, fast, seeded PRNG (mulberry32): the same seed gives the same workload everywhere. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A standard normal variate (Box-Muller; one of the pair). */
function normal(random: () => number): number {
  const u = Math.max(random(), 1e-12);
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
}

export interface LengthDistribution {
  /** Target mean of the clipped distribution, in tokens. */
  mean: number;
  sigma: number;
  min: number;
  max: number;
}

export const SHAREGPT_INPUT: LengthDistribution = { mean: 202, sigma: 1.0, min: 4, max: 1024 };
export const SHAREGPT_OUTPUT: LengthDistribution = { mean: 179, sigma: 1.1, min: 4, max: 1024 };

const clip = (x: number, d: LengthDistribution) => Math.min(d.max, Math.max(d.min, Math.round(x)));

/**
 * The mu of the log-normal whose clipped samples average `d.mean`: bisection on a fixed set of
 * normal variates (deterministic, independent of the workload's seed).
 */
export function solveMu(d: LengthDistribution, samples = 20_000): number {
  const random = mulberry32(12345);
  const z = Array.from({ length: samples }, () => normal(random));
  const meanAt = (mu: number) => z.reduce((s, v) => s + clip(Math.exp(mu + d.sigma * v), d), 0) / samples;
  let lo = Math.log(d.min), hi = Math.log(d.max);
  for (let i = 0; i < 60; i++) {
    const mid = (lo + hi) / 2;
    if (meanAt(mid) < d.mean) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

export interface WorkloadRequest {
  /** Position in the workload (also the request's sampling seed). */
  index: number;
  inputTokens: number;
  outputTokens: number;
}

export interface WorkloadOptions {
  requests: number;
  seed: number;
  /** Multiplies every length (1 = ShareGPT's; the CPU runs use 0.25). */
  scale?: number;
  /** Input + output at most this (a model's context); the output is cut first, then the input. */
  maxTotal?: number;
  input?: LengthDistribution;
  output?: LengthDistribution;
}

export function sharegptWorkload(opts: WorkloadOptions): WorkloadRequest[] {
  const scale = opts.scale ?? 1;
  const inD = opts.input ?? SHAREGPT_INPUT, outD = opts.output ?? SHAREGPT_OUTPUT;
  const [muIn, muOut] = [solveMu(inD), solveMu(outD)];
  const random = mulberry32(opts.seed);
  const maxTotal = opts.maxTotal ?? Infinity;
  return Array.from({ length: opts.requests }, (_, index) => {
    let inputTokens = Math.max(1, Math.round(scale * clip(Math.exp(muIn + inD.sigma * normal(random)), inD)));
    let outputTokens = Math.max(1, Math.round(scale * clip(Math.exp(muOut + outD.sigma * normal(random)), outD)));
    if (inputTokens + outputTokens > maxTotal) {
      outputTokens = Math.max(1, Math.min(outputTokens, maxTotal - inputTokens));
      inputTokens = Math.max(1, Math.min(inputTokens, maxTotal - outputTokens));
    }
    return { index, inputTokens, outputTokens };
  });
}

/** Mean, median, p99 and max of a list of lengths. */
export function lengthSummary(xs: number[]) {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
  return { mean: s.reduce((a, b) => a + b, 0) / Math.max(1, s.length), p50: at(0.5), p99: at(0.99), max: s[s.length - 1] ?? NaN };
}
