// The dashboard on the real server: the page is fixed text (no data, no key, no organization in
// it) with a Content-Security-Policy that allows this origin's script and style only; its data
// endpoint takes an admin key like /metrics (401 / 403 / 200); and its numbers move by exactly
// what real requests did: generations and tokens (from the responses' usage), the recent requests
// (route, status, organization, tokens), each organization's usage and cost (computed here from
// the catalog's rates, in integer picodollars), and a throughput over the time between reads. The
// plots' history holds, per interval, the tokens and generations of real requests and the queue
// they made, and each service keeps its own.

import vm from 'node:vm';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey } from '../../src/store/api-keys.js';
import type { DashboardData } from '../../src/dashboard/dashboard-data.js';
import { testCatalog } from '../helpers/api-catalog.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
let adminKey: string;
let acmeKey: string;

beforeAll(async () => {
  // Samples every 50 ms (the service's default is 5 s), so that a request spans several.
  server = await startTestServer({ catalog: testCatalog, dashboardHistory: { intervalMs: 50, capacity: 5_000 } });
  adminKey = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
  acmeKey = await server.keyFor('acme');
});
afterAll(async () => { await server?.close(); });

async function data(key = adminKey): Promise<DashboardData> {
  const res = await fetch(`${server.origin}/dashboard/data`, { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  expect(res.headers.get('cache-control')).toBe('no-store');
  return (await res.json()) as DashboardData;
}

/** Exact decimal string of picodollars (as the ledger writes costs). */
function usd(pico: bigint): string {
  const s = pico.toString().padStart(13, '0');
  return `${s.slice(0, -12)}.${s.slice(-12)}`.replace(/\.?0+$/, '') || '0';
}

describe('GET /dashboard/data', () => {
  // First in this file: the server's first read of the data, so the throughput's base is `before`.
  it('moves by what real requests of two organizations did', async () => {
    const before = await data();
    expect(before.throughput).toBeNull();
    expect(before.usage.organizations).toEqual([]);

    const chat = (key: string, content: string, maxTokens: number) => new OpenAI({ baseURL: server.baseUrl, apiKey: key, maxRetries: 0 })
      .chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0 });
    const results = await Promise.all([
      chat(acmeKey, 'the first question of acme', 6), chat(acmeKey, 'and a second, longer one from acme', 9),
      chat(server.key, 'one from the default organization', 4),
    ]);
    // A request refused before any work: in the recent requests, nowhere in the usage.
    const refused = await fetch(`${server.baseUrl}/models`, { headers: { authorization: 'Bearer not-a-key' } });
    expect(refused.status).toBe(401);
    await fetch(`${server.origin}/health`);

    const after = await data();
    const prompt = results.reduce((n, r) => n + r.usage!.prompt_tokens, 0);
    const completion = results.reduce((n, r) => n + r.usage!.completion_tokens, 0);
    expect(completion).toBeGreaterThan(0);
    expect(after.totals.generations - before.totals.generations).toBe(3);
    expect(after.totals.prompt_tokens - before.totals.prompt_tokens).toBe(prompt);
    expect(after.totals.generation_tokens - before.totals.generation_tokens).toBe(completion);
    expect(after.totals.computed_tokens).toBeGreaterThan(before.totals.computed_tokens);

    // Throughput over the time since `before`: the token difference divided by that time.
    const t = after.throughput!;
    expect(t.interval_seconds).toBeGreaterThan(0);
    expect(t.generation_tokens_per_s * t.interval_seconds).toBeCloseTo(completion, -1);
    expect(t.generations_per_s * t.interval_seconds).toBeCloseTo(3, 0);

    // Recent requests: newest first; probes and the dashboard's own reads are not kept.
    const recent = after.recent_requests;
    expect(recent[0]).toMatchObject({ method: 'GET', route: '/v1/models', status: 401, organization: null, tokens: null });
    expect(recent.some((r) => r.route === '/health' || r.route.startsWith('/dashboard'))).toBe(false);
    const chats = recent.filter((r) => r.route === '/v1/chat/completions');
    expect(chats).toHaveLength(3);
    expect(chats.map((r) => r.organization).sort()).toEqual(['acme', 'acme', 'default']);
    expect(chats.every((r) => r.status === 200 && r.duration_ms > 0)).toBe(true);
    expect(chats.map((r) => r.tokens!.completion).sort()).toEqual(results.map((r) => r.usage!.completion_tokens).sort());

    // Usage and cost per organization, from the ledger: chat completions run in the standard
    // window; acme pays its negotiated rate (input 0.15, cached at the input rate, output 0.5 per
    // 1M tokens), default the published one (0.2, 0.05, 0.6). Picodollars = tokens × micro-USD per 1M.
    const cost = (rates: [number, number, number], rs: typeof results) => rs.reduce((pico, r) => {
      const cached = r.usage!.prompt_tokens_details?.cached_tokens ?? 0;
      return pico + BigInt(r.usage!.prompt_tokens - cached) * BigInt(rates[0]) + BigInt(cached) * BigInt(rates[1])
        + BigInt(r.usage!.completion_tokens) * BigInt(rates[2]);
    }, 0n);
    const acme = cost([150_000, 150_000, 500_000], results.slice(0, 2));
    const deflt = cost([200_000, 50_000, 600_000], results.slice(2));
    expect(after.usage.organizations).toEqual([
      {
        organization: 'acme', requests: 2, input_tokens: results[0]!.usage!.prompt_tokens + results[1]!.usage!.prompt_tokens,
        cached_tokens: expect.any(Number), output_tokens: results[0]!.usage!.completion_tokens + results[1]!.usage!.completion_tokens,
        cost: usd(acme), cost_usd: Number(usd(acme)),
      },
      expect.objectContaining({ organization: 'default', requests: 1, cost: usd(deflt) }),
    ]);
    expect(after.usage.total).toMatchObject({ requests: 3, input_tokens: prompt, output_tokens: completion, cost: usd(acme + deflt) });

    // Queues and KV per model and window. The pool is the engine's last step's: the blocks of the
    // finished sequences are freed by the next step, so wait for it; then nothing runs or waits,
    // nothing is used, and the prompts' blocks stay cached.
    const tiny = (d: DashboardData) => d.models.find((m) => m.model === 'tiny')!;
    const blocks = (d: DashboardData) => tiny(d).kv_blocks.used + tiny(d).kv_blocks.cached + tiny(d).kv_blocks.free;
    expect(tiny(after).windows.map((w) => w.window)).toEqual(['asap', 'standard', 'flex']);
    expect(blocks(after)).toBeGreaterThan(0);
    expect(blocks(after)).toBe(blocks(before));
    expect(tiny(after).kv_usage_ratio).toBeCloseTo(tiny(after).kv_blocks.used / blocks(after), 9);
    let idle = after;
    for (let i = 0; i < 200 && tiny(idle).kv_blocks.used > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
      idle = await data();
    }
    expect(tiny(idle).kv_blocks).toMatchObject({ used: 0, cached: expect.any(Number) });
    expect(tiny(idle).kv_blocks.cached).toBeGreaterThan(tiny(before).kv_blocks.cached);
    expect(tiny(idle).kv_usage_ratio).toBe(0);
    expect(tiny(idle).windows.every((w) => w.running === 0 && w.waiting === 0)).toBe(true);
  });

  it('keeps a history of output tokens, ended generations and the queue per interval, from real requests', async () => {
    // Begin at a sample's end, so that the samples after it cover nothing from before this test.
    const entered = Date.now();
    let before = await data();
    for (let i = 0; i < 200 && !before.history.samples.some((s) => Date.parse(s.time) > entered); i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      before = await data();
    }
    const startMs = Date.parse(before.history.samples.at(-1)!.time);
    // 8 choices of up to 400 tokens: they run together for many steps, so samples see them running.
    const r = await new OpenAI({ baseURL: server.baseUrl, apiKey: acmeKey, maxRetries: 0 }).chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'a long answer, eight times' }], max_tokens: 400, n: 8, temperature: 1, seed: 7,
    });
    const endMs = Date.now();
    // Wait for a sample that ends after the reply (every step of the request is counted by then)
    // and finds nothing running (the step after the last frees the finished sequences).
    let after = await data();
    const settled = (d: DashboardData) => d.history.samples.some((s) => Date.parse(s.time) > endMs + 60)
      && d.history.samples.at(-1)!.running === 0;
    for (let i = 0; i < 200 && !settled(after); i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      after = await data();
    }
    expect(after.history).toMatchObject({ interval_seconds: 0.05, capacity: 5_000 });
    // Only this request ran since startMs (the tests of this file run one at a time).
    const mine = after.history.samples.filter((s) => Date.parse(s.time) > startMs);
    expect(mine.length).toBeGreaterThan(1);
    const sum = (key: 'requests' | 'output_tokens') => mine.reduce((n, s) => n + s[key], 0);
    expect(sum('requests')).toBe(8);
    // Tokens as sampled, step by step: at least those the choices returned, and at most one more
    // per choice (a step planned while the one that finished a choice was still running).
    const completion = r.usage!.completion_tokens;
    expect(sum('output_tokens')).toBeGreaterThanOrEqual(completion);
    expect(sum('output_tokens')).toBeLessThanOrEqual(completion + 8);
    expect(Math.max(...mine.map((s) => s.running))).toBeGreaterThan(0);
    expect(Math.max(...mine.map((s) => s.running + s.waiting))).toBeLessThanOrEqual(8);
    expect(mine.at(-1)).toMatchObject({ running: 0, waiting: 0 });
    for (const s of mine) {
      expect(s.seconds).toBeGreaterThan(0);
      // Rates to the hundredth.
      expect(Math.abs(s.output_tokens_per_s - s.output_tokens / s.seconds)).toBeLessThanOrEqual(0.005 + 1e-9);
      expect(Math.abs(s.requests_per_s - s.requests / s.seconds)).toBeLessThanOrEqual(0.005 + 1e-9);
    }
    // Oldest first, one every interval or so.
    const times = after.history.samples.map((s) => Date.parse(s.time));
    expect(times).toEqual([...times].sort((a, b) => a - b));
  });

  it('keeps each service\'s history to itself', async () => {
    const other = await startTestServer({ dashboardHistory: { intervalMs: 50 } });
    try {
      const ops = (await createApiKey(other.service.store, 'ops', { admin: true })).key;
      await new Promise((resolve) => setTimeout(resolve, 200));
      const res = await fetch(`${other.origin}/dashboard/data`, { headers: { authorization: `Bearer ${ops}` } });
      const own = (await res.json()) as DashboardData;
      expect(own.history.samples.length).toBeGreaterThan(0);
      // The first server has run generations all along; none of them is in this one's history.
      expect(own.history.samples.every((s) => s.requests === 0 && s.output_tokens === 0 && s.running === 0)).toBe(true);
      expect((await data()).history.samples.some((s) => s.requests > 0)).toBe(true);
    } finally {
      await other.close();
    }
  });

  it('needs an admin key: 401 without a key or with an unknown one, 403 with another key', async () => {
    const get = (headers: Record<string, string>) => fetch(`${server.origin}/dashboard/data`, { headers });
    const none = await get({});
    expect(none.status).toBe(401);
    expect((await none.json()).error).toMatchObject({ type: 'authentication_error', code: 'missing_api_key' });
    const unknown = await get({ authorization: 'Bearer sk-not-a-key' });
    expect(unknown.status).toBe(401);
    expect((await unknown.json()).error.code).toBe('invalid_api_key');
    const tenant = await get({ authorization: `Bearer ${acmeKey}` });
    expect(tenant.status).toBe(403);
    expect((await tenant.json()).error).toMatchObject({ type: 'permission_error', code: 'admin_key_required' });
    expect((await get({ authorization: `Bearer ${adminKey}` })).status).toBe(200);
  });

  it('needs an admin key even where /metrics is public', async () => {
    const open = await startTestServer({ metrics: { public: true } });
    try {
      expect((await fetch(`${open.origin}/metrics`)).status).toBe(200);
      expect((await fetch(`${open.origin}/dashboard/data`)).status).toBe(401);
      const res = await fetch(`${open.origin}/dashboard/data`, { headers: { authorization: `Bearer ${open.key}` } });
      expect(res.status).toBe(403);
    } finally {
      await open.close();
    }
  });
});

