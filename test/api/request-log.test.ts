// The service's one JSON log stream, captured from a pino destination: request ids (kept when a
// client's x-request-id is safe, replaced otherwise, generated when absent; returned on every
// response, and as request-id on /v1/messages), one access line per request with its fields, the
// periodic engine line while the engine works, the startup lines, and what a restart resumes.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { chatLine, createBatch } from '../helpers/batches.js';
import { httpRequest, rawExchange } from '../helpers/raw-http.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

type Line = Record<string, any>;

/** A pino logger at info whose lines land, parsed, in `lines`. */
function capture(): { logger: pino.Logger; lines: Line[] } {
  const lines: Line[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line) as Line); } });
  return { logger, lines };
}

async function until<T>(what: string, get: () => T | undefined, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = get();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let server: TestServer;
let lines: Line[];

beforeAll(async () => {
  const captured = capture();
  lines = captured.lines;
  server = await startTestServer({ loggerInstance: captured.logger, engineLogIntervalMs: 50 });
});
afterAll(async () => {
  await server?.close();
});

const get = (path: string, headers: Record<string, string> = {}) => fetch(`${server.origin}${path}`, { headers });
const accessLine = (requestId: string) => until(`the access line of ${requestId}`,
  () => lines.find((l) => l['request_id'] === requestId && l['msg'] === 'request'));

describe('request ids', () => {
  it('keeps a safe x-request-id, returns it, and logs the request under it', async () => {
    const id = 'trace-42.a_b:c/d+e=';
    const res = await get('/v1/models', { authorization: `Bearer ${server.key}`, 'x-request-id': id });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe(id);
    expect(res.headers.get('request-id')).toBeNull();
    const line = await accessLine(id);
    const org = (await server.service.store.getOrganizationByName('default'))!;
    expect(line).toMatchObject({ level: 30, route: '/v1/models', method: 'GET', status: 200, org_id: org.id });
    expect(line['duration_ms']).toBeGreaterThanOrEqual(0);
    expect(line['tokens']).toBeUndefined();
  });

  it('generates one when absent, and replaces one that is too long or has unsafe characters', async () => {
    for (const given of [undefined, 'has spaces', 'quote"d', 'x'.repeat(129), 'é', '']) {
      const res = await get('/health', given === undefined ? {} : { 'x-request-id': given });
      const id = res.headers.get('x-request-id')!;
      expect(id, String(given)).toMatch(UUID);
      expect((await accessLine(id))['route']).toBe('/health');
    }
    // The longest kept: 128 characters.
    const longest = 'y'.repeat(128);
    expect((await get('/health', { 'x-request-id': longest })).headers.get('x-request-id')).toBe(longest);
  });

  it('is on refusals too: 401, 404 (logged as route "unmatched"), and request-id on /v1/messages, even refused', async () => {
    const refused = await fetch(`${server.origin}/v1/messages`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': 'msg-1' }, body: '{}',
    });
    expect(refused.status).toBe(401);
    expect(refused.headers.get('x-request-id')).toBe('msg-1');
    expect(refused.headers.get('request-id')).toBe('msg-1');
    expect(await accessLine('msg-1')).toMatchObject({ route: '/v1/messages', method: 'POST', status: 401, org_id: null });

    const missing = await get('/no/such/path?secret=1', { 'x-request-id': 'nf-1' });
    expect(missing.status).toBe(404);
    expect(missing.headers.get('x-request-id')).toBe('nf-1');
    const line = await accessLine('nf-1');
    expect(line).toMatchObject({ route: 'unmatched', status: 404 });
    expect(JSON.stringify(line)).not.toContain('secret');
  });

  it('is on replies written before routing: malformed HTTP (on the raw socket) and an unsupported Expect', async () => {
    const malformed = await rawExchange(server.origin, 'GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n');
    expect(malformed.status).toBe(400);
    expect(malformed.headers['x-request-id']).toMatch(UUID);
    const expect417 = await rawExchange(server.origin, httpRequest('POST', '/v1/responses', {
      host: 'x', 'content-type': 'application/json', 'content-length': 2, expect: 'something-else', 'x-request-id': 'exp-1',
    }, '{}'));
    expect(expect417.status).toBe(417);
    expect(expect417.headers['x-request-id']).toBe('exp-1');
  });

  it('answers an Anthropic client with request-id and logs the message with its tokens', async () => {
    const res = await fetch(`${server.origin}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': server.key, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'tiny', max_tokens: 6, messages: [{ role: 'user', content: 'hello' }] }),
    });
    expect(res.status).toBe(200);
    const body = await res.json() as { usage: { input_tokens: number; output_tokens: number } };
    const id = res.headers.get('request-id')!;
    expect(id).toMatch(UUID);
    expect(res.headers.get('x-request-id')).toBe(id);
    const line = await accessLine(id);
    expect(line).toMatchObject({ route: '/v1/messages', status: 200, tokens: { prompt: body.usage.input_tokens, completion: body.usage.output_tokens, cached: 0 } });
  });
});

describe('the access log', () => {
  it('writes one line per request with the tokens of all its choices', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const { data, response } = await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'count' }], max_tokens: 5, n: 3, temperature: 0.5,
    }).withResponse();
    const id = response.headers.get('x-request-id')!;
    await accessLine(id);
    const mine = lines.filter((l) => l['request_id'] === id);
    expect(mine.filter((l) => l['msg'] === 'request')).toHaveLength(1);
    const completion = data.usage!.completion_tokens;
    expect(mine[0]).toMatchObject({ route: '/v1/chat/completions', method: 'POST', status: 200 });
    // As the usage object (and the ledger) counts them: the prompt once, the choices' output together.
    expect(mine[0]!['tokens']).toEqual({
      prompt: data.usage!.prompt_tokens, completion, cached: data.usage!.prompt_tokens_details!.cached_tokens,
    });
    expect(completion).toBeGreaterThanOrEqual(3);   // three choices of 1..5 tokens each
    expect(completion).toBeLessThanOrEqual(15);
  });
});

describe('engine and lifecycle lines', () => {
  it('logs the engine\'s throughput, queues and KV use while it works', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const from = lines.length;
    await Promise.all([0, 1, 2].map((i) => client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: `story ${i}` }], max_tokens: 40, temperature: 0,
    })));
    // The requests sampled 120 tokens: an interval that saw some of them has a line saying so.
    const line = await until('an engine line with generation throughput',
      () => lines.slice(from).find((l) => /^engine tiny: /.test(l['msg']) && l['generation_tokens_per_s'] > 0));
    expect(line).toMatchObject({ level: 30, model: 'tiny' });
    expect(line['steps']).toBeGreaterThan(0);
    expect(Object.keys(line['running'])).toEqual(['asap', 'standard', 'flex']);
    expect(Object.keys(line['waiting'])).toEqual(['asap', 'standard', 'flex']);
    const { used, cached, free } = line['kv_blocks'];
    expect(used + cached + free).toBe(server.service.registry.models[0]!.engine.info.numBlocks);
    expect(line['msg']).toMatch(/generation [\d.]+ tokens\/s, running \d+ \(asap \d+, standard \d+, flex \d+\), waiting \d+/);
  });

  it('logged the engine (backend, device, threads, KV pool, limits) and the service limits at start', () => {
    const info = server.service.registry.models[0]!.engine.info;
    const engine = lines.find((l) => String(l['msg']).startsWith('engine for tiny: '))!;
    expect(engine).toMatchObject({
      models: ['tiny'], backend: 'cpu', device: info.simd, threads: 1, kv_cache_bytes: info.kvCacheBytes, kv_blocks: info.numBlocks,
      block_size: info.blockSize, max_num_seqs: info.maxNumSeqs, max_batched_tokens: info.maxBatchedTokens,
    });
    const limits = lines.find((l) => String(l['msg']).startsWith('limits per organization: '))!;
    expect(limits['org_limits']).toEqual({ maxInflightRequests: 256, maxQueuedBackground: 10_000, tokensPerMinute: 0 });
    expect(limits['transport_limits']).toMatchObject({ maxConnections: 4096 });
  });
});

describe('a restart', () => {
  let receiver: WebhookReceiver;
  let dataDir: string;
  beforeAll(async () => {
    receiver = await startWebhookReceiver();
    dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-log-restart-'));
  });
  afterAll(async () => {
    await receiver.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('logs the background work it resumes: batches, webhook deliveries, background responses', async () => {
    const webhooks = { allowPrivateAddresses: true, timeoutMs: 30_000, baseDelayMs: 20 };
    const first = await startTestServer({ dataDir, webhooks });
    const hook = receiver.hook(['hang'], 200);
    try {
      const client = new OpenAI({ baseURL: first.baseUrl, apiKey: first.key, maxRetries: 0 });
      first.service.batches.pause();
      await createBatch(client, [chatLine('a', 'one')]);
      // Its callback's first attempt hangs: still pending when the service stops.
      await client.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, metadata: { completion_webhook: hook.url },
      });
      await hook.waitForCalls(1);
      // Long enough to be running still when the service stops right after.
      const running = await client.responses.create({ model: 'tiny', input: 'go on', max_output_tokens: 1800, background: true });
      expect(running.status).toBe('in_progress');
    } finally {
      await first.close();
    }
    const { logger, lines: restarted } = capture();
    const second = await startTestServer({ dataDir, webhooks, loggerInstance: logger });
    try {
      const msgs = restarted.map((l) => String(l['msg']));
      expect(msgs).toContain('batches left unfinished by the previous process resume: 1');
      expect(msgs).toContain('completion webhooks: 1 pending deliveries resume');
      expect(restarted.find((l) => String(l['msg']).startsWith('background responses left by the previous process'))).toMatchObject({
        resumed: 1, timed_out: 0, failed: 0,
      });
    } finally {
      await second.close();
    }
  });
});
