// The store on its own: SQLite's schema version, and, on every store kind (helpers/stores.ts),
// ownership by organization, reopening, and idempotency states.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { SQLITE_MIGRATIONS } from '../src/store/migrations.js';
import { SqliteStore } from '../src/store/sqlite-store.js';
import type { Store } from '../src/store/store.js';
import { describeStores, HELD, type StoreUnderTest } from './helpers/stores.js';

let root: string;
beforeAll(() => { root = mkdtempSync(join(os.tmpdir(), 'sluice-store-')); });
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('SqliteStore', () => {
  it('records its schema version and refuses a database from a newer sluice', async () => {
    const path = join(root, 'v.db');
    await new SqliteStore(path).close();
    const db = new Database(path);
    expect(db.pragma('user_version', { simple: true })).toBe(SQLITE_MIGRATIONS.length);
    db.pragma(`user_version = ${SQLITE_MIGRATIONS.length + 1}`);
    db.close();
    expect(() => new SqliteStore(path)).toThrow(/written by a newer sluice/);
  });
});

describeStores('store basics', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
  });
  afterEach(async () => {
    await t.dispose();
  });

  it('keeps responses per organization and survives reopening', async () => {
    const a = await store.ensureOrganization('a');
    const b = await store.ensureOrganization('b');
    expect((await store.ensureOrganization('a')).id).toBe(a.id);
    await store.insertResponse(a.id, { id: 'resp_1', status: 'in_progress', created_at: 5 });
    expect(await store.updateResponse(b.id, { id: 'resp_1', status: 'completed' })).toBe(false);
    expect(await store.getResponse(b.id, 'resp_1')).toBeUndefined();
    expect(await store.updateResponse(a.id, { id: 'resp_1', status: 'completed', created_at: 5 })).toBe(true);
    await store.close();
    store = await t.open();
    expect(await store.getResponse(a.id, 'resp_1')).toEqual({ id: 'resp_1', status: 'completed', created_at: 5 });
  });

  it('walks an idempotency key through new, in progress, done and mismatch; releases pending keys', async () => {
    const org = (await store.ensureOrganization('a')).id;
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h1', 1, HELD)).toEqual({ state: 'new' });
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h1', 2, HELD)).toEqual({ state: 'in_progress' });
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h2', 2, HELD)).toEqual({ state: 'mismatch' });
    expect(await store.beginIdempotency('other-org', 'messages', 'k', 'h2', 2, HELD)).toEqual({ state: 'new' });
    await store.completeIdempotency(org, 'messages', 'k', 200, { id: 'msg_1' });
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h1', 3, HELD)).toEqual({ state: 'done', statusCode: 200, body: { id: 'msg_1' } });
    // The other organization's key is still pending: a restart releases it, and only it.
    expect(await store.releasePendingIdempotency()).toBe(1);
    expect(await store.beginIdempotency('other-org', 'messages', 'k', 'h2', 4, HELD)).toEqual({ state: 'new' });
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h1', 4, HELD)).toMatchObject({ state: 'done' });
  });
});