describe('GET /dashboard', () => {
  it('serves fixed HTML (no data, no key, no organization) under a same-origin-only CSP', async () => {
    const res = await fetch(`${server.origin}/dashboard`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    const csp = Object.fromEntries(res.headers.get('content-security-policy')!.split(';').map((d) => {
      const [name, ...values] = d.trim().split(/\s+/);
      return [name!, values.join(' ')];
    }));
    expect(csp).toMatchObject({
      'default-src': "'none'", 'script-src': "'self'", 'style-src': "'self'", 'connect-src': "'self'",
      'frame-ancestors': "'none'", 'base-uri': "'none'",
    });
    const html = await res.text();
    // Every script is a same-origin file; nothing inline, nothing from elsewhere.
    const scripts = [...html.matchAll(/<script\b([^>]*)>([\s\S]*?)<\/script>/g)];
    expect(scripts.length).toBeGreaterThan(0);
    for (const [, attrs, body] of scripts) {
      expect(body!.trim()).toBe('');
      expect(attrs).toMatch(/\bsrc="dashboard\/[^":]+"/);
    }
    expect(html).not.toMatch(/\son[a-z]+=/i); // no inline event handlers
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//);
    // By now the server has served requests of acme, default and ops: none of it is in the page.
    for (const secret of [adminKey, acmeKey, server.key, 'acme', 'ops']) expect(html).not.toContain(secret);
    expect(html).toBe(await (await fetch(`${server.origin}/dashboard`)).text());
  });

  it('serves the script and the style sheet it links, the script as valid JavaScript', async () => {
    const js = await fetch(`${server.origin}/dashboard/app.js`);
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    const source = await js.text();
    expect(() => new vm.Script(source)).not.toThrow();
    expect(source).toMatch(/fetch\(['"]dashboard\/data['"]/);
    expect(source).not.toMatch(/innerHTML|outerHTML|insertAdjacentHTML|document\.write/);
    const css = await fetch(`${server.origin}/dashboard/app.css`);
    expect(css.status).toBe(200);
    expect(css.headers.get('content-type')).toBe('text/css; charset=utf-8');
    expect(await css.text()).toContain('.kv-bar');
  });
});
