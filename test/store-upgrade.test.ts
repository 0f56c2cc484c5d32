// Databases written by the previous store code (two migration lists, one per dialect) open with
// the current one (one list, src/store/migrations.ts) and keep every row: fixtures made by that
// code (test/fixtures/store-*.sql), with rows in every table, are loaded, opened as a store, read
// back through the Store interface and compared row for row; their schema is the one a new
// database gets. PostgreSQL needs SLUICE_TEST_POSTGRES_URL (skipped with the reason otherwise).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS } from '../src/store/migrations.js';
import { PostgresStore } from '../src/store/postgres-store.js';
import { SqliteStore } from '../src/store/sqlite-store.js';
import type { Store } from '../src/store/store.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient, type Row } from './helpers/stores.js';

const fixture = (name: string) => readFileSync(join(dirname(fileURLToPath(import.meta.url)), 'fixtures', name), 'utf8');
const TABLES = ['organizations', 'api_keys', 'responses', 'response_inputs', 'files', 'idempotency', 'batches', 'batch_results',
  'batch_chunks', 'webhook_deliveries', 'background_jobs', 'usage_ledger'];
const T = 1_764_000_000;

/** What the fixtures hold, read through the Store interface (both were made by the same steps). */
async function expectFixtureRows(store: Store): Promise<void> {
  const org = (await store.getOrganizationByName('acme'))!;
  expect(await store.getOrganizationByName('beta')).toBeDefined();
  expect(await store.findActiveKeyByHash('a'.repeat(64))).toMatchObject({ id: 'key_admin', orgId: org.id, orgName: 'acme', revokedAt: null });
  expect(await store.findActiveKeyByHash('b'.repeat(64))).toBeUndefined();
  expect((await store.listApiKeys()).map((k) => [k.id, k.revokedAt])).toEqual([['key_admin', null], ['key_old', T + 2]]);
  expect(await store.isAdminKey('key_admin')).toBe(true);
  expect(await store.isAdminKey('key_old')).toBe(false);
  expect(await store.getResponse(org.id, 'resp_1')).toEqual({
    id: 'resp_1', object: 'response', status: 'completed', created_at: T, output_text: 'it\'s "quoted"\nand multi-line',
  });
  expect(await store.getResponseInput(org.id, 'resp_1')).toEqual([{ type: 'message', role: 'user', content: 'hi' }]);
  expect((await store.listFiles(org.id, { limit: 10 })).map((f) => [f.id, f.bytes, f.statusDetails])).toEqual([['file-2', 5, 'ok'], ['file-in', 1234, null]]);
  const lease = { owner: 'rpl_new', nowMs: T * 1000 + 120_000, untilMs: T * 1000 + 180_000 };
  expect(await store.beginIdempotency(org.id, 'messages', 'idem-done', 'h1', T, lease)).toEqual({ state: 'done', statusCode: 200, body: { id: 'msg_1', content: [] } });
  // The old replica's lease on the pending key ran out: the next request takes it over.
  expect(await store.beginIdempotency(org.id, 'messages', 'idem-pending', 'h2', T, lease)).toEqual({ state: 'new' });
  expect(await store.getBatch(org.id, 'batch_1')).toMatchObject({
    status: 'in_progress', completionWindow: 'asap', metadata: { tag: 'x' }, requestCounts: { total: 3, completed: 1, failed: 0 },
  });
  expect(await store.listBatchResults('batch_1', 0, 10)).toEqual([{ lineNo: 1, ok: true, line: '{"id":"r1","custom_id":"a"}' }]);
  expect((await store.claimBatchChunks(lease, 10, [])).map((c) => [c.chunk.chunkNo, c.chunk.firstLine, c.chunk.endOffset])).toEqual([[0, 1, 100], [1, 3, 150]]);
  expect((await store.listUsage({})).map((u) => [u.id, u.requestId, u.longContext, u.cost, u.completedAtMs])).toEqual([
    ['use_1', 'batch_1:1', true, '0.0000031', T * 1000 + 1], ['use_2', 'resp_2', false, '0.0000031', T * 1000 + 2],
  ]);
  expect(await store.countPendingWebhookDeliveries()).toBe(1);
  expect(await store.renewWebhookLeases({ owner: 'rpl_old', nowMs: lease.nowMs, untilMs: lease.untilMs })).toEqual(['whd_1']);
  expect(await store.listBackgroundJobs()).toEqual([
    { responseId: 'resp_bg', orgId: org.id, deadlineAt: T + 3600, request: { model: 'm', input: 'go' }, createdAt: T + 4, window: 'flex' },
  ]);
}

