// Every 4xx and 5xx the server can produce is the error envelope {error: {message, type, param,
// code}} and nothing else at the top level, on every surface (Messages included, where the inner
// type is Anthropic's name for the status), including the replies fastify and Node write before any route runs: malformed HTTP,
// oversized headers, bad or over-long URLs, a missing Host, an unsupported Expect, JSON with
// prototype keys or absurd nesting, and requests that arrive while the server shuts down.
// Requests go over raw sockets, so that nothing is normalised on the way.

import { afterEach, afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { anthropicErrorType } from '../../src/surfaces/messages/envelope.js';
import { SluiceError } from '../../src/errors.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { httpRequest, rawExchange, type RawReply } from '../helpers/raw-http.js';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({
    // "thrifty" may spend one token a minute: its second generation is a 429.
    catalog: (dir) => ({ models: [{ id: 'tiny', checkpoint: dir }], limits: { organizations: { thrifty: { tokens_per_minute: 1 } } } }),
  });
});
afterAll(async () => { await server?.close(); });
afterEach(() => { vi.restoreAllMocks(); });

/**
 * The spec's Error object exactly: `error` and no other top-level key; inside, message and type
 * (strings), param (string or null) and code (string, integer or null), plus only the extras listed.
 */
function expectSpecEnvelope(body: unknown, extras: readonly string[] = []): Record<string, unknown> {
  expect(Object.keys(body as object)).toEqual(['error']);
  const error = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(error).sort()).toEqual(['code', 'message', 'param', 'type', ...extras].sort());
  expect(typeof error['message']).toBe('string');
  expect(typeof error['type']).toBe('string');
  expect(error['param'] === null || typeof error['param'] === 'string').toBe(true);
  expect(error['code'] === null || typeof error['code'] === 'string' || Number.isInteger(error['code'])).toBe(true);
  return error;
}

function expectEnvelope(reply: RawReply, status: number, code: string | null, param: string | null = null): Record<string, unknown> {
  expect(reply.status, reply.text.slice(0, 300)).toBe(status);
  expect(reply.headers['content-type']).toMatch(/^application\/json/);
  const error = expectSpecEnvelope(JSON.parse(reply.body));
  expect(error).toMatchObject({ param, code });
  return error;
}

const json = (path: string, body: string, extra: Record<string, string> = {}) => httpRequest('POST', path, {
  Host: 'sluice.test', Authorization: `Bearer ${server.key}`, 'Content-Type': 'application/json',
  'Content-Length': Buffer.byteLength(body), Connection: 'close', ...extra,
}, body);

describe('replies written before routing', () => {
  const rows: Array<[string, () => string, number, string]> = [
    ['a path parameter of 8,000 characters (fastify FST_ERR_MAX_PARAM_LENGTH)',
      () => httpRequest('GET', `/v1/responses/${'a'.repeat(8000)}`, { Host: 'x', Authorization: `Bearer ${server.key}`, Connection: 'close' }), 414, 'uri_too_long'],
    ['the same without a key', () => httpRequest('GET', `/v1/files/${'a'.repeat(8000)}`, { Host: 'x', Connection: 'close' }), 414, 'uri_too_long'],
    ['a malformed %-escape (FST_ERR_BAD_URL)', () => httpRequest('GET', '/v1/%zz', { Host: 'x', Connection: 'close' }), 400, 'invalid_url'],
    ['a request line that is not HTTP', () => 'GARBAGE\r\n\r\n', 400, 'malformed_request'],
    ['an unknown method token', () => httpRequest('FOO', '/v1/models', { Host: 'x' }), 400, 'malformed_request'],
    ['an HTTP version that does not exist', () => 'GET /health HTTP/7.3\r\nHost: x\r\n\r\n', 400, 'malformed_request'],
    ['headers over 16 KiB', () => httpRequest('GET', '/health', { Host: 'x', 'X-Big': 'a'.repeat(20_000) }), 431, 'headers_too_large'],
    ['Content-Length with Transfer-Encoding', () => 'POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', 400, 'malformed_request'],
    ['a Content-Length that is not a number', () => 'POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n', 400, 'malformed_request'],
    ['a malformed chunk size', () => 'POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n', 400, 'malformed_request'],
    ['a Transfer-Encoding other than chunked', () => 'POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}', 400, 'malformed_request'],
    ['a declared body over the 32 MiB limit', () => httpRequest('POST', '/v1/responses', {
      Host: 'x', Authorization: `Bearer ${server.key}`, 'Content-Type': 'application/json', 'Content-Length': 40_000_000,
    }), 413, 'request_too_large'],
    ['HTTP/1.1 without Host', () => 'GET /health HTTP/1.1\r\nConnection: close\r\n\r\n', 400, 'missing_host_header'],
    // Found by the malformed-input fuzz: the multipart parser threw a plain Error (a 500).
    ['multipart/form-data without a boundary', () => httpRequest('POST', '/v1/files', {
      Host: 'x', Authorization: `Bearer ${server.key}`, 'Content-Type': 'multipart/form-data', 'Content-Length': 2, Connection: 'close',
    }, '--'), 400, 'invalid_multipart'],
    ['an Expect other than 100-continue', () => httpRequest('POST', '/v1/responses', { Host: 'x', Expect: 'teapot', 'Content-Length': 2, Connection: 'close' }, '{}'), 417, 'expectation_failed'],
  ];

  it.each(rows)('%s -> %i', async (_name, request, status, code) => {
    const reply = await rawExchange(server.origin, request());
    const error = expectEnvelope(reply, status, code);
    // Nothing echoes the oversized input back.
    expect(reply.body.length).toBeLessThan(1000);
    expect(String(error['message'])).not.toContain('aaaaaaaaaa');
  });

  it('still answers on the server after the battery', async () => {
    const reply = await rawExchange(server.origin, httpRequest('GET', '/health', { Host: 'x', Connection: 'close' }));
    expect(reply.status).toBe(200);
  });
});

