// Request options that each either work or are refused with a 400 naming them (issue 28: "options
// accepted and then ignored"), on all three surfaces: service_tier picks the completion window
// (flex only where the spec lets it run, in the background), Responses logprobs through include and
// top_logprobs, Messages output_config.format as a structured output, one sentence for stream=true
// everywhere, and the OpenAI fields refused outright. Also the catalog's default_reasoning_effort on
// a thinking (Qwen3-style) model, with a request's own effort winning, and reasoning summaries.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { STREAMING_UNAVAILABLE } from '../../src/surfaces/content.js';
import { price } from '../helpers/api-catalog.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow } from '../helpers/batches.js';

let root: string;
let server: TestServer;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-options-'));
  const qwen3 = join(root, 'tiny-qwen3');
  await makeModel({ preset: 'tiny-qwen3', out: qwen3, seed: 4 });
  server = await startTestServer({
    catalog: (tiny) => ({
      models: [
        { id: 'tiny', checkpoint: tiny, pricing: [price('asap', 1, 0, 2), price('standard', 0.5, 0, 1), price('flex', 0.25, 0, 0.5)] },
        { id: 'tiny-asap', checkpoint: tiny, pricing: [price('asap', 1, 0, 2)] },
        { id: 'thinker', checkpoint: qwen3 },
        { id: 'thinker-quiet', checkpoint: qwen3, default_reasoning_effort: 'none' },
      ],
    }),
  });
});
afterAll(async () => {
  if (server) await closeNow(server);
  rmSync(root, { recursive: true, force: true });
});

type Json = Record<string, any>;

async function post(path: string, body: unknown): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.baseUrl}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Json };
}

/** A 400 whose error names `param`; returns the message. */
function refused(reply: { status: number; body: Json }, param: string): string {
  expect(reply.status, JSON.stringify(reply.body)).toBe(400);
  expect(reply.body['error'].param).toBe(param);
  return reply.body['error'].message as string;
}

const chat = (extra: Json = {}) => ({ model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_completion_tokens: 3, ...extra });
const responses = (extra: Json = {}) => ({ model: 'tiny', input: 'Hello', max_output_tokens: 3, ...extra });
const messages = (extra: Json = {}) => ({ model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 3, ...extra });

describe('service_tier', () => {
  it('Chat Completions: priority runs in asap, auto and default in the default window; flex and scale are refused', async () => {
    expect((await post('/chat/completions', chat({ service_tier: 'priority' }))).body['completion_window']).toBe('asap');
    expect((await post('/chat/completions', chat({ service_tier: 'default' }))).body['completion_window']).toBe('standard');
    expect((await post('/chat/completions', chat({ service_tier: 'auto', metadata: { completion_window: 'asap' } }))).body['completion_window']).toBe('asap');
    expect((await post('/chat/completions', chat({ service_tier: 'priority', metadata: { completion_window: 'asap' } }))).body['completion_window']).toBe('asap');
    expect(refused(await post('/chat/completions', chat({ service_tier: 'flex' })), 'service_tier')).toMatch(/background=true/);
    refused(await post('/chat/completions', chat({ service_tier: 'scale' })), 'service_tier');
    expect(refused(await post('/chat/completions', chat({ service_tier: 'priority', metadata: { completion_window: 'standard' } })), 'service_tier'))
      .toMatch(/metadata\.completion_window is "standard"/);
  });

  it('Responses: flex runs in the flex window in the background only; priority in asap', async () => {
    expect((await post('/responses', responses({ service_tier: 'priority' }))).body['completion_window']).toBe('asap');
    expect(refused(await post('/responses', responses({ service_tier: 'flex' })), 'service_tier')).toMatch(/requires background=true/);
    const flex = await post('/responses', responses({ service_tier: 'flex', background: true }));
    expect(flex.status).toBe(200);
    expect(flex.body['completion_window']).toBe('flex');
    refused(await post('/responses', responses({ service_tier: 'scale' })), 'service_tier');
    // A window the model does not offer is refused naming the field that asked for it.
    expect(refused(await post('/responses', responses({ model: 'tiny-asap', service_tier: 'flex', background: true })), 'service_tier'))
      .toMatch(/has no "flex" completion window/);
  });

  it('Messages: standard_only runs in standard, and is refused where the model has no standard window', async () => {
    expect((await post('/messages', messages({ service_tier: 'standard_only' }))).body['completion_window']).toBe('standard');
    expect((await post('/messages', messages({ model: 'tiny-asap', service_tier: 'auto' }))).body['completion_window']).toBe('asap');
    refused(await post('/messages', messages({ model: 'tiny-asap', service_tier: 'standard_only' })), 'service_tier');
  });
});

