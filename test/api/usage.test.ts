// The usage ledger end to end: requests on every surface (Responses foreground and background,
// Chat Completions with n choices, Messages, a batch), then GET /v1/admin/usage and `sluice usage`
// must report exactly the tokens the responses reported, priced from the catalog's rates
// (negotiated ones for acme). Expected costs are computed here independently, in integer
// picodollars: tokens × (USD per 1M tokens × 10^6).
// The CLI part runs dist/src/cli.js: build first (npx tsc -p tsconfig.json).

import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testCatalog } from '../helpers/api-catalog.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { chatLine, closeNow, createBatch, readResults, waitForBatch } from '../helpers/batches.js';
import { createApiKey } from '../../src/store/api-keys.js';

const run = promisify(execFile);
const CLI = join(import.meta.dirname, '..', '..', 'dist', 'src', 'cli.js');

let server: TestServer;
let adminKey: string;
let acmeKey: string;

beforeAll(async () => {
  server = await startTestServer({ catalog: testCatalog });
  adminKey = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
  acmeKey = await server.keyFor('acme');
});
afterAll(async () => { if (server) await closeNow(server); });

async function call(method: string, path: string, key: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: await res.json() };
}

/** Rates in micro-USD per 1M tokens (so a token costs rate picodollars); a cached rate of 0 is the input rate. */
type Rates = [input: number, cached: number, output: number];
const RATES: Record<string, Rates> = {
  'default/tiny/standard': [200_000, 50_000, 600_000],
  'default/tiny/asap': [400_000, 100_000, 1_200_000],
  'acme/tiny/standard': [150_000, 150_000, 500_000], // negotiated, cached 0
  'default/tiny-asap/asap': [1_000_000, 1_000_000, 2_000_000],
  'default/tiny-flex/flex': [50_000, 50_000, 100_000],
};

/** Exact decimal string of picodollars. */
function usd(pico: bigint): string {
  const s = pico.toString().padStart(13, '0');
  return `${s.slice(0, -12)}.${s.slice(-12)}`.replace(/\.?0+$/, '') || '0';
}

