// Every Store method the other store tests leave out, on every store kind (helpers/stores.ts:
// SQLite, and PostgreSQL when configured), with the same expectations for both: keys and admin
// flags, input items and deletion, file listing, abandoned idempotency keys, background jobs, the
// one-transaction request end (all of it or nothing), the usage ledger's exact numbers and
// filters, reclaimSpace; and races between two stores on the same data (two processes or
// replicas) that constraints and compare-and-set settle: one winner, one row.
import { afterEach, beforeEach, expect, it } from 'vitest';
import type { BatchRecord } from '../src/store/batch-records.js';
import type { FileRecord, Store, UsageRecord, WebhookDelivery } from '../src/store/store.js';
import { describeStores, HELD, type StoreUnderTest } from './helpers/stores.js';

function usage(orgId: string, orgName: string, requestId: string, over: Partial<UsageRecord> = {}): UsageRecord {
  return {
    id: `use_${requestId}`, orgId, orgName, keyId: 'key_1', model: 'm', tier: 'asap', surface: 'responses', requestId,
    inputTokens: 10, cachedTokens: 4, outputTokens: 3, inputCost: '0.000001', cachedCost: '0.0000002', outputCost: '0.000003',
    cost: '0.0000042', longContext: false, completedAtMs: 1_700_000_000_000, ...over,
  };
}

function delivery(id: string, orgId: string, objectId: string): WebhookDelivery {
  return {
    id, orgId, objectId, url: 'https://hooks.example/cb', host: 'hooks.example', token: 'tok', body: `{"id":"${objectId}"}`,
    state: 'pending', attempts: 0, nextAttemptAtMs: 5_000, lastError: null, createdAt: 1,
  };
}

function batch(id: string, orgId: string): BatchRecord {
  return {
    id, orgId, orgName: 'o', keyId: 'k', endpoint: '/v1/responses', inputFileId: 'file-00000000', completionWindow: 'flex',
    status: 'in_progress', errors: null, outputFileId: null, errorFileId: null, metadata: null,
    requestCounts: { total: 2, completed: 0, failed: 0 }, progress: { nextLine: 1, nextOffset: 0 }, createdAt: 100, expiresAt: 200,
    inProgressAt: 100, finalizingAt: null, completedAt: null, failedAt: null, expiredAt: null, cancellingAt: null, cancelledAt: null,
  };
}

const file = (id: string, orgId: string, purpose: string, bytes = 10): FileRecord => ({
  id, orgId, bytes, createdAt: 1_700_000_000, filename: `${id}.jsonl`, purpose, status: 'processed', statusDetails: null,
});

