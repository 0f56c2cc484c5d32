// Prompt tokens served from the prefix cache, as each surface reports them: Responses
// input_tokens_details.cached_tokens, Chat Completions prompt_tokens_details.cached_tokens,
// Messages cache_read_input_tokens (with input_tokens excluding them, Anthropic's convention).
// A repeated long system prompt is served from the cache at block granularity, and the greedy
// text is the same as without the hit.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
beforeAll(async () => { server = await startTestServer(); });
afterAll(async () => { await server?.close(); });

const SYSTEM = 'You answer questions about rivers, lakes and the sea. '.repeat(12);
const BLOCK = 16;

async function post(path: string, body: unknown): Promise<Record<string, any>> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(res.status).toBe(200);
  return await res.json() as Record<string, any>;
}

describe('cached_tokens in usage', () => {
  it('reports the shared prefix served from the cache on every surface, in whole blocks', async () => {
    const first = await post('/responses', { model: 'tiny', instructions: SYSTEM, input: 'Where do rivers start?', max_output_tokens: 4, temperature: 0 });
    const second = await post('/responses', { model: 'tiny', instructions: SYSTEM, input: 'Where do rivers start?', max_output_tokens: 4, temperature: 0 });
    expect(first['usage'].input_tokens_details.cached_tokens).toBe(0);
    const cached = second['usage'].input_tokens_details.cached_tokens as number;
    // The same prompt again: every full block but the one holding the last prompt token.
    expect(cached % BLOCK).toBe(0);
    expect(cached).toBeGreaterThanOrEqual(second['usage'].input_tokens - BLOCK);
    expect(cached).toBeLessThan(second['usage'].input_tokens);
    expect(second['output'][0].content[0].text).toBe(first['output'][0].content[0].text);

    // Another question under the same system prompt: at least the system prompt's whole blocks.
    const chat = await post('/chat/completions', {
      model: 'tiny', messages: [{ role: 'developer', content: SYSTEM }, { role: 'user', content: 'And lakes?' }], max_tokens: 2, temperature: 0,
    });
    const chatCached = chat['usage'].prompt_tokens_details.cached_tokens as number;
    expect(chatCached % BLOCK).toBe(0);
    expect(chatCached).toBeGreaterThan(100);
    const message = await post('/messages', {
      model: 'tiny', system: SYSTEM, messages: [{ role: 'user', content: 'And the sea?' }], max_tokens: 2, temperature: 0,
    });
    const read = message['usage'].cache_read_input_tokens as number;
    expect(read % BLOCK).toBe(0);
    expect(read).toBeGreaterThan(100);
    // input_tokens excludes the cache read: together they are the whole prompt.
    const engine = server.service.registry.models[0]!.engine;
    const prompt = engine.promptTokenIds({ messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'And the sea?' }] });
    expect(message['usage'].input_tokens + read).toBe(prompt.length);
  });
});
