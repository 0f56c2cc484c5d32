// What the dashboard shows, as one JSON object (GET /dashboard/data, api/dashboard-route.ts), built
// from what the service already keeps; nothing here counts anything itself:
//   - totals, queues per window and the KV pool: the metrics registry (metrics/service-metrics.ts),
//     read through prom-client's getMetricsAsJSON (which runs the gauges' collect, as a scrape does);
//   - throughput: differences of those counters between this read and an earlier one (RateMeter);
//   - recent requests: the access log's ring (metrics/recent-requests.ts);
//   - the last minutes' throughput and queues: the dashboard's own ring of samples (history.ts);
//   - per-organization usage and cost: the usage ledger, as GET /v1/admin/usage reports it, summed
//     per organization with exact decimals (billing/money.ts).
// It names every organization, so only admin keys may read it.

import type { Registry } from 'prom-client';
import type { UsageReport, UsageTotals } from '../billing/usage-report.js';
import { add, formatDecimal, parseDecimal, toNumber, ZERO, type Decimal } from '../billing/money.js';
import type { RecentRequest } from '../metrics/recent-requests.js';
import type { HistorySample } from './history.js';

/** Counter totals over every label: what the rates are computed from. */
export interface DashboardTotals {
  /** HTTP requests answered (every route, the dashboard's own polling included). */
  http_requests: number;
  /** Generations that ended, whatever the reason. */
  generations: number;
  prompt_tokens: number;
  cached_tokens: number;
  generation_tokens: number;
  /** Tokens the engines computed in their steps (prefill chunks and decodes): moves every step. */
  computed_tokens: number;
}

export interface DashboardThroughput {
  /** Seconds between the two reads the rates compare. */
  interval_seconds: number;
  generations_per_s: number;
  prompt_tokens_per_s: number;
  generation_tokens_per_s: number;
  computed_tokens_per_s: number;
}

export interface DashboardModel {
  model: string;
  /** Per completion window, in the scheduler's order (asap, standard, flex). */
  windows: { window: string; running: number; waiting: number }[];
  kv_blocks: { used: number; cached: number; free: number };
  kv_usage_ratio: number;
  /** LoRA adapters of the engine (only when it has had any): resident or retired, resident bytes, loads, evictions. */
  lora?: { resident: number; retired: number; resident_bytes: number; loads: number; evictions: number };
}

export interface OrganizationUsage extends UsageTotals {
  organization: string;
}

export interface DashboardData {
  object: 'dashboard';
  /** When this was read, ISO 8601. */
  time: string;
  totals: DashboardTotals;
  /** null on the first read (nothing to compare with yet). */
  throughput: DashboardThroughput | null;
  models: DashboardModel[];
  /**
   * The last minutes, for the plots: a sample every `interval_seconds`, at most `capacity` of them
   * (so the plots span interval_seconds × capacity), oldest first.
   */
  history: { interval_seconds: number; capacity: number; samples: HistorySample[] };
  /** Newest first. */
  recent_requests: RecentRequest[];
  /** The whole ledger, one row per organization (sorted by name), and the sum of all. */
  usage: { organizations: OrganizationUsage[]; total: UsageTotals };
}

type MetricsJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;
type MetricValue = MetricsJson[number]['values'][number] & { metricName?: string };

/** The values of metric `name` (for a histogram, those of its series `metricName`). */
function valuesOf(metrics: MetricsJson, name: string, metricName?: string): MetricValue[] {
  const family = metrics.find((m) => m.name === name);
  if (!family) return [];
  const values = family.values as MetricValue[];
  return metricName === undefined ? values : values.filter((v) => v.metricName === metricName);
}

const total = (values: MetricValue[]) => values.reduce((n, v) => n + v.value, 0);

export function readTotals(metrics: MetricsJson): DashboardTotals {
  return {
    http_requests: total(valuesOf(metrics, 'sluice_http_requests_total')),
    generations: total(valuesOf(metrics, 'sluice_requests_finished_total')),
    prompt_tokens: total(valuesOf(metrics, 'sluice_prompt_tokens_total')),
    cached_tokens: total(valuesOf(metrics, 'sluice_prompt_cached_tokens_total')),
    generation_tokens: total(valuesOf(metrics, 'sluice_generation_tokens_total')),
    computed_tokens: total(valuesOf(metrics, 'sluice_engine_step_tokens', 'sluice_engine_step_tokens_sum')),
  };
}

