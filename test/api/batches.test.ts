// The Batch API end to end: a real server and the official openai client (files.create,
// batches.create/retrieve/list/cancel, files.content). Counts are checked exactly, and every
// custom_id must appear exactly once across the output and error files, including across a
// restart in the middle of a batch.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import {
  chatLine, closeNow, countIds, createBatch, readResults, waitForBatch, type BatchEndpoint, type RequestLine,
} from '../helpers/batches.js';

let server: TestServer;
let client: OpenAI;

/** A line that keeps the engine busy for a while (long answer), for catching a batch mid-run. */
const slowLine = (id: string) => chatLine(id, `Write a long story about the number ${id}.`, { max_tokens: 48 });

beforeAll(async () => {
  // asap batches expire 3 s after creation: the expiry test uses that window, the rest do not.
  server = await startTestServer({ batchDeadlines: { asap: 3 } });
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
});
afterAll(async () => { if (server) await closeNow(server); });

async function postJson(path: string, body: unknown, key = server.key): Promise<{ status: number; body: any }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

describe('a large batch with mixed outcomes', () => {
  it('runs 1,200 lines: exact counts, each custom_id once, bad bodies in the error file', async () => {
    const bad: Record<number, [Record<string, unknown>, number, string]> = {
      // line index -> [body change, status, error code]
      7: [{ temperature: 5 }, 400, 'invalid_request'],
      77: [{ model: 'no-such-model' }, 404, 'model_not_found'],
      177: [{ stream: true }, 400, 'unsupported_parameter'],
      277: [{ messages: [] }, 400, 'invalid_request'],
      377: [{ unknown_field: 1 }, 400, 'invalid_request'],
    };
    const lines: RequestLine[] = [];
    for (let i = 0; i < 1200; i++) {
      const kind = bad[i % 500];
      const line = chatLine(`req-${i}`, `Say something about ${i}`);
      if (kind) Object.assign(line.body, kind[0]);
      lines.push(line);
    }
    const started = Date.now();
    const created = await createBatch(client, lines, '24h');
    expect(created).toMatchObject({
      object: 'batch', endpoint: '/v1/chat/completions', completion_window: '24h', status: 'validating', errors: null,
      output_file_id: null, error_file_id: null, request_counts: { total: 0, completed: 0, failed: 0 }, metadata: null,
    });
    expect(created.id).toMatch(/^batch_[0-9a-f]{32}$/);
    expect(created.expires_at).toBe(created.created_at + 24 * 3600);

    const done = await waitForBatch(client, created.id);
    const badCount = lines.filter((_, i) => bad[i % 500]).length;
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 1200, completed: 1200 - badCount, failed: badCount });
    for (const t of ['in_progress_at', 'finalizing_at', 'completed_at'] as const) expect(done[t]).toBeGreaterThanOrEqual(done.created_at);
    expect(done.failed_at ?? done.cancelled_at ?? done.expired_at ?? done.cancelling_at).toBeNull();
    console.info(`batch of 1,200 one-token lines: ${Date.now() - started} ms`);

    const output = await readResults(client, done.output_file_id);
    const errors = await readResults(client, done.error_file_id);
    expect(output).toHaveLength(1200 - badCount);
    expect(errors).toHaveLength(badCount);
    const counts = countIds(output, errors);
    expect(counts.size).toBe(1200);
    expect([...counts.values()].every((n) => n === 1)).toBe(true);
    // Result lines follow the input's order.
    expect(output.map((l) => l.custom_id)).toEqual(lines.filter((_, i) => !bad[i % 500]).map((l) => l.custom_id));

    for (const l of output) {
      expect(l.id).toMatch(/^batch_req_[0-9a-f]{32}$/);
      expect(l.error).toBeNull();
      expect(l.response).toMatchObject({ status_code: 200, request_id: expect.any(String), body: { object: 'chat.completion', model: 'tiny' } });
    }
    for (const l of errors) {
      const [, status, code] = bad[Number(l.custom_id.slice(4)) % 500]!;
      expect(l.response?.status_code).toBe(status);
      expect(Object.keys(l.response!.body)).toEqual(['error']);
      expect(l.response!.body['error'].code).toBe(code);
      expect(l.error).toEqual({ code, message: l.response!.body['error'].message });
    }

    // The result files are the caller's files, purpose batch_output.
    const outFile = await client.files.retrieve(done.output_file_id!);
    expect(outFile).toMatchObject({ purpose: 'batch_output', filename: `${done.id}_output.jsonl`, status: 'uploaded' });
  }, 90_000);
});

