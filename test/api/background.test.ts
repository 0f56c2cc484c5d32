// Background responses: cancel at every stage, window deadlines, and restarts of the service on the
// same data directory (work resumes, or fails with timeout when its deadline passed meanwhile).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../src/store/sqlite-store.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

type Body = Record<string, any>;

async function call(server: TestServer, method: string, path: string, body?: unknown, key = server.key): Promise<{ status: number; body: Body }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() as Body };
}

/** A long background generation: the tiny model at 1 thread needs seconds for it. */
const LONG = { model: 'tiny', input: 'Tell me a very long story', max_output_tokens: 1500, temperature: 0, background: true };

async function waitFor(server: TestServer, id: string, done: (b: Body) => boolean, timeoutMs = 30_000): Promise<Body> {
  const start = Date.now();
  for (;;) {
    const { body } = await call(server, 'GET', `/responses/${id}`);
    if (done(body) || Date.now() - start > timeoutMs) return body;
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('cancel', () => {
  let server: TestServer;
  beforeAll(async () => { server = await startTestServer(); });
  afterAll(async () => { await server?.close(); });

  it('cancels an in_progress background response, idempotently, and frees its sequence', async () => {
    const created = await call(server, 'POST', '/responses', LONG);
    expect(created.body['status']).toBe('in_progress');
    const cancelled = await call(server, 'POST', `/responses/${created.body['id']}/cancel`);
    expect(cancelled.status).toBe(200);
    expect(cancelled.body).toMatchObject({ id: created.body['id'], status: 'cancelled', object: 'response' });
    expect((await call(server, 'GET', `/responses/${created.body['id']}`)).body['status']).toBe('cancelled');
    // An empty body sent as JSON (as curl -X POST -H 'content-type: application/json' does) is fine.
    const again = await fetch(`${server.baseUrl}/responses/${created.body['id']}/cancel`, {
      method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
    });
    expect(again.status).toBe(200);
    expect(((await again.json()) as Body)['status']).toBe('cancelled');
    // The engine is free again: a new request completes at once.
    const after = await call(server, 'POST', '/responses', { model: 'tiny', input: 'hi', max_output_tokens: 2 });
    expect(after.status).toBe(200);
  });

  it('works with the openai client\'s responses.cancel', async () => {
    const { default: OpenAI } = await import('openai');
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key });
    const created = await client.responses.create({ ...LONG, background: true } as never) as unknown as { id: string; status: string };
    expect(created.status).toBe('in_progress');
    const cancelled = await client.responses.cancel(created.id);
    expect(cancelled.status).toBe('cancelled');
  });

  it('refuses finished, foreground, unknown and other organizations\' responses', async () => {
    const done = await call(server, 'POST', '/responses', { ...LONG, max_output_tokens: 2 });
    const finished = await waitFor(server, done.body['id'], (b) => b['status'] !== 'in_progress');
    expect(finished['status']).not.toBe('in_progress');
    const late = await call(server, 'POST', `/responses/${done.body['id']}/cancel`);
    expect(late.status).toBe(409);
    expect(late.body['error'].code).toBe('response_not_cancellable');

    const foreground = await call(server, 'POST', '/responses', { model: 'tiny', input: 'hi', max_output_tokens: 1 });
    const notBackground = await call(server, 'POST', `/responses/${foreground.body['id']}/cancel`);
    expect(notBackground.status).toBe(400);
    expect(notBackground.body['error'].param).toBe('response_id');

    expect((await call(server, 'POST', '/responses/resp_nope/cancel')).status).toBe(404);
    const other = await server.keyFor('other-org');
    const running = await call(server, 'POST', '/responses', LONG);
    expect((await call(server, 'POST', `/responses/${running.body['id']}/cancel`, undefined, other)).status).toBe(404);
    expect((await call(server, 'POST', `/responses/${running.body['id']}/cancel`)).body['status']).toBe('cancelled');
  });
});

describe('deadlines', () => {
  let server: TestServer;
  beforeAll(async () => { server = await startTestServer({ deadlines: { standard: 1 } }); });
  afterAll(async () => { await server?.close(); });

  it('fails a background response still in_progress past its window\'s deadline with error.code timeout', async () => {
    const created = await call(server, 'POST', '/responses', { ...LONG, max_output_tokens: 2000 });
    const ended = await waitFor(server, created.body['id'], (b) => b['status'] !== 'in_progress');
    expect(ended['status']).toBe('failed');
    expect(ended['error']).toMatchObject({ code: 'timeout' });
    expect(typeof ended['error'].message).toBe('string');
    // asap keeps its default deadline: the same work there is not failed.
    const asap = await call(server, 'POST', '/responses', { ...LONG, max_output_tokens: 3, metadata: { completion_window: 'asap' } });
    expect((await waitFor(server, asap.body['id'], (b) => b['status'] !== 'in_progress'))['status']).not.toBe('failed');
  });
});

describe('restarts', () => {
  let dataDir: string;
  beforeAll(() => { dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-bg-restart-')); });
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

  it('resumes in_progress background work after a restart, and fails it with timeout when its deadline passed meanwhile', async () => {
    // The deadline is fixed when the response is created: asap ones get 2 s here.
    let server = await startTestServer({ dataDir, deadlines: { asap: 2 } });
    const resumed = await call(server, 'POST', '/responses', { ...LONG, max_output_tokens: 200 });
    const expired = await call(server, 'POST', '/responses', { ...LONG, metadata: { completion_window: 'asap' } });
    await server.close();
    // Both stay in_progress while no server runs; the asap one's deadline passes meanwhile.
    const store = new SqliteStore(join(dataDir, 'sluice.db'));
    const org = (await store.getOrganizationByName('default'))!.id;
    expect((await store.getResponse(org, resumed.body['id']))!.status).toBe('in_progress');
    expect((await store.listBackgroundJobs()).map((j) => j.responseId).sort()).toEqual([resumed.body['id'], expired.body['id']].sort());
    await store.close();
    await new Promise((r) => setTimeout(r, 3000));
    server = await startTestServer({ dataDir });
    try {
      const a = await waitFor(server, resumed.body['id'], (b) => b['status'] !== 'in_progress');
      expect(['completed', 'incomplete']).toContain(a['status']);
      expect(a['usage'].output_tokens).toBeGreaterThan(0);
      expect(a['output'][0].content[0].text.length).toBeGreaterThan(0);
      const b = await waitFor(server, expired.body['id'], (r) => r['status'] !== 'in_progress');
      expect(b['status']).toBe('failed');
      expect(b['error'].code).toBe('timeout');
      expect(await server.service.store.listBackgroundJobs()).toEqual([]);
    } finally {
      await server.close();
    }
  });
});
