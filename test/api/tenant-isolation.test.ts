// Isolation between requests and organizations over HTTP (issue: "no request can hurt anyone
// else's"): a sampling value the engine cannot hold fails that request alone with a 400; a long
// input is refused by length before tokenizing, and one under the limit is tokenized off the event
// loop (health checks stay fast); one organization never hits another's cached prefix.

import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
let keyB: string;
/** The tiny checkpoint with its context raised to 32k tokens (so multi-MB inputs are in range). */
const LONG_CONTEXT = 32_768;

beforeAll(async () => {
  server = await startTestServer({
    catalog: (dir) => {
      const path = join(dir, 'config.json');
      writeFileSync(path, JSON.stringify({ ...JSON.parse(readFileSync(path, 'utf8')), max_position_embeddings: LONG_CONTEXT }));
      return { models: [{ id: 'tiny', checkpoint: dir }] };
    },
  });
  keyB = await server.keyFor('org-b');
});
afterAll(async () => { await server?.close(); });

async function post(path: string, body: unknown, key = server.key): Promise<{ status: number; body: Record<string, any> }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() as Record<string, any> };
}

describe('a bad sampling value fails its own request only', () => {
  it('top_k 2147483648 on Messages is a 400 while every other request in flight completes', async () => {
    const others = Array.from({ length: 4 }, (_, i) => post('/responses', { model: 'tiny', input: `hello ${i}`, max_output_tokens: 8 }, keyB));
    const bad = post('/messages', { model: 'tiny', max_tokens: 8, top_k: 2147483648, messages: [{ role: 'user', content: 'hi' }] });
    const [badRes, ...rest] = await Promise.all([bad, ...others]);
    expect(badRes.status).toBe(400);
    expect(badRes.body['error']).toMatchObject({ type: 'invalid_request_error', param: 'top_k' });
    for (const r of rest) expect(r.status).toBe(200);
    // Also with an idempotency key: the key is not left locked.
    const headers = { 'x-api-key': server.key, 'content-type': 'application/json', 'idempotency-key': 'k-topk' };
    const body = JSON.stringify({ model: 'tiny', max_tokens: 4, top_k: 4_000_000_000, messages: [{ role: 'user', content: 'hi' }] });
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`${server.baseUrl}/messages`, { method: 'POST', headers, body });
      expect(res.status).toBe(400);
    }
  });

  it('top_k up to the vocabulary is served', async () => {
    const vocab = server.service.registry.models[0]!.engine.info.vocabSize;
    const ok = await post('/messages', { model: 'tiny', max_tokens: 3, top_k: vocab, messages: [{ role: 'user', content: 'hi' }] });
    expect(ok.status).toBe(200);
    const over = await post('/messages', { model: 'tiny', max_tokens: 3, top_k: vocab + 1, messages: [{ role: 'user', content: 'hi' }] });
    expect(over.status).toBe(400);
  });
});

describe('long inputs', () => {
  it('refuses an input longer than the context can hold by its length, before tokenizing', async () => {
    const engine = server.service.registry.models[0]!.engine;
    const limit = engine.maxInputChars(LONG_CONTEXT);
    const res = await post('/responses', { model: 'tiny', input: 'a'.repeat(limit + 1), max_output_tokens: 1 });
    expect(res.status).toBe(400);
    expect(res.body['error']).toMatchObject({ code: 'input_too_long', param: 'input' });
  });

  it('tokenizes long inputs off the event loop: /health keeps answering meanwhile', async () => {
    // Three concurrent inputs of 600k characters (each several seconds of tokenizing): more tokens
    // than the context, so each ends in a 400, but only after the worker tokenized it.
    const text = (salt: number) => Array.from({ length: 120_000 }, (_, i) => `w${(i * 31 + salt) % 997} `).join('').slice(0, 600_000);
    const started = Date.now();
    const big = [0, 1, 2].map((i) => post('/responses', { model: 'tiny', input: text(i), max_output_tokens: 1 }, i === 1 ? keyB : server.key));
    let settled = false;
    void Promise.all(big).finally(() => { settled = true; });
    const latencies: number[] = [];
    while (!settled) {
      const t0 = performance.now();
      const res = await fetch(`${server.origin}/health`);
      expect(res.status).toBe(200);
      latencies.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const r of await Promise.all(big)) {
      expect(r.status).toBe(400);
      expect(r.body['error'].code).toBe('context_length_exceeded');
    }
    const elapsed = Date.now() - started;
    expect(elapsed).toBeGreaterThan(500);  // the work was real
    expect(latencies.length).toBeGreaterThan(5);
    // Tokenizing one of these inputs on the event loop would hold a /health answer for seconds (the
    // whole tokenization); off the loop it waits only for CPU time shared with the workers. The
    // bound separates the two without depending on how loaded the 2-core machine is.
    expect(Math.max(...latencies)).toBeLessThan(Math.min(500, elapsed / 4));
  });
});

describe('prefix cache between organizations', () => {
  it('org B sending org A\'s prompt gets no cached tokens; A\'s own repeat does', async () => {
    const instructions = 'You are the assistant of a private company; here is its confidential context. '.repeat(6);
    const body = { model: 'tiny', instructions, input: 'Summarize.', max_output_tokens: 2, temperature: 0 };
    const cached = (r: { body: Record<string, any> }) => r.body['usage'].input_tokens_details.cached_tokens as number;
    expect(cached(await post('/responses', body))).toBe(0);
    expect(cached(await post('/responses', body, keyB))).toBe(0);
    expect(cached(await post('/responses', body, keyB))).toBeGreaterThan(100);  // B's own, now
    expect(cached(await post('/responses', body))).toBeGreaterThan(100);
    // The same prompt_cache_key in two organizations groups nothing across them.
    const keyed = { ...body, instructions: `Keyed. ${instructions}`, prompt_cache_key: 'shared-key' };
    expect(cached(await post('/responses', keyed))).toBe(0);
    expect(cached(await post('/responses', keyed, keyB))).toBe(0);
  });
});