/** Fields that differ between two runs of the same request (ids, clocks). */
/**
 * A body without ids, timestamps and prefix-cache hits: the direct request runs after the batch
 * line on the same prompt, so it may find that prompt's blocks in the prefix cache.
 */
function stable(body: any): any {
  const { id: _id, created: _c, created_at: _ca, completed_at: _done, ...rest } = structuredClone(body);
  if (Array.isArray(rest.output)) rest.output = rest.output.map(({ id: _i, ...item }: any) => item);
  const usage = rest.usage;
  if (usage?.input_tokens_details) usage.input_tokens_details.cached_tokens = 0;
  if (usage?.prompt_tokens_details) usage.prompt_tokens_details.cached_tokens = 0;
  if (usage && typeof usage.cache_read_input_tokens === 'number') {
    usage.input_tokens += usage.cache_read_input_tokens;
    usage.cache_read_input_tokens = 0;
  }
  return rest;
}

describe('a line gives exactly the body its endpoint gives', () => {
  const cases: Array<[BatchEndpoint, string, Record<string, unknown>]> = [
    ['/v1/responses', '/responses', { model: 'tiny', input: 'Tell me about rivers', max_output_tokens: 6, temperature: 0 }],
    ['/v1/chat/completions', '/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: 'Tell me about rivers' }], max_tokens: 6, temperature: 0 }],
    ['/v1/messages', '/messages', { model: 'tiny', messages: [{ role: 'user', content: 'Tell me about rivers' }], max_tokens: 6, temperature: 0 }],
  ];
  for (const [endpoint, path, body] of cases) {
    it(endpoint, async () => {
      const batch = await createBatch(client, [{ custom_id: 'one', method: 'POST', url: endpoint, body }], 'standard', endpoint);
      const done = await waitForBatch(client, batch.id);
      expect(done.request_counts).toEqual({ total: 1, completed: 1, failed: 0 });
      const [line] = await readResults(client, done.output_file_id);
      const direct = await postJson(path, body);
      expect(direct.status).toBe(200);
      expect(stable(line!.response!.body)).toEqual(stable(direct.body));
      expect(done.error_file_id).toBeNull();
    });
  }
});

describe('creation and validation', () => {
  it('fails a batch whose lines target another endpoint, listing the lines', async () => {
    const lines = [chatLine('a', 'x'), { ...chatLine('b', 'x'), url: '/v1/responses' as const }, chatLine('c', 'x'), { ...chatLine('d', 'x'), url: '/v1/messages' as const }];
    const batch = await createBatch(client, lines, 'standard');
    const done = await waitForBatch(client, batch.id);
    expect(done.status).toBe('failed');
    expect(done.failed_at).toBeGreaterThanOrEqual(done.created_at);
    expect(done.in_progress_at).toBeNull();
    expect(done.errors?.data.map((e) => [e.code, e.line, e.param])).toEqual([['mismatched_endpoint', 2, 'url'], ['mismatched_endpoint', 4, 'url']]);
    expect(done.request_counts).toEqual({ total: 4, completed: 0, failed: 0 });
    expect([done.output_file_id, done.error_file_id]).toEqual([null, null]);
  });

  it('refuses a missing file, a file of another purpose, another organization\'s file and bad fields', async () => {
    const fileOf = async (c: OpenAI, purpose: 'batch' | 'user_data') =>
      (await c.files.create({ file: await toFile(Buffer.from(`${JSON.stringify(chatLine('a', 'x'))}\n`), 'f.jsonl'), purpose })).id;
    const other = new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('other-org'), maxRetries: 0 });
    const base = { endpoint: '/v1/chat/completions', completion_window: '24h' };
    const cases: Array<[Record<string, unknown>, number, string | null]> = [
      [{ ...base, input_file_id: 'file-0123456789abcdef01234567' }, 400, 'input_file_id'],
      [{ ...base, input_file_id: await fileOf(client, 'user_data') }, 400, 'input_file_id'],
      [{ ...base, input_file_id: await fileOf(other, 'batch') }, 400, 'input_file_id'],
      [{ ...base, input_file_id: await fileOf(client, 'batch'), completion_window: '1h' }, 400, 'completion_window'],
      [{ ...base, input_file_id: await fileOf(client, 'batch'), endpoint: '/v1/embeddings' }, 400, 'endpoint'],
      [{ endpoint: base.endpoint, completion_window: '24h' }, 400, 'input_file_id'],
    ];
    for (const [body, status, param] of cases) {
      const res = await postJson('/batches', body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      expect(res.body.error.param).toBe(param);
    }
  });
});

