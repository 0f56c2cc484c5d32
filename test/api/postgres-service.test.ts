// The whole service on PostgreSQL (`databaseUrl`, `sluice serve --database-url`), through its real
// HTTP API: one service (a response, a file, a batch, a background response, the usage ledger),
// then two services ("replicas", each with its own data directory) on one database and one files
// directory, and `sluice keys` / `sluice usage` with --database-url. Each test has a schema of its
// own, dropped after it. Skipped, with the reason in its name, without SLUICE_TEST_POSTGRES_URL;
// failing instead with SLUICE_REQUIRE_POSTGRES=1 (test/helpers/stores.ts).
//
// Work that replicas share under leases is tested in batch-replicas.test.ts (batch lines in chunks)
// and background-replicas.test.ts (background responses).

import { execFile, spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import OpenAI, { toFile } from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { FileStorage } from '../../src/files/file-storage.js';
import { checkDatabaseUrl, redactDatabaseUrl, scrubPassword } from '../../src/store/database-url.js';
import { openService, type Service } from '../../src/service.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient } from '../helpers/stores.js';
import { chatLine, createBatch, readResults, waitForBatch } from '../helpers/batches.js';
import { uploadWithRawFilename } from '../helpers/raw-upload.js';

const execFileP = promisify(execFile);
const CLI = resolve(dirname(fileURLToPath(import.meta.url)), '../../dist/src/cli.js');
const SKIP = POSTGRES_URL ? undefined : 'SLUICE_TEST_POSTGRES_URL is not set (postgres://user:password@host/database)';

interface Replica {
  service: Service;
  origin: string;
  dataDir: string;
}

let root: string;
let modelDir: string;
const opened: Replica[] = [];
const schemas: string[] = [];

async function startReplica(schema: string, opts: { filesDir?: string; dataDir?: string } = {}): Promise<Replica> {
  const dataDir = opts.dataDir ?? mkdtempSync(join(root, 'data-'));
  const service = await openService({
    catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] },
    dataDir,
    databaseUrl: POSTGRES_URL!,
    databaseSchema: schema,
    ...(opts.filesDir !== undefined && { filesDir: opts.filesDir }),
    engineDefaults: { backend: 'cpu', kvCacheBytes: 32 << 20, threads: 1 },
    onProgress: () => {},
  });
  const origin = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const replica = { service, origin, dataDir };
  opened.push(replica);
  return replica;
}

function newSchema(): string {
  const schema = freshSchema();
  schemas.push(schema);
  return schema;
}

async function call(replica: Replica, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${replica.origin}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }), ...headers },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, headers: res.headers, json: await res.json() as any };
}

async function ledgerRows(schema: string): Promise<number> {
  const client = await schemaClient(schema);
  try {
    return Number((await client.query('SELECT COUNT(*) AS n FROM usage_ledger')).rows[0].n);
  } finally {
    await client.end();
  }
}

