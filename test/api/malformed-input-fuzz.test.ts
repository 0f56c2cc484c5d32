// A seeded fuzz of every route the app registers (its route table, read from the router): a few
// hundred requests with malformed bodies, content types, keys, headers, paths, query strings and
// methods, over raw sockets so that nothing is normalised on the way. Every answer outside 2xx
// must be the spec's Error object exactly ({error: {message, type, param, code}} and no other
// top-level field) in JSON, and none may be a 5xx.
//
// SLUICE_FUZZ_SEED picks another seed; SLUICE_FUZZ_CASES another count. A failure lists the seed
// and each failing case whole, so it can be replayed.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeNow } from '../helpers/batches.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { testCatalog } from '../helpers/api-catalog.js';
import { rawExchange } from '../helpers/raw-http.js';
import { mulberry32 } from '../../bench/sharegpt-workload.js';
import { registeredRoutes, type RegisteredRoute } from '../helpers/route-table.js';

const SEED = Number(process.env['SLUICE_FUZZ_SEED'] ?? 2026_08_14);
const CASES = Number(process.env['SLUICE_FUZZ_CASES'] ?? 400);


let server: TestServer;
let routes: RegisteredRoute[];
/** Ids that exist, so that some requests get past "not found" to the checks behind it. */
const real = { responseId: '', fileId: '', adminKey: '', acmeKey: '' };

beforeAll(async () => {
  server = await startTestServer({ catalog: testCatalog });
  routes = registeredRoutes(server.service.app);
  real.acmeKey = await server.keyFor('acme');
  const created = await fetch(`${server.baseUrl}/responses`, {
    method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', input: 'Hi', max_output_tokens: 2 }),
  });
  real.responseId = (await created.json() as { id: string }).id;
  const form = new FormData();
  form.append('purpose', 'batch');
  form.append('file', new Blob([`${JSON.stringify({ custom_id: 'a', method: 'POST', url: '/v1/responses', body: { model: 'tiny', input: 'Hi', max_output_tokens: 2 } })}\n`]), 'in.jsonl');
  const uploaded = await fetch(`${server.baseUrl}/files`, { method: 'POST', headers: { authorization: `Bearer ${server.key}` }, body: form });
  real.fileId = (await uploaded.json() as { id: string }).id;
  expect(real.responseId).toMatch(/^resp_/);
  expect(real.fileId).not.toBe('');
});
afterAll(async () => { if (server) await closeNow(server); });

interface Case {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer;
  /** The route the case was made from. */
  route: string;
}

