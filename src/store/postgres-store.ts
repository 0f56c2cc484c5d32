// The store on PostgreSQL (the maintained `pg` driver), for several processes sharing one
// database: the same repositories as SQLite (sql-store.ts) over this driver. Selected by
// `sluice serve --database-url` (SQLite stays the default).
//
// A transaction is one pooled client from BEGIN to COMMIT. Races are settled by the database,
// never by timing: status changes are compare-and-set UPDATEs, idempotency keys and ledger rows
// are unique by constraints (ON CONFLICT), claims take rows FOR UPDATE SKIP LOCKED, fences lock
// the rows they check until their commit, and the fair webhook claim is serialized by an advisory
// lock (advisoryLock). Every statement is parameterized.
//
// BIGINT (int8) columns, and COUNT(*) over them, arrive from the server as text. They are parsed
// into JS numbers exactly: a value past Number.MAX_SAFE_INTEGER (2^53 - 1) throws instead of being
// rounded. Nothing the store keeps comes near that (Unix ms are about 2^41; money is decimal text).

import pg from 'pg';
import { POSTGRES_MIGRATIONS, type Migration } from './migrations.js';
import { compiler, values, type Params, type Row, type Sql, type SqlDriver } from './sql-driver.js';
import { SqlStore } from './sql-store.js';

export interface PostgresStoreOptions {
  /**
   * The schema holding sluice's tables (created when missing); the connection's default
   * (normally `public`) when absent. Lower-case letters, digits and underscores.
   */
  schema?: string;
  /** Most connections the pool opens (pg's default: 10). */
  maxConnections?: number;
  /** Milliseconds a new connection may take before it fails (pg's default: no limit). */
  connectTimeoutMs?: number;
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;
const INT8_OID = 20;

/** Parses an int8 exactly, or throws: never a silently rounded number. */
export function parseBigint(text: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n)) throw new RangeError(`integer ${text} from PostgreSQL is beyond JavaScript's exact integers`);
  return n;
}

/** Type parsers for the store's pool only (pg's global parsers are left as they are). */
const STORE_TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === INT8_OID && format !== 'binary' ? parseBigint : pg.types.getTypeParser(oid, format as 'text')) as pg.CustomTypesConfig['getTypeParser'],
};

type Queryable = Pick<pg.Pool | pg.PoolClient, 'query'>;

export class PostgresDriver implements SqlDriver {
  readonly shared = true;
  private readonly compile = compiler('postgres');
  private closed = false;

  constructor(private readonly pool: pg.Pool) {}

  all(text: string, params?: Params): Promise<Row[]> {
    return this.query(this.pool, text, params).then((r) => r.rows);
  }

  async one(text: string, params?: Params): Promise<Row | undefined> {
    return (await this.all(text, params))[0];
  }

  run(text: string, params?: Params): Promise<number> {
    return this.query(this.pool, text, params).then((r) => r.rowCount ?? 0);
  }

  async transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    const tx: Sql = {
      all: async (text, params) => (await this.query(client, text, params)).rows,
      one: async (text, params) => (await this.query(client, text, params)).rows[0],
      run: async (text, params) => (await this.query(client, text, params)).rowCount ?? 0,
      transaction: (inner) => inner(tx),
      advisoryLock: async (key) => {
        await client.query(`SELECT pg_advisory_xact_lock($1, hashtext(COALESCE(current_schema(), '')))`, [key]);
      },
    };
    let broken = false;
    try {
      await client.query('BEGIN');
      try {
        const result = await fn(tx);
        await client.query('COMMIT');
        return result;
      } catch (err) {
        // A connection that cannot even roll back is dropped, not handed back to the pool.
        await client.query('ROLLBACK').catch(() => { broken = true; });
        throw err;
      }
    } finally {
      client.release(broken);
    }
  }

  async advisoryLock(): Promise<void> {
    throw new Error('advisoryLock is for a transaction: a lock of its own would end with its statement');
  }

  /**
   * PostgreSQL's autovacuum makes deleted rows' space reusable on its own; after a large deletion
   * (a finished batch's result rows) this VACUUMs the table now, so the space is reused (and a
   * truncatable tail handed back) without waiting for autovacuum's thresholds.
   */
  async reclaimSpace(table: string): Promise<void> {
    await this.pool.query(`VACUUM ${table}`);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }

  private query(on: Queryable, text: string, params: Params = {}): Promise<pg.QueryResult<Row>> {
    const compiled = this.compile(text);
    return on.query<Row>(compiled.text, values(compiled, params, (v) => v ?? null));
  }
}

