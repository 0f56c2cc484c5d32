// GET /v1/models resolved per organization, bearer-key authentication, the error envelope for
// transport-level failures, health/readiness and the OpenAPI document. Black-box over HTTP.
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { revokeApiKey } from '../../src/store/api-keys.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { testCatalog } from '../helpers/api-catalog.js';

let server: TestServer;
let acmeKey: string;

beforeAll(async () => {
  server = await startTestServer({ catalog: testCatalog });
  acmeKey = await server.keyFor('acme');
});
afterAll(async () => { await server?.close(); });

// The spec's required fields of a Model object; restricted and long_context_pricing come only where they apply,
// and no other field is present.
const MODEL_FIELDS = ['id', 'object', 'name', 'context_length', 'supports_chat', 'supports_image_input', 'supports_tools', 'pricing'];
const PRICE_FIELDS = ['cached_input_per_1m_tokens', 'input_per_1m_tokens', 'output_per_1m_tokens', 'tier'];
const LONG_CONTEXT_FIELDS = ['above_input_tokens', 'effective_from', 'input_multiplier', 'output_multiplier'];

function get(path: string, headers: Record<string, string> = {}) {
  return fetch(`${server.origin}${path}`, { headers });
}

/** The spec's Error object exactly: nothing beside `error` at the top, its four fields inside. */
function expectEnvelope(body: unknown, type: string): void {
  expect(Object.keys(body as object)).toEqual(['error']);
  const error = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(error).toMatchObject({ type });
  expect(typeof error['message']).toBe('string');
  expect(error['param'] === null || typeof error['param'] === 'string').toBe(true);
  expect(error['code'] === null || ['string', 'number'].includes(typeof error['code'])).toBe(true);
}

/** Every field of a model object is the spec's, nested price objects included. */
function expectSpecModel(m: Record<string, unknown>): void {
  const optional = ['restricted', 'long_context_pricing'].filter((k) => k in m);
  expect(Object.keys(m).sort(), String(m['id'])).toEqual([...MODEL_FIELDS, ...optional].sort());
  expect(m['object']).toBe('model');
  if ('restricted' in m) expect(m['restricted']).toBe(true);
  for (const p of m['pricing'] as Array<Record<string, unknown>>) expect(Object.keys(p).sort()).toEqual(PRICE_FIELDS);
  if (m['long_context_pricing'] !== undefined) expect(Object.keys(m['long_context_pricing'] as object).sort()).toEqual(LONG_CONTEXT_FIELDS);
}

