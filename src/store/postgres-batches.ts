// The batch tables of the PostgreSQL store: PostgresStore delegates its batch methods here, as
// SqliteStore does to sqlite-batches.ts. Each method takes the connection to run on (the pool, or
// the client of a transaction the store holds open).
//
// Every status change is one compare-and-set statement, UPDATE ... WHERE status = ANY(from), so the
// runner and a cancel request racing on one batch, on any replicas, cannot both win. A result row
// is unique by its primary key (batch, line): a line recorded twice is neither stored nor counted
// again, whoever records it.

import type {
  BatchChunkBounds, BatchClaim, BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus, ClaimedBatchChunk, HeldBatchLeases,
} from './batch-records.js';
import { chunkBounds, chunkKey, UNFINISHED_BATCH_STATUSES, WINDOW_RANK_SQL } from './batch-records.js';
import type { LeaseTerm } from './leases.js';
import type { Db } from './postgres-db.js';
import type { FileRecord } from './store.js';
import { BATCH_PATCH_COLUMNS, batchRecord, jsonText } from './store-rows.js';

export const postgresBatches = {
  async insert(db: Db, b: BatchRecord): Promise<void> {
    await db.query(`INSERT INTO batches (id, org_id, org_name, key_id, endpoint, input_file_id, completion_window, status,
                      errors, metadata, total, created_at, expires_at, window_rank)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, ${WINDOW_RANK_SQL('$7')})`,
    [b.id, b.orgId, b.orgName, b.keyId, b.endpoint, b.inputFileId, b.completionWindow, b.status, jsonText(b.errors),
      jsonText(b.metadata), b.requestCounts.total, b.createdAt, b.expiresAt]);
  },

  async get(db: Db, orgId: string, id: string): Promise<BatchRecord | undefined> {
    const { rows } = await db.query('SELECT * FROM batches WHERE id = $1 AND org_id = $2', [id, orgId]);
    return rows[0] && batchRecord(rows[0]);
  },

  async list(db: Db, orgId: string, opts: { limit: number; after?: string; before?: string }): Promise<BatchRecord[]> {
    const seqOf = async (id: string | undefined): Promise<number | undefined> => {
      if (id === undefined) return undefined;
      const { rows } = await db.query('SELECT seq FROM batches WHERE id = $1 AND org_id = $2', [id, orgId]);
      return rows[0]?.['seq'] as number | undefined;
    };
    const below = (await seqOf(opts.after)) ?? Number.MAX_SAFE_INTEGER;
    const above = (await seqOf(opts.before)) ?? 0;
    // Newest first below `after`; with `before`, the batches just newer than it (ascending, then reversed).
    const order = opts.before === undefined ? 'DESC' : 'ASC';
    const { rows } = await db.query(`SELECT * FROM batches WHERE org_id = $1 AND seq < $2 AND seq > $3 ORDER BY seq ${order} LIMIT $4`,
      [orgId, below, above, opts.limit]);
    const records = rows.map(batchRecord);
    return opts.before === undefined ? records : records.reverse();
  },

  async listUnfinished(db: Db): Promise<BatchRecord[]> {
    const { rows } = await db.query('SELECT * FROM batches WHERE status = ANY($1::text[]) ORDER BY seq', [[...UNFINISHED_BATCH_STATUSES]]);
    return rows.map(batchRecord);
  },

  /** The compare-and-set: one UPDATE that applies `patch` only while the status is one of `from`. */
  async transition(db: Db, id: string, from: readonly BatchStatus[], patch: BatchPatch): Promise<BatchRecord | undefined> {
    const sets: string[] = [];
    const values: unknown[] = [id, [...from]];
    for (const [key, value] of Object.entries(patch) as [keyof BatchPatch, unknown][]) {
      if (value === undefined) continue;
      values.push(key === 'errors' ? jsonText(value) : value);
      sets.push(`${BATCH_PATCH_COLUMNS[key]} = $${values.length}`);
    }
    if (sets.length === 0) sets.push('status = status');
    const { rows } = await db.query(`UPDATE batches SET ${sets.join(', ')} WHERE id = $1 AND status = ANY($2::text[]) RETURNING *`, values);
    return rows[0] && batchRecord(rows[0]);
  },

  /** Run inside the caller's transaction: the insert and the count move together. */
  async recordResult(db: Db, id: string, result: BatchResultRow, progress: BatchProgress): Promise<boolean> {
    const inserted = (await db.query(`INSERT INTO batch_results (batch_id, line_no, ok, line) VALUES ($1, $2, $3, $4)
                                       ON CONFLICT (batch_id, line_no) DO NOTHING`,
    [id, result.lineNo, result.ok, result.line])).rowCount === 1;
    if (inserted) {
      await db.query(`UPDATE batches SET completed = completed + $1, failed = failed + $2,
                        next_line = GREATEST(next_line, $3), next_offset = GREATEST(next_offset, $4) WHERE id = $5`,
      [result.ok ? 1 : 0, result.ok ? 0 : 1, progress.nextLine, progress.nextOffset, id]);
    } else {
      await db.query('UPDATE batches SET next_line = GREATEST(next_line, $1), next_offset = GREATEST(next_offset, $2) WHERE id = $3',
        [progress.nextLine, progress.nextOffset, id]);
    }
    return inserted;
  },

  async resultLines(db: Db, id: string, fromLine: number, toLine = Number.MAX_SAFE_INTEGER): Promise<number[]> {
    const { rows } = await db.query('SELECT line_no FROM batch_results WHERE batch_id = $1 AND line_no >= $2 AND line_no <= $3 ORDER BY line_no',
      [id, fromLine, toLine]);
    return rows.map((r) => r['line_no'] as number);
  },

  async results(db: Db, id: string, afterLine: number, limit: number): Promise<BatchResultRow[]> {
    const { rows } = await db.query('SELECT line_no, ok, line FROM batch_results WHERE batch_id = $1 AND line_no > $2 ORDER BY line_no LIMIT $3',
      [id, afterLine, limit]);
    return rows.map((r) => ({ lineNo: r['line_no'] as number, ok: r['ok'] === true, line: r['line'] as string }));
  },

  /** Run inside the caller's transaction: the compare-and-set, the result files' records, the rows dropped. */
  async finish(db: Db, id: string, from: readonly BatchStatus[], patch: BatchPatch, files: FileRecord[]): Promise<BatchRecord | undefined> {
    const updated = await postgresBatches.transition(db, id, from, patch);
    if (!updated) return undefined;
    for (const f of files) {
      await db.query(`INSERT INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING`,
      [f.id, f.orgId, f.bytes, f.createdAt, f.filename, f.purpose, f.status, f.statusDetails]);
    }
    await db.query('DELETE FROM batch_results WHERE batch_id = $1', [id]);
    // Its chunk rows go after this transaction (dropChunks): deleting them here would take chunk
    // locks after the batch row's, the reverse of a line commit's order (a deadlock).
    await db.query('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE id = $1', [id]);
    return updated;
  },

  async dropChunks(db: Db, id: string): Promise<void> {
    await db.query('DELETE FROM batch_chunks WHERE batch_id = $1', [id]);
  },

  // Leases (store.ts, "Batch work under leases"). Lock order, to stay free of deadlocks: a chunk
  // row before its batch row (a line commit, the fence); nothing takes a chunk lock while holding a
  // batch row lock.
  async work(db: Db, owner: string, nowMs: number): Promise<BatchRecord[]> {
    const { rows } = await db.query(`SELECT * FROM batches b WHERE b.status = ANY($1::text[])
        AND (b.lease_owner IS NULL OR b.lease_owner = $2 OR b.lease_until_ms <= $3)
        AND (b.status <> 'in_progress' OR b.num_chunks IS NULL OR b.errors IS NOT NULL OR b.expires_at <= $4
             OR NOT EXISTS (SELECT 1 FROM batch_chunks c WHERE c.batch_id = b.id AND NOT c.done))
      ORDER BY b.window_rank, b.created_at, b.seq`, [[...UNFINISHED_BATCH_STATUSES], owner, nowMs, Math.floor(nowMs / 1000)]);
    return rows.map(batchRecord);
  },

  /** Two statements, each its own transaction: the claim (the barrier), then a count no chunk changes while the row is leased. */
  async claimBatch(db: Db, id: string, lease: LeaseTerm): Promise<BatchClaim | undefined> {
    const { rows } = await db.query(`UPDATE batches SET lease_owner = $2, lease_until_ms = $3
        WHERE id = $1 AND status = ANY($5::text[]) AND (lease_owner IS NULL OR lease_owner = $2 OR lease_until_ms <= $4) RETURNING *`,
    [id, lease.owner, lease.untilMs, lease.nowMs, [...UNFINISHED_BATCH_STATUSES]]);
    if (!rows[0]) return undefined;
    const undone = await db.query('SELECT COUNT(*) AS n FROM batch_chunks WHERE batch_id = $1 AND NOT done', [id]);
    return { batch: batchRecord(rows[0]), chunked: rows[0]['num_chunks'] !== null, undoneChunks: undone.rows[0]!['n'] as number };
  },

  /** Run inside the caller's transaction. */
  async startChunks(db: Db, id: string, owner: string, from: readonly BatchStatus[], patch: BatchPatch, chunks: BatchChunkBounds[]): Promise<BatchRecord | undefined> {
    // Chunks are written once per batch: a batch already split (by another task) is left alone.
    const held = await db.query('SELECT 1 FROM batches WHERE id = $1 AND lease_owner = $2 AND num_chunks IS NULL FOR UPDATE', [id, owner]);
    if (held.rows.length === 0 || !(await postgresBatches.transition(db, id, from, patch))) return undefined;
    for (let i = 0; i < chunks.length; i += 1000) {
      const part = chunks.slice(i, i + 1000);
      await db.query(`INSERT INTO batch_chunks (batch_id, chunk_no, first_line, last_line, start_offset, end_offset, num_lines, window_rank, created_at)
          SELECT b.id, c.chunk_no, c.first_line, c.last_line, c.start_offset, c.end_offset, c.num_lines, b.window_rank, b.created_at
          FROM batches b, UNNEST($2::int[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::int[])
            AS c(chunk_no, first_line, last_line, start_offset, end_offset, num_lines)
          WHERE b.id = $1`,
      [id, part.map((c) => c.chunkNo), part.map((c) => c.firstLine), part.map((c) => c.lastLine), part.map((c) => c.startOffset),
        part.map((c) => c.endOffset), part.map((c) => c.numLines)]);
    }
    const { rows } = await db.query(`UPDATE batches SET num_chunks = $2, lease_owner = NULL, lease_until_ms = 0
        WHERE id = $1 RETURNING *`, [id, chunks.length]);
    return batchRecord(rows[0]!);
  },

  /** Run inside the caller's transaction: FOR UPDATE SKIP LOCKED, so concurrent claims never meet on a chunk. */
  async claimChunks(db: Db, lease: LeaseTerm, limit: number, skipBatchIds: readonly string[], skipOrgIds: readonly string[] = []): Promise<ClaimedBatchChunk[]> {
    const { rows } = await db.query(`SELECT c.batch_id, c.chunk_no, c.first_line, c.last_line, c.start_offset, c.end_offset, c.num_lines
        FROM batch_chunks c JOIN batches b ON b.id = c.batch_id
        WHERE NOT c.done AND (c.lease_owner IS NULL OR c.lease_until_ms <= $1)
          AND b.status = 'in_progress' AND b.lease_owner IS NULL AND b.expires_at > $2 AND NOT (c.batch_id = ANY($3::text[]))
          AND NOT (b.org_id = ANY($5::text[]))
        ORDER BY c.window_rank, c.created_at, b.seq, c.chunk_no LIMIT $4
        FOR UPDATE OF c SKIP LOCKED`, [lease.nowMs, Math.floor(lease.nowMs / 1000), [...skipBatchIds], limit, [...skipOrgIds]]);
    const claimed: ClaimedBatchChunk[] = [];
    for (const r of rows) {
      await db.query('UPDATE batch_chunks SET lease_owner = $1, lease_until_ms = $2 WHERE batch_id = $3 AND chunk_no = $4',
        [lease.owner, lease.untilMs, r['batch_id'], r['chunk_no']]);
      const batch = (await db.query('SELECT * FROM batches WHERE id = $1', [r['batch_id']])).rows[0]!;
      claimed.push({ chunk: chunkBounds(r), batch: batchRecord(batch) });
    }
    return claimed;
  },

  async renew(db: Db, lease: LeaseTerm): Promise<HeldBatchLeases> {
    const batches = await db.query('UPDATE batches SET lease_until_ms = $1 WHERE lease_owner = $2 AND status = ANY($3::text[]) RETURNING id',
      [lease.untilMs, lease.owner, [...UNFINISHED_BATCH_STATUSES]]);
    const chunks = await db.query(`UPDATE batch_chunks SET lease_until_ms = $1 WHERE lease_owner = $2 AND NOT done
        AND batch_id IN (SELECT id FROM batches WHERE status = 'in_progress' AND lease_owner IS NULL) RETURNING batch_id, chunk_no`,
    [lease.untilMs, lease.owner]);
    return {
      batchIds: batches.rows.map((r) => r['id'] as string),
      chunkKeys: chunks.rows.map((r) => chunkKey(r['batch_id'] as string, r['chunk_no'] as number)),
    };
  },

  /**
   * Run inside the caller's transaction, before it writes anything: locks the chunk row (held by
   * `owner`, not done) and then the batch row (in_progress, nobody ending it) until it commits, so
   * a takeover or an end (claimBatch) waits for this commit, and a commit after them is refused.
   */
  async fence(db: Db, batchId: string, chunkNo: number, owner: string): Promise<boolean> {
    const chunk = await db.query('SELECT 1 FROM batch_chunks WHERE batch_id = $1 AND chunk_no = $2 AND lease_owner = $3 AND NOT done FOR UPDATE',
      [batchId, chunkNo, owner]);
    if (chunk.rows.length === 0) return false;
    const batch = await db.query(`SELECT 1 FROM batches WHERE id = $1 AND status = 'in_progress' AND lease_owner IS NULL FOR UPDATE`, [batchId]);
    return batch.rows.length > 0;
  },

  /** Run inside the caller's transaction. */
  async finishChunk(db: Db, batchId: string, chunkNo: number, owner: string): Promise<boolean> {
    if (!(await postgresBatches.fence(db, batchId, chunkNo, owner))) return false;
    await db.query('UPDATE batch_chunks SET done = TRUE, lease_owner = NULL, lease_until_ms = 0 WHERE batch_id = $1 AND chunk_no = $2', [batchId, chunkNo]);
    return true;
  },

  async releaseOne(db: Db, batchId: string, owner: string, chunkNo: number | undefined): Promise<void> {
    if (chunkNo === undefined) {
      await db.query('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE id = $1 AND lease_owner = $2', [batchId, owner]);
    } else {
      await db.query('UPDATE batch_chunks SET lease_owner = NULL, lease_until_ms = 0 WHERE batch_id = $1 AND chunk_no = $2 AND lease_owner = $3',
        [batchId, chunkNo, owner]);
    }
  },

  async release(db: Db, owner: string | undefined): Promise<number> {
    const who = owner === undefined ? 'lease_owner IS NOT NULL' : 'lease_owner = $1';
    const values = owner === undefined ? [] : [owner];
    const batches = await db.query(`UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE ${who}`, values);
    const chunks = await db.query(`UPDATE batch_chunks SET lease_owner = NULL, lease_until_ms = 0 WHERE ${who}`, values);
    return (batches.rowCount ?? 0) + (chunks.rowCount ?? 0);
  },
};
