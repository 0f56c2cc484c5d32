// POST /v1/chat/completions, black-box over HTTP with OpenAI's official client (and raw fetch for
// the rejection table). The tiny model's text is gibberish, so determinism is checked with
// temperature 0 (greedy) and with seeds.
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { isSluiceError } from '../../src/errors.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
let client: OpenAI;

const ASAP_ONLY = [{ tier: 'asap' as const, input_per_1m_tokens: 1, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 2 }];

beforeAll(async () => {
  // Every entry shares the tiny checkpoint (and so one engine).
  server = await startTestServer({
    catalog: (dir) => ({
      models: [
        { id: 'tiny', checkpoint: dir },
        { id: 'tiny-acme', checkpoint: dir, restricted: true, granted_organizations: ['acme'] },
        { id: 'tiny-asap', checkpoint: dir, pricing: ASAP_ONLY },
        { id: 'tiny-short', checkpoint: dir, context_length: 64 },
      ],
    }),
  });
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
});
afterAll(async () => { await server?.close(); });
afterEach(() => { vi.restoreAllMocks(); });

const engine = () => server.service.registry.models[0]!.engine;
const user = (content: string) => [{ role: 'user' as const, content }];

async function post(body: unknown, key = server.key): Promise<{ status: number; json: any }> {
  const res = await fetch(`${server.baseUrl}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

/** A substring of `text` made of 3 ASCII letters/spaces, not at its very start. */
function pickStop(text: string): string {
  for (let i = 4; i + 3 <= text.length; i++) {
    const s = text.slice(i, i + 3);
    if (/^[A-Za-z ]{3}$/.test(s)) return s;
  }
  throw new Error(`no ASCII stretch in ${JSON.stringify(text)}`);
}

describe('chat.completion object', () => {
  it('has the OpenAI shape, field by field', async () => {
    const c = await client.chat.completions.create({ model: 'tiny', messages: user('Hello there'), temperature: 0, max_completion_tokens: 6 });
    expect(Object.keys(c).sort()).toEqual(
      ['choices', 'completion_window', 'created', 'id', 'model', 'object', 'system_fingerprint', 'usage']);
    expect(c.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    expect(c.object).toBe('chat.completion');
    expect(Math.abs(c.created - Date.now() / 1000)).toBeLessThan(60);
    expect(c.model).toBe('tiny');
    expect(c.system_fingerprint).toMatch(/^fp_[0-9a-f]{12}$/);
    expect((c as unknown as { completion_window: string }).completion_window).toBe('standard');
    expect(c.choices).toHaveLength(1);
    const choice = c.choices[0]!;
    expect(Object.keys(choice).sort()).toEqual(['finish_reason', 'index', 'logprobs', 'message']);
    expect(choice.index).toBe(0);
    expect(choice.message).toEqual({ role: 'assistant', content: expect.any(String), refusal: null });
    expect(choice.logprobs).toBeNull();
    expect(choice.finish_reason).toBe('length');
    expect(c.usage).toEqual({
      prompt_tokens: expect.any(Number),
      completion_tokens: 6,
      total_tokens: c.usage!.prompt_tokens + 6,
      prompt_tokens_details: { cached_tokens: 0 },
      completion_tokens_details: { reasoning_tokens: 0 },
    });
    expect(c.usage!.prompt_tokens).toBeGreaterThan(0);
    // The fingerprint is stable for the model.
    const again = await client.chat.completions.create({ model: 'tiny', messages: user('Other'), max_completion_tokens: 1 });
    expect(again.system_fingerprint).toBe(c.system_fingerprint);
    expect(again.id).not.toBe(c.id);
  });

  it('is greedy-deterministic and matches the Responses surface for the same conversation', async () => {
    const messages = [{ role: 'system' as const, content: 'You are terse.' }, { role: 'user' as const, content: 'Tell me about rivers' }];
    const a = await client.chat.completions.create({ model: 'tiny', messages, temperature: 0, max_completion_tokens: 24 });
    const b = await client.chat.completions.create({ model: 'tiny', messages, temperature: 0, max_completion_tokens: 24 });
    expect(b.choices[0]!.message.content).toBe(a.choices[0]!.message.content);
    expect(a.choices[0]!.message.content!.length).toBeGreaterThan(0);
    const r = await client.responses.create({ model: 'tiny', input: messages, temperature: 0, max_output_tokens: 24 });
    expect(r.output_text).toBe(a.choices[0]!.message.content);
    expect(r.usage!.input_tokens).toBe(a.usage!.prompt_tokens);
    expect(r.usage!.output_tokens).toBe(a.usage!.completion_tokens);
    // Text parts render like a string (joined with '\n'), here as there.
    const parts = await client.chat.completions.create({
      model: 'tiny', temperature: 0, max_completion_tokens: 24,
      messages: [messages[0]!, { role: 'user', content: [{ type: 'text', text: 'Tell me' }, { type: 'text', text: 'about rivers' }] }],
    });
    const joined = await client.chat.completions.create({
      model: 'tiny', temperature: 0, max_completion_tokens: 24, messages: [messages[0]!, { role: 'user', content: 'Tell me\nabout rivers' }],
    });
    expect(parts.choices[0]!.message.content).toBe(joined.choices[0]!.message.content);
  });

  it('cuts the text at a stop string with finish_reason stop', async () => {
    const full = await client.chat.completions.create({ model: 'tiny', messages: user('Once upon a time'), temperature: 0, max_completion_tokens: 40 });
    const text = full.choices[0]!.message.content!;
    const stop = pickStop(text);
    for (const stopParam of [stop, [stop], ['never-in-gibberish-zz', stop]]) {
      const cut = await client.chat.completions.create({
        model: 'tiny', messages: user('Once upon a time'), temperature: 0, max_completion_tokens: 40, stop: stopParam,
      });
      expect(cut.choices[0]!.message.content).toBe(text.slice(0, text.indexOf(stop)));
      expect(cut.choices[0]!.finish_reason).toBe('stop');
      expect(cut.usage!.completion_tokens).toBeLessThan(40);
    }
  });

  it('honours max_completion_tokens and its alias max_tokens with finish_reason length', async () => {
    for (const limit of [{ max_completion_tokens: 3 }, { max_tokens: 3 }, { max_tokens: 3, max_completion_tokens: 3 }]) {
      const c = await client.chat.completions.create({ model: 'tiny', messages: user('Count'), temperature: 0, ...limit });
      expect(c.choices[0]!.finish_reason).toBe('length');
      expect(c.usage!.completion_tokens).toBe(3);
    }
  });

  it('runs n choices with seeds seed, seed+1, ... and counts the prompt once', async () => {
    const base = { model: 'tiny', messages: user('Pick a word'), temperature: 1, max_completion_tokens: 12 };
    const two = await client.chat.completions.create({ ...base, n: 2, seed: 7 });
    expect(two.choices.map((c) => c.index)).toEqual([0, 1]);
    const [seven, eight] = await Promise.all([
      client.chat.completions.create({ ...base, seed: 7 }),
      client.chat.completions.create({ ...base, seed: 8 }),
    ]);
    expect(two.choices[0]!.message.content).toBe(seven.choices[0]!.message.content);
    expect(two.choices[1]!.message.content).toBe(eight.choices[0]!.message.content);
    expect(two.usage!.prompt_tokens).toBe(seven.usage!.prompt_tokens);
    expect(two.usage!.completion_tokens).toBe(seven.usage!.completion_tokens + eight.usage!.completion_tokens);
    const again = await client.chat.completions.create({ ...base, n: 2, seed: 7 });
    expect(again.choices.map((c) => c.message.content)).toEqual(two.choices.map((c) => c.message.content));
  });

  it('reports the engine timings in a Server-Timing header (n choices: the first token, the longest decode)', async () => {
    for (const n of [1, 3]) {
      const res = await fetch(`${server.baseUrl}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', messages: user('hi'), max_tokens: 4, n, seed: 1, temperature: 1 }),
      });
      expect(res.status).toBe(200);
      const timing = res.headers.get('server-timing') ?? '';
      const durations = Object.fromEntries([...timing.matchAll(/(\w+);dur=([\d.]+)/g)].map((m) => [m[1], Number(m[2])]));
      expect(Object.keys(durations)).toEqual(['queue', 'prefill', 'decode']);
      for (const d of Object.values(durations)) expect(d).toBeGreaterThanOrEqual(0);
      expect(durations.prefill).toBeGreaterThan(0);  // a prompt was computed before the first token
    }
  });

  it('returns logprobs in the OpenAI shape', async () => {
    const c = await client.chat.completions.create({
      model: 'tiny', messages: user('Hello'), temperature: 0, max_completion_tokens: 5, logprobs: true, top_logprobs: 3,
    });
    const content = c.choices[0]!.logprobs!.content!;
    expect(c.choices[0]!.logprobs!.refusal).toBeNull();
    expect(content).toHaveLength(c.usage!.completion_tokens);
    for (const lp of content) {
      expect(Object.keys(lp).sort()).toEqual(['bytes', 'logprob', 'token', 'top_logprobs']);
      expect(lp.logprob).toBeLessThanOrEqual(0);
      expect(lp.bytes).toEqual([...Buffer.from(lp.token, 'utf8')]);
      expect(lp.top_logprobs).toHaveLength(3);
      for (const top of lp.top_logprobs) {
        expect(Object.keys(top).sort()).toEqual(['bytes', 'logprob', 'token']);
        expect(top.logprob).toBeLessThanOrEqual(0);
      }
      // Greedy: the chosen token is the most likely one.
      expect(lp.top_logprobs[0]!.token).toBe(lp.token);
      expect(lp.top_logprobs[0]!.logprob).toBeGreaterThanOrEqual(lp.top_logprobs[2]!.logprob);
    }
    expect(content.map((lp) => lp.token).join('')).toBe(c.choices[0]!.message.content);
    const noTop = await client.chat.completions.create({ model: 'tiny', messages: user('Hello'), max_completion_tokens: 2, logprobs: true });
    expect(noTop.choices[0]!.logprobs!.content!.every((lp) => lp.top_logprobs.length === 0)).toBe(true);
  });

  it('accepts the fields it documents as harmless and gives the same text', async () => {
    const base = { model: 'tiny', messages: user('Hello there'), temperature: 0, max_completion_tokens: 8 };
    const plain = await client.chat.completions.create(base);
    const decorated = await client.chat.completions.create({
      ...base,
      tools: [], tool_choice: 'none', parallel_tool_calls: true, service_tier: 'auto', store: false,
      presence_penalty: 0, frequency_penalty: null, logit_bias: {}, stream: false, user: 'u-1', top_p: 1,
      metadata: { completion_window: 'asap', team: 'x' }, response_format: { type: 'text' }, n: 1,
      seed: -5, reasoning_effort: 'low', modalities: ['text'], prompt_cache_key: 'k',
    });
    expect(decorated.choices[0]!.message.content).toBe(plain.choices[0]!.message.content);
    expect((decorated as unknown as { completion_window: string }).completion_window).toBe('asap');
    // A schema constrains the output: a value cut by the token limit is 'length', and the text is
    // the start of a JSON object (the random model cannot complete one in 8 tokens).
    const schema = await client.chat.completions.create({
      ...base, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'integer' } },
        required: ['a'], additionalProperties: false }, strict: true } },
    });
    expect(schema.choices[0]!.finish_reason).toBe('length');
    expect(schema.choices[0]!.message.content).toMatch(/^\s*\{/);
    // Strict mode follows OpenAI's rules: an object left open is a 400 naming the pointer.
    const open = await client.chat.completions.create({
      ...base, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' }, strict: true } },
    }).catch((e: unknown) => e);
    expect((open as { status: number }).status).toBe(400);
    expect((open as { param: string }).param).toBe('response_format.json_schema.schema');
    const json = await client.chat.completions.create({ ...base, max_completion_tokens: 4, response_format: { type: 'json_object' } });
    expect(json.choices[0]!.message.content).toMatch(/^\s*\{/);
    // An assistant turn that called tools may have null content; tool results render as tool turns.
    const history = await client.chat.completions.create({
      ...base, messages: [{ role: 'developer', content: 'Be brief.' }, ...user('Hi'), { role: 'assistant', content: null }, ...user('Again')],
    });
    expect(history.choices).toHaveLength(1);
    // Chat's temperature range is 0..2 (Messages': 0..1).
    const hot = await client.chat.completions.create({ ...base, temperature: 2, max_completion_tokens: 2 });
    expect(hot.usage!.completion_tokens).toBe(2);
  });

  it('lets a granted organization use a restricted model', async () => {
    const acme = new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('acme'), maxRetries: 0 });
    const c = await acme.chat.completions.create({ model: 'tiny-acme', messages: user('Hi'), max_completion_tokens: 2 });
    expect(c.model).toBe('tiny-acme');
    const asap = await client.chat.completions.create({ model: 'tiny-asap', messages: user('Hi'), max_completion_tokens: 2 });
    expect((asap as unknown as { completion_window: string }).completion_window).toBe('asap');
  });

  it('cancels the generation when the client disconnects', async () => {
    const generate = vi.spyOn(engine(), 'generate');
    const controller = new AbortController();
    const pending = client.chat.completions.create(
      { model: 'tiny', messages: user('Hello there'), temperature: 0, max_completion_tokens: 1500 }, { signal: controller.signal });
    await vi.waitFor(() => expect(generate).toHaveBeenCalledTimes(1));
    await new Promise((r) => setTimeout(r, 100));
    controller.abort();
    await expect(pending).rejects.toThrow();
    const outcome = await (generate.mock.results[0]!.value as Promise<unknown>).then(() => 'finished', (err: unknown) => err);
    expect(isSluiceError(outcome) && outcome.code).toBe('cancelled');
  });
});

