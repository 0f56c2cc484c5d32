// The API mounted as a plugin inside someone else's fastify app: it works under any prefix and
// leaves the host app's own routes, parsers and error handling alone.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Fastify from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { assembleRuntime, createApiKey, ModelRegistry, SqliteStore, sluiceApi } from '../../src/index.js';

let root: string;
let registry: ModelRegistry;
let store: SqliteStore;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-mount-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 3 });
  registry = await ModelRegistry.load({ models: [{ id: 'tiny', checkpoint: join(root, 'tiny') }] },
    { engineDefaults: { backend: 'cpu', kvCacheBytes: 16 << 20 } });
  store = new SqliteStore(join(root, 'data', 'sluice.db'));
});
afterAll(async () => {
  await registry?.dispose();
  await store?.close();
  rmSync(root, { recursive: true, force: true });
});

describe('sluiceApi mounted in a host app', () => {
  it('serves under the host\'s prefix without touching the host\'s routes', async () => {
    const app = Fastify();
    app.post('/echo', async (request) => ({ got: request.body }));
    app.setErrorHandler((_err, _request, reply) => reply.code(418).send('host handler'));
    const runtime = assembleRuntime({ store, registry, dataDir: join(root, 'data') });
    await app.register(sluiceApi, { prefix: '/llm/v1', runtime });
    app.addHook('onReady', async () => runtime.start());
    app.addHook('onClose', async () => runtime.close());
    const { key } = await createApiKey(store, 'host-org');
    const auth = { authorization: `Bearer ${key}` };

    const models = await app.inject({ method: 'GET', url: '/llm/v1/models', headers: auth });
    expect(models.statusCode).toBe(200);
    expect(models.json().data.map((m: { id: string }) => m.id)).toEqual(['tiny']);

    const created = await app.inject({ method: 'POST', url: '/llm/v1/responses', headers: auth, payload: { model: 'tiny', input: 'Hi', max_output_tokens: 2 } });
    expect(created.statusCode).toBe(200);
    expect(created.json().object).toBe('response');

    // The plugin's error envelope stays inside its prefix; the host keeps its text/plain parser and handler.
    const bad = await app.inject({ method: 'POST', url: '/llm/v1/responses', headers: auth, payload: { model: 'tiny' } });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.param).toBe('input');
    const echo = await app.inject({ method: 'POST', url: '/echo', headers: { 'content-type': 'text/plain' }, payload: 'plain' });
    expect(echo.json()).toEqual({ got: 'plain' });
    const unauth = await app.inject({ method: 'GET', url: '/llm/v1/models' });
    expect(unauth.statusCode).toBe(401);
    await app.close();
  });
});
