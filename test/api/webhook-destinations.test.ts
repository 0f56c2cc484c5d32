// Completion webhooks may not reach internal addresses (issue 11, point 5): a callback URL whose
// host is, or resolves to, a loopback / private / link-local / reserved address is refused by
// default, in every spelling of the address, and never reaches the receiver; the request itself is
// unaffected. The operator's `allowPrivateAddresses` lets the same URLs through. The local test
// receiver listens on 127.0.0.1 and ::1, so every loopback spelling below would reach it.
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
const FAST: WebhookSettings = { timeoutMs: 500, baseDelayMs: 20, maxRetries: 3, log };

let strict: TestServer;
let permissive: TestServer;
let receiver: WebhookReceiver;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  [strict, permissive] = await Promise.all([
    startTestServer({ webhooks: FAST }),
    startTestServer({ webhooks: { ...FAST, allowPrivateAddresses: true } }),
  ]);
});
afterAll(async () => {
  await strict?.close();
  await permissive?.close();
  await receiver?.close();
});

type Json = Record<string, any>;

async function createResponse(s: TestServer, metadata: Record<string, string>): Promise<Json> {
  const res = await fetch(`${s.baseUrl}/responses`, {
    method: 'POST',
    headers: { authorization: `Bearer ${s.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', input: 'Hello there', max_output_tokens: 2, temperature: 0, metadata }),
  });
  expect(res.status).toBe(200);
  return await res.json() as Json;
}

function deliveryRows(s: TestServer, objectId: string): Json[] {
  const db = new Database(storePath(s.dataDir), { readonly: true });
  try {
    return db.prepare('SELECT * FROM webhook_deliveries WHERE object_id = ?').all(objectId) as Json[];
  } finally {
    db.close();
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until the delivery of `objectId` is absent-for-good or ended; returns its rows. */
async function settled(s: TestServer, objectId: string): Promise<Json[]> {
  for (let i = 0; i < 200; i++) {
    const rows = deliveryRows(s, objectId);
    if (rows.every((r) => r['state'] !== 'pending')) return rows;
    await sleep(20);
  }
  throw new Error(`the delivery of ${objectId} is still pending`);
}

/** Loopback spellings the local receiver answers on: refused by default, delivered when allowed. */
const LOOPBACK_HOSTS: [string, string][] = [
  ['dotted IPv4', '127.0.0.1'],
  ['short IPv4 (127.1)', '127.1'],
  ['decimal IPv4 (2130706433)', '2130706433'],
  ['hex IPv4 (0x7f000001)', '0x7f000001'],
  ['octal IPv4 (0177.0.0.1)', '0177.0.0.1'],
  ['the name localhost', 'localhost'],
  ['IPv6 loopback', '[::1]'],
  ['IPv4-mapped IPv6, dotted', '[::ffff:127.0.0.1]'],
  ['IPv4-mapped IPv6, hex', '[::ffff:7f00:1]'],
];

/** Internal destinations no test receiver can answer on: only the refusal is checked. */
const OTHER_INTERNAL_HOSTS: [string, string][] = [
  ['private 10/8', '10.0.0.1'],
  ['private 192.168/16', '192.168.1.20'],
  ['cloud metadata (link-local)', '169.254.169.254'],
  ['carrier-grade NAT', '100.64.0.1'],
  ['unspecified', '0.0.0.0'],
  ['broadcast', '255.255.255.255'],
  ['multicast', '224.0.0.1'],
  ['unique-local IPv6', '[fd00::1]'],
  ['link-local IPv6', '[fe80::1]'],
  ['unspecified IPv6', '[::]'],
  ['NAT64 of 10.0.0.1', '[64:ff9b::a00:1]'],
  ['6to4 of 192.168.0.1', '[2002:c0a8:1::1]'],
];

describe('by default, internal destinations are refused', () => {
  it.each([...LOOPBACK_HOSTS, ...OTHER_INTERNAL_HOSTS])('%s (%s): no call, the request succeeds', async (_name, host) => {
    const hook = receiver.hook();
    const created = await createResponse(strict, { completion_webhook: hook.urlAt(host), webhook_token: 'secret' });
    expect(['completed', 'incomplete']).toContain(created['status']);
    const rows = await settled(strict, created['id']);
    // Refused before storing (a literal address) or at the first attempt (a name): never retried.
    for (const row of rows) expect(row).toMatchObject({ state: 'failed', attempts: 1, token: null });
    await sleep(50);
    expect(hook.calls).toHaveLength(0);
    const refusals = logs.filter((l) => l.level === 'warn' && l.fields['object_id'] === created['id']);
    expect(refusals.map((l) => l.fields['reason'])).toEqual(['refused_destination']);
    expect(String(refusals[0]!.fields['detail'])).toMatch(/loopback|private|link-local|unspecified|reserved|multicast|broadcast|shared|not a global/);
  });
});

describe('allowPrivateAddresses lets them through', () => {
  it.each(LOOPBACK_HOSTS)('%s (%s) is delivered', async (_name, host) => {
    const hook = receiver.hook();
    const created = await createResponse(permissive, { completion_webhook: hook.urlAt(host), webhook_token: 'secret' });
    const [callback] = await hook.waitForCalls(1);
    expect(callback!.headers['authorization']).toBe('Bearer secret');
    expect(callback!.body['id']).toBe(created['id']);
  });
});