function makeCases(seed: number, count: number): Case[] {
  const rand = mulberry32(seed);
  const chance = (p: number) => rand() < p;
  const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;

  const junkToken = (): string => {
    const pieces = ['a', 'Z', '9', '-', '_', '.', '~', '%20', '%E2%98%83', '%00', '%2F', ':', '@', '!', '$', '(', ';', '=', ',', '%zz', '%', '..'];
    return Array.from({ length: int(1, 12) }, () => pick(pieces)).join('');
  };
  const paramValue = (name: string): string => {
    const long = 'x'.repeat(pick([129, 300, 2000]));
    switch (name) {
      case 'response_id': return pick([real.responseId, real.responseId, `resp_${'0'.repeat(32)}`, 'resp_x', junkToken(), long]);
      case 'file_id': return pick([real.fileId, real.fileId, 'file-nope', junkToken(), long]);
      case 'batch_id': return pick(['batch_nope', `batch_${'f'.repeat(32)}`, junkToken(), long]);
      case 'model': return pick(['tiny', 'tiny-restricted', 'tiny-base', 'nope', junkToken(), long]);
      default: return junkToken();
    }
  };
  const query = (): string => {
    const keys = ['limit', 'after', 'before', 'order', 'org', 'since', 'purpose', 'after_id', 'x', '%zz', ''];
    const values = ['-1', '0', '1', '10', '1000', 'abc', '1e9', '', '%zz', '2026-01-01', 'yesterday', '%E2%98%83', 'a'.repeat(300)];
    return `?${Array.from({ length: int(1, 3) }, () => `${pick(keys)}=${pick(values)}`).join('&')}`;
  };

  const randomValue = (depth = 0): unknown => {
    const leaves: unknown[] = [null, true, false, 0, -1, 1, 1.5, 2 ** 31, -(2 ** 53), 1e308, '', 'x', '\u2603\u0000', 'x'.repeat(int(1000, 5000))];
    if (depth > 2 || chance(0.5)) return pick(leaves);
    switch (int(0, 3)) {
      case 0: return Array.from({ length: int(0, 3) }, () => randomValue(depth + 1));
      case 1: return { type: pick(['text', 'input_text', 'image_url', 'input_image', 'image', 'tool_use', 'tool_result', 'function', 'json_schema', 'audio', 'bogus']), text: randomValue(depth + 1) };
      case 2: return { role: pick(['user', 'system', 'assistant', 'tool', 'developer', 'bogus']), content: randomValue(depth + 1) };
      default: return Object.fromEntries(Array.from({ length: int(0, 3) }, () => [pick(['a', 'type', 'name', 'schema', 'url']), randomValue(depth + 1)]));
    }
  };

  const validJson = (url: string): Record<string, unknown> | undefined => {
    const model = pick(['tiny', 'tiny', 'tiny-asap', 'tiny-flex', 'tiny-base', 'tiny-restricted']);
    const messages = [{ role: 'user', content: 'Hi' }];
    switch (url) {
      case '/v1/responses': return { model, input: 'Hi', max_output_tokens: 2 };
      case '/v1/chat/completions': return { model, messages, max_completion_tokens: 2 };
      case '/v1/messages': return { model, max_tokens: 2, messages };
      case '/v1/messages/count_tokens': return { model, messages };
      case '/v1/batches': return { input_file_id: real.fileId, endpoint: '/v1/responses', completion_window: pick(['standard', 'flex', '24h']) };
      case '/v1/responses/:response_id/cancel': case '/v1/batches/:batch_id/cancel': return {};
      default: return undefined;
    }
  };
  const fieldNames = ['model', 'input', 'messages', 'max_tokens', 'max_output_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'stream',
    'background', 'metadata', 'tools', 'tool_choice', 'n', 'text', 'response_format', 'reasoning', 'reasoning_effort', 'service_tier', 'include',
    'top_logprobs', 'logprobs', 'system', 'stop', 'stop_sequences', 'user', 'store', 'truncation', 'input_file_id', 'endpoint', 'completion_window',
    'thinking', 'seed', 'bogus'];

  const jsonBody = (url: string): Buffer => {
    const valid = validJson(url) ?? {};
    const text = JSON.stringify(valid);
    switch (int(0, 9)) {
      case 0: return Buffer.from(text.slice(0, int(0, Math.max(0, text.length - 1)))); // cut short
      case 1: { // one field changed or added
        const body: Record<string, unknown> = { ...valid, [pick(fieldNames)]: randomValue() };
        return Buffer.from(JSON.stringify(body));
      }
      case 2: { // one field removed
        const keys = Object.keys(valid);
        if (keys.length > 0) delete valid[pick(keys)];
        return Buffer.from(JSON.stringify(valid));
      }
      case 3: return Buffer.from(JSON.stringify(randomValue()) ?? 'undefined'); // not an object, or the wrong one
      case 4: return Buffer.from(Array.from({ length: int(0, 200) }, () => int(0, 255))); // bytes
      case 5: { const d = int(40, 120); return Buffer.from(`{"model": ${'['.repeat(d)}${']'.repeat(d)}}`); }
      case 6: return Buffer.from(`{${pick(['"__proto__": {"x": 1}', '"constructor": {"prototype": {}}', '"model": "tiny", "model": 5'])}, ${text.slice(1)}`);
      case 7: return Buffer.concat([Buffer.from('{"model": "'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('", "input": "Hi"}')]); // not UTF-8
      case 8: return Buffer.from(pick(['', ' ', 'null', '{}', '[]', '"x"', '1', 'true', '{"model":', '{]', '\u0000']));
      default: return Buffer.from(text); // valid: lets the checks behind the parser run, and some 2xx through
    }
  };
  const multipartBody = (boundary: string): Buffer => {
    const part = (name: string, value: string, filename?: string) =>
      `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ''}\r\n\r\n${value}\r\n`;
    const line = JSON.stringify({ custom_id: 'a', method: 'POST', url: '/v1/responses', body: { model: 'tiny', input: 'Hi' } });
    const garbled = () => `--${boundary}\r\n${pick(['Content-Disposition bogus', 'X-Nothing: 1', 'Content-Disposition: attachment', `X: ${'y'.repeat(20_000)}`, ''])}\r\n\r\nbatch\r\n`;
    const parts = [
      chance(0.1) ? garbled() : '',
      chance(0.8) ? part('purpose', pick(['batch', 'batch', 'nope', '', 'fine-tune'])) : '',
      chance(0.8) ? part(pick(['file', 'file', 'files', 'upload']), pick([`${line}\n`, '{not json\n', '', 'x'.repeat(3000)]), pick(['in.jsonl', 'a.txt', '', '../../etc/passwd'])) : '',
      chance(0.2) ? part('extra', 'x') : '',
    ];
    const text = `${parts.join('')}${chance(0.85) ? `--${boundary}--\r\n` : ''}`;
    return Buffer.from(chance(0.15) ? text.slice(0, int(0, text.length)) : text);
  };

  const auth = (): Record<string, string> => {
    if (chance(0.65)) return { Authorization: `Bearer ${server.key}` };
    return pick<Record<string, string>>([
      {}, { Authorization: 'Bearer sk-sluice-nope' }, { Authorization: 'Basic Zm9vOmJhcg==' }, { Authorization: 'Bearer' },
      { Authorization: `Bearer ${'k'.repeat(5000)}` }, { 'x-api-key': server.key }, { 'x-api-key': '' }, { Authorization: `Bearer ${real.acmeKey}` },
      { Authorization: `bearer ${server.key}` }, { Authorization: `Bearer ${server.key}`, 'x-api-key': 'sk-sluice-other' },
    ]);
  };
  const methods = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];
  const contentTypes = ['application/json; charset=utf-8', 'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data',
    'application/octet-stream', '', 'application/json; charset=utf-16', 'APPLICATION/JSON', '*/*', 'application/jsonx', 'application/json, text/plain'];

  const weighted = routes.flatMap((r) => (['POST', 'PUT', 'PATCH'].includes(r.method) ? [r, r, r] : [r]));
  return Array.from({ length: count }, (): Case => {
    // Routes that take a body are drawn three times as often: most of the malformed input goes there.
    const route = pick(weighted);
    const method = chance(0.75) ? route.method : pick(methods);
    let path = route.url.replace(/:([A-Za-z_]+)/g, (_m, name: string) => paramValue(name));
    if (chance(0.2)) {
      path = pick([
        `${path}/`, `${path}/extra`, path.replace('/v1/', '/v1//'), path.toUpperCase(), path.replace('/v1/', '/v2/'), path.replace(/^\/v1/, ''),
        `${path}/..`, `${path}%2F`, `${path}/${junkToken()}`,
      ]);
    }
    if (chance(0.2)) path += query();

    const headers: Record<string, string> = { Host: 'sluice.test', Connection: 'close', ...auth() };
    if (chance(0.4)) headers['anthropic-version'] = pick(['2023-06-01', '', 'nonsense']);
    if (chance(0.15)) headers[pick(['Idempotency-Key', 'alt-idempotency-key'])] = 'k'.repeat(pick([1, 10, 255, 256, 400]));
    if (chance(0.1)) headers['Accept'] = pick(['text/event-stream', 'application/xml', '*/*', '']);
    if (chance(0.1)) headers['x-request-id'] = pick(['', 'a'.repeat(500), 'a b\tc', '\u00e9']);
    if (chance(0.05)) headers['Content-Encoding'] = pick(['gzip', 'br', 'identity', 'bogus']);

    let body: Buffer = Buffer.alloc(0);
    const sendsBody = ['POST', 'PUT', 'PATCH'].includes(method) ? chance(0.9) : chance(0.15);
    if (sendsBody) {
      const isUpload = route.url === '/v1/files' && method === 'POST' && chance(0.7);
      if (isUpload) {
        const boundary = `----fuzz${int(0, 1e6)}`;
        headers['Content-Type'] = chance(0.85)
          ? pick([`multipart/form-data; boundary=${boundary}`, `multipart/form-data; boundary="${boundary}"`])
          : pick(['multipart/form-data', 'multipart/form-data; boundary=', 'multipart/mixed; boundary=x', 'application/json', 'text/plain']);
        body = multipartBody(boundary);
      } else {
        if (chance(0.7)) headers['Content-Type'] = 'application/json';
        else if (chance(0.85)) headers['Content-Type'] = pick(contentTypes);
        body = jsonBody(route.url);
      }
    }
    if (body.length > 0 || ['POST', 'PUT', 'PATCH'].includes(method)) headers['Content-Length'] = String(body.length);
    return { method, path, headers, body, route: `${route.method} ${route.url}` };
  });
}

