// Leased work in the PostgreSQL store (leases.ts): background jobs and in-progress idempotency keys.
// PostgresStore delegates its lease methods here, and its commitRequestEnd fences a background end
// through fenceBackgroundEnd().
//
// Races are settled by row locks, never by timing. A claim selects free or expired jobs FOR UPDATE
// SKIP LOCKED and leases them in the same transaction, so concurrent claims on other replicas skip
// the rows it holds and never return the same job. The fence is a DELETE of the job row WHERE it is
// still leased to the committing owner: it waits for a claim that holds the row and then sees the
// claim's new owner (READ COMMITTED re-checks an updated row), so a stale replica's end writes
// nothing. Every comparison of expiry uses the caller's clock (lease.nowMs), as leases are set.

import type { Db } from './postgres-db.js';
import { WINDOW_RANK, type LeaseTerm } from './leases.js';
import type { BackgroundJob, IdempotencyBegin } from './store.js';
import { backgroundJob } from './store-rows.js';

export const postgresLeases = {
  /** Runs inside the caller's transaction (insertBackgroundResponse). */
  async insertJob(db: Db, job: BackgroundJob, lease: LeaseTerm): Promise<void> {
    await db.query(`INSERT INTO background_jobs (response_id, org_id, deadline_at, request, created_at, window_rank, lease_owner, lease_until_ms)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    [job.responseId, job.orgId, job.deadlineAt, JSON.stringify(job.request), job.createdAt, WINDOW_RANK[job.window], lease.owner, lease.untilMs]);
  },

  async getJob(db: Db, orgId: string, responseId: string): Promise<BackgroundJob | undefined> {
    const { rows } = await db.query('SELECT * FROM background_jobs WHERE response_id = $1 AND org_id = $2', [responseId, orgId]);
    return rows[0] && backgroundJob(rows[0]);
  },

  /** Runs inside the caller's transaction: the row locks and the leases commit together. */
  async claim(tx: Db, lease: LeaseTerm, limit: number): Promise<BackgroundJob[]> {
    const { rows } = await tx.query(`SELECT * FROM background_jobs WHERE lease_owner IS NULL OR lease_until_ms <= $1
                                      ORDER BY window_rank, created_at, response_id COLLATE "C" LIMIT $2
                                      FOR UPDATE SKIP LOCKED`, [lease.nowMs, limit]);
    const jobs = rows.map(backgroundJob);
    if (jobs.length > 0) {
      await tx.query('UPDATE background_jobs SET lease_owner = $1, lease_until_ms = $2 WHERE response_id = ANY($3::text[])',
        [lease.owner, lease.untilMs, jobs.map((j) => j.responseId)]);
    }
    return jobs;
  },

  async renew(db: Db, lease: LeaseTerm): Promise<string[]> {
    await db.query('UPDATE idempotency SET lease_until_ms = $1 WHERE lease_owner = $2 AND status_code IS NULL', [lease.untilMs, lease.owner]);
    const { rows } = await db.query('UPDATE background_jobs SET lease_until_ms = $1 WHERE lease_owner = $2 RETURNING response_id',
      [lease.untilMs, lease.owner]);
    return rows.map((r) => r['response_id'] as string);
  },

  async releaseJob(db: Db, responseId: string, owner: string): Promise<void> {
    await db.query('UPDATE background_jobs SET lease_owner = NULL, lease_until_ms = 0 WHERE response_id = $1 AND lease_owner = $2',
      [responseId, owner]);
  },

  /** `owner` undefined: every lease, whoever holds it (a store one process owns, at its start). */
  async release(db: Db, owner: string | undefined): Promise<void> {
    const which = owner === undefined ? 'lease_owner IS NOT NULL' : 'lease_owner = $1';
    const values = owner === undefined ? [] : [owner];
    await db.query(`UPDATE background_jobs SET lease_owner = NULL, lease_until_ms = 0 WHERE ${which}`, values);
    await db.query(`UPDATE idempotency SET lease_owner = NULL, lease_until_ms = 0 WHERE ${which} AND status_code IS NULL`, values);
  },

  /**
   * Runs first inside commitRequestEnd's transaction: deletes the job while `owner` holds it; false
   * (the caller then writes nothing) when it is gone or leased to another replica.
   */
  async fenceBackgroundEnd(tx: Db, orgId: string, responseId: string, owner: string): Promise<boolean> {
    const { rowCount } = await tx.query('DELETE FROM background_jobs WHERE response_id = $1 AND org_id = $2 AND lease_owner = $3',
      [responseId, orgId, owner]);
    return (rowCount ?? 0) > 0;
  },

  /**
   * Inside the caller's transaction: deletes the job (whoever holds it) while the response is
   * in_progress; false when the job is gone or the response ended. The DELETE locks the job row
   * first, so a fenced end running at the same time either commits before (the job is gone: false)
   * or finds the job gone after (it writes nothing).
   */
  async takeForCancel(tx: Db, orgId: string, responseId: string): Promise<boolean> {
    const { rowCount } = await tx.query(`DELETE FROM background_jobs j WHERE j.response_id = $1 AND j.org_id = $2
                                           AND EXISTS (SELECT 1 FROM responses r WHERE r.id = $1 AND r.org_id = $2 AND r.status = 'in_progress')`,
    [responseId, orgId]);
    return (rowCount ?? 0) > 0;
  },

  async beginIdempotency(db: Db, orgId: string, scope: string, key: string, requestHash: string, at: number,
    lease: LeaseTerm): Promise<IdempotencyBegin> {
    // The primary key settles a race on a new key: exactly one INSERT creates the row. A loser reads
    // the winner's row; if the winner abandoned it meanwhile, the key is new again: try once more.
    // An in-progress key whose lease ran out (its replica died) is taken over by a compare-and-set
    // on that expiry: of two requests racing for it, one gets it.
    for (;;) {
      const inserted = await db.query(`INSERT INTO idempotency (org_id, scope, key, request_hash, created_at, lease_owner, lease_until_ms)
                                       VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (org_id, scope, key) DO NOTHING`,
      [orgId, scope, key, requestHash, at, lease.owner, lease.untilMs]);
      if (inserted.rowCount === 1) return { state: 'new' };
      const { rows } = await db.query('SELECT * FROM idempotency WHERE org_id = $1 AND scope = $2 AND key = $3', [orgId, scope, key]);
      const row = rows[0];
      if (!row) continue;
      if (row['request_hash'] !== requestHash) return { state: 'mismatch' };
      if (row['status_code'] === null) {
        if ((row['lease_until_ms'] as number) > lease.nowMs) return { state: 'in_progress' };
        const taken = await db.query(`UPDATE idempotency SET lease_owner = $1, lease_until_ms = $2
                                       WHERE org_id = $3 AND scope = $4 AND key = $5 AND status_code IS NULL AND lease_until_ms <= $6`,
        [lease.owner, lease.untilMs, orgId, scope, key, lease.nowMs]);
        if (taken.rowCount === 1) return { state: 'new' };
        continue; // completed, abandoned or taken by another request meanwhile: look again
      }
      return { state: 'done', statusCode: row['status_code'] as number, body: JSON.parse(row['body'] as string) };
    }
  },
};