describe('listing and ownership', () => {
  it('pages newest first with after, before and limit; another organization sees nothing', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await createBatch(client, [chatLine(`l${i}`, 'x')], 'standard')).id);
    const newest = [...ids].reverse();
    const first = await client.batches.list({ limit: 2 });
    expect(first.data.map((b) => b.id)).toEqual(newest.slice(0, 2));
    expect(first.has_more).toBe(true);
    const second = await client.batches.list({ limit: 2, after: newest[1]! });
    expect(second.data.map((b) => b.id)).toEqual(newest.slice(2, 4));
    const before = await fetch(`${server.baseUrl}/batches?limit=2&before=${newest[3]}`, { headers: { authorization: `Bearer ${server.key}` } });
    const page = (await before.json()) as { data: { id: string }[]; has_more: boolean };
    expect(page.data.map((b) => b.id)).toEqual(newest.slice(1, 3));
    expect(page.has_more).toBe(true);
    // The SDK's auto-pagination walks every batch once.
    const all: string[] = [];
    for await (const b of client.batches.list({ limit: 2 })) all.push(b.id);
    expect(all.slice(0, 5)).toEqual(newest);
    expect(new Set(all).size).toBe(all.length);
    expect((await client.batches.list()).data.length).toBeLessThanOrEqual(25);

    for (const q of ['limit=0', 'limit=201', 'after=batch_nope']) {
      const res = await fetch(`${server.baseUrl}/batches?${q}`, { headers: { authorization: `Bearer ${server.key}` } });
      expect(res.status, q).toBe(400);
    }
    expect((await fetch(`${server.baseUrl}/batches?limit=200`, { headers: { authorization: `Bearer ${server.key}` } })).status).toBe(200);

    const other = new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('someone-else'), maxRetries: 0 });
    expect((await other.batches.list()).data).toEqual([]);
    await expect(other.batches.retrieve(ids[0]!)).rejects.toMatchObject({ status: 404 });
    await expect(other.batches.cancel(ids[0]!)).rejects.toMatchObject({ status: 404 });
    await waitForBatch(client, ids[4]!);
  });
});

