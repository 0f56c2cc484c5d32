// Stored responses (the Responses surface keeps every one, store=false included), their input items,
// and background responses with their jobs (the work a restart or another replica resumes; the
// jobs' leases are in leases-repo.ts).

import { WINDOW_RANK } from './leases.js';
import type { Sql } from './sql-driver.js';
import type { ResponseBody, ResponseRepository } from './store.js';
import { backgroundJob } from './store-rows.js';
import { webhookRows } from './webhooks-repo.js';

const nowSeconds = () => Math.floor(Date.now() / 1000);

/** The statements a unit of work (sql-store.ts) runs inside its transaction. */
export const responseRows = {
  /** A response's input items, written with the response (its end, or its background start). */
  async putInput(db: Sql, orgId: string, responseId: string, items: Record<string, unknown>[]): Promise<void> {
    await db.run(`INSERT INTO response_inputs (response_id, org_id, items) VALUES (:responseId, :orgId, :items)
                  ON CONFLICT (response_id) DO UPDATE SET org_id = excluded.org_id, items = excluded.items`,
    { responseId, orgId, items: JSON.stringify(items) });
  },

  /** `createdAt`: the body's created_at when it has one (whole seconds), else now. */
  async insert(db: Sql, orgId: string, body: ResponseBody, createdAt?: number): Promise<void> {
    const at = createdAt ?? (typeof body['created_at'] === 'number' ? Math.floor(body['created_at']) : nowSeconds());
    await db.run(`INSERT INTO responses (id, org_id, status, created_at, updated_at, body)
                  VALUES (:id, :orgId, :status, :createdAt, :now, :body)`,
    { id: body.id, orgId, status: body.status, createdAt: at, now: nowSeconds(), body: JSON.stringify(body) });
  },

  /** Rows replaced (0: no such response of this organization). */
  update(db: Sql, orgId: string, body: ResponseBody): Promise<number> {
    return db.run('UPDATE responses SET status = :status, updated_at = :now, body = :body WHERE id = :id AND org_id = :orgId',
      { status: body.status, now: nowSeconds(), body: JSON.stringify(body), id: body.id, orgId });
  },
};

export function responseRepository(db: Sql): ResponseRepository {
  return {
    insertResponse: (orgId, body) => responseRows.insert(db, orgId, body),

    async updateResponse(orgId, body) {
      return (await responseRows.update(db, orgId, body)) > 0;
    },

    async getResponse(orgId, id) {
      const row = await db.one('SELECT body FROM responses WHERE id = :id AND org_id = :orgId', { id, orgId });
      return row && (JSON.parse(row['body'] as string) as ResponseBody);
    },

    putResponseInput: (orgId, responseId, items) => responseRows.putInput(db, orgId, responseId, items),

    async getResponseInput(orgId, responseId) {
      const row = await db.one('SELECT items FROM response_inputs WHERE response_id = :responseId AND org_id = :orgId', { responseId, orgId });
      return row && (JSON.parse(row['items'] as string) as Record<string, unknown>[]);
    },

    deleteResponse: (orgId, id) => db.transaction(async (tx) => {
      await tx.run('DELETE FROM response_inputs WHERE response_id = :id AND org_id = :orgId', { id, orgId });
      return (await tx.run('DELETE FROM responses WHERE id = :id AND org_id = :orgId', { id, orgId })) > 0;
    }),

    insertBackgroundResponse: (body, job, lease, inputItems) => db.transaction(async (tx) => {
      if (inputItems) await responseRows.putInput(tx, job.orgId, body.id, inputItems);
      await tx.run(`INSERT INTO background_jobs (response_id, org_id, deadline_at, request, created_at, window_rank, lease_owner, lease_until_ms)
                    VALUES (:responseId, :orgId, :deadlineAt, :request, :createdAt, :rank, :owner, :untilMs)`,
      { ...job, request: JSON.stringify(job.request), rank: WINDOW_RANK[job.window], owner: lease.owner, untilMs: lease.untilMs });
      await responseRows.insert(tx, job.orgId, body, job.createdAt);
    }),

    finishBackgroundResponse: (orgId, body) => db.transaction(async (tx) => {
      await responseRows.update(tx, orgId, body);
      await tx.run('DELETE FROM background_jobs WHERE response_id = :id AND org_id = :orgId', { id: body.id, orgId });
    }),

    async listBackgroundJobs() {
      return (await db.all('SELECT * FROM background_jobs ORDER BY created_at, response_id COLLATE "C"')).map(backgroundJob);
    },

    async getBackgroundJob(orgId, responseId) {
      const row = await db.one('SELECT * FROM background_jobs WHERE response_id = :responseId AND org_id = :orgId', { responseId, orgId });
      return row && backgroundJob(row);
    },

    cancelBackgroundResponse: (orgId, cancelled, delivery) => db.transaction(async (tx) => {
      // Deletes the job (whoever holds it) while the response is in_progress. The DELETE locks the
      // job row first, so a fenced end running at the same time (leases-repo.ts) either commits
      // before (the job is gone: false here) or finds the job gone after (it writes nothing).
      const taken = await tx.run(`DELETE FROM background_jobs WHERE response_id = :id AND org_id = :orgId
          AND EXISTS (SELECT 1 FROM responses r WHERE r.id = :id AND r.org_id = :orgId AND r.status = 'in_progress')`,
      { id: cancelled.id, orgId });
      if (taken === 0) return false;
      await responseRows.update(tx, orgId, cancelled);
      if (delivery) await webhookRows.insert(tx, delivery);
      return true;
    }),
  };
}