describe('a SQLite database written by the previous store code', () => {
  let dir: string | undefined;
  afterEach(() => { if (dir) rmSync(dir, { recursive: true, force: true }); });

  const rows = (path: string): Record<string, Row[]> => {
    const db = new Database(path, { readonly: true });
    try {
      return Object.fromEntries(TABLES.map((t) => [t, db.prepare(`SELECT * FROM ${t} ORDER BY 1, 2`).all() as Row[]]));
    } finally {
      db.close();
    }
  };
  /** Tables, columns and indexes, with the SQL that made them (comments and spacing aside). */
  const schema = (path: string) => {
    const db = new Database(path, { readonly: true });
    try {
      const objects = db.prepare("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name").all() as Row[];
      return objects.map((o) => ({
        ...o,
        sql: String(o['sql']).replace(/--[^\n]*/g, '').replace(/\s+/g, ' ').replace(/\( /g, '(').replace(/ \)/g, ')').trim(),
        columns: o['type'] === 'table' ? db.prepare(`PRAGMA table_xinfo(${o['name']})`).all() : undefined,
      }));
    } finally {
      db.close();
    }
  };

  it('opens at its version with every row kept, and its schema is a new database\'s', async () => {
    dir = mkdtempSync(join(os.tmpdir(), 'sluice-upgrade-'));
    const path = join(dir, 'sluice.db');
    const old = new Database(path);
    old.exec(fixture('store-sqlite-v10.sql'));
    old.close();
    const before = rows(path);
    expect(Object.values(before).every((r) => r.length > 0)).toBe(true);

    const store = new SqliteStore(path);
    await store.close();
    expect(rows(path)).toEqual(before);
    const db = new Database(path, { readonly: true });
    expect(db.pragma('user_version', { simple: true })).toBe(SQLITE_MIGRATIONS.length);
    db.close();
    const fresh = join(dir, 'fresh.db');
    await new SqliteStore(fresh).close();
    expect(schema(path)).toEqual(schema(fresh));

    const reopened = new SqliteStore(path);
    try {
      await expectFixtureRows(reopened);
    } finally {
      await reopened.close();
    }
  });
});

(POSTGRES_URL ? describe : describe.skip)(`a PostgreSQL schema written by the previous store code${POSTGRES_URL ? '' : ' [skipped: SLUICE_TEST_POSTGRES_URL is not set]'}`, () => {
  const schemas: string[] = [];
  afterEach(async () => {
    for (const s of schemas.splice(0)) await dropSchema(s);
  });

  async function query<R extends Row>(schema: string, sql: string): Promise<R[]> {
    const client = await schemaClient(schema);
    try {
      return (await client.query(sql)).rows as R[];
    } finally {
      await client.end();
    }
  }
  const rows = async (schema: string) => Object.fromEntries(await Promise.all(TABLES.map(async (t) => [t, await query(schema, `SELECT * FROM ${t} ORDER BY 1, 2`)])));
  /** Every column's type, nullability and default, and every index and constraint (column order aside). */
  const layout = async (schema: string) => ({
    columns: await query(schema, `SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity FROM information_schema.columns
      WHERE table_schema = current_schema() AND table_name <> 'schema_migrations' ORDER BY table_name, column_name`),
    indexes: (await query(schema, 'SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY indexname'))
      .map((r) => ({ ...r, indexdef: String(r['indexdef']).replace(`${schema}.`, '') })),
    constraints: await query(schema, `SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
      WHERE connamespace = current_schema()::regnamespace ORDER BY conname`),
  });

  it('opens at its version with every row kept, and its schema is a new database\'s', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    const client = await schemaClient(schema);
    try {
      await client.query(`CREATE SCHEMA ${schema}`);
      await client.query(fixture('store-postgres-v4.sql'));
    } finally {
      await client.end();
    }
    const before = await rows(schema);
    expect(Object.values(before).every((r) => r.length > 0)).toBe(true);

    const store = await PostgresStore.open(POSTGRES_URL!, { schema });
    await store.close();
    expect(await rows(schema)).toEqual(before);
    expect((await query(schema, 'SELECT version, name FROM schema_migrations ORDER BY version')))
      .toEqual(POSTGRES_MIGRATIONS.map((m, i) => ({ version: i + 1, name: m.name })));
    const fresh = freshSchema();
    schemas.push(fresh);
    await (await PostgresStore.open(POSTGRES_URL!, { schema: fresh })).close();
    expect(await layout(schema)).toEqual(await layout(fresh));

    const reopened = await PostgresStore.open(POSTGRES_URL!, { schema });
    try {
      await expectFixtureRows(reopened);
    } finally {
      await reopened.close();
    }
  });
});