describe('rejections', () => {
  const M = user('Hello');
  const ok = { model: 'tiny', messages: M };
  const img = (url: string) => [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url } }] }];
  // [what, body, status, param, code?]
  const rows: Array<[string, Record<string, unknown>, number, string | null, string?]> = [
    ['temperature above 2', { ...ok, temperature: 2.5 }, 400, 'temperature'],
    ['temperature below 0', { ...ok, temperature: -0.1 }, 400, 'temperature'],
    ['top_p above 1', { ...ok, top_p: 1.5 }, 400, 'top_p'],
    ['max_completion_tokens 0', { ...ok, max_completion_tokens: 0 }, 400, 'max_completion_tokens'],
    ['max_tokens 0', { ...ok, max_tokens: 0 }, 400, 'max_tokens'],
    ['max_tokens disagreeing with max_completion_tokens', { ...ok, max_tokens: 5, max_completion_tokens: 6 }, 400, 'max_tokens'],
    ['model missing', { messages: M }, 400, 'model'],
    ['messages missing', { model: 'tiny' }, 400, 'messages'],
    ['messages empty', { model: 'tiny', messages: [] }, 400, 'messages'],
    ['bad role', { model: 'tiny', messages: [{ role: 'robot', content: 'x' }] }, 400, 'messages[0].role'],
    ['extra message field', { model: 'tiny', messages: [{ role: 'user', content: 'x', extra: 1 }] }, 400, 'messages[0].extra'],
    ['user content null', { model: 'tiny', messages: [{ role: 'user', content: null }] }, 400, 'messages[0].content'],
    ['unknown part type', { model: 'tiny', messages: [{ role: 'user', content: [{ type: 'video', text: 'x' }] }] }, 400, 'messages[0].content[0].type'],
    ['audio part', { model: 'tiny', messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: {} }] }] }, 400, 'messages[0].content[0].type', 'unsupported_input'],
    ['text part without text', { model: 'tiny', messages: [{ role: 'user', content: [{ type: 'text' }] }] }, 400, 'messages[0].content[0].text'],
    ['image_url part with text', { model: 'tiny', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' }, text: 'x' }] }] }, 400, 'messages[0].content[0].text'],
    ['image URL not http', { model: 'tiny', messages: img('ftp://example.com/a.png') }, 400, 'messages[0].content[1].image_url.url'],
    ['stream true', { ...ok, stream: true }, 400, 'stream', 'unsupported_parameter'],
    ['stream_options', { ...ok, stream_options: { include_usage: true } }, 400, 'stream_options'],
    ['five stop strings', { ...ok, stop: ['a', 'b', 'c', 'd', 'e'] }, 400, 'stop'],
    ['empty stop string', { ...ok, stop: '' }, 400, 'stop'],
    ['fractional seed', { ...ok, seed: 1.5 }, 400, 'seed'],
    ['n 0', { ...ok, n: 0 }, 400, 'n'],
    ['n 9', { ...ok, n: 9 }, 400, 'n'],
    ['top_logprobs without logprobs', { ...ok, top_logprobs: 3 }, 400, 'top_logprobs'],
    ['top_logprobs 21', { ...ok, logprobs: true, top_logprobs: 21 }, 400, 'top_logprobs'],
    ['presence_penalty', { ...ok, presence_penalty: 0.5 }, 400, 'presence_penalty', 'unsupported_parameter'],
    ['frequency_penalty', { ...ok, frequency_penalty: -1 }, 400, 'frequency_penalty', 'unsupported_parameter'],
    ['logit_bias', { ...ok, logit_bias: { 50: 10 } }, 400, 'logit_bias', 'unsupported_parameter'],
    ['tools', { ...ok, tools: [{ type: 'function', function: { name: 'f' } }] }, 400, 'tools', 'tools_unsupported'],
    ['functions', { ...ok, functions: [{ name: 'f' }] }, 400, 'functions', 'unsupported_parameter'],
    ['tool_choice required without tools', { ...ok, tool_choice: 'required' }, 400, 'tool_choice'],
    ['audio output', { ...ok, audio: { voice: 'alloy', format: 'mp3' } }, 400, 'audio', 'unsupported_parameter'],
    ['response_format json_object with extra fields', { ...ok, response_format: { type: 'json_object', schema: {} } }, 400, 'response_format.schema'],
    ['json_schema with an unsupported keyword', { ...ok, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } },
      400, 'response_format.json_schema.schema'],
    ['json_schema without json_schema', { ...ok, response_format: { type: 'json_schema' } }, 400, 'response_format.json_schema'],
    ['json_schema without name', { ...ok, response_format: { type: 'json_schema', json_schema: { schema: {} } } }, 400, 'response_format.json_schema.name'],
    ['metadata value not a string', { ...ok, metadata: { a: 1 } }, 400, 'metadata.a'],
    ['user too long', { ...ok, user: 'u'.repeat(257) }, 400, 'user'],
    ['service_tier unknown', { ...ok, service_tier: 'gold' }, 400, 'service_tier'],
    ['unknown top-level field', { ...ok, frobnicate: true }, 400, 'frobnicate'],
    ['image to a model without image input', { model: 'tiny', messages: img('https://example.com/a.png') }, 400, 'messages[0].content[1]', 'image_input_unsupported'],
    ['image as data URI', { model: 'tiny', messages: img('data:image/png;base64,iVBORw0KGgo=') }, 400, 'messages[0].content[1]', 'image_input_unsupported'],
    ['context length exceeded', { model: 'tiny-short', messages: M, max_completion_tokens: 60 }, 400, 'max_completion_tokens', 'context_length_exceeded'],
    ['unknown model', { model: 'nope', messages: M }, 404, 'model', 'model_not_found'],
    ['restricted model (answered as unknown)', { model: 'tiny-acme', messages: M }, 404, 'model', 'model_not_found'],
    ['window not priced', { model: 'tiny-asap', messages: M, metadata: { completion_window: 'standard' } }, 400, 'metadata.completion_window', 'unsupported_completion_window'],
    ['flex (no background here)', { model: 'tiny', messages: M, metadata: { completion_window: 'flex' } }, 400, 'metadata.completion_window'],
    ['bad window value', { model: 'tiny', messages: M, metadata: { completion_window: 'soon' } }, 400, 'metadata.completion_window'],
  ];

  it.each(rows.map(([what, body, status, param, code]) => [what, status, param, body, code] as const))(
    '%s -> %i (param %s)', async (_what, status, param, body, code) => {
      const generate = vi.spyOn(engine(), 'generate');
      const promptTokenIds = vi.spyOn(engine(), 'promptTokenIds');
      const res = await post(body);
      expect(res.status).toBe(status);
      expect(Object.keys(res.json)).toEqual(['error']);
      expect(res.json.error).toMatchObject({ type: expect.any(String), message: expect.any(String), param });
      if (code !== undefined) expect(res.json.error.code).toBe(code);
      expect(generate).not.toHaveBeenCalled();
      // Everything but the context check fails before the prompt is even tokenized.
      if (code !== 'context_length_exceeded') expect(promptTokenIds).not.toHaveBeenCalled();
    });

  it('maps statuses to the OpenAI client error classes', async () => {
    await expect(client.chat.completions.create({ model: 'nope', messages: M })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    // A restricted model without the grant is answered as unknown (no 403 that would confirm it exists).
    await expect(client.chat.completions.create({ model: 'tiny-acme', messages: M })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(client.chat.completions.create({ model: 'tiny', messages: M, temperature: 3 })).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    const bad = new OpenAI({ baseURL: server.baseUrl, apiKey: 'sk-wrong', maxRetries: 0 });
    await expect(bad.chat.completions.create({ model: 'tiny', messages: M })).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  });
});