describe('JSON bodies', () => {
  it('refuses a __proto__ key with a 400 naming it, not as "not valid JSON"', async () => {
    const reply = await rawExchange(server.origin, json('/v1/responses', '{"__proto__": {"x": 1}, "model": "tiny", "input": "hi"}'));
    const error = expectEnvelope(reply, 400, 'forbidden_json_key', '__proto__');
    expect(error['message']).toContain('"__proto__"');
    expect(error['message']).not.toContain('not valid JSON');
  });

  it('refuses constructor.prototype, and finds a forbidden key deep in the body', async () => {
    const ctor = await rawExchange(server.origin, json('/v1/chat/completions', '{"constructor": {"prototype": {"x": 1}}, "model": "tiny", "messages": []}'));
    expect(expectEnvelope(ctor, 400, 'forbidden_json_key', 'constructor.prototype')['message']).toContain('"constructor"');
    const deep = await rawExchange(server.origin,
      json('/v1/responses', '{"model": "tiny", "input": [{"role": "user", "content": "hi", "__proto__": {"admin": true}}]}'));
    expectEnvelope(deep, 400, 'forbidden_json_key', 'input[0].__proto__');
    // Written with escapes, it is the same key (here on /v1/messages: the same envelope).
    const escaped = await rawExchange(server.origin, json('/v1/messages', '{"\\u005f_proto__": {}, "model": "tiny"}'));
    expect(escaped.status).toBe(400);
    expect(JSON.parse(escaped.body)).toEqual({
      error: { type: 'invalid_request_error', message: expect.any(String), code: 'forbidden_json_key', param: '__proto__' },
    });
  });

  it('refuses nesting past 64 levels before parsing, also outside /v1', async () => {
    const deep = `{"model": "tiny", "input": "hi", "x": ${'['.repeat(100)}${']'.repeat(100)}}`;
    expect(expectEnvelope(await rawExchange(server.origin, json('/v1/responses', deep)), 400, 'json_too_deep')['message']).toContain('64');
    // Brackets inside strings are text, not nesting.
    const inString = `{"model": "nope", "input": "${'['.repeat(100)}\\"${'{'.repeat(100)}"}`;
    expectEnvelope(await rawExchange(server.origin, json('/v1/responses', inString)), 404, 'model_not_found', 'model');
    expectEnvelope(await rawExchange(server.origin, json('/nothing-here', '['.repeat(100_000))), 400, 'json_too_deep');
  });

  it('keeps malformed JSON and a mismatched Content-Type in the envelope', async () => {
    expectEnvelope(await rawExchange(server.origin, json('/v1/responses', '{"model": ')), 400, 'invalid_json');
    expectEnvelope(await rawExchange(server.origin, json('/nothing-here', '{')), 400, 'invalid_json');
    expectEnvelope(await rawExchange(server.origin, json('/v1/responses', '{}', { 'Content-Type': 'text/plain' })), 415, 'unsupported_media_type');
  });
});

