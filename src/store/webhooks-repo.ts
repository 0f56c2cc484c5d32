// The webhook outbox: completion deliveries, written by a request's end (or a cancel) in its
// transaction and sent by webhooks/dispatcher.ts.
//
// Leases: a claimed delivery has lease_owner and leased_until_ms set (and next_attempt_at_ms moved
// to the same time, so it is not due meanwhile) until its outcome is recorded, which clears them;
// the owner renews the lease while its attempt runs (leases-repo.ts), and records the outcome only
// while it still holds it. Rows with an unexpired lease are the attempts in flight, whichever
// process runs them; the fairness caps count those, so claims must not interleave: each runs in a
// transaction that first takes an advisory lock (PostgreSQL; SQLite's writers are serial anyway),
// then ranks and leases in the same snapshot of committed rows.

import type { Sql } from './sql-driver.js';
import type { WebhookDelivery, WebhookOutbox } from './store.js';
import { webhookDelivery } from './store-rows.js';

/** The advisory lock key serializing fair claims. */
const CLAIM_LOCK = 0x51c4;

/**
 * The fair claim, as one statement: due rows are ranked within their host, round robin over the
 * host's organizations, and kept while the host stays within its cap; the survivors are ranked
 * within their organization and kept while it stays within its cap; the result is ordered by that
 * rank (round robin over organizations), oldest first within a round. Ids break ties in byte order
 * (COLLATE "C"), whatever the database's collation.
 * NOTE: ranking within the host first means an organization's deliveries held back by a full host
 * do not use up its own cap, so its other receivers still get their turn.
 */
const CLAIM_SQL = `
  WITH in_flight AS (
    SELECT org_id, host FROM webhook_deliveries WHERE state = 'pending' AND leased_until_ms > :now
  ),
  org_busy AS (SELECT org_id, COUNT(*) AS n FROM in_flight GROUP BY org_id),
  host_busy AS (SELECT host, COUNT(*) AS n FROM in_flight GROUP BY host),
  due AS (
    SELECT id, org_id, host, next_attempt_at_ms,
           ROW_NUMBER() OVER (PARTITION BY host, org_id ORDER BY next_attempt_at_ms, id COLLATE "C") AS turn_in_host
      FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at_ms <= :now
  ),
  host_ranked AS (
    SELECT due.*, ROW_NUMBER() OVER (PARTITION BY host ORDER BY turn_in_host, next_attempt_at_ms, id COLLATE "C") AS host_rank FROM due
  ),
  host_fit AS (
    SELECT h.* FROM host_ranked h LEFT JOIN host_busy b ON b.host = h.host
     WHERE h.host_rank + COALESCE(b.n, 0) <= :perHost
  ),
  org_ranked AS (
    SELECT f.*, ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY next_attempt_at_ms, id COLLATE "C") AS org_rank FROM host_fit f
  )
  SELECT d.* FROM org_ranked o
    LEFT JOIN org_busy b ON b.org_id = o.org_id
    JOIN webhook_deliveries d ON d.id = o.id
   WHERE o.org_rank + COALESCE(b.n, 0) <= :perOrg
   ORDER BY o.org_rank, o.next_attempt_at_ms, o.id COLLATE "C"
   LIMIT :limit`;

/** The statements a unit of work (sql-store.ts) runs inside its transaction. */
export const webhookRows = {
  async insert(db: Sql, d: WebhookDelivery): Promise<void> {
    await db.run(`INSERT INTO webhook_deliveries (id, org_id, object_id, url, host, token, body, state, attempts,
                    next_attempt_at_ms, last_error, created_at, updated_at)
                  VALUES (:id, :orgId, :objectId, :url, :host, :token, :body, :state, :attempts, :nextAttemptAtMs, :lastError,
                    :createdAt, :createdAt)`, { ...d });
  },
};

export function webhookOutbox(db: Sql): WebhookOutbox {
  return {
    insertWebhookDelivery: (d) => webhookRows.insert(db, d),

    claimDueWebhookDeliveries: (lease, limit, caps) => db.transaction(async (tx) => {
      await tx.advisoryLock(CLAIM_LOCK);
      const claimed = (await tx.all(CLAIM_SQL, { now: lease.nowMs, perHost: caps.perHost, perOrg: caps.perOrg, limit })).map(webhookDelivery);
      if (claimed.length > 0) {
        await tx.run('UPDATE webhook_deliveries SET next_attempt_at_ms = :untilMs, leased_until_ms = :untilMs, lease_owner = :owner WHERE id = ANY(:ids)',
          { untilMs: lease.untilMs, owner: lease.owner, ids: claimed.map((d) => d.id) });
      }
      return claimed;
    }),

    async updateWebhookDelivery(id, owner, u) {
      // A delivery that ends (delivered or failed) forgets its token.
      return (await db.run(`UPDATE webhook_deliveries SET state = :state, attempts = :attempts, next_attempt_at_ms = :next,
            last_error = :lastError, leased_until_ms = NULL, lease_owner = NULL, updated_at = :at,
            token = CASE WHEN :state = 'pending' THEN token ELSE NULL END
          WHERE id = :id AND lease_owner = :owner`,
      { id, owner, state: u.state, attempts: u.attempts, next: u.nextAttemptAtMs, lastError: u.lastError, at: Math.floor(Date.now() / 1000) })) > 0;
    },

    async nextWebhookAttemptMs(afterMs) {
      const row = await db.one(`SELECT MIN(next_attempt_at_ms) AS at FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at_ms > :afterMs`,
        { afterMs });
      return (row?.['at'] as number | null) ?? undefined;
    },

    async countPendingWebhookDeliveries() {
      return (await db.one(`SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'`))!['n'] as number;
    },
  };
}
