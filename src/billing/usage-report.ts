// Usage totals from the ledger, per organization × model × tier: what `sluice usage` prints and
// GET /v1/admin/usage returns. Costs are summed exactly (money.ts) and rendered as decimal
// strings; `cost_usd` is a convenience number of that string, never used for arithmetic.

import { SluiceError } from '../errors.js';
import type { Store, UsageRecord } from '../store/store.js';
import { add, parseDecimal, toNumber, formatDecimal, type Decimal, ZERO } from './money.js';

export interface UsageTotals {
  requests: number;
  /** Every prompt token, cached ones included. */
  input_tokens: number;
  cached_tokens: number;
  output_tokens: number;
  /** Exact USD, a plain decimal string. */
  cost: string;
  cost_usd: number;
}

export interface UsageRow extends UsageTotals {
  organization: string;
  model: string;
  tier: string;
}

export interface UsageReport {
  object: 'usage_report';
  /** The filters: null when not given. `since` as ISO 8601. */
  organization: string | null;
  since: string | null;
  /** Sorted by organization, model, tier. */
  data: UsageRow[];
  total: UsageTotals;
}

/**
 * Parses `--since` / `?since=`: 'YYYY-MM-DD' (midnight UTC) or an ISO 8601 date-time with a
 * time zone. Returns Unix ms.
 */
export function parseSince(text: string): number {
  const dateOnly = /^\d{4}-\d{2}-\d{2}$/.test(text);
  const ms = dateOnly ? Date.parse(`${text}T00:00:00Z`)
    : /^\d{4}-\d{2}-\d{2}T[\d:.]+(Z|[+-]\d{2}:\d{2})$/.test(text) ? Date.parse(text) : NaN;
  if (Number.isNaN(ms) || (dateOnly && new Date(ms).toISOString().slice(0, 10) !== text)) {
    throw new SluiceError('invalid_argument',
      `since must be a date (YYYY-MM-DD, UTC) or an ISO 8601 date-time with a zone (got ${JSON.stringify(text)})`, { param: 'since' });
  }
  return ms;
}

interface Acc { requests: number; input: number; cached: number; output: number; cost: Decimal }

const totals = (a: Acc): UsageTotals => ({
  requests: a.requests, input_tokens: a.input, cached_tokens: a.cached, output_tokens: a.output,
  cost: formatDecimal(a.cost), cost_usd: toNumber(a.cost),
});

function accumulate(acc: Acc, r: UsageRecord): void {
  acc.requests += 1;
  acc.input += r.inputTokens;
  acc.cached += r.cachedTokens;
  acc.output += r.outputTokens;
  acc.cost = add(acc.cost, parseDecimal(r.cost));
}

const empty = (): Acc => ({ requests: 0, input: 0, cached: 0, output: 0, cost: ZERO });

export function summarizeUsage(records: Iterable<UsageRecord>, filter: { orgName?: string; sinceMs?: number } = {}): UsageReport {
  const groups = new Map<string, { org: string; model: string; tier: string; acc: Acc }>();
  const all = empty();
  for (const r of records) {
    const key = JSON.stringify([r.orgName, r.model, r.tier]);
    let g = groups.get(key);
    if (!g) groups.set(key, (g = { org: r.orgName, model: r.model, tier: r.tier, acc: empty() }));
    accumulate(g.acc, r);
    accumulate(all, r);
  }
  const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  const data = [...groups.values()]
    .sort((a, b) => cmp(a.org, b.org) || cmp(a.model, b.model) || cmp(a.tier, b.tier))
    .map((g) => ({ organization: g.org, model: g.model, tier: g.tier, ...totals(g.acc) }));
  return {
    object: 'usage_report',
    organization: filter.orgName ?? null,
    since: filter.sinceMs === undefined ? null : new Date(filter.sinceMs).toISOString(),
    data,
    total: totals(all),
  };
}

export async function usageReport(store: Store, filter: { orgName?: string; sinceMs?: number }): Promise<UsageReport> {
  return summarizeUsage(await store.listUsage(filter), filter);
}