describe('routes and methods', () => {
  it('answers unknown paths and methods with the envelope, with and without a key', async () => {
    const auth = { Host: 'x', Authorization: `Bearer ${server.key}`, Connection: 'close' };
    expectEnvelope(await rawExchange(server.origin, httpRequest('DELETE', '/v1/models', auth)), 404, 'unknown_route');
    expectEnvelope(await rawExchange(server.origin, httpRequest('PROPFIND', '/v1/models', auth)), 404, 'unknown_route');
    expectEnvelope(await rawExchange(server.origin, httpRequest('OPTIONS', '*', { Host: 'x', Connection: 'close' })), 404, 'unknown_route');
    expectEnvelope(await rawExchange(server.origin, httpRequest('PUT', '/health', { Host: 'x', Connection: 'close' })), 404, 'unknown_route');
    expectEnvelope(await rawExchange(server.origin, httpRequest('GET', '/v1/models', { Host: 'x', Connection: 'close' })), 401, 'missing_api_key');
  });
});

describe('the three generation surfaces', () => {
  // One valid body per surface; each row breaks one thing about the request.
  const surfaces = {
    responses: { path: '/v1/responses', body: { model: 'tiny', input: 'Hi', max_output_tokens: 2 } },
    'chat completions': { path: '/v1/chat/completions', body: { model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 2 } },
    messages: { path: '/v1/messages', body: { model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] } },
  } as const;
  type Surface = keyof typeof surfaces;
  const names = Object.keys(surfaces) as Surface[];

  interface Row {
    what: string;
    /** The request: method, extra/overriding headers (null removes one), raw body. */
    make: (s: Surface) => { method?: string; headers?: Record<string, string | number | null>; body?: string };
    status: number;
    /** undefined: not checked. */
    code?: string | null;
    /** The inner type on Responses and Chat Completions; Messages has Anthropic's name for the status. */
    type: string;
  }
  const valid = (s: Surface) => JSON.stringify(surfaces[s].body);
  const rows: Row[] = [
    { what: 'no key', make: () => ({ headers: { Authorization: null } }), status: 401, code: 'missing_api_key', type: 'authentication_error' },
    { what: 'an unknown key', make: () => ({ headers: { Authorization: 'Bearer sk-sluice-nope' } }), status: 401, code: 'invalid_api_key', type: 'authentication_error' },
    { what: 'malformed JSON', make: () => ({ body: '{"model": ' }), status: 400, code: 'invalid_json', type: 'invalid_request_error' },
    { what: 'an empty JSON body', make: () => ({ body: '' }), status: 400, code: 'invalid_request', type: 'invalid_request_error' },
    { what: 'JSON nested too deep', make: () => ({ body: `${'['.repeat(100)}${']'.repeat(100)}` }), status: 400, code: 'json_too_deep', type: 'invalid_request_error' },
    { what: 'a prototype key', make: (s) => ({ body: `{"__proto__": {}, ${valid(s).slice(1)}` }), status: 400, code: 'forbidden_json_key', type: 'invalid_request_error' },
    { what: 'a JSON array', make: () => ({ body: '[]' }), status: 400, code: 'invalid_request', type: 'invalid_request_error' },
    { what: 'a text/plain body', make: (s) => ({ headers: { 'Content-Type': 'text/plain' }, body: valid(s) }), status: 415, code: 'unsupported_media_type', type: 'invalid_request_error' },
    { what: 'a body without Content-Type', make: (s) => ({ headers: { 'Content-Type': null }, body: valid(s) }), status: 415, code: 'unsupported_media_type', type: 'invalid_request_error' },
    { what: 'a declared body over 32 MiB', make: () => ({ headers: { 'Content-Length': 40_000_000 }, body: '' }), status: 413, code: 'request_too_large', type: 'request_too_large' },
    { what: 'a field out of range', make: (s) => ({ body: JSON.stringify({ ...surfaces[s].body, temperature: 7 }) }), status: 400, code: 'invalid_request', type: 'invalid_request_error' },
    // (Its code differs between surfaces; the envelope does not.)
    { what: 'stream=true', make: (s) => ({ body: JSON.stringify({ ...surfaces[s].body, stream: true }) }), status: 400, type: 'invalid_request_error' },
    { what: 'an unknown model', make: (s) => ({ body: JSON.stringify({ ...surfaces[s].body, model: 'nope' }) }), status: 404, code: 'model_not_found', type: 'not_found_error' },
    { what: 'an unknown method', make: () => ({ method: 'PUT' }), status: 404, code: 'unknown_route', type: 'invalid_request_error' },
    { what: 'a path below it', make: () => ({ method: 'GET' }), status: 404, code: 'unknown_route', type: 'invalid_request_error' },
  ];

  async function send(s: Surface, row: Row): Promise<RawReply> {
    const req = row.make(s);
    const body = req.body ?? valid(s);
    const headers: Record<string, string | number | null> = {
      Host: 'sluice.test', Authorization: `Bearer ${server.key}`, 'Content-Type': 'application/json',
      'Content-Length': Buffer.byteLength(body), Connection: 'close', ...req.headers,
    };
    const path = row.what === 'a path below it' ? `${surfaces[s].path}/nothing/at/all` : surfaces[s].path;
    const present = Object.fromEntries(Object.entries(headers).filter(([, v]) => v !== null)) as Record<string, string | number>;
    return rawExchange(server.origin, httpRequest(req.method ?? 'POST', path, present, body));
  }

  const table = rows.flatMap((row) => names.map((s) => [s, row.what, row] as const));
  it.each(table)('%s: %s', async (s, _what, row) => {
    const reply = await send(s, row);
    expect(reply.status, reply.text.slice(0, 300)).toBe(row.status);
    expect(reply.headers['content-type']).toMatch(/^application\/json/);
    const error = expectSpecEnvelope(JSON.parse(reply.body));
    if (row.code !== undefined) expect(error['code']).toBe(row.code);
    expect(error['type']).toBe(s === 'messages' ? anthropicErrorType(row.status) : row.type);
    expect(String(error['message']).length).toBeGreaterThan(0);
  });

  const engine = () => server.service.registry.models[0]!.engine;
  const post = (s: Surface, key = server.key) => rawExchange(server.origin, httpRequest('POST', surfaces[s].path, {
    Host: 'x', Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(valid(s)), Connection: 'close',
  }, valid(s)));

  it.each(names)('%s: a rate-limited organization gets a 429 with retry_after as the one extra', async (s) => {
    const thrifty = await server.keyFor('thrifty');
    // The minute's one token goes to the first generation of whichever surface runs first.
    let reply = await post(s, thrifty);
    for (let i = 0; i < 3 && reply.status === 200; i++) reply = await post(s, thrifty);
    expect(reply.status, reply.text.slice(0, 300)).toBe(429);
    const error = expectSpecEnvelope(JSON.parse(reply.body), ['retry_after']);
    expect(error).toMatchObject({ type: 'rate_limit_error', code: 'rate_limit_exceeded' });
    expect(Number.isInteger(error['retry_after'])).toBe(true);
    expect(reply.headers['retry-after']).toBe(String(error['retry_after']));
  });

  it.each(names)('%s: an engine shutting down is a 503, and an internal failure a 500 that hides it, both in the envelope', async (s) => {
    vi.spyOn(engine(), 'generate').mockRejectedValueOnce(new SluiceError('engine_disposed', 'disposed at /secret/path'));
    const unavailable = await post(s);
    expect(unavailable.status, unavailable.text.slice(0, 300)).toBe(503);
    const e503 = expectSpecEnvelope(JSON.parse(unavailable.body));
    expect(e503).toMatchObject({ type: s === 'messages' ? 'overloaded_error' : 'server_error', code: 'engine_disposed' });
    expect(unavailable.body).not.toContain('secret');

    vi.spyOn(engine(), 'generate').mockRejectedValueOnce(new Error('SQLITE_CORRUPT at /secret/path'));
    const broken = await post(s);
    expect(broken.status, broken.text.slice(0, 300)).toBe(500);
    const e500 = expectSpecEnvelope(JSON.parse(broken.body));
    expect(e500).toMatchObject({ type: s === 'messages' ? 'api_error' : 'server_error', code: 'internal_error' });
    expect(broken.body).not.toMatch(/secret|SQLITE/);
  });
});

describe('shutting down', () => {
  it('answers a request that arrives while the server closes with a 503 envelope', async () => {
    const other = await startTestServer();
    try {
      // Headers half sent when close begins: the connection is busy, so close waits for it.
      const reply = rawExchange(other.origin, ['GET /ready HTTP/1.1\r\n', 'Host: x\r\n\r\n'], { gapMs: 300 });
      await new Promise((r) => setTimeout(r, 100));
      const closing = other.service.app.close();
      const got = await reply;
      expectEnvelope(got, 503, 'shutting_down');
      expect(got.headers['connection']).toBe('close');
      await closing;
    } finally {
      await other.close();
    }
  });
});
