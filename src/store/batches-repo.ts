// Batches: the batch row, one result row per finished request line until the batch ends, and its
// split into chunks (batch_chunks) that replicas claim under leases (leases-repo.ts).
//
// Every status change is one compare-and-set statement, UPDATE ... WHERE status = ANY(from), so the
// runner and a cancel request racing on one batch, on any replicas, cannot both win. A result row
// is unique by its primary key (batch, line): a line recorded twice is neither stored nor counted
// again, whoever records it. Lock order, to stay free of deadlocks on PostgreSQL: a chunk row
// before its batch row (a line commit, the fence); nothing takes a chunk lock while holding a
// batch row lock.

import type { BatchChunkBounds, BatchPatch, BatchProgress, BatchResultRow, BatchStatus } from './batch-records.js';
import { UNFINISHED_BATCH_STATUSES, WINDOW_RANK_SQL, type BatchRecord } from './batch-records.js';
import { fileRows } from './files-repo.js';
import { flag, type Params, type Sql } from './sql-driver.js';
import type { BatchRepository } from './store.js';
import { BATCH_PATCH_COLUMNS, batchRecord, jsonText } from './store-rows.js';

/** The statuses a batch leaves only by its runner's work, as an SQL list. */
export const UNFINISHED = `(${UNFINISHED_BATCH_STATUSES.map((s) => `'${s}'`).join(', ')})`;

/** Chunk rows per INSERT: a few fixed sizes, so that any number of chunks is a few statement texts. */
const CHUNKS_PER_INSERT = [256, 16, 1];

/** The statements other transactions run (a request's end, a chunk's end, the claims). */
export const batchRows = {
  /** The compare-and-set: applies `patch` only while the status is one of `from`; the batch after it. */
  async transition(db: Sql, id: string, from: readonly BatchStatus[], patch: BatchPatch): Promise<BatchRecord | undefined> {
    const sets: string[] = [];
    const params: Params = { id, fromStatuses: [...from] };
    for (const [key, value] of Object.entries(patch) as [keyof BatchPatch, unknown][]) {
      if (value === undefined) continue;
      const column = BATCH_PATCH_COLUMNS[key];
      sets.push(`${column} = :${column}`);
      params[column] = key === 'errors' ? jsonText(value) : value;
    }
    if (sets.length === 0) sets.push('status = status');
    const row = await db.one(`UPDATE batches SET ${sets.join(', ')} WHERE id = :id AND status = ANY(:fromStatuses) RETURNING *`, params);
    return row && batchRecord(row);
  },

  /** Inside the caller's transaction: the insert and the count move together; false when the line had a row. */
  async recordResult(db: Sql, id: string, result: BatchResultRow, progress: BatchProgress): Promise<boolean> {
    const inserted = (await db.run(`INSERT INTO batch_results (batch_id, line_no, ok, line) VALUES (:id, :lineNo, :ok, :line)
        ON CONFLICT (batch_id, line_no) DO NOTHING`, { id, ...result })) === 1;
    await db.run(`UPDATE batches SET completed = completed + :completed, failed = failed + :failed,
        next_line = GREATEST(next_line, :nextLine), next_offset = GREATEST(next_offset, :nextOffset) WHERE id = :id`,
    { id, completed: inserted && result.ok ? 1 : 0, failed: inserted && !result.ok ? 1 : 0, ...progress });
    return inserted;
  },

  /**
   * Inside the caller's transaction, before it writes anything: may chunk `chunkNo`'s `owner` still
   * write? Locks the chunk row (held by `owner`, not done) and then the batch row (in_progress,
   * nobody ending it) until the commit, so a takeover or an end (claimBatch) waits for this commit,
   * and a commit after them is refused.
   */
  async fence(db: Sql, batchId: string, chunkNo: number, owner: string): Promise<boolean> {
    const chunk = await db.one(`SELECT 1 FROM batch_chunks WHERE batch_id = :batchId AND chunk_no = :chunkNo AND lease_owner = :owner
        AND NOT done FOR UPDATE`, { batchId, chunkNo, owner });
    return chunk !== undefined && (await db.one(`SELECT 1 FROM batches WHERE id = :batchId AND status = 'in_progress' AND lease_owner IS NULL
        FOR UPDATE`, { batchId })) !== undefined;
  },
};

