// Leases (store/leases.ts) on every store kind: background jobs claimed asap > standard > flex then
// oldest first, never twice at once (two stores on the same data, i.e. two replicas), taken over
// after their lease expires; renewals that report the jobs lost; the fence that refuses a stale
// owner's end and writes nothing; a cancel of a job leased elsewhere; hand-backs; and in-progress
// idempotency keys taken over after their lease expires. Times are explicit (lease terms with their
// own nowMs), never waited for.
import { afterEach, beforeEach, expect, it } from 'vitest';
import type { LeaseTerm } from '../src/store/leases.js';
import type { BackgroundJob, Store, UsageRecord, WebhookDelivery } from '../src/store/store.js';
import { describeStores, type StoreUnderTest } from './helpers/stores.js';

const term = (owner: string, nowMs: number, ttlMs = 1_000): LeaseTerm => ({ owner, nowMs, untilMs: nowMs + ttlMs });
/** Far in the past: a lease that any claim may take. */
const EXPIRED = term('rpl_dead', 0, 1);

function usage(orgId: string, requestId: string): UsageRecord {
  return {
    id: `use_${requestId}`, orgId, orgName: 'o', keyId: 'key_1', model: 'm', tier: 'standard', surface: 'responses', requestId,
    inputTokens: 1, cachedTokens: 0, outputTokens: 1, inputCost: '0', cachedCost: '0', outputCost: '0', cost: '0',
    longContext: false, completedAtMs: 1_700_000_000_000,
  };
}

function delivery(id: string, orgId: string, objectId: string): WebhookDelivery {
  return {
    id, orgId, objectId, url: 'https://hooks.example/cb', host: 'hooks.example', token: 'tok', body: `{"id":"${objectId}"}`,
    state: 'pending', attempts: 0, nextAttemptAtMs: 5_000, lastError: null, createdAt: 1,
  };
}

