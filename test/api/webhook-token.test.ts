// metadata.webhook_token is a credential the caller gives the service for one callback (issue 11,
// point 7): it is never echoed (POST reply, GET, the callback body, batch output lines), it lives
// only in the delivery row (and a background job's stored request until the job ends), and the
// delivery row forgets it once the delivery has ended, delivered or failed.
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { storePath } from '../../src/service.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow, createBatch, readResults, waitForBatch } from '../helpers/batches.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

const TOKEN = 'tok-never-echoed-0123456789';
let server: TestServer;
let receiver: WebhookReceiver;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  server = await startTestServer({
    webhooks: { timeoutMs: 500, baseDelayMs: 20, maxRetries: 1, allowPrivateAddresses: true, log: { warn: () => {}, error: () => {} } },
  });
});
afterAll(async () => {
  if (server) await closeNow(server);
  await receiver?.close();
});

type Json = Record<string, any>;

async function call(method: string, path: string, body?: unknown): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${server.key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() as Json };
}

function rows(sql: string, ...params: unknown[]): Json[] {
  const db = new Database(storePath(server.dataDir), { readonly: true });
  try {
    return db.prepare(sql).all(...params) as Json[];
  } finally {
    db.close();
  }
}

/** Waits for the delivery of `objectId` to leave `pending`. */
async function endedDelivery(objectId: string): Promise<Json> {
  for (let i = 0; i < 250; i++) {
    const [row] = rows('SELECT * FROM webhook_deliveries WHERE object_id = ?', objectId);
    if (row && row['state'] !== 'pending') return row;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`the delivery of ${objectId} did not end`);
}

const noToken = (text: string) => expect(text).not.toContain(TOKEN);

describe('the token is never echoed', () => {
  it('foreground: not in the reply, GET, the callback body or the stored row; the header still carries it', async () => {
    const hook = receiver.hook();
    const metadata = { completion_webhook: hook.url, webhook_token: TOKEN, tag: 'kept' };
    const created = await call('POST', '/responses', { model: 'tiny', input: 'Hi', max_output_tokens: 2, metadata });
    expect(created.status).toBe(200);
    expect(created.body['metadata']).toEqual({ completion_webhook: hook.url, tag: 'kept' });
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.headers['authorization']).toBe(`Bearer ${TOKEN}`);
    noToken(JSON.stringify(callback!.body));
    const got = await call('GET', `/responses/${created.body['id']}`);
    noToken(JSON.stringify(got.body));
    expect(callback!.body).toEqual(got.body);
    for (const r of rows('SELECT body FROM responses WHERE id = ?', created.body['id'])) noToken(r['body']);
    const delivery = await endedDelivery(created.body['id']);
    expect(delivery).toMatchObject({ state: 'delivered', token: null });
    noToken(delivery['body']);
  });

  it('background: the job holds it until the response ends, then only the delivery until it ends', async () => {
    const hook = receiver.hook();
    const created = await call('POST', '/responses', {
      model: 'tiny', input: 'Hi', max_output_tokens: 2, background: true, metadata: { completion_webhook: hook.url, webhook_token: TOKEN },
    });
    noToken(JSON.stringify(created.body));
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.headers['authorization']).toBe(`Bearer ${TOKEN}`);
    noToken(JSON.stringify(callback!.body));
    noToken(JSON.stringify((await call('GET', `/responses/${created.body['id']}`)).body));
    expect(rows('SELECT * FROM background_jobs WHERE response_id = ?', created.body['id'])).toEqual([]);
    expect(await endedDelivery(created.body['id'])).toMatchObject({ state: 'delivered', token: null });
  });

  it('a delivery that failed forgets the token too', async () => {
    const hook = receiver.hook([], 500);
    const created = await call('POST', '/responses', {
      model: 'tiny', input: 'Hi', max_output_tokens: 2, metadata: { completion_webhook: hook.url, webhook_token: TOKEN },
    });
    await hook.waitForCalls(2);
    expect(await endedDelivery(created.body['id'])).toMatchObject({ state: 'failed', attempts: 2, token: null });
  });

  it('batch output lines of /v1/responses carry the metadata without the token', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const line = {
      custom_id: 'a', method: 'POST' as const, url: '/v1/responses' as const,
      body: { model: 'tiny', input: 'Hi', max_output_tokens: 2, metadata: { completion_webhook: 'https://example.com/h', webhook_token: TOKEN } },
    };
    const batch = await createBatch(client, [line], '24h', '/v1/responses');
    const done = await waitForBatch(client, batch.id);
    expect(done.status).toBe('completed');
    const [result] = await readResults(client, done.output_file_id);
    expect(result!.response!.body['metadata']).toEqual({ completion_webhook: 'https://example.com/h' });
    noToken(JSON.stringify(result));
  });
});
