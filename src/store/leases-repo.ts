// The one leases API (leases.ts says what a lease is): claims, renewals, hand-backs and fenced ends
// of every leased table, written once over the tables' shared lease columns (lease_owner and
// lease_until_ms; webhook deliveries keep theirs in leased_until_ms, which moves with their next
// attempt). The fair webhook claim is the outbox's (webhooks-repo.ts).
//
// Races are settled by row locks, never by timing. A claim selects free or expired rows FOR UPDATE
// SKIP LOCKED and leases them in the same transaction, so concurrent claims on other replicas skip
// the rows it holds and never return the same one (SQLite: one process, writers serial). A fence is
// a statement that locks the leased row while it is still the committing owner's: it waits for a
// claim that holds the row and then sees the claim's new owner (READ COMMITTED re-checks an updated
// row), so a stale replica's end writes nothing. Expiry is compared with the caller's clock
// (lease.nowMs), as leases are set.

import { UNFINISHED, batchRows } from './batches-repo.js';
import { chunkBounds, chunkKey } from './batch-records.js';
import type { LeaseTerm } from './leases.js';
import type { Params, Row, Sql } from './sql-driver.js';
import type { LeaseRepository } from './store.js';
import { backgroundJob, batchRecord } from './store-rows.js';

/** A table whose rows carry a lease, and which of its leases renewals and hand-backs touch (all when absent). */
interface Leased {
  table: string;
  /** Rows whose lease is still worth holding: a renewal extends only these. */
  live?: string;
  /** Rows a hand-back frees (an idempotency key's lease ends with its request). */
  releasable?: string;
}

const JOBS: Leased = { table: 'background_jobs' };
const KEYS: Leased = { table: 'idempotency', live: 'status_code IS NULL', releasable: 'status_code IS NULL' };
const BATCHES: Leased = { table: 'batches', live: `status IN ${UNFINISHED}` };
/** A chunk lease lives while its batch runs and nobody holds the batch row (to end it). */
const CHUNKS: Leased = { table: 'batch_chunks', live: `NOT done AND batch_id IN (SELECT id FROM batches WHERE status = 'in_progress' AND lease_owner IS NULL)` };

const and = (...conditions: (string | undefined)[]) => conditions.filter(Boolean).join(' AND ');

/** Extends `lease.owner`'s live leases of `t` to `lease.untilMs`; the rows still held (their `returning` columns). */
const renew = (db: Sql, t: Leased, lease: LeaseTerm, returning: string): Promise<Row[]> =>
  db.all(`UPDATE ${t.table} SET lease_until_ms = :untilMs WHERE ${and('lease_owner = :owner', t.live)} RETURNING ${returning}`, { ...lease });

/**
 * Hands back (owner NULL, expiry 0) `owner`'s leases of `t`, or everyone's when undefined, or with
 * `only` just the rows it selects; how many.
 */
function release(db: Sql, t: Leased, owner: string | undefined, only?: { where: string; params: Params }): Promise<number> {
  const where = and(owner === undefined ? 'lease_owner IS NOT NULL' : 'lease_owner = :owner', t.releasable, only?.where);
  return db.run(`UPDATE ${t.table} SET lease_owner = NULL, lease_until_ms = 0 WHERE ${where}`, { owner, ...only?.params });
}

/** The statements a unit of work (sql-store.ts) runs inside its transaction. */
export const leaseRows = {
  /**
   * The fence of a background end, first in its transaction: deletes the job while `owner` holds
   * it; false (the caller then writes nothing) when it is gone or leased to another replica.
   */
  async endBackgroundJob(db: Sql, orgId: string, responseId: string, owner: string): Promise<boolean> {
    return (await db.run('DELETE FROM background_jobs WHERE response_id = :responseId AND org_id = :orgId AND lease_owner = :owner',
      { responseId, orgId, owner })) > 0;
  },
};

