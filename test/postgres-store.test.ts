// What only the PostgreSQL store has (it needs SLUICE_TEST_POSTGRES_URL; skipped with the reason
// otherwise): its schema_migrations table, migrations applied once and whole even when replicas
// start at the same moment, a schema from a newer sluice refused, and integers that come back
// exactly or not at all. Each test works in a fresh schema of its own, dropped after it.
import { afterEach, describe, expect, it } from 'vitest';
import { POSTGRES_MIGRATIONS } from '../src/store/migrations.js';
import { migratePostgres, parseBigint, PostgresStore } from '../src/store/postgres-store.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient } from './helpers/stores.js';

const suite = POSTGRES_URL ? describe : describe.skip;
const title = `PostgresStore${POSTGRES_URL ? '' : ' [skipped: SLUICE_TEST_POSTGRES_URL is not set]'}`;

describe('parseBigint', () => {
  it('reads int8 text exactly and refuses what a JS number cannot hold exactly', () => {
    expect(parseBigint('1764000000123')).toBe(1_764_000_000_123);
    expect(parseBigint('-9007199254740991')).toBe(-Number.MAX_SAFE_INTEGER);
    expect(() => parseBigint('9007199254740993')).toThrow(/beyond JavaScript's exact integers/);
  });
});

suite(title, () => {
  const schemas: string[] = [];
  const stores: PostgresStore[] = [];
  const schema = () => {
    const s = freshSchema();
    schemas.push(s);
    return s;
  };
  const open = async (s: string) => {
    const store = await PostgresStore.open(POSTGRES_URL!, { schema: s });
    stores.push(store);
    return store;
  };
  afterEach(async () => {
    for (const store of stores.splice(0)) await store.close();
    for (const s of schemas.splice(0)) await dropSchema(s);
  });

  async function versions(s: string): Promise<{ version: number; name: string }[]> {
    const client = await schemaClient(s);
    try {
      return (await client.query('SELECT version, name FROM schema_migrations ORDER BY version')).rows;
    } finally {
      await client.end();
    }
  }

  it('records each migration once, also when several replicas start at the same moment', async () => {
    const s = schema();
    const started = await Promise.all(Array.from({ length: 4 }, () => open(s)));
    expect(started).toHaveLength(4);
    const expected = POSTGRES_MIGRATIONS.map((m, i) => ({ version: i + 1, name: m.name }));
    expect(await versions(s)).toEqual(expected);
    await open(s); // a restart finds nothing to do
    expect(await versions(s)).toEqual(expected);
  });

  it('refuses a schema written by a newer sluice', async () => {
    const s = schema();
    await open(s);
    const client = await schemaClient(s);
    try {
      await client.query("INSERT INTO schema_migrations (version, name) VALUES ($1, 'future')", [POSTGRES_MIGRATIONS.length + 1]);
    } finally {
      await client.end();
    }
    await expect(open(s)).rejects.toThrow(/written by a newer sluice/);
  });

  it('applies each migration in its own transaction: a failing one leaves nothing of itself', async () => {
    const s = schema();
    await open(s);
    const later = [
      ...POSTGRES_MIGRATIONS,
      { name: 'good', sql: 'CREATE TABLE good_table (x INTEGER)' },
      { name: 'bad', sql: 'CREATE TABLE half_table (x INTEGER); SELECT 1 / 0' },
    ];
    const client = await schemaClient(s);
    try {
      await expect(migratePostgres(client as never, later)).rejects.toThrow(/division by zero/);
      expect((await client.query('SELECT MAX(version) AS v FROM schema_migrations')).rows[0].v).toBe(POSTGRES_MIGRATIONS.length + 1);
      const tables = (await client.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = $1
        AND table_name IN ('good_table', 'half_table')`, [s])).rows.map((r) => r.table_name);
      expect(tables).toEqual(['good_table']);
      // The advisory lock was given back: another start goes through (and refuses the unknown version 3).
      await expect(open(s)).rejects.toThrow(/schema version/);
    } finally {
      await client.end();
    }
  });

  it('reads back an integer only when it is exact', async () => {
    const s = schema();
    const store = await open(s);
    const org = (await store.ensureOrganization('o')).id;
    await store.insertFile({ id: 'file-1', orgId: org, bytes: Number.MAX_SAFE_INTEGER, createdAt: 1, filename: 'f', purpose: 'batch', status: 'processed', statusDetails: null });
    expect((await store.getFile(org, 'file-1'))!.bytes).toBe(Number.MAX_SAFE_INTEGER);
    const client = await schemaClient(s);
    try {
      await client.query("UPDATE files SET bytes = 9007199254740993 WHERE id = 'file-1'");
    } finally {
      await client.end();
    }
    await expect(store.getFile(org, 'file-1')).rejects.toThrow(/beyond JavaScript's exact integers/);
  });

  it('refuses a schema name that is not a plain identifier', async () => {
    await expect(PostgresStore.open(POSTGRES_URL!, { schema: 'x; DROP TABLE y' })).rejects.toThrow(/invalid PostgreSQL schema name/);
  });
});
