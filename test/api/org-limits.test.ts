// Per-organization limits over HTTP (src/serving/tenant-limits.ts, set per organization in the
// catalog's `limits`): a foreground request over its organization's in-flight limit gets 429 with
// Retry-After in the envelope, stores nothing and sends no callback, while other organizations
// are unaffected; background work is bounded by its own queue limit and never blocks the
// organization's foreground requests; tokens per minute are bounded. And an engine broken by a
// device fault answers 503 in the envelope, and /ready says the process is not ready.

import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { chatLine, createBatch, readResults, waitForBatch } from '../helpers/batches.js';
import OpenAI from 'openai';

let server: TestServer;
let receiver: WebhookReceiver;
const keys: Record<string, string> = {};

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  server = await startTestServer({
    webhooks: { allowPrivateAddresses: true },
    catalog: (dir) => ({
      models: [{ id: 'tiny', checkpoint: dir }],
      limits: {
        organizations: {
          'one-at-a-time': { max_inflight_requests: 1 },
          'small-queue': { max_queued_background: 2, max_inflight_requests: 1 },
          'few-tokens': { tokens_per_minute: 60 },
          'batch-tokens': { tokens_per_minute: 60 },
        },
      },
    }),
  });
  for (const org of ['one-at-a-time', 'small-queue', 'few-tokens', 'batch-tokens']) keys[org] = await server.keyFor(org);
});
afterAll(async () => {
  await server?.close();
  await receiver?.close();
});

/** Rows an organization has in a table with an org_id column, read from the database file. */
function storedRows(table: 'responses' | 'response_inputs', orgName: string): number {
  const db = new Database(join(server.dataDir, 'sluice.db'), { readonly: true });
  try {
    return (db.prepare(`SELECT COUNT(*) AS n FROM ${table} r JOIN organizations o ON o.id = r.org_id WHERE o.name = ?`)
      .get(orgName) as { n: number }).n;
  } finally {
    db.close();
  }
}
const storedResponses = (orgName: string) => storedRows('responses', orgName);

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
  it('refuses a foreground request over the in-flight limit with 429 and Retry-After, storing and sending nothing', async () => {
    const hook = receiver.hook();
    const long = { model: 'tiny', input: 'tell me a long story', max_output_tokens: 200, temperature: 0, metadata: { completion_webhook: hook.url } };
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
    // Only the admitted request was stored and called back; the refused ones left no trace, not
    // even their input items.
    expect(storedResponses('one-at-a-time')).toBe(1);
    expect(storedRows('response_inputs', 'one-at-a-time')).toBe(1);
    await hook.waitForCalls(3);  // the admitted one (of this org) and the two of the default organization
    await new Promise((r) => setTimeout(r, 300));
    expect(hook.calls).toHaveLength(3);
    // Chat Completions too: no callback for a request refused at admission.
    const chatHook = receiver.hook();
    const chat = { model: 'tiny', messages: [{ role: 'user', content: 'a long story' }], max_tokens: 200, metadata: { completion_webhook: chatHook.url } };
    const chats = await Promise.all([post(chat, keys['one-at-a-time']!, '/chat/completions'), post(chat, keys['one-at-a-time']!, '/chat/completions')]);
    expect(chats.map((r) => r.status).sort()).toEqual([200, 429]);
    await chatHook.waitForCalls(1);
    await new Promise((r) => setTimeout(r, 300));
    expect(chatHook.calls).toHaveLength(1);
  });

  it('answers 400 naming n when n alone exceeds the in-flight limit (no retry could admit it)', async () => {
    const chat = { model: 'tiny', messages: [{ role: 'user', content: 'two answers' }], max_tokens: 2, n: 2 };
    const res = await post(chat, keys['one-at-a-time']!, '/chat/completions');
    expect(res.status).toBe(400);
    expect(res.retryAfter).toBeNull();
    expect(Object.keys(res.body)).toEqual(['error']);
    expect(res.body['error']).toMatchObject({ type: 'invalid_request_error', param: 'n', code: 'invalid_request' });
    expect(res.body['error'].message).toMatch(/n is 2.*limit of 1/);
    // Within the limit, n is admitted as before.
    expect((await post({ ...chat, n: 1 }, keys['one-at-a-time']!, '/chat/completions')).status).toBe(200);
  });

  it('bounds the background queue; background work never takes the foreground\'s in-flight slots', async () => {
    const key = keys['small-queue']!;
    const body = { model: 'tiny', input: 'queued', max_output_tokens: 60, background: true };
    const accepted = [await post(body, key), await post(body, key)];
    for (const r of accepted) expect(r.body['status']).toBe('in_progress');
    const third = await post(body, key);
    expect(third.status).toBe(429);
    expect(third.body['error']).toMatchObject({ code: 'rate_limit_exceeded', param: 'background' });
    expect(storedRows('response_inputs', 'small-queue')).toBe(2);  // the refused one stored no input
    // With max_inflight_requests 1 and two background responses in progress, a foreground
    // request of the same organization is still served.
    expect((await post({ model: 'tiny', input: 'now', max_output_tokens: 2 }, key)).status).toBe(200);
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
    expect([storedRows('responses', 'few-tokens'), storedRows('response_inputs', 'few-tokens')]).toEqual([1, 1]);
  });
});

