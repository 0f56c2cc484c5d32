// Upgrading a database written before webhook tokens were kept out of stored objects (issue 11,
// point 7): the migration scrubs metadata.webhook_token from stored responses, delivery bodies and
// batch result lines, forgets the token of ended deliveries, keeps it for pending ones, and gives
// every delivery its receiver host for the fairness caps.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, expect, it } from 'vitest';
import { SQLITE_MIGRATIONS } from '../src/store/migrations.js';
import { SqliteStore } from '../src/store/sqlite-store.js';

let dir: string | undefined;
afterEach(() => { if (dir) rmSync(dir, { recursive: true, force: true }); });

const TOKEN = 'old-secret';
const metadata = { completion_webhook: 'https://hooks.example:8443/cb?x=1', webhook_token: TOKEN, tag: 't' };
const response = { id: 'resp_1', object: 'response', status: 'completed', metadata, usage: { input_tokens: 3 } };

it('scrubs tokens from everything but pending deliveries and fills in receiver hosts', async () => {
  dir = mkdtempSync(join(os.tmpdir(), 'sluice-migrate-'));
  const path = join(dir, 'sluice.db');
  const before = SQLITE_MIGRATIONS.findIndex((m) => m.includes('leased_until_ms'));
  expect(before).toBeGreaterThan(0);
  const old = new Database(path);
  for (let v = 0; v < before; v++) old.exec(SQLITE_MIGRATIONS[v]!);
  old.pragma(`user_version = ${before}`);
  old.prepare("INSERT INTO organizations (id, name, created_at) VALUES ('org_1', 'acme', 1)").run();
  old.prepare('INSERT INTO responses (id, org_id, status, created_at, updated_at, body) VALUES (?, ?, ?, 1, 1, ?)')
    .run('resp_1', 'org_1', 'completed', JSON.stringify(response));
  const delivery = old.prepare(`INSERT INTO webhook_deliveries (id, org_id, object_id, url, token, body, state, attempts,
    next_attempt_at_ms, created_at, updated_at) VALUES (?, 'org_1', 'resp_1', ?, ?, ?, ?, 0, 0, 1, 1)`);
  delivery.run('whd_pending', metadata.completion_webhook, TOKEN, JSON.stringify(response), 'pending');
  delivery.run('whd_done', 'http://LOCAL.example/x', TOKEN, JSON.stringify(response), 'delivered');
  old.prepare('INSERT INTO batch_results (batch_id, line_no, ok, line) VALUES (?, 1, 1, ?)')
    .run('batch_1', JSON.stringify({ id: 'r', custom_id: 'a', response: { status_code: 200, body: response }, error: null }));
  old.close();

  await new SqliteStore(path).close();

  const db = new Database(path, { readonly: true });
  try {
    const stored = JSON.parse((db.prepare('SELECT body FROM responses').get() as { body: string }).body);
    expect(stored).toEqual({ ...response, metadata: { completion_webhook: metadata.completion_webhook, tag: 't' } });
    const rows = db.prepare('SELECT id, host, token, body FROM webhook_deliveries ORDER BY id').all() as Record<string, string>[];
    expect(rows.map((r) => [r['id'], r['host'], r['token']])).toEqual([
      ['whd_done', 'local.example', null],
      ['whd_pending', 'hooks.example:8443', TOKEN],
    ]);
    for (const r of rows) expect(r['body']).not.toContain(TOKEN);
    expect((db.prepare('SELECT line FROM batch_results').get() as { line: string }).line).not.toContain(TOKEN);
  } finally {
    db.close();
  }
});
