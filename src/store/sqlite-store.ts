// The single-process store: one SQLite file (better-sqlite3, WAL) under the data directory, behind
// the dialect layer (sql-driver.ts) that the repositories are written against (sql-store.ts).
//
// better-sqlite3 is synchronous and a statement takes microseconds; the async Sql interface wraps
// its results. A transaction (BEGIN IMMEDIATE: the write lock first, so that a second process such
// as `sluice keys` waits for it instead of failing mid-transaction) awaits between its statements,
// so it must not see another caller's statements run inside it, and no other connection of this
// process may wait for the file's write lock meanwhile: that wait blocks the thread (SQLite's busy
// handler sleeps), so the open transaction could never finish. Every connection to one file in
// this process therefore shares one queue (FileQueue): transactions run one at a time, and a
// statement outside them waits while one is open or queued.

import { chmodSync, closeSync, existsSync, mkdirSync, openSync } from 'node:fs';
import { dirname, resolve as absolutePath } from 'node:path';
import Database from 'better-sqlite3';
import { SQLITE_MIGRATIONS } from './migrations.js';
import { compiler, values, type Params, type Row, type Sql, type SqlDriver } from './sql-driver.js';
import { SqlStore } from './sql-store.js';

/** Free pages handed back per step of reclaimSpace (4 KiB pages: 8 MiB). */
const RECLAIM_STEP_PAGES = 2048;

/** SQLite binds no booleans and no arrays: 1/0, and JSON text (read back through json_each). */
const bind = (value: unknown): unknown =>
  typeof value === 'boolean' ? (value ? 1 : 0) : Array.isArray(value) ? JSON.stringify(value) : value ?? null;

/** The transactions of one database file in this process, in order. */
class FileQueue {
  private static readonly byPath = new Map<string, FileQueue>();
  /** Settles when the last transaction queued so far has ended; undefined when none is open or queued. */
  private tail: Promise<void> | undefined;
  /** Open connections using this queue. */
  private users = 0;

  private constructor(private readonly path: string) {}

  static open(path: string): FileQueue {
    // ':memory:' is a database of its own per connection: nothing to share.
    if (path === ':memory:') return new FileQueue(path);
    const queue = FileQueue.byPath.get(absolutePath(path)) ?? new FileQueue(absolutePath(path));
    FileQueue.byPath.set(queue.path, queue);
    queue.users++;
    return queue;
  }

  close(): void {
    if (--this.users === 0) FileQueue.byPath.delete(this.path);
  }

  /** A statement outside any transaction: at once when none is open, else after the queued ones. */
  outside<T>(fn: () => T): Promise<T> {
    if (this.tail !== undefined) return this.exclusive(async () => fn());
    try {
      return Promise.resolve(fn());
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Runs `fn` after every transaction queued before it, and before any queued after it. */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const before = this.tail;
    let done!: () => void;
    const ended = new Promise<void>((resolve) => { done = resolve; });
    this.tail = ended;
    const run = async (): Promise<T> => {
      try {
        return await fn();
      } finally {
        if (this.tail === ended) this.tail = undefined;
        done();
      }
    };
    return before ? before.then(run) : run();
  }
}

export class SqliteDriver implements SqlDriver {
  readonly shared = false;
  private readonly db: Database.Database;
  private readonly compile = compiler('sqlite');
  private readonly queue: FileQueue;
  private readonly statements = new Map<string, Database.Statement>();
  /** The open transaction's view: statements straight on the connection, nested transactions joined. */
  private readonly tx: Sql = {
    all: async (text, params) => this.exec(text, params, 'all') as Row[],
    one: async (text, params) => (this.exec(text, params, 'all') as Row[])[0],
    run: async (text, params) => this.exec(text, params, 'run') as number,
    transaction: (fn) => fn(this.tx),
    advisoryLock: async () => {},
  };

  /**
   * Opens (creating if needed) the database at `path` and applies pending migrations. The file and
   * its -wal/-shm are private to the owner (0600), an existing database's included; a directory
   * made for it is 0700.
   */
  constructor(path: string) {
    if (path !== ':memory:') createPrivately(path);
    this.db = new Database(path);
    try {
      useIncrementalVacuum(this.db);
      this.db.pragma('journal_mode = WAL');
      this.db.pragma('synchronous = NORMAL');
      this.db.pragma('foreign_keys = ON');
      this.db.pragma('busy_timeout = 5000');
      migrate(this.db);
    } catch (err) {
      this.db.close();
      throw err;
    }
    this.queue = FileQueue.open(path);
  }

