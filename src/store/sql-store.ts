// The Store as its repositories over one database: SqliteStore and PostgresStore are this class
// over their driver (sqlite-store.ts, postgres-store.ts), so every statement is written once. Each
// repository (store.ts names its file) owns its tables' statements; the one write that spans them,
// a request's end, is the unit of work below, to which each lends its statements (responseRows,
// usageRows, ...) inside one transaction.

import { batchRepository, batchRows } from './batches-repo.js';
import { fileRepository } from './files-repo.js';
import { idempotencyRepository, idempotencyRows } from './idempotency-repo.js';
import { keyRepository } from './keys-repo.js';
import { leaseRepository, leaseRows } from './leases-repo.js';
import { responseRepository, responseRows } from './responses-repo.js';
import type { Sql, SqlDriver } from './sql-driver.js';
import type { RequestEnd, RequestEndCommit, Store } from './store.js';
import { usageLedger, usageRows } from './usage-repo.js';
import { webhookOutbox, webhookRows } from './webhooks-repo.js';

/**
 * A request's end in one transaction: the fences first, before any write (an end whose work this
 * replica no longer holds writes nothing), then the terminal object, the idempotency result, the
 * batch result row, the ledger row and the webhook delivery.
 */
export async function commitRequestEnd(tx: Sql, end: RequestEnd): Promise<RequestEndCommit> {
  const { response, idempotency, batchResult } = end;
  if (response?.kind === 'background' && !(await leaseRows.endBackgroundJob(tx, response.orgId, response.body.id, response.leaseOwner))) {
    return { batchResultRecorded: false, backgroundLeaseLost: true };
  }
  if (idempotency?.leaseOwner !== undefined && !(await idempotencyRows.held(tx, idempotency, idempotency.leaseOwner))) {
    return { batchResultRecorded: false, idempotencyLeaseLost: true };
  }
  if (batchResult?.lease && !(await batchRows.fence(tx, batchResult.batchId, batchResult.lease.chunkNo, batchResult.lease.owner))) {
    return { batchResultRecorded: false, batchLeaseLost: true };
  }
  if (response?.kind === 'foreground') {
    await responseRows.insert(tx, response.orgId, response.body);
    if (response.inputItems) await responseRows.putInput(tx, response.orgId, response.body.id, response.inputItems);
  }
  else if (response?.kind === 'background') await responseRows.update(tx, response.orgId, response.body);
  if (idempotency) await idempotencyRows.complete(tx, idempotency);
  const batchResultRecorded = batchResult ? await batchRows.recordResult(tx, batchResult.batchId, batchResult.result, batchResult.progress) : false;
  if (end.usage) await usageRows.insert(tx, end.usage);
  if (end.delivery) await webhookRows.insert(tx, end.delivery);
  return { batchResultRecorded };
}

// The class gets the repositories' methods in its constructor; this declaration types them.
export interface SqlStore extends Store {}

export class SqlStore {
  constructor(private readonly db: SqlDriver) {
    // Typed as the whole Store less what the class defines: a repository method missing here fails to compile.
    const repositories: Omit<Store, 'shared' | 'commitRequestEnd' | 'reclaimSpace' | 'close'> = {
      ...keyRepository(db), ...responseRepository(db), ...fileRepository(db), ...idempotencyRepository(db), ...batchRepository(db),
      ...webhookOutbox(db), ...usageLedger(db), ...leaseRepository(db),
    };
    Object.assign(this, repositories);
  }

  get shared(): boolean {
    return this.db.shared;
  }

  commitRequestEnd(end: RequestEnd): Promise<RequestEndCommit> {
    return this.db.transaction((tx) => commitRequestEnd(tx, end));
  }

  /** Hands back the space a batch's end freed (its result rows): batch_results is the table that large deletions empty. */
  reclaimSpace(): Promise<void> {
    return this.db.reclaimSpace('batch_results');
  }

  close(): Promise<void> {
    return this.db.close();
  }
}
