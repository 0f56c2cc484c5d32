// Completion webhook deliveries under leases, with real dispatchers on every store kind
// (helpers/stores.ts): a delivery is leased to its dispatcher for one lease length and renewed
// while its attempt runs, so
//   - a dispatcher that dies mid-attempt (here: loses its database) frees the delivery within about
//     one lease length, not the 30 s attempt timeout (the cluster test's kill -9 once lost a
//     callback to that wait);
//   - a slow receiver keeps its delivery with the dispatcher calling it: no second dispatcher
//     sends it meanwhile;
//   - an attempt whose lease lapsed while its process stalled goes on, once (the process's next
//     claim takes the delivery back instead of starting a second attempt);
//   - an attempt whose delivery another process took over stops and writes nothing.
// On SQLite (a store one process owns) the next dispatcher hands the dead one's leases back at its
// start; on PostgreSQL the survivor finds them by polling once they expire.
import { afterEach, beforeEach, expect, it } from 'vitest';
import { leaseConfig } from '../src/store/leases.js';
import type { Store, WebhookDelivery } from '../src/store/store.js';
import { WebhookDispatcher, type WebhookLog } from '../src/jobs/webhook-deliveries.js';
import { deliveryRow, describeStores, type StoreUnderTest } from './helpers/stores.js';
import { startWebhookReceiver, type Hook, type WebhookReceiver } from './helpers/webhook-receiver.js';

/** Lease length of the dispatchers here: renewed every 100 ms. */
const TTL_MS = 300;

