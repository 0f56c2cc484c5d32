// Prefix caching across replicas, through a real load balancer:
//   npm run bench:prefix:replicas -- [--database-url postgres://...] [--keys 6] [--requests-per-key 8]
//       [--prefix-words 600] [--max-output-tokens 4] [--replicas 3] [--model DIR]
//       [--out bench/results/prefix-replicas-<cpu>-<N>core.json]
//
// Requests that share a prompt_cache_key share a long system prompt (one per key). They are sent
// one after another, in rounds (every key once per round, in a shuffled order), through HAProxy
// to `sluice serve` replicas on one PostgreSQL database (a fresh schema per run, dropped after),
// in three set-ups, each on fresh replicas (cold caches):
//   - one replica behind deploy/haproxy.cfg: the single-replica number;
//   - N replicas behind deploy/haproxy.cfg: the key hashed consistently over the replicas (affinity);
//   - N replicas behind the same file with the key hashing taken out and `balance roundrobin`.
// For each: cached_tokens / input tokens over all keyed requests (usage as the API reports it),
// the same from each key's second request on, mean time to first token (Server-Timing queue +
// prefill), and on how many replicas each key landed (from the replicas' access logs). With
// affinity a key misses once (its first request); round robin misses once per key per replica.
//
// Needs the haproxy binary (SLUICE_HAPROXY or the usual paths) and a PostgreSQL database
// (--database-url, else SLUICE_DATABASE_URL or SLUICE_TEST_POSTGRES_URL) whose user may create
// schemas. The model is the tiny demo model with a 4,096-token context, made once in the model
// cache (the one bench:prefix uses); --model takes a checkpoint. CPU backend, one thread per
// replica. Prints a table and writes JSON naming the machine.

import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';

import { makeModel } from '../models/make-model.js';
import { modelCacheDir } from '../src/engine/paths.js';
import { createApiKey } from '../src/store/api-keys.js';
import { PostgresStore } from '../src/store/postgres-store.js';
import { chartsBesideResult } from './charts.js';
import { findHaproxy, HAPROXY_MISSING, startHaproxy, type Haproxy } from './haproxy.js';
import { machineInfo } from './machine.js';

const { values: args } = parseArgs({
  options: {
    'database-url': { type: 'string' },
    keys: { type: 'string', default: '6' },
    'requests-per-key': { type: 'string', default: '8' },
    'prefix-words': { type: 'string', default: '600' },
    'max-output-tokens': { type: 'string', default: '4' },
    replicas: { type: 'string', default: '3' },
    model: { type: 'string' },
    out: { type: 'string' },
  },
});

const CLI = join(import.meta.dirname, '..', 'src', 'cli.js');
const WORDS = ('river stone cloud lamp forest bridge harbor window garden letter mountain candle ' +
  'silver meadow thunder orchard lantern compass feather valley').split(' ');

/** `numWords` words, deterministic in `seed`. */
function wordsOf(numWords: number, seed: number): string {
  const out: string[] = [];
  let i = seed;
  while (out.length < numWords) out.push(WORDS[(i = (i * 1103515245 + 12345) >>> 0) % WORDS.length]!);
  return out.join(' ');
}

/**
 * The keys in an order fixed by `round` (the same in every set-up). In a fixed order, round robin
 * over N replicas would send a key to the same replica every time whenever N divides the number of
 * keys: shuffling each round spreads every key as round robin spreads unrelated requests.
 */