async function waitForResponse(replica: Replica, key: string, id: string): Promise<any> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const got = await call(replica, key, 'GET', `/v1/responses/${id}`);
    if (got.json.status !== 'queued' && got.json.status !== 'in_progress') return got.json;
    if (Date.now() > deadline) throw new Error(`response ${id} is still ${got.json.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The database URL whose connections use `schema` (what an operator's URL would carry). */
function urlWithSchema(schema: string): string {
  const url = new URL(POSTGRES_URL!);
  url.searchParams.set('options', `-c search_path=${schema}`);
  return url.toString();
}

const client = (replica: Replica, key: string) => new OpenAI({ baseURL: `${replica.origin}/v1`, apiKey: key, maxRetries: 0 });
const SHORT = { model: 'tiny', input: 'Hello', max_output_tokens: 4, temperature: 0 };

(SKIP ? describe.skip : describe)(`the service on PostgreSQL${SKIP ? ` [skipped: ${SKIP}]` : ''}`, () => {
  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-pg-service-'));
    modelDir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
  });
  afterEach(async () => {
    for (const r of opened.splice(0)) await r.service.close();
    for (const s of schemas.splice(0)) await dropSchema(s);
  });
  afterAll(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('serves responses, files, batches and background responses, and keeps the usage ledger, in PostgreSQL', async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const key = a.service.firstKey!.key;

    const created = await call(a, key, 'POST', '/v1/responses', SHORT);
    expect(created.status).toBe(200);
    expect(['completed', 'incomplete']).toContain(created.json.status);
    const got = await call(a, key, 'GET', `/v1/responses/${created.json.id}`);
    expect(got.status).toBe(200);
    expect(got.json).toMatchObject({ id: created.json.id, status: created.json.status, output: created.json.output });

    const openai = client(a, key);
    const file = await openai.files.create({ file: await toFile(Buffer.from('{"hello": "postgres"}\n'), 'x.jsonl'), purpose: 'user_data' as never });
    expect(await (await openai.files.content(file.id)).text()).toBe('{"hello": "postgres"}\n');
    // Its metadata is a row of the PostgreSQL store, not of a SQLite file.
    const rows = await schemaClient(schema);
    try {
      expect((await rows.query('SELECT id FROM files WHERE id = $1', [file.id])).rows).toHaveLength(1);
    } finally {
      await rows.end();
    }
    expect(readdirSync(a.dataDir)).not.toContain('sluice.db');

    const batch = await createBatch(openai, [chatLine('one', 'Hi'), chatLine('two', 'Ho')], 'asap');
    const done = await waitForBatch(openai, batch.id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: 2, completed: 2, failed: 0 });
    expect((await readResults(openai, done.output_file_id)).map((l) => l.custom_id).sort()).toEqual(['one', 'two']);

    const background = await call(a, key, 'POST', '/v1/responses', { ...SHORT, background: true });
    expect(background.status).toBe(200);
    expect(['completed', 'incomplete']).toContain((await waitForResponse(a, key, background.json.id)).status);

    // One row per finished request: the foreground response, the background one, two batch lines.
    expect(await ledgerRows(schema)).toBe(4);
  });

  it('refuses an upload filename holding a NUL with 400 (PostgreSQL text cannot hold it), storing nothing', async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const key = a.service.firstKey!.key;
    const res = await uploadWithRawFilename(`${a.origin}/v1/files`, key, 'bad\u0000name.jsonl', '{"a":1}\n');
    expect(res.status).toBe(400);
    expect(Object.keys(res.body)).toEqual(['error']);
    expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param: 'file', code: 'invalid_request' });
    const rows = await schemaClient(schema);
    try {
      expect((await rows.query('SELECT id FROM files')).rows).toHaveLength(0);
    } finally {
      await rows.end();
    }
    const ok = await uploadWithRawFilename(`${a.origin}/v1/files`, key, 'good name.jsonl', '{"a":1}\n');
    expect(ok.status).toBe(200);
  });

  it('two replicas on one database and one files directory answer for each other', async () => {
    const schema = newSchema();
    const filesDir = join(root, `shared-files-${schema}`);
    const a = await startReplica(schema, { filesDir });
    // The per-deployment secrets, identical on every replica (README): copied from the first one.
    const dataDirB = mkdtempSync(join(root, 'data-'));
    for (const name of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(a.dataDir, name), join(dataDirB, name));
    const b = await startReplica(schema, { filesDir, dataDir: dataDirB });
    expect(b.service.firstKey).toBeUndefined();
    const key = a.service.firstKey!.key;

    // A response created on one replica is retrieved on the other.
    const created = await call(a, key, 'POST', '/v1/responses', SHORT);
    expect(created.status).toBe(200);
    const onB = await call(b, key, 'GET', `/v1/responses/${created.json.id}`);
    expect(onB.status).toBe(200);
    expect(onB.json).toMatchObject({ id: created.json.id, status: created.json.status, output: created.json.output });

    // A file uploaded on one is read on the other (its bytes in the shared directory), and back.
    const bytes = Buffer.from(Array.from({ length: 2000 }, (_, i) => `line ${i}`).join('\n'));
    const file = await client(a, key).files.create({ file: await toFile(bytes, 'shared.txt'), purpose: 'user_data' as never });
    expect(Buffer.from(await (await client(b, key).files.content(file.id)).arrayBuffer())).toEqual(bytes);
    expect(readdirSync(filesDir)).toContain(file.id);
    const fromB = await client(b, key).files.create({ file: await toFile(Buffer.from('from b'), 'b.txt'), purpose: 'user_data' as never });
    expect(await (await client(a, key).files.content(fromB.id)).text()).toBe('from b');

    // The same idempotency key sent to both replicas gives one message, generated once.
    const message = { model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'Say something' }], temperature: 1 };
    const before = await ledgerRows(schema);
    const first = await call(a, key, 'POST', '/v1/messages', message, { 'idempotency-key': 'same-on-both' });
    const second = await call(b, key, 'POST', '/v1/messages', message, { 'idempotency-key': 'same-on-both' });
    expect(first.status).toBe(200);
    expect(second.status).toBe(200);
    expect(second.json).toEqual(first.json);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    // Sent to both at once: whichever begins first generates; the other replays it or is told it runs (409).
    const together = await Promise.all([a, b].map((r) => call(r, key, 'POST', '/v1/messages', message, { 'idempotency-key': 'at-once' })));
    expect(together.every((r) => r.status === 200 || r.status === 409)).toBe(true);
    const ids = new Set(together.filter((r) => r.status === 200).map((r) => r.json.id));
    expect(ids.size).toBe(1);
    expect(await ledgerRows(schema)).toBe(before + 2);
  });

  it('sluice keys and sluice usage work on the database with --database-url', async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const url = urlWithSchema(schema);
    const made = await execFileP(process.execPath, [CLI, 'keys', 'create', '--org', 'acme', '--json', '--database-url', url]);
    const { key } = JSON.parse(made.stdout) as { key: string };
    const res = await call(a, key, 'POST', '/v1/responses', SHORT);
    expect(res.status).toBe(200);
    const listed = JSON.parse((await execFileP(process.execPath, [CLI, 'keys', 'list', '--json', '--database-url', url])).stdout) as { organization: string }[];
    expect(listed.map((k) => k.organization).sort()).toEqual(['acme', 'default']);
    const usage = JSON.parse((await execFileP(process.execPath, [CLI, 'usage', '--org', 'acme', '--json', '--database-url', url])).stdout);
    expect(usage.total.requests).toBe(1);
  });

  it('sluice serve --database-url --files-dir serves from the database, and its log never shows the password', async () => {
    const schema = newSchema();
    // A schema named in the URL must exist (sluice makes its tables, not the schema the URL names).
    const admin = await schemaClient('public');
    try {
      await admin.query(`CREATE SCHEMA ${schema}`);
    } finally {
      await admin.end();
    }
    const url = urlWithSchema(schema);
    const password = decodeURIComponent(new URL(url).password);
    const filesDir = join(root, `cli-files-${schema}`);
    const dataDir = mkdtempSync(join(root, 'data-'));
    const child = spawn(process.execPath, [CLI, 'serve', '--model', modelDir, '--port', '0', '--data-dir', dataDir,
      '--database-url', url, '--files-dir', filesDir, '--backend', 'cpu', '--threads', '1', '--kv-cache-bytes', String(32 << 20)],
    { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d) => { stdout += d; });
    const exited = new Promise<number | null>((done) => child.on('exit', (code) => done(code)));
    try {
      const origin = await new Promise<string>((done, fail) => {
        child.stderr!.on('data', (d) => {
          stderr += d;
          const m = /serving tiny on (http:\/\/[^/\s]+)\/v1/.exec(stderr);
          if (m) done(m[1]!);
        });
        exited.then((code) => fail(new Error(`serve exited with ${code}: ${stderr}`)));
      });
      await new Promise((r) => setTimeout(r, 100)); // the key banner on stdout
      const key = /(sk-sluice-\S+)/.exec(stdout)![1]!;
      const replica = { origin } as Replica;
      const file = await client(replica, key).files.create({ file: await toFile(Buffer.from('via the CLI'), 'c.txt'), purpose: 'user_data' as never });
      expect(readdirSync(filesDir)).toContain(file.id);
      expect((await call(replica, key, 'POST', '/v1/responses', SHORT)).status).toBe(200);
      expect(await ledgerRows(schema)).toBe(1);
      expect(readdirSync(dataDir)).not.toContain('sluice.db');
      expect(stderr).toContain(`store in PostgreSQL ${new URL(url).protocol}//${new URL(url).username}:***@`);
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
    // (The CI role's password is also its user and database name: look for it where a password goes.)
    if (password) expect(stderr + stdout).not.toContain(`:${password}@`);
  });

  it('refuses other URLs and an unreachable database clearly, never showing the password', async () => {
    const dataDir = mkdtempSync(join(root, 'data-'));
    const failed = await execFileP(process.execPath, [CLI, 'keys', 'list', '--database-url', 'mysql://u:hunter22@h/db', '--data-dir', dataDir])
      .then(() => undefined, (err: { code: number; stderr: string }) => err);
    expect(failed?.code).toBe(1);
    expect(failed?.stderr).toMatch(/--database-url must be a postgres:\/\/ or postgresql:\/\/ URL/);
    expect(failed?.stderr).not.toContain('hunter22');

    const unreachable = openService({
      catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] },
      dataDir, databaseUrl: 'postgresql://sluice:hunter22@127.0.0.1:1/sluice', onProgress: () => {},
    });
    const err = await unreachable.then(() => undefined, (e: Error) => e);
    expect(err?.message).toMatch(/^cannot open the PostgreSQL database postgresql:\/\/sluice:\*\*\*@127\.0\.0\.1:1\/sluice: .*ECONNREFUSED/);
    expect(err?.message).not.toContain('hunter22');
    // The data directory was let go: a service can start on it now.
    await startReplica(newSchema(), { dataDir });
  });

  it('a shared files directory sweeps only stale temp files at open, never an upload in progress', async () => {
    const dir = join(root, 'sweep');
    await FileStorage.open(root, { filesDir: dir });
    writeFileSync(join(dir, '.upload-live'), 'x');
    writeFileSync(join(dir, '.upload-dead'), 'x');
    const old = new Date(Date.now() - 25 * 3600_000);
    utimesSync(join(dir, '.upload-dead'), old, old);
    await FileStorage.open(root, { filesDir: dir });
    expect(readdirSync(dir).sort()).toEqual(['.upload-live']);
  });
});

