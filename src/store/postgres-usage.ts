// The usage ledger and the admin flag of API keys in the PostgreSQL store: PostgresStore delegates
// its "Usage ledger" methods here. Ledger rows are only ever inserted, never updated; the unique
// constraints on id and on (surface, request_id) keep exactly one row per request, whichever
// replica or retry writes it (ON CONFLICT DO NOTHING).

import type { Db } from './postgres-db.js';
import type { UsageRecord } from './store.js';
import { usageRecord } from './store-rows.js';

export const postgresUsage = {
  async insertUsage(db: Db, r: UsageRecord): Promise<boolean> {
    const result = await db.query(`INSERT INTO usage_ledger (id, org_id, org_name, key_id, model, tier, surface, request_id,
        input_tokens, cached_tokens, output_tokens, input_cost, cached_cost, output_cost, cost, long_context, completed_at_ms)
      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) ON CONFLICT DO NOTHING`,
    [r.id, r.orgId, r.orgName, r.keyId, r.model, r.tier, r.surface, r.requestId, r.inputTokens, r.cachedTokens,
      r.outputTokens, r.inputCost, r.cachedCost, r.outputCost, r.cost, r.longContext, r.completedAtMs]);
    return result.rowCount === 1;
  },

  async listUsage(db: Db, filter: { orgName?: string; sinceMs?: number }): Promise<UsageRecord[]> {
    const where: string[] = [];
    const params: unknown[] = [];
    if (filter.orgName !== undefined) {
      params.push(filter.orgName);
      where.push(`org_name = $${params.length}`);
    }
    if (filter.sinceMs !== undefined) {
      params.push(filter.sinceMs);
      where.push(`completed_at_ms >= $${params.length}`);
    }
    const { rows } = await db.query(`SELECT * FROM usage_ledger ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY seq`, params);
    return rows.map(usageRecord);
  },

  async setApiKeyAdmin(db: Db, keyId: string, admin: boolean): Promise<boolean> {
    return (await db.query('UPDATE api_keys SET admin = $1 WHERE id = $2', [admin, keyId])).rowCount === 1;
  },

  async isAdminKey(db: Db, keyId: string): Promise<boolean> {
    const { rows } = await db.query('SELECT admin FROM api_keys WHERE id = $1 AND revoked_at IS NULL', [keyId]);
    return rows[0]?.['admin'] === true;
  },
};
