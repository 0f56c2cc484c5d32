// Every 4xx and 5xx the server can produce is the error envelope {error: {message, type, param,
// code}} (Anthropic's on the Messages routes, test/api/anthropic-surface.test.ts), including the replies fastify and Node write before any route runs: malformed HTTP,
// oversized headers, bad or over-long URLs, a missing Host, an unsupported Expect, JSON with
// prototype keys or absurd nesting, and requests that arrive while the server shuts down.
// Requests go over raw sockets, so that nothing is normalised on the way.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { httpRequest, rawExchange, type RawReply } from '../helpers/raw-http.js';

let server: TestServer;
beforeAll(async () => { server = await startTestServer(); });
afterAll(async () => { await server?.close(); });

function expectEnvelope(reply: RawReply, status: number, code: string | null, param: string | null = null): Record<string, unknown> {
  expect(reply.status, reply.text.slice(0, 300)).toBe(status);
  expect(reply.headers['content-type']).toMatch(/^application\/json/);
  const body = JSON.parse(reply.body) as { error: Record<string, unknown> };
  expect(Object.keys(body)).toEqual(['error']);
  expect(body.error).toMatchObject({ type: expect.any(String), message: expect.any(String), param, code });
  return body.error;
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
    // Written with escapes, it is the same key (here on /v1/messages, in Anthropic's envelope).
    const escaped = await rawExchange(server.origin, json('/v1/messages', '{"\\u005f_proto__": {}, "model": "tiny"}'));
    expect(escaped.status).toBe(400);
    expect(JSON.parse(escaped.body)).toMatchObject({
      type: 'error', error: { type: 'invalid_request_error', code: 'forbidden_json_key', param: '__proto__' },
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