/** The Store on PostgreSQL: `await PostgresStore.open(url, { schema })`. */
export class PostgresStore extends SqlStore {
  /**
   * Connects to the database at `url` (postgres://user:password@host:port/database) and applies
   * pending migrations (migratePostgres: under an advisory lock, so replicas may start together).
   */
  static async open(url: string, opts: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const { schema } = opts;
    if (schema !== undefined && !SCHEMA_NAME.test(schema)) throw new Error(`invalid PostgreSQL schema name: ${schema}`);
    const pool = new pg.Pool({
      connectionString: url,
      types: STORE_TYPES,
      ...(opts.maxConnections !== undefined ? { max: opts.maxConnections } : {}),
      ...(opts.connectTimeoutMs !== undefined ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}),
      // The schema is checked above to be a plain identifier; search_path makes every unqualified table name its own.
      ...(schema !== undefined ? { options: `-c search_path=${schema}` } : {}),
    });
    // An idle client's connection error (the server restarting) must not crash the process; the
    // next query gets a fresh connection.
    pool.on('error', () => {});
    try {
      const client = await pool.connect();
      try {
        await migratePostgres(client, undefined, schema);
      } finally {
        client.release();
      }
    } catch (err) {
      await pool.end();
      throw err;
    }
    return new PostgresStore(new PostgresDriver(pool));
  }
}

/** The advisory lock (two-key form) held while migrating: the schema's name is the second key. */
const MIGRATION_LOCK = 0x51c3;

/**
 * Applies the migrations not yet recorded in the current schema (the connection's search_path),
 * each in its own transaction with its schema_migrations row, under a session advisory lock keyed
 * by the schema, so replicas starting at once apply each exactly once and the others wait, then
 * find nothing to do. `createSchema` (the search_path's schema, when it may not exist yet) is
 * created under the same lock. Throws when the schema records a version this code does not know.
 */
export async function migratePostgres(client: pg.PoolClient, migrations: readonly Migration[] = POSTGRES_MIGRATIONS,
  createSchema?: string): Promise<void> {
  const { rows: named } = await client.query<{ s: string }>(`SELECT COALESCE($1::text, current_schema(), '') AS s`, [createSchema ?? null]);
  const lockName = named[0]!.s;
  await client.query('SELECT pg_advisory_lock($1, hashtext($2))', [MIGRATION_LOCK, lockName]);
  try {
    if (createSchema !== undefined) await client.query(`CREATE SCHEMA IF NOT EXISTS ${client.escapeIdentifier(createSchema)}`);
    await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version    INTEGER PRIMARY KEY,
      name       TEXT NOT NULL,
      applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ v: number | null }>('SELECT MAX(version) AS v FROM schema_migrations');
    const current = rows[0]?.v ?? 0;
    if (current > migrations.length) {
      throw new Error(`the database was written by a newer sluice (schema version ${current}, this one knows ${migrations.length})`);
    }
    for (let v = current; v < migrations.length; v++) {
      const m = migrations[v]!;
      await client.query('BEGIN');
      try {
        await client.query(m.sql);
        await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [v + 1, m.name]);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK');
        throw err;
      }
    }
  } finally {
    await client.query('SELECT pg_advisory_unlock($1, hashtext($2))', [MIGRATION_LOCK, lockName]);
  }
}
