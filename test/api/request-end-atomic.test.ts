// A request's end is one transaction (issue 11, point 7): the terminal object, its usage ledger
// row, its webhook delivery (and for Messages the idempotency result, for a batch line its result
// row) are written together or not at all. Faults are injected in the store itself: a SQLite
// trigger that aborts one of the writes. Whatever the write that fails, nothing of the request's
// end is left half-written, and a request whose end could not be stored is not billed.
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { storePath } from '../../src/service.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { chatLine, createBatch, waitForBatch } from '../helpers/batches.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

let server: TestServer;
let receiver: WebhookReceiver;
const quiet = { warn: () => {}, error: () => {} };

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  server = await startTestServer({ webhooks: { timeoutMs: 500, baseDelayMs: 20, maxRetries: 0, allowPrivateAddresses: true, log: quiet } });
});
afterAll(async () => {
  const closing = server?.close();
  server?.service.app.server.closeAllConnections();
  await closing;
  await receiver?.close();
});
afterEach(() => {
  vi.restoreAllMocks();
  dropFaults();
});

type Json = Record<string, any>;

function withDb<T>(fn: (db: Database.Database) => T): T {
  const db = new Database(storePath(server.dataDir));
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

/** Makes every `event` (e.g. 'INSERT ON webhook_deliveries') fail inside its transaction. */
function injectFault(event: string): void {
  const name = `fault_${Math.random().toString(36).slice(2)}`;
  withDb((db) => db.exec(`CREATE TRIGGER ${name} BEFORE ${event} BEGIN SELECT RAISE(ABORT, 'injected fault'); END`));
}

function dropFaults(): void {
  withDb((db) => {
    for (const { name } of db.prepare("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'fault_%'").all() as { name: string }[]) {
      db.exec(`DROP TRIGGER ${name}`);
    }
  });
}

const count = (table: string, where = '1 = 1', ...params: unknown[]): number =>
  withDb((db) => (db.prepare(`SELECT COUNT(*) AS n FROM ${table} WHERE ${where}`).get(...params) as { n: number }).n);

async function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() as Json };
}

const engine = () => server.service.registry.models[0]!.engine;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves once the next generation the engine runs has ended, and the writes after it had time. */
function nextGenerationEnded(): () => Promise<void> {
  const generate = vi.spyOn(engine(), 'generate');
  return async () => {
    await vi.waitFor(() => expect(generate).toHaveBeenCalled(), { timeout: 10_000 });
    await (generate.mock.results[0]!.value as Promise<unknown>).catch(() => {});
    await sleep(200);
  };
}

describe('a fault in the delivery insert', () => {
  it('foreground Responses: a 500, and neither a response, a ledger row nor a delivery', async () => {
    const before = { responses: count('responses'), usage: count('usage_ledger'), deliveries: count('webhook_deliveries') };
    injectFault('INSERT ON webhook_deliveries');
    const hook = receiver.hook();
    const res = await post('/responses', { model: 'tiny', input: 'Hi', max_output_tokens: 2, metadata: { completion_webhook: hook.url } });
    expect(res.status).toBe(500);
    expect({ responses: count('responses'), usage: count('usage_ledger'), deliveries: count('webhook_deliveries') }).toEqual(before);
  });

  it('background Responses: stays in_progress with its job, unbilled, to run again at the next start', async () => {
    injectFault('INSERT ON webhook_deliveries');
    const ended = nextGenerationEnded();
    const hook = receiver.hook();
    const res = await post('/responses', { model: 'tiny', input: 'Hi', max_output_tokens: 2, background: true, metadata: { completion_webhook: hook.url } });
    expect(res.status).toBe(200);
    const id = res.body['id'] as string;
    await ended();
    expect(count('responses', "id = ? AND status = 'in_progress'", id)).toBe(1);
    expect(count('background_jobs', 'response_id = ?', id)).toBe(1);
    expect(count('usage_ledger', 'request_id = ?', id)).toBe(0);
    expect(count('webhook_deliveries', 'object_id = ?', id)).toBe(0);
  });

  it('Chat Completions: a 500 and no ledger row', async () => {
    const usage = count('usage_ledger');
    injectFault('INSERT ON webhook_deliveries');
    const hook = receiver.hook();
    const res = await post('/chat/completions', {
      model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 2, metadata: { completion_webhook: hook.url },
    });
    expect(res.status).toBe(500);
    expect(count('usage_ledger')).toBe(usage);
  });
});

describe('a fault in the ledger insert', () => {
  it('foreground Responses: the response is stored failed, with its failed callback, and not billed', async () => {
    injectFault('INSERT ON usage_ledger');
    const hook = receiver.hook();
    const res = await post('/responses', { model: 'tiny', input: 'Hi', max_output_tokens: 2, metadata: { completion_webhook: hook.url } });
    expect(res.status).toBe(500);
    const rows = withDb((db) => db.prepare('SELECT id, body FROM responses ORDER BY created_at DESC, rowid DESC LIMIT 1').all()) as Json[];
    const stored = JSON.parse(rows[0]!['body']) as Json;
    expect(stored['status']).toBe('failed');
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.body).toEqual(stored);
  });
});

describe('Messages', () => {
  it('a fault in storing the idempotent result: a 500, no ledger row, and the key is free again', async () => {
    const usage = count('usage_ledger');
    injectFault('UPDATE ON idempotency');
    const body = { model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] };
    const headers = { 'idempotency-key': `atomic-${Date.now()}` };
    expect((await post('/messages', body, headers)).status).toBe(500);
    expect(count('usage_ledger')).toBe(usage);
    dropFaults();
    const retried = await post('/messages', body, headers);
    expect(retried.status).toBe(200);
    expect(count('usage_ledger', "surface = 'messages' AND request_id = ?", retried.body['id'])).toBe(1);
  });
});

describe('batch lines', () => {
  it('a fault in the result row insert leaves no ledger row for the line', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    injectFault('INSERT ON batch_results');
    const ended = nextGenerationEnded();
    const batch = await createBatch(client, [chatLine('only', 'Hi')], '24h');
    await ended();
    expect(count('usage_ledger', 'request_id LIKE ?', `${batch.id}:%`)).toBe(0);
    expect((await waitForBatch(client, batch.id, () => true)).request_counts?.completed ?? 0).toBe(0);
  });
});
