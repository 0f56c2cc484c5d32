// One organization's slow receiver delays only its own callbacks (issue 11, point 6). Org A's
// receiver never answers, and A has more callbacks pending than the dispatcher would ever run at
// once; org B's callback must still go out at once, not after A's attempts time out. The check is
// an ordering (B arrives before any A attempt has timed out), not a wall-clock number.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { DEFAULT_WEBHOOK_SETTINGS, type WebhookLog } from '../../src/jobs/webhook-deliveries.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

const logs: { msg: string; fields: Record<string, unknown> }[] = [];
const log: WebhookLog = {
  warn: (fields, msg) => logs.push({ msg, fields: fields as Record<string, unknown> }),
  error: (fields, msg) => logs.push({ msg, fields: fields as Record<string, unknown> }),
};
/** Long enough that a slow test machine never sees it fire before B's callback could arrive. */
const TIMEOUT_MS = 4_000;

let server: TestServer;
let receiverA: WebhookReceiver;
let receiverB: WebhookReceiver;

beforeAll(async () => {
  [receiverA, receiverB] = await Promise.all([startWebhookReceiver(), startWebhookReceiver()]);
  server = await startTestServer({ webhooks: { timeoutMs: TIMEOUT_MS, baseDelayMs: 20, maxRetries: 0, allowPrivateAddresses: true, log } });
});
afterAll(async () => {
  await server?.close();
  await receiverA?.close();
  await receiverB?.close();
});

async function createResponse(key: string, webhook: string): Promise<void> {
  const res = await fetch(`${server.baseUrl}/responses`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', input: 'Hi', max_output_tokens: 1, temperature: 0, metadata: { completion_webhook: webhook } }),
  });
  expect(res.status).toBe(200);
}

it("org B's callback arrives while org A's hanging receiver holds every attempt A may have", async () => {
  const keyA = await server.keyFor('org-a');
  const keyB = await server.keyFor('org-b');
  const hookA = receiverA.hook([], 'hang');
  const hookB = receiverB.hook();
  // More than the dispatcher ran at once before (16) and more than one receiver host may hold.
  for (let i = 0; i < 40; i++) await createResponse(keyA, hookA.url);
  await hookA.waitForCalls(8); // A's attempts are in flight and hanging
  await createResponse(keyB, hookB.url);
  await hookB.waitForCalls(1, 3 * TIMEOUT_MS);
  const timedOut = logs.filter((l) => String(l.fields['error'] ?? '').startsWith('timed out'));
  expect(timedOut).toEqual([]);
  // A's hanging receiver got calls, but no more than one host's share: the rest of A waits.
  expect(hookA.calls.length).toBeLessThanOrEqual(DEFAULT_WEBHOOK_SETTINGS.maxInFlightPerHost);
});
