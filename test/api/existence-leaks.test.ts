// Nothing tells a caller that a model it may not use exists: routes without a key name no models,
// and a restricted model the organization was not granted is answered exactly like an unknown one
// (404 model_not_found, the same message but for the id) on every surface and in batch lines.

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { testCatalog } from '../helpers/api-catalog.js';
import { closeNow, createBatch, readResults, waitForBatch, type RequestLine } from '../helpers/batches.js';

let server: TestServer;
beforeAll(async () => { server = await startTestServer({ catalog: testCatalog }); });
afterAll(async () => { if (server) await closeNow(server); });

const RESTRICTED = 'tiny-restricted';
const UNKNOWN = 'tiny-nonexistent';

async function post(path: string, body: unknown): Promise<{ status: number; text: string }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

describe('routes without a key', () => {
  it('name no model', async () => {
    const ready = await fetch(`${server.origin}/ready`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready' });
    for (const path of ['/health', '/ready', '/v1/openapi.json', '/nothing-here']) {
      const text = await (await fetch(`${server.origin}${path}`)).text();
      expect(text, path).not.toContain('tiny');
    }
  });
});

describe('a restricted model without the grant', () => {
  const surfaces: Array<[string, (model: string) => unknown]> = [
    ['/responses', (model) => ({ model, input: 'hi', max_output_tokens: 1 })],
    ['/chat/completions', (model) => ({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 })],
    ['/messages', (model) => ({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 })],
  ];

  it.each(surfaces)('POST %s answers exactly as for an unknown model', async (path, body) => {
    const restricted = await post(path, body(RESTRICTED));
    const unknown = await post(path, body(UNKNOWN));
    expect(restricted.status).toBe(404);
    expect(unknown.status).toBe(404);
    expect(JSON.parse(restricted.text).error).toMatchObject({ type: 'not_found_error', code: 'model_not_found', param: 'model' });
    expect(restricted.text.replaceAll(RESTRICTED, 'ID')).toBe(unknown.text.replaceAll(UNKNOWN, 'ID'));
  });

  it('GET /v1/models/{id} answers exactly as for an unknown model', async () => {
    const get = async (id: string) => {
      const res = await fetch(`${server.baseUrl}/models/${id}`, { headers: { authorization: `Bearer ${server.key}` } });
      return { status: res.status, text: await res.text() };
    };
    const restricted = await get(RESTRICTED);
    const unknown = await get(UNKNOWN);
    expect(restricted.status).toBe(404);
    expect(restricted.text.replaceAll(RESTRICTED, 'ID')).toBe(unknown.text.replaceAll(UNKNOWN, 'ID'));
  });

  it('fails a batch line exactly as an unknown model does', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const line = (id: string, model: string): RequestLine => ({
      custom_id: id, method: 'POST', url: '/v1/responses', body: { model, input: 'hi', max_output_tokens: 1 },
    });
    const created = await createBatch(client, [line('restricted', RESTRICTED), line('unknown', UNKNOWN)], '24h', '/v1/responses');
    const done = await waitForBatch(client, created.id);
    expect(done.request_counts).toMatchObject({ total: 2, failed: 2 });
    const errors = await readResults(client, done.error_file_id);
    const byId = Object.fromEntries(errors.map((l) => [l.custom_id, l]));
    const shape = (l: (typeof errors)[number], model: string) => ({
      status: l.response?.status_code, body: JSON.stringify(l.response?.body).replaceAll(model, 'ID'), error: JSON.stringify(l.error).replaceAll(model, 'ID'),
    });
    expect(byId['restricted']!.response?.status_code).toBe(404);
    expect(byId['restricted']!.error?.code).toBe('model_not_found');
    expect(shape(byId['restricted']!, RESTRICTED)).toEqual(shape(byId['unknown']!, UNKNOWN));
  });
});
