// The batch tables of the SQLite store (migration "batches"): SqliteStore delegates its batch
// methods here so that its own file stays about keys, responses and files.
//
// Every status change is a compare-and-set on the current status (transition, finish), so the
// runner and a cancel request racing on one batch cannot both win.

import type Database from 'better-sqlite3';
import type {
  BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus,
} from './batch-records.js';
import { UNFINISHED_BATCH_STATUSES } from './batch-records.js';
import type { FileRecord } from './store.js';
import { BATCH_PATCH_COLUMNS, batchRecord, jsonText, type Row } from './store-rows.js';

export class SqliteBatches {
  private readonly stmt: Record<string, Database.Statement>;

  constructor(private readonly db: Database.Database) {
    const prepare = (sql: string) => db.prepare(sql);
    const unfinished = UNFINISHED_BATCH_STATUSES.map((s) => `'${s}'`).join(', ');
    this.stmt = {
      insert: prepare(`INSERT INTO batches (id, org_id, org_name, key_id, endpoint, input_file_id, completion_window, status,
                         errors, metadata, total, created_at, expires_at)
                       VALUES (@id, @orgId, @orgName, @keyId, @endpoint, @inputFileId, @completionWindow, @status,
                         @errors, @metadata, @total, @createdAt, @expiresAt)`),
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
      resultLines: prepare('SELECT line_no FROM batch_results WHERE batch_id = ? AND line_no >= ? ORDER BY line_no'),
      results: prepare('SELECT line_no, ok, line FROM batch_results WHERE batch_id = ? AND line_no > ? ORDER BY line_no LIMIT ?'),
      dropResults: prepare('DELETE FROM batch_results WHERE batch_id = ?'),
      insertFile: prepare(`INSERT OR IGNORE INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
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

  resultLines(id: string, fromLine: number): number[] {
    return (this.stmt['resultLines']!.all(id, fromLine) as { line_no: number }[]).map((r) => r.line_no);
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
      return updated;
    })();
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