/** Per model: running and waiting per window, the KV pool. Models in the order the registry reports them. */
export function readModels(metrics: MetricsJson): DashboardModel[] {
  const byModel = new Map<string, DashboardModel>();
  const model = (name: string): DashboardModel => {
    let m = byModel.get(name);
    if (!m) byModel.set(name, (m = { model: name, windows: [], kv_blocks: { used: 0, cached: 0, free: 0 }, kv_usage_ratio: 0 }));
    return m;
  };
  const windowOf = (m: DashboardModel, window: string) => {
    let w = m.windows.find((x) => x.window === window);
    if (!w) m.windows.push((w = { window, running: 0, waiting: 0 }));
    return w;
  };
  for (const v of valuesOf(metrics, 'sluice_kv_cache_blocks')) {
    const blocks = model(String(v.labels.model)).kv_blocks;
    const state = String(v.labels.state);
    if (state === 'used' || state === 'cached' || state === 'free') blocks[state] = v.value;
  }
  for (const v of valuesOf(metrics, 'sluice_kv_cache_usage_ratio')) model(String(v.labels.model)).kv_usage_ratio = v.value;
  for (const v of valuesOf(metrics, 'sluice_requests_running')) windowOf(model(String(v.labels.model)), String(v.labels.window)).running = v.value;
  for (const v of valuesOf(metrics, 'sluice_requests_waiting')) windowOf(model(String(v.labels.model)), String(v.labels.window)).waiting = v.value;
  const lora = (m: DashboardModel) => (m.lora ??= { resident: 0, retired: 0, resident_bytes: 0, loads: 0, evictions: 0 });
  for (const v of valuesOf(metrics, 'sluice_lora_adapters')) {
    const state = String(v.labels.state);
    if (state === 'resident' || state === 'retired') lora(model(String(v.labels.model)))[state] = v.value;
  }
  for (const v of valuesOf(metrics, 'sluice_lora_resident_bytes')) lora(model(String(v.labels.model))).resident_bytes = v.value;
  for (const v of valuesOf(metrics, 'sluice_lora_loads_total')) lora(model(String(v.labels.model))).loads = v.value;
  for (const v of valuesOf(metrics, 'sluice_lora_evictions_total')) lora(model(String(v.labels.model))).evictions = v.value;
  return [...byModel.values()];
}

/**
 * Rates of counter totals between reads. Each read is kept as a sample; a rate compares the
 * current totals with the newest sample at least `windowMs` old (or, while none is that old, the
 * oldest one), so a page that polls every few seconds sees the rate over about the last `windowMs`,
 * and one that polls rarely the rate since its last poll. Older samples are dropped.
 */
export class RateMeter<K extends string> {
  // Oldest first; samples[0] is the only one that may be older than windowMs.
  private samples: { atMs: number; totals: Record<K, number> }[] = [];

  /** `now`: a milliseconds clock (tests inject one). */
  constructor(private readonly windowMs = 10_000, private readonly now: () => number = () => performance.now()) {}

  /** Records `totals` as read now; returns the per-second rates since the base sample, or null when there is none. */
  sample(totals: Record<K, number>): { seconds: number; perSecond: Record<K, number> } | null {
    const atMs = this.now();
    let baseIndex = 0;
    for (let i = 0; i < this.samples.length; i++) if (this.samples[i]!.atMs <= atMs - this.windowMs) baseIndex = i;
    this.samples = this.samples.slice(baseIndex);
    const base = this.samples[0];
    this.samples.push({ atMs, totals });
    if (base === undefined || atMs <= base.atMs) return null;
    const seconds = (atMs - base.atMs) / 1000;
    const perSecond = {} as Record<K, number>;
    for (const k of Object.keys(totals) as K[]) perSecond[k] = Math.max(0, totals[k] - base.totals[k]) / seconds;
    return { seconds, perSecond };
  }
}

export function throughputOf(meter: RateMeter<keyof DashboardTotals>, totals: DashboardTotals): DashboardThroughput | null {
  const rates = meter.sample(totals);
  if (rates === null) return null;
  const round = (n: number) => Math.round(n * 100) / 100;
  return {
    interval_seconds: round(rates.seconds),
    generations_per_s: round(rates.perSecond.generations),
    prompt_tokens_per_s: round(rates.perSecond.prompt_tokens),
    generation_tokens_per_s: round(rates.perSecond.generation_tokens),
    computed_tokens_per_s: round(rates.perSecond.computed_tokens),
  };
}

/** The usage report's rows (organization × model × tier) summed per organization, costs exactly. */
export function usageByOrganization(report: UsageReport): DashboardData['usage'] {
  const byOrg = new Map<string, { requests: number; input: number; cached: number; output: number; cost: Decimal }>();
  for (const row of report.data) {
    let acc = byOrg.get(row.organization);
    if (!acc) byOrg.set(row.organization, (acc = { requests: 0, input: 0, cached: 0, output: 0, cost: ZERO }));
    acc.requests += row.requests;
    acc.input += row.input_tokens;
    acc.cached += row.cached_tokens;
    acc.output += row.output_tokens;
    acc.cost = add(acc.cost, parseDecimal(row.cost));
  }
  // The report's rows are sorted by organization already, and Map keeps that order.
  const organizations = [...byOrg].map(([organization, a]) => ({
    organization, requests: a.requests, input_tokens: a.input, cached_tokens: a.cached, output_tokens: a.output,
    cost: formatDecimal(a.cost), cost_usd: toNumber(a.cost),
  }));
  return { organizations, total: report.total };
}