describe('usage ledger', () => {
  // group key -> [requests, input tokens (cached included), cached tokens, output tokens]
  const expected = new Map<string, [number, number, number, number]>();
  const add = (key: string, input: number, cached: number | undefined, output: number) => {
    const [r, i, c, o] = expected.get(key) ?? [0, 0, 0, 0];
    expected.set(key, [r + 1, i + input, c + (cached ?? 0), o + output]);
  };

  it('records a request on every surface', async () => {
    const fg = await call('POST', '/responses', acmeKey, { model: 'tiny', input: 'Hello there', max_output_tokens: 5 });
    expect(fg.status).toBe(200);
    add('acme/tiny/standard', fg.body.usage.input_tokens, fg.body.usage.input_tokens_details?.cached_tokens, fg.body.usage.output_tokens);

    const bg = await call('POST', '/responses', server.key,
      { model: 'tiny', input: 'Background work', max_output_tokens: 4, background: true, metadata: { completion_window: 'asap' } });
    expect(bg.status).toBe(200);
    let done = bg.body;
    for (let i = 0; i < 400 && done.status === 'in_progress'; i++) {
      await new Promise((r) => setTimeout(r, 25));
      done = (await call('GET', `/responses/${bg.body.id}`, server.key)).body;
    }
    expect(done.status).toMatch(/^(completed|incomplete)$/);
    add('default/tiny/asap', done.usage.input_tokens, done.usage.input_tokens_details?.cached_tokens, done.usage.output_tokens);

    const chat = await call('POST', '/chat/completions', server.key,
      { model: 'tiny-asap', messages: [{ role: 'user', content: 'Two choices' }], max_tokens: 3, n: 2 });
    expect(chat.status).toBe(200);
    add('default/tiny-asap/asap', chat.body.usage.prompt_tokens, chat.body.usage.prompt_tokens_details?.cached_tokens, chat.body.usage.completion_tokens);

    const msg = await call('POST', '/messages', server.key,
      { model: 'tiny', max_tokens: 6, messages: [{ role: 'user', content: 'A message' }] });
    expect(msg.status).toBe(200);
    // Messages' input_tokens excludes cache reads (Anthropic's convention).
    const cacheRead = msg.body.usage.cache_read_input_tokens ?? 0;
    add('default/tiny/standard', msg.body.usage.input_tokens + cacheRead, cacheRead, msg.body.usage.output_tokens);

    const client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const batch = await createBatch(client, [
      chatLine('a', 'First line', { model: 'tiny-flex', max_tokens: 2 }),
      chatLine('b', 'Second line', { model: 'tiny-flex', max_tokens: 3 }),
      chatLine('c', 'Bad line', { model: 'tiny-flex', temperature: 9 }), // an error line: not billed
    ], '24h');
    const ended = await waitForBatch(client, batch.id);
    expect(ended.request_counts).toEqual({ total: 3, completed: 2, failed: 1 });
    for (const line of await readResults(client, ended.output_file_id)) {
      const u = line.response!.body['usage'];
      add('default/tiny-flex/flex', u.prompt_tokens, u.prompt_tokens_details?.cached_tokens, u.completion_tokens);
    }

    // A failed request (unknown model) is not billed.
    expect((await call('POST', '/responses', server.key, { model: 'nope', input: 'x' })).status).toBe(404);
  });

  function expectedReport() {
    let total = 0n;
    const order = (key: string) => key.split('/').map((part) => part.padEnd(32, ' ')).join('');
    const data = [...expected.entries()].sort(([a], [b]) => (order(a) < order(b) ? -1 : 1)).map(([key, [requests, input, cached, output]]) => {
      const [organization, model, tier] = key.split('/');
      const [inRate, cachedRate, outRate] = RATES[key]!.map(BigInt) as [bigint, bigint, bigint];
      const cost = BigInt(input - cached) * inRate + BigInt(cached) * cachedRate + BigInt(output) * outRate;
      total += cost;
      return { organization, model, tier, requests, input_tokens: input, cached_tokens: cached, output_tokens: output, cost: usd(cost) };
    });
    return { data, total: usd(total) };
  }

  it('GET /v1/admin/usage returns exact totals per organization × model × tier', async () => {
    const res = await call('GET', '/admin/usage', adminKey);
    expect(res.status).toBe(200);
    const want = expectedReport();
    expect(res.body.object).toBe('usage_report');
    expect(res.body.data.map(({ cost_usd, ...rest }: Record<string, unknown>) => rest)).toEqual(want.data);
    expect(res.body.total.cost).toBe(want.total);
    expect(res.body.total.requests).toBe(6);

    const acme = await call('GET', '/admin/usage?org=acme', adminKey);
    expect(acme.body.data).toHaveLength(1);
    expect(acme.body.data[0].organization).toBe('acme');
    expect(acme.body.organization).toBe('acme');

    const future = await call('GET', '/admin/usage?since=2999-01-01', adminKey);
    expect(future.body).toMatchObject({ data: [], since: '2999-01-01T00:00:00.000Z', total: { requests: 0, cost: '0' } });
    expect((await call('GET', '/admin/usage?since=2026-02-30', adminKey)).status).toBe(400);
  });

  it('refuses keys that are not admin keys with 403 permission_error', async () => {
    const res = await call('GET', '/admin/usage', acmeKey);
    expect(res.status).toBe(403);
    expect(res.body.error).toMatchObject({ type: 'permission_error', code: 'admin_key_required' });
    expect((await call('GET', '/admin/usage', 'sk-sluice-nope')).status).toBe(401);
  });

  it('`sluice usage --json` prints the same report', async () => {
    const viaHttp = (await call('GET', '/admin/usage', adminKey)).body;
    const { stdout } = await run(process.execPath, [CLI, 'usage', '--data-dir', server.dataDir, '--json']);
    expect(JSON.parse(stdout)).toEqual(viaHttp);
    const { stdout: table } = await run(process.execPath, [CLI, 'usage', '--data-dir', server.dataDir, '--org', 'acme']);
    expect(table.split('\n')[1]).toMatch(/^acme\ttiny\tstandard\t1\t/);
    await expect(run(process.execPath, [CLI, 'usage', '--data-dir', server.dataDir, '--since', 'soon'])).rejects.toThrow(/since must be/);
  });
});
