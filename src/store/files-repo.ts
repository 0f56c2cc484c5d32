// File metadata (the bytes live in FileStorage): newest first by upload order (the seq column).

import type { FileRecord, FileRepository } from './store.js';
import type { Sql } from './sql-driver.js';
import { fileRecord } from './store-rows.js';

const INSERT = `INSERT INTO files (id, org_id, bytes, created_at, filename, purpose, status, status_details)
                VALUES (:id, :orgId, :bytes, :createdAt, :filename, :purpose, :status, :statusDetails)`;

/** The statements a unit of work runs inside its transaction (a batch's end records its result files). */
export const fileRows = {
  /** A file whose id is recorded already is kept as it is. */
  async insertIfNew(db: Sql, f: FileRecord): Promise<void> {
    await db.run(`${INSERT} ON CONFLICT (id) DO NOTHING`, { ...f });
  },
};

export function fileRepository(db: Sql): FileRepository {
  return {
    async insertFile(f) {
      await db.run(INSERT, { ...f });
    },

    async getFile(orgId, id) {
      const row = await db.one('SELECT * FROM files WHERE id = :id AND org_id = :orgId', { id, orgId });
      return row && fileRecord(row);
    },

    async listFiles(orgId, opts) {
      // CAST: PostgreSQL needs a type for a parameter that is only compared with NULL.
      const rows = await db.all(`SELECT * FROM files WHERE org_id = :orgId AND (CAST(:purpose AS TEXT) IS NULL OR purpose = :purpose)
          AND seq < COALESCE((SELECT seq FROM files WHERE id = :after AND org_id = :orgId), 9223372036854775807)
          ORDER BY seq DESC LIMIT :limit`, { orgId, purpose: opts.purpose, after: opts.after, limit: opts.limit });
      return rows.map(fileRecord);
    },

    async deleteFile(orgId, id) {
      return (await db.run('DELETE FROM files WHERE id = :id AND org_id = :orgId', { id, orgId })) > 0;
    },
  };
}
