// POST /v1/messages, black-box over HTTP with Anthropic's official client (and raw fetch for the
// rejection table and headers): the message object, stops and limits, the same engine path as
// the other surfaces, every rejection rule, and idempotency keys.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
let client: Anthropic;
let toolsRoot: string;

const ASAP_ONLY = [{ tier: 'asap' as const, input_per_1m_tokens: 1, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 2 }];

beforeAll(async () => {
  // A Qwen3-shaped checkpoint whose template renders tools: a model with supports_tools true.
  toolsRoot = mkdtempSync(join(os.tmpdir(), 'sluice-messages-tools-'));
  await makeModel({ preset: 'tiny-qwen3', out: join(toolsRoot, 'tiny-qwen3'), seed: 4 });
  // Every other entry shares the tiny checkpoint (and so one engine).
  server = await startTestServer({
    catalog: (dir) => ({
      models: [
        { id: 'tiny', checkpoint: dir },
        { id: 'tiny-acme', checkpoint: dir, restricted: true, granted_organizations: ['acme'] },
        { id: 'tiny-asap', checkpoint: dir, pricing: ASAP_ONLY },
        { id: 'tiny-short', checkpoint: dir, context_length: 64 },
        { id: 'tiny-tools', checkpoint: join(toolsRoot, 'tiny-qwen3') },
      ],
    }),
  });
  // The Anthropic client appends /v1/messages to the origin.
  client = new Anthropic({ baseURL: server.origin, apiKey: server.key, maxRetries: 0 });
});
afterAll(async () => {
  await server?.close();
  if (toolsRoot) rmSync(toolsRoot, { recursive: true, force: true });
});
afterEach(() => { vi.restoreAllMocks(); });

const engine = () => server.service.registry.models[0]!.engine;
const user = (content: string) => [{ role: 'user' as const, content }];