export function batchRepository(db: Sql): BatchRepository {
  return {
    async insertBatch(b) {
      await db.run(`INSERT INTO batches (id, org_id, org_name, key_id, endpoint, input_file_id, completion_window, status,
          errors, metadata, total, created_at, expires_at, window_rank)
        VALUES (:id, :orgId, :orgName, :keyId, :endpoint, :inputFileId, :completionWindow, :status, :errors, :metadata, :total,
          :createdAt, :expiresAt, ${WINDOW_RANK_SQL(':completionWindow')})`,
      { ...b, errors: jsonText(b.errors), metadata: jsonText(b.metadata), total: b.requestCounts.total });
    },

    async getBatch(orgId, id) {
      const row = await db.one('SELECT * FROM batches WHERE id = :id AND org_id = :orgId', { id, orgId });
      return row && batchRecord(row);
    },

    async listBatches(orgId, opts) {
      // Newest first below `after`; with `before`, the batches just newer than it (ascending, then
      // reversed). A cursor that is not a batch of this organization bounds nothing.
      const order = opts.before === undefined ? 'DESC' : 'ASC';
      const rows = await db.all(`SELECT * FROM batches WHERE org_id = :orgId
          AND seq < COALESCE((SELECT seq FROM batches WHERE id = :after AND org_id = :orgId), 9223372036854775807)
          AND seq > COALESCE((SELECT seq FROM batches WHERE id = :before AND org_id = :orgId), 0)
          ORDER BY seq ${order} LIMIT :limit`, { orgId, after: opts.after, before: opts.before, limit: opts.limit });
      const records = rows.map(batchRecord);
      return opts.before === undefined ? records : records.reverse();
    },

    async listUnfinishedBatches() {
      return (await db.all(`SELECT * FROM batches WHERE status IN ${UNFINISHED} ORDER BY seq`)).map(batchRecord);
    },

    transitionBatch: (id, from, patch) => batchRows.transition(db, id, from, patch),

    recordBatchResult: (id, result, progress) => db.transaction((tx) => batchRows.recordResult(tx, id, result, progress)),

    async listBatchResultLines(id, fromLine, toLine = Number.MAX_SAFE_INTEGER) {
      const rows = await db.all('SELECT line_no FROM batch_results WHERE batch_id = :id AND line_no >= :fromLine AND line_no <= :toLine ORDER BY line_no',
        { id, fromLine, toLine });
      return rows.map((r) => r['line_no'] as number);
    },

    async listBatchResults(id, afterLine, limit) {
      const rows = await db.all('SELECT line_no, ok, line FROM batch_results WHERE batch_id = :id AND line_no > :afterLine ORDER BY line_no LIMIT :limit',
        { id, afterLine, limit });
      return rows.map((r) => ({ lineNo: r['line_no'] as number, ok: flag(r['ok']), line: r['line'] as string }));
    },

    async finishBatch(id, from, patch, files) {
      const ended = await db.transaction(async (tx) => {
        const updated = await batchRows.transition(tx, id, from, patch);
        if (!updated) return undefined;
        for (const f of files) await fileRows.insertIfNew(tx, f);
        await tx.run('DELETE FROM batch_results WHERE batch_id = :id', { id });
        await tx.run('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE id = :id', { id });
        return updated;
      });
      // Its chunk rows go after that transaction: deleting them inside it would take chunk locks
      // after the batch row's, the reverse of a line commit's order (a deadlock on PostgreSQL).
      if (ended) await db.run('DELETE FROM batch_chunks WHERE batch_id = :id', { id });
      return ended;
    },

    async listBatchWork(owner, nowMs) {
      const rows = await db.all(`SELECT * FROM batches b WHERE b.status IN ${UNFINISHED}
          AND (b.lease_owner IS NULL OR b.lease_owner = :owner OR b.lease_until_ms <= :nowMs)
          AND (b.status <> 'in_progress' OR b.num_chunks IS NULL OR b.errors IS NOT NULL OR b.expires_at <= :nowSec
               OR NOT EXISTS (SELECT 1 FROM batch_chunks c WHERE c.batch_id = b.id AND NOT c.done))
        ORDER BY b.window_rank, b.created_at, b.seq`, { owner, nowMs, nowSec: Math.floor(nowMs / 1000) });
      return rows.map(batchRecord);
    },

    startBatchChunks: (id, owner, from, patch, chunks) => db.transaction(async (tx) => {
      // Chunks are written once per batch: a batch already split (by another task) is left alone.
      const held = await tx.one('SELECT window_rank, created_at FROM batches WHERE id = :id AND lease_owner = :owner AND num_chunks IS NULL FOR UPDATE',
        { id, owner });
      if (!held || !(await batchRows.transition(tx, id, from, patch))) return undefined;
      await insertChunks(tx, id, held['window_rank'] as number, held['created_at'] as number, chunks);
      const row = await tx.one('UPDATE batches SET num_chunks = :n, lease_owner = NULL, lease_until_ms = 0 WHERE id = :id RETURNING *',
        { id, n: chunks.length });
      return batchRecord(row!);
    }),
  };
}

/** The chunk rows of a batch, with its claim order (window rank, then age). */
async function insertChunks(db: Sql, id: string, rank: number, createdAt: number, chunks: BatchChunkBounds[]): Promise<void> {
  for (let start = 0; start < chunks.length;) {
    const size = CHUNKS_PER_INSERT.find((n) => n <= chunks.length - start)!;
    const params: Params = { id, rank, createdAt };
    const rows = chunks.slice(start, start + size).map((c, i) => {
      Object.assign(params, { [`n${i}`]: c.chunkNo, [`f${i}`]: c.firstLine, [`l${i}`]: c.lastLine, [`s${i}`]: c.startOffset,
        [`e${i}`]: c.endOffset, [`k${i}`]: c.numLines });
      return `(:id, :n${i}, :f${i}, :l${i}, :s${i}, :e${i}, :k${i}, :rank, :createdAt)`;
    });
    await db.run(`INSERT INTO batch_chunks (batch_id, chunk_no, first_line, last_line, start_offset, end_offset, num_lines, window_rank, created_at)
      VALUES ${rows.join(', ')}`, params);
    start += size;
  }
}
