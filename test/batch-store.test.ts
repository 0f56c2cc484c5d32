// The pieces a batch's exactly-once guarantee rests on, without a server: the store's result rows
// (recorded and counted once, progress only forward, ends as compare-and-set), on every store kind
// (helpers/stores.ts), and the JSONL line reader's numbering and offsets (a resumed read starts
// exactly at a recorded offset).

import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { jsonlLines } from '../src/batches/jsonl-lines.js';
import type { BatchRecord } from '../src/store/batch-records.js';
import type { Store } from '../src/store/store.js';
import { describeStores, type StoreUnderTest } from './helpers/stores.js';

async function newBatch(store: Store, id: string): Promise<BatchRecord> {
  const org = await store.ensureOrganization('o');
  const batch: BatchRecord = {
    id, orgId: org.id, orgName: 'o', keyId: 'k', endpoint: '/v1/responses', inputFileId: 'file-00000000', completionWindow: 'flex',
    status: 'in_progress', errors: null, outputFileId: null, errorFileId: null, metadata: { a: 'b' },
    requestCounts: { total: 3, completed: 0, failed: 0 }, progress: { nextLine: 1, nextOffset: 0 }, createdAt: 100, expiresAt: 200,
    inProgressAt: 100, finalizingAt: null, completedAt: null, failedAt: null, expiredAt: null, cancellingAt: null, cancelledAt: null,
  };
  await store.insertBatch(batch);
  return batch;
}

describeStores('batch rows in the store', (kind) => {
  let t: StoreUnderTest;
  let store: Store;
  beforeEach(async () => {
    t = await kind.create();
    store = t.store;
  });
  afterEach(async () => {
    await t.dispose();
  });

  it('records a line once, counts it once, and only moves progress forward', async () => {
    const b = await newBatch(store, 'batch_1');
    expect(await store.recordBatchResult(b.id, { lineNo: 2, ok: true, line: 'two' }, { nextLine: 1, nextOffset: 0 })).toBe(true);
    expect(await store.recordBatchResult(b.id, { lineNo: 1, ok: false, line: 'one' }, { nextLine: 3, nextOffset: 40 })).toBe(true);
    // A repeat (a line re-run after a crash) is neither stored nor counted again; stale progress is ignored.
    expect(await store.recordBatchResult(b.id, { lineNo: 2, ok: true, line: 'again' }, { nextLine: 2, nextOffset: 20 })).toBe(false);
    const now = (await store.getBatch(b.orgId, b.id))!;
    expect(now.requestCounts).toEqual({ total: 3, completed: 1, failed: 1 });
    expect(now.progress).toEqual({ nextLine: 3, nextOffset: 40 });
    expect(await store.listBatchResultLines(b.id, 2)).toEqual([2]);
    expect(await store.listBatchResults(b.id, 0, 10)).toEqual([
      { lineNo: 1, ok: false, line: 'one' }, { lineNo: 2, ok: true, line: 'two' },
    ]);
    expect(await store.listBatchResults(b.id, 1, 10)).toHaveLength(1);
    expect(await store.getBatch('another-org', b.id)).toBeUndefined();
  });

  it('transitions and ends only from the expected statuses', async () => {
    const b = await newBatch(store, 'batch_2');
    expect(await store.transitionBatch(b.id, ['validating'], { status: 'failed' })).toBeUndefined();
    const cancelling = await store.transitionBatch(b.id, ['in_progress'], { status: 'cancelling', cancellingAt: 150 });
    expect(cancelling).toMatchObject({ status: 'cancelling', cancellingAt: 150, metadata: { a: 'b' } });
    await store.recordBatchResult(b.id, { lineNo: 1, ok: true, line: 'x' }, { nextLine: 2, nextOffset: 5 });
    const file = { id: 'file-0123456789ab', orgId: b.orgId, bytes: 2, createdAt: 160, filename: 'o.jsonl', purpose: 'batch_output', status: 'uploaded', statusDetails: null };
    expect(await store.finishBatch(b.id, ['in_progress'], { status: 'completed' }, [file])).toBeUndefined();
    expect(await store.getFile(b.orgId, file.id)).toBeUndefined(); // a lost compare-and-set records nothing
    const ended = await store.finishBatch(b.id, ['cancelling'], { status: 'cancelled', cancelledAt: 170, outputFileId: file.id }, [file]);
    expect(ended).toMatchObject({ status: 'cancelled', cancelledAt: 170, outputFileId: file.id, requestCounts: { completed: 1 } });
    expect(await store.getFile(b.orgId, file.id)).toEqual(file);
    expect(await store.listBatchResults(b.id, 0, 10)).toEqual([]);
    expect(await store.listUnfinishedBatches()).toEqual([]);
  });

  it('lists newest first around after and before cursors', async () => {
    for (let i = 1; i <= 5; i++) await newBatch(store, `batch_${i}`);
    const org = (await store.getOrganizationByName('o'))!.id;
    const ids = async (opts: { limit: number; after?: string; before?: string }) => (await store.listBatches(org, opts)).map((b) => b.id);
    expect(await ids({ limit: 2 })).toEqual(['batch_5', 'batch_4']);
    expect(await ids({ limit: 2, after: 'batch_4' })).toEqual(['batch_3', 'batch_2']);
    expect(await ids({ limit: 2, before: 'batch_2' })).toEqual(['batch_4', 'batch_3']);
    expect(await ids({ limit: 9, after: 'batch_5', before: 'batch_2' })).toEqual(['batch_4', 'batch_3']);
  });
});

describe('jsonlLines', () => {
  const text = '{"a":1}\r\n\n{"b":2}\n{"c":3}';
  const all = async (stream: Readable, start?: number, line?: number) => {
    const out = [];
    for await (const l of jsonlLines(stream, start, line)) out.push(l);
    return out;
  };

  it('numbers every line (blank ones too) with its byte range, across chunk boundaries', async () => {
    const bytes = Buffer.from(`\ufeff${text}`);
    const chunks = [...bytes].map((b) => Buffer.from([b])); // one byte per chunk
    const lines = await all(Readable.from(chunks));
    expect(lines.map((l) => [l.lineNo, l.text])).toEqual([[1, '{"a":1}'], [2, ''], [3, '{"b":2}'], [4, '{"c":3}']]);
    expect(lines.at(-1)!.end).toBe(bytes.length);
    // Resuming at a line's recorded start reads the same lines from there.
    const third = lines[2]!;
    const resumed = await all(Readable.from([bytes.subarray(third.start)]), third.start, third.lineNo);
    expect(resumed).toEqual(lines.slice(2));
  });
});
