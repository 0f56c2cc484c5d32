// The dashboard's pure parts: rates between reads of counter totals (with a clock of our own), the
// plots' history ring (samples of what fake engines report, on clocks of our own), the
// recent-requests ring, the per-organization sums of a usage report (exact decimals), and the
// reading of a real ServiceMetrics registry through prom-client's JSON.

import { describe, expect, it } from 'vitest';
import { RateMeter, readModels, readTotals, usageByOrganization } from '../src/dashboard/dashboard-data.js';
import { DashboardHistory } from '../src/dashboard/history.js';
import type { EngineObserver } from '../src/engine/engine-events.js';
import { RecentRequests, type RecentRequest } from '../src/metrics/recent-requests.js';
import { ServiceMetrics } from '../src/metrics/service-metrics.js';
import type { UsageReport } from '../src/billing/usage-report.js';

describe('RateMeter', () => {
  it('has no rate on the first read, then compares with the newest read at least the window old', () => {
    let now = 0;
    const meter = new RateMeter<'tokens'>(10_000, () => now);
    expect(meter.sample({ tokens: 0 })).toBeNull();
    now = 2_000;
    // Only one earlier read: the rate is since it.
    expect(meter.sample({ tokens: 100 })).toEqual({ seconds: 2, perSecond: { tokens: 50 } });
    // Reads every 2 s: the base moves to the newest read at least 10 s old (t = 2 s at t = 12 s).
    for (const [t, tokens] of [[4_000, 200], [6_000, 300], [8_000, 400], [10_000, 500]] as const) {
      now = t;
      meter.sample({ tokens });
    }
    now = 12_000;
    expect(meter.sample({ tokens: 1100 })).toEqual({ seconds: 10, perSecond: { tokens: 100 } });
    // A read after a long pause compares with the last read before it.
    now = 72_000;
    expect(meter.sample({ tokens: 1100 + 600 })).toEqual({ seconds: 60, perSecond: { tokens: 10 } });
  });

  it('gives no rate for two reads at the same instant', () => {
    const meter = new RateMeter<'n'>(10_000, () => 5);
    meter.sample({ n: 1 });
    expect(meter.sample({ n: 2 })).toBeNull();
  });
});

describe('RecentRequests', () => {
  const entry = (i: number): RecentRequest => ({
    time: new Date(i).toISOString(), request_id: `r${i}`, method: 'GET', route: '/v1/models', status: 200,
    organization: 'o', tokens: null, duration_ms: i,
  });

  it('lists newest first and keeps only the last `capacity`', () => {
    const ring = new RecentRequests(3);
    expect(ring.list()).toEqual([]);
    ring.record(entry(1));
    ring.record(entry(2));
    expect(ring.list().map((e) => e.request_id)).toEqual(['r2', 'r1']);
    for (let i = 3; i <= 7; i++) ring.record(entry(i));
    expect(ring.list().map((e) => e.request_id)).toEqual(['r7', 'r6', 'r5']);
  });

  it('refuses a capacity that is not a positive integer', () => {
    expect(() => new RecentRequests(0)).toThrow(RangeError);
    expect(() => new RecentRequests(1.5)).toThrow(RangeError);
  });
});

describe('usageByOrganization', () => {
  it('sums every model and tier of an organization, costs as exact decimals', () => {
    const row = (organization: string, model: string, tier: string, requests: number, cost: string) => ({
      organization, model, tier, requests, input_tokens: 10 * requests, cached_tokens: requests, output_tokens: 3 * requests,
      cost, cost_usd: Number(cost),
    });
    const report: UsageReport = {
      object: 'usage_report', organization: null, since: null,
      data: [
        row('acme', 'tiny', 'asap', 1, '0.1'), row('acme', 'tiny', 'standard', 2, '0.2'),
        row('beta', 'tiny', 'flex', 4, '0.000000000001'),
      ],
      total: { requests: 7, input_tokens: 70, cached_tokens: 7, output_tokens: 21, cost: '0.300000000001', cost_usd: 0.300000000001 },
    };
    const usage = usageByOrganization(report);
    expect(usage.organizations).toEqual([
      { organization: 'acme', requests: 3, input_tokens: 30, cached_tokens: 3, output_tokens: 9, cost: '0.3', cost_usd: 0.3 },
      { organization: 'beta', requests: 4, input_tokens: 40, cached_tokens: 4, output_tokens: 12, cost: '0.000000000001', cost_usd: 1e-12 },
    ]);
    expect(usage.total).toBe(report.total);
  });
});

describe('reading the registry', () => {
  it('reads the totals and, per model, the queues and KV pool from a ServiceMetrics registry', async () => {
    const metrics = new ServiceMetrics();
    const byWindow = {
      asap: { numRunning: 2, numWaiting: 1 }, standard: { numRunning: 0, numWaiting: 4 }, flex: { numRunning: 1, numWaiting: 0 },
    };
    let onRequestEnd: ((r: object) => void) | undefined;
    const engine = {
      schedulerStats: () => ({ byWindow, kvPool: { numTotalBlocks: 100, numFreeBlocks: 70, numEvictableBlocks: 20 } }),
      adapterStats: () => ({ known: 5, resident: 2, residentBytes: 3 << 20, budgetBytes: 4 << 20, loads: 9, evictions: 4 }),
      observe: (o: { onRequestEnd: (r: object) => void }) => { onRequestEnd = o.onRequestEnd; return () => {}; },
    };
    metrics.watchModels({ models: [{ id: 'tiny', engine }] } as never);
    onRequestEnd!({
      window: 'asap', outcome: 'finished', finishReason: 'length', queuedMs: 1, numPromptTokens: 12, numCachedTokens: 4,
      numGeneratedTokens: 5, firstTokenMs: 2, e2eMs: 3, decodeMs: 1,
    });
    metrics.observeHttp('/v1/chat/completions', 'POST', 200, 'acme', 0.01);
    const read = await metrics.registry.getMetricsAsJSON();
    expect(readTotals(read)).toEqual({
      http_requests: 1, generations: 1, prompt_tokens: 12, cached_tokens: 4, generation_tokens: 5, computed_tokens: 0,
    });
    expect(readModels(read)).toEqual([{
      model: 'tiny',
      windows: [{ window: 'asap', running: 2, waiting: 1 }, { window: 'standard', running: 0, waiting: 4 }, { window: 'flex', running: 1, waiting: 0 }],
      kv_blocks: { used: 30, cached: 20, free: 50 },
      kv_usage_ratio: 0.3,
      lora: { resident: 2, retired: 3, resident_bytes: 3 << 20, loads: 9, evictions: 4 },
    }]);
  });
});

