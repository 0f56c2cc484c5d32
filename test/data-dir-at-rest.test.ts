// The data directory at rest: the SQLite store's file modes (0600 files, a 0700 directory when it
// makes one, an existing database tightened at open), and space given back to the file system
// once a large batch's result rows are dropped (incremental auto-vacuum, also for a database made
// before it was turned on).

import { chmodSync, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { BatchRecord } from '../src/store/batch-records.js';
import { SqliteStore } from '../src/store/sqlite-store.js';

let root: string;
beforeEach(() => { root = mkdtempSync(join(os.tmpdir(), 'sluice-at-rest-')); });
afterEach(() => rmSync(root, { recursive: true, force: true }));

const mode = (path: string) => statSync(path).mode & 0o777;

describe('file modes of the SQLite store', () => {
  it('creates its directory 0700 and sluice.db, -wal and -shm 0600', async () => {
    const path = join(root, 'new-dir', 'sluice.db');
    const store = new SqliteStore(path);
    await store.ensureOrganization('o'); // a write, so that the WAL exists
    expect(mode(join(root, 'new-dir'))).toBe(0o700);
    for (const file of [path, `${path}-wal`, `${path}-shm`]) {
      expect(existsSync(file)).toBe(true);
      expect(mode(file)).toBe(0o600);
    }
    await store.close();
  });

  it('tightens an existing world-readable database at open', async () => {
    const path = join(root, 'sluice.db');
    await new SqliteStore(path).close();
    chmodSync(path, 0o644);
    const store = new SqliteStore(path);
    expect(mode(path)).toBe(0o600);
    await store.close();
  });
});

async function insertBatch(store: SqliteStore, id: string): Promise<BatchRecord> {
  const org = await store.ensureOrganization('o');
  const batch: BatchRecord = {
    id, orgId: org.id, orgName: 'o', keyId: 'k', endpoint: '/v1/responses', inputFileId: 'file-00000000', completionWindow: 'flex',
    status: 'in_progress', errors: null, outputFileId: null, errorFileId: null, metadata: null,
    requestCounts: { total: 2000, completed: 0, failed: 0 }, progress: { nextLine: 1, nextOffset: 0 }, createdAt: 100, expiresAt: 200,
    inProgressAt: 100, finalizingAt: null, completedAt: null, failedAt: null, expiredAt: null, cancellingAt: null, cancelledAt: null,
  };
  await store.insertBatch(batch);
  return batch;
}

/** Bytes of the database and its WAL together. */
function onDisk(path: string): number {
  return [path, `${path}-wal`].filter(existsSync).reduce((sum, f) => sum + statSync(f).size, 0);
}

/** Records 2,000 result lines of 8 KiB (16 MiB), ends the batch (which drops them) and reclaims. */
async function bigBatchThenReclaim(store: SqliteStore, path: string): Promise<{ full: number; after: number }> {
  const batch = await insertBatch(store, 'batch_big');
  const line = 'x'.repeat(8192);
  for (let n = 1; n <= 2000; n++) {
    await store.recordBatchResult(batch.id, { lineNo: n, ok: true, line }, { nextLine: n + 1, nextOffset: n * 100 });
  }
  await store.reclaimSpace(); // checkpoint: the rows now live in the database file itself
  const full = onDisk(path);
  expect(await store.finishBatch(batch.id, ['in_progress'], { status: 'cancelled', cancelledAt: 150 }, [])).toBeDefined();
  await store.reclaimSpace();
  return { full, after: onDisk(path) };
}

describe('space of dropped batch results', () => {
  it('goes back to the file system after a large batch ends', async () => {
    const path = join(root, 'sluice.db');
    const store = new SqliteStore(path);
    const { full, after } = await bigBatchThenReclaim(store, path);
    expect(full).toBeGreaterThan(16 * 1024 * 1024);
    expect(after).toBeLessThan(2 * 1024 * 1024);
    await store.close();
  });

  it('also in a database created before incremental auto-vacuum (switched by one VACUUM at open)', async () => {
    const path = join(root, 'sluice.db');
    await new SqliteStore(path).close();
    // Turn the database back into one without auto-vacuum, as older sluice versions made it.
    const old = new Database(path);
    old.pragma('auto_vacuum = NONE');
    old.exec('VACUUM');
    expect(old.pragma('auto_vacuum', { simple: true })).toBe(0);
    old.close();

    const store = new SqliteStore(path);
    const { full, after } = await bigBatchThenReclaim(store, path);
    expect(full).toBeGreaterThan(16 * 1024 * 1024);
    expect(after).toBeLessThan(2 * 1024 * 1024);
    await store.close();
  });
});