export function leaseRepository(db: Sql): LeaseRepository {
  return {
    // Background jobs and in-progress idempotency keys.
    claimBackgroundJobs: (lease, limit) => db.transaction(async (tx) => {
      const jobs = (await tx.all(`SELECT * FROM background_jobs WHERE lease_owner IS NULL OR lease_until_ms <= :nowMs
          ORDER BY window_rank, created_at, response_id COLLATE "C" LIMIT :limit FOR UPDATE SKIP LOCKED`, { nowMs: lease.nowMs, limit }))
        .map(backgroundJob);
      if (jobs.length > 0) {
        await tx.run('UPDATE background_jobs SET lease_owner = :owner, lease_until_ms = :untilMs WHERE response_id = ANY(:ids)',
          { owner: lease.owner, untilMs: lease.untilMs, ids: jobs.map((j) => j.responseId) });
      }
      return jobs;
    }),

    async renewLeases(lease) {
      await renew(db, KEYS, lease, '1');
      return (await renew(db, JOBS, lease, 'response_id')).map((r) => r['response_id'] as string);
    },

    releaseLeases: (owner) => db.transaction(async (tx) => {
      await release(tx, JOBS, owner);
      await release(tx, KEYS, owner);
    }),

    async releaseBackgroundJob(responseId, owner) {
      await release(db, JOBS, owner, { where: 'response_id = :responseId', params: { responseId } });
    },

    releaseAllLeases: () => db.transaction(async (tx) => {
      await release(tx, JOBS, undefined);
      await release(tx, KEYS, undefined);
    }),

    // Webhook deliveries (claimed by the outbox's fair claim).
    async renewWebhookLeases(lease) {
      const rows = await db.all(`UPDATE webhook_deliveries SET next_attempt_at_ms = :untilMs, leased_until_ms = :untilMs
          WHERE lease_owner = :owner AND state = 'pending' RETURNING id`, { ...lease });
      return rows.map((r) => r['id'] as string);
    },

    releaseAllWebhookLeases: (nowMs) => db.run(`UPDATE webhook_deliveries SET next_attempt_at_ms = LEAST(next_attempt_at_ms, :nowMs),
        leased_until_ms = NULL, lease_owner = NULL WHERE state = 'pending' AND leased_until_ms IS NOT NULL`, { nowMs }),

    // Batch rows and chunks. Renewals and releases are one statement per table, each its own
    // transaction, so none holds a batch row's lock while it takes chunk locks.
    async claimBatch(id, lease) {
      // Two statements: the claim (the barrier: a line commit holding the row's lock commits first,
      // and none passes the fence after it), then a count no chunk changes while the row is leased.
      const row = await db.one(`UPDATE batches SET lease_owner = :owner, lease_until_ms = :untilMs
          WHERE id = :id AND status IN ${UNFINISHED} AND (lease_owner IS NULL OR lease_owner = :owner OR lease_until_ms <= :nowMs)
          RETURNING *`, { id, ...lease });
      if (!row) return undefined;
      const undone = await db.one('SELECT COUNT(*) AS n FROM batch_chunks WHERE batch_id = :id AND NOT done', { id });
      return { batch: batchRecord(row), chunked: row['num_chunks'] !== null, undoneChunks: undone!['n'] as number };
    },

    claimBatchChunks: (lease, limit, skipBatchIds, skipOrgIds = []) => db.transaction(async (tx) => {
      const rows = await tx.all(`SELECT c.batch_id, c.chunk_no, c.first_line, c.last_line, c.start_offset, c.end_offset, c.num_lines
          FROM batch_chunks c JOIN batches b ON b.id = c.batch_id
          WHERE NOT c.done AND (c.lease_owner IS NULL OR c.lease_until_ms <= :nowMs)
            AND b.status = 'in_progress' AND b.lease_owner IS NULL AND b.expires_at > :nowSec
            AND NOT (c.batch_id = ANY(:skipBatchIds)) AND NOT (b.org_id = ANY(:skipOrgIds))
          ORDER BY c.window_rank, c.created_at, b.seq, c.chunk_no LIMIT :limit
          FOR UPDATE OF c SKIP LOCKED`,
      { nowMs: lease.nowMs, nowSec: Math.floor(lease.nowMs / 1000), skipBatchIds: [...skipBatchIds], skipOrgIds: [...skipOrgIds], limit });
      const claimed = [];
      for (const r of rows) {
        await tx.run('UPDATE batch_chunks SET lease_owner = :owner, lease_until_ms = :untilMs WHERE batch_id = :batchId AND chunk_no = :chunkNo',
          { owner: lease.owner, untilMs: lease.untilMs, batchId: r['batch_id'], chunkNo: r['chunk_no'] });
        const batch = await tx.one('SELECT * FROM batches WHERE id = :id', { id: r['batch_id'] });
        claimed.push({ chunk: chunkBounds(r), batch: batchRecord(batch!) });
      }
      return claimed;
    }),

    async renewBatchLeases(lease) {
      const batches = await renew(db, BATCHES, lease, 'id');
      const chunks = await renew(db, CHUNKS, lease, 'batch_id, chunk_no');
      return {
        batchIds: batches.map((r) => r['id'] as string),
        chunkKeys: chunks.map((r) => chunkKey(r['batch_id'] as string, r['chunk_no'] as number)),
      };
    },

    finishBatchChunk: (batchId, chunkNo, owner) => db.transaction(async (tx) => {
      if (!(await batchRows.fence(tx, batchId, chunkNo, owner))) return false;
      await tx.run('UPDATE batch_chunks SET done = TRUE, lease_owner = NULL, lease_until_ms = 0 WHERE batch_id = :batchId AND chunk_no = :chunkNo',
        { batchId, chunkNo });
      return true;
    }),

    async releaseBatchLease(batchId, owner, chunkNo) {
      if (chunkNo === undefined) await release(db, BATCHES, owner, { where: 'id = :batchId', params: { batchId } });
      else await release(db, CHUNKS, owner, { where: 'batch_id = :batchId AND chunk_no = :chunkNo', params: { batchId, chunkNo } });
    },

    async releaseBatchLeases(owner) {
      return (await release(db, BATCHES, owner)) + (await release(db, CHUNKS, owner));
    },
  };
}
