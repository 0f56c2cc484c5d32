// Completion webhooks (spec, "Events") against a real local receiver: headers, the body being the
// GET object, retries with backoff, timeouts, giving up, invalid URLs, both surfaces, failures,
// and deliveries that outlive a restart. Retry settings are shrunk so the file runs in seconds.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { SluiceError } from '../../src/errors.js';
import { storePath } from '../../src/service.js';
import type { WebhookLog, WebhookSettings } from '../../src/jobs/webhook-deliveries.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

interface LogLine { level: 'warn' | 'error'; msg: string; fields: Record<string, unknown> }

const logs: LogLine[] = [];
const log: WebhookLog = {
  warn: (fields, msg) => logs.push({ level: 'warn', msg, fields: fields as Record<string, unknown> }),
  error: (fields, msg) => logs.push({ level: 'error', msg, fields: fields as Record<string, unknown> }),
};
// The receiver is on 127.0.0.1: a loopback destination, refused unless private ones are allowed.
const FAST: WebhookSettings = { timeoutMs: 200, baseDelayMs: 20, maxRetries: 3, allowPrivateAddresses: true, log };

let server: TestServer;
let receiver: WebhookReceiver;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  server = await startTestServer({ webhooks: FAST });
});
afterAll(async () => {
  await server?.close();
  await receiver?.close();
});

type Json = Record<string, any>;

async function call(s: TestServer, method: string, path: string, body?: unknown): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${s.baseUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${s.key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() as Json };
}

const createResponse = (metadata: Record<string, string> | undefined, extra: Json = {}, s = server) =>
  call(s, 'POST', '/responses', { model: 'tiny', input: 'Hello there', max_output_tokens: 4, temperature: 0, ...(metadata && { metadata }), ...extra });
const getResponse = async (id: string, s = server) => (await call(s, 'GET', `/responses/${id}`)).body;

/** Delivery rows as stored, read straight from SQLite (the store has no listing method). */
function deliveries(dataDir: string, where: { url?: string; objectId?: string }): Json[] {
  const db = new Database(storePath(dataDir), { readonly: true });
  try {
    return db.prepare('SELECT * FROM webhook_deliveries WHERE url = ? OR object_id = ?').all(where.url ?? null, where.objectId ?? null) as Json[];
  } finally {
    db.close();
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const engine = () => server.service.registry.models[0]!.engine;

describe('delivery', () => {
  it('POSTs the stored response with Content-Type and the exact bearer token (foreground)', async () => {
    const hook = receiver.hook();
    const created = await createResponse({ completion_webhook: hook.url, webhook_token: 'tok-1:/+=_~ x' });
    expect(created.status).toBe(200);
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.method).toBe('POST');
    expect(callback!.headers['content-type']).toBe('application/json');
    expect(callback!.headers['authorization']).toBe('Bearer tok-1:/+=_~ x');
    expect(['completed', 'incomplete']).toContain(callback!.body['status']);
    expect(callback!.body).toEqual(await getResponse(created.body['id']));
    expect(callback!.body).toEqual(created.body);
  });

  it('sends no Authorization header without webhook_token, and the final object for a background request', async () => {
    const hook = receiver.hook();
    const created = await createResponse({ completion_webhook: hook.url }, { background: true });
    expect(created.body['status']).toBe('in_progress');
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.headers['authorization']).toBeUndefined();
    expect(['completed', 'incomplete']).toContain(callback!.body['status']);
    expect(callback!.body['id']).toBe(created.body['id']);
    expect(callback!.body).toEqual(await getResponse(created.body['id']));
    await sleep(100);
    expect(hook.calls).toHaveLength(1);
    expect(deliveries(server.dataDir, { url: hook.url })).toMatchObject([{ state: 'delivered', attempts: 1, token: null }]);
  });

  it('sends the chat.completion object for Chat Completions', async () => {
    const hook = receiver.hook();
    const res = await call(server, 'POST', '/chat/completions', {
      model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 3,
      metadata: { completion_webhook: hook.url, webhook_token: 'chat-secret' },
    });
    expect(res.status).toBe(200);
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.headers['authorization']).toBe('Bearer chat-secret');
    expect(callback!.body).toEqual(res.body);
    expect(callback!.body['object']).toBe('chat.completion');
  });
});

