// The store on PostgreSQL (the maintained `pg` driver): the same Store interface and semantics as
// SqliteStore, for several processes sharing one database. Selected by `sluice serve --database-url`
// (the databaseUrl option; SQLite stays the default). Background jobs and in-progress idempotency
// keys run under leases (leases.ts, postgres-leases.ts), so each runs on one replica at a time.
//
// Writes that SQLite groups in a transaction are one transaction here too, on one pooled client
// (commitRequestEnd above all: response, ledger row, webhook delivery, idempotency result and batch
// result row commit together or not at all). Races are settled by the database, never by timing:
// status changes are compare-and-set UPDATEs, idempotency keys and ledger rows are unique by
// constraints (INSERT ... ON CONFLICT), and the fair webhook claim is serialized by an advisory
// lock. Every statement is parameterized. Batches, the usage ledger, webhook deliveries and leased
// work live in postgres-batches.ts, postgres-usage.ts, postgres-webhooks.ts and postgres-leases.ts; integers come back exact
// (postgres-db.ts).

import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus } from './batch-records.js';
import type { BatchChunkBounds, BatchClaim, ClaimedBatchChunk, HeldBatchLeases } from './batch-records.js';
import { postgresBatches } from './postgres-batches.js';
import { postgresLeases } from './postgres-leases.js';
import type { LeaseTerm } from './leases.js';
import { STORE_TYPES, type Db, type Row } from './postgres-db.js';
import { migratePostgres } from './postgres-migrations.js';
import { postgresUsage } from './postgres-usage.js';
import { postgresWebhooks } from './postgres-webhooks.js';
import type { ApiKeyInfo, BackgroundJob, FileRecord, IdempotencyBegin, Organization, ResponseBody, Store } from './store.js';
import type { RequestEnd, RequestEndCommit, UsageRecord, WebhookClaimCaps, WebhookDelivery, WebhookDeliveryUpdate } from './store.js';
import { backgroundJob, fileRecord, keyInfo } from './store-rows.js';

export interface PostgresStoreOptions {
  /**
   * The schema holding sluice's tables (created when missing); the connection's default
   * (normally `public`) when absent. Lower-case letters, digits and underscores.
   */
  schema?: string;
  /** Most connections the pool opens (pg's default: 10). */
  maxConnections?: number;
  /** Milliseconds a new connection may take before it fails (pg's default: no limit). */
  connectTimeoutMs?: number;
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

function organization(row: Row): Organization {
  return { id: row['id'] as string, name: row['name'] as string, createdAt: row['created_at'] as number };
}

const nowSeconds = () => Math.floor(Date.now() / 1000);
/** The responses.created_at column: the body's created_at when it has one (whole seconds), else now. */
const createdAtOf = (body: ResponseBody) => (typeof body['created_at'] === 'number' ? Math.floor(body['created_at']) : nowSeconds());

const KEY_SELECT = 'SELECT k.*, o.name AS org_name FROM api_keys k JOIN organizations o ON o.id = k.org_id';

export class PostgresStore implements Store {
  readonly shared = true;
  private constructor(private readonly pool: pg.Pool) {}

  /**
   * Connects to the database at `url` (postgres://user:password@host:port/database) and applies
   * pending migrations (migratePostgres: under an advisory lock, so replicas may start together).
   */
  static async open(url: string, opts: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const { schema } = opts;
    if (schema !== undefined && !SCHEMA_NAME.test(schema)) throw new Error(`invalid PostgreSQL schema name: ${schema}`);
    const pool = new pg.Pool({
      connectionString: url,
      types: STORE_TYPES,
      ...(opts.maxConnections !== undefined ? { max: opts.maxConnections } : {}),
      ...(opts.connectTimeoutMs !== undefined ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}),
      // The schema is checked above to be a plain identifier; search_path makes every unqualified table name its own.
      ...(schema !== undefined ? { options: `-c search_path=${schema}` } : {}),
    });
    // An idle client's connection error (the server restarting) must not crash the process; the
    // next query gets a fresh connection.
    pool.on('error', () => {});
    try {
      const client = await pool.connect();
      try {
        await migratePostgres(client, undefined, schema);
      } finally {
        client.release();
      }
    } catch (err) {
      await pool.end();
      throw err;
    }
    return new PostgresStore(pool);
  }