describe('cancel', () => {
  it('cancels a validating batch', async () => {
    server.service.batches.pause();
    let batch;
    try {
      batch = await createBatch(client, [chatLine('a', 'x'), chatLine('b', 'y')], 'standard');
      expect((await client.batches.retrieve(batch.id)).status).toBe('validating');
      const cancelling = await client.batches.cancel(batch.id);
      expect(['cancelling', 'cancelled']).toContain(cancelling.status);
      expect(cancelling.cancelling_at).toBeGreaterThanOrEqual(batch.created_at);
    } finally {
      server.service.batches.resume();
    }
    const done = await waitForBatch(client, batch.id);
    expect(done).toMatchObject({ status: 'cancelled', output_file_id: null, error_file_id: null, in_progress_at: null });
    expect(done.request_counts).toEqual({ total: 0, completed: 0, failed: 0 });
  });

  it('cancels an in_progress batch, keeping the lines that finished', async () => {
    const lines = Array.from({ length: 300 }, (_, i) => slowLine(`s${i}`));
    const batch = await createBatch(client, lines, 'standard');
    await waitForBatch(client, batch.id, (b) => b.request_counts!.completed >= 3);
    const cancelling = await client.batches.cancel(batch.id);
    expect(cancelling.status).toBe('cancelling');
    // A second cancel changes nothing.
    expect((await client.batches.cancel(batch.id)).status).toMatch(/^cancell/);
    const done = await waitForBatch(client, batch.id);
    expect(done.status).toBe('cancelled');
    expect(done.cancelled_at).toBeGreaterThanOrEqual(done.cancelling_at!);
    const { total, completed, failed } = done.request_counts!;
    expect(total).toBe(300);
    expect(completed).toBeGreaterThanOrEqual(3);
    expect(completed + failed).toBeLessThan(300);
    const output = await readResults(client, done.output_file_id);
    expect(output).toHaveLength(completed);
    expect(new Set(output.map((l) => l.custom_id)).size).toBe(completed);
  }, 60_000);

  it('refuses to cancel a completed batch (409) and leaves it as it was', async () => {
    const batch = await createBatch(client, [chatLine('a', 'x')], 'standard');
    const done = await waitForBatch(client, batch.id);
    expect(done.status).toBe('completed');
    const res = await postJson(`/batches/${batch.id}/cancel`, {});
    expect(res.status).toBe(409);
    expect(res.body.error.code).toBe('batch_not_cancellable');
    expect(await client.batches.retrieve(batch.id)).toEqual(done);
  });
});

describe('expiry', () => {
  it('expires a batch at its deadline, keeping the finished lines', async () => {
    // Far more work than 3 s holds on a fast machine (1,500 x 48 tokens), so the deadline ends it.
    const lines = Array.from({ length: 1500 }, (_, i) => slowLine(`e${i}`));
    const batch = await createBatch(client, lines, 'asap');
    expect(batch.expires_at).toBe(batch.created_at + 3);
    const done = await waitForBatch(client, batch.id);
    expect(done.status).toBe('expired');
    expect(done.expired_at).toBeGreaterThanOrEqual(batch.expires_at!);
    const { completed, failed } = done.request_counts!;
    expect(completed).toBeGreaterThan(0);
    expect(completed + failed).toBeLessThan(1500);
    expect(await readResults(client, done.output_file_id)).toHaveLength(completed);
  }, 30_000);
});

describe('restart', () => {
  it('resumes a batch after the service restarts mid-run: no line lost or repeated', async () => {
    const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-batch-restart-'));
    let first: TestServer | undefined;
    let second: TestServer | undefined;
    try {
      first = await startTestServer({ dataDir });
      const c1 = new OpenAI({ baseURL: first.baseUrl, apiKey: first.key, maxRetries: 0 });
      const lines = Array.from({ length: 600 }, (_, i) => chatLine(`r${i}`, `Count to ${i}`, { max_tokens: 6, ...(i % 97 === 0 && { top_p: 7 }) }));
      const batch = await createBatch(c1, lines, 'standard');
      const mid = await waitForBatch(c1, batch.id, (b) => b.request_counts!.completed >= 40);
      await closeNow(first);
      first = undefined;

      second = await startTestServer({ dataDir });
      const c2 = new OpenAI({ baseURL: second.baseUrl, apiKey: second.key, maxRetries: 0 });
      const done = await waitForBatch(c2, batch.id);
      expect(done.status).toBe('completed');
      const badCount = lines.filter((_, i) => i % 97 === 0).length;
      expect(done.request_counts).toEqual({ total: 600, completed: 600 - badCount, failed: badCount });
      expect(done.request_counts!.completed).toBeGreaterThanOrEqual(mid.request_counts!.completed);
      const counts = countIds(await readResults(c2, done.output_file_id), await readResults(c2, done.error_file_id));
      expect(counts.size).toBe(600);
      expect([...counts.values()].every((n) => n === 1)).toBe(true);
    } finally {
      if (first) await closeNow(first);
      if (second) await closeNow(second);
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 90_000);
});
