// The whole system (issue 18): three real `sluice serve` replicas on one PostgreSQL schema and one
// shared --files-dir, each with its own data directory holding the same prefix-hash.key and
// reasoning-keys.json (copied from the first, as the README says), behind HAProxy running
// deploy/haproxy.cfg, with a local webhook receiver. Everything goes through HAProxy.
//
//   1. Affinity, every replica healthy: keyed chat completions (a few prompt_cache_key values,
//      interleaved) each land on one replica, read from the replicas' access logs by the request id
//      the test sends; repeats of a key report cached tokens.
//   2. A 300-line batch (one file upload, one batch); once a tenth of its lines are done (their
//      ledger rows), 30 background responses (asap, standard and flex, each with a completion
//      webhook).
//   3. At once: `kill -9` of the replica holding the most leases (read from PostgreSQL), and
//      SIGTERM of another (it drains, then exits, handing its leases back).
//   4. The survivor finishes everything, after the killed replica's leases expire (--lease-seconds 2).
//      Then: every background response is terminal with output, and every callback body for it is
//      the stored response (finished once: a second run would store a different one); every batch
//      line is in the result files exactly once and the counts add up to 300; every webhook was
//      delivered at least once; the usage ledger (read straight from PostgreSQL) has exactly one row
//      per finished request: 300 batch lines, 30 responses, the affinity phase's chat completions.
//
// The final checks are soft (expect.soft): when some fail, the others still run and report.
// Skipped, with the reason in its name, without SLUICE_TEST_POSTGRES_URL or a haproxy binary;
// failing instead when SLUICE_REQUIRE_POSTGRES=1 or SLUICE_REQUIRE_HAPROXY=1 (or CI) says they must
// be there (as .ci/run does).

import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findHaproxy, HAPROXY_MISSING, startHaproxy, waitFor, type Haproxy } from '../bench/haproxy.js';
import { makeModel } from '../models/make-model.js';
import { createApiKey } from '../src/store/api-keys.js';
import { PostgresStore } from '../src/store/postgres-store.js';
import { startServe, stopServe, type ServeProcess } from './helpers/serve-process.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient } from './helpers/stores.js';
import { startWebhookReceiver, type Hook, type WebhookReceiver } from './helpers/webhook-receiver.js';

const haproxy = findHaproxy();
const haproxyRequired = process.env['CI'] === 'true' || process.env['CI'] === '1' || process.env['SLUICE_REQUIRE_HAPROXY'] === '1';
const SKIP = !POSTGRES_URL ? 'SLUICE_TEST_POSTGRES_URL is not set (postgres://user:password@host/database)' : !haproxy ? HAPROXY_MISSING : undefined;

const NUM_LINES = 300;
const NUM_BACKGROUND = 30;
const KEYS = ['alpha', 'bravo', 'charlie', 'delta', 'echo'];
const PER_KEY = 6;
const LEASE_SECONDS = 2;
const DRAIN_SECONDS = 4;
/** How long the survivor gets to finish everything after the kill and the drain. */
const FINISH_MS = 120_000;
const CHAT = '/v1/chat/completions';
const TERMINAL_RESPONSE = ['completed', 'incomplete', 'failed', 'cancelled'];
const TERMINAL_BATCH = ['completed', 'failed', 'expired', 'cancelled'];
const WINDOWS = ['asap', 'standard', 'flex'] as const;
// Long enough for several full 16-token KV blocks, different per key.
const systemPrompt = (key: string) => `You are the ${key} assistant. Answer briefly and carefully about ${key}. `.repeat(6);

if (SKIP && !haproxyRequired) console.warn(`cluster test skipped: ${SKIP}`);

describe.runIf(!haproxy && haproxyRequired)('the whole system behind HAProxy (CI)', () => {
  it('has a haproxy binary', () => {
    throw new Error(`CI needs HAProxy for the cluster test: ${HAPROXY_MISSING}`);
  });
});

/* eslint-disable @typescript-eslint/no-explicit-any */

