// The usage ledger and the admin flag of API keys in the SQLite store (migration 5): SqliteStore
// delegates its "Usage ledger" methods here. Ledger rows are only ever inserted, never updated.

import type Database from 'better-sqlite3';
import type { UsageRecord } from './store.js';
import { usageRecord, type Row } from './store-rows.js';

export class SqliteUsage {
  private readonly insert: Database.Statement;
  private readonly setAdmin: Database.Statement;
  private readonly admin: Database.Statement;

  constructor(private readonly db: Database.Database) {
    this.insert = db.prepare(`INSERT OR IGNORE INTO usage_ledger (id, org_id, org_name, key_id, model, tier, surface,
      request_id, input_tokens, cached_tokens, output_tokens, input_cost, cached_cost, output_cost, cost, long_context,
      completed_at_ms) VALUES (@id, @orgId, @orgName, @keyId, @model, @tier, @surface, @requestId, @inputTokens,
      @cachedTokens, @outputTokens, @inputCost, @cachedCost, @outputCost, @cost, @longContext, @completedAtMs)`);
    this.setAdmin = db.prepare('UPDATE api_keys SET admin = ? WHERE id = ?');
    this.admin = db.prepare('SELECT admin FROM api_keys WHERE id = ? AND revoked_at IS NULL');
  }

  insertUsage(r: UsageRecord): boolean {
    return this.insert.run({ ...r, longContext: r.longContext ? 1 : 0 }).changes === 1;
  }

  listUsage(filter: { orgName?: string; sinceMs?: number }): UsageRecord[] {
    const where: string[] = [];
    const params: unknown[] = [];
    if (filter.orgName !== undefined) {
      where.push('org_name = ?');
      params.push(filter.orgName);
    }
    if (filter.sinceMs !== undefined) {
      where.push('completed_at_ms >= ?');
      params.push(filter.sinceMs);
    }
    const sql = `SELECT * FROM usage_ledger ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY seq`;
    return (this.db.prepare(sql).all(...params) as Row[]).map(usageRecord);
  }

  setApiKeyAdmin(keyId: string, admin: boolean): boolean {
    return this.setAdmin.run(admin ? 1 : 0, keyId).changes === 1;
  }

  isAdminKey(keyId: string): boolean {
    return (this.admin.get(keyId) as Row | undefined)?.['admin'] === 1;
  }
}
