// Background responses across replicas sharing one PostgreSQL database (leases, store/leases.ts),
// through the real services and their HTTP API, with short leases (1 s): a response whose replica
// dies (its store closed under it, or the process killed with SIGKILL) is finished by another
// replica exactly once (one ledger row, one webhook delivery); a cancel sent to one replica of a
// response running on another ends it cancelled at once, and the replica running it stops without
// writing anything (no ledger row); a webhook delivery left pending by a dead replica is sent by another without
// any wake-up of its own. Each test has a schema of its own, dropped after it. Skipped, with the
// reason in its name, without SLUICE_TEST_POSTGRES_URL (test/helpers/stores.ts). The SIGKILL test
// runs the built CLI (npm run build:ts).

import { execFile, spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { openService, type Service } from '../../src/service.js';
import { leaseConfig } from '../../src/store/leases.js';
import { PostgresStore } from '../../src/store/postgres-store.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient } from '../helpers/stores.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

const CLI = resolve(dirname(fileURLToPath(import.meta.url)), '../../dist/src/cli.js');
const SKIP = POSTGRES_URL ? undefined : 'SLUICE_TEST_POSTGRES_URL is not set (postgres://user:password@host/database)';
const LEASE_MS = 1_000;

interface Replica {
  service: Service;
  origin: string;
  dataDir: string;
}

let root: string;
let modelDir: string;
let receiver: WebhookReceiver;
const opened: Replica[] = [];
const schemas: string[] = [];

/** A replica on `schema`; `like` gives it the per-deployment secrets of another (README). */
async function startReplica(schema: string, like?: Replica): Promise<Replica> {
  const dataDir = mkdtempSync(join(root, 'data-'));
  if (like) for (const name of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(like.dataDir, name), join(dataDir, name));
  const service = await openService({
    catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] },
    dataDir,
    databaseUrl: POSTGRES_URL!,
    databaseSchema: schema,
    lease: leaseConfig(LEASE_MS),
    webhooks: { allowPrivateAddresses: true, baseDelayMs: 100, pollIntervalMs: 200 },
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

async function call(origin: string, key: string, method: string, path: string, body?: unknown) {
  const res = await fetch(`${origin}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, json: await res.json() as any };
}

async function waitUntil<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await probe();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error(`still waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function waitForEnd(origin: string, key: string, id: string): Promise<any> {
  return waitUntil(`response ${id} to end`, async () => {
    const got = await call(origin, key, 'GET', `/v1/responses/${id}`);
    return got.json.status === 'in_progress' ? undefined : got.json;
  });
}

/** Rows of `table` about one object, read behind the stores' backs. */
async function countRows(schema: string, table: 'usage_ledger' | 'webhook_deliveries' | 'background_jobs', id: string): Promise<number> {
  const column = { usage_ledger: 'request_id', webhook_deliveries: 'object_id', background_jobs: 'response_id' }[table];
  const client = await schemaClient(schema);
  try {
    return Number((await client.query(`SELECT COUNT(*) AS n FROM ${table} WHERE ${column} = $1`, [id])).rows[0].n);
  } finally {
    await client.end();
  }
}

const engineIdle = (r: Replica) => {
  const stats = r.service.registry.models[0]!.engine.schedulerStats();
  return stats.numRunning + stats.numWaiting === 0;
};

const story = (maxOutputTokens: number, hook: string) => ({
  model: 'tiny', input: 'Tell me a very long story', max_output_tokens: maxOutputTokens, temperature: 0, background: true,
  metadata: { completion_webhook: hook },
});

(SKIP ? describe.skip : describe)(`background responses across replicas${SKIP ? ` [skipped: ${SKIP}]` : ''}`, () => {
  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-bg-replicas-'));
    modelDir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
    receiver = await startWebhookReceiver();
  });
  afterEach(async () => {
    for (const r of opened.splice(0)) await r.service.close();
    for (const s of schemas.splice(0)) await dropSchema(s);
  });
  afterAll(async () => {
    await receiver?.close();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a response whose replica stops talking to the database is finished by another, once', async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const b = await startReplica(schema, a);
    const key = a.service.firstKey!.key;
    const hook = receiver.hook();
    const created = await call(a.origin, key, 'POST', '/v1/responses', story(300, hook.url));
    expect(created.json.status).toBe('in_progress');
    const id = created.json.id as string;
    // A "dies": its store is closed under it, so it can neither renew its lease nor store an end.
    await a.service.store.close();

    const ended = await waitForEnd(b.origin, key, id);
    expect(['completed', 'incomplete']).toContain(ended.status);
    expect(ended.usage.output_tokens).toBeGreaterThan(0);
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.body).toMatchObject({ id, status: ended.status });
    expect(await countRows(schema, 'usage_ledger', id)).toBe(1);
    expect(await countRows(schema, 'webhook_deliveries', id)).toBe(1);
    expect(await countRows(schema, 'background_jobs', id)).toBe(0);
    // A stops its own run once its lease has run out without a renewal.
    await waitUntil('A to stop its run', async () => (engineIdle(a) ? true : undefined), 30_000);
  });

  it('a cancel sent to one replica ends a response running on another, which stops without writing', async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const b = await startReplica(schema, a);
    const key = a.service.firstKey!.key;
    const hook = receiver.hook();
    const created = await call(a.origin, key, 'POST', '/v1/responses', story(1500, hook.url));
    const id = created.json.id as string;
    await waitUntil('A to run it', async () => (engineIdle(a) ? undefined : true));

    const cancelled = await call(b.origin, key, 'POST', `/v1/responses/${id}/cancel`);
    expect(cancelled.status).toBe(200);
    expect(cancelled.json).toMatchObject({ id, status: 'cancelled' });
    expect((await call(b.origin, key, 'POST', `/v1/responses/${id}/cancel`)).json.status).toBe('cancelled');

    // A learns at its next renewal that the job is gone and stops the run, storing nothing.
    await waitUntil('A to stop its run', async () => (engineIdle(a) ? true : undefined), 30_000);
    expect((await call(a.origin, key, 'GET', `/v1/responses/${id}`)).json.status).toBe('cancelled');
    expect(await countRows(schema, 'usage_ledger', id)).toBe(0);
    expect(await countRows(schema, 'background_jobs', id)).toBe(0);
    // A cancelled response sends no callback (events.ts): neither replica stored one.
    expect(await countRows(schema, 'webhook_deliveries', id)).toBe(0);

    // Other replicas' answers stay the route's: unknown is 404, ended otherwise is 409.
    expect((await call(b.origin, key, 'POST', '/v1/responses/resp_nope/cancel')).status).toBe(404);
    const short = await call(a.origin, key, 'POST', '/v1/responses', story(2, hook.url));
    await waitForEnd(b.origin, key, short.json.id);
    const late = await call(b.origin, key, 'POST', `/v1/responses/${short.json.id}/cancel`);
    expect(late.status).toBe(409);
    expect(late.json.error.code).toBe('response_not_cancellable');
  });

  it('a webhook delivery left pending by a dead replica is sent by another without a wake-up', async () => {
    const schema = newSchema();
    const b = await startReplica(schema);
    const org = (await b.service.store.getOrganizationByName('default'))!.id;
    const hook = receiver.hook();
    // Stored by a replica that died before sending it (no process wakes for it).
    const other = await PostgresStore.open(POSTGRES_URL!, { schema });
    try {
      await other.insertWebhookDelivery({
        id: 'whd_orphan', orgId: org, objectId: 'resp_orphan', url: hook.url, host: new URL(hook.url).host, token: null,
        body: '{"id":"resp_orphan","status":"completed"}', state: 'pending', attempts: 0, nextAttemptAtMs: Date.now(),
        lastError: null, createdAt: Math.floor(Date.now() / 1000),
      });
    } finally {
      await other.close();
    }
    const [got] = await hook.waitForCalls(1);
    expect(got!.body).toEqual({ id: 'resp_orphan', status: 'completed' });
  });

  it('a response of a `sluice serve --lease-seconds 1` killed with SIGKILL is finished by another replica, once', async () => {
    const schema = newSchema();
    const b = await startReplica(schema);
    const key = b.service.firstKey!.key;
    const url = new URL(POSTGRES_URL!);
    url.searchParams.set('options', `-c search_path=${schema}`);
    const dataDir = mkdtempSync(join(root, 'data-'));
    for (const name of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(b.dataDir, name), join(dataDir, name));
    const child = spawn(process.execPath, [CLI, 'serve', '--model', modelDir, '--port', '0', '--data-dir', dataDir,
      '--database-url', url.toString(), '--lease-seconds', '1', '--allow-private-webhooks',
      '--backend', 'cpu', '--threads', '1', '--kv-cache-bytes', String(32 << 20)], { stdio: ['ignore', 'ignore', 'pipe'] });
    const exited = new Promise<NodeJS.Signals | null>((done) => child.on('exit', (_code, signal) => done(signal)));
    try {
      const origin = await new Promise<string>((done, fail) => {
        let stderr = '';
        child.stderr!.on('data', (d) => {
          stderr += d;
          const m = /serving tiny on (http:\/\/[^/\s]+)\/v1/.exec(stderr);
          if (m) done(m[1]!);
        });
        exited.then((signal) => fail(new Error(`serve exited (${signal}): ${stderr}`)));
      });
      const hook = receiver.hook();
      const created = await call(origin, key, 'POST', '/v1/responses', story(300, hook.url));
      expect(created.json.status).toBe('in_progress');
      const id = created.json.id as string;
      child.kill('SIGKILL');
      expect(await exited).toBe('SIGKILL');

      const ended = await waitForEnd(b.origin, key, id);
      expect(['completed', 'incomplete']).toContain(ended.status);
      const [callback] = await hook.waitForCalls(1);
      expect(callback!.body).toMatchObject({ id, status: ended.status });
      expect(await countRows(schema, 'usage_ledger', id)).toBe(1);
      expect(await countRows(schema, 'webhook_deliveries', id)).toBe(1);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    }
  });
});

describe('sluice serve --lease-seconds', () => {
  it('takes an integer number of seconds in [1, 600], and says so otherwise', async () => {
    const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-lease-flag-'));
    try {
      for (const bad of ['0', '601', '1.5']) {
        const failed = await promisify(execFile)(process.execPath, [CLI, 'serve', '--lease-seconds', bad, '--data-dir', dataDir])
          .then(() => undefined, (err: { code: number; stderr: string }) => err);
        expect(failed?.code).toBe(1);
        expect(failed?.stderr).toContain(`--lease-seconds must be an integer in [1, 600], got "${bad}"`);
      }
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
