// prompt_cache_key affinity through a real load balancer: deploy/haproxy.cfg (rendered with real
// ports) in front of three real `sluice serve` replicas on 127.0.0.1, each with its own data
// directory (the same API key seeded into each). Which replica answered a request is read from the
// replicas' own access logs (the request id the test sends comes back in them).
//
//   - Keyed requests (a few keys, interleaved) each land on exactly one replica, and repeats of a
//     key report cached_tokens > 0 (the prefix is reused where the key lives).
//   - Requests without a key are spread (least connections) over more than one replica.
//   - SIGTERM to the replica owning the most keys: it drains (/ready 503 while it still serves),
//     HAProxy marks it down, its keys move to the others (each key again to exactly one replica,
//     with cache hits on repeats), the other keys stay where they were, and nothing reaches it.
//
// Without a haproxy binary the suite is skipped (developers' machines), except in CI (CI=true or
// SLUICE_REQUIRE_HAPROXY=1), where .ci/run installs Debian's package and a missing binary fails.

import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findHaproxy, HAPROXY_MISSING as MISSING, startHaproxy, waitFor, type Haproxy } from '../bench/haproxy.js';
import { makeModel } from '../models/make-model.js';
import { storePath } from '../src/service.js';
import { createApiKey } from '../src/store/api-keys.js';
import { SqliteStore } from '../src/store/sqlite-store.js';
import { startServe, stopServe, type ServeProcess } from './helpers/serve-process.js';

const haproxy = findHaproxy();
const required = process.env.CI === 'true' || process.env.CI === '1' || process.env.SLUICE_REQUIRE_HAPROXY === '1';
const ROUTE = '/v1/chat/completions';
const KEYS = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot'];
// Long enough for several full 16-token KV blocks, different per key.
const systemPrompt = (key: string) => `You are the ${key} assistant. Answer briefly and carefully about ${key}. `.repeat(6);

if (!haproxy && !required) console.warn(`HAProxy affinity test skipped: ${MISSING}`);

describe.runIf(!haproxy && required)('prompt_cache_key affinity behind HAProxy (CI)', () => {
  it('has a haproxy binary', () => {
    throw new Error(`CI needs HAProxy for the affinity test: ${MISSING}`);
  });
});