describe('batch lines and the organization\'s limits', () => {
  it('charges batch lines to the tokens-per-minute budget and makes the rest wait, foreground getting 429 meanwhile', async () => {
    const key = keys['batch-tokens']!;
    const openai = new OpenAI({ baseURL: server.baseUrl, apiKey: key, maxRetries: 0 });
    const lines = Array.from({ length: 12 }, (_, i) => chatLine(`l${i}`, `a long story number ${i}`, { max_tokens: 60, temperature: 0 }));
    const batch = await createBatch(openai, lines, 'asap');
    // The first lines spend the 60 tokens (their prompts as they start, their outputs as they end);
    // the organization's own first foreground request after one has ended is refused.
    await waitForBatch(openai, batch.id, (b) => (b.request_counts?.completed ?? 0) >= 1);
    const refused = await post({ model: 'tiny', input: 'now', max_output_tokens: 2 }, key);
    expect(refused.status).toBe(429);
    expect(refused.body['error']).toMatchObject({ code: 'rate_limit_exceeded' });
    // And the remaining lines wait for the budget (minutes of debt at 1 token/s) instead of running.
    await new Promise((r) => setTimeout(r, 1000));
    const now = await openai.batches.retrieve(batch.id);
    expect(now.request_counts!.completed).toBeLessThan(lines.length);
    await openai.batches.cancel(batch.id);
    await waitForBatch(openai, batch.id);
  });
});

describe('batch lines and the in-flight limit', () => {
  it('runs at most the organization\'s in-flight limit of its batch lines at once', async () => {
    const key = keys['one-at-a-time']!;
    const openai = new OpenAI({ baseURL: server.baseUrl, apiKey: key, maxRetries: 0 });
    const engine = server.service.registry.models[0]!.engine;
    const lines = Array.from({ length: 4 }, (_, i) => chatLine(`c${i}`, `story ${i}`, { max_tokens: 30, temperature: 0 }));
    // n above the limit is that line's 400 naming n, as its endpoint answers.
    lines.push(chatLine('too-many', 'two at once', { n: 2 }));
    const batch = await createBatch(openai, lines, 'asap');
    let most = 0;
    const watch = setInterval(() => {
      const { numRunning, numWaiting } = engine.schedulerStats();
      most = Math.max(most, numRunning + numWaiting);
    }, 2);
    try {
      const done = await waitForBatch(openai, batch.id);
      expect(done.status).toBe('completed');
      expect(done.request_counts).toMatchObject({ completed: 4, failed: 1 });
      const [failed] = await readResults(openai, done.error_file_id);
      expect(failed).toMatchObject({ custom_id: 'too-many', response: { status_code: 400, body: { error: { param: 'n', type: 'invalid_request_error' } } } });
    } finally {
      clearInterval(watch);
    }
    expect(most).toBe(1);
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