async function post(body: unknown, headers: Record<string, string> = {}, key = server.key) {
  const res = await fetch(`${server.baseUrl}/messages`, {
    method: 'POST',
    headers: { 'x-api-key': key, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, json: await res.json() as any };
}

/** A substring of `text` made of 3 ASCII letters/spaces, not at its very start. */
function pickStop(text: string): string {
  for (let i = 4; i + 3 <= text.length; i++) {
    const s = text.slice(i, i + 3);
    if (/^[A-Za-z ]{3}$/.test(s)) return s;
  }
  throw new Error(`no ASCII stretch in ${JSON.stringify(text)}`);
}

const textOf = (m: Anthropic.Message) => (m.content[0] as Anthropic.TextBlock).text;

describe('message object', () => {
  it('has the Anthropic shape, field by field', async () => {
    const m = await client.messages.create({ model: 'tiny', max_tokens: 6, messages: user('Hello there'), temperature: 0 });
    expect(Object.keys(m).sort()).toEqual(
      ['completion_window', 'content', 'id', 'model', 'role', 'stop_reason', 'stop_sequence', 'type', 'usage']);
    expect(m.id).toMatch(/^msg_[0-9a-f]{32}$/);
    expect(m.type).toBe('message');
    expect(m.role).toBe('assistant');
    expect(m.model).toBe('tiny');
    expect(m.content).toEqual([{ type: 'text', text: expect.any(String), citations: null }]);
    expect(m.stop_reason).toBe('max_tokens');
    expect(m.stop_sequence).toBeNull();
    expect(m.usage).toEqual({ input_tokens: expect.any(Number), output_tokens: 6, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 });
    expect(m.usage.input_tokens).toBeGreaterThan(0);
  });

  it('runs the same engine path as Chat Completions and Responses', async () => {
    const system = 'You are terse.';
    const a = await client.messages.create({ model: 'tiny', max_tokens: 24, system, messages: user('Tell me about rivers'), temperature: 0 });
    const b = await client.messages.create({
      model: 'tiny', max_tokens: 24, temperature: 0, system: [{ type: 'text', text: system, cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me about rivers' }] }],
    });
    expect(textOf(b)).toBe(textOf(a));
    const openai = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const messages = [{ role: 'system' as const, content: system }, ...user('Tell me about rivers')];
    const chat = await openai.chat.completions.create({ model: 'tiny', messages, temperature: 0, max_completion_tokens: 24 });
    expect(textOf(a)).toBe(chat.choices[0]!.message.content);
    expect(a.usage.input_tokens).toBe(chat.usage!.prompt_tokens);
    const response = await openai.responses.create({ model: 'tiny', input: messages, temperature: 0, max_output_tokens: 24 });
    expect(response.output_text).toBe(textOf(a));
    expect(response.usage!.input_tokens).toBe(a.usage.input_tokens);
  });

  it('cuts the text at a stop sequence and names it', async () => {
    const full = await client.messages.create({ model: 'tiny', max_tokens: 40, messages: user('Once upon a time'), temperature: 0 });
    const text = textOf(full);
    const stop = pickStop(text);
    const cut = await client.messages.create({
      model: 'tiny', max_tokens: 40, messages: user('Once upon a time'), temperature: 0, stop_sequences: ['never-in-gibberish-zz', stop],
    });
    expect(textOf(cut)).toBe(text.slice(0, text.indexOf(stop)));
    expect(cut.stop_reason).toBe('stop_sequence');
    expect(cut.stop_sequence).toBe(stop);
    expect(cut.usage.output_tokens).toBeLessThan(40);
  });

  it('keeps one text block even when the text is empty', async () => {
    const full = await client.messages.create({ model: 'tiny', max_tokens: 8, messages: user('Start'), temperature: 0 });
    const first = textOf(full).slice(0, 1);
    const empty = await client.messages.create({ model: 'tiny', max_tokens: 8, messages: user('Start'), temperature: 0, stop_sequences: [first] });
    expect(empty.content).toEqual([{ type: 'text', text: '', citations: null }]);
    expect(empty.stop_reason).toBe('stop_sequence');
  });

  it('accepts and ignores tools, tool_choice, output_config; serves thinking disabled, top_k, metadata', async () => {
    const base = { model: 'tiny', max_tokens: 8, messages: user('Hello there'), temperature: 0 };
    const plain = await client.messages.create(base);
    const decorated = await client.messages.create({
      ...base,
      tools: [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: {} } }],
      tool_choice: { type: 'auto' }, thinking: { type: 'disabled' }, top_k: 0, top_p: 1, service_tier: 'auto', stream: false,
      metadata: { user_id: 'u-1' }, output_config: { effort: 'low' } as never,
    } as Anthropic.MessageCreateParamsNonStreaming);
    expect(textOf(decorated)).toBe(textOf(plain));
    expect(decorated.usage.input_tokens).toBe(plain.usage.input_tokens);
    const windowed = await post({ ...base, metadata: { user_id: null, completion_window: 'asap' } });
    expect(windowed.status).toBe(200);
    expect(windowed.json.completion_window).toBe('asap');
    // An assistant turn in the history and a granted restricted model.
    const acme = new Anthropic({ baseURL: server.origin, apiKey: await server.keyFor('acme'), maxRetries: 0 });
    const m = await acme.messages.create({ model: 'tiny-acme', max_tokens: 2, messages: [...user('Hi'), { role: 'assistant', content: 'Hello' }, ...user('Again')] });
    expect(m.model).toBe('tiny-acme');
  });
});

describe('rejections', () => {
  const M = user('Hello');
  const ok = { model: 'tiny', max_tokens: 8, messages: M };
  const blocks = (...content: unknown[]) => [{ role: 'user', content }];
  const image = (source: unknown) => blocks({ type: 'text', text: 'What is this?' }, { type: 'image', source });
  const PNG = { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' };
  // [what, body, status, param, code?]
  const rows: Array<[string, Record<string, unknown>, number, string | null, string?]> = [
    ['temperature above 1 (Chat allows 2)', { ...ok, temperature: 1.5 }, 400, 'temperature'],
    ['temperature below 0', { ...ok, temperature: -0.5 }, 400, 'temperature'],
    ['top_p above 1', { ...ok, top_p: 1.1 }, 400, 'top_p'],
    ['top_k negative', { ...ok, top_k: -1 }, 400, 'top_k'],
    ['top_k fractional', { ...ok, top_k: 1.5 }, 400, 'top_k'],
    ['max_tokens missing', { model: 'tiny', messages: M }, 400, 'max_tokens'],
    ['max_tokens 0', { ...ok, max_tokens: 0 }, 400, 'max_tokens'],
    ['model missing', { max_tokens: 8, messages: M }, 400, 'model'],
    ['messages empty', { ...ok, messages: [] }, 400, 'messages'],
    ['system role in messages', { ...ok, messages: [{ role: 'system', content: 'x' }] }, 400, 'messages[0].role'],
    ['extra message field', { ...ok, messages: [{ role: 'user', content: 'x', name: 'n' }] }, 400, 'messages[0].name'],
    ['empty content list', { ...ok, messages: [{ role: 'user', content: [] }] }, 400, 'messages[0].content'],
    ['unknown block type', { ...ok, messages: blocks({ type: 'video', text: 'x' }) }, 400, 'messages[0].content[0].type'],
    ['block type named like a prototype key', { ...ok, messages: blocks({ type: 'constructor' }) }, 400, 'messages[0].content[0].type', 'invalid_request'],
    ['tool_use block', { ...ok, messages: [{ role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'f', input: {} }] }] }, 400, 'messages[0].content[0].type', 'unsupported_input'],
    ['tool_result block', { ...ok, messages: blocks({ type: 'tool_result', tool_use_id: 't', content: 'x' }) }, 400, 'messages[0].content[0].type', 'unsupported_input'],
    ['document block', { ...ok, messages: blocks({ type: 'document', source: { type: 'text', data: 'x', media_type: 'text/plain' } }) }, 400, 'messages[0].content[0].type', 'unsupported_input'],
    ['text block without text', { ...ok, messages: blocks({ type: 'text' }) }, 400, 'messages[0].content[0].text'],
    ['extra block field', { ...ok, messages: blocks({ type: 'text', text: 'x', bogus: 1 }) }, 400, 'messages[0].content[0].bogus'],
    ['image without source', { ...ok, messages: blocks({ type: 'image' }) }, 400, 'messages[0].content[0].source'],
    ['image source of unknown type', { ...ok, messages: image({ type: 'file', file_id: 'f' }) }, 400, 'messages[0].content[1].source.type'],
    ['base64 image without media_type', { ...ok, messages: image({ type: 'base64', data: 'iVBORw0KGgo=' }) }, 400, 'messages[0].content[1].source.media_type'],
    ['base64 image data not base64', { ...ok, messages: image({ ...PNG, data: '<svg/>' }) }, 400, 'messages[0].content[1].source.data'],
    ['image block with text', { ...ok, messages: blocks({ type: 'image', source: PNG, text: 'x' }) }, 400, 'messages[0].content[0].text'],
    ['image URL not http', { ...ok, messages: image({ type: 'url', url: 'file:///etc/passwd' }) }, 400, 'messages[0].content[1].source.url'],
    ['system of the wrong type', { ...ok, system: 5 }, 400, 'system'],
    ['system block of the wrong type', { ...ok, system: [{ type: 'image', text: 'x' }] }, 400, 'system[0].type'],
    ['empty stop sequence', { ...ok, stop_sequences: [''] }, 400, 'stop_sequences[0]'],
    ['stop_sequences as a string', { ...ok, stop_sequences: 'x' }, 400, 'stop_sequences'],
    ['stream true', { ...ok, stream: true }, 400, 'stream', 'unsupported_parameter'],
    ['thinking enabled', { ...ok, thinking: { type: 'enabled', budget_tokens: 1024 } }, 400, 'thinking.type', 'unsupported_parameter'],
    ['metadata value not a string', { ...ok, metadata: { completion_window: 3 } }, 400, 'metadata.completion_window'],
    ['service_tier unknown', { ...ok, service_tier: 'priority' }, 400, 'service_tier'],
    ['unknown top-level field', { ...ok, top_a: 1 }, 400, 'top_a'],
    ['base64 image to a model without image input', { ...ok, messages: image(PNG) }, 400, 'messages[0].content[1]', 'image_input_unsupported'],
    ['URL image to a model without image input', { ...ok, messages: image({ type: 'url', url: 'https://example.com/a.png' }) }, 400, 'messages[0].content[1]', 'image_input_unsupported'],
    ['context length exceeded', { ...ok, model: 'tiny-short', max_tokens: 60 }, 400, 'max_tokens', 'context_length_exceeded'],
    ['unknown model', { ...ok, model: 'nope' }, 404, 'model', 'model_not_found'],
    ['restricted model (answered as unknown)', { ...ok, model: 'tiny-acme' }, 404, 'model', 'model_not_found'],
    ['window not priced', { ...ok, model: 'tiny-asap', metadata: { completion_window: 'standard' } }, 400, 'metadata.completion_window', 'unsupported_completion_window'],
    ['flex (no background here)', { ...ok, metadata: { completion_window: 'flex' } }, 400, 'metadata.completion_window'],
  ];

  it.each(rows.map(([what, body, status, param, code]) => [what, status, param, body, code] as const))(
    '%s -> %i (param %s)', async (_what, status, param, body, code) => {
      const generate = vi.spyOn(engine(), 'generate');
      const promptTokenIds = vi.spyOn(engine(), 'promptTokenIds');
      const res = await post(body);
      expect(res.status).toBe(status);
      // The spec's envelope, nothing else at the top; the inner type is Anthropic's name for the status.
      expect(Object.keys(res.json)).toEqual(['error']);
      expect(Object.keys(res.json.error).sort()).toEqual(['code', 'message', 'param', 'type']);
      expect(res.json.error).toMatchObject({ type: status === 404 ? 'not_found_error' : 'invalid_request_error', message: expect.any(String), param });
      if (code !== undefined) expect(res.json.error.code).toBe(code);
      expect(generate).not.toHaveBeenCalled();
      // Everything but the context check fails before the prompt is even tokenized.
      if (code !== 'context_length_exceeded') expect(promptTokenIds).not.toHaveBeenCalled();
    });

  it('maps statuses to the Anthropic client error classes', async () => {
    await expect(client.messages.create({ ...ok, model: 'nope' })).rejects.toBeInstanceOf(Anthropic.NotFoundError);
    // A restricted model without the grant is answered as unknown (no 403 that would confirm it exists).
    await expect(client.messages.create({ ...ok, model: 'tiny-acme' })).rejects.toBeInstanceOf(Anthropic.NotFoundError);
    await expect(client.messages.create({ ...ok, temperature: 1.5 })).rejects.toBeInstanceOf(Anthropic.BadRequestError);
    const bad = new Anthropic({ baseURL: server.origin, apiKey: 'sk-wrong', maxRetries: 0 });
    await expect(bad.messages.create(ok)).rejects.toBeInstanceOf(Anthropic.AuthenticationError);
  });
});

describe('tool turns', () => {
  const toolUse = { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Oslo' } };
  const toolResult = { type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' };

  it('refuses a tool turn in the history with what is true, also for a model that calls tools', async () => {
    const model = await fetch(`${server.baseUrl}/models/tiny-tools`, { headers: { authorization: `Bearer ${server.key}` } });
    expect((await model.json() as { supports_tools: boolean }).supports_tools).toBe(true);
    const rows: Array<[string, unknown[], string]> = [
      ['tool_use', [...user('Weather in Oslo?'), { role: 'assistant', content: [toolUse] }], 'messages[1].content[0].type'],
      ['tool_result', [...user('Weather in Oslo?'), { role: 'assistant', content: [toolUse] }, { role: 'user', content: [toolResult] }],
        'messages[1].content[0].type'],
      ['tool_result alone', [{ role: 'user', content: [{ type: 'text', text: 'Here:' }, toolResult] }], 'messages[0].content[1].type'],
    ];
    for (const [what, messages, param] of rows) {
      const res = await post({ model: 'tiny-tools', max_tokens: 4, messages });
      expect(res.status, what).toBe(400);
      expect(res.json, what).toEqual({ error: { type: 'invalid_request_error', message: expect.any(String), param, code: 'unsupported_input' } });
      const message: string = res.json.error.message;
      // Not "the models cannot call tools", which a supports_tools model contradicts: this surface carries no tool turns.
      expect(message, what).not.toMatch(/cannot call tools/);
      expect(message, what).toMatch(/does not carry tool turns/);
      expect(message, what).toContain('/v1/responses');
      expect(message, what).toContain('/v1/chat/completions');
    }
    // count_tokens says the same.
    const counted = await fetch(`${server.baseUrl}/messages/count_tokens`, {
      method: 'POST', headers: { 'x-api-key': server.key, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny-tools', messages: rows[0]![1] }),
    });
    expect(counted.status).toBe(400);
    expect((await counted.json() as { error: { message: string } }).error.message).toMatch(/does not carry tool turns/);
  });

  it('accepts and ignores tools for a tool model: the prompt is the one without them', async () => {
    const base = { model: 'tiny-tools', max_tokens: 4, messages: user('Weather in Oslo?'), temperature: 0 };
    const plain = await client.messages.create(base);
    const withTools = await client.messages.create({
      ...base, tools: [{ name: 'get_weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
      tool_choice: { type: 'any' },
    });
    // input_tokens leaves out cache reads (the second call reads the first's prefix): the prompt is both together.
    const promptOf = (m: Anthropic.Message) => m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0);
    expect(promptOf(withTools)).toBe(promptOf(plain));
    expect(withTools.content).toEqual(plain.content);
    expect(withTools.stop_reason).not.toBe('tool_use');
  });
});

describe('idempotency keys', () => {
  // Sampled without a seed: two generations agree only by replay.
  const sampled = { model: 'tiny', max_tokens: 24, messages: user('Say something'), temperature: 1 };
  let n = 0;
  const freshKey = () => `key-${Date.now()}-${n++}`;

  it('replays the first result for the same key and body, without generating again', async () => {
    const generate = vi.spyOn(engine(), 'generate');
    for (const header of ['Idempotency-Key', 'alt-idempotency-key']) {
      generate.mockClear();
      const key = freshKey();
      const first = await post(sampled, { [header]: key });
      const second = await post(sampled, { [header]: key });
      expect(first.status).toBe(200);
      expect(second.status).toBe(200);
      expect(second.json).toEqual(first.json);
      expect(first.headers.get('idempotent-replayed')).toBeNull();
      expect(second.headers.get('idempotent-replayed')).toBe('true');
      expect(generate).toHaveBeenCalledTimes(1);
      // The two headers are one key space: the other header with the same key replays too.
      const other = header === 'Idempotency-Key' ? 'alt-idempotency-key' : 'Idempotency-Key';
      expect((await post(sampled, { [other]: key })).json.id).toBe(first.json.id);
    }
  });

  it('works through the Anthropic client with request options headers', async () => {
    const key = freshKey();
    const a = await client.messages.create(sampled, { headers: { 'Idempotency-Key': key } });
    const b = await client.messages.create(sampled, { headers: { 'Idempotency-Key': key } });
    expect(b.id).toBe(a.id);
    expect(textOf(b)).toBe(textOf(a));
    const c = await client.messages.create(sampled, { headers: { 'alt-idempotency-key': key } });
    expect(c.id).toBe(a.id);
    const fresh = await client.messages.create(sampled);
    expect(fresh.id).not.toBe(a.id);
  });

  it('refuses a reused key with a different body (422) and a key still running (409)', async () => {
    const key = freshKey();
    const first = await post(sampled, { 'Idempotency-Key': key });
    const reused = await post({ ...sampled, max_tokens: 25 }, { 'Idempotency-Key': key });
    expect(reused.status).toBe(422);
    expect(reused.json).toEqual({ error: { type: 'invalid_request_error', message: expect.any(String), code: 'idempotency_key_reused', param: 'idempotency-key' } });
    // Key order in the body does not matter.
    const reordered = await post({ temperature: 1, messages: sampled.messages, max_tokens: 24, model: 'tiny' }, { 'Idempotency-Key': key });
    expect(reordered.json.id).toBe(first.json.id);

    const running = freshKey();
    // Greedy on the tiny model runs to the limit: long enough to overlap with the repeat.
    const long = { model: 'tiny', max_tokens: 1200, messages: user('Hello there'), temperature: 0 };
    const generate = vi.spyOn(engine(), 'generate');
    const pending = post(long, { 'alt-idempotency-key': running });
    await vi.waitFor(() => expect(generate).toHaveBeenCalledTimes(1));
    const busy = await post(long, { 'alt-idempotency-key': running });
    expect(busy.status).toBe(409);
    expect(busy.json).toEqual({ error: { type: 'invalid_request_error', message: expect.any(String), code: 'idempotency_key_in_use', param: 'alt-idempotency-key' } });
    const done = await pending;
    expect(done.status).toBe(200);
    expect((await post(long, { 'alt-idempotency-key': running })).json.id).toBe(done.json.id);
    expect(generate).toHaveBeenCalledTimes(1);
  });

  it('checks the headers', async () => {
    const tooLong = await post(sampled, { 'Idempotency-Key': 'k'.repeat(256) });
    expect(tooLong.status).toBe(400);
    expect(tooLong.json.error.param).toBe('idempotency-key');
    const altTooLong = await post(sampled, { 'alt-idempotency-key': 'k'.repeat(256) });
    expect(altTooLong.status).toBe(400);
    expect(altTooLong.json.error.param).toBe('alt-idempotency-key');
    expect((await post(sampled, { 'Idempotency-Key': `${freshKey()}-`.padEnd(255, 'k') })).status).toBe(200);
    const disagree = await post(sampled, { 'Idempotency-Key': freshKey(), 'alt-idempotency-key': freshKey() });
    expect(disagree.status).toBe(400);
    expect(disagree.json.error.code).toBe('invalid_idempotency_key');
    const same = freshKey();
    expect((await post(sampled, { 'Idempotency-Key': same, 'alt-idempotency-key': same })).status).toBe(200);
  });

  it('keeps keys per organization', async () => {
    const key = freshKey();
    const generate = vi.spyOn(engine(), 'generate');
    const ours = await post(sampled, { 'Idempotency-Key': key });
    const theirs = await post(sampled, { 'Idempotency-Key': key }, await server.keyFor('other-org'));
    expect(theirs.status).toBe(200);
    expect(theirs.json.id).not.toBe(ours.json.id);
    expect(generate).toHaveBeenCalledTimes(2);
    // And a different body under the same key is that organization's own business.
    const theirsChanged = await post({ ...sampled, max_tokens: 3 }, { 'Idempotency-Key': key }, await server.keyFor('third-org'));
    expect(theirsChanged.status).toBe(200);
  });

  it('releases the key when the request fails, so a retry runs', async () => {
    const key = freshKey();
    const tooLong = { ...sampled, model: 'tiny-short', max_tokens: 60 };
    expect((await post(tooLong, { 'Idempotency-Key': key })).status).toBe(400);
    expect((await post(tooLong, { 'Idempotency-Key': key })).status).toBe(400);
    // The failed body left nothing behind: the key is free for another body.
    const fixed = await post({ ...tooLong, max_tokens: 8 }, { 'Idempotency-Key': key });
    expect(fixed.status).toBe(200);
    expect((await post({ ...tooLong, max_tokens: 8 }, { 'Idempotency-Key': key })).json.id).toBe(fixed.json.id);
  });
});
