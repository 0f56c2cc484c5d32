// Completion webhook deliveries in the PostgreSQL store: PostgresStore delegates its "Webhook
// deliveries" methods here, and its commitRequestEnd inserts deliveries through insert().
//
// Leases as in sqlite-webhooks.ts: a claimed delivery has lease_owner and leased_until_ms set (and
// next_attempt_at_ms moved to the same time) until its outcome is recorded; the owner renews it
// while its attempt runs, and records the outcome only while it still holds it. The fair claim counts
// unexpired leases of every replica as in flight, so claims must not interleave: each claim runs in
// a transaction that first takes a transaction-level advisory lock (the same serialization SQLite's
// IMMEDIATE transaction gives), then ranks and leases in the same snapshot of committed rows.

import type { LeaseTerm } from './leases.js';
import type { Db } from './postgres-db.js';
import type { WebhookClaimCaps, WebhookDelivery, WebhookDeliveryUpdate } from './store.js';
import { webhookDelivery } from './store-rows.js';

/** The advisory lock key (two-key form, second key: the schema) serializing fair claims. */
const CLAIM_LOCK = 0x51c4;

/**
 * The fair claim of sqlite-webhooks.ts, statement for statement ($1 now, $2 perHost, $3 perOrg, $4 limit);
 * ids break ties in byte order (COLLATE "C"), as in SQLite, whatever the database's collation.
 */
const CLAIM_SQL = `
  WITH in_flight AS (
    SELECT org_id, host FROM webhook_deliveries WHERE state = 'pending' AND leased_until_ms > $1
  ),
  org_busy AS (SELECT org_id, COUNT(*) AS n FROM in_flight GROUP BY org_id),
  host_busy AS (SELECT host, COUNT(*) AS n FROM in_flight GROUP BY host),
  due AS (
    SELECT id, org_id, host, next_attempt_at_ms,
           ROW_NUMBER() OVER (PARTITION BY host, org_id ORDER BY next_attempt_at_ms, id COLLATE "C") AS turn_in_host
      FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at_ms <= $1
  ),
  host_ranked AS (
    SELECT due.*, ROW_NUMBER() OVER (PARTITION BY host ORDER BY turn_in_host, next_attempt_at_ms, id COLLATE "C") AS host_rank FROM due
  ),
  host_fit AS (
    SELECT h.* FROM host_ranked h LEFT JOIN host_busy b ON b.host = h.host
     WHERE h.host_rank + COALESCE(b.n, 0) <= $2
  ),
  org_ranked AS (
    SELECT f.*, ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY next_attempt_at_ms, id COLLATE "C") AS org_rank FROM host_fit f
  )
  SELECT d.* FROM org_ranked o
    LEFT JOIN org_busy b ON b.org_id = o.org_id
    JOIN webhook_deliveries d ON d.id = o.id
   WHERE o.org_rank + COALESCE(b.n, 0) <= $3
   ORDER BY o.org_rank, o.next_attempt_at_ms, o.id COLLATE "C"
   LIMIT $4`;

export const postgresWebhooks = {
  /** Runs inside the caller's transaction when there is one (commitRequestEnd). */
  async insert(db: Db, d: WebhookDelivery): Promise<void> {
    await db.query(`INSERT INTO webhook_deliveries (id, org_id, object_id, url, host, token, body, state, attempts,
                      next_attempt_at_ms, last_error, created_at, updated_at)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
    [d.id, d.orgId, d.objectId, d.url, d.host, d.token, d.body, d.state, d.attempts, d.nextAttemptAtMs, d.lastError,
      d.createdAt, d.createdAt]);
  },

  /** Runs inside the caller's transaction: the lock, the ranking and the leases commit together. */
  async claimDue(tx: Db, lease: LeaseTerm, limit: number, caps: WebhookClaimCaps): Promise<WebhookDelivery[]> {
    await tx.query(`SELECT pg_advisory_xact_lock($1, hashtext(COALESCE(current_schema(), '')))`, [CLAIM_LOCK]);
    const { rows } = await tx.query(CLAIM_SQL, [lease.nowMs, caps.perHost, caps.perOrg, limit]);
    const claimed = rows.map(webhookDelivery);
    if (claimed.length > 0) {
      await tx.query('UPDATE webhook_deliveries SET next_attempt_at_ms = $1, leased_until_ms = $1, lease_owner = $2 WHERE id = ANY($3::text[])',
        [lease.untilMs, lease.owner, claimed.map((d) => d.id)]);
    }
    return claimed;
  },

  async renew(db: Db, lease: LeaseTerm): Promise<string[]> {
    const { rows } = await db.query(`UPDATE webhook_deliveries SET next_attempt_at_ms = $1, leased_until_ms = $1
                                      WHERE lease_owner = $2 AND state = 'pending' RETURNING id`, [lease.untilMs, lease.owner]);
    return rows.map((r) => r['id'] as string);
  },

  async update(db: Db, id: string, owner: string, u: WebhookDeliveryUpdate): Promise<boolean> {
    const { rowCount } = await db.query(`UPDATE webhook_deliveries SET state = $3, attempts = $4, next_attempt_at_ms = $5,
                      last_error = $6, leased_until_ms = NULL, lease_owner = NULL, updated_at = $7,
                      token = CASE WHEN $3 = 'pending' THEN token ELSE NULL END
                    WHERE id = $1 AND lease_owner = $2`,
    [id, owner, u.state, u.attempts, u.nextAttemptAtMs, u.lastError, Math.floor(Date.now() / 1000)]);
    return (rowCount ?? 0) > 0;
  },

  async releaseAll(db: Db, nowMs: number): Promise<number> {
    const { rowCount } = await db.query(`UPDATE webhook_deliveries SET next_attempt_at_ms = LEAST(next_attempt_at_ms, $1),
                                           leased_until_ms = NULL, lease_owner = NULL
                                          WHERE state = 'pending' AND leased_until_ms IS NOT NULL`, [nowMs]);
    return rowCount ?? 0;
  },

  async nextAttemptMs(db: Db, afterMs: number): Promise<number | undefined> {
    const { rows } = await db.query(`SELECT MIN(next_attempt_at_ms) AS at FROM webhook_deliveries
                                      WHERE state = 'pending' AND next_attempt_at_ms > $1`, [afterMs]);
    return (rows[0]?.['at'] as number | null) ?? undefined;
  },

  async countPending(db: Db): Promise<number> {
    const { rows } = await db.query(`SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'`);
    return rows[0]!['n'] as number;
  },
};