/** An engine as the history sees it: observers it reports to, and queue counts we set. */
function fakeEngine() {
  const observers = new Set<EngineObserver>();
  const engine = {
    running: 0,
    waiting: 0,
    observe(o: EngineObserver) { observers.add(o); return () => { observers.delete(o); }; },
    schedulerStats() { return { numRunning: engine.running, numWaiting: engine.waiting } as never; },
    step(numSampledTokens: number) {
      for (const o of observers) o.onStep?.({ durationMs: 1, numRows: numSampledTokens, numComputedTokens: numSampledTokens, numPrefillTokens: 0, numSampledTokens, numVerifyingRows: 0, numDraftTokens: 0, numAcceptedTokens: 0, preempted: [], ok: true });
    },
    end() { for (const o of observers) o.onRequestEnd?.({} as never); },
    get numObservers() { return observers.size; },
  };
  return engine;
}

describe('DashboardHistory', () => {
  it('samples what the engines sampled and ended per interval, and the queues at its end, summed over engines', () => {
    let now = 1_000;
    let wall = Date.UTC(2026, 0, 1, 12, 0, 0);
    const history = new DashboardHistory({ intervalMs: 5_000, capacity: 10 }, () => now, () => wall);
    const a = fakeEngine();
    const b = fakeEngine();
    // Two ids on one checkpoint share an engine: it is counted once.
    history.watch({ models: [{ engine: a }, { engine: b }, { engine: a }] }, false);
    expect(a.numObservers).toBe(1);
    a.step(4); a.step(4); b.step(2); a.end(); b.end(); b.end();
    a.running = 3; b.running = 1; b.waiting = 5;
    now += 5_000; wall += 5_000;
    history.tick();
    a.running = 0; b.running = 0; b.waiting = 0;
    now += 2_500; wall += 2_500;
    history.tick();
    expect(history.samples()).toEqual([
      { time: '2026-01-01T12:00:05.000Z', seconds: 5, output_tokens: 10, output_tokens_per_s: 2, requests: 3, requests_per_s: 0.6, running: 4, waiting: 5 },
      { time: '2026-01-01T12:00:07.500Z', seconds: 2.5, output_tokens: 0, output_tokens_per_s: 0, requests: 0, requests_per_s: 0, running: 0, waiting: 0 },
    ]);
  });

  it('keeps only the newest `capacity` samples, oldest first, and hands out copies', () => {
    let now = 0;
    const history = new DashboardHistory({ intervalMs: 1_000, capacity: 3 }, () => now);
    const engine = fakeEngine();
    history.watch({ models: [{ engine }] }, false);
    for (let i = 1; i <= 7; i++) {
      engine.step(i);
      now += 1_000;
      history.tick();
    }
    const samples = history.samples();
    expect(samples.map((s) => s.output_tokens)).toEqual([5, 6, 7]);
    samples[0]!.output_tokens = 99;
    expect(history.samples()[0]!.output_tokens).toBe(5);
  });

  it('stops counting when stopped (twice is fine); the samples stay', () => {
    let now = 0;
    const history = new DashboardHistory({}, () => now);
    expect([history.intervalMs, history.capacity]).toEqual([5_000, 180]);
    const engine = fakeEngine();
    history.watch({ models: [{ engine }] }, false);
    engine.step(3);
    now = 5_000;
    history.tick();
    history.stop();
    history.stop();
    expect(engine.numObservers).toBe(0);
    engine.step(100);
    now = 10_000;
    history.tick();
    expect(history.samples().map((s) => s.output_tokens)).toEqual([3, 0]);
  });

  it('samples on its own timer once watching, and refuses intervals and capacities out of range', async () => {
    const history = new DashboardHistory({ intervalMs: 10 });
    const engine = fakeEngine();
    history.watch({ models: [{ engine }] });
    engine.step(1);
    for (let i = 0; i < 200 && history.samples().length < 3; i++) await new Promise((r) => setTimeout(r, 10));
    history.stop();
    const samples = history.samples();
    expect(samples.length).toBeGreaterThanOrEqual(3);
    expect(samples.reduce((n, s) => n + s.output_tokens, 0)).toBe(1);
    expect(samples.every((s) => s.seconds > 0)).toBe(true);
    for (const bad of [{ intervalMs: 5 }, { intervalMs: 1.5e7 }, { intervalMs: 100.5 }, { capacity: 0 }, { capacity: 100_001 }]) {
      expect(() => new DashboardHistory(bad)).toThrow(/must be an integer in/);
    }
  });
});