function shuffled<T>(items: readonly T[], round: number): T[] {
  const out = [...items];
  let x = 2654435761 * (round + 1) >>> 0;
  for (let i = out.length - 1; i > 0; i--) {
    x = (x * 1103515245 + 12345) >>> 0;
    const j = x % (i + 1);
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

async function benchModel(): Promise<string> {
  if (args.model) return resolve(args.model);
  const dir = join(modelCacheDir(), 'tiny-ctx4096-bf16');
  if (!existsSync(join(dir, 'config.json'))) {
    process.stderr.write(`making the tiny model with a 4096-token context in ${dir}...\n`);
    await makeModel({ preset: 'tiny', out: dir, dtype: 'bf16', seed: 0, overrides: { maxPositionEmbeddings: 4096 } });
  }
  return dir;
}

interface Replica {
  name: string;
  child: ChildProcess;
  origin: string;
  dataDir: string;
  /** request_id of every access line of POST /v1/responses. */
  requestIds: Set<string>;
  exited: Promise<void>;
}

/** Starts `sluice serve` (dist/src/cli.js) and waits for its "serving ... on" line. */
async function startReplica(name: string, serveArgs: string[], dataDir: string): Promise<Replica> {
  const child = spawn(process.execPath, [CLI, 'serve', ...serveArgs, '--data-dir', dataDir], { stdio: ['ignore', 'ignore', 'pipe'] });
  const requestIds = new Set<string>();
  let stderr = '';
  let partial = '';
  const exited = new Promise<void>((done) => child.on('exit', () => done()));
  const origin = await new Promise<string>((done, fail) => {
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d;
      partial += d;
      const lines = partial.split('\n');
      partial = lines.pop()!;
      for (const line of lines) {
        try {
          const l = JSON.parse(line) as Record<string, unknown>;
          if (l['msg'] === 'request' && l['route'] === '/v1/responses') requestIds.add(String(l['request_id']));
        } catch { /* not a log line */ }
      }
      const m = /serving \S+ on (http:\/\/[^/\s]+)\/v1/.exec(stderr);
      if (m) done(m[1]!);
    });
    exited.then(() => fail(new Error(`replica ${name} exited: ${stderr}`)));
  });
  return { name, child, origin, dataDir, requestIds, exited };
}

async function stopReplica(r: Replica): Promise<void> {
  if (r.child.exitCode === null && r.child.signalCode === null) r.child.kill('SIGTERM');
  const timer = setTimeout(() => r.child.kill('SIGKILL'), 30_000);
  await r.exited;
  clearTimeout(timer);
}

interface Sent { id: string; key: string; index: number; inputTokens: number; cachedTokens: number; ttftMs: number; replica: string }

interface ModeResult {
  name: string;
  replicas: number;
  routing: string;
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  cachedFraction: number;
  /** From each key's second request on. */
  cachedFractionAfterFirst: number;
  meanTtftMs: number;
  /** key -> replicas its requests landed on. */
  replicasPerKey: Record<string, string[]>;
}

