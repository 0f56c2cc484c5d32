// Idempotency keys, per organization and scope (the endpoint). A key in progress is leased to the
// replica running its request (leases.ts); one whose lease ran out (its replica died) is taken
// over by the next request with it. Renewals and hand-backs are leases-repo.ts's.

import type { Sql } from './sql-driver.js';
import type { IdempotencyRepository } from './store.js';

const KEY = 'org_id = :orgId AND scope = :scope AND key = :key';

/** The statements a unit of work (sql-store.ts) runs inside its transaction. */
export const idempotencyRows = {
  async complete(db: Sql, k: { orgId: string; scope: string; key: string; statusCode: number; body: unknown }): Promise<void> {
    await db.run(`UPDATE idempotency SET status_code = :statusCode, body = :body WHERE ${KEY}`, { ...k, body: JSON.stringify(k.body) });
  },

  /**
   * The fence of a fenced end, before it writes anything: is the key still in progress and
   * `owner`'s? The row stays locked until the commit, so a takeover (beginIdempotency) waits for it.
   */
  async held(db: Sql, k: { orgId: string; scope: string; key: string }, owner: string): Promise<boolean> {
    return (await db.one(`SELECT 1 FROM idempotency WHERE ${KEY} AND status_code IS NULL AND lease_owner = :owner FOR UPDATE`,
      { ...k, owner })) !== undefined;
  },
};

export function idempotencyRepository(db: Sql): IdempotencyRepository {
  return {
    async beginIdempotency(orgId, scope, key, requestHash, at, lease) {
      // No transaction, and none needed: the primary key settles a race on a new key (exactly one
      // INSERT creates the row). A loser reads the winner's row; if the winner abandoned it
      // meanwhile, the key is new again: try once more. An in-progress key whose lease ran out is
      // taken over by a compare-and-set on that expiry: of two requests racing for it, one gets it.
      const k = { orgId, scope, key };
      for (;;) {
        const inserted = await db.run(`INSERT INTO idempotency (org_id, scope, key, request_hash, created_at, lease_owner, lease_until_ms)
            VALUES (:orgId, :scope, :key, :requestHash, :at, :owner, :untilMs) ON CONFLICT (org_id, scope, key) DO NOTHING`,
        { ...k, requestHash, at, owner: lease.owner, untilMs: lease.untilMs });
        if (inserted === 1) return { state: 'new' };
        const row = await db.one(`SELECT * FROM idempotency WHERE ${KEY}`, k);
        if (!row) continue;
        if (row['request_hash'] !== requestHash) return { state: 'mismatch' };
        if (row['status_code'] === null) {
          if ((row['lease_until_ms'] as number) > lease.nowMs) return { state: 'in_progress' };
          const taken = await db.run(`UPDATE idempotency SET lease_owner = :owner, lease_until_ms = :untilMs
              WHERE ${KEY} AND status_code IS NULL AND lease_until_ms <= :nowMs`, { ...k, ...lease });
          if (taken === 1) return { state: 'new' };
          continue; // completed, abandoned or taken by another request meanwhile: look again
        }
        return { state: 'done', statusCode: row['status_code'] as number, body: JSON.parse(row['body'] as string) };
      }
    },

    completeIdempotency: (orgId, scope, key, statusCode, body) => idempotencyRows.complete(db, { orgId, scope, key, statusCode, body }),

    async abandonIdempotency(orgId, scope, key, leaseOwner) {
      await db.run(`DELETE FROM idempotency WHERE ${KEY} AND status_code IS NULL AND (CAST(:owner AS TEXT) IS NULL OR lease_owner = :owner)`,
        { orgId, scope, key, owner: leaseOwner });
    },

    releasePendingIdempotency: () => db.run('DELETE FROM idempotency WHERE status_code IS NULL'),
  };
}
