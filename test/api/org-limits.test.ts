// Per-organization limits over HTTP (src/serving/tenant-limits.ts, set per organization in the
// catalog's `limits`): a foreground request over its organization's in-flight limit gets 429 with
// Retry-After in the envelope while other organizations are unaffected; background work over it
// waits its turn instead; the background queue and tokens per minute are bounded. And an engine
// broken by a device fault answers 503 in the envelope, and /ready says the process is not ready.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
const keys: Record<string, string> = {};

beforeAll(async () => {
  server = await startTestServer({
    catalog: (dir) => ({
      models: [{ id: 'tiny', checkpoint: dir }],
      limits: {
        organizations: {
          'one-at-a-time': { max_inflight_requests: 1 },
          'small-queue': { max_queued_background: 2, max_inflight_requests: 1 },
          'few-tokens': { tokens_per_minute: 60 },
        },
      },
    }),
  });
  for (const org of ['one-at-a-time', 'small-queue', 'few-tokens']) keys[org] = await server.keyFor(org);
});
afterAll(async () => { await server?.close(); });

async function post(body: unknown, key: string, path = '/responses') {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.json() as Record<string, any> };
}

async function waitTerminal(id: string, key: string): Promise<Record<string, any>> {
  for (let i = 0; i < 600; i++) {
    const res = await fetch(`${server.baseUrl}/responses/${id}`, { headers: { authorization: `Bearer ${key}` } });
    const body = await res.json() as Record<string, any>;
    if (body['status'] !== 'in_progress') return body;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${id} still in progress`);
}

describe('per-organization limits', () => {
  it('refuses a foreground request over the in-flight limit with 429 and Retry-After; others are unaffected', async () => {
    const long = { model: 'tiny', input: 'tell me a long story', max_output_tokens: 200, temperature: 0 };
    const results = await Promise.all([
      post(long, keys['one-at-a-time']!), post(long, keys['one-at-a-time']!), post(long, keys['one-at-a-time']!),
      post(long, server.key), post(long, server.key),
    ]);
    const mine = results.slice(0, 3);
    expect(mine.filter((r) => r.status === 200)).toHaveLength(1);
    for (const r of mine.filter((x) => x.status !== 200)) {
      expect(r.status).toBe(429);
      expect(r.retryAfter).toBe('1');
      expect(r.body['error']).toMatchObject({ type: 'rate_limit_error', code: 'rate_limit_exceeded', retry_after: 1 });
    }
    expect(results.slice(3).map((r) => r.status)).toEqual([200, 200]);
  });

  it('lets background work over the in-flight limit wait its turn, and bounds the background queue', async () => {
    const key = keys['small-queue']!;
    const body = { model: 'tiny', input: 'queued', max_output_tokens: 30, background: true };
    const accepted = [await post(body, key), await post(body, key)];
    for (const r of accepted) expect(r.body['status']).toBe('in_progress');
    const third = await post(body, key);
    expect(third.status).toBe(429);
    expect(third.body['error']).toMatchObject({ code: 'rate_limit_exceeded', param: 'background' });
    // Both run, one after the other (max_inflight_requests 1), and complete.
    for (const r of accepted) expect((await waitTerminal(r.body['id'], key))['status']).toMatch(/^(completed|incomplete)$/);
    expect((await post(body, key)).status).toBe(200);  // room again
  });

  it('spends a tokens-per-minute budget, then answers 429 with the seconds until it refills', async () => {
    const key = keys['few-tokens']!;
    const first = await post({ model: 'tiny', input: 'spend the budget', max_output_tokens: 80, temperature: 0 }, key);
    expect(first.status).toBe(200);
    const used = first.body['usage'].total_tokens as number;
    expect(used).toBeGreaterThan(60);
    const second = await post({ model: 'tiny', input: 'again', max_output_tokens: 4 }, key);
    expect(second.status).toBe(429);
    const wait = Number(second.retryAfter);
    // In debt by (used - 60) tokens at 1 token/s.
    expect(wait).toBeGreaterThanOrEqual(1);
    expect(wait).toBeLessThanOrEqual(used - 60 + 1);
    expect(second.body['error'].retry_after).toBe(wait);
    // Background requests are refused at creation too while the budget is spent.
    expect((await post({ model: 'tiny', input: 'bg', max_output_tokens: 4, background: true }, key)).status).toBe(429);
  });
});

describe('an engine broken by a device fault', () => {
  it('answers 503 engine_broken in the envelope, and /ready is 503', async () => {
    const broken = await startTestServer();
    try {
      expect((await fetch(`${broken.origin}/ready`)).status).toBe(200);
      broken.service.registry.models[0]!.engine.injectDeviceFault();
      const res = await fetch(`${broken.baseUrl}/responses`, {
        method: 'POST', headers: { authorization: `Bearer ${broken.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', input: 'hi', max_output_tokens: 4 }),
      });
      expect(res.status).toBe(503);
      const body = await res.json() as Record<string, any>;
      expect(body).toEqual({ error: { type: 'server_error', code: 'engine_broken', param: null, message: expect.stringContaining('out of service') } });
      const again = await fetch(`${broken.baseUrl}/chat/completions`, {
        method: 'POST', headers: { authorization: `Bearer ${broken.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
      });
      expect(again.status).toBe(503);
      const ready = await fetch(`${broken.origin}/ready`);
      expect(ready.status).toBe(503);
      expect((await ready.json() as Record<string, any>)['error']).toMatchObject({ code: 'engine_broken' });
    } finally {
      await broken.close();
    }
  });
});