describeStores('leases', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  let org: string;
  const job = (id: string, createdAt: number, window: BackgroundJob['window'] = 'standard'): BackgroundJob => ({
    responseId: id, orgId: org, deadlineAt: 1_700_000_600, request: { model: 'm', metadata: { n: id } }, createdAt, window,
  });
  const insert = (id: string, createdAt: number, window: BackgroundJob['window'], lease: LeaseTerm, s = store) =>
    s.insertBackgroundResponse({ id, status: 'in_progress', created_at: createdAt }, job(id, createdAt, window), lease);
  const end = (id: string, owner: string, status = 'completed') => ({
    response: { orgId: org, kind: 'background' as const, leaseOwner: owner, body: { id, status } },
    usage: usage(org, id),
    delivery: delivery(`whd_${id}_${owner}`, org, id),
  });

  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
    org = (await store.ensureOrganization('o')).id;
  });
  afterEach(async () => { await t.dispose(); });

  it('claims free and expired jobs asap before standard before flex, oldest first, each once', async () => {
    await insert('resp_flex_old', 10, 'flex', EXPIRED);
    await insert('resp_std_new', 30, 'standard', EXPIRED);
    await insert('resp_asap_new', 40, 'asap', EXPIRED);
    await insert('resp_std_old', 20, 'standard', EXPIRED);
    await insert('resp_held', 5, 'asap', term('rpl_alive', 1_000));
    const first = await store.claimBackgroundJobs(term('rpl_a', 1_500), 2);
    expect(first.map((j) => j.responseId)).toEqual(['resp_asap_new', 'resp_std_old']);
    expect(first[0]).toEqual(job('resp_asap_new', 40, 'asap'));
    const rest = await store.claimBackgroundJobs(term('rpl_b', 1_500), 10);
    expect(rest.map((j) => j.responseId)).toEqual(['resp_std_new', 'resp_flex_old']);
    expect(await store.claimBackgroundJobs(term('rpl_c', 1_500), 10)).toEqual([]);
    // resp_held's lease runs out at 2000: then it is the first job a claim takes.
    expect((await store.claimBackgroundJobs(term('rpl_c', 2_000), 1)).map((j) => j.responseId)).toEqual(['resp_held']);
  });

  it('two stores on the same data (two replicas) claiming at once never get the same job', async () => {
    const second = await t.open();
    for (let i = 0; i < 40; i++) await insert(`resp_${String(i).padStart(2, '0')}`, 100 + i, (['asap', 'standard', 'flex'] as const)[i % 3], EXPIRED);
    const claimers = [store, second, store, second, store, second];
    const rounds = await Promise.all(claimers.map(async (s, i) => {
      const taken: string[] = [];
      for (let round = 0; round < 4; round++) taken.push(...(await s.claimBackgroundJobs(term(`rpl_${i}`, 1_000), 3)).map((j) => j.responseId));
      return taken;
    }));
    const all = rounds.flat();
    expect(new Set(all).size).toBe(all.length);
    expect(all).toHaveLength(40);
  });

  it('a job whose lease expired is taken over; the stale owner learns it at renewal and its end writes nothing', async () => {
    await insert('resp_1', 10, 'standard', term('rpl_a', 1_000)); // held by A until 2000
    expect(await store.claimBackgroundJobs(term('rpl_b', 1_999), 5)).toEqual([]);
    expect(await store.renewLeases(term('rpl_a', 1_500))).toEqual(['resp_1']); // now until 2500
    expect(await store.claimBackgroundJobs(term('rpl_b', 2_400), 5)).toEqual([]);
    // A stalls past its lease: B takes the job over.
    expect((await store.claimBackgroundJobs(term('rpl_b', 2_500), 5)).map((j) => j.responseId)).toEqual(['resp_1']);
    expect(await store.renewLeases(term('rpl_a', 2_600))).toEqual([]);
    expect(await store.renewLeases(term('rpl_b', 2_600))).toEqual(['resp_1']);

    // A's end is fenced off: no response update, no ledger row, no delivery, the job stays B's.
    expect(await store.commitRequestEnd(end('resp_1', 'rpl_a'))).toEqual({ batchResultRecorded: false, backgroundLeaseLost: true });
    expect(await store.getResponse(org, 'resp_1')).toMatchObject({ status: 'in_progress' });
    expect(await store.listUsage({})).toEqual([]);
    expect(await store.countPendingWebhookDeliveries()).toBe(0);
    expect((await store.listBackgroundJobs()).map((j) => j.responseId)).toEqual(['resp_1']);

    // B's end is written whole, once; a late end of A after it still writes nothing.
    expect(await store.commitRequestEnd(end('resp_1', 'rpl_b'))).toEqual({ batchResultRecorded: false });
    expect(await store.getResponse(org, 'resp_1')).toMatchObject({ status: 'completed' });
    expect(await store.listUsage({})).toHaveLength(1);
    expect(await store.countPendingWebhookDeliveries()).toBe(1);
    expect(await store.listBackgroundJobs()).toEqual([]);
    expect(await store.commitRequestEnd(end('resp_1', 'rpl_a', 'failed'))).toMatchObject({ backgroundLeaseLost: true });
    expect(await store.getResponse(org, 'resp_1')).toMatchObject({ status: 'completed' });
    expect(await store.listUsage({})).toHaveLength(1);
  });

  it('a cancel of a job leased elsewhere stores it cancelled at once; its owner loses the job', async () => {
    await insert('resp_1', 10, 'standard', term('rpl_a', 1_000));
    await insert('resp_2', 11, 'standard', term('rpl_a', 1_000));
    const cancelled = { id: 'resp_1', status: 'cancelled', created_at: 10 };
    expect(await store.cancelBackgroundResponse(org, cancelled, delivery('whd_c', org, 'resp_1'))).toBe(true);
    expect(await store.getResponse(org, 'resp_1')).toEqual(cancelled);
    expect(await store.countPendingWebhookDeliveries()).toBe(1);
    expect(await store.renewLeases(term('rpl_a', 1_100))).toEqual(['resp_2']);
    expect(await store.commitRequestEnd(end('resp_1', 'rpl_a'))).toMatchObject({ backgroundLeaseLost: true });
    expect(await store.getResponse(org, 'resp_1')).toEqual(cancelled);
    expect(await store.listUsage({})).toEqual([]);
    // Gone or already ended: nothing is written.
    expect(await store.cancelBackgroundResponse(org, cancelled, delivery('whd_c2', org, 'resp_1'))).toBe(false);
    expect(await store.cancelBackgroundResponse('org_other', { id: 'resp_2', status: 'cancelled' })).toBe(false);
    expect(await store.countPendingWebhookDeliveries()).toBe(1);
    expect(await store.getBackgroundJob(org, 'resp_2')).toEqual(job('resp_2', 11));
    expect(await store.getBackgroundJob('org_other', 'resp_2')).toBeUndefined();
  });

  it('hands leases back: an owner\'s at close, one job\'s, everyone\'s at a lone store\'s start', async () => {
    await insert('resp_a1', 10, 'standard', term('rpl_a', 1_000, 60_000));
    await insert('resp_b1', 11, 'standard', term('rpl_b', 1_000, 60_000));
    await store.beginIdempotency(org, 'messages', 'k_a', 'h', 1, term('rpl_a', 1_000, 60_000));
    await store.releaseLeases('rpl_a');
    expect((await store.claimBackgroundJobs(term('rpl_c', 2_000), 5)).map((j) => j.responseId)).toEqual(['resp_a1']);
    expect(await store.beginIdempotency(org, 'messages', 'k_a', 'h', 2, term('rpl_c', 2_000))).toEqual({ state: 'new' });
    // One job, only while the owner named holds it.
    await store.releaseBackgroundJob('resp_b1', 'rpl_a');
    expect(await store.claimBackgroundJobs(term('rpl_c', 2_000), 5)).toEqual([]);
    await store.releaseBackgroundJob('resp_b1', 'rpl_b');
    expect((await store.claimBackgroundJobs(term('rpl_c', 2_000), 5)).map((j) => j.responseId)).toEqual(['resp_b1']);
    await store.releaseAllLeases();
    expect((await store.claimBackgroundJobs(term('rpl_d', 2_000), 5)).map((j) => j.responseId)).toEqual(['resp_a1', 'resp_b1']);
  });

  it('an in-progress idempotency key is renewed by its owner and taken over once its lease expires', async () => {
    const second = await t.open();
    expect(await store.beginIdempotency(org, 'messages', 'k', 'h', 1, term('rpl_a', 1_000))).toEqual({ state: 'new' });
    expect(await second.beginIdempotency(org, 'messages', 'k', 'h', 1, term('rpl_b', 1_900))).toEqual({ state: 'in_progress' });
    await store.renewLeases(term('rpl_a', 1_500)); // until 2500
    expect(await second.beginIdempotency(org, 'messages', 'k', 'h', 1, term('rpl_b', 2_400))).toEqual({ state: 'in_progress' });
    expect(await second.beginIdempotency(org, 'messages', 'k', 'other-body', 1, term('rpl_b', 3_000))).toEqual({ state: 'mismatch' });
    // A died: two requests race for the expired key, one of them runs it.
    const raced = await Promise.all([store, second, store, second].map((s, i) =>
      s.beginIdempotency(org, 'messages', 'k', 'h', 1, term(`rpl_${i}`, 3_000))));
    expect(raced.filter((b) => b.state === 'new')).toHaveLength(1);
    expect(raced.filter((b) => b.state === 'in_progress')).toHaveLength(3);
    await store.completeIdempotency(org, 'messages', 'k', 200, { id: 'msg_1' });
    expect(await second.beginIdempotency(org, 'messages', 'k', 'h', 1, term('rpl_b', 99_000))).toEqual({ state: 'done', statusCode: 200, body: { id: 'msg_1' } });
  });

  it('a stale owner\'s idempotent end writes nothing, and its abandon leaves the key to the replica that took it over', async () => {
    const second = await t.open();
    const idemEnd = (owner: string, id: string) => ({
      usage: { ...usage(org, id), surface: 'messages' },
      idempotency: { orgId: org, scope: 'messages', key: 'k2', statusCode: 200, body: { id }, leaseOwner: owner },
    });
    expect(await store.beginIdempotency(org, 'messages', 'k2', 'h', 1, term('rpl_a', 1_000))).toEqual({ state: 'new' });
    // rpl_a stalls past its lease; rpl_b takes the key over.
    expect(await second.beginIdempotency(org, 'messages', 'k2', 'h', 1, term('rpl_b', 5_000))).toEqual({ state: 'new' });
    expect(await store.commitRequestEnd(idemEnd('rpl_a', 'msg_a'))).toMatchObject({ idempotencyLeaseLost: true });
    await store.abandonIdempotency(org, 'messages', 'k2', 'rpl_a');
    expect(await t.rows(`SELECT request_id FROM usage_ledger WHERE surface = 'messages'`)).toEqual([]);
    // Still rpl_b's: a third caller waits, and rpl_b's end is the key's result.
    expect(await store.beginIdempotency(org, 'messages', 'k2', 'h', 1, term('rpl_c', 5_500))).toEqual({ state: 'in_progress' });
    expect(await second.commitRequestEnd(idemEnd('rpl_b', 'msg_b'))).not.toHaveProperty('idempotencyLeaseLost');
    expect(await store.beginIdempotency(org, 'messages', 'k2', 'h', 1, term('rpl_c', 6_000))).toEqual({ state: 'done', statusCode: 200, body: { id: 'msg_b' } });
    // Completed: a second end for the key (rpl_b again, or anyone) is refused too.
    expect(await second.commitRequestEnd(idemEnd('rpl_b', 'msg_b2'))).toMatchObject({ idempotencyLeaseLost: true });
    expect((await t.rows(`SELECT request_id FROM usage_ledger WHERE surface = 'messages'`)).map((r) => r['request_id'])).toEqual(['msg_b']);
  });
});