function requestBytes(c: Case): Buffer {
  const head = [`${c.method} ${c.path} HTTP/1.1`, ...Object.entries(c.headers).map(([k, v]) => `${k}: ${v}`)].join('\r\n');
  return Buffer.concat([Buffer.from(`${head}\r\n\r\n`, 'latin1'), c.body]);
}

/** What is wrong with a reply, or undefined when it is a 2xx or exactly the spec's envelope. */
function violation(status: number, contentType: string | undefined, text: string): string | undefined {
  if (!Number.isInteger(status) || status < 100) return 'no status line';
  if (status >= 500) return `a ${status}`;
  if (status >= 200 && status < 300) return undefined;
  if (!/^application\/json/.test(contentType ?? '')) return `content-type ${contentType}`;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return 'a body that is not JSON';
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'a body that is not an object';
  const top = Object.keys(body);
  if (top.length !== 1 || top[0] !== 'error') return `top-level keys ${JSON.stringify(top)}`;
  const error = (body as { error: unknown }).error as Record<string, unknown> | null;
  if (error === null || typeof error !== 'object' || Array.isArray(error)) return 'error is not an object';
  for (const key of ['message', 'type', 'param', 'code']) if (!(key in error)) return `error.${key} missing`;
  if (typeof error['message'] !== 'string' || error['message'] === '') return 'error.message is not a non-empty string';
  if (typeof error['type'] !== 'string' || error['type'] === '') return 'error.type is not a non-empty string';
  if (error['param'] !== null && typeof error['param'] !== 'string') return 'error.param is neither a string nor null';
  const code = error['code'];
  if (code !== null && typeof code !== 'string' && !Number.isInteger(code)) return 'error.code is neither a string, an integer nor null';
  return undefined;
}

