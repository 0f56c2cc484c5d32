// Leased work in the SQLite store (migration 8, leases.ts): background jobs and in-progress
// idempotency keys. SqliteStore delegates its lease methods here, and its commitRequestEnd fences a
// background end through fenceBackgroundEnd().
//
// SQLite serializes writers: every claim, renewal and fence runs in one IMMEDIATE transaction (the
// write lock is taken before the first read), so two claimers never take the same job. One process
// owns the file (the data directory lock), so leases matter here only as fences and across a
// restart: releaseAll() at start hands back what the dead process left.

import type Database from 'better-sqlite3';
import { WINDOW_RANK, type LeaseTerm } from './leases.js';
import type { BackgroundJob, IdempotencyBegin } from './store.js';
import { backgroundJob, type Row } from './store-rows.js';

type Statement = 'insertJob' | 'getJob' | 'claimable' | 'lease' | 'renewJobs' | 'renewKeys' | 'releaseJobs' | 'releaseKeys'
  | 'releaseJob' | 'releaseAllJobs' | 'releaseAllKeys' | 'fence' | 'getIdem' | 'insertIdem' | 'takeIdem' | 'getStatus' | 'deleteJob';

export class SqliteLeases {
  private readonly stmt: Record<Statement, Database.Statement>;

  constructor(private readonly db: Database.Database) {
    const prepare = (sql: string) => db.prepare(sql);
    this.stmt = {
      insertJob: prepare(`INSERT INTO background_jobs (response_id, org_id, deadline_at, request, created_at, window_rank, lease_owner, lease_until_ms)
                          VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      getJob: prepare('SELECT * FROM background_jobs WHERE response_id = ? AND org_id = ?'),
      claimable: prepare(`SELECT * FROM background_jobs WHERE lease_owner IS NULL OR lease_until_ms <= ?
                            ORDER BY window_rank, created_at, response_id LIMIT ?`),
      lease: prepare('UPDATE background_jobs SET lease_owner = ?, lease_until_ms = ? WHERE response_id = ?'),
      renewJobs: prepare('UPDATE background_jobs SET lease_until_ms = ? WHERE lease_owner = ? RETURNING response_id'),
      renewKeys: prepare('UPDATE idempotency SET lease_until_ms = ? WHERE lease_owner = ? AND status_code IS NULL'),
      releaseJobs: prepare('UPDATE background_jobs SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner = ?'),
      releaseKeys: prepare('UPDATE idempotency SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner = ? AND status_code IS NULL'),
      releaseJob: prepare('UPDATE background_jobs SET lease_owner = NULL, lease_until_ms = 0 WHERE response_id = ? AND lease_owner = ?'),
      releaseAllJobs: prepare('UPDATE background_jobs SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner IS NOT NULL'),
      releaseAllKeys: prepare('UPDATE idempotency SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner IS NOT NULL AND status_code IS NULL'),
      fence: prepare('DELETE FROM background_jobs WHERE response_id = ? AND org_id = ? AND lease_owner = ?'),
      getIdem: prepare('SELECT * FROM idempotency WHERE org_id = ? AND scope = ? AND key = ?'),
      insertIdem: prepare(`INSERT INTO idempotency (org_id, scope, key, request_hash, created_at, lease_owner, lease_until_ms)
                           VALUES (?, ?, ?, ?, ?, ?, ?)`),
      takeIdem: prepare(`UPDATE idempotency SET lease_owner = ?, lease_until_ms = ?
                           WHERE org_id = ? AND scope = ? AND key = ? AND status_code IS NULL AND lease_until_ms <= ?`),
      getStatus: prepare('SELECT status FROM responses WHERE id = ? AND org_id = ?'),
      deleteJob: prepare('DELETE FROM background_jobs WHERE response_id = ? AND org_id = ?'),
    };
  }

  /** Runs inside the caller's transaction (insertBackgroundResponse). */
  insertJob(job: BackgroundJob, lease: LeaseTerm): void {
    this.stmt.insertJob.run(job.responseId, job.orgId, job.deadlineAt, JSON.stringify(job.request), job.createdAt,
      WINDOW_RANK[job.window], lease.owner, lease.untilMs);
  }

  getJob(orgId: string, responseId: string): BackgroundJob | undefined {
    const row = this.stmt.getJob.get(responseId, orgId) as Row | undefined;
    return row && backgroundJob(row);
  }

  claim(lease: LeaseTerm, limit: number): BackgroundJob[] {
    return this.db.transaction((): BackgroundJob[] => {
      const jobs = (this.stmt.claimable.all(lease.nowMs, limit) as Row[]).map(backgroundJob);
      for (const job of jobs) this.stmt.lease.run(lease.owner, lease.untilMs, job.responseId);
      return jobs;
    }).immediate();
  }

  renew(lease: LeaseTerm): string[] {
    return this.db.transaction((): string[] => {
      this.stmt.renewKeys.run(lease.untilMs, lease.owner);
      return (this.stmt.renewJobs.all(lease.untilMs, lease.owner) as { response_id: string }[]).map((r) => r.response_id);
    }).immediate();
  }

  release(owner: string): void {
    this.db.transaction(() => {
      this.stmt.releaseJobs.run(owner);
      this.stmt.releaseKeys.run(owner);
    }).immediate();
  }

  releaseJob(responseId: string, owner: string): void {
    this.stmt.releaseJob.run(responseId, owner);
  }

  releaseAll(): void {
    this.db.transaction(() => {
      this.stmt.releaseAllJobs.run();
      this.stmt.releaseAllKeys.run();
    }).immediate();
  }

  /**
   * Runs first inside commitRequestEnd's transaction: deletes the job while `owner` holds it; false
   * (the caller then writes nothing) when it is gone or leased to another replica.
   */
  fenceBackgroundEnd(orgId: string, responseId: string, owner: string): boolean {
    return this.stmt.fence.run(responseId, orgId, owner).changes > 0;
  }

  /** Inside the caller's IMMEDIATE transaction: the job exists and the response is in_progress, then the job is deleted. */
  takeForCancel(orgId: string, responseId: string): boolean {
    if (!this.stmt.getJob.get(responseId, orgId)) return false;
    const row = this.stmt.getStatus.get(responseId, orgId) as { status: string } | undefined;
    if (row?.status !== 'in_progress') return false;
    this.stmt.deleteJob.run(responseId, orgId);
    return true;
  }

  beginIdempotency(orgId: string, scope: string, key: string, requestHash: string, at: number, lease: LeaseTerm): IdempotencyBegin {
    // One IMMEDIATE transaction: two requests racing on a new (or expired) key cannot both see it as new.
    return this.db.transaction((): IdempotencyBegin => {
      const row = this.stmt.getIdem.get(orgId, scope, key) as Row | undefined;
      if (!row) {
        this.stmt.insertIdem.run(orgId, scope, key, requestHash, at, lease.owner, lease.untilMs);
        return { state: 'new' };
      }
      if (row['request_hash'] !== requestHash) return { state: 'mismatch' };
      if (row['status_code'] === null) {
        // Its replica died (the lease ran out): this request takes the key over.
        const taken = this.stmt.takeIdem.run(lease.owner, lease.untilMs, orgId, scope, key, lease.nowMs).changes > 0;
        return taken ? { state: 'new' } : { state: 'in_progress' };
      }
      return { state: 'done', statusCode: row['status_code'] as number, body: JSON.parse(row['body'] as string) };
    }).immediate();
  }
}