describe.skipIf(SKIP !== undefined)(`three replicas on PostgreSQL behind HAProxy${SKIP ? ` (skipped: ${SKIP})` : ''}`, () => {
  let root: string;
  let schema: string;
  let key: string;
  let receiver: WebhookReceiver;
  let hook: Hook;
  let lb: Haproxy;
  const replicas = new Map<string, ServeProcess>();

  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-cluster-'));
    const modelDir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
    schema = freshSchema();
    const admin = await schemaClient('public');
    try {
      await admin.query(`CREATE SCHEMA ${schema}`);
    } finally {
      await admin.end();
    }
    // The one API key, made in the database before any replica starts (so none makes its own).
    const seed = await PostgresStore.open(POSTGRES_URL!, { schema });
    try {
      key = (await createApiKey(seed, 'default', { admin: true })).key;
    } finally {
      await seed.close();
    }
    const url = new URL(POSTGRES_URL!);
    url.searchParams.set('options', `-c search_path=${schema}`);
    const filesDir = join(root, 'shared-files');
    mkdirSync(filesDir);
    const serveArgs = (dataDir: string) => [
      '--model', modelDir, '--port', '0', '--host', '127.0.0.1', '--data-dir', dataDir,
      '--database-url', url.toString(), '--files-dir', filesDir,
      '--backend', 'cpu', '--threads', '1', '--kv-cache-bytes', String(16 << 20),
      '--lease-seconds', String(LEASE_SECONDS), '--drain-seconds', String(DRAIN_SECONDS),
      '--allow-private-webhooks', '--log-stats-interval', '0',
    ];
    // The first replica makes the per-deployment secrets; the others start with copies of them.
    const dataDirs = ['r1', 'r2', 'r3'].map((name) => [name, mkdtempSync(join(root, `${name}-`))] as const);
    replicas.set('r1', await startServe(serveArgs(dataDirs[0]![1])));
    for (const [, dir] of dataDirs.slice(1)) {
      for (const file of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(dataDirs[0]![1], file), join(dir, file));
    }
    for (const [name, p] of await Promise.all(dataDirs.slice(1).map(async ([name, dir]) => [name, await startServe(serveArgs(dir))] as const))) {
      replicas.set(name, p);
    }
    lb = await startHaproxy({ binary: haproxy!, dir: root, servers: [...replicas].map(([name, p]) => [name, p.origin.replace('http://', '')]) });
    receiver = await startWebhookReceiver();
    hook = receiver.hook([], 200);
  });

  afterAll(async () => {
    await lb?.stop();
    await Promise.all([...replicas.values()].map((p) => stopServe(p, 10_000)));
    await receiver?.close();
    if (schema) await dropSchema(schema);
    if (root) rmSync(root, { recursive: true, force: true });
  });

  async function api(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: any }> {
    const res = await fetch(`${lb.origin}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }), ...headers },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    // HAProxy's own error pages (a 502 or 503 while it notices a replica is gone) are not JSON.
    return { status: res.status, json: (res.headers.get('content-type') ?? '').includes('json') ? JSON.parse(text) : text };
  }

  /** The replicas whose access logs have this request id for this route. */
  const answeredBy = (route: string, id: string) => [...replicas].filter(([, p]) => p.requestIds(route).has(id)).map(([name]) => name);

  /** Sequences running or waiting in a replica's engine, from its /metrics (asked directly, not through HAProxy). */
  async function workOn(p: ServeProcess): Promise<number> {
    const res = await fetch(`${p.origin}/metrics`, { headers: { authorization: `Bearer ${key}` } });
    const text = await res.text();
    let n = 0;
    for (const m of text.matchAll(/^sluice_requests_(?:running|waiting)\{[^}]*\} (\d+(?:\.\d+)?)$/gm)) n += Number(m[1]);
    return n;
  }

  /** A replica's id (the owner of its leases), from its "serving" log line. */
  function replicaIdOf(p: ServeProcess): string {
    for (const l of p.logLines) {
      const m = /; replica (rpl_[0-9a-f]+)\)$/.exec(String(l['msg']));
      if (m) return m[1]!;
    }
    throw new Error('no replica id in the serving line');
  }

  /** Live leases (batch chunks and background jobs) held by one replica. */
  async function leasesHeldBy(owner: string): Promise<number> {
    const db = await schemaClient(schema);
    try {
      const n = async (table: string) => Number((await db.query(`SELECT COUNT(*) AS n FROM ${table} WHERE lease_owner = $1 AND lease_until_ms > $2`,
        [owner, Date.now()])).rows[0].n);
      return await n('batch_chunks') + await n('background_jobs');
    } finally {
      await db.end();
    }
  }

  /** Batch chunks and background jobs under a live lease and how many replicas hold them, and unfinished background responses (read from PostgreSQL). */
  async function leasedWork(): Promise<{ chunks: { count: number; owners: number }; jobs: { count: number; owners: number; unfinished: number } }> {
    const db = await schemaClient(schema);
    try {
      const count = async (table: string, unfinished: string) => {
        const row = (await db.query(`SELECT COUNT(*) AS n, COUNT(DISTINCT lease_owner) AS owners FROM ${table}
          WHERE ${unfinished} AND lease_owner IS NOT NULL AND lease_until_ms > $1`, [Date.now()])).rows[0];
        return { count: Number(row.n), owners: Number(row.owners) };
      };
      // A background response keeps its job row until it is terminal.
      const unfinished = Number((await db.query('SELECT COUNT(*) AS n FROM background_jobs')).rows[0].n);
      return { chunks: await count('batch_chunks', 'NOT done'), jobs: { ...await count('background_jobs', 'TRUE'), unfinished } };
    } finally {
      await db.end();
    }
  }

  it('keeps affinity, then finishes a batch and background responses exactly once through a kill -9 and a drain', async () => {
    const started = Date.now();
    const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;

    // 1. Affinity while every replica is healthy.
    const keyed = await Promise.all(KEYS.map(async (k) => {
      const out: Array<{ id: string; key: string; status: number; cached: number }> = [];
      for (let i = 0; i < PER_KEY; i++) {
        const id = `affinity-${k}-${i}`;
        const res = await api('POST', CHAT, {
          model: 'tiny', max_tokens: 2, temperature: 0, prompt_cache_key: k,
          messages: [{ role: 'system', content: systemPrompt(k) }, { role: 'user', content: `Question ${i}?` }],
        }, { 'x-request-id': id });
        out.push({ id, key: k, status: res.status, cached: res.json?.usage?.prompt_tokens_details?.cached_tokens ?? -1 });
      }
      return out;
    })).then((lanes) => lanes.flat());
    expect(keyed.filter((s) => s.status !== 200)).toEqual([]);
    // An access line is written once the reply is sent: wait until every request has one.
    await waitFor('every keyed request in an access log', async () => (keyed.every((s) => answeredBy(CHAT, s.id).length > 0) ? true : undefined), 5_000);
    const owner = new Map<string, string>();
    for (const k of KEYS) {
      const where = new Set(keyed.filter((s) => s.key === k).flatMap((s) => answeredBy(CHAT, s.id)));
      expect([...where], `replicas that answered key ${k}`).toHaveLength(1);
      owner.set(k, [...where][0]!);
    }
    for (const s of keyed.filter((s) => !s.id.endsWith('-0'))) expect(s.cached, `cached tokens of ${s.id}`).toBeGreaterThan(0);

    // 2. The batch, then (once some of its lines are done) the background responses.
    const lines = Array.from({ length: NUM_LINES }, (_, i) => JSON.stringify({
      custom_id: `line-${i}`, method: 'POST', url: CHAT,
      body: { model: 'tiny', max_tokens: 32, temperature: 0, messages: [{ role: 'user', content: `Line ${i}: write a few words about the number ${i}.` }] },
    }));
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([`${lines.join('\n')}\n`], { type: 'application/jsonl' }), 'cluster.jsonl');
    const uploaded = await fetch(`${lb.origin}/v1/files`, { method: 'POST', headers: { authorization: `Bearer ${key}` }, body: form });
    expect(uploaded.status).toBe(200);
    const fileId = (await uploaded.json() as { id: string }).id;
    const created = await api('POST', '/v1/batches', { input_file_id: fileId, endpoint: CHAT, completion_window: 'standard' });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    const batchId = created.json.id as string;

    // Lines done, as their ledger rows are committed (the batch's request_counts move a chunk at a time).
    const linesDone = async () => {
      const db = await schemaClient(schema);
      try {
        return Number((await db.query("SELECT COUNT(*) AS n FROM usage_ledger WHERE surface = 'batch'")).rows[0].n);
      } finally {
        await db.end();
      }
    };
    const doneAtKill = await waitFor('a tenth of the lines done', async () => {
      const n = await linesDone();
      return n >= NUM_LINES / 10 ? n : undefined;
    }, 60_000, 100);
    // Created now, so that they are running when the replicas go.
    const background = await Promise.all(Array.from({ length: NUM_BACKGROUND }, async (_, i) => {
      const res = await api('POST', '/v1/responses', {
        model: 'tiny', input: `Background ${i}: tell a short story about ${KEYS[i % KEYS.length]}.`, max_output_tokens: 256, temperature: 0,
        background: true, metadata: { completion_window: WINDOWS[i % WINDOWS.length]!, completion_webhook: hook.url },
      });
      expect(res.status, JSON.stringify(res.json)).toBe(200);
      return res.json.id as string;
    }));
    expect(new Set(background).size).toBe(NUM_BACKGROUND);

    // 3. Mid-way: kill -9 the replica holding the most leases (batch chunks and background
    // responses, read from PostgreSQL: its own work is what must move), SIGTERM another.
    const progress = (await api('GET', `/v1/batches/${batchId}`)).json;
    const ids = [...replicas].map(([name, p]) => [name, replicaIdOf(p)] as const);
    const held = await waitFor('a replica holding leases', async () => {
      const got = await Promise.all(ids.map(async ([name, id]) => [name, await leasesHeldBy(id)] as const));
      return got.some(([, n]) => n > 0) ? got : undefined;
    }, 30_000, 20);
    const work = await Promise.all([...replicas].map(async ([name, p]) => [name, await workOn(p)] as const));
    const [killed, heldByKilled] = held.reduce((a, b) => (b[1] > a[1] ? b : a));
    const [drained] = work.filter(([n]) => n !== killed).reduce((a, b) => (b[1] > a[1] ? b : a));
    const survivor = [...replicas.keys()].find((n) => n !== killed && n !== drained)!;
    expect(TERMINAL_BATCH, `the batch ended before the kill (${JSON.stringify(progress.request_counts)}): make it longer`).not.toContain(progress.status);
    const leased = await leasedWork();
    const killedId = ids.find(([n]) => n === killed)![1];
    replicas.get(killed)!.child.kill('SIGKILL');
    const drainedProcess = replicas.get(drained)!;
    drainedProcess.child.kill('SIGTERM');
    expect(await replicas.get(killed)!.exited).toBeNull();
    console.info(`cluster: at ${elapsed()} ${doneAtKill} lines done, leases held ${JSON.stringify(Object.fromEntries(held))}, sequences running `
      + `${JSON.stringify(Object.fromEntries(work))}; leased just after: ${JSON.stringify(leased)}; kill -9 ${killed} (${killedId}), SIGTERM ${drained}, ${survivor} survives`);
    // The killed replica's own leases are what must move: it held some when it died. (Whether
    // background responses were still running then depends on timing; a SIGKILLed replica's
    // background response taken over is test/api/background-replicas.test.ts.)
    expect(heldByKilled, `leases held by ${killed} (${killedId}) at the kill`).toBeGreaterThan(0);

    // 4. Everything terminal, polled through HAProxy (which now sends everything to the survivor).
    const finishBy = Date.now() + FINISH_MS;
    let batch: any;
    let responses = new Map<string, any>();
    for (;;) {
      // A round with any answer other than 200 (HAProxy still noticing a replica is gone: an error
      // status, or a connection it closes) is polled again.
      const polled = await Promise.all([`/v1/batches/${batchId}`, ...background.map((id) => `/v1/responses/${id}`)]
        .map((path) => api('GET', path).catch(() => ({ status: 0, json: undefined as any }))));
      if (polled.every((p) => p.status === 200)) {
        batch = polled[0]!.json;
        responses = new Map(polled.slice(1).map((p, i) => [background[i]!, p.json]));
        const done = TERMINAL_BATCH.includes(batch.status) && [...responses.values()].every((r) => TERMINAL_RESPONSE.includes(r.status));
        if (done) break;
      }
      if (Date.now() > finishBy) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    expect(batch, 'a round of polls answered 200').toBeDefined();
    const drainExit = await Promise.race([drainedProcess.exited, new Promise((r) => setTimeout(() => r('still running'), 30_000))]);
    const notTerminal = [...responses].filter(([, r]) => !TERMINAL_RESPONSE.includes(r.status)).map(([id, r]) => `${id} ${r.status}`);
    console.info(`cluster: at ${elapsed()} batch ${batch.status} ${JSON.stringify(batch.request_counts)}; `
      + `${NUM_BACKGROUND - notTerminal.length} of ${NUM_BACKGROUND} responses terminal; ${drained} exited with ${String(drainExit)}`);

    // The drained replica left cleanly.
    expect.soft(drainExit, `${drained} after SIGTERM`).toBe(0);

    // Every background response terminal, with output, and finished once: each callback body is the stored response.
    expect.soft(notTerminal, 'background responses not terminal').toEqual([]);
    for (const [id, r] of responses) {
      if (!TERMINAL_RESPONSE.includes(r.status)) continue;
      expect.soft(['completed', 'incomplete'], `status of ${id} (${JSON.stringify(r.error)})`).toContain(r.status);
      expect.soft(Array.isArray(r.output) && r.output.length > 0, `${id} has output`).toBe(true);
    }
    // Callbacks: at least once per response (a delivery may be repeated), each the response as stored.
    await waitFor('a callback for every terminal response', async () => (
      [...responses].filter(([, r]) => TERMINAL_RESPONSE.includes(r.status)).every(([id]) => hook.calls.some((c) => c.body['id'] === id)) ? true : undefined), 15_000)
      .catch(() => undefined);
    const delivered = new Set(hook.calls.map((c) => String(c.body['id'])));
    const undelivered = background.filter((id) => !delivered.has(id));
    if (undelivered.length > 0) {
      // What the store says of them (state, attempts, lease), to tell a lost delivery from a late one.
      const db = await schemaClient(schema);
      try {
        const { rows } = await db.query(`SELECT object_id, state, attempts, last_error, lease_owner, leased_until_ms, next_attempt_at_ms
          FROM webhook_deliveries WHERE object_id = ANY($1::text[])`, [undelivered]);
        console.info(`cluster: at ${elapsed()} (now ${Date.now()}) deliveries of responses without a callback: ${JSON.stringify(rows)}`);
      } finally {
        await db.end();
      }
    }
    expect.soft(undelivered, 'responses whose callback never arrived').toEqual([]);
    expect.soft([...delivered].filter((id) => !background.includes(id)), 'callbacks for unknown ids').toEqual([]);
    for (const c of hook.calls) {
      const stored = responses.get(String(c.body['id']));
      if (stored && TERMINAL_RESPONSE.includes(stored.status)) expect.soft(c.body, `callback body of ${c.body['id']}`).toEqual(stored);
    }

    // Every line exactly once in the result files, and the counts add up.
    expect.soft(batch.status, `batch ${batchId}`).toBe('completed');
    const resultLines: Array<{ custom_id: string }> = [];
    for (const fid of [batch.output_file_id, batch.error_file_id]) {
      if (!fid) continue;
      const res = await fetch(`${lb.origin}/v1/files/${fid}/content`, { headers: { authorization: `Bearer ${key}` } });
      resultLines.push(...(await res.text()).split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { custom_id: string }));
    }
    const perId = new Map<string, number>();
    for (const l of resultLines) perId.set(l.custom_id, (perId.get(l.custom_id) ?? 0) + 1);
    expect.soft([...perId].filter(([, n]) => n > 1), 'lines in the result files more than once').toEqual([]);
    expect.soft(perId.size, 'distinct lines in the result files').toBe(NUM_LINES);
    expect.soft(resultLines.length, 'result lines').toBe(NUM_LINES);
    expect.soft(batch.request_counts.total).toBe(NUM_LINES);
    expect.soft(batch.request_counts.completed + batch.request_counts.failed, 'completed + failed').toBe(NUM_LINES);

    // The ledger: exactly one row per finished request, read from PostgreSQL.
    const db = await schemaClient(schema);
    let rows: Array<{ surface: string; request_id: string }>;
    try {
      rows = (await db.query('SELECT surface, request_id FROM usage_ledger')).rows;
    } finally {
      await db.end();
    }
    const batchRows = rows.filter((r) => r.surface === 'batch');
    expect.soft(batchRows.filter((r) => !r.request_id.startsWith(`${batchId}:`)), 'batch rows of another batch').toEqual([]);
    expect.soft(new Set(batchRows.map((r) => r.request_id)).size, 'distinct batch rows').toBe(batchRows.length);
    expect.soft(batchRows.length, 'ledger rows of batch lines (one per line with a result)').toBe(batch.request_counts.completed);
    expect.soft(batchRows.length, 'ledger rows of batch lines').toBe(NUM_LINES);
    const responseRows = rows.filter((r) => r.surface === 'responses').map((r) => r.request_id);
    expect.soft(responseRows.sort(), 'ledger rows of background responses').toEqual([...background].sort());
    const chatRows = rows.filter((r) => r.surface === 'chat.completions');
    expect.soft(chatRows.length, 'ledger rows of the keyed chat completions').toBe(KEYS.length * PER_KEY);
    expect.soft(rows.length, 'ledger rows in all').toBe(NUM_LINES + NUM_BACKGROUND + KEYS.length * PER_KEY);

    console.info(`cluster: keys ${JSON.stringify(Object.fromEntries(owner))}; ${hook.calls.length} callbacks for ${delivered.size} responses; `
      + `${rows.length} ledger rows; ${elapsed()} in all`);
  }, FINISH_MS + 120_000);
});
