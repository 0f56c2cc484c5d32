// The store's fair claim of webhook deliveries (issue 11, point 6), on every store kind
// (helpers/stores.ts: SQLite, and PostgreSQL when configured): round robin over organizations,
// per-organization and per-host caps counted from unexpired leases (whatever process holds them),
// leases that expire, are renewed by their holder and fence its outcome, leases handed back at a
// lone process's start, and tokens forgotten at the end.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { LeaseTerm } from '../src/store/leases.js';
import type { Store, WebhookDelivery } from '../src/store/store.js';
import { deliveryRow, describeStores, type StoreUnderTest } from './helpers/stores.js';

describeStores('webhook claims', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  let seq = 0;

  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
  });
  afterEach(async () => {
    await t.dispose();
  });

  /** token of each delivery, read straight from the database (the store has no listing method). */
  async function tokens(): Promise<Record<string, string | null>> {
    const rows = (await t.rows('SELECT id, token FROM webhook_deliveries')) as { id: string; token: string | null }[];
    return Object.fromEntries(rows.map((r) => [r.id, r.token]));
  }

  const NOW = 1_000_000;
  const LEASE = NOW + 30_000;
  const WIDE = { perOrg: 100, perHost: 100 };
  /** A claim at `nowMs` by replica `owner`, leased until `untilMs`. */
  const at = (nowMs: number, untilMs = LEASE, owner = 'rpl_a'): LeaseTerm => ({ owner, nowMs, untilMs });

  /** Stores a pending delivery of `org` to `host`, due `ageMs` before NOW (older first). */
  async function due(org: string, host: string, ageMs = 0, token: string | null = null): Promise<string> {
    const id = `whd_${String(seq++).padStart(4, '0')}`;
    const d: WebhookDelivery = {
      id, orgId: org, objectId: `resp_${id}`, url: `https://${host}/hook`, host, token, body: '{}',
      state: 'pending', attempts: 0, nextAttemptAtMs: NOW - ageMs, lastError: null, createdAt: 1,
    };
    await store.insertWebhookDelivery(d);
    return id;
  }

  const orgsOf = (claimed: WebhookDelivery[]) => claimed.map((d) => d.orgId);

  describe('claim order', () => {
    it('round robin over organizations, oldest first within each round', async () => {
      for (let i = 0; i < 5; i++) await due('A', `a${i}.example`, 1000 - i); // A's backlog is the oldest
      await due('B', 'b.example', 10);
      await due('B', 'b.example', 5);
      await due('C', 'c.example', 1);
      expect(orgsOf(await store.claimDueWebhookDeliveries(at(NOW), 5, WIDE))).toEqual(['A', 'B', 'C', 'A', 'B']);
    });

    it('a claimed delivery is leased: not due again until the lease ends, and then no longer in flight', async () => {
      const id = await due('A', 'a.example');
      expect((await store.claimDueWebhookDeliveries(at(NOW), 10, WIDE)).map((d) => d.id)).toEqual([id]);
      expect(await store.claimDueWebhookDeliveries(at(NOW + 1), 10, WIDE)).toEqual([]);
      expect(await store.nextWebhookAttemptMs(NOW)).toBe(LEASE);
      // The process holding it died: at the lease's end it is due again, and counts as in flight no more.
      const again = await store.claimDueWebhookDeliveries(at(LEASE, LEASE + 30_000), 10, { perOrg: 1, perHost: 1 });
      expect(again.map((d) => d.id)).toEqual([id]);
    });
  });

  describe('caps', () => {
    it('an organization never goes above its cap, counting leases already held', async () => {
      for (let i = 0; i < 6; i++) await due('A', `a${i}.example`, 100 - i);
      await due('B', 'b.example');
      expect(orgsOf(await store.claimDueWebhookDeliveries(at(NOW), 10, { perOrg: 2, perHost: 10 }))).toEqual(['A', 'B', 'A']);
      expect(await store.claimDueWebhookDeliveries(at(NOW + 1), 10, { perOrg: 2, perHost: 10 })).toEqual([]);
      expect(orgsOf(await store.claimDueWebhookDeliveries(at(NOW + 1), 10, { perOrg: 3, perHost: 10 }))).toEqual(['A']);
    });

    it('a receiver host never goes above its cap, shared round robin by its organizations', async () => {
      for (let i = 0; i < 4; i++) await due('A', 'shared.example', 100 - i);
      await due('B', 'shared.example', 1);
      const claimed = await store.claimDueWebhookDeliveries(at(NOW), 10, { perOrg: 10, perHost: 2 });
      expect(orgsOf(claimed)).toEqual(['A', 'B']); // B's one delivery is not behind A's backlog
      expect(await store.claimDueWebhookDeliveries(at(NOW + 1), 10, { perOrg: 10, perHost: 2 })).toEqual([]);
    });

    it("deliveries held back by a full host do not use up their organization's cap", async () => {
      for (let i = 0; i < 5; i++) await due('A', 'slow.example', 100 - i);
      const fast = await due('A', 'fast.example', 1);
      const claimed = await store.claimDueWebhookDeliveries(at(NOW), 10, { perOrg: 2, perHost: 1 });
      expect(claimed.map((d) => d.host)).toEqual(['slow.example', 'fast.example']);
      expect(claimed[1]!.id).toBe(fast);
    });
  });

  describe('leases', () => {
    it('renewal extends only what its holder still holds; after a takeover the old holder writes nothing', async () => {
      const id = await due('A', 'a.example');
      expect((await store.claimDueWebhookDeliveries(at(NOW, NOW + 1_000, 'rpl_a'), 10, WIDE)).map((d) => d.id)).toEqual([id]);
      expect(await deliveryRow(t, id)).toEqual({ state: 'pending', attempts: 0, owner: 'rpl_a' });
      // Renewed while its attempt runs: not due at the first lease's end.
      expect(await store.renewWebhookLeases(at(NOW + 500, NOW + 1_500, 'rpl_a'))).toEqual([id]);
      expect(await store.nextWebhookAttemptMs(NOW)).toBe(NOW + 1_500);
      expect(await store.claimDueWebhookDeliveries(at(NOW + 1_000, NOW + 2_000, 'rpl_b'), 10, WIDE)).toEqual([]);
      expect(await store.renewWebhookLeases(at(NOW + 1_000, NOW + 2_000, 'rpl_b'))).toEqual([]);
      // rpl_a stalled past its lease: rpl_b takes the delivery over.
      expect((await store.claimDueWebhookDeliveries(at(NOW + 2_500, NOW + 3_500, 'rpl_b'), 10, WIDE)).map((d) => d.id)).toEqual([id]);
      expect(await store.renewWebhookLeases(at(NOW + 2_600, NOW + 3_600, 'rpl_a'))).toEqual([]);
      expect(await store.updateWebhookDelivery(id, 'rpl_a', { state: 'failed', attempts: 4, nextAttemptAtMs: NOW, lastError: 'late' })).toBe(false);
      expect(await deliveryRow(t, id)).toEqual({ state: 'pending', attempts: 0, owner: 'rpl_b' });
      expect(await store.updateWebhookDelivery(id, 'rpl_b', { state: 'delivered', attempts: 1, nextAttemptAtMs: NOW, lastError: null })).toBe(true);
      expect(await deliveryRow(t, id)).toEqual({ state: 'delivered', attempts: 1, owner: null });
      // An ended delivery is renewed by no one.
      expect(await store.renewWebhookLeases(at(NOW + 3_000, NOW + 4_000, 'rpl_b'))).toEqual([]);
    });

    it('handing back every lease (a lone process starting) makes leased deliveries due at once, and leaves waiting retries as they are', async () => {
      const leased = [await due('A', 'a.example'), await due('B', 'b.example')];
      const retry = await due('C', 'c.example', -60_000); // its next attempt is a minute away
      expect((await store.claimDueWebhookDeliveries(at(NOW), 10, WIDE)).map((d) => d.id).sort()).toEqual(leased);
      expect(await store.releaseAllWebhookLeases(NOW + 5)).toBe(2);
      expect(await deliveryRow(t, leased[0]!)).toEqual({ state: 'pending', attempts: 0, owner: null });
      expect((await store.claimDueWebhookDeliveries(at(NOW + 5, LEASE, 'rpl_b'), 10, WIDE)).map((d) => d.id).sort()).toEqual(leased);
      expect(await deliveryRow(t, retry)).toEqual({ state: 'pending', attempts: 0, owner: null });
      expect(await store.nextWebhookAttemptMs(LEASE)).toBe(NOW + 60_000);
    });
  });

  describe('outcomes', () => {
    it('ending a delivery forgets its token and its lease; a retry keeps the token', async () => {
      const retried = await due('A', 'a.example', 0, 'tok-a');
      const delivered = await due('B', 'b.example', 0, 'tok-b');
      const failed = await due('C', 'c.example', 0, 'tok-c');
      await store.claimDueWebhookDeliveries(at(NOW), 10, WIDE);
      await store.updateWebhookDelivery(retried, 'rpl_a', { state: 'pending', attempts: 1, nextAttemptAtMs: NOW + 10, lastError: 'HTTP 500' });
      await store.updateWebhookDelivery(delivered, 'rpl_a', { state: 'delivered', attempts: 1, nextAttemptAtMs: NOW, lastError: null });
      await store.updateWebhookDelivery(failed, 'rpl_a', { state: 'failed', attempts: 4, nextAttemptAtMs: NOW, lastError: 'HTTP 500' });
      expect(await tokens()).toEqual({ [retried]: 'tok-a', [delivered]: null, [failed]: null });
      const [again] = await store.claimDueWebhookDeliveries(at(NOW + 10), 10, { perOrg: 1, perHost: 1 });
      expect(again).toMatchObject({ id: retried, token: 'tok-a', attempts: 1 });
      await store.updateWebhookDelivery(retried, 'rpl_a', { state: 'delivered', attempts: 2, nextAttemptAtMs: NOW, lastError: null });
      expect((await tokens())[retried]).toBeNull();
      expect(await store.nextWebhookAttemptMs(0)).toBeUndefined();
    });
  });
});