  /** Runs `fn` in one transaction on one pooled client: committed when it returns, rolled back when it throws. */
  private async transaction<T>(fn: (tx: Db) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    let broken = false;
    try {
      await client.query('BEGIN');
      try {
        const result = await fn(client);
        await client.query('COMMIT');
        return result;
      } catch (err) {
        // A connection that cannot even roll back is dropped, not handed back to the pool.
        await client.query('ROLLBACK').catch(() => { broken = true; });
        throw err;
      }
    } finally {
      client.release(broken);
    }
  }

  private async one(text: string, values?: unknown[]): Promise<Row | undefined> {
    return (await this.pool.query(text, values)).rows[0];
  }

  private async changed(text: string, values?: unknown[]): Promise<number> {
    return (await this.pool.query(text, values)).rowCount ?? 0;
  }

  // Organizations and keys.
  async ensureOrganization(name: string): Promise<Organization> {
    await this.pool.query('INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING',
      [`org_${randomUUID().replace(/-/g, '')}`, name, nowSeconds()]);
    return organization((await this.one('SELECT * FROM organizations WHERE name = $1', [name]))!);
  }

  async getOrganizationByName(name: string): Promise<Organization | undefined> {
    const row = await this.one('SELECT * FROM organizations WHERE name = $1', [name]);
    return row && organization(row);
  }

  async insertApiKey(key: { id: string; orgId: string; hash: string; prefix: string; createdAt: number }): Promise<void> {
    await this.pool.query('INSERT INTO api_keys (id, org_id, hash, prefix, created_at) VALUES ($1, $2, $3, $4, $5)',
      [key.id, key.orgId, key.hash, key.prefix, key.createdAt]);
  }

  async findActiveKeyByHash(hash: string): Promise<ApiKeyInfo | undefined> {
    const row = await this.one(`${KEY_SELECT} WHERE k.hash = $1 AND k.revoked_at IS NULL`, [hash]);
    return row && keyInfo(row);
  }

  async listApiKeys(): Promise<ApiKeyInfo[]> {
    return (await this.pool.query(`${KEY_SELECT} ORDER BY k.created_at, k.id COLLATE "C"`)).rows.map(keyInfo);
  }

  async revokeApiKey(idOrHash: string, at: number): Promise<boolean> {
    return (await this.changed('UPDATE api_keys SET revoked_at = $1 WHERE (id = $2 OR hash = $2) AND revoked_at IS NULL', [at, idOrHash])) > 0;
  }

  async countActiveApiKeys(): Promise<number> {
    return (await this.one('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL'))!['n'] as number;
  }

  // Responses.
  private static async insertResponseRow(db: Db, orgId: string, body: ResponseBody, createdAt: number): Promise<void> {
    await db.query('INSERT INTO responses (id, org_id, status, created_at, updated_at, body) VALUES ($1, $2, $3, $4, $5, $6)',
      [body.id, orgId, body.status, createdAt, nowSeconds(), JSON.stringify(body)]);
  }

  private static async updateResponseRow(db: Db, orgId: string, body: ResponseBody): Promise<number> {
    return (await db.query('UPDATE responses SET status = $1, updated_at = $2, body = $3 WHERE id = $4 AND org_id = $5',
      [body.status, nowSeconds(), JSON.stringify(body), body.id, orgId])).rowCount ?? 0;
  }

  async insertResponse(orgId: string, body: ResponseBody): Promise<void> {
    await PostgresStore.insertResponseRow(this.pool, orgId, body, createdAtOf(body));
  }

  async updateResponse(orgId: string, body: ResponseBody): Promise<boolean> {
    return (await PostgresStore.updateResponseRow(this.pool, orgId, body)) > 0;
  }

  async getResponse(orgId: string, id: string): Promise<ResponseBody | undefined> {
    const row = await this.one('SELECT body FROM responses WHERE id = $1 AND org_id = $2', [id, orgId]);
    return row && (JSON.parse(row['body'] as string) as ResponseBody);
  }

  async putResponseInput(orgId: string, responseId: string, items: Record<string, unknown>[]): Promise<void> {
    await this.pool.query(`INSERT INTO response_inputs (response_id, org_id, items) VALUES ($1, $2, $3)
                           ON CONFLICT (response_id) DO UPDATE SET org_id = EXCLUDED.org_id, items = EXCLUDED.items`,
    [responseId, orgId, JSON.stringify(items)]);
  }

  async getResponseInput(orgId: string, responseId: string): Promise<Record<string, unknown>[] | undefined> {
    const row = await this.one('SELECT items FROM response_inputs WHERE response_id = $1 AND org_id = $2', [responseId, orgId]);
    return row && (JSON.parse(row['items'] as string) as Record<string, unknown>[]);
  }

