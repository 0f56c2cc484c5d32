// Input shapes are bounded before any work is done for them: request metadata (OpenAI's limits on
// every surface and on batches), JSON schemas in requests (depth and size; a 400 before the model
// runs, nothing billed), nesting depth in batch lines (an error line), and requests per batch
// file (refused at upload).

import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow, createBatch, readResults, uploadLines, waitForBatch, type RequestLine } from '../helpers/batches.js';

let server: TestServer;
let client: OpenAI;
beforeAll(async () => {
  server = await startTestServer();
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
});
afterAll(async () => { if (server) await closeNow(server); });

/** Posts a body (text is sent as it is: JSON.stringify cannot write what a client may send). */
async function post(path: string, body: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

const manyKeys = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v']));
const longKey = { ['k'.repeat(65)]: 'v' };
const longValue = { note: 'v'.repeat(513) };
const atLimits = { ...Object.fromEntries(Array.from({ length: 15 }, (_, i) => [`${'k'.repeat(60)}${i}`, 'v'.repeat(512)])), completion_window: 'asap' };

describe('request metadata', () => {
  const surfaces: Array<[string, (metadata: Record<string, string>) => unknown]> = [
    ['/responses', (metadata) => ({ model: 'tiny', input: 'hi', max_output_tokens: 1, metadata })],
    ['/chat/completions', (metadata) => ({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, metadata })],
    ['/messages', (metadata) => ({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, metadata: { user_id: 'u-1', ...metadata } })],
  ];

  it.each(surfaces)('POST %s: at most 16 keys, keys up to 64 and values up to 512 characters', async (path, body) => {
    for (const [metadata, param, says] of [
      [manyKeys, 'metadata', 'more than 16'],
      [longKey, 'metadata', 'more than 64 characters'],
      [longValue, 'metadata.note', 'more than 512 characters'],
    ] as const) {
      const res = await post(path, body(metadata));
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param });
      expect(res.body.error.message).toContain(says);
    }
    // user_id counts among the keys of Messages metadata; at the limits everything passes.
    const ok = await post(path, body(path === '/messages' ? Object.fromEntries(Object.entries(atLimits).slice(1)) : atLimits));
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
  });

  it('POST /batches: the same limits', async () => {
    const input_file_id = await uploadLines(client, [{ custom_id: 'a', method: 'POST', url: '/v1/responses', body: { model: 'tiny', input: 'hi' } }]);
    for (const [metadata, param] of [[manyKeys, 'metadata'], [longKey, 'metadata'], [longValue, 'metadata.note']] as const) {
      const res = await post('/batches', { input_file_id, endpoint: '/v1/responses', completion_window: '24h', metadata });
      expect(res.status).toBe(400);
      expect(res.body.error.param).toBe(param);
    }
  });
});

/** A JSON schema nested `levels` objects deep: {type: object, properties: {a: {...}}}. */
function nestedSchema(levels: number): Record<string, unknown> {
  let schema: Record<string, unknown> = { type: 'string' };
  for (let i = 0; i < levels; i++) schema = { type: 'object', properties: { a: schema } };
  return schema;
}

/** The same as JSON text, for depths JSON.stringify cannot write. */
function nestedSchemaText(levels: number): string {
  return `${'{"type": "object", "properties": {"a": '.repeat(levels)}{"type": "string"}${'}}'.repeat(levels)}`;
}

describe('JSON schemas in requests', () => {
  const responses = (schema: unknown) => ({
    model: 'tiny', input: 'hi', max_output_tokens: 2, text: { format: { type: 'json_schema', name: 'out', schema } },
  });
  const chat = (schema: unknown) => ({
    model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2,
    response_format: { type: 'json_schema', json_schema: { name: 'out', schema } },
  });
  const cases: Array<[string, string, (schema: unknown) => unknown, string]> = [
    ['/responses', 'text.format.schema', responses, 'resp_'],
    ['/chat/completions', 'response_format.json_schema.schema', chat, 'chatcmpl'],
  ];

  it.each(cases)('POST %s: a schema nested 10,000 deep is a 400 before the model runs, and nothing is billed', async (path, param, body) => {
    const before = (await server.service.store.listUsage({})).length;
    const deep = await post(path, JSON.stringify(body('SCHEMA')).replace('"SCHEMA"', nestedSchemaText(10_000)));
    expect(deep.status).toBe(400);
    expect(deep.body.error).toMatchObject({ code: 'json_too_deep' });
    // Within the body's 64 levels but past the schema's 32: refused by the schema's own bound.
    const nested = await post(path, body(nestedSchema(20)));
    expect(nested.status).toBe(400);
    expect(nested.body.error).toMatchObject({ param, message: expect.stringContaining('at most 32 levels') });
    const big = await post(path, body({ type: 'object', description: 'd'.repeat(100_001) }));
    expect(big.status).toBe(400);
    expect(big.body.error).toMatchObject({ param, message: expect.stringContaining('100000 characters') });
    expect((await server.service.store.listUsage({})).length).toBe(before);
    // A reasonable schema still runs (and is billed).
    const ok = await post(path, body(nestedSchema(5)));
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect((await server.service.store.listUsage({})).length).toBe(before + 1);
  });
});

describe('batch files', () => {
  const line = (id: string, body: Record<string, unknown>): RequestLine => ({ custom_id: id, method: 'POST', url: '/v1/responses', body });

  it('turns a line nested past 64 levels, or with a prototype key, into a 400 error line', async () => {
    const deep = { model: 'tiny', input: 'hi', max_output_tokens: 1, text: { format: { type: 'json_schema', name: 'o', schema: nestedSchema(40) } } };
    const proto = JSON.parse('{"model": "tiny", "input": "hi", "max_output_tokens": 1, "metadata": {"__proto__": {"a": "b"}}}') as Record<string, unknown>;
    const created = await createBatch(client, [
      line('deep', deep), line('proto', proto), line('fine', { model: 'tiny', input: 'hi', max_output_tokens: 1 }),
    ], '24h', '/v1/responses');
    const done = await waitForBatch(client, created.id);
    expect(done.request_counts).toMatchObject({ total: 3, completed: 1, failed: 2 });
    const errors = Object.fromEntries((await readResults(client, done.error_file_id)).map((l) => [l.custom_id, l]));
    expect(errors['deep']!.response?.status_code).toBe(400);
    expect(errors['deep']!.error?.code).toBe('json_too_deep');
    expect(errors['proto']!.response?.status_code).toBe(400);
    expect(errors['proto']!.error?.code).toBe('forbidden_json_key');
  });

  it('refuses a file of more than 50,000 requests at upload, naming the limit', async () => {
    const text = Array.from({ length: 50_001 }, (_, i) => JSON.stringify(line(`r${i}`, { model: 'tiny', input: 'hi' }))).join('\n');
    const res = await client.files.create({ file: await toFile(Buffer.from(text), 'many.jsonl'), purpose: 'batch' }).catch((e: unknown) => e);
    expect(res).toBeInstanceOf(OpenAI.BadRequestError);
    const error = (res as InstanceType<typeof OpenAI.BadRequestError>).error as { code: string; message: string; param: string };
    expect(error).toMatchObject({ code: 'invalid_batch_file', param: 'file' });
    expect(error.message).toContain('line 50001');
    expect(error.message).toContain('50000 requests');
  });
});
