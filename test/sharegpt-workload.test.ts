// The throughput bench's workload generator: seeded, ShareGPT-like means, bounded by the context.
import { describe, expect, it } from 'vitest';

import { lengthSummary, sharegptWorkload, SHAREGPT_INPUT, SHAREGPT_OUTPUT, solveMu } from '../bench/sharegpt-workload.js';

describe('sharegptWorkload', () => {
  it('has the stated means (within 3% over 5,000 requests), a long tail and the clip bounds', () => {
    const w = sharegptWorkload({ requests: 5000, seed: 1 });
    const input = lengthSummary(w.map((r) => r.inputTokens));
    const output = lengthSummary(w.map((r) => r.outputTokens));
    expect(Math.abs(input.mean - 202) / 202).toBeLessThan(0.03);
    expect(Math.abs(output.mean - 179) / 179).toBeLessThan(0.03);
    // Right-skewed: the median well under the mean, a tail near the clip.
    expect(input.p50).toBeLessThan(0.8 * input.mean);
    expect(output.p50).toBeLessThan(0.8 * output.mean);
    expect(input.p99).toBeGreaterThan(3 * input.mean);
    for (const r of w) {
      expect(r.inputTokens).toBeGreaterThanOrEqual(SHAREGPT_INPUT.min);
      expect(r.inputTokens).toBeLessThanOrEqual(SHAREGPT_INPUT.max);
      expect(r.outputTokens).toBeGreaterThanOrEqual(SHAREGPT_OUTPUT.min);
      expect(r.outputTokens).toBeLessThanOrEqual(SHAREGPT_OUTPUT.max);
    }
  });

  it('is the same for the same seed and differs for another', () => {
    const a = sharegptWorkload({ requests: 50, seed: 7 });
    expect(sharegptWorkload({ requests: 50, seed: 7 })).toEqual(a);
    expect(sharegptWorkload({ requests: 50, seed: 8 })).not.toEqual(a);
    expect(a.map((r) => r.index)).toEqual([...Array(50).keys()]);
  });

  it('scales lengths and keeps input + output within maxTotal', () => {
    const full = sharegptWorkload({ requests: 400, seed: 3 });
    const quarter = sharegptWorkload({ requests: 400, seed: 3, scale: 0.25 });
    quarter.forEach((r, i) => expect(r.inputTokens).toBe(Math.max(1, Math.round(0.25 * full[i]!.inputTokens))));
    const bounded = sharegptWorkload({ requests: 400, seed: 3, maxTotal: 300 });
    for (const r of bounded) {
      expect(r.inputTokens + r.outputTokens).toBeLessThanOrEqual(300);
      expect(r.outputTokens).toBeGreaterThanOrEqual(1);
    }
    expect(bounded.some((r, i) => r.outputTokens < full[i]!.outputTokens)).toBe(true);
  });

  it('solves mu so that a wider clip range keeps the mean', () => {
    const wide = { ...SHAREGPT_INPUT, max: 4096 };
    expect(solveMu(wide)).toBeLessThan(solveMu(SHAREGPT_INPUT));
  });
});
