// Replicas sharing batches through PostgreSQL, under leases (issue 18): two services on one schema
// and one files directory run one batch's lines between them, each line exactly once (one result
// in the output or error file, one ledger row, exact request_counts); a replica killed with
// SIGKILL while holding chunks (a real child process) leaves them to the other, which finishes the
// batch after the leases expire, still exactly once. Short leases (leaseConfig(900)); nothing
// asserts a duration. Skipped with the reason without SLUICE_TEST_POSTGRES_URL (helpers/stores.ts).
// The child process runs the built service: `npm run build:ts` first.

import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { openService, type Service } from '../../src/service.js';
import { leaseConfig } from '../../src/store/leases.js';
import { chatLine, countIds, createBatch, readResults, waitForBatch, type RequestLine } from '../helpers/batches.js';
import { dropSchema, freshSchema, POSTGRES_URL, schemaClient } from '../helpers/stores.js';

const SKIP = POSTGRES_URL ? undefined : 'SLUICE_TEST_POSTGRES_URL is not set (postgres://user:password@host/database)';
const DIST = resolve(dirname(fileURLToPath(import.meta.url)), '../../dist/src');
const TTL_MS = 900;
/** Few engine slots, so that one replica holds only a few chunks at a time and the other gets some. */
const ENGINE = { backend: 'cpu' as const, kvCacheBytes: 32 << 20, threads: 1, maxNumSeqs: 8 };

let root: string;
let modelDir: string;
const services: Service[] = [];
const children: ChildProcess[] = [];
const schemas: string[] = [];

async function startReplica(schema: string, filesDir: string, dataDir: string, ttlMs = TTL_MS): Promise<{ service: Service; client: (key: string) => OpenAI }> {
  const service = await openService({
    catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] },
    dataDir, databaseUrl: POSTGRES_URL!, databaseSchema: schema, filesDir,
    engineDefaults: ENGINE, onProgress: () => {}, lease: leaseConfig(ttlMs),
  });
  services.push(service);
  const origin = await service.app.listen({ host: '127.0.0.1', port: 0 });
  return { service, client: (key) => new OpenAI({ baseURL: `${origin}/v1`, apiKey: key, maxRetries: 0 }) };
}

/** A data directory with the first one's per-deployment secrets (README: identical on every replica). */
function secondDataDir(first: string): string {
  const dir = mkdtempSync(join(root, 'data-'));
  for (const name of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(first, name), join(dir, name));
  return dir;
}

/** Lines done by one replica (its sluice_batch_lines_total, both outcomes). */
async function linesRunBy(service: Service): Promise<number> {
  const metric = await service.metrics.registry.getSingleMetric('sluice_batch_lines_total')!.get();
  return metric.values.reduce((sum, v) => sum + v.value, 0);
}

async function query(schema: string, sql: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
  const client = await schemaClient(schema);
  try {
    return (await client.query(sql, values)).rows;
  } finally {
    await client.end();
  }
}

async function ledgerRequestIds(schema: string): Promise<string[]> {
  return (await query(schema, "SELECT request_id FROM usage_ledger WHERE surface = 'batch'")).map((r) => r['request_id'] as string);
}

/** Every line once across both files, one ledger row per line that has a result in the output file. */
async function expectExactlyOnce(schema: string, client: OpenAI, batch: { id: string; output_file_id?: string | null; error_file_id?: string | null },
  lines: RequestLine[], badCount: number): Promise<void> {
  const output = await readResults(client, batch.output_file_id);
  const errors = await readResults(client, batch.error_file_id);
  const counts = countIds(output, errors);
  expect(counts.size).toBe(lines.length);
  expect([...counts.values()].every((n) => n === 1)).toBe(true);
  expect(errors).toHaveLength(badCount);
  const ledger = await ledgerRequestIds(schema);
  expect(ledger).toHaveLength(lines.length - badCount);
  expect(new Set(ledger).size).toBe(ledger.length);
}

const lineSet = (n: number, prefix: string) => Array.from({ length: n }, (_, i) =>
  chatLine(`${prefix}${i}`, `Count from ${i} on`, { max_tokens: 6, ...(i % 53 === 7 && { top_p: 7 }) }));