describe('malformed-input fuzz of every route', () => {
  it('reads the route table from the router', () => {
    // Checked against the router itself: a change of printRoutes' format cannot leave an empty or garbled table.
    expect(routes.length).toBeGreaterThanOrEqual(20);
    for (const r of routes) expect(server.service.app.hasRoute({ method: r.method as 'GET', url: r.url }), `${r.method} ${r.url}`).toBe(true);
    for (const r of ['POST /v1/responses', 'POST /v1/chat/completions', 'POST /v1/messages', 'GET /v1/models', 'POST /v1/files', 'GET /health']) {
      expect(routes.map((x) => `${x.method} ${x.url}`)).toContain(r);
    }
  });

  it('tells a spec envelope from anything else', () => {
    const ok = JSON.stringify({ error: { message: 'm', type: 't', param: null, code: null } });
    expect(violation(400, 'application/json; charset=utf-8', ok)).toBeUndefined();
    expect(violation(200, 'text/html', '<html>')).toBeUndefined();
    expect(violation(500, 'application/json', ok)).toBe('a 500');
    expect(violation(400, 'text/plain', ok)).toMatch(/content-type/);
    expect(violation(400, 'application/json', JSON.stringify({ type: 'error', error: { message: 'm', type: 't', param: null, code: null } }))).toMatch(/top-level/);
    expect(violation(404, 'application/json', JSON.stringify({ error: { message: 'm', type: 't' } }))).toBe('error.param missing');
    expect(violation(404, 'application/json', JSON.stringify({ error: { message: 'm', type: 't', param: 1, code: null } }))).toMatch(/param/);
  });

  it(`answers ${CASES} malformed requests (seed ${SEED}) with 2xx or the spec's envelope, never a 5xx`, async () => {
    const cases = makeCases(SEED, CASES);
    const failures: string[] = [];
    const statuses = new Map<number, number>();
    /** Per route: how many answers got past the key check (anything but 401/403). */
    const pastAuth = new Map<string, number>(routes.map((r) => [`${r.method} ${r.url}`, 0]));
    for (const [i, c] of cases.entries()) {
      const reply = await rawExchange(server.origin, requestBytes(c), { waitMs: 10_000 });
      statuses.set(reply.status, (statuses.get(reply.status) ?? 0) + 1);
      if (reply.status !== 401 && reply.status !== 403) pastAuth.set(c.route, (pastAuth.get(c.route) ?? 0) + 1);
      const wrong = violation(reply.status, reply.headers['content-type'], reply.body);
      if (wrong !== undefined) {
        failures.push(`case ${i} (seed ${SEED}): ${wrong}\n  ${c.method} ${c.path.slice(0, 200)} [${c.route}]\n`
          + `  headers ${JSON.stringify(c.headers).slice(0, 300)}\n  body ${JSON.stringify(c.body.toString('latin1').slice(0, 200))}\n`
          + `  -> ${reply.status} ${reply.body.slice(0, 300)}`);
      }
    }
    expect(failures.join('\n\n')).toBe('');
    // The fuzz reached past the parsers and the key check on every route, and drew a spread of refusals.
    expect([...pastAuth].filter(([, n]) => n === 0).map(([r]) => r)).toEqual([]);
    for (const status of [200, 400, 401, 404, 415]) expect(statuses.get(status) ?? 0, `replies with ${status}`).toBeGreaterThan(0);
    const refused = [...statuses].filter(([s]) => s >= 400).reduce((n, [, k]) => n + k, 0);
    expect(refused).toBeGreaterThan(CASES / 2);
  }, 60_000);
});