describe('database URLs', () => {
  it('accepts postgres:// and postgresql:// only, and never repeats a refused URL', () => {
    expect(checkDatabaseUrl('postgres://u:p@h/db')).toBe('postgres://u:p@h/db');
    expect(checkDatabaseUrl('postgresql://u@/db?host=/var/run/postgresql')).toBe('postgresql://u@/db?host=/var/run/postgresql');
    for (const bad of ['mysql://u:hunter22@h/db', 'hunter22', 'http://u:hunter22@h/', '']) {
      expect(() => checkDatabaseUrl(bad)).toThrow(/must be a postgres:\/\/ or postgresql:\/\/ URL/);
      expect(() => checkDatabaseUrl(bad)).not.toThrow(/hunter22/);
    }
  });

  it('redacts the password wherever it is', () => {
    expect(redactDatabaseUrl('postgres://u:hunter22@h:5432/db')).toBe('postgres://u:***@h:5432/db');
    expect(redactDatabaseUrl('postgres://u@h/db?password=hunter22&sslmode=require')).toBe('postgres://u@h/db?password=***&sslmode=require');
    // Not a WHATWG URL (a password and a socket instead of a host): cut out of the text.
    expect(redactDatabaseUrl('postgres://u:hunter22@/db?host=/run/pg')).toBe('postgres://u:***@/db?host=/run/pg');
    expect(scrubPassword('login with hunter22 failed', 'postgres://u:hunter22@h/db')).toBe('login with *** failed');
    expect(scrubPassword('p@ss failed', 'postgres://u:p%40ss@h/db')).toBe('*** failed');
  });
});
