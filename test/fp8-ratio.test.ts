// bench/fp8-ratio.ts: issue 33's FP8 / bf16 ratios from two results of one bench, as the device
// check's engine-8b-fp8 and throughput-fp8 phases compute them.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

import { compareEngine, compareKv, compareThroughput } from '../bench/fp8-ratio.js';

type Json = Record<string, unknown>;

// A bench:engine --backend cuda result on the 8B from an H200 (bf16, our GEMM), and an FP8 twin of
// it: decode twice as fast at batch 1, the KV pool 10% larger in bytes and e4m3 (twice the blocks per byte).
const bf16 = JSON.parse(readFileSync('bench/results/engine-cuda-llama-3.1-8b-h200.json', 'utf8')) as Json;
const fp8Of = (r: Json): Json => {
  const m = (r.models as Json[])[0]!;
  const info = m.info as Json;
  const kvCacheBytes = Math.round((info.kvCacheBytes as number) * 1.1);
  return { ...r, models: [{ ...m,
    info: { ...info, weightDtype: 'f8_e4m3', kvCacheDtype: 'f8_e4m3', kvCacheBytes,
      numBlocks: Math.round(((info.numBlocks as number) / (info.kvCacheBytes as number)) * kvCacheBytes * 2) },
    rows: (m.rows as Json[]).map((row) => ({ ...row, decodeTokensPerS: (row.decodeTokensPerS as number) * (row.batch === 1 ? 2 : 1.2),
      decodeTokensPerSMedian: (row.decodeTokensPerSMedian as number) * 1.5 })),
  }] };
};

describe('fp8-ratio', () => {
  it('compares batch sizes of two bench:engine --backend cuda results', () => {
    const info = (bf16.models as Json[])[0]!.info as Json;
    const c = compareEngine({ ...bf16, models: [{ ...(bf16.models as Json[])[0]!, info: { ...info, kvCacheDtype: 'bf16' } }] }, fp8Of(bf16));
    expect(c.preset).toBe('llama-3.1-8b');
    expect(c.rows.map((r) => r.batch)).toEqual(((bf16.models as Json[])[0]!.rows as Json[]).map((r) => r.batch));
    expect(c.batch1DecodeRatio).toBeCloseTo(2, 9);
    expect(c.batch1DecodeMet).toBe(true);
    expect(c.rows.find((r) => r.batch !== 1)!.decodeRatio).toBeCloseTo(1.2, 9);
    expect(c.rows[0]!.decodeMedianRatio).toBeCloseTo(1.5, 9);
    expect(c.rows[0]!.prefillRatio).toBeCloseTo(1, 9);
    expect(c.kv.numBlocksRatio).toBeCloseTo(2.2, 3);
    expect(c.kv.blocksPerByteRatio).toBeCloseTo(2, 3);
    expect(c.kv.met).toBe(true);
  });

  it('reports a batch-1 decode under 1.7x as not met, and no batch 1 as not measured', () => {
    const slow = fp8Of(bf16);
    const m = (slow.models as Json[])[0]!;
    const b1 = (bf16.models as Json[])[0]!.rows as Json[];
    m.rows = b1.map((row) => ({ ...row, decodeTokensPerS: (row.decodeTokensPerS as number) * 1.5 }));
    expect(compareEngine(bf16, slow).batch1DecodeMet).toBe(false);
    m.rows = b1.filter((row) => row.batch !== 1);
    const none = compareEngine(bf16, slow);
    expect(none.batch1DecodeRatio).toBeNull();
    expect(none.batch1DecodeMet).toBeNull();
  });

  it('checks twice the blocks per byte only for a bf16 cache against an e4m3 one', () => {
    const pool = (kvCacheDtype: string, numBlocks: number, kvCacheBytes: number) => ({ kvCacheDtype, weightDtype: 'bf16', numBlocks, kvCacheBytes });
    expect(compareKv(pool('bf16', 1000, 1e9), pool('f8_e4m3', 2000, 1e9)).met).toBe(true);
    expect(compareKv(pool('bf16', 1000, 1e9), pool('f8_e4m3', 1500, 1e9)).met).toBe(false);
    // The dry run's CPU cache is f32: 4x per byte, no verdict on the bf16 target.
    const cpu = compareKv(pool('f32', 1024, 1 << 26), pool('f8_e4m3', 4096, 1 << 26));
    expect(cpu.blocksPerByteRatio).toBe(4);
    expect(cpu.met).toBeNull();
    // Results written before numBlocks was recorded.
    const old = compareKv({ kvCacheDtype: null, weightDtype: null, numBlocks: null, kvCacheBytes: null }, pool('f8_e4m3', 2, 1));
    expect(old.numBlocksRatio).toBeNull();
    expect(old.met).toBeNull();
  });

  it('compares the offline phases of two bench:throughput results', () => {
    const result = (tps: Record<string, number>, engine: Json) => ({
      bench: 'throughput', engine,
      results: [...Object.entries(tps).map(([phase, outputTokensPerS]) => ({ phase, outputTokensPerS })),
        { phase: 'poisson', rate: 10, outputTokensPerS: 1 }],
    });
    const c = compareThroughput(
      result({ engine: 1000, chat: 950, batch: 900 }, { kvCacheDtype: 'bf16', numBlocks: 100, kvCacheBytes: 1000 }),
      result({ engine: 1400, chat: 1200 }, { kvCacheDtype: 'f8_e4m3', numBlocks: 220, kvCacheBytes: 1100 }));
    expect(c.rows.map((r) => [r.phase, r.ratio])).toEqual([['engine', 1.4], ['chat', 1200 / 950]]);
    expect(c.engineRatio).toBeCloseTo(1.4, 9);
    expect(c.engineMet).toBe(true);
    expect(c.kv.blocksPerByteRatio).toBeCloseTo(2, 9);
    expect(c.kv.met).toBe(true);
  });

  it('names the result that is not of the mode asked for', () => {
    expect(() => compareEngine({ results: [] }, bf16)).toThrow(/bf16 result has no models/);
    expect(() => compareThroughput({ results: [] }, bf16)).toThrow(/fp8 result has no results/);
  });
});