describe('Responses logprobs', () => {
  it('include message.output_text.logprobs returns each output token with top_logprobs alternatives, as Chat does', async () => {
    const r = await post('/responses', responses({ temperature: 0, max_output_tokens: 5, include: ['message.output_text.logprobs'], top_logprobs: 3 }));
    expect(r.status).toBe(200);
    const part = r.body['output'][0].content[0];
    const logprobs = part.logprobs as Array<{ token: string; logprob: number; bytes: number[]; top_logprobs: Array<{ token: string; logprob: number }> }>;
    expect(logprobs).toHaveLength(r.body['usage'].output_tokens);
    for (const lp of logprobs) {
      expect(lp.top_logprobs).toHaveLength(3);
      expect(lp.logprob).toBeLessThanOrEqual(0);
      // Greedy: the chosen token is the most likely one.
      expect(lp.top_logprobs[0]!.token).toBe(lp.token);
      expect(lp.bytes).toEqual([...Buffer.from(lp.token, 'utf8')]);
    }
    // The same numbers Chat Completions reports for the same prompt.
    const c = await post('/chat/completions', chat({ temperature: 0, max_completion_tokens: 5, logprobs: true, top_logprobs: 3 }));
    expect(c.body['choices'][0].logprobs.content).toEqual(logprobs);

    const noTop = await post('/responses', responses({ temperature: 0, include: ['message.output_text.logprobs'] }));
    const plain = noTop.body['output'][0].content[0].logprobs as Array<{ top_logprobs: unknown[] }>;
    expect(plain.length).toBeGreaterThan(0);
    expect(plain.every((lp) => lp.top_logprobs.length === 0)).toBe(true);
    expect((await post('/responses', responses())).body['output'][0].content[0].logprobs).toEqual([]);
  });

  it('refuses top_logprobs without the include, and include values it cannot serve', async () => {
    expect(refused(await post('/responses', responses({ top_logprobs: 2 })), 'top_logprobs')).toMatch(/message\.output_text\.logprobs/);
    refused(await post('/responses', responses({ include: ['message.output_text.logprobs'], top_logprobs: 21 })), 'top_logprobs');
    refused(await post('/responses', responses({ include: ['file_search_call.results'] })), 'include[0]');
    expect(refused(await post('/responses', responses({ include: ['reasoning.encrypted_content'] })), 'include[0]')).toMatch(/store=false/);
    expect((await post('/responses', responses({ include: ['reasoning.encrypted_content'], store: false }))).status).toBe(200);
  });
});

describe('fields refused by name', () => {
  it('stream=true gets the same sentence on every surface', async () => {
    for (const [path, body] of [['/responses', responses()], ['/chat/completions', chat()], ['/messages', messages()]] as const) {
      const reply = await post(path, { ...body, stream: true });
      expect(refused(reply, 'stream'), path).toBe(STREAMING_UNAVAILABLE);
    }
  });

  it('Responses: stream_options, conversation, prompt, text.verbosity other than medium', async () => {
    refused(await post('/responses', responses({ stream_options: { include_obfuscation: false } })), 'stream_options');
    refused(await post('/responses', responses({ conversation: 'conv_1' })), 'conversation');
    refused(await post('/responses', responses({ prompt: { id: 'pmpt_1' } })), 'prompt');
    refused(await post('/responses', responses({ text: { verbosity: 'low' } })), 'text.verbosity');
    expect((await post('/responses', responses({ text: { verbosity: 'medium' }, safety_identifier: 'u-1' }))).status).toBe(200);
  });

  it('Chat Completions: store=true', async () => {
    refused(await post('/chat/completions', chat({ store: true })), 'store');
    expect((await post('/chat/completions', chat({ store: false }))).status).toBe(200);
  });
});

