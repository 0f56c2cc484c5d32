// The stores the store-level tests run against: SQLite always; PostgreSQL when
// SLUICE_TEST_POSTGRES_URL names a database (postgres://user:password@host/db), each test in a fresh
// schema of its own (dropped after it), so tests never see each other's rows. Without the variable
// the PostgreSQL suites are reported as skipped, with the reason in their name; with
// SLUICE_REQUIRE_POSTGRES=1 a missing variable fails instead.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import Database from 'better-sqlite3';
import pg from 'pg';
import { describe } from 'vitest';
import { PostgresStore } from '../../src/store/postgres-store.js';
import { SqliteStore } from '../../src/store/sqlite-store.js';
import type { Store } from '../../src/store/store.js';
import type { LeaseTerm } from '../../src/store/leases.js';

export type Row = Record<string, unknown>;

/** A lease held for the whole test (an hour) by replica `rpl_test`: for tests about something else. */
export const HELD: LeaseTerm = { owner: 'rpl_test', nowMs: Date.now(), untilMs: Date.now() + 3_600_000 };

/** One test's store, on data of its own. */
export interface StoreUnderTest {
  store: Store;
  /** Another store on the same data (a restart, or a second process/replica). */
  open(): Promise<Store>;
  /** Rows read straight from the database, bypassing the store (SQL both dialects accept). */
  rows(sql: string): Promise<Row[]>;
  /** Runs a statement straight on the database, behind the store's back (another process's write). */
  exec(sql: string): Promise<void>;
  /** Closes every store opened here and removes the data. */
  dispose(): Promise<void>;
}

export interface StoreKind {
  name: 'sqlite' | 'postgres';
  /** Why this kind's tests are skipped here, or undefined when they run. */
  skip: string | undefined;
  create(): Promise<StoreUnderTest>;
}

export const POSTGRES_URL = process.env['SLUICE_TEST_POSTGRES_URL'] || undefined;
if (!POSTGRES_URL && process.env['SLUICE_REQUIRE_POSTGRES'] === '1') {
  throw new Error('SLUICE_REQUIRE_POSTGRES=1 but SLUICE_TEST_POSTGRES_URL is not set');
}

async function sqlite(): Promise<StoreUnderTest> {
  const dir = mkdtempSync(join(os.tmpdir(), 'sluice-store-'));
  const path = join(dir, 'sluice.db');
  const opened: Store[] = [];
  const open = async () => {
    const s = new SqliteStore(path);
    opened.push(s);
    return s;
  };
  return {
    store: await open(),
    open,
    rows: async (sql) => {
      const db = new Database(path, { readonly: true });
      try {
        return db.prepare(sql).all() as Row[];
      } finally {
        db.close();
      }
    },
    exec: async (sql) => {
      const db = new Database(path);
      try {
        db.exec(sql);
      } finally {
        db.close();
      }
    },
    dispose: async () => {
      for (const s of opened) await s.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A fresh schema name for one test. */
export function freshSchema(): string {
  return `sluice_test_${randomBytes(6).toString('hex')}`;
}

/** A pg client whose unqualified table names are `schema`'s (for reading rows behind the store's back). */
export async function schemaClient(schema: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: POSTGRES_URL, options: `-c search_path=${schema}` });
  await client.connect();
  return client;
}

export async function dropSchema(schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: POSTGRES_URL });
  await client.connect();
  try {
    await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await client.end();
  }
}

async function postgres(): Promise<StoreUnderTest> {
  const schema = freshSchema();
  const opened: Store[] = [];
  const open = async () => {
    const s = await PostgresStore.open(POSTGRES_URL!, { schema });
    opened.push(s);
    return s;
  };
  return {
    store: await open(),
    open,
    rows: async (sql) => {
      const client = await schemaClient(schema);
      try {
        return (await client.query(sql)).rows as Row[];
      } finally {
        await client.end();
      }
    },
    exec: async (sql) => {
      const client = await schemaClient(schema);
      try {
        await client.query(sql);
      } finally {
        await client.end();
      }
    },
    dispose: async () => {
      for (const s of opened) await s.close();
      await dropSchema(schema);
    },
  };
}

export const STORE_KINDS: readonly StoreKind[] = [
  { name: 'sqlite', skip: undefined, create: sqlite },
  {
    name: 'postgres',
    skip: POSTGRES_URL ? undefined : 'SLUICE_TEST_POSTGRES_URL is not set (postgres://user:password@host/database)',
    create: postgres,
  },
];

/**
 * One describe block per store kind, named `<title> [<kind>]`; a kind that cannot run here is a
 * skipped block whose name gives the reason.
 */
export function describeStores(title: string, body: (kind: StoreKind) => void): void {
  for (const kind of STORE_KINDS) {
    if (kind.skip) describe.skip(`${title} [${kind.name}: skipped, ${kind.skip}]`, () => body(kind));
    else describe(`${title} [${kind.name}]`, () => body(kind));
  }
}

/** A webhook delivery's row as stored, read behind the store's back: its state, attempts and lease holder. */
export async function deliveryRow(t: StoreUnderTest, id: string): Promise<{ state: string; attempts: number; owner: string | null }> {
  const rows = (await t.rows(`SELECT state, attempts, lease_owner FROM webhook_deliveries WHERE id = '${id}'`)) as
    Array<{ state: string; attempts: number; lease_owner: string | null }>;
  return { state: rows[0]!.state, attempts: Number(rows[0]!.attempts), owner: rows[0]!.lease_owner };
}
