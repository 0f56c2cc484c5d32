// One server per data directory. Two servers on one directory would both resume the same
// background responses and batches and drop each other's pending idempotency records, so the
// server takes an exclusive lock at start and a second one is refused with a clear message.
//
// The lock is an open exclusive transaction on a small SQLite file, `<data-dir>/server.lock`
// (locking_mode EXCLUSIVE + BEGIN EXCLUSIVE). SQLite locks are the operating system's file locks:
// they end with the process that holds them, kill -9 included, so a lock is never stale (no PID
// file to clean up). Within one process SQLite tracks the lock too, so a second openService in the
// same process is refused as well. `sluice keys` and `sluice usage` open sluice.db, not this
// file: they keep working next to a running server.

import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { SluiceError } from '../errors.js';

export const LOCK_FILE = 'server.lock';

export class DataDirLock {
  private constructor(private db: Database.Database | undefined, readonly path: string) {}

  /**
   * Takes the lock of an existing directory, or throws SluiceError data_dir_locked naming the
   * directory when another server (in this process or another) holds it.
   */
  static acquire(dataDir: string): DataDirLock {
    const path = join(dataDir, LOCK_FILE);
    // Created 0600 before SQLite opens it (SQLite would create it with the process umask).
    closeSync(openSync(path, 'a', 0o600));
    const db = new Database(path, { timeout: 0 });
    try {
      db.pragma('locking_mode = EXCLUSIVE');
      db.exec('BEGIN EXCLUSIVE');
    } catch (err) {
      db.close();
      if ((err as { code?: string }).code?.startsWith('SQLITE_BUSY')) {
        throw new SluiceError('data_dir_locked',
          `another sluice server is using the data directory ${dataDir} (it holds ${path}); stop it, or give this one another --data-dir`);
      }
      throw err;
    }
    return new DataDirLock(db, path);
  }

  /** Ends the transaction and closes the file, which frees the lock. Safe to call twice. */
  release(): void {
    const db = this.db;
    this.db = undefined;
    if (db?.open) db.close();
  }
}