  async deleteResponse(orgId: string, id: string): Promise<boolean> {
    return this.transaction(async (tx) => {
      await tx.query('DELETE FROM response_inputs WHERE response_id = $1 AND org_id = $2', [id, orgId]);
      return ((await tx.query('DELETE FROM responses WHERE id = $1 AND org_id = $2', [id, orgId])).rowCount ?? 0) > 0;
    });
  }

  // Files.
  async insertFile(f: FileRecord): Promise<void> {
    await this.pool.query(`INSERT INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    [f.id, f.orgId, f.bytes, f.createdAt, f.filename, f.purpose, f.status, f.statusDetails]);
  }

  async getFile(orgId: string, id: string): Promise<FileRecord | undefined> {
    const row = await this.one('SELECT * FROM files WHERE id = $1 AND org_id = $2', [id, orgId]);
    return row && fileRecord(row);
  }

  async listFiles(orgId: string, opts: { limit: number; purpose?: string; after?: string }): Promise<FileRecord[]> {
    const { rows } = await this.pool.query(`SELECT * FROM files WHERE org_id = $1 AND ($2::text IS NULL OR purpose = $2)
        AND seq < COALESCE((SELECT seq FROM files WHERE id = $3 AND org_id = $1), 9223372036854775807)
        ORDER BY seq DESC LIMIT $4`, [orgId, opts.purpose ?? null, opts.after ?? null, opts.limit]);
    return rows.map(fileRecord);
  }

  async deleteFile(orgId: string, id: string): Promise<boolean> {
    return (await this.changed('DELETE FROM files WHERE id = $1 AND org_id = $2', [id, orgId])) > 0;
  }

  // Idempotency keys.
  async beginIdempotency(orgId: string, scope: string, key: string, requestHash: string, at: number, lease: LeaseTerm): Promise<IdempotencyBegin> {
    return postgresLeases.beginIdempotency(this.pool, orgId, scope, key, requestHash, at, lease);
  }

  private static async completeIdempotencyRow(db: Db, orgId: string, scope: string, key: string, statusCode: number, body: unknown): Promise<void> {
    await db.query('UPDATE idempotency SET status_code = $1, body = $2 WHERE org_id = $3 AND scope = $4 AND key = $5',
      [statusCode, JSON.stringify(body), orgId, scope, key]);
  }

  async completeIdempotency(orgId: string, scope: string, key: string, statusCode: number, body: unknown): Promise<void> {
    await PostgresStore.completeIdempotencyRow(this.pool, orgId, scope, key, statusCode, body);
  }

  async abandonIdempotency(orgId: string, scope: string, key: string, leaseOwner?: string): Promise<void> {
    await this.pool.query(`DELETE FROM idempotency WHERE org_id = $1 AND scope = $2 AND key = $3 AND status_code IS NULL
        AND ($4::text IS NULL OR lease_owner = $4)`, [orgId, scope, key, leaseOwner ?? null]);
  }

  async releasePendingIdempotency(): Promise<number> {
    return this.changed('DELETE FROM idempotency WHERE status_code IS NULL');
  }

  private closed = false;
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }

  /**
   * PostgreSQL's autovacuum makes deleted rows' space reusable on its own; after a large deletion
   * (a finished batch's result rows) this runs a VACUUM of that table now, so the space is reused
   * (and a truncatable tail handed back) without waiting for autovacuum's thresholds.
   */
  async reclaimSpace(): Promise<void> {
    await this.pool.query('VACUUM batch_results');
  }

  // The end of a request: one transaction over every table it touches.
  async commitRequestEnd(end: RequestEnd): Promise<RequestEndCommit> {
    return this.transaction(async (tx): Promise<RequestEndCommit> => {
      const { response, idempotency, batchResult } = end;
      // The fences first, before any write: an end whose work this replica no longer holds writes nothing.
      if (response?.kind === 'background' && !(await postgresLeases.fenceBackgroundEnd(tx, response.orgId, response.body.id, response.leaseOwner))) {
        return { batchResultRecorded: false, backgroundLeaseLost: true };
      }
      if (idempotency?.leaseOwner !== undefined) {
        // Locks the key's row until the commit: a takeover (beginIdempotency) waits for it.
        const held = await tx.query(`SELECT 1 FROM idempotency WHERE org_id = $1 AND scope = $2 AND key = $3 AND status_code IS NULL
            AND lease_owner = $4 FOR UPDATE`, [idempotency.orgId, idempotency.scope, idempotency.key, idempotency.leaseOwner]);
        if (held.rowCount === 0) return { batchResultRecorded: false, idempotencyLeaseLost: true };
      }
      // A batch line whose chunk this replica no longer holds (or whose batch is ending) writes nothing.
      if (batchResult?.lease && !(await postgresBatches.fence(tx, batchResult.batchId, batchResult.lease.chunkNo, batchResult.lease.owner))) {
        return { batchResultRecorded: false, batchLeaseLost: true };
      }
      if (response?.kind === 'foreground') {
        await PostgresStore.insertResponseRow(tx, response.orgId, response.body, createdAtOf(response.body));
      } else if (response?.kind === 'background') {
        await PostgresStore.updateResponseRow(tx, response.orgId, response.body);
      }
      if (idempotency) {
        await PostgresStore.completeIdempotencyRow(tx, idempotency.orgId, idempotency.scope, idempotency.key, idempotency.statusCode, idempotency.body);
      }
      const batchResultRecorded = batchResult
        ? await postgresBatches.recordResult(tx, batchResult.batchId, batchResult.result, batchResult.progress)
        : false;
      if (end.usage) await postgresUsage.insertUsage(tx, end.usage);
      if (end.delivery) await postgresWebhooks.insert(tx, end.delivery);
      return { batchResultRecorded };
    });
  }

  // Background jobs (leases in postgres-leases.ts).
  async insertBackgroundResponse(body: ResponseBody, job: BackgroundJob, lease: LeaseTerm): Promise<void> {
    await this.transaction(async (tx) => {
      await postgresLeases.insertJob(tx, job, lease);
      await PostgresStore.insertResponseRow(tx, job.orgId, body, job.createdAt);
    });
  }

  async finishBackgroundResponse(orgId: string, body: ResponseBody): Promise<void> {
    await this.transaction(async (tx) => {
      await PostgresStore.updateResponseRow(tx, orgId, body);
      await tx.query('DELETE FROM background_jobs WHERE response_id = $1 AND org_id = $2', [body.id, orgId]);
    });
  }

  async listBackgroundJobs(): Promise<BackgroundJob[]> {
    const { rows } = await this.pool.query('SELECT * FROM background_jobs ORDER BY created_at, response_id COLLATE "C"');
    return rows.map(backgroundJob);
  }

  async getBackgroundJob(orgId: string, responseId: string): Promise<BackgroundJob | undefined> {
    return postgresLeases.getJob(this.pool, orgId, responseId);
  }

  async claimBackgroundJobs(lease: LeaseTerm, limit: number): Promise<BackgroundJob[]> {
    return this.transaction((tx) => postgresLeases.claim(tx, lease, limit));
  }

  async renewLeases(lease: LeaseTerm): Promise<string[]> {
    return postgresLeases.renew(this.pool, lease);
  }

  async releaseLeases(owner: string): Promise<void> {
    await this.transaction((tx) => postgresLeases.release(tx, owner));
  }

  async releaseBackgroundJob(responseId: string, owner: string): Promise<void> {
    await postgresLeases.releaseJob(this.pool, responseId, owner);
  }

  async releaseAllLeases(): Promise<void> {
    await this.transaction((tx) => postgresLeases.release(tx, undefined));
  }

  async cancelBackgroundResponse(orgId: string, cancelled: ResponseBody, delivery?: WebhookDelivery): Promise<boolean> {
    return this.transaction(async (tx) => {
      if (!(await postgresLeases.takeForCancel(tx, orgId, cancelled.id))) return false;
      await PostgresStore.updateResponseRow(tx, orgId, cancelled);
      if (delivery) await postgresWebhooks.insert(tx, delivery);
      return true;
    });
  }

  // Webhook deliveries (postgres-webhooks.ts).
  async insertWebhookDelivery(d: WebhookDelivery): Promise<void> {
    await postgresWebhooks.insert(this.pool, d);
  }

  async claimDueWebhookDeliveries(lease: LeaseTerm, limit: number, caps: WebhookClaimCaps): Promise<WebhookDelivery[]> {
    return this.transaction((tx) => postgresWebhooks.claimDue(tx, lease, limit, caps));
  }

  async renewWebhookLeases(lease: LeaseTerm): Promise<string[]> {
    return postgresWebhooks.renew(this.pool, lease);
  }

  async updateWebhookDelivery(id: string, owner: string, u: WebhookDeliveryUpdate): Promise<boolean> {
    return postgresWebhooks.update(this.pool, id, owner, u);
  }

  async releaseAllWebhookLeases(nowMs: number): Promise<number> {
    return postgresWebhooks.releaseAll(this.pool, nowMs);
  }

  async nextWebhookAttemptMs(afterMs: number): Promise<number | undefined> {
    return postgresWebhooks.nextAttemptMs(this.pool, afterMs);
  }

  async countPendingWebhookDeliveries(): Promise<number> {
    return postgresWebhooks.countPending(this.pool);
  }

  // Batches (postgres-batches.ts).
  async insertBatch(batch: BatchRecord): Promise<void> {
    await postgresBatches.insert(this.pool, batch);
  }

  async getBatch(orgId: string, id: string): Promise<BatchRecord | undefined> {
    return postgresBatches.get(this.pool, orgId, id);
  }

  async listBatches(orgId: string, opts: { limit: number; after?: string; before?: string }): Promise<BatchRecord[]> {
    return postgresBatches.list(this.pool, orgId, opts);
  }

  async listUnfinishedBatches(): Promise<BatchRecord[]> {
    return postgresBatches.listUnfinished(this.pool);
  }

  async transitionBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch): Promise<BatchRecord | undefined> {
    return postgresBatches.transition(this.pool, id, from, patch);
  }

  async recordBatchResult(id: string, result: BatchResultRow, progress: BatchProgress): Promise<boolean> {
    return this.transaction((tx) => postgresBatches.recordResult(tx, id, result, progress));
  }

  async listBatchResultLines(id: string, fromLine: number, toLine?: number): Promise<number[]> {
    return postgresBatches.resultLines(this.pool, id, fromLine, toLine);
  }

  async listBatchResults(id: string, afterLine: number, limit: number): Promise<BatchResultRow[]> {
    return postgresBatches.results(this.pool, id, afterLine, limit);
  }

  async finishBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch, files: FileRecord[]): Promise<BatchRecord | undefined> {
    const ended = await this.transaction((tx) => postgresBatches.finish(tx, id, from, patch, files));
    if (ended) await postgresBatches.dropChunks(this.pool, id);
    return ended;
  }

  // Batch work under leases (postgres-batches.ts). Renewals and releases are one statement per
  // table, each its own transaction, so none holds a batch row's lock while it takes chunk locks.
  async listBatchWork(owner: string, nowMs: number): Promise<BatchRecord[]> {
    return postgresBatches.work(this.pool, owner, nowMs);
  }

  async claimBatch(id: string, lease: LeaseTerm): Promise<BatchClaim | undefined> {
    return postgresBatches.claimBatch(this.pool, id, lease);
  }

  async startBatchChunks(id: string, owner: string, from: readonly BatchStatus[], patch: BatchPatch, chunks: BatchChunkBounds[]): Promise<BatchRecord | undefined> {
    return this.transaction((tx) => postgresBatches.startChunks(tx, id, owner, from, patch, chunks));
  }

  async claimBatchChunks(lease: LeaseTerm, limit: number, skipBatchIds: readonly string[], skipOrgIds: readonly string[] = []): Promise<ClaimedBatchChunk[]> {
    return this.transaction((tx) => postgresBatches.claimChunks(tx, lease, limit, skipBatchIds, skipOrgIds));
  }

  async renewBatchLeases(lease: LeaseTerm): Promise<HeldBatchLeases> {
    return postgresBatches.renew(this.pool, lease);
  }

  async finishBatchChunk(batchId: string, chunkNo: number, owner: string): Promise<boolean> {
    return this.transaction((tx) => postgresBatches.finishChunk(tx, batchId, chunkNo, owner));
  }

  async releaseBatchLease(batchId: string, owner: string, chunkNo?: number): Promise<void> {
    await postgresBatches.releaseOne(this.pool, batchId, owner, chunkNo);
  }

  async releaseBatchLeases(owner?: string): Promise<number> {
    return postgresBatches.release(this.pool, owner);
  }

  // Usage ledger (postgres-usage.ts).
  async listUsage(filter: { orgName?: string; sinceMs?: number }): Promise<UsageRecord[]> {
    return postgresUsage.listUsage(this.pool, filter);
  }

  async setApiKeyAdmin(keyId: string, admin: boolean): Promise<boolean> {
    return postgresUsage.setApiKeyAdmin(this.pool, keyId, admin);
  }

  async isAdminKey(keyId: string): Promise<boolean> {
    return postgresUsage.isAdminKey(this.pool, keyId);
  }
}
