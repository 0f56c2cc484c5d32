// GET /metrics on the real server: scraped while concurrent requests of two organizations run, and
// parsed with a Prometheus text-format parser (prom2javascript; parse-prometheus-text-format
// merges every series of a labelled histogram into one, so it cannot check these); counters must move by exactly what the requests
// did (tokens from their usage, one histogram observation per generation, requests by route,
// status and organization), batch lines and webhook deliveries are counted by outcome, and the
// endpoint needs an admin key unless the operator made it public (then no organization is named).

import OpenAI from 'openai';
import { getMetricsFromIterator, type PromMetric } from 'prom2javascript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiKey } from '../../src/store/api-keys.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { chatLine, createBatch, waitForBatch } from '../helpers/batches.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

/** One series: a counter's or gauge's value, or a histogram's buckets, count and sum. */
interface Sample {
  labels: Record<string, string>;
  value?: number;
  buckets?: Record<string, number>;
  count?: number;
  sum?: number;
}

/** A parsed scrape: metric families by name. */
class Scrape {
  constructor(private readonly byName: Record<string, PromMetric>) {}

  family(name: string): PromMetric {
    const f = this.byName[name];
    if (!f) throw new Error(`no metric ${name}`);
    return f;
  }

  /** Series whose labels include `labels` ('' matches an empty or absent label). */
  samples(name: string, labels: Record<string, string> = {}): Sample[] {
    return (this.family(name).data as Sample[]).filter((m) => Object.entries(labels).every(([k, v]) => (m.labels[k] ?? '') === v));
  }

  /** Sum of the matching counters or gauges (histograms: of their counts). */
  value(name: string, labels: Record<string, string> = {}): number {
    return this.samples(name, labels).reduce((total, m) => total + (m.value ?? m.count!), 0);
  }
}

