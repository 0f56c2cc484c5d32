// Batch work under leases in the store, on every store kind (helpers/stores.ts): the batch row's
// lease (validation and the split into chunks in one transaction, the end's barrier), chunk claims
// (window, then age, then file order; two stores claiming at once never share a chunk; a dead
// owner's chunk taken over after expiry), renewals, hand-backs, and the fence on a line's commit
// (a stale owner's line, or a line of a batch that left in_progress or is being ended, writes
// nothing: no result row, no ledger row). Lease times are given explicitly: nothing sleeps.

import { afterEach, beforeEach, expect, it } from 'vitest';
import type { BatchChunkBounds, BatchRecord } from '../src/store/batch-records.js';
import type { LeaseTerm } from '../src/store/leases.js';
import type { Store, UsageRecord } from '../src/store/store.js';
import { describeStores, type StoreUnderTest } from './helpers/stores.js';

const T = 1_700_000_000_000; // "now" in ms for the leases below
const TTL = 1_000;
const term = (owner: string, nowMs = T): LeaseTerm => ({ owner, nowMs, untilMs: nowMs + TTL });

async function newBatch(store: Store, id: string, window: string, createdAt: number, status: BatchRecord['status'] = 'validating',
  orgName = 'o'): Promise<BatchRecord> {
  const org = await store.ensureOrganization(orgName);
  const batch: BatchRecord = {
    id, orgId: org.id, orgName, keyId: 'k', endpoint: '/v1/responses', inputFileId: 'file-00000000', completionWindow: window,
    status, errors: null, outputFileId: null, errorFileId: null, metadata: null,
    requestCounts: { total: 0, completed: 0, failed: 0 }, progress: { nextLine: 1, nextOffset: 0 }, createdAt, expiresAt: 4_000_000_000 + createdAt,
    inProgressAt: null, finalizingAt: null, completedAt: null, failedAt: null, expiredAt: null, cancellingAt: null, cancelledAt: null,
  };
  await store.insertBatch(batch);
  return batch;
}

/** `n` chunks of two lines each (line numbers and offsets as if every line were 10 bytes). */
const chunksOf = (n: number): BatchChunkBounds[] => Array.from({ length: n }, (_, i) => ({
  chunkNo: i, firstLine: 2 * i + 1, lastLine: 2 * i + 2, startOffset: 20 * i, endOffset: 20 * i + 20, numLines: 2,
}));

/** A validating batch taken through validation by `owner`: in_progress with `n` chunks. */
async function chunkedBatch(store: Store, id: string, window: string, createdAt: number, n: number, owner = 'rpl_validator',
  orgName = 'o'): Promise<BatchRecord> {
  await newBatch(store, id, window, createdAt, 'validating', orgName);
  expect(await store.claimBatch(id, term(owner))).toMatchObject({ chunked: false, undoneChunks: 0 });
  const started = await store.startBatchChunks(id, owner, ['validating'], { status: 'in_progress', total: 2 * n, inProgressAt: createdAt }, chunksOf(n));
  expect(started).toMatchObject({ status: 'in_progress', requestCounts: { total: 2 * n } });
  return started!;
}

function usage(b: BatchRecord, lineNo: number): UsageRecord {
  return {
    id: `use_${b.id}_${lineNo}`, orgId: b.orgId, orgName: 'o', keyId: 'k', model: 'm', tier: 'flex', surface: 'batch', requestId: `${b.id}:${lineNo}`,
    inputTokens: 1, cachedTokens: 0, outputTokens: 1, inputCost: '0.000001', cachedCost: '0', outputCost: '0.000001',
    cost: '0.000002', longContext: false, completedAtMs: T,
  };
}

/** A line's fenced commit, as a chunk run makes it. */
const commitLine = (store: Store, b: BatchRecord, chunkNo: number, lineNo: number, owner: string) => store.commitRequestEnd({
  batchResult: { batchId: b.id, result: { lineNo, ok: true, line: `line ${lineNo}` }, progress: { nextLine: 0, nextOffset: 0 }, lease: { owner, chunkNo } },
  usage: usage(b, lineNo),
});

