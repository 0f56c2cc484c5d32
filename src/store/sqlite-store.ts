// The single-process store: one SQLite file (better-sqlite3, WAL) under the data directory.
// better-sqlite3 is synchronous and each statement takes microseconds, so the async interface
// simply wraps its results. Batches, the usage ledger, webhook deliveries and leased work live in
// delegates (sqlite-batches.ts, sqlite-usage.ts, sqlite-webhooks.ts, sqlite-leases.ts);
// commitRequestEnd writes across them in one transaction.

import { randomUUID } from 'node:crypto';
import { chmodSync, closeSync, existsSync, mkdirSync, openSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { SQLITE_MIGRATIONS } from './migrations.js';
import { SqliteBatches } from './sqlite-batches.js';
import { SqliteLeases } from './sqlite-leases.js';
import { SqliteUsage } from './sqlite-usage.js';
import { SqliteWebhooks } from './sqlite-webhooks.js';
import type { BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus } from './batch-records.js';
import type { BatchChunkBounds, BatchClaim, ClaimedBatchChunk, HeldBatchLeases } from './batch-records.js';
import type { ApiKeyInfo, BackgroundJob, FileRecord, IdempotencyBegin, Organization, ResponseBody, Store } from './store.js';
import type { RequestEnd, RequestEndCommit, WebhookClaimCaps, WebhookDelivery, WebhookDeliveryUpdate } from './store.js';
import type { UsageRecord } from './store.js';
import { backgroundJob, fileRecord, keyInfo, type Row } from './store-rows.js';
import type { LeaseTerm } from './leases.js';

/** Free pages handed back per step of reclaimSpace (4 KiB pages: 8 MiB). */
const RECLAIM_STEP_PAGES = 2048;

export class SqliteStore implements Store {
  readonly shared = false;
  private readonly db: Database.Database;
  private readonly stmt: Record<string, Database.Statement>;

  /**
   * Opens (creating if needed) the database at `path` and applies pending migrations. The file and
   * its -wal/-shm are private to the owner (0600), an existing database's included; a directory
   * made for it is 0700.
   */
  constructor(path: string) {
    if (path !== ':memory:') createPrivately(path);
    this.db = new Database(path);
    useIncrementalVacuum(this.db);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = NORMAL');
    this.db.pragma('foreign_keys = ON');
    this.db.pragma('busy_timeout = 5000');
    migrate(this.db);
    const keySelect = `SELECT k.*, o.name AS org_name FROM api_keys k JOIN organizations o ON o.id = k.org_id`;
    const prepare = (sql: string) => this.db.prepare(sql);
    this.stmt = {
      orgByName: prepare('SELECT * FROM organizations WHERE name = ?'),
      insertOrg: prepare('INSERT OR IGNORE INTO organizations (id, name, created_at) VALUES (?, ?, ?)'),
      insertKey: prepare('INSERT INTO api_keys (id, org_id, hash, prefix, created_at) VALUES (?, ?, ?, ?, ?)'),
      keyByHash: prepare(`${keySelect} WHERE k.hash = ? AND k.revoked_at IS NULL`),
      listKeys: prepare(`${keySelect} ORDER BY k.created_at, k.id`),
      revokeKey: prepare('UPDATE api_keys SET revoked_at = ? WHERE (id = ? OR hash = ?) AND revoked_at IS NULL'),
      countKeys: prepare('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL'),
      insertResponse: prepare('INSERT INTO responses (id, org_id, status, created_at, updated_at, body) VALUES (?, ?, ?, ?, ?, ?)'),
      updateResponse: prepare('UPDATE responses SET status = ?, updated_at = ?, body = ? WHERE id = ? AND org_id = ?'),
      getResponse: prepare('SELECT body FROM responses WHERE id = ? AND org_id = ?'),
      putResponseInput: prepare('INSERT OR REPLACE INTO response_inputs (response_id, org_id, items) VALUES (?, ?, ?)'),
      getResponseInput: prepare('SELECT items FROM response_inputs WHERE response_id = ? AND org_id = ?'),
      deleteResponse: prepare('DELETE FROM responses WHERE id = ? AND org_id = ?'),
      deleteResponseInput: prepare('DELETE FROM response_inputs WHERE response_id = ? AND org_id = ?'),
      insertFile: prepare(`INSERT INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      getFile: prepare('SELECT * FROM files WHERE id = ? AND org_id = ?'),
      listFiles: prepare(`SELECT * FROM files WHERE org_id = ? AND (? IS NULL OR purpose = ?)
                          AND seq < COALESCE((SELECT seq FROM files WHERE id = ? AND org_id = ?), 9223372036854775807)
                          ORDER BY seq DESC LIMIT ?`),
      deleteFile: prepare('DELETE FROM files WHERE id = ? AND org_id = ?'),
      completeIdem: prepare('UPDATE idempotency SET status_code = ?, body = ? WHERE org_id = ? AND scope = ? AND key = ?'),
      deleteIdem: prepare('DELETE FROM idempotency WHERE org_id = ? AND scope = ? AND key = ? AND status_code IS NULL'),
      deleteOwnIdem: prepare(`DELETE FROM idempotency WHERE org_id = ? AND scope = ? AND key = ? AND status_code IS NULL
                                AND lease_owner = ?`),
      fenceIdem: prepare(`SELECT 1 FROM idempotency WHERE org_id = ? AND scope = ? AND key = ? AND status_code IS NULL
                            AND lease_owner = ?`),
      deletePendingIdem: prepare('DELETE FROM idempotency WHERE status_code IS NULL'),
      deleteJob: prepare('DELETE FROM background_jobs WHERE response_id = ? AND org_id = ?'),
      listJobs: prepare('SELECT * FROM background_jobs ORDER BY created_at, response_id'),
    };
  }

  async ensureOrganization(name: string): Promise<Organization> {
    this.stmt['insertOrg']!.run(`org_${randomUUID().replace(/-/g, '')}`, name, Math.floor(Date.now() / 1000));
    const row = this.stmt['orgByName']!.get(name) as Row;
    return { id: row['id'] as string, name: row['name'] as string, createdAt: row['created_at'] as number };
  }

  async getOrganizationByName(name: string): Promise<Organization | undefined> {
    const row = this.stmt['orgByName']!.get(name) as Row | undefined;
    return row && { id: row['id'] as string, name: row['name'] as string, createdAt: row['created_at'] as number };
  }

  async insertApiKey(key: { id: string; orgId: string; hash: string; prefix: string; createdAt: number }): Promise<void> {
    this.stmt['insertKey']!.run(key.id, key.orgId, key.hash, key.prefix, key.createdAt);
  }

  async findActiveKeyByHash(hash: string): Promise<ApiKeyInfo | undefined> {
    const row = this.stmt['keyByHash']!.get(hash) as Row | undefined;
    return row && keyInfo(row);
  }

  async listApiKeys(): Promise<ApiKeyInfo[]> {
    return (this.stmt['listKeys']!.all() as Row[]).map(keyInfo);
  }

  async revokeApiKey(idOrHash: string, at: number): Promise<boolean> {
    return this.stmt['revokeKey']!.run(at, idOrHash, idOrHash).changes > 0;
  }

  async countActiveApiKeys(): Promise<number> {
    return (this.stmt['countKeys']!.get() as { n: number }).n;
  }

  async insertResponse(orgId: string, body: ResponseBody): Promise<void> {
    const now = Math.floor(Date.now() / 1000);
    const createdAt = typeof body['created_at'] === 'number' ? body['created_at'] : now;
    this.stmt['insertResponse']!.run(body.id, orgId, body.status, createdAt, now, JSON.stringify(body));
  }

  async updateResponse(orgId: string, body: ResponseBody): Promise<boolean> {
    const now = Math.floor(Date.now() / 1000);
    return this.stmt['updateResponse']!.run(body.status, now, JSON.stringify(body), body.id, orgId).changes > 0;
  }

  async getResponse(orgId: string, id: string): Promise<ResponseBody | undefined> {
    const row = this.stmt['getResponse']!.get(id, orgId) as { body: string } | undefined;
    return row && (JSON.parse(row.body) as ResponseBody);
  }

  async putResponseInput(orgId: string, responseId: string, items: Record<string, unknown>[]): Promise<void> {
    this.stmt['putResponseInput']!.run(responseId, orgId, JSON.stringify(items));
  }

  async getResponseInput(orgId: string, responseId: string): Promise<Record<string, unknown>[] | undefined> {
    const row = this.stmt['getResponseInput']!.get(responseId, orgId) as { items: string } | undefined;
    return row && (JSON.parse(row.items) as Record<string, unknown>[]);
  }

  async deleteResponse(orgId: string, id: string): Promise<boolean> {
    return this.db.transaction(() => {
      this.stmt['deleteResponseInput']!.run(id, orgId);
      return this.stmt['deleteResponse']!.run(id, orgId).changes > 0;
    })();
  }

  async insertFile(f: FileRecord): Promise<void> {
    this.stmt['insertFile']!.run(f.id, f.orgId, f.bytes, f.createdAt, f.filename, f.purpose, f.status, f.statusDetails);
  }

  async getFile(orgId: string, id: string): Promise<FileRecord | undefined> {
    const row = this.stmt['getFile']!.get(id, orgId) as Row | undefined;
    return row && fileRecord(row);
  }

  async listFiles(orgId: string, opts: { limit: number; purpose?: string; after?: string }): Promise<FileRecord[]> {
    const purpose = opts.purpose ?? null;
    const after = opts.after ?? null;
    return (this.stmt['listFiles']!.all(orgId, purpose, purpose, after, orgId, opts.limit) as Row[]).map(fileRecord);
  }

  async deleteFile(orgId: string, id: string): Promise<boolean> {
    return this.stmt['deleteFile']!.run(id, orgId).changes > 0;
  }

  async beginIdempotency(orgId: string, scope: string, key: string, requestHash: string, at: number, lease: LeaseTerm): Promise<IdempotencyBegin> {
    return this.leases.beginIdempotency(orgId, scope, key, requestHash, at, lease);
  }

  async completeIdempotency(orgId: string, scope: string, key: string, statusCode: number, body: unknown): Promise<void> {
    this.stmt['completeIdem']!.run(statusCode, JSON.stringify(body), orgId, scope, key);
  }

  async abandonIdempotency(orgId: string, scope: string, key: string, leaseOwner?: string): Promise<void> {
    if (leaseOwner === undefined) this.stmt['deleteIdem']!.run(orgId, scope, key);
    else this.stmt['deleteOwnIdem']!.run(orgId, scope, key, leaseOwner);
  }

  async releasePendingIdempotency(): Promise<number> {
    return this.stmt['deletePendingIdem']!.run().changes;
  }

  async close(): Promise<void> {
    if (this.db.open) this.db.close();
  }

  /**
   * Gives the file system back the pages that deleted rows left free (a finished batch's result
   * rows): an incremental vacuum, then a checkpoint that truncates the WAL, which the vacuum just
   * grew. Cheap when nothing is free; run it after large deletions. The vacuum goes in steps of
   * RECLAIM_STEP_PAGES with the event loop free between them (better-sqlite3 is synchronous, and
   * freeing hundreds of megabytes at once would hold every request).
   */
  async reclaimSpace(): Promise<void> {
    while (this.db.open && (this.db.pragma('freelist_count', { simple: true }) as number) > 0) {
      this.db.pragma(`incremental_vacuum(${RECLAIM_STEP_PAGES})`);
      await new Promise((resolve) => setImmediate(resolve));
    }
    if (this.db.open) this.db.pragma('wal_checkpoint(TRUNCATE)');
  }

  // Background jobs (leases in sqlite-leases.ts).
  private leaseTables: SqliteLeases | undefined;
  private get leases(): SqliteLeases {
    return (this.leaseTables ??= new SqliteLeases(this.db));
  }

  async insertBackgroundResponse(body: ResponseBody, job: BackgroundJob, lease: LeaseTerm): Promise<void> {
    this.db.transaction(() => {
      this.leases.insertJob(job, lease);
      const now = Math.floor(Date.now() / 1000);
      this.stmt['insertResponse']!.run(body.id, job.orgId, body.status, job.createdAt, now, JSON.stringify(body));
    })();
  }

  async finishBackgroundResponse(orgId: string, body: ResponseBody): Promise<void> {
    this.db.transaction(() => {
      this.stmt['updateResponse']!.run(body.status, Math.floor(Date.now() / 1000), JSON.stringify(body), body.id, orgId);
      this.stmt['deleteJob']!.run(body.id, orgId);
    })();
  }

  async listBackgroundJobs(): Promise<BackgroundJob[]> {
    return (this.stmt['listJobs']!.all() as Row[]).map(backgroundJob);
  }

  async getBackgroundJob(orgId: string, responseId: string): Promise<BackgroundJob | undefined> {
    return this.leases.getJob(orgId, responseId);
  }

  async claimBackgroundJobs(lease: LeaseTerm, limit: number): Promise<BackgroundJob[]> {
    return this.leases.claim(lease, limit);
  }

  async renewLeases(lease: LeaseTerm): Promise<string[]> {
    return this.leases.renew(lease);
  }

  async releaseLeases(owner: string): Promise<void> {
    this.leases.release(owner);
  }

  async releaseBackgroundJob(responseId: string, owner: string): Promise<void> {
    this.leases.releaseJob(responseId, owner);
  }

  async releaseAllLeases(): Promise<void> {
    this.leases.releaseAll();
  }

  async cancelBackgroundResponse(orgId: string, cancelled: ResponseBody, delivery?: WebhookDelivery): Promise<boolean> {
    return this.db.transaction((): boolean => {
      if (!this.leases.takeForCancel(orgId, cancelled.id)) return false;
      this.stmt['updateResponse']!.run(cancelled.status, Math.floor(Date.now() / 1000), JSON.stringify(cancelled), cancelled.id, orgId);
      if (delivery) this.webhooks.insert(delivery);
      return true;
    }).immediate();
  }

  // Webhook deliveries (sqlite-webhooks.ts).
  private webhookTables: SqliteWebhooks | undefined;
  private get webhooks(): SqliteWebhooks {
    return (this.webhookTables ??= new SqliteWebhooks(this.db));
  }

  async insertWebhookDelivery(d: WebhookDelivery): Promise<void> {
    this.webhooks.insert(d);
  }

  async claimDueWebhookDeliveries(lease: LeaseTerm, limit: number, caps: WebhookClaimCaps): Promise<WebhookDelivery[]> {
    return this.webhooks.claimDue(lease, limit, caps);
  }

  async renewWebhookLeases(lease: LeaseTerm): Promise<string[]> {
    return this.webhooks.renew(lease);
  }

  async updateWebhookDelivery(id: string, owner: string, u: WebhookDeliveryUpdate): Promise<boolean> {
    return this.webhooks.update(id, owner, u);
  }

  async releaseAllWebhookLeases(nowMs: number): Promise<number> {
    return this.webhooks.releaseAll(nowMs);
  }

  async nextWebhookAttemptMs(afterMs: number): Promise<number | undefined> {
    return this.webhooks.nextAttemptMs(afterMs);
  }

  async countPendingWebhookDeliveries(): Promise<number> {
    return this.webhooks.countPending();
  }

  // The end of a request: one transaction over the tables above and the delegates' tables.
  async commitRequestEnd(end: RequestEnd): Promise<RequestEndCommit> {
    return this.db.transaction((): RequestEndCommit => {
      const { response, idempotency, batchResult } = end;
      // The fences first, before any write: an end whose work this replica no longer holds writes nothing.
      if (response?.kind === 'background' && !this.leases.fenceBackgroundEnd(response.orgId, response.body.id, response.leaseOwner)) {
        return { batchResultRecorded: false, backgroundLeaseLost: true };
      }
      if (idempotency?.leaseOwner !== undefined
        && this.stmt['fenceIdem']!.get(idempotency.orgId, idempotency.scope, idempotency.key, idempotency.leaseOwner) === undefined) {
        return { batchResultRecorded: false, idempotencyLeaseLost: true };
      }
      // A fenced batch line whose chunk this replica no longer holds (or whose batch is ending) writes nothing.
      if (batchResult?.lease && !this.batches.fenced(batchResult.batchId, batchResult.lease.chunkNo, batchResult.lease.owner)) {
        return { batchResultRecorded: false, batchLeaseLost: true };
      }
      if (response?.kind === 'foreground') {
        const createdAt = typeof response.body['created_at'] === 'number' ? response.body['created_at'] : Math.floor(Date.now() / 1000);
        this.stmt['insertResponse']!.run(response.body.id, response.orgId, response.body.status, createdAt,
          Math.floor(Date.now() / 1000), JSON.stringify(response.body));
      } else if (response?.kind === 'background') {
        this.stmt['updateResponse']!.run(response.body.status, Math.floor(Date.now() / 1000), JSON.stringify(response.body),
          response.body.id, response.orgId);
      }
      if (idempotency) {
        this.stmt['completeIdem']!.run(idempotency.statusCode, JSON.stringify(idempotency.body), idempotency.orgId, idempotency.scope, idempotency.key);
      }
      const batchResultRecorded = batchResult ? this.batches.recordResult(batchResult.batchId, batchResult.result, batchResult.progress) : false;
      if (end.usage) this.usage.insertUsage(end.usage);
      if (end.delivery) this.webhooks.insert(end.delivery);
      return { batchResultRecorded };
    }).immediate();
  }

  // Batches.
  private batchTables: SqliteBatches | undefined;
  private get batches(): SqliteBatches {
    return (this.batchTables ??= new SqliteBatches(this.db));
  }

  async insertBatch(batch: BatchRecord): Promise<void> {
    this.batches.insert(batch);
  }

  async getBatch(orgId: string, id: string): Promise<BatchRecord | undefined> {
    return this.batches.get(orgId, id);
  }

  async listBatches(orgId: string, opts: { limit: number; after?: string; before?: string }): Promise<BatchRecord[]> {
    return this.batches.list(orgId, opts);
  }

  async listUnfinishedBatches(): Promise<BatchRecord[]> {
    return this.batches.listUnfinished();
  }

  async transitionBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch): Promise<BatchRecord | undefined> {
    return this.batches.transition(id, from, patch);
  }

  async recordBatchResult(id: string, result: BatchResultRow, progress: BatchProgress): Promise<boolean> {
    return this.batches.recordResult(id, result, progress);
  }

  async listBatchResultLines(id: string, fromLine: number, toLine?: number): Promise<number[]> {
    return this.batches.resultLines(id, fromLine, toLine);
  }

  async listBatchResults(id: string, afterLine: number, limit: number): Promise<BatchResultRow[]> {
    return this.batches.results(id, afterLine, limit);
  }

  async finishBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch, files: FileRecord[]): Promise<BatchRecord | undefined> {
    return this.batches.finish(id, from, patch, files);
  }

  // Batch work under leases (sqlite-batches.ts).
  async listBatchWork(owner: string, nowMs: number): Promise<BatchRecord[]> {
    return this.batches.work(owner, nowMs);
  }

  async claimBatch(id: string, lease: LeaseTerm): Promise<BatchClaim | undefined> {
    return this.batches.claimBatch(id, lease);
  }

  async startBatchChunks(id: string, owner: string, from: readonly BatchStatus[], patch: BatchPatch, chunks: BatchChunkBounds[]): Promise<BatchRecord | undefined> {
    return this.batches.startChunks(id, owner, from, patch, chunks);
  }

  async claimBatchChunks(lease: LeaseTerm, limit: number, skipBatchIds: readonly string[], skipOrgIds: readonly string[] = []): Promise<ClaimedBatchChunk[]> {
    return this.batches.claimChunks(lease, limit, skipBatchIds, skipOrgIds);
  }

  async renewBatchLeases(lease: LeaseTerm): Promise<HeldBatchLeases> {
    return this.batches.renew(lease);
  }

  async finishBatchChunk(batchId: string, chunkNo: number, owner: string): Promise<boolean> {
    return this.batches.finishChunk(batchId, chunkNo, owner);
  }

  async releaseBatchLease(batchId: string, owner: string, chunkNo?: number): Promise<void> {
    this.batches.releaseOne(batchId, owner, chunkNo);
  }

  async releaseBatchLeases(owner?: string): Promise<number> {
    return this.batches.release(owner);
  }

  // Usage ledger.
  private usageTables: SqliteUsage | undefined;
  private get usage(): SqliteUsage {
    return (this.usageTables ??= new SqliteUsage(this.db));
  }

  async listUsage(filter: { orgName?: string; sinceMs?: number }): Promise<UsageRecord[]> {
    return this.usage.listUsage(filter);
  }

  async setApiKeyAdmin(keyId: string, admin: boolean): Promise<boolean> {
    return this.usage.setApiKeyAdmin(keyId, admin);
  }

  async isAdminKey(keyId: string): Promise<boolean> {
    return this.usage.isAdminKey(keyId);
  }
}

/**
 * Makes the database's directory (0700) and an empty database file (0600) when missing, and
 * tightens an existing file and its -wal/-shm to 0600. SQLite creates -wal and -shm with the
 * database file's mode, so they follow.
 */
function createPrivately(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  if (!existsSync(path)) closeSync(openSync(path, 'a', 0o600));
  for (const file of [path, `${path}-wal`, `${path}-shm`]) {
    if (existsSync(file)) chmodSync(file, 0o600);
  }
}

/**
 * Auto-vacuum INCREMENTAL keeps a map of free pages so that reclaimSpace can hand them back.
 * A database made before this setting needs one VACUUM to switch (it rewrites the file; run
 * outside any transaction, before WAL mode is set); a new, empty one takes it directly.
 */
function useIncrementalVacuum(db: Database.Database): void {
  const INCREMENTAL = 2;
  if (db.pragma('auto_vacuum', { simple: true }) === INCREMENTAL) return;
  db.pragma('auto_vacuum = INCREMENTAL');
  if ((db.pragma('page_count', { simple: true }) as number) === 0) return;
  try {
    db.exec('VACUUM');
  } catch (err) {
    // Another process is in the database (a CLI command next to a server of an older version):
    // the switch waits for the next open; nothing else depends on it.
    if (!(err as { code?: string }).code?.startsWith('SQLITE_BUSY')) throw err;
  }
}

function migrate(db: Database.Database): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > SQLITE_MIGRATIONS.length) {
    throw new Error(`the database was written by a newer sluice (schema version ${current}, this one knows ${SQLITE_MIGRATIONS.length})`);
  }
  for (let v = current; v < SQLITE_MIGRATIONS.length; v++) {
    db.transaction(() => {
      db.exec(SQLITE_MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
}
