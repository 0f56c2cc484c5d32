// The batch tables of the PostgreSQL store: PostgresStore delegates its batch methods here, as
// SqliteStore does to sqlite-batches.ts. Each method takes the connection to run on (the pool, or
// the client of a transaction the store holds open).
//
// Every status change is one compare-and-set statement, UPDATE ... WHERE status = ANY(from), so the
// runner and a cancel request racing on one batch, on any replicas, cannot both win. A result row
// is unique by its primary key (batch, line): a line recorded twice is neither stored nor counted
// again, whoever records it.

import type { BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus } from './batch-records.js';
import { UNFINISHED_BATCH_STATUSES } from './batch-records.js';
import type { Db } from './postgres-db.js';
import type { FileRecord } from './store.js';
import { BATCH_PATCH_COLUMNS, batchRecord, jsonText } from './store-rows.js';

export const postgresBatches = {
  async insert(db: Db, b: BatchRecord): Promise<void> {
    await db.query(`INSERT INTO batches (id, org_id, org_name, key_id, endpoint, input_file_id, completion_window, status,
                      errors, metadata, total, created_at, expires_at)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
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

  async resultLines(db: Db, id: string, fromLine: number): Promise<number[]> {
    const { rows } = await db.query('SELECT line_no FROM batch_results WHERE batch_id = $1 AND line_no >= $2 ORDER BY line_no', [id, fromLine]);
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
    return updated;
  },
};