describeStores('store contract', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  let org: string;
  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
    org = (await store.ensureOrganization('o')).id;
  });
  afterEach(async () => {
    await t.dispose();
  });

  it('organizations, keys, revocation and admin flags', async () => {
    expect(await store.getOrganizationByName('nobody')).toBeUndefined();
    expect(await store.getOrganizationByName('o')).toMatchObject({ id: org, name: 'o' });
    await store.insertApiKey({ id: 'key_a', orgId: org, hash: 'hash-a', prefix: 'sk-a', createdAt: 10 });
    await store.insertApiKey({ id: 'key_b', orgId: org, hash: 'hash-b', prefix: 'sk-b', createdAt: 20 });
    await expect(store.insertApiKey({ id: 'key_c', orgId: org, hash: 'hash-a', prefix: 'sk-c', createdAt: 30 })).rejects.toThrow();
    expect(await store.findActiveKeyByHash('hash-a')).toEqual({ id: 'key_a', orgId: org, orgName: 'o', prefix: 'sk-a', createdAt: 10, revokedAt: null });
    expect(await store.countActiveApiKeys()).toBe(2);
    expect(await store.isAdminKey('key_a')).toBe(false);
    expect(await store.setApiKeyAdmin('key_a', true)).toBe(true);
    expect(await store.setApiKeyAdmin('key_missing', true)).toBe(false);
    expect(await store.isAdminKey('key_a')).toBe(true);
    expect(await store.revokeApiKey('key_a', 50)).toBe(true); // by id
    expect(await store.revokeApiKey('key_a', 60)).toBe(false); // already revoked
    expect(await store.revokeApiKey('hash-b', 70)).toBe(true); // by the key's hash
    expect(await store.findActiveKeyByHash('hash-a')).toBeUndefined();
    expect(await store.isAdminKey('key_a')).toBe(false); // a revoked key is no admin
    expect(await store.countActiveApiKeys()).toBe(0);
    expect((await store.listApiKeys()).map((k) => [k.id, k.revokedAt])).toEqual([['key_a', 50], ['key_b', 70]]);
  });

  it('input items per organization, replaced when written again, deleted with their response', async () => {
    const other = (await store.ensureOrganization('other')).id;
    await store.insertResponse(org, { id: 'resp_1', status: 'completed' });
    await store.putResponseInput(org, 'resp_1', [{ type: 'message', role: 'user', content: 'hi' }]);
    await store.putResponseInput(org, 'resp_1', [{ type: 'message', role: 'user', content: 'again' }]);
    expect(await store.getResponseInput(org, 'resp_1')).toEqual([{ type: 'message', role: 'user', content: 'again' }]);
    expect(await store.getResponseInput(other, 'resp_1')).toBeUndefined();
    expect(await store.deleteResponse(other, 'resp_1')).toBe(false);
    expect(await store.getResponse(org, 'resp_1')).toBeDefined();
    expect(await store.deleteResponse(org, 'resp_1')).toBe(true);
    expect(await store.getResponse(org, 'resp_1')).toBeUndefined();
    expect(await store.getResponseInput(org, 'resp_1')).toBeUndefined();
    expect(await store.deleteResponse(org, 'resp_1')).toBe(false);
  });

  it('files: newest first, by purpose, after a cursor, per organization', async () => {
    const other = (await store.ensureOrganization('other')).id;
    const big = 2 ** 40 + 7; // a byte count past 32 bits comes back exactly
    await store.insertFile(file('file-1', org, 'batch', big));
    await store.insertFile(file('file-2', org, 'user_data'));
    await store.insertFile(file('file-3', org, 'batch'));
    await store.insertFile(file('file-4', other, 'batch'));
    const ids = async (opts: { limit: number; purpose?: string; after?: string }) => (await store.listFiles(org, opts)).map((f) => f.id);
    expect(await ids({ limit: 10 })).toEqual(['file-3', 'file-2', 'file-1']);
    expect(await ids({ limit: 2 })).toEqual(['file-3', 'file-2']);
    expect(await ids({ limit: 10, purpose: 'batch' })).toEqual(['file-3', 'file-1']);
    expect(await ids({ limit: 10, after: 'file-2' })).toEqual(['file-1']);
    expect(await ids({ limit: 10, after: 'file-4' })).toEqual(['file-3', 'file-2', 'file-1']); // another org's cursor is ignored
    expect(await store.getFile(org, 'file-1')).toEqual(file('file-1', org, 'batch', big));
    expect(await store.getFile(org, 'file-4')).toBeUndefined();
    expect(await store.deleteFile(org, 'file-4')).toBe(false);
    expect(await store.deleteFile(org, 'file-1')).toBe(true);
    expect(await store.getFile(org, 'file-1')).toBeUndefined();
  });

  it('abandons only an in-progress idempotency key', async () => {
    await store.beginIdempotency(org, 'messages', 'pending', 'h', 1, HELD);
    await store.beginIdempotency(org, 'messages', 'done', 'h', 1, HELD);
    await store.completeIdempotency(org, 'messages', 'done', 201, { ok: true });
    await store.abandonIdempotency(org, 'messages', 'pending');
    await store.abandonIdempotency(org, 'messages', 'done');
    expect(await store.beginIdempotency(org, 'messages', 'pending', 'h2', 2, HELD)).toEqual({ state: 'new' });
    expect(await store.beginIdempotency(org, 'messages', 'done', 'h', 2, HELD)).toEqual({ state: 'done', statusCode: 201, body: { ok: true } });
  });

  it('background jobs: stored with their response, listed in order, dropped when finished', async () => {
    const job = (id: string, createdAt: number) => ({
      responseId: id, orgId: org, deadlineAt: 1_700_000_600, request: { model: 'm', input: [1, 2] }, createdAt, window: 'standard' as const,
    });
    await store.insertBackgroundResponse({ id: 'resp_b', status: 'in_progress' }, job('resp_b', 20), HELD);
    await store.insertBackgroundResponse({ id: 'resp_a', status: 'in_progress' }, job('resp_a', 10), HELD);
    await store.insertBackgroundResponse({ id: 'resp_c', status: 'in_progress' }, job('resp_c', 30), HELD);
    expect(await store.listBackgroundJobs()).toEqual([job('resp_a', 10), job('resp_b', 20), job('resp_c', 30)]);
    // A job and its response are one write: a duplicate id stores neither.
    await expect(store.insertBackgroundResponse({ id: 'resp_a', status: 'in_progress' }, job('resp_a', 40), HELD)).rejects.toThrow();
    expect(await store.listBackgroundJobs()).toHaveLength(3);
    await store.finishBackgroundResponse(org, { id: 'resp_a', status: 'completed' });
    expect(await store.getResponse(org, 'resp_a')).toEqual({ id: 'resp_a', status: 'completed' });
    await store.commitRequestEnd({ response: { orgId: org, kind: 'background', leaseOwner: HELD.owner, body: { id: 'resp_b', status: 'failed' } } });
    expect(await store.getResponse(org, 'resp_b')).toEqual({ id: 'resp_b', status: 'failed' });
    expect((await store.listBackgroundJobs()).map((j) => j.responseId)).toEqual(['resp_c']);
  });

  it('commits a request end whole, or nothing of it', async () => {
    await store.insertBatch(batch('batch_1', org));
    await store.beginIdempotency(org, 'messages', 'idem', 'h', 1, HELD);
    const end = {
      response: { orgId: org, kind: 'foreground' as const, body: { id: 'resp_1', status: 'completed', created_at: 1_700_000_000 } },
      usage: usage(org, 'o', 'resp_1'),
      delivery: delivery('whd_1', org, 'resp_1'),
      idempotency: { orgId: org, scope: 'messages', key: 'idem', statusCode: 200, body: { id: 'resp_1' } },
      batchResult: { batchId: 'batch_1', result: { lineNo: 1, ok: true, line: '{"a":1}' }, progress: { nextLine: 2, nextOffset: 8 } },
    };
    expect(await store.commitRequestEnd(end)).toEqual({ batchResultRecorded: true });
    expect(await store.getResponse(org, 'resp_1')).toEqual(end.response.body);
    expect(await store.listUsage({})).toEqual([end.usage]);
    expect(await store.countPendingWebhookDeliveries()).toBe(1);
    expect(await store.beginIdempotency(org, 'messages', 'idem', 'h', 2, HELD)).toEqual({ state: 'done', statusCode: 200, body: { id: 'resp_1' } });
    expect((await store.getBatch(org, 'batch_1'))!.requestCounts.completed).toBe(1);

    // The same request's end again (a run after a restart): the response insert fails, so nothing
    // else of it is written either: no second ledger row, delivery or count.
    await expect(store.commitRequestEnd({ ...end, usage: { ...end.usage, id: 'use_other' }, delivery: delivery('whd_2', org, 'resp_1') }))
      .rejects.toThrow();
    expect(await store.listUsage({})).toHaveLength(1);
    expect(await store.countPendingWebhookDeliveries()).toBe(1);
    // Without the response: the ledger row (same surface and request) and the line are kept as they are.
    expect(await store.commitRequestEnd({ usage: { ...end.usage, id: 'use_other' }, batchResult: end.batchResult }))
      .toEqual({ batchResultRecorded: false });
    expect(await store.listUsage({})).toEqual([end.usage]);
    expect((await store.getBatch(org, 'batch_1'))!.requestCounts).toEqual({ total: 2, completed: 1, failed: 0 });
  });

  it('the usage ledger: exact integers and money, filters, insertion order', async () => {
    const other = (await store.ensureOrganization('other')).id;
    const big = { inputTokens: 2 ** 41 + 3, cachedTokens: 2 ** 33 + 1, outputTokens: 4_294_967_297, completedAtMs: 1_764_000_000_123 };
    const rows = [
      usage(org, 'o', 'resp_1', { ...big, cost: '123456789.000000000123456789', longContext: true }),
      usage(other, 'other', 'resp_2', { completedAtMs: 1_764_000_000_124, surface: 'batch' }),
      usage(org, 'o', 'resp_3', { completedAtMs: 1_764_000_000_100, surface: 'messages' }),
    ];
    for (const r of rows) await store.commitRequestEnd({ usage: r });
    expect(await store.listUsage({})).toEqual(rows);
    expect(await store.listUsage({ orgName: 'o' })).toEqual([rows[0], rows[2]]);
    expect(await store.listUsage({ sinceMs: 1_764_000_000_123 })).toEqual([rows[0], rows[1]]);
    expect(await store.listUsage({ orgName: 'other', sinceMs: 1_764_000_000_125 })).toEqual([]);
  });

  it('reclaims space after a batch ends and its rows are dropped', async () => {
    await store.insertBatch(batch('batch_r', org));
    for (let line = 1; line <= 200; line++) {
      await store.recordBatchResult('batch_r', { lineNo: line, ok: true, line: 'x'.repeat(500) }, { nextLine: line + 1, nextOffset: line * 501 });
    }
    await store.finishBatch('batch_r', ['in_progress'], { status: 'completed', completedAt: 300 }, []);
    await store.reclaimSpace();
    expect(await store.listBatchResults('batch_r', 0, 10)).toEqual([]);
    expect(await store.getBatch(org, 'batch_r')).toMatchObject({ status: 'completed', completedAt: 300, requestCounts: { completed: 200 } });
  });

  it('races between two stores on the same data have one winner', async () => {
    const second = await t.open();
    const both = <T>(fn: (s: Store, i: number) => Promise<T>) =>
      Promise.all(Array.from({ length: 8 }, (_, i) => fn(i % 2 === 0 ? store : second, i)));

    // One new idempotency key: exactly one request runs it.
    const begun = await both((s, i) => s.beginIdempotency(org, 'messages', 'race', 'h', i, HELD));
    expect(begun.filter((b) => b.state === 'new')).toHaveLength(1);
    expect(begun.filter((b) => b.state === 'in_progress')).toHaveLength(7);

    // One compare-and-set: exactly one transition from in_progress wins.
    await store.insertBatch(batch('batch_race', org));
    const moved = await both((s, i) => s.transitionBatch('batch_race', ['in_progress'], { status: 'cancelling', cancellingAt: 100 + i }));
    expect(moved.filter((b) => b !== undefined)).toHaveLength(1);

    // One batch line ended by several runners at once: recorded and counted once, billed once.
    const ended = await both((s, i) => s.commitRequestEnd({
      usage: usage(org, 'o', 'batch_race:1', { id: `use_${i}`, surface: 'batch' }),
      batchResult: { batchId: 'batch_race', result: { lineNo: 1, ok: true, line: `run ${i}` }, progress: { nextLine: 2, nextOffset: 9 } },
    }));
    expect(ended.filter((e) => e.batchResultRecorded)).toHaveLength(1);
    expect((await store.getBatch(org, 'batch_race'))!.requestCounts).toEqual({ total: 2, completed: 1, failed: 0 });
    expect(await store.listUsage({})).toHaveLength(1);

    // Claims of the same due deliveries: none is claimed twice, and the per-organization cap holds.
    for (let i = 0; i < 6; i++) await store.insertWebhookDelivery(delivery(`whd_${i}`, org, `resp_${i}`));
    const claims = await both((s) => s.claimDueWebhookDeliveries({ owner: 'rpl_test', nowMs: 10_000, untilMs: 40_000 }, 10, { perOrg: 4, perHost: 10 }));
    const claimed = claims.flat().map((d) => d.id);
    expect(new Set(claimed).size).toBe(claimed.length);
    expect(claimed).toHaveLength(4);
    expect(await second.nextWebhookAttemptMs(10_000)).toBe(40_000);
  });
});