describe.skipIf(!haproxy)(`prompt_cache_key affinity behind HAProxy${haproxy ? ` (${haproxy})` : ` (skipped: ${MISSING})`}`, () => {
  let root: string;
  let key: string;
  const replicas = new Map<string, ServeProcess>();
  let lb: Haproxy | undefined;
  let lbOrigin: string;

  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-haproxy-'));
    const modelDir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
    // One key for every replica: made in the first data directory, whose store is then copied.
    const dataDirs = ['r1', 'r2', 'r3'].map((name) => [name, mkdtempSync(join(root, `${name}-`))] as const);
    const seed = new SqliteStore(storePath(dataDirs[0]![1]));
    key = (await createApiKey(seed, 'default', { admin: true })).key;
    await seed.close();
    for (const [, dir] of dataDirs.slice(1)) copyFileSync(storePath(dataDirs[0]![1]), storePath(dir));
    const started = await Promise.all(dataDirs.map(async ([name, dir]) => [name, await startServe([
      '--model', modelDir, '--port', '0', '--host', '127.0.0.1', '--data-dir', dir, '--backend', 'cpu', '--threads', '1',
      '--kv-cache-bytes', String(16 << 20), '--drain-seconds', '60', '--log-stats-interval', '0',
    ])] as const));
    for (const [name, p] of started) replicas.set(name, p);

    lb = await startHaproxy({ binary: haproxy!, dir: root, servers: started.map(([name, p]) => [name, p.origin.replace('http://', '')]) });
    lbOrigin = lb.origin;
  });

  afterAll(async () => {
    await lb?.stop();
    await Promise.all([...replicas.values()].map((p) => stopServe(p, 10_000)));
    if (root) rmSync(root, { recursive: true, force: true });
  });

  /** backend/server -> status (UP, DOWN, ...) from HAProxy's CSV status page. */
  const serverStates = () => lb!.serverStates();

  interface Sent { id: string; key: string | undefined; status: number; cached: number }

  async function send(id: string, cacheKey: string | undefined, i: number): Promise<Sent> {
    const res = await fetch(`${lbOrigin}${ROUTE}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-request-id': id },
      body: JSON.stringify({
        model: 'tiny', max_tokens: 2, temperature: 0,
        messages: [{ role: 'system', content: systemPrompt(cacheKey ?? 'general') }, { role: 'user', content: `Question ${i}?` }],
        ...(cacheKey !== undefined && { prompt_cache_key: cacheKey }),
      }),
    });
    const body = await res.json() as { usage?: { prompt_tokens_details?: { cached_tokens?: number } } };
    return { id, key: cacheKey, status: res.status, cached: body.usage?.prompt_tokens_details?.cached_tokens ?? -1 };
  }

  /** Each key's requests one after another (so repeats follow the first), keys and unkeyed requests concurrently. */
  async function round(tag: string, keys: string[], perKey: number, unkeyed: number): Promise<Sent[]> {
    const lanes = keys.map(async (k) => {
      const out: Sent[] = [];
      for (let i = 0; i < perKey; i++) out.push(await send(`${tag}-${k}-${i}`, k, i));
      return out;
    });
    const free = (async () => {
      const out: Sent[] = [];
      for (let i = 0; i < unkeyed; i++) out.push(await send(`${tag}-nokey-${i}`, undefined, i));
      return out;
    })();
    return (await Promise.all([...lanes, free])).flat();
  }

  /** The replica whose access log has the request id (exactly one must have it). */
  function replicaOf(id: string): string {
    const found = [...replicas].filter(([, p]) => p.requestIds(ROUTE).has(id)).map(([name]) => name);
    expect(found, `replicas that logged ${id}`).toHaveLength(1);
    return found[0]!;
  }

  /** key -> the replicas its requests landed on. */
  function placement(sent: Sent[]): Map<string, Set<string>> {
    const by = new Map<string, Set<string>>();
    for (const s of sent) {
      const k = s.key ?? '(none)';
      by.set(k, (by.get(k) ?? new Set()).add(replicaOf(s.id)));
    }
    return by;
  }

  async function logged(sent: Sent[]): Promise<void> {
    // An access line is written when the reply has been sent: wait until every request has one.
    await waitFor('every request in an access log', async () => (sent.every((s) =>
      [...replicas.values()].some((p) => p.requestIds(ROUTE).has(s.id))) ? true : undefined), 5_000);
  }

  it('routes each key to one replica, spreads unkeyed requests, and moves a drained replica\'s keys', async () => {
    // Phase 1: every replica healthy.
    const first = await round('p1', KEYS, 4, 12);
    expect(first.every((s) => s.status === 200), JSON.stringify(first.filter((s) => s.status !== 200))).toBe(true);
    await logged(first);
    const before = placement(first);
    const owner = new Map<string, string>();
    for (const k of KEYS) {
      expect([...before.get(k)!], `replicas of key ${k}`).toHaveLength(1);
      owner.set(k, [...before.get(k)!][0]!);
    }
    expect(before.get('(none)')!.size, 'replicas that served unkeyed requests').toBeGreaterThan(1);
    // Repeats of a key meet the prefix its first request left on its replica.
    for (const s of first.filter((s) => s.key !== undefined && !s.id.endsWith('-0'))) {
      expect(s.cached, `cached_tokens of ${s.id}`).toBeGreaterThan(0);
    }

    // Phase 2: drain the replica that owns the most keys.
    const counts = [...replicas.keys()].map((n) => [n, KEYS.filter((k) => owner.get(k) === n).length] as const);
    const [drained] = counts.reduce((a, b) => (b[1] > a[1] ? b : a));
    const moved = KEYS.filter((k) => owner.get(k) === drained);
    const stayed = KEYS.filter((k) => owner.get(k) !== drained);
    expect(moved.length).toBeGreaterThan(0);
    const victim = replicas.get(drained)!;
    victim.child.kill('SIGTERM');
    await waitFor('the drained replica\'s /ready to answer 503', async () => ((await fetch(`${victim.origin}/ready`)).status === 503 ? true : undefined));
    await waitFor(`HAProxy to mark ${drained} down`, async () => {
      const states = await serverStates();
      return states.get(`sluice_by_key/${drained}`)?.startsWith('DOWN') && states.get(`sluice_least_conn/${drained}`)?.startsWith('DOWN') ? true : undefined;
    });
    // Still draining, still serving whoever reaches it directly.
    expect(victim.child.exitCode).toBeNull();
    const direct = await fetch(`${victim.origin}/health`);
    expect(direct.status).toBe(200);

    const second = await round('p2', KEYS, 3, 6);
    expect(second.every((s) => s.status === 200), JSON.stringify(second.filter((s) => s.status !== 200))).toBe(true);
    await logged(second);
    expect(victim.requestIds(ROUTE).size, 'requests the drained replica answered').toBe(first.filter((s) => replicaOf(s.id) === drained).length);
    const after = placement(second);
    for (const k of KEYS) {
      const where = [...after.get(k)!];
      expect(where, `replicas of key ${k} after the drain`).toHaveLength(1);
      expect(where[0]).not.toBe(drained);
      // Consistent hashing: only the drained replica's keys moved.
      if (stayed.includes(k)) expect(where[0], `key ${k} stays`).toBe(owner.get(k));
    }
    for (const s of second.filter((s) => s.key !== undefined && !s.id.endsWith('-0'))) {
      expect(s.cached, `cached_tokens of ${s.id}`).toBeGreaterThan(0);
    }
    // Every request went to a replica HAProxy saw as up: the two left.
    expect(after.get('(none)')!.has(drained)).toBe(false);

    console.info(`HAProxy affinity: keys before ${JSON.stringify(Object.fromEntries(owner))}; ${drained} drained; `
      + `after ${JSON.stringify(Object.fromEntries(KEYS.map((k) => [k, [...after.get(k)!][0]])))}; unkeyed on ${[...before.get('(none)')!].join(', ')}`);
    // A second SIGTERM ends the drain; the replica exits 0.
    victim.child.kill('SIGTERM');
    expect(await victim.exited).toBe(0);
  });
});