describe('GET /v1/models', () => {
  it('lists exactly the spec fields, resolved for the default organization', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key });
    const page = await client.models.list();
    const models = page.data as unknown as Array<Record<string, unknown>>;
    expect(models.map((m) => m.id)).toEqual(['tiny', 'tiny-asap', 'tiny-flex', 'tiny-base']);
    const tiny = models[0]!;
    expect(Object.keys(tiny).sort()).toEqual([...MODEL_FIELDS, 'long_context_pricing'].sort());
    expect(tiny).toEqual({
      id: 'tiny', object: 'model', name: 'Tiny demo', context_length: 2048,
      supports_chat: true, supports_image_input: false, supports_tools: false,
      pricing: [
        { tier: 'asap', input_per_1m_tokens: 0.4, cached_input_per_1m_tokens: 0.1, output_per_1m_tokens: 1.2 },
        { tier: 'standard', input_per_1m_tokens: 0.2, cached_input_per_1m_tokens: 0.05, output_per_1m_tokens: 0.6 },
      ],
      long_context_pricing: { above_input_tokens: 1000, input_multiplier: 2, output_multiplier: 1.5, effective_from: '2026-09-01' },
    });
    // No rate published: pricing is [] and long_context_pricing is absent; the catalog lowers context_length.
    const base = models[3]!;
    expect(Object.keys(base).sort()).toEqual([...MODEL_FIELDS].sort());
    expect(base).toMatchObject({ id: 'tiny-base', name: 'tiny-base', pricing: [], context_length: 64, supports_chat: false });
    for (const m of models) expect(m).not.toHaveProperty('restricted');
    for (const m of models) expectSpecModel(m);
  });

  it('answers the same spec list, field for field, to every client whatever its headers', async () => {
    const bearer = { authorization: `Bearer ${acmeKey}` };
    const plain = await (await get('/v1/models', bearer)).json() as { data: Array<Record<string, unknown>> };
    const variants: Array<[string, Record<string, string>, string]> = [
      ['anthropic-version (Anthropic\'s clients)', { 'x-api-key': acmeKey, 'anthropic-version': '2023-06-01' }, ''],
      ['anthropic-version and a beta header', { ...bearer, 'anthropic-version': '2023-06-01', 'anthropic-beta': 'x' }, ''],
      ['OpenAI-style headers', { ...bearer, 'openai-organization': 'org-x', 'openai-beta': 'assistants=v2' }, ''],
      ['Anthropic paging parameters', { ...bearer, 'anthropic-version': '2023-06-01' }, '?limit=1&after_id=tiny'],
    ];
    expect(plain.data.map((m) => m.id)).toContain('tiny-restricted');
    for (const m of plain.data) expectSpecModel(m);
    for (const [what, headers, query] of variants) {
      const res = await get(`/v1/models${query}`, headers);
      expect(res.status, what).toBe(200);
      expect(await res.json(), what).toEqual(plain);
      for (const m of plain.data) {
        const one = await get(`/v1/models/${String(m['id'])}`, headers);
        expect(one.status, what).toBe(200);
        expect(await one.json(), what).toEqual(m);
      }
    }
  });

  it('describes the model object in the OpenAPI document with the spec\'s fields only', async () => {
    const doc = await (await get('/v1/openapi.json')).json() as { paths: Record<string, any> };
    const list = doc.paths['/models']!['get'].responses['200'].content['application/json'].schema;
    const model = list.properties.data.items;
    expect(Object.keys(model.properties).sort()).toEqual([...MODEL_FIELDS, 'restricted', 'long_context_pricing'].sort());
    expect([...model.required].sort()).toEqual([...MODEL_FIELDS].sort());
    expect(model.additionalProperties).toBe(false);
    // No Anthropic-shaped alternative is documented either.
    expect(JSON.stringify(doc.paths['/models'])).not.toMatch(/display_name|anthropic-version|after_id/);
  });

  it('shows restricted models only to granted organizations, with restricted: true and negotiated rates', async () => {
    const res = await get('/v1/models', { authorization: `Bearer ${acmeKey}` });
    expect(res.status).toBe(200);
    const body = await res.json() as { object: string; data: Array<Record<string, unknown>> };
    expect(Object.keys(body).sort()).toEqual(['data', 'object']);
    expect(body.data.map((m) => m.id)).toEqual(['tiny', 'tiny-asap', 'tiny-flex', 'tiny-restricted', 'tiny-base']);
    const restricted = body.data.find((m) => m.id === 'tiny-restricted')!;
    expect(restricted['restricted']).toBe(true);
    expect(Object.keys(restricted).sort()).toEqual([...MODEL_FIELDS, 'restricted'].sort());
    // acme's negotiated standard rate replaces the published one; asap stays published.
    expect(body.data[0]!['pricing']).toEqual([
      { tier: 'asap', input_per_1m_tokens: 0.4, cached_input_per_1m_tokens: 0.1, output_per_1m_tokens: 1.2 },
      { tier: 'standard', input_per_1m_tokens: 0.15, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 0.5 },
    ]);
  });
});

describe('GET /v1/models/{model}', () => {
  it('returns one model as the list shows it, and 404 for unknown or hidden ones', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key });
    const list = (await client.models.list()).data;
    expect(await client.models.retrieve('tiny-asap')).toEqual(list.find((m) => m.id === 'tiny-asap'));
    for (const id of ['nope', 'tiny-restricted']) {
      const res = await get(`/v1/models/${id}`, { authorization: `Bearer ${server.key}` });
      expect(res.status).toBe(404);
      expect((await res.json() as { error: { code: string } }).error.code).toBe('model_not_found');
    }
    const granted = await get('/v1/models/tiny-restricted', { authorization: `Bearer ${acmeKey}` });
    expect(await granted.json()).toMatchObject({ id: 'tiny-restricted', restricted: true });
  });
});