async function scrape(server: TestServer, key?: string): Promise<Scrape> {
  const res = await fetch(`${server.origin}/metrics`, key === undefined ? {} : { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  return new Scrape(await getMetricsFromIterator(text.split('\n')[Symbol.iterator]()));
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

let server: TestServer;
let receiver: WebhookReceiver;
let adminKey: string;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  server = await startTestServer({ webhooks: { allowPrivateAddresses: true, baseDelayMs: 20, timeoutMs: 5_000 } });
  adminKey = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
});
afterAll(async () => {
  await server?.close();
  await receiver?.close();
});

describe('GET /metrics under load', () => {
  it('counts what concurrent requests of two organizations did, scraped while they run', async () => {
    const acmeKey = await server.keyFor('acme');
    const client = (key: string) => new OpenAI({ baseURL: server.baseUrl, apiKey: key, maxRetries: 0 });
    const before = await scrape(server, adminKey);
    const chat = (key: string, i: number, content = `tell me about ${i}`) => client(key).chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 8 + 3 * i, temperature: 0,
    });
    const load = [
      ...Array.from({ length: 6 }, (_, i) => chat(server.key, i)),
      ...Array.from({ length: 2 }, (_, i) => chat(acmeKey, 10 + i)),
    ];
    // Scrapes while the requests run: each parses, and the KV pool adds up.
    const during = await Promise.all(Array.from({ length: 3 }, () => scrape(server, adminKey)));
    const completions = await Promise.all(load);
    for (const s of during) {
      expect(s.value('sluice_kv_cache_blocks', { model: 'tiny' })).toBe(server.service.registry.models[0]!.engine.info.numBlocks);
    }
    // The same long prompt twice, one after the other: the second is served from the prefix cache.
    const long = `${'the quick brown fox jumps over the lazy dog '.repeat(12)}`;
    completions.push(await chat(server.key, 0, long), await chat(server.key, 1, long));
    expect(completions.at(-1)!.usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThan(0);
    await expect(fetch(`${server.origin}/metrics`)).resolves.toMatchObject({ status: 401 });

    const after = await scrape(server, adminKey);
    const delta = (name: string, labels: Record<string, string> = {}) => after.value(name, labels) - before.value(name, labels);
    const usage = completions.map((c) => c.usage!);
    const tiny = { model: 'tiny', window: 'standard' };

    const route = { route: '/v1/chat/completions', method: 'POST', status: '200' };
    expect(delta('sluice_http_requests_total', { ...route, organization: 'default' })).toBe(8);
    expect(delta('sluice_http_requests_total', { ...route, organization: 'acme' })).toBe(2);
    expect(delta('sluice_http_requests_total', { route: '/metrics', status: '401', organization: '' })).toBe(1);
    // The scrapes of `during` (the admin's organization) are counted once they are answered.
    expect(delta('sluice_http_requests_total', { route: '/metrics', status: '200', organization: 'ops' })).toBe(4);
    expect(delta('sluice_http_request_duration_seconds', { route: '/v1/chat/completions' })).toBe(10);

    expect(delta('sluice_prompt_tokens_total', tiny)).toBe(sum(usage.map((u) => u.prompt_tokens)));
    expect(delta('sluice_generation_tokens_total', tiny)).toBe(sum(usage.map((u) => u.completion_tokens)));
    expect(delta('sluice_prompt_cached_tokens_total', tiny)).toBe(sum(usage.map((u) => u.prompt_tokens_details!.cached_tokens!)));
    for (const reason of ['stop', 'length']) {
      expect(delta('sluice_requests_finished_total', { ...tiny, reason })).toBe(completions.filter((c) => c.choices[0]!.finish_reason === reason).length);
    }
    expect(delta('sluice_requests_finished_total', { ...tiny, reason: 'failed' })).toBe(0);
    for (const histogram of ['sluice_time_to_first_token_seconds', 'sluice_e2e_request_latency_seconds', 'sluice_request_queue_time_seconds']) {
      expect(delta(histogram, tiny), histogram).toBe(10);
      expect(after.samples(histogram, tiny)[0]!.sum).toBeGreaterThan(0);
    }
    expect(delta('sluice_time_per_output_token_seconds', tiny)).toBe(usage.filter((u) => u.completion_tokens > 1).length);
    // Every uncached prompt token and every generated token but the last went through a step once
    // (CPU: the serial step loop, no preemption in a roomy pool).
    const computed = sum(usage.map((u) => u.prompt_tokens - u.prompt_tokens_details!.cached_tokens! + u.completion_tokens - 1));
    const stepTokens = (s: Scrape) => s.samples('sluice_engine_step_tokens', { model: 'tiny' })[0]?.sum ?? 0;
    expect(stepTokens(after) - stepTokens(before)).toBe(computed);
    expect(delta('sluice_engine_step_duration_seconds', { model: 'tiny' })).toBeGreaterThan(0);
    expect(after.samples('sluice_preemptions_total', { model: 'tiny' }).map((m) => [m.labels.window, m.value]))
      .toEqual([['asap', 0], ['standard', 0], ['flex', 0]]);
    expect(after.samples('sluice_requests_running', { model: 'tiny' }).map((m) => m.labels.window)).toEqual(['asap', 'standard', 'flex']);
    expect(after.family('sluice_requests_waiting').type).toBe('gauge');
    expect(after.family('sluice_time_to_first_token_seconds').type).toBe('histogram');
    const ratio = after.value('sluice_kv_cache_usage_ratio', { model: 'tiny' });
    expect(ratio).toBeGreaterThanOrEqual(0);
    expect(ratio).toBeLessThanOrEqual(1);
  });

  it('counts batch lines and webhook deliveries by outcome', async () => {
    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const before = await scrape(server, adminKey);
    const batch = await createBatch(client, [chatLine('a', 'one'), chatLine('b', 'two'), chatLine('c', 'three')]);
    expect((await waitForBatch(client, batch.id)).status).toBe('completed');
    // The receiver answers 500 first, then 200: one retry, then delivered.
    const hook = receiver.hook([500], 200);
    const res = await client.responses.create({
      model: 'tiny', input: 'hi', max_output_tokens: 4, metadata: { completion_webhook: hook.url },
    } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    expect(res.status).not.toBe('failed');
    await hook.waitForCalls(2);
    let after = await scrape(server, adminKey);
    // The outcome is counted once stored, just after the receiver answered.
    for (let i = 0; i < 200 && after.value('sluice_webhook_deliveries_total', { outcome: 'delivered' }) === before.value('sluice_webhook_deliveries_total', { outcome: 'delivered' }); i++) {
      await new Promise((r) => setTimeout(r, 10));
      after = await scrape(server, adminKey);
    }
    const delta = (name: string, labels: Record<string, string> = {}) => after.value(name, labels) - before.value(name, labels);
    expect(delta('sluice_batch_lines_total', { outcome: 'completed' })).toBe(3);
    expect(delta('sluice_batch_lines_total', { outcome: 'failed' })).toBe(0);
    expect(delta('sluice_webhook_deliveries_total', { outcome: 'delivered' })).toBe(1);
    expect(delta('sluice_webhook_deliveries_total', { outcome: 'failed' })).toBe(0);
    expect(delta('sluice_webhook_retries_total')).toBe(1);
  });
});

describe('who may scrape', () => {
  it('needs an admin key: none is 401, another key 403, both in the error envelope', async () => {
    const none = await fetch(`${server.origin}/metrics`);
    expect(none.status).toBe(401);
    expect((await none.json()).error.code).toBe('missing_api_key');
    const user = await fetch(`${server.origin}/metrics`, { headers: { authorization: `Bearer ${server.key}` } });
    expect(user.status).toBe(403);
    expect((await user.json()).error).toMatchObject({ type: 'permission_error', code: 'admin_key_required' });
    await scrape(server, adminKey);
  });

  it('is public with --metrics-public, and then names no organization', async () => {
    const open = await startTestServer({ metrics: { public: true } });
    try {
      const client = new OpenAI({ baseURL: open.baseUrl, apiKey: open.key, maxRetries: 0 });
      await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
      await scrape(open);
      const s = await scrape(open);
      const series = s.samples('sluice_http_requests_total');
      expect(series.find((m) => m.labels.route === '/v1/chat/completions')!.value).toBe(1);
      expect(new Set(series.map((m) => m.labels.organization ?? ''))).toEqual(new Set(['']));
    } finally {
      await open.close();
    }
  });

  it('names at most maxOrganizations organizations; later ones count as _other', async () => {
    const capped = await startTestServer({ metrics: { maxOrganizations: 1 } });
    try {
      const admin = (await createApiKey(capped.service.store, 'ops', { admin: true })).key;
      const ask = (key: string) => new OpenAI({ baseURL: capped.baseUrl, apiKey: key, maxRetries: 0 }).models.list();
      await ask(capped.key);
      await ask(await capped.keyFor('acme'));
      await ask(await capped.keyFor('zeta'));
      const s = await scrape(capped, admin);
      const byOrg = Object.fromEntries(s.samples('sluice_http_requests_total', { route: '/v1/models' })
        .map((m) => [m.labels.organization, m.value]));
      expect(byOrg).toEqual({ default: 1, _other: 2 });
    } finally {
      await capped.close();
    }
  });
});