describe('retries', () => {
  it('retries after 500s with growing backoff and stops at the first 2xx (N failures -> N+1 calls)', async () => {
    const hook = receiver.hook([500, 503]);
    const created = await createResponse({ completion_webhook: hook.url });
    const calls = await hook.waitForCalls(3);
    await sleep(150);
    expect(hook.calls).toHaveLength(3);
    expect(calls[1]!.at - calls[0]!.at).toBeGreaterThanOrEqual(FAST.baseDelayMs! - 2);
    expect(calls[2]!.at - calls[1]!.at).toBeGreaterThanOrEqual(2 * FAST.baseDelayMs! - 2);
    for (const c of calls) expect(c.body).toEqual(created.body); // every attempt carries the same body
    expect(deliveries(server.dataDir, { url: hook.url })).toMatchObject([{ state: 'delivered', attempts: 3 }]);
  });

  it('treats a 4xx (the receiver refusing the token) as a failed attempt', async () => {
    const hook = receiver.hook([401]);
    await createResponse({ completion_webhook: hook.url, webhook_token: 'x' });
    await hook.waitForCalls(2);
    await sleep(100);
    expect(hook.calls).toHaveLength(2);
  });

  it('gives up after 1 + 3 attempts, logs it, and leaves the stored response unchanged', async () => {
    const hook = receiver.hook([], 500);
    const created = await createResponse({ completion_webhook: hook.url });
    const before = await getResponse(created.body['id']);
    await hook.waitForCalls(4);
    await sleep(300); // longer than the next backoff (8 x base) would be
    expect(hook.calls).toHaveLength(4);
    expect(await getResponse(created.body['id'])).toEqual(before);
    expect(deliveries(server.dataDir, { url: hook.url })).toMatchObject([{ state: 'failed', attempts: 4, last_error: 'HTTP 500' }]);
    const gaveUp = logs.filter((l) => l.level === 'error' && l.fields['object_id'] === created.body['id']);
    expect(gaveUp).toHaveLength(1);
    expect(gaveUp[0]!.msg).toMatch(/giving up/);
    expect(gaveUp[0]!.fields['error']).toBe('HTTP 500');
  });

  it('counts a reply slower than the per-attempt timeout as a failed attempt', async () => {
    const hook = receiver.hook(['hang']);
    const created = await createResponse({ completion_webhook: hook.url });
    const calls = await hook.waitForCalls(2);
    expect(calls[1]!.at - calls[0]!.at).toBeGreaterThanOrEqual(FAST.timeoutMs! + FAST.baseDelayMs! - 5);
    await sleep(100);
    expect(hook.calls).toHaveLength(2);
    const warned = logs.find((l) => l.level === 'warn' && l.fields['object_id'] === created.body['id']);
    expect(warned?.fields['error']).toBe(`timed out after ${FAST.timeoutMs} ms`);
  });
});

describe('what sends nothing', () => {
  it.each([
    ['an ftp URL', { completion_webhook: 'ftp://x' }, 'unusable_url'],
    ['text that is no URL', { completion_webhook: 'not a url' }, 'unusable_url'],
    ['a URL with credentials (fetch refuses them)', { completion_webhook: 'http://user:pw@127.0.0.1:9/' }, 'unusable_url'],
    ['a token no HTTP header can carry', { completion_webhook: 'http://127.0.0.1:9/', webhook_token: 'jeton-é' }, 'unusable_token'],
    ['an empty string', { completion_webhook: '' }, undefined],
    ['a token without a URL', { webhook_token: 'tok' }, undefined],
    ['no metadata', undefined, undefined],
  ])('%s: the request succeeds and no delivery exists', async (_name, metadata, reason) => {
    const created = await createResponse(metadata);
    expect(created.status).toBe(200);
    expect(['completed', 'incomplete']).toContain(created.body['status']);
    // The token is never echoed (webhook-token.test.ts); the rest of the metadata is.
    const { webhook_token: _token, ...echoed } = (metadata ?? {}) as Record<string, string>;
    expect(created.body['metadata']).toEqual(echoed);
    expect(deliveries(server.dataDir, { objectId: created.body['id'] })).toEqual([]);
    // An unusable URL or token is logged for the operator; a missing URL is nothing to report.
    const warned = logs.filter((l) => l.fields['object_id'] === created.body['id']).map((l) => l.fields['reason']);
    expect(warned).toEqual(reason ? [reason] : []);
  });

  it('a response cancelled by its client disconnecting', async () => {
    const hook = receiver.hook();
    // A generation that runs until it is aborted, as a long one would: the test cannot lose the race.
    const generate = vi.spyOn(engine(), 'generate').mockImplementationOnce((req) => new Promise((_resolve, reject) => {
      req.signal!.addEventListener('abort', () => reject(new SluiceError('cancelled', 'the request was cancelled')));
    }));
    try {
      const controller = new AbortController();
      const pending = fetch(`${server.baseUrl}/responses`, {
        method: 'POST',
        headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', input: 'Hello there', max_output_tokens: 1500, metadata: { completion_webhook: hook.url } }),
        signal: controller.signal,
      });
      await vi.waitFor(() => expect(generate).toHaveBeenCalledTimes(1));
      controller.abort();
      await expect(pending).rejects.toThrow();
      await (generate.mock.results[0]!.value as Promise<unknown>).catch(() => {});
      await sleep(100);
    } finally {
      generate.mockRestore();
    }
    expect(hook.calls).toHaveLength(0);
    expect(deliveries(server.dataDir, { url: hook.url })).toEqual([]);
  });
});

