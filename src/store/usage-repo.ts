// The usage ledger: rows are only ever inserted (by a request's end), never updated; the unique
// constraints on id and on (surface, request_id) keep exactly one row per request, whichever
// replica or retry writes it.

import type { Sql } from './sql-driver.js';
import type { UsageLedger, UsageRecord } from './store.js';
import { usageRecord } from './store-rows.js';

/** The statements a unit of work (sql-store.ts) runs inside its transaction. */
export const usageRows = {
  /** False when the request's row is recorded already (it is kept as it is). */
  async insert(db: Sql, r: UsageRecord): Promise<boolean> {
    return (await db.run(`INSERT INTO usage_ledger (id, org_id, org_name, key_id, model, tier, surface, request_id, input_tokens,
        cached_tokens, output_tokens, input_cost, cached_cost, output_cost, cost, long_context, completed_at_ms)
      VALUES (:id, :orgId, :orgName, :keyId, :model, :tier, :surface, :requestId, :inputTokens, :cachedTokens, :outputTokens,
        :inputCost, :cachedCost, :outputCost, :cost, :longContext, :completedAtMs) ON CONFLICT DO NOTHING`, { ...r })) === 1;
  },
};

export function usageLedger(db: Sql): UsageLedger {
  return {
    async listUsage(filter) {
      const where = [filter.orgName !== undefined && 'org_name = :orgName', filter.sinceMs !== undefined && 'completed_at_ms >= :sinceMs']
        .filter(Boolean);
      const rows = await db.all(`SELECT * FROM usage_ledger ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY seq`, { ...filter });
      return rows.map(usageRecord);
    },
  };
}
