// createSluice: the API mounted in a host's own fastify app with the documented few lines. The
// helper must do what openService does around the plugin: release the idempotency keys the last
// process left pending, start the batch runner, and on the host app's close stop the API's work
// before the engines and the store go, then release the data directory.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { createSluice, SqliteStore, type Catalog, type Sluice } from '../../src/index.js';
import { chatLine, createBatch, waitForBatch } from '../helpers/batches.js';
import { HELD } from '../helpers/stores.js';

type Body = Record<string, any>;

let root: string;
let catalog: Catalog;
const engineDefaults = { backend: 'cpu' as const, kvCacheBytes: 64 << 20, threads: 1 };

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-embed-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 3 });
  catalog = { models: [{ id: 'tiny', checkpoint: join(root, 'tiny') }] };
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A host app with a route of its own and the API under /llm/v1, listening on a free port. */
async function startHost(dataDir: string): Promise<{ app: FastifyInstance; sluice: Sluice; baseUrl: string }> {
  const sluice = await createSluice({ catalog, dataDir, engineDefaults, onProgress: () => {} });
  const app = Fastify();
  app.get('/hello', async () => ({ host: true }));
  await app.register(sluice.plugin, { prefix: '/llm/v1' });
  const origin = await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, sluice, baseUrl: `${origin}/llm/v1` };
}

async function call(baseUrl: string, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${baseUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }), ...headers },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() as Body };
}

describe('createSluice', () => {
  it('mounts the API beside the host\'s routes, releases pending idempotency keys and runs batches', async () => {
    const dataDir = join(root, 'data-a');
    // A Messages request the last process was running when it stopped: its key is still pending.
    const before = new SqliteStore(join(dataDir, 'sluice.db'));
    const org = (await before.ensureOrganization('default')).id;
    expect(await before.beginIdempotency(org, 'messages', 'cut-off', 'hash-of-another-body', Date.now(), HELD)).toEqual({ state: 'new' });
    await before.close();

    const { app, sluice, baseUrl } = await startHost(dataDir);
    try {
      expect(sluice.firstKey?.key).toMatch(/^sk-/);
      const key = sluice.firstKey!.key;
      expect((await app.inject({ method: 'GET', url: '/hello' })).json()).toEqual({ host: true });
      const models = await call(baseUrl, key, 'GET', '/models');
      expect(models.status).toBe(200);
      expect(models.body['data'].map((m: Body) => m['id'])).toEqual(['tiny']);
      expect((await call(baseUrl, 'sk-wrong', 'GET', '/models')).status).toBe(401);

      // Released at open: without that, the key would be in use (409) or bound to another body (422).
      const message = await call(baseUrl, key, 'POST', '/messages', { model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] },
        { 'idempotency-key': 'cut-off' });
      expect(message.status).toBe(200);
      expect(message.body['type']).toBe('message');

      // The batch runner was started when the host app became ready.
      const client = new OpenAI({ baseURL: baseUrl, apiKey: key });
      const batch = await createBatch(client, [chatLine('a', 'Hi'), chatLine('b', 'Ho')]);
      const done = await waitForBatch(client, batch.id);
      expect(done.status).toBe('completed');
      expect(done.request_counts).toMatchObject({ total: 2, completed: 2, failed: 0 });
    } finally {
      await app.close();
    }
  });

  it('closes with the host app: background work is left to resume, the data directory is released', async () => {
    const dataDir = join(root, 'data-b');
    const first = await startHost(dataDir);
    const key = first.sluice.firstKey!.key;
    const created = await call(first.baseUrl, key, 'POST', '/responses',
      { model: 'tiny', input: 'Tell me a very long story', max_output_tokens: 1500, temperature: 0, background: true });
    expect(created.body['status']).toBe('in_progress');
    await new Promise((r) => setTimeout(r, 100));
    await first.app.close();
    // The API stopped the job before the engine went, so it was not failed: it is still in_progress.
    const store = new SqliteStore(join(dataDir, 'sluice.db'));
    const org = (await store.getOrganizationByName('default'))!.id;
    expect((await store.getResponse(org, created.body['id']))!.status).toBe('in_progress');
    await store.close();

    // A second open of the directory fails while one is open, so this one proves close released it.
    const second = await startHost(dataDir);
    try {
      expect(second.sluice.firstKey).toBeUndefined();
      const deadline = Date.now() + 60_000;
      let body: Body;
      do {
        body = (await call(second.baseUrl, key, 'GET', `/responses/${created.body['id']}`)).body;
        if (body['status'] !== 'in_progress') break;
        await new Promise((r) => setTimeout(r, 50));
      } while (Date.now() < deadline);
      expect(['completed', 'incomplete']).toContain(body['status']);
      await expect(second.sluice.plugin(Fastify(), {})).rejects.toThrow(/registered once/);
    } finally {
      await second.app.close();
      await second.sluice.close(); // already closed with the app: a second call does nothing
    }
  });

  it('refuses a data directory another instance holds', async () => {
    const dataDir = join(root, 'data-c');
    const held = await createSluice({ catalog, dataDir, engineDefaults, onProgress: () => {} });
    try {
      await expect(createSluice({ catalog, dataDir, engineDefaults, onProgress: () => {} })).rejects.toMatchObject({ code: 'data_dir_locked' });
    } finally {
      await held.close();
    }
  });
});
