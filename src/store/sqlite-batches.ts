// The batch tables of the SQLite store (migration "batches"): SqliteStore delegates its batch
// methods here so that its own file stays about keys, responses and files.
//
// Every status change is a compare-and-set on the current status (transition, finish), so the
// runner and a cancel request racing on one batch cannot both win.

import type Database from 'better-sqlite3';
import type {
  BatchChunkBounds, BatchClaim, BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus, ClaimedBatchChunk, HeldBatchLeases,
} from './batch-records.js';
import { chunkBounds, chunkKey, UNFINISHED_BATCH_STATUSES, WINDOW_RANK_SQL } from './batch-records.js';
import type { LeaseTerm } from './leases.js';
import type { FileRecord } from './store.js';
import { BATCH_PATCH_COLUMNS, batchRecord, jsonText, type Row } from './store-rows.js';

export class SqliteBatches {
  private readonly stmt: Record<string, Database.Statement>;

  constructor(private readonly db: Database.Database) {
    const prepare = (sql: string) => db.prepare(sql);
    const unfinished = UNFINISHED_BATCH_STATUSES.map((s) => `'${s}'`).join(', ');
    this.stmt = {
      insert: prepare(`INSERT INTO batches (id, org_id, org_name, key_id, endpoint, input_file_id, completion_window, status,
                         errors, metadata, total, created_at, expires_at, window_rank)
                       VALUES (@id, @orgId, @orgName, @keyId, @endpoint, @inputFileId, @completionWindow, @status,
                         @errors, @metadata, @total, @createdAt, @expiresAt, ${WINDOW_RANK_SQL('@completionWindow')})`),
      get: prepare('SELECT * FROM batches WHERE id = ? AND org_id = ?'),
      getById: prepare('SELECT * FROM batches WHERE id = ?'),
      seqOf: prepare('SELECT seq FROM batches WHERE id = ? AND org_id = ?'),
      // Newest first below `after`; with `before`, the batches just newer than it (ascending, reversed by the caller).
      listDesc: prepare('SELECT * FROM batches WHERE org_id = ? AND seq < ? AND seq > ? ORDER BY seq DESC LIMIT ?'),
      listAsc: prepare('SELECT * FROM batches WHERE org_id = ? AND seq < ? AND seq > ? ORDER BY seq ASC LIMIT ?'),
      unfinished: prepare(`SELECT * FROM batches WHERE status IN (${unfinished}) ORDER BY seq`),
      insertResult: prepare('INSERT OR IGNORE INTO batch_results (batch_id, line_no, ok, line) VALUES (?, ?, ?, ?)'),
      countResult: prepare(`UPDATE batches SET completed = completed + ?, failed = failed + ?,
                              next_line = MAX(next_line, ?), next_offset = MAX(next_offset, ?) WHERE id = ?`),
      progress: prepare('UPDATE batches SET next_line = MAX(next_line, ?), next_offset = MAX(next_offset, ?) WHERE id = ?'),
      resultLines: prepare('SELECT line_no FROM batch_results WHERE batch_id = ? AND line_no >= ? AND line_no <= ? ORDER BY line_no'),
      results: prepare('SELECT line_no, ok, line FROM batch_results WHERE batch_id = ? AND line_no > ? ORDER BY line_no LIMIT ?'),
      dropResults: prepare('DELETE FROM batch_results WHERE batch_id = ?'),
      insertFile: prepare(`INSERT OR IGNORE INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      dropChunks: prepare('DELETE FROM batch_chunks WHERE batch_id = ?'),
      work: prepare(`SELECT * FROM batches b WHERE b.status IN (${unfinished})
                       AND (b.lease_owner IS NULL OR b.lease_owner = @owner OR b.lease_until_ms <= @nowMs)
                       AND (b.status <> 'in_progress' OR b.num_chunks IS NULL OR b.errors IS NOT NULL OR b.expires_at <= @nowSec
                            OR NOT EXISTS (SELECT 1 FROM batch_chunks c WHERE c.batch_id = b.id AND c.done = 0))
                     ORDER BY b.window_rank, b.created_at, b.seq`),
      claimBatch: prepare(`UPDATE batches SET lease_owner = @owner, lease_until_ms = @untilMs
                           WHERE id = @id AND status IN (${unfinished})
                             AND (lease_owner IS NULL OR lease_owner = @owner OR lease_until_ms <= @nowMs)`),
      insertChunk: prepare(`INSERT INTO batch_chunks (batch_id, chunk_no, first_line, last_line, start_offset, end_offset, num_lines, window_rank, created_at)
                            SELECT id, ?, ?, ?, ?, ?, ?, window_rank, created_at FROM batches WHERE id = ?`),
      chunked: prepare('UPDATE batches SET num_chunks = ?, lease_owner = NULL, lease_until_ms = 0 WHERE id = ?'),
      claimable: prepare(`SELECT c.batch_id, c.chunk_no, c.first_line, c.last_line, c.start_offset, c.end_offset, c.num_lines
                          FROM batch_chunks c JOIN batches b ON b.id = c.batch_id
                          WHERE c.done = 0 AND (c.lease_owner IS NULL OR c.lease_until_ms <= @nowMs)
                            AND b.status = 'in_progress' AND b.lease_owner IS NULL AND b.expires_at > @nowSec
                            AND c.batch_id NOT IN (SELECT value FROM json_each(@skip))
                            AND b.org_id NOT IN (SELECT value FROM json_each(@skipOrgs))
                          ORDER BY c.window_rank, c.created_at, b.seq, c.chunk_no LIMIT @limit`),
      leaseChunk: prepare('UPDATE batch_chunks SET lease_owner = ?, lease_until_ms = ? WHERE batch_id = ? AND chunk_no = ?'),
      renewBatches: prepare(`UPDATE batches SET lease_until_ms = @untilMs WHERE lease_owner = @owner AND status IN (${unfinished})
                             RETURNING id`),
      renewChunks: prepare(`UPDATE batch_chunks SET lease_until_ms = @untilMs WHERE lease_owner = @owner AND done = 0
                              AND batch_id IN (SELECT id FROM batches WHERE status = 'in_progress' AND lease_owner IS NULL)
                            RETURNING batch_id, chunk_no`),
      // The fence of a line's commit and of a chunk's end.
      fence: prepare(`SELECT 1 FROM batch_chunks c JOIN batches b ON b.id = c.batch_id
                      WHERE c.batch_id = ? AND c.chunk_no = ? AND c.lease_owner = ? AND c.done = 0
                        AND b.status = 'in_progress' AND b.lease_owner IS NULL`),
      chunkDone: prepare('UPDATE batch_chunks SET done = 1, lease_owner = NULL, lease_until_ms = 0 WHERE batch_id = ? AND chunk_no = ?'),
      undone: prepare('SELECT COUNT(*) AS n FROM batch_chunks WHERE batch_id = ? AND done = 0'),
      releaseRowOf: prepare('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE id = ? AND lease_owner = ?'),
      releaseRow: prepare('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE id = ?'),
      releaseChunk: prepare('UPDATE batch_chunks SET lease_owner = NULL, lease_until_ms = 0 WHERE batch_id = ? AND chunk_no = ? AND lease_owner = ?'),
      releaseBatchesOf: prepare('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner = ?'),
      releaseChunksOf: prepare('UPDATE batch_chunks SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner = ?'),
      releaseAllBatches: prepare('UPDATE batches SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner IS NOT NULL'),
      releaseAllChunks: prepare('UPDATE batch_chunks SET lease_owner = NULL, lease_until_ms = 0 WHERE lease_owner IS NOT NULL'),
    };
  }

  insert(b: BatchRecord): void {
    this.stmt['insert']!.run({
      id: b.id, orgId: b.orgId, orgName: b.orgName, keyId: b.keyId, endpoint: b.endpoint, inputFileId: b.inputFileId,
      completionWindow: b.completionWindow, status: b.status, errors: jsonText(b.errors), metadata: jsonText(b.metadata),
      total: b.requestCounts.total, createdAt: b.createdAt, expiresAt: b.expiresAt,
    });
  }

  get(orgId: string, id: string): BatchRecord | undefined {
    const row = this.stmt['get']!.get(id, orgId) as Row | undefined;
    return row && batchRecord(row);
  }

  list(orgId: string, opts: { limit: number; after?: string; before?: string }): BatchRecord[] {
    const seqOf = (id: string | undefined) => (id === undefined ? undefined
      : (this.stmt['seqOf']!.get(id, orgId) as { seq: number } | undefined)?.seq);
    const below = seqOf(opts.after) ?? Number.MAX_SAFE_INTEGER;
    const above = seqOf(opts.before) ?? 0;
    if (opts.before === undefined) return (this.stmt['listDesc']!.all(orgId, below, above, opts.limit) as Row[]).map(batchRecord);
    return (this.stmt['listAsc']!.all(orgId, below, above, opts.limit) as Row[]).map(batchRecord).reverse();
  }

  listUnfinished(): BatchRecord[] {
    return (this.stmt['unfinished']!.all() as Row[]).map(batchRecord);
  }

  transition(id: string, from: readonly BatchStatus[], patch: BatchPatch): BatchRecord | undefined {
    return this.db.transaction(() => this.applyPatch(id, from, patch))();
  }

  recordResult(id: string, result: BatchResultRow, progress: BatchProgress): boolean {
    return this.db.transaction(() => {
      const inserted = this.stmt['insertResult']!.run(id, result.lineNo, result.ok ? 1 : 0, result.line).changes > 0;
      if (inserted) this.stmt['countResult']!.run(result.ok ? 1 : 0, result.ok ? 0 : 1, progress.nextLine, progress.nextOffset, id);
      else this.stmt['progress']!.run(progress.nextLine, progress.nextOffset, id);
      return inserted;
    })();
  }

  resultLines(id: string, fromLine: number, toLine = Number.MAX_SAFE_INTEGER): number[] {
    return (this.stmt['resultLines']!.all(id, fromLine, toLine) as { line_no: number }[]).map((r) => r.line_no);
  }

  results(id: string, afterLine: number, limit: number): BatchResultRow[] {
    return (this.stmt['results']!.all(id, afterLine, limit) as Row[]).map((r) => ({
      lineNo: r['line_no'] as number, ok: r['ok'] === 1, line: r['line'] as string,
    }));
  }

  finish(id: string, from: readonly BatchStatus[], patch: BatchPatch, files: FileRecord[]): BatchRecord | undefined {
    return this.db.transaction(() => {
      const updated = this.applyPatch(id, from, patch);
      if (!updated) return undefined;
      for (const f of files) {
        this.stmt['insertFile']!.run(f.id, f.orgId, f.bytes, f.createdAt, f.filename, f.purpose, f.status, f.statusDetails);
      }
      this.stmt['dropResults']!.run(id);
      this.stmt['dropChunks']!.run(id);
      this.stmt['releaseRow']!.run(id);
      return updated;
    })();
  }

  // Leases (store.ts, "Batch work under leases").
  work(owner: string, nowMs: number): BatchRecord[] {
    return (this.stmt['work']!.all({ owner, nowMs, nowSec: Math.floor(nowMs / 1000) }) as Row[]).map(batchRecord);
  }

  claimBatch(id: string, lease: LeaseTerm): BatchClaim | undefined {
    return this.db.transaction(() => {
      if (this.stmt['claimBatch']!.run({ id, ...lease }).changes === 0) return undefined;
      const row = this.stmt['getById']!.get(id) as Row;
      const undone = (this.stmt['undone']!.get(id) as { n: number }).n;
      return { batch: batchRecord(row), chunked: row['num_chunks'] !== null, undoneChunks: undone };
    }).immediate();
  }

  startChunks(id: string, owner: string, from: readonly BatchStatus[], patch: BatchPatch, chunks: BatchChunkBounds[]): BatchRecord | undefined {
    return this.db.transaction(() => {
      const row = this.stmt['getById']!.get(id) as Row | undefined;
      // Chunks are written once per batch: a batch already split (by another task) is left alone.
      if (!row || row['lease_owner'] !== owner || row['num_chunks'] !== null || !this.applyPatch(id, from, patch)) return undefined;
      for (const c of chunks) this.stmt['insertChunk']!.run(c.chunkNo, c.firstLine, c.lastLine, c.startOffset, c.endOffset, c.numLines, id);
      this.stmt['chunked']!.run(chunks.length, id);
      return batchRecord(this.stmt['getById']!.get(id) as Row);
    }).immediate();
  }

  claimChunks(lease: LeaseTerm, limit: number, skipBatchIds: readonly string[], skipOrgIds: readonly string[] = []): ClaimedBatchChunk[] {
    return this.db.transaction(() => {
      const rows = this.stmt['claimable']!.all({
        nowMs: lease.nowMs, nowSec: Math.floor(lease.nowMs / 1000), skip: JSON.stringify(skipBatchIds), skipOrgs: JSON.stringify(skipOrgIds), limit,
      }) as Row[];
      return rows.map((r) => {
        this.stmt['leaseChunk']!.run(lease.owner, lease.untilMs, r['batch_id'], r['chunk_no']);
        return { chunk: chunkBounds(r), batch: batchRecord(this.stmt['getById']!.get(r['batch_id']) as Row) };
      });
    }).immediate();
  }

  renew(lease: LeaseTerm): HeldBatchLeases {
    return this.db.transaction(() => {
      const batches = this.stmt['renewBatches']!.all({ owner: lease.owner, untilMs: lease.untilMs }) as Row[];
      const chunks = this.stmt['renewChunks']!.all({ owner: lease.owner, untilMs: lease.untilMs }) as Row[];
      return {
        batchIds: batches.map((r) => r['id'] as string),
        chunkKeys: chunks.map((r) => chunkKey(r['batch_id'] as string, r['chunk_no'] as number)),
      };
    })();
  }

  /** Inside the caller's transaction: may chunk `chunkNo`'s owner still write? */
  fenced(batchId: string, chunkNo: number, owner: string): boolean {
    return this.stmt['fence']!.get(batchId, chunkNo, owner) !== undefined;
  }

  finishChunk(batchId: string, chunkNo: number, owner: string): boolean {
    return this.db.transaction(() => {
      if (!this.fenced(batchId, chunkNo, owner)) return false;
      this.stmt['chunkDone']!.run(batchId, chunkNo);
      return true;
    }).immediate();
  }

  releaseOne(batchId: string, owner: string, chunkNo: number | undefined): void {
    if (chunkNo === undefined) this.stmt['releaseRowOf']!.run(batchId, owner);
    else this.stmt['releaseChunk']!.run(batchId, chunkNo, owner);
  }

  release(owner: string | undefined): number {
    return this.db.transaction(() => owner === undefined
      ? this.stmt['releaseAllBatches']!.run().changes + this.stmt['releaseAllChunks']!.run().changes
      : this.stmt['releaseBatchesOf']!.run(owner).changes + this.stmt['releaseChunksOf']!.run(owner).changes)();
  }

  /** Runs inside a transaction: the compare-and-set, then the row as it now is. */
  private applyPatch(id: string, from: readonly BatchStatus[], patch: BatchPatch): BatchRecord | undefined {
    const row = this.stmt['getById']!.get(id) as Row | undefined;
    if (!row || !from.includes(row['status'] as BatchStatus)) return undefined;
    const sets: string[] = [];
    const values: unknown[] = [];
    for (const [key, value] of Object.entries(patch) as [keyof BatchPatch, unknown][]) {
      if (value === undefined) continue;
      sets.push(`${BATCH_PATCH_COLUMNS[key]} = ?`);
      values.push(key === 'errors' ? jsonText(value) : value);
    }
    if (sets.length > 0) this.db.prepare(`UPDATE batches SET ${sets.join(', ')} WHERE id = ?`).run(...values, id);
    return batchRecord(this.stmt['getById']!.get(id) as Row);
  }
}