(SKIP ? describe.skip : describe)(`batches shared by replicas on PostgreSQL${SKIP ? ` [skipped: ${SKIP}]` : ''}`, () => {
  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-batch-replicas-'));
    modelDir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
  });
  afterEach(async () => {
    for (const child of children.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    for (const s of services.splice(0)) await s.close();
    for (const s of schemas.splice(0)) await dropSchema(s);
  });
  afterAll(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('two replicas run one batch\'s lines between them, each exactly once', async () => {
    const schema = freshSchema();
    schemas.push(schema);
    const filesDir = join(root, `files-${schema}`);
    const a = await startReplica(schema, filesDir, mkdtempSync(join(root, 'data-')));
    const b = await startReplica(schema, filesDir, secondDataDir(a.service.dataDir));
    const key = a.service.firstKey!.key;
    const lines = lineSet(400, 'l');
    const badCount = lines.filter((_, i) => i % 53 === 7).length;
    // Created on A; B takes chunks at its polls.
    const created = await createBatch(a.client(key), lines, 'standard');
    const done = await waitForBatch(b.client(key), created.id, undefined, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 400, completed: 400 - badCount, failed: badCount });
    const [byA, byB] = [await linesRunBy(a.service), await linesRunBy(b.service)];
    expect(byA).toBeGreaterThan(0);
    expect(byB).toBeGreaterThan(0);
    expect(byA + byB).toBe(400);
    await expectExactlyOnce(schema, a.client(key), done, lines, badCount);
    // Ended: no chunk rows or leases left behind.
    expect(await query(schema, 'SELECT * FROM batch_chunks')).toEqual([]);
    expect(await query(schema, 'SELECT id FROM batches WHERE lease_owner IS NOT NULL')).toEqual([]);
  }, 180_000);

  it('a replica killed while holding chunks leaves them to the other, which finishes the batch exactly once', async () => {
    if (!existsSync(join(DIST, 'service.js'))) throw new Error('dist/ is missing: run npm run build:ts first');
    const schema = freshSchema();
    schemas.push(schema);
    const filesDir = join(root, `files-${schema}`);
    const dataDirA = mkdtempSync(join(root, 'data-'));
    // The doomed replica: the built service in a child process, killed with SIGKILL below.
    const script = join(root, `replica-${schema}.mjs`);
    writeFileSync(script, `
      const { openService } = await import(${JSON.stringify(pathToFileURL(join(DIST, 'service.js')).href)});
      const { leaseConfig } = await import(${JSON.stringify(pathToFileURL(join(DIST, 'store/leases.js')).href)});
      const cfg = JSON.parse(process.argv[2]);
      const service = await openService({
        catalog: { models: [{ id: 'tiny', checkpoint: cfg.modelDir }] }, dataDir: cfg.dataDir, databaseUrl: cfg.url,
        databaseSchema: cfg.schema, filesDir: cfg.filesDir, engineDefaults: cfg.engine, onProgress: () => {},
        lease: leaseConfig(cfg.ttlMs, 'rpl_doomed'),
      });
      const origin = await service.app.listen({ host: '127.0.0.1', port: 0 });
      process.stdout.write(JSON.stringify({ origin, key: service.firstKey.key }) + '\\n');
    `);
    const child = spawn(process.execPath, [script, JSON.stringify({
      modelDir, dataDir: dataDirA, url: POSTGRES_URL, schema, filesDir, engine: ENGINE, ttlMs: TTL_MS,
    })], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (d) => { stderr += d; });
    const { origin, key } = await new Promise<{ origin: string; key: string }>((done, fail) => {
      let out = '';
      child.stdout!.on('data', (d) => {
        out += d;
        if (out.includes('\n')) done(JSON.parse(out.split('\n')[0]!));
      });
      child.on('exit', (code, signal) => fail(new Error(`the replica exited (${code ?? signal}): ${stderr}`)));
    });
    const doomed = new OpenAI({ baseURL: `${origin}/v1`, apiKey: key, maxRetries: 0 });
    const lines = lineSet(300, 'k');
    const badCount = lines.filter((_, i) => i % 53 === 7).length;
    const created = await createBatch(doomed, lines, 'asap');
    // Killed once it has finished some lines and holds undone chunks.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const held = await query(schema, "SELECT chunk_no FROM batch_chunks WHERE lease_owner = 'rpl_doomed' AND NOT done");
      const counts = (await doomed.batches.retrieve(created.id)).request_counts!;
      if (held.length > 0 && counts.completed + counts.failed >= 10) break;
      if (Date.now() > deadline) throw new Error('the doomed replica never held chunks mid-run');
      await new Promise((r) => setTimeout(r, 20));
    }
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    const heldAtDeath = (await query(schema, "SELECT chunk_no FROM batch_chunks WHERE lease_owner = 'rpl_doomed' AND NOT done")).length;
    expect(heldAtDeath).toBeGreaterThan(0);
    const [row] = await query(schema, 'SELECT completed, failed FROM batches WHERE id = $1', [created.id]);
    const storedAtDeath = Number(row!['completed']) + Number(row!['failed']);

    const survivor = await startReplica(schema, filesDir, secondDataDir(dataDirA));
    const done = await waitForBatch(survivor.client(key), created.id, undefined, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 300, completed: 300 - badCount, failed: badCount });
    // The survivor ran exactly the rest, the dead replica's chunks included.
    expect(await linesRunBy(survivor.service)).toBe(300 - storedAtDeath);
    await expectExactlyOnce(schema, survivor.client(key), done, lines, badCount);
    expect(await query(schema, 'SELECT * FROM batch_chunks')).toEqual([]);
  }, 180_000);

  it('a draining replica claims nothing new, and one that stops hands its leases back at once', async () => {
    // Leases of 10 minutes: the other replica can only continue because they are handed back.
    const LONG = 600_000;
    const schema = freshSchema();
    schemas.push(schema);
    const filesDir = join(root, `files-${schema}`);
    const a = await startReplica(schema, filesDir, mkdtempSync(join(root, 'data-')), LONG);
    const key = a.service.firstKey!.key;
    const owner = a.service.batches.lease.owner;
    const heldBy = async (who: string) => (await query(schema,
      'SELECT batch_id FROM batch_chunks WHERE lease_owner = $1 UNION ALL SELECT id FROM batches WHERE lease_owner = $1', [who])).length;
    const lines = lineSet(600, 'd');
    const badCount = lines.filter((_, i) => i % 53 === 7).length;
    const created = await createBatch(a.client(key), lines, 'flex');
    await waitForBatch(a.client(key), created.id, (x) => x.request_counts!.completed >= 20);

    // Drain: the chunks it runs go on to their end, and it claims no other.
    a.service.drain();
    const deadline = Date.now() + 60_000;
    while ((await heldBy(owner)) > 0) {
      if (Date.now() > deadline) throw new Error('the draining replica still holds leases');
      await new Promise((r) => setTimeout(r, 50));
    }
    const ranByA = await linesRunBy(a.service);
    const mid = await a.client(key).batches.retrieve(created.id);
    expect(mid.status).toBe('in_progress');
    expect(mid.request_counts!.completed + mid.request_counts!.failed).toBe(ranByA);
    expect(ranByA).toBeLessThan(600);

    // B takes the rest; A, still draining, runs nothing more.
    const b = await startReplica(schema, filesDir, secondDataDir(a.service.dataDir), LONG);
    const bOwner = b.service.batches.lease.owner;
    await waitForBatch(b.client(key), created.id, (x) => x.request_counts!.completed + x.request_counts!.failed >= ranByA + 20);
    expect(await linesRunBy(a.service)).toBe(ranByA);
    // B stops mid-run (a shutdown): its lines still running are not stored, and its leases go back at once.
    await b.service.close();
    services.splice(services.indexOf(b.service), 1);
    expect(await heldBy(bOwner)).toBe(0);
    const stopped = await a.client(key).batches.retrieve(created.id);
    expect(stopped.status).toBe('in_progress');

    // A third replica, on leases of 10 minutes too, takes the rest at once.
    const c = await startReplica(schema, filesDir, secondDataDir(a.service.dataDir), LONG);
    const done = await waitForBatch(c.client(key), created.id, undefined, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 600, completed: 600 - badCount, failed: badCount });
    expect(await linesRunBy(a.service)).toBe(ranByA);
    await expectExactlyOnce(schema, c.client(key), done, lines, badCount);
  }, 180_000);
});