describe('authentication', () => {
  it.each([
    ['no header', {}, 'missing_api_key'],
    ['not Bearer', { authorization: 'Basic abc' }, 'invalid_api_key'],
    ['empty Bearer', { authorization: 'Bearer ' }, 'invalid_api_key'],
    ['unknown key', { authorization: 'Bearer sk-sluice-not-a-real-key' }, 'invalid_api_key'],
  ])('%s -> 401 in the envelope', async (_name, headers, code) => {
    for (const path of ['/v1/models', '/v1/responses/resp_x', '/v1/files']) {
      const res = await get(path, headers as Record<string, string>);
      expect(res.status).toBe(401);
      const body = await res.json();
      expectEnvelope(body, 'authentication_error');
      expect((body as { error: { code: string } }).error.code).toBe(code);
    }
    // The three generation surfaces alike, Messages included (with or without anthropic-version).
    for (const [path, extra] of [
      ['/v1/responses', {}], ['/v1/chat/completions', {}], ['/v1/messages', {}], ['/v1/messages', { 'anthropic-version': '2023-06-01' }],
    ] as const) {
      const res = await fetch(`${server.origin}${path}`, {
        method: 'POST', headers: { ...(headers as Record<string, string>), ...extra, 'content-type': 'application/json' }, body: '{}',
      });
      expect(res.status, path).toBe(401);
      const body = await res.json();
      expectEnvelope(body, 'authentication_error');
      expect((body as { error: { code: string } }).error.code, path).toBe(code);
    }
  });

  it('accepts x-api-key (how Anthropic clients send the key) and refuses a key once revoked', async () => {
    const key = await server.keyFor('temp-org');
    expect((await get('/v1/models', { 'x-api-key': key })).status).toBe(200);
    expect((await get('/v1/models', { authorization: `Bearer ${key}` })).status).toBe(200);
    expect(await revokeApiKey(server.service.store, key)).toBe(true);
    const res = await get('/v1/models', { authorization: `Bearer ${key}` });
    expect(res.status).toBe(401);
    expectEnvelope(await res.json(), 'authentication_error');
  });

  it('stores only a hash of each key', async () => {
    const key = await server.keyFor('hash-org');
    const keys = await server.service.store.listApiKeys();
    const serialized = JSON.stringify(keys);
    expect(serialized).not.toContain(key);
    expect(keys.find((k) => k.orgName === 'hash-org')!.prefix.length).toBeLessThan(key.length / 2);
  });
});

describe('transport errors use the envelope', () => {
  const auth = () => ({ authorization: `Bearer ${server.key}` });

  it('malformed JSON -> 400 invalid_json', async () => {
    const res = await fetch(`${server.baseUrl}/responses`, {
      method: 'POST', headers: { ...auth(), 'content-type': 'application/json' }, body: '{"model": ',
    });
    expect(res.status).toBe(400);
    const body = await res.json();
    expectEnvelope(body, 'invalid_request_error');
    expect((body as { error: { code: string } }).error.code).toBe('invalid_json');
  });

  it('a wrong content type -> 415', async () => {
    const res = await fetch(`${server.baseUrl}/responses`, {
      method: 'POST', headers: { ...auth(), 'content-type': 'text/plain' }, body: 'hello',
    });
    expect(res.status).toBe(415);
    expectEnvelope(await res.json(), 'invalid_request_error');
  });

  it('an oversized body -> 413', async () => {
    const big = JSON.stringify({ model: 'tiny', input: 'x'.repeat(33 * 1024 * 1024) });
    const res = await fetch(`${server.baseUrl}/responses`, {
      method: 'POST', headers: { ...auth(), 'content-type': 'application/json' }, body: big,
    });
    expect(res.status).toBe(413);
    expectEnvelope(await res.json(), 'request_too_large');
  });

  it('an internal failure -> 500 without internals', async () => {
    const store = server.service.store;
    const original = store.getResponse.bind(store);
    store.getResponse = async () => { throw new Error('SQLITE_CORRUPT at /secret/path/sluice.db'); };
    try {
      const res = await get('/v1/responses/resp_x', auth());
      expect(res.status).toBe(500);
      const body = await res.json() as { error: { message: string } };
      expectEnvelope(body, 'server_error');
      expect(JSON.stringify(body)).not.toMatch(/secret|SQLITE/);
    } finally {
      store.getResponse = original;
    }
  });

  it('unknown routes -> 404, inside and outside /v1', async () => {
    for (const path of ['/v1/nothing-here', '/nothing-here']) {
      const res = await get(path, auth());
      expect(res.status).toBe(404);
      expectEnvelope(await res.json(), 'invalid_request_error');
    }
  });
});

describe('health, readiness and the OpenAPI document', () => {
  it('answers /health and /ready without a key, naming no model', async () => {
    expect(await (await get('/health')).json()).toEqual({ status: 'ok' });
    const ready = await get('/ready');
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready' });
  });

  it('serves an OpenAPI document generated from the route schemas', async () => {
    const res = await get('/v1/openapi.json');
    expect(res.status).toBe(200);
    const doc = await res.json() as {
      openapi: string; info: { version: string }; servers: Array<{ url: string }>; paths: Record<string, Record<string, unknown>>;
    };
    expect(doc.openapi).toMatch(/^3\./);
    expect(doc.info.version).toBe('2026-08-14');
    // Paths are relative to the server URL, which carries the /v1 prefix the plugin is mounted under.
    expect(doc.servers).toEqual([{ url: '/v1' }]);
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/models', '/responses', '/responses/{response_id}']));
    expect(Object.keys(doc.paths)).not.toContain('/openapi.json');
    const post = doc.paths['/responses']!['post'] as { requestBody: { content: Record<string, { schema: { required: string[] } }> } };
    expect(post.requestBody.content['application/json']!.schema.required).toEqual(['model', 'input']);
  });
});