  all(text: string, params?: Params): Promise<Row[]> {
    return this.queue.outside(() => this.exec(text, params, 'all') as Row[]);
  }

  async one(text: string, params?: Params): Promise<Row | undefined> {
    return (await this.all(text, params))[0];
  }

  run(text: string, params?: Params): Promise<number> {
    return this.queue.outside(() => this.exec(text, params, 'run') as number);
  }

  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.queue.exclusive(async () => {
      this.db.exec('BEGIN IMMEDIATE');
      try {
        const result = await fn(this.tx);
        this.db.exec('COMMIT');
        return result;
      } catch (err) {
        if (this.db.inTransaction) this.db.exec('ROLLBACK');
        throw err;
      }
    });
  }

  async advisoryLock(): Promise<void> {}

  /**
   * Gives the file system back the pages that deleted rows left free: an incremental vacuum, then
   * a checkpoint that truncates the WAL, which the vacuum just grew. Cheap when nothing is free.
   * It goes in steps of RECLAIM_STEP_PAGES with the event loop free between them (freeing hundreds
   * of megabytes at once would hold every request).
   */
  async reclaimSpace(): Promise<void> {
    const vacuumStep = async (): Promise<boolean> => {
      if (!this.db.open || (this.db.pragma('freelist_count', { simple: true }) as number) === 0) return false;
      this.db.pragma(`incremental_vacuum(${RECLAIM_STEP_PAGES})`);
      return true;
    };
    while (await this.queue.exclusive(vacuumStep)) await new Promise((resolve) => setImmediate(resolve));
    await this.queue.exclusive(async () => { if (this.db.open) this.db.pragma('wal_checkpoint(TRUNCATE)'); });
  }

  async close(): Promise<void> {
    if (!this.db.open) return;
    this.db.close();
    this.queue.close();
  }

  private exec(text: string, params: Params = {}, mode: 'all' | 'run'): Row[] | number {
    const compiled = this.compile(text);
    let statement = this.statements.get(compiled.text);
    if (!statement) this.statements.set(compiled.text, (statement = this.db.prepare(compiled.text)));
    const args = values(compiled, params, bind);
    return mode === 'all' ? (statement.all(...args) as Row[]) : statement.run(...args).changes;
  }
}

/** The Store on SQLite: `new SqliteStore(<data-dir>/sluice.db)`. */
export class SqliteStore extends SqlStore {
  constructor(path: string) {
    super(new SqliteDriver(path));
  }
}

/**
 * Makes the database's directory (0700) and an empty database file (0600) when missing, and
 * tightens an existing file and its -wal/-shm to 0600. SQLite creates -wal and -shm with the
 * database file's mode, so they follow.
 */
function createPrivately(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  if (!existsSync(path)) closeSync(openSync(path, 'a', 0o600));
  for (const file of [path, `${path}-wal`, `${path}-shm`]) {
    if (existsSync(file)) chmodSync(file, 0o600);
  }
}

/**
 * Auto-vacuum INCREMENTAL keeps a map of free pages so that reclaimSpace can hand them back.
 * A database made before this setting needs one VACUUM to switch (it rewrites the file; run
 * outside any transaction, before WAL mode is set); a new, empty one takes it directly.
 */
function useIncrementalVacuum(db: Database.Database): void {
  const INCREMENTAL = 2;
  if (db.pragma('auto_vacuum', { simple: true }) === INCREMENTAL) return;
  db.pragma('auto_vacuum = INCREMENTAL');
  if ((db.pragma('page_count', { simple: true }) as number) === 0) return;
  try {
    db.exec('VACUUM');
  } catch (err) {
    // Another process is in the database (a CLI command next to a server of an older version):
    // the switch waits for the next open; nothing else depends on it.
    if (!(err as { code?: string }).code?.startsWith('SQLITE_BUSY')) throw err;
  }
}

/** PRAGMA user_version counts the migrations applied; each runs in its own transaction. */
function migrate(db: Database.Database): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > SQLITE_MIGRATIONS.length) {
    throw new Error(`the database was written by a newer sluice (schema version ${current}, this one knows ${SQLITE_MIGRATIONS.length})`);
  }
  for (let v = current; v < SQLITE_MIGRATIONS.length; v++) {
    db.transaction(() => {
      db.exec(SQLITE_MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
}