describeStores('webhook delivery leases', (kind) => {
  let t: StoreUnderTest;
  let receiver: WebhookReceiver;
  const dispatchers: WebhookDispatcher[] = [];
  let seq = 0;

  beforeEach(async () => {
    t = await kind.create();
    receiver = await startWebhookReceiver();
  });
  afterEach(async () => {
    await Promise.all(dispatchers.splice(0).map((d) => d.close()));
    await receiver.close();
    await t.dispose();
  });

  /** A log that keeps its messages (a dispatcher whose store is gone logs errors, as it should). */
  function recordingLog(): WebhookLog & { messages: string[] } {
    const messages: string[] = [];
    const keep = (_obj: object, msg: string) => void messages.push(msg);
    return { messages, info: keep, warn: keep, error: keep };
  }

  /** A dispatcher of replica `owner` on `store`, polling every 50 ms, with the default 30 s attempt timeout unless told. */
  async function dispatcher(store: Store, owner: string, log: WebhookLog, timeoutMs?: number): Promise<WebhookDispatcher> {
    const d = new WebhookDispatcher(store, {
      log, lease: leaseConfig(TTL_MS, owner), allowPrivateAddresses: true, pollIntervalMs: 50, baseDelayMs: 50,
      ...(timeoutMs !== undefined && { timeoutMs }),
    });
    dispatchers.push(d);
    await d.start();
    return d;
  }

  /** Stores a delivery to `hook`, due now. */
  async function deliveryTo(store: Store, hook: Hook): Promise<string> {
    const id = `whd_${String(seq++).padStart(4, '0')}`;
    const d: WebhookDelivery = {
      id, orgId: 'org_a', objectId: `resp_${id}`, url: hook.url, host: new URL(hook.url).host, token: null,
      body: JSON.stringify({ id: `resp_${id}`, status: 'completed' }), state: 'pending', attempts: 0,
      nextAttemptAtMs: Date.now(), lastError: null, createdAt: Math.floor(Date.now() / 1000),
    };
    await store.insertWebhookDelivery(d);
    return id;
  }

  /** Polls `check` every 20 ms until it holds; fails after `ms`. */
  async function eventually(what: string, check: () => Promise<boolean> | boolean, ms = 5_000): Promise<void> {
    const until = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > until) throw new Error(`not within ${ms} ms: ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  it('a dispatcher that dies mid-attempt frees its delivery within about a lease, long before its attempt would time out', async () => {
    const hook = receiver.hook(['hang'], 200);
    const dyingStore = await t.open();
    const id = await deliveryTo(t.store, hook);
    await dispatcher(dyingStore, 'rpl_dying', recordingLog());
    await hook.waitForCalls(1);
    expect(await deliveryRow(t, id)).toEqual({ state: 'pending', attempts: 0, owner: 'rpl_dying' });
    // Its process loses the database: it can neither renew nor record anything any more.
    await dyingStore.close();
    const survivorLog = recordingLog();
    await dispatcher(t.store, 'rpl_survivor', survivorLog);
    // The first attempt hangs for its 30 s timeout; the second call comes from the survivor.
    await hook.waitForCalls(2, 5_000);
    await eventually('the survivor recorded the delivery', async () => (await deliveryRow(t, id)).state === 'delivered');
    expect(await deliveryRow(t, id)).toEqual({ state: 'delivered', attempts: 1, owner: null });
    expect(survivorLog.messages.filter((m) => /could not|failed/.test(m))).toEqual([]);
  });

  it('a slow receiver keeps its delivery: while the attempt runs past many lease lengths no other dispatcher sends it', async () => {
    const hook = receiver.hook(['hang'], 200);
    const log = recordingLog();
    // Two replicas, both started before the delivery exists (on SQLite a start hands back every lease, as a lone process's does).
    const both = [await dispatcher(t.store, 'rpl_one', log, 1_500), await dispatcher(await t.open(), 'rpl_two', log, 1_500)];
    const id = await deliveryTo(t.store, hook);
    // Both look all the while (on SQLite a dispatcher looks again only when woken).
    const waking = setInterval(() => both.forEach((d) => d.wake()), 20);
    try {
      await hook.waitForCalls(1);
      // The hanging attempt times out after 1.5 s (five lease lengths) and is recorded as failed by
      // the dispatcher that made it; the retry gets the 200.
      await hook.waitForCalls(2, 10_000);
      await eventually('the retry recorded', async () => (await deliveryRow(t, id)).state === 'delivered');
    } finally {
      clearInterval(waking);
    }
    // Taken over during the hang instead, it would have been delivered at the first attempt, and the
    // timed-out attempt's failure refused by the fence.
    expect(hook.calls).toHaveLength(2);
    expect(await deliveryRow(t, id)).toEqual({ state: 'delivered', attempts: 2, owner: null });
    expect(log.messages).toContain('completion webhook attempt failed; will retry');
    expect(log.messages.filter((m) => /not recorded|stopped/.test(m))).toEqual([]);
  });

  it('an attempt that outlives its lease while the process stalls is not started a second time by the same process', async () => {
    const hook = receiver.hook(['hang'], 200);
    const id = await deliveryTo(t.store, hook);
    const log = recordingLog();
    const d = await dispatcher(t.store, 'rpl_stalling', log, 1_500);
    await hook.waitForCalls(1);
    // The event loop stalls for two lease lengths: no renewal runs, and the lease lapses.
    const until = Date.now() + 2 * TTL_MS;
    while (Date.now() < until) { /* stalled */ }
    // The first look after the stall claims the delivery again (on SQLite before any renewal can run).
    d.wake();
    await hook.waitForCalls(2, 10_000);
    await eventually('the retry recorded', async () => (await deliveryRow(t, id)).state === 'delivered');
    // One attempt timed out and was recorded, then the retry: no second attempt during the hang.
    expect(hook.calls).toHaveLength(2);
    expect(await deliveryRow(t, id)).toEqual({ state: 'delivered', attempts: 2, owner: null });
    expect(log.messages.filter((m) => /not recorded|stopped/.test(m))).toEqual([]);
  });

  it('an attempt whose delivery another process took over stops, and writes nothing', async () => {
    const hook = receiver.hook(['hang'], 200);
    const id = await deliveryTo(t.store, hook);
    const log = recordingLog();
    await dispatcher(t.store, 'rpl_stalled', log);
    await hook.waitForCalls(1);
    // Another replica took the delivery over (as after a stall past the lease), behind this one's back.
    await t.exec(`UPDATE webhook_deliveries SET lease_owner = 'rpl_other', leased_until_ms = ${Date.now() + 60_000},
                    next_attempt_at_ms = ${Date.now() + 60_000} WHERE id = '${id}'`);
    await eventually('the attempt stopped', () => log.messages.includes('completion webhook attempt stopped: another process took the delivery over'));
    expect(await deliveryRow(t, id)).toEqual({ state: 'pending', attempts: 0, owner: 'rpl_other' });
    expect(hook.calls).toHaveLength(1);
  });
});