describe('failures', () => {
  it('a failed background response arrives with status failed and its error code and message', async () => {
    const hook = receiver.hook();
    const generate = vi.spyOn(engine(), 'generate').mockRejectedValueOnce(new Error('native fault'));
    try {
      const created = await createResponse({ completion_webhook: hook.url }, { background: true });
      const [callback] = await hook.waitForCalls(1);
      expect(callback!.body['status']).toBe('failed');
      expect(callback!.body['error']).toEqual({ code: 'server_error', message: expect.any(String) });
      expect(callback!.body).toEqual(await getResponse(created.body['id']));
    } finally {
      generate.mockRestore();
    }
  });

  it('a failed foreground response too (the client gets a 500)', async () => {
    const hook = receiver.hook();
    const generate = vi.spyOn(engine(), 'generate').mockRejectedValueOnce(new Error('native fault'));
    try {
      const created = await createResponse({ completion_webhook: hook.url });
      expect(created.status).toBe(500);
      const [callback] = await hook.waitForCalls(1);
      expect(callback!.body['status']).toBe('failed');
      expect(callback!.body['error']['code']).toBe('server_error');
      expect(callback!.body).toEqual(await getResponse(callback!.body['id']));
    } finally {
      generate.mockRestore();
    }
  });

  it('a failed chat completion sends its id with status failed and the error', async () => {
    const hook = receiver.hook();
    const generate = vi.spyOn(engine(), 'generate').mockRejectedValueOnce(new Error('native fault'));
    try {
      const res = await call(server, 'POST', '/chat/completions', {
        model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 3, metadata: { completion_webhook: hook.url },
      });
      expect(res.status).toBe(500);
      const [callback] = await hook.waitForCalls(1);
      expect(callback!.body).toMatchObject({
        object: 'chat.completion', model: 'tiny', status: 'failed', choices: [], error: { code: 'server_error', message: expect.any(String) },
      });
      expect(callback!.body['id']).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    } finally {
      generate.mockRestore();
    }
  });
});

describe('restarts', () => {
  it('an attempt cut off by shutdown stays pending and is sent by the next process on the same data directory', async () => {
    const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-webhooks-'));
    const hook = receiver.hook(['hang', 500]);
    let first: TestServer | undefined = await startTestServer({ dataDir, webhooks: { ...FAST, timeoutMs: 30_000 } });
    let second: TestServer | undefined;
    try {
      const created = await createResponse({ completion_webhook: hook.url, webhook_token: 'restart' }, {}, first);
      await hook.waitForCalls(1); // hangs: the attempt is in flight when the service stops
      await first.close();
      first = undefined;
      await sleep(100);
      expect(hook.calls).toHaveLength(1); // nothing is sent after close
      expect(deliveries(dataDir, { url: hook.url })).toMatchObject([{ state: 'pending', attempts: 0 }]);

      second = await startTestServer({ dataDir, webhooks: FAST });
      const calls = await hook.waitForCalls(3); // the resumed attempt fails (500), its retry succeeds
      await sleep(100);
      expect(hook.calls).toHaveLength(3);
      // At-least-once: the same body (and id) more than once; the receiver deduplicates by id.
      for (const c of calls) {
        expect(c.body).toEqual(created.body);
        expect(c.headers['authorization']).toBe('Bearer restart');
      }
      expect(await getResponse(created.body['id'], second)).toEqual(created.body);
      expect(deliveries(dataDir, { url: hook.url })).toMatchObject([{ state: 'delivered', attempts: 2 }]);
    } finally {
      await first?.close();
      await second?.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