async function runMode(name: string, numReplicas: number, roundRobin: boolean, ctx: {
  databaseUrl: string; haproxyBinary: string; modelDir: string; keys: string[]; perKey: number;
  systems: Map<string, string>; maxOutputTokens: number;
}): Promise<ModeResult> {
  const root = mkdtempSync(join(os.tmpdir(), 'sluice-bench-replicas-'));
  const schema = `sluice_bench_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: ctx.databaseUrl });
  await admin.connect();
  await admin.query(`CREATE SCHEMA ${schema}`);
  const replicas: Replica[] = [];
  let lb: Haproxy | undefined;
  try {
    const seed = await PostgresStore.open(ctx.databaseUrl, { schema });
    const { key } = await createApiKey(seed, 'default', { admin: true });
    await seed.close();
    const url = new URL(ctx.databaseUrl);
    url.searchParams.set('options', `-c search_path=${schema}`);
    const filesDir = join(root, 'files');
    mkdirSync(filesDir);
    const serveArgs = ['--model', ctx.modelDir, '--host', '127.0.0.1', '--port', '0', '--database-url', url.toString(), '--files-dir', filesDir,
      '--backend', 'cpu', '--threads', '1', '--kv-cache-bytes', String(256 << 20), '--log-stats-interval', '0'];
    // The first replica makes the per-deployment secrets; the others get copies (README).
    const dirs = Array.from({ length: numReplicas }, (_, i) => mkdtempSync(join(root, `r${i + 1}-`)));
    replicas.push(await startReplica('r1', serveArgs, dirs[0]!));
    for (const dir of dirs.slice(1)) for (const f of ['prefix-hash.key', 'reasoning-keys.json']) copyFileSync(join(dirs[0]!, f), join(dir, f));
    replicas.push(...await Promise.all(dirs.slice(1).map((dir, i) => startReplica(`r${i + 2}`, serveArgs, dir))));
    lb = await startHaproxy({ binary: ctx.haproxyBinary, dir: root, roundRobin, servers: replicas.map((r) => [r.name, r.origin.replace('http://', '')]) });
    const models = await (await fetch(`${lb.origin}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).json() as { data: Array<{ id: string }> };
    const model = models.data[0]!.id;

    const sent: Sent[] = [];
    for (let i = 0; i < ctx.perKey; i++) {
      for (const k of shuffled(ctx.keys, i)) {
        const requestId = `${name.replace(/\W+/g, '-')}-${k}-${i}`;
        const res = await fetch(`${lb.origin}/v1/responses`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-request-id': requestId },
          body: JSON.stringify({
            model, instructions: ctx.systems.get(k), input: `Question ${i} about ${k}: ${wordsOf(12, 5000 + i)}?`,
            max_output_tokens: ctx.maxOutputTokens, temperature: 0, prompt_cache_key: k,
          }),
        });
        const body = await res.json() as { usage?: { input_tokens: number; input_tokens_details: { cached_tokens: number } } };
        if (res.status !== 200 || !body.usage) throw new Error(`POST /v1/responses (${name}): HTTP ${res.status} ${JSON.stringify(body)}`);
        const timing = Object.fromEntries([...(res.headers.get('server-timing') ?? '').matchAll(/(\w+);dur=([\d.]+)/g)].map((m) => [m[1]!, Number(m[2])]));
        sent.push({ id: requestId, key: k, index: i, inputTokens: body.usage.input_tokens, cachedTokens: body.usage.input_tokens_details.cached_tokens,
          ttftMs: (timing['queue'] ?? NaN) + (timing['prefill'] ?? NaN), replica: '?' });
      }
    }
    // Which replica answered each request: its access line (written once the reply is sent).
    const until = Date.now() + 5_000;
    const whereOf = (id: string) => replicas.filter((r) => r.requestIds.has(id)).map((r) => r.name);
    while (sent.some((s) => whereOf(s.id).length === 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    for (const s of sent) s.replica = whereOf(s.id).join('+') || '?';

    const sum = (list: Sent[], f: (s: Sent) => number) => list.reduce((a, s) => a + f(s), 0);
    const later = sent.filter((s) => s.index > 0);
    return {
      name, replicas: numReplicas, routing: roundRobin ? 'round robin' : 'deploy/haproxy.cfg (key hashed)',
      requests: sent.length,
      promptTokens: sum(sent, (s) => s.inputTokens),
      cachedTokens: sum(sent, (s) => s.cachedTokens),
      cachedFraction: sum(sent, (s) => s.cachedTokens) / sum(sent, (s) => s.inputTokens),
      cachedFractionAfterFirst: sum(later, (s) => s.cachedTokens) / sum(later, (s) => s.inputTokens),
      meanTtftMs: sum(sent, (s) => s.ttftMs) / sent.length,
      replicasPerKey: Object.fromEntries(ctx.keys.map((k) => [k, [...new Set(sent.filter((s) => s.key === k).map((s) => s.replica))].sort()])),
    };
  } finally {
    await lb?.stop();
    await Promise.all(replicas.map(stopReplica));
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
    await admin.end();
    rmSync(root, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const databaseUrl = args['database-url'] ?? process.env['SLUICE_DATABASE_URL'] ?? process.env['SLUICE_TEST_POSTGRES_URL'];
  if (!databaseUrl) throw new Error('bench:prefix:replicas needs a PostgreSQL database: --database-url postgres://... (or SLUICE_DATABASE_URL)');
  const haproxyBinary = findHaproxy();
  if (!haproxyBinary) throw new Error(`bench:prefix:replicas needs HAProxy: ${HAPROXY_MISSING}`);
  const numKeys = Number(args.keys);
  const perKey = Number(args['requests-per-key']);
  const prefixWords = Number(args['prefix-words']);
  const maxOutputTokens = Number(args['max-output-tokens']);
  const numReplicas = Number(args.replicas);
  const modelDir = await benchModel();
  const keys = Array.from({ length: numKeys }, (_, i) => `tenant-${i + 1}`);
  const systems = new Map(keys.map((k, i) => [k, `You answer for ${k}. ${wordsOf(prefixWords, 7 + 101 * i)}`]));
  const ctx = { databaseUrl, haproxyBinary, modelDir, keys, perKey, systems, maxOutputTokens };

  const modes: ModeResult[] = [];
  for (const [name, n, rr] of [['one replica', 1, false], [`${numReplicas} replicas, affinity`, numReplicas, false], [`${numReplicas} replicas, round robin`, numReplicas, true]] as const) {
    process.stderr.write(`${name}...\n`);
    modes.push(await runMode(name, n, rr, ctx));
  }

  const cpus = os.cpus();
  console.log(`${args.model ?? 'tiny model (4096 context)'}, cpu backend, 1 thread per replica; ${cpus[0]?.model} x${cpus.length}, node ${process.version}`);
  console.log(`${numKeys} prompt_cache_key values x ${perKey} requests, sent one after another (rounds of every key in a shuffled order) through HAProxy; `
    + `a ${prefixWords}-word system prompt per key, ${maxOutputTokens} output tokens\n`);
  console.log('| set-up | requests | prompt tokens | cached_tokens | cached / prompt | from 2nd request per key | mean TTFT ms | replicas per key |');
  console.log('|---|--:|--:|--:|--:|--:|--:|--:|');
  for (const m of modes) {
    const perKeyCounts = Object.values(m.replicasPerKey).map((r) => r.length);
    console.log(`| ${m.name} | ${m.requests} | ${m.promptTokens} | ${m.cachedTokens} | ${(100 * m.cachedFraction).toFixed(1)}% | `
      + `${(100 * m.cachedFractionAfterFirst).toFixed(1)}% | ${m.meanTtftMs.toFixed(1)} | ${Math.min(...perKeyCounts)}-${Math.max(...perKeyCounts)} |`);
  }
  const [single, affinity] = modes;
  const ratio = affinity!.cachedFraction / single!.cachedFraction;
  console.log(`\naffinity keeps ${(100 * ratio).toFixed(1)}% of the single replica's cached fraction (target: as high as one replica, >= 99%: ${ratio >= 0.99 ? 'met' : 'NOT met'})`);

  const machine = machineInfo();
  const slug = `${(machine.cpu ?? 'cpu').toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '')}-${machine.cores}core`;
  const outArg = args.out ?? `bench/results/prefix-replicas-${slug}.json`;
  const out = resolve(outArg);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify({
    bench: 'prefix-replicas',
    date: new Date().toISOString(),
    machine,
    settings: { keys: numKeys, requestsPerKey: perKey, prefixWords, maxOutputTokens, replicas: numReplicas, model: modelDir, backend: 'cpu', threadsPerReplica: 1, sequential: true },
    modes,
    targets: { affinityVsSingle: { target: '>= 0.99', value: ratio, met: ratio >= 0.99 } },
  }, null, 2) + '\n');
  await chartsBesideResult(out);
  console.log(`\nwrote ${outArg}`);
}

main().catch((err) => {
  console.error(err instanceof Error ? err.stack ?? err.message : err);
  process.exit(1);
});