describeStores('batch leases in the store', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
  });
  afterEach(async () => {
    await t.dispose();
  });

  const ledgerRows = async () => Number((await t.rows('SELECT COUNT(*) AS n FROM usage_ledger'))[0]!['n']);

  it('validation under the row lease: another owner cannot take it, and in_progress comes with the chunks in one step', async () => {
    await newBatch(store, 'batch_v', 'flex', 100);
    expect((await store.listBatchWork('rpl_a', T)).map((b) => b.id)).toEqual(['batch_v']);
    expect(await store.claimBatch('batch_v', term('rpl_a'))).toMatchObject({ batch: { id: 'batch_v', status: 'validating' } });
    // Held: not listed for another owner, not claimable by it until the lease expires.
    expect(await store.listBatchWork('rpl_b', T + 10)).toEqual([]);
    expect(await store.claimBatch('batch_v', term('rpl_b', T + 10))).toBeUndefined();
    // Only the holder moves it on; nothing is claimable before.
    expect(await store.claimBatchChunks(term('rpl_b'), 5, [])).toEqual([]);
    expect(await store.startBatchChunks('batch_v', 'rpl_b', ['validating'], { status: 'in_progress' }, chunksOf(2))).toBeUndefined();
    expect((await t.rows("SELECT COUNT(*) AS n FROM batch_chunks WHERE batch_id = 'batch_v'"))[0]!['n']).toEqual(kind.name === 'sqlite' ? 0 : '0');
    const started = await store.startBatchChunks('batch_v', 'rpl_a', ['validating'], { status: 'in_progress', total: 4 }, chunksOf(2));
    expect(started).toMatchObject({ status: 'in_progress', requestCounts: { total: 4 } });
    // Written once: a second split (a task racing on a batch from before chunks) changes nothing.
    expect(await store.claimBatch('batch_v', term('rpl_a'))).toMatchObject({ chunked: true, undoneChunks: 2 });
    expect(await store.startBatchChunks('batch_v', 'rpl_a', ['in_progress'], {}, chunksOf(5))).toBeUndefined();
    await store.releaseBatchLease('batch_v', 'rpl_a');
    // The row lease went back with the split: the chunks are claimable, the row is not work now.
    expect(await store.listBatchWork('rpl_b', T)).toEqual([]);
    expect((await store.claimBatchChunks(term('rpl_b'), 5, [])).map((c) => c.chunk)).toEqual(chunksOf(2));
  });

  it('claims chunks asap before standard before flex, then the older batch, then in file order', async () => {
    await chunkedBatch(store, 'batch_flex_old', 'flex', 100, 2);
    await chunkedBatch(store, 'batch_24h', '24h', 150, 1);
    await chunkedBatch(store, 'batch_std_new', 'standard', 300, 1);
    await chunkedBatch(store, 'batch_asap', 'asap', 400, 2);
    await chunkedBatch(store, 'batch_std_old', 'standard', 200, 1);
    const order: string[] = [];
    for (;;) {
      const [claimed] = await store.claimBatchChunks(term('rpl_a'), 1, []);
      if (!claimed) break;
      order.push(`${claimed.batch.id}#${claimed.chunk.chunkNo}`);
    }
    expect(order).toEqual([
      'batch_asap#0', 'batch_asap#1', 'batch_std_old#0', 'batch_std_new#0', 'batch_flex_old#0', 'batch_flex_old#1', 'batch_24h#0',
    ]);
    // A claim can skip batches (those already feeding lines here).
    await chunkedBatch(store, 'batch_a', 'asap', 500, 1);
    await chunkedBatch(store, 'batch_b', 'asap', 600, 1);
    expect((await store.claimBatchChunks(term('rpl_a'), 1, ['batch_a']))[0]?.batch.id).toBe('batch_b');
  });

  it('skips the organizations a replica names (at their cap of feeding batches): another organization\'s newer batch is claimed', async () => {
    const a1 = await chunkedBatch(store, 'batch_a1', 'flex', 100, 2, 'rpl_validator', 'org-a');
    await chunkedBatch(store, 'batch_a2', 'flex', 110, 2, 'rpl_validator', 'org-a');
    const b1 = await chunkedBatch(store, 'batch_b1', 'flex', 120, 2, 'rpl_validator', 'org-b');
    const claim = (skipBatches: string[], skipOrgs: string[]) => store.claimBatchChunks(term('rpl_a'), 1, skipBatches, skipOrgs)
      .then((c) => c.map((x) => `${x.batch.id}#${x.chunk.chunkNo}`));
    // Without a skipped organization the oldest batch comes first.
    expect(await claim([], [])).toEqual(['batch_a1#0']);
    // org-a at its cap: org-b's newer batch is next, though org-a's second batch is older.
    expect(await claim([a1.id], [a1.orgId])).toEqual(['batch_b1#0']);
    // Both skipped: nothing.
    expect(await claim([a1.id, b1.id], [a1.orgId, b1.orgId])).toEqual([]);
  });

  it('two stores claiming at once never get the same chunk', async () => {
    const other = await t.open();
    await chunkedBatch(store, 'batch_many', 'standard', 100, 40);
    const claimAll = async (s: Store, owner: string) => {
      const got: number[] = [];
      for (;;) {
        const claimed = await s.claimBatchChunks(term(owner), 3, []);
        if (claimed.length === 0) return got;
        got.push(...claimed.map((c) => c.chunk.chunkNo));
      }
    };
    const [a, b, c] = await Promise.all([claimAll(store, 'rpl_a'), claimAll(other, 'rpl_b'), claimAll(other, 'rpl_c')]);
    const all = [...a, ...b, ...c].sort((x, y) => x - y);
    expect(all).toEqual(Array.from({ length: 40 }, (_, i) => i));
    const owners = await t.rows("SELECT lease_owner, COUNT(*) AS n FROM batch_chunks GROUP BY lease_owner");
    expect(owners.reduce((sum, r) => sum + Number(r['n']), 0)).toBe(40);
  });

  it('a dead owner\'s chunk is taken over after its lease expires; renewals keep a live one\'s', async () => {
    const b = await chunkedBatch(store, 'batch_t', 'standard', 100, 2);
    const [mine] = await store.claimBatchChunks(term('rpl_dead'), 1, []);
    expect(mine!.chunk.chunkNo).toBe(0);
    const [live] = await store.claimBatchChunks(term('rpl_live'), 1, []);
    expect(live!.chunk.chunkNo).toBe(1);
    // rpl_live renews; rpl_dead does not.
    expect(await store.renewBatchLeases(term('rpl_live', T + 600))).toEqual({ batchIds: [], chunkKeys: ['batch_t:1'] });
    expect(await store.claimBatchChunks(term('rpl_new', T + TTL - 1), 5, [])).toEqual([]);
    const taken = await store.claimBatchChunks(term('rpl_new', T + TTL), 5, []);
    expect(taken.map((c) => c.chunk.chunkNo)).toEqual([0]);
    // The dead owner's renewal (it was only stalled) no longer finds it, and its line is refused.
    expect(await store.renewBatchLeases(term('rpl_dead', T + TTL + 1))).toEqual({ batchIds: [], chunkKeys: [] });
    expect(await commitLine(store, b, 0, 1, 'rpl_dead')).toEqual({ batchResultRecorded: false, batchLeaseLost: true });
    expect(await store.listBatchResultLines(b.id, 1)).toEqual([]);
    expect(await ledgerRows()).toBe(0);
    // The new owner's lines are written, counted and billed once; then its chunk is done.
    expect(await commitLine(store, b, 0, 1, 'rpl_new')).toMatchObject({ batchResultRecorded: true });
    expect(await commitLine(store, b, 0, 2, 'rpl_new')).toMatchObject({ batchResultRecorded: true });
    expect(await store.finishBatchChunk(b.id, 0, 'rpl_dead')).toBe(false);
    expect(await store.finishBatchChunk(b.id, 0, 'rpl_new')).toBe(true);
    expect(await commitLine(store, b, 0, 2, 'rpl_new')).toMatchObject({ batchLeaseLost: true }); // done: closed
    expect((await store.getBatch(b.orgId, b.id))!.requestCounts).toEqual({ total: 4, completed: 2, failed: 0 });
    expect(await ledgerRows()).toBe(2);
    // Not every chunk is done: not the row's work yet. Once the last is, it is.
    expect(await store.listBatchWork('rpl_new', T + TTL)).toEqual([]);
    await commitLine(store, b, 1, 3, 'rpl_live');
    await commitLine(store, b, 1, 4, 'rpl_live');
    expect(await store.finishBatchChunk(b.id, 1, 'rpl_live')).toBe(true);
    expect((await store.listBatchWork('rpl_new', T + TTL)).map((x) => x.id)).toEqual([b.id]);
    expect(await store.claimBatch(b.id, term('rpl_new', T + TTL))).toMatchObject({ chunked: true, undoneChunks: 0 });
  });

  it('the fence refuses lines of a batch that left in_progress or is being ended, writing nothing', async () => {
    const b = await chunkedBatch(store, 'batch_f', 'flex', 100, 2);
    await store.claimBatchChunks(term('rpl_a'), 2, []);
    expect(await commitLine(store, b, 0, 1, 'rpl_a')).toMatchObject({ batchResultRecorded: true });
    // Another replica starts ending it (say, past its deadline): its row lease is the barrier.
    expect(await store.claimBatch(b.id, term('rpl_end'))).toMatchObject({ chunked: true, undoneChunks: 2 });
    expect(await commitLine(store, b, 0, 2, 'rpl_a')).toEqual({ batchResultRecorded: false, batchLeaseLost: true });
    expect(await store.finishBatchChunk(b.id, 0, 'rpl_a')).toBe(false);
    expect(await store.renewBatchLeases(term('rpl_a'))).toEqual({ batchIds: [], chunkKeys: [] });
    expect(await store.claimBatchChunks(term('rpl_b', T + 5 * TTL), 5, [])).toEqual([]);
    await store.releaseBatchLease(b.id, 'rpl_end');
    // Cancelled: refused too.
    await store.transitionBatch(b.id, ['in_progress'], { status: 'cancelling', cancellingAt: 150 });
    expect(await commitLine(store, b, 1, 3, 'rpl_a')).toEqual({ batchResultRecorded: false, batchLeaseLost: true });
    expect(await store.listBatchResultLines(b.id, 1)).toEqual([1]);
    expect(await ledgerRows()).toBe(1);
    expect((await store.getBatch(b.orgId, b.id))!.requestCounts).toMatchObject({ completed: 1, failed: 0 });
    // A cancelling batch is the row's work; ending it drops its chunks.
    expect((await store.listBatchWork('rpl_b', T)).map((x) => x.id)).toEqual([b.id]);
    expect(await store.finishBatch(b.id, ['cancelling'], { status: 'cancelled', cancelledAt: 160 }, [])).toMatchObject({ status: 'cancelled' });
    expect(await t.rows('SELECT * FROM batch_chunks')).toEqual([]);
  });

  it('hands back one owner\'s leases, or everyone\'s (a store one process owns, at start)', async () => {
    await chunkedBatch(store, 'batch_r', 'standard', 100, 3);
    await newBatch(store, 'batch_v', 'standard', 200);
    await store.claimBatch('batch_v', term('rpl_a'));
    await store.claimBatchChunks(term('rpl_a'), 2, []);
    await store.claimBatchChunks(term('rpl_b'), 1, []);
    expect(await store.renewBatchLeases(term('rpl_a'))).toEqual({ batchIds: ['batch_v'], chunkKeys: ['batch_r:0', 'batch_r:1'] });
    expect(await store.releaseBatchLeases('rpl_a')).toBe(3);
    // At once, not after expiry: another owner claims them.
    expect((await store.claimBatchChunks(term('rpl_c'), 5, [])).map((c) => c.chunk.chunkNo)).toEqual([0, 1]);
    expect(await store.claimBatch('batch_v', term('rpl_c'))).toBeDefined();
    expect(await store.releaseBatchLeases()).toBe(4);
    expect(await t.rows('SELECT * FROM batch_chunks WHERE lease_owner IS NOT NULL')).toEqual([]);
  });

  it('lists a batch from before chunks, an expired one and one whose input vanished as the row\'s work', async () => {
    const old = await newBatch(store, 'batch_old', 'standard', 100, 'in_progress');
    expect((await store.listBatchWork('rpl_a', T)).map((b) => b.id)).toEqual([old.id]);
    expect(await store.claimBatch(old.id, term('rpl_a'))).toMatchObject({ chunked: false, undoneChunks: 0 });
    expect(await store.startBatchChunks(old.id, 'rpl_a', ['in_progress'], {}, chunksOf(1))).toMatchObject({ status: 'in_progress' });
    expect(await store.listBatchWork('rpl_a', T)).toEqual([]);
    await store.transitionBatch(old.id, ['in_progress'], { errors: [{ code: 'file_not_found', message: 'gone', line: null, param: null }] });
    expect((await store.listBatchWork('rpl_a', T)).map((b) => b.id)).toEqual([old.id]);
    const late = await chunkedBatch(store, 'batch_late', 'asap', 200, 1);
    expect(await store.listBatchWork('rpl_a', late.expiresAt * 1000 - 1)).toHaveLength(1);
    expect((await store.listBatchWork('rpl_a', late.expiresAt * 1000)).map((b) => b.id)).toEqual([late.id, old.id]);
    // Past its deadline, its chunks are not claimed.
    expect(await store.claimBatchChunks(term('rpl_a', late.expiresAt * 1000), 5, [])).toEqual([]);
  });
});