describe('Messages output_config.format', () => {
  it('constrains the answer to the schema', async () => {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
    const reply = await post('/messages', messages({ max_tokens: 40, temperature: 0, output_config: { format: { type: 'json_schema', schema } } }));
    expect(reply.status).toBe(200);
    const text = reply.body['content'][0].text as string;
    // The random model is steered into the schema: a whole object, or the start of one when cut.
    if (reply.body['stop_reason'] === 'end_turn') expect(typeof JSON.parse(text).ok).toBe('boolean');
    else expect(text).toMatch(/^\s*\{/);
    const free = await post('/messages', messages({ max_tokens: 40, temperature: 0 }));
    expect(free.body['content'][0].text).not.toBe(text);
    refused(await post('/messages', messages({ output_config: { format: { type: 'xml' } } })), 'output_config.format.type');
    const badSchema = await post('/messages', messages({
      output_config: { format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'string', contentEncoding: 'base64' } } } } },
    }));
    expect(badSchema.status).toBe(400);
    expect(badSchema.body['error'].param).toMatch(/^output_config\.format\.schema/);
    expect(badSchema.body['error'].message).toMatch(/contentEncoding/);
  });
});

describe('the catalog default_reasoning_effort', () => {
  const reasons = (body: Json) => (body['output'] as Array<{ type: string }>).some((o) => o.type === 'reasoning');

  it('turns thinking off for requests that name no effort; an explicit effort still wins', { timeout: 120_000 }, async () => {
    const ask = (model: string, extra: Json = {}) => post('/responses', { model, input: 'hi', max_output_tokens: 6, temperature: 0, ...extra });
    const usual = await ask('thinker');
    expect(reasons(usual.body)).toBe(true);
    const quiet = await ask('thinker-quiet');
    expect(reasons(quiet.body)).toBe(false);
    expect(quiet.body['usage'].output_tokens_details.reasoning_tokens).toBe(0);
    expect(reasons((await ask('thinker-quiet', { reasoning: { effort: 'low' } })).body)).toBe(true);
    // Chat Completions alike.
    const chatQuiet = await post('/chat/completions', { model: 'thinker-quiet', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 6 });
    expect(chatQuiet.body['usage'].completion_tokens_details.reasoning_tokens).toBe(0);
    const chatAsked = await post('/chat/completions', { model: 'thinker-quiet', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 6, reasoning_effort: 'low' });
    expect(chatAsked.body['usage'].completion_tokens_details.reasoning_tokens).toBeGreaterThan(0);
  });

  it('a reasoning summary asked for carries the reasoning text', { timeout: 120_000 }, async () => {
    const r = await post('/responses', { model: 'thinker', input: 'hi', max_output_tokens: 12, temperature: 0, reasoning: { effort: 'low', summary: 'auto' } });
    const item = (r.body['output'] as Json[]).find((o) => o['type'] === 'reasoning')!;
    expect(item['summary']).toEqual([{ type: 'summary_text', text: item['content'][0].text }]);
    expect(r.body['reasoning']).toEqual({ effort: 'low', summary: 'auto' });
    const none = await post('/responses', { model: 'thinker', input: 'hi', max_output_tokens: 12, temperature: 0, reasoning: { effort: 'low' } });
    expect((none.body['output'] as Json[]).find((o) => o['type'] === 'reasoning')!['summary']).toEqual([]);
  });
});
