// Completion webhook deliveries in the SQLite store (migrations 3 and 6): SqliteStore delegates its
// "Webhook deliveries" methods here, and its commitRequestEnd inserts deliveries through insert().
//
// Leases: a claimed delivery has lease_owner and leased_until_ms set (and next_attempt_at_ms moved
// to the same time, so it is not due meanwhile) until its outcome is recorded, which clears them;
// the owner renews the lease while its attempt runs, and records the outcome only while it still
// holds it. Rows with an unexpired lease are the attempts in flight, whichever process runs them;
// the fairness caps count those. A process that died mid-attempt leaves a lease that expires
// (after one lease length, not a whole attempt's timeout), or that the next process on the same
// store hands back at its start.

import type Database from 'better-sqlite3';
import type { LeaseTerm } from './leases.js';
import type { WebhookClaimCaps, WebhookDelivery, WebhookDeliveryUpdate } from './store.js';
import { webhookDelivery, type Row } from './store-rows.js';

/**
 * The fair claim, as one statement: due rows are ranked within their host, round robin over the
 * host's organizations, and kept while the host stays within its cap; the survivors are ranked
 * within their organization and kept while it stays within its cap; the result is ordered by that
 * rank (round robin over organizations), oldest first within a round.
 * NOTE: ranking within the host first means an organization's deliveries held back by a full host
 * do not use up its own cap, so its other receivers still get their turn.
 */
const CLAIM_SQL = `
  WITH in_flight AS (
    SELECT org_id, host FROM webhook_deliveries WHERE state = 'pending' AND leased_until_ms > @now
  ),
  org_busy AS (SELECT org_id, COUNT(*) AS n FROM in_flight GROUP BY org_id),
  host_busy AS (SELECT host, COUNT(*) AS n FROM in_flight GROUP BY host),
  due AS (
    SELECT id, org_id, host, next_attempt_at_ms,
           ROW_NUMBER() OVER (PARTITION BY host, org_id ORDER BY next_attempt_at_ms, id) AS turn_in_host
      FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at_ms <= @now
  ),
  host_ranked AS (
    SELECT due.*, ROW_NUMBER() OVER (PARTITION BY host ORDER BY turn_in_host, next_attempt_at_ms, id) AS host_rank FROM due
  ),
  host_fit AS (
    SELECT h.* FROM host_ranked h LEFT JOIN host_busy b ON b.host = h.host
     WHERE h.host_rank + COALESCE(b.n, 0) <= @perHost
  ),
  org_ranked AS (
    SELECT f.*, ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY next_attempt_at_ms, id) AS org_rank FROM host_fit f
  )
  SELECT d.* FROM org_ranked o
    LEFT JOIN org_busy b ON b.org_id = o.org_id
    JOIN webhook_deliveries d ON d.id = o.id
   WHERE o.org_rank + COALESCE(b.n, 0) <= @perOrg
   ORDER BY o.org_rank, o.next_attempt_at_ms, o.id
   LIMIT @limit`;

export class SqliteWebhooks {
  private readonly stmt: Record<'insert' | 'claim' | 'lease' | 'renew' | 'update' | 'releaseAll' | 'next' | 'pending', Database.Statement>;

  constructor(private readonly db: Database.Database) {
    this.stmt = {
      insert: db.prepare(`INSERT INTO webhook_deliveries (id, org_id, object_id, url, host, token, body, state, attempts,
                            next_attempt_at_ms, last_error, created_at, updated_at)
                          VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
      claim: db.prepare(CLAIM_SQL),
      lease: db.prepare('UPDATE webhook_deliveries SET next_attempt_at_ms = @until, leased_until_ms = @until, lease_owner = @owner WHERE id = @id'),
      renew: db.prepare(`UPDATE webhook_deliveries SET next_attempt_at_ms = @until, leased_until_ms = @until
                          WHERE lease_owner = @owner AND state = 'pending' RETURNING id`),
      update: db.prepare(`UPDATE webhook_deliveries SET state = @state, attempts = @attempts, next_attempt_at_ms = @next,
                            last_error = @lastError, leased_until_ms = NULL, lease_owner = NULL, updated_at = @at,
                            token = CASE WHEN @state = 'pending' THEN token ELSE NULL END
                          WHERE id = @id AND lease_owner = @owner`),
      releaseAll: db.prepare(`UPDATE webhook_deliveries SET next_attempt_at_ms = MIN(next_attempt_at_ms, @now), leased_until_ms = NULL,
                               lease_owner = NULL WHERE state = 'pending' AND leased_until_ms IS NOT NULL`),
      next: db.prepare(`SELECT MIN(next_attempt_at_ms) AS at FROM webhook_deliveries
                          WHERE state = 'pending' AND next_attempt_at_ms > ?`),
      pending: db.prepare(`SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'`),
    };
  }

  /** Runs inside the caller's transaction when there is one (commitRequestEnd). */
  insert(d: WebhookDelivery): void {
    this.stmt.insert.run(d.id, d.orgId, d.objectId, d.url, d.host, d.token, d.body, d.state, d.attempts,
      d.nextAttemptAtMs, d.lastError, d.createdAt, d.createdAt);
  }

  claimDue(lease: LeaseTerm, limit: number, caps: WebhookClaimCaps): WebhookDelivery[] {
    // IMMEDIATE: the write lock is taken before the select, so two claimers never pick the same rows.
    return this.db.transaction((): WebhookDelivery[] => {
      const rows = (this.stmt.claim.all({ now: lease.nowMs, perOrg: caps.perOrg, perHost: caps.perHost, limit }) as Row[]).map(webhookDelivery);
      for (const row of rows) this.stmt.lease.run({ until: lease.untilMs, owner: lease.owner, id: row.id });
      return rows;
    }).immediate();
  }

  renew(lease: LeaseTerm): string[] {
    return (this.stmt.renew.all({ until: lease.untilMs, owner: lease.owner }) as Array<{ id: string }>).map((r) => r.id);
  }

  update(id: string, owner: string, u: WebhookDeliveryUpdate): boolean {
    return this.stmt.update.run({
      id, owner, state: u.state, attempts: u.attempts, next: u.nextAttemptAtMs, lastError: u.lastError, at: Math.floor(Date.now() / 1000),
    }).changes > 0;
  }

  releaseAll(nowMs: number): number {
    return this.stmt.releaseAll.run({ now: nowMs }).changes;
  }

  nextAttemptMs(afterMs: number): number | undefined {
    return (this.stmt.next.get(afterMs) as { at: number | null }).at ?? undefined;
  }

  countPending(): number {
    return (this.stmt.pending.get() as { n: number }).n;
  }
}
