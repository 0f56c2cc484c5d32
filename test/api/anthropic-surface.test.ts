// What Anthropic's clients meet besides POST /v1/messages itself, black-box over HTTP with the
// official SDK (and raw fetch where the wire shape is the point): the spec's error envelope
// ({error: {message, type, param, code}}, nothing else at the top) on every failure of the
// Messages routes, including those raised before a route handler runs, with Anthropic's type
// names inside, which the SDK reads; the spec's model objects whatever the anthropic-version
// header says; POST /v1/messages/count_tokens.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { toMessagesEnvelope } from '../../src/surfaces/messages/envelope.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { createBatch, readResults, waitForBatch } from '../helpers/batches.js';

let server: TestServer;
let client: Anthropic;
let acmeKey: string;

const ASAP = [{ tier: 'asap' as const, input_per_1m_tokens: 1, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 2 }];

beforeAll(async () => {
  server = await startTestServer({
    catalog: (dir) => ({
      models: [
        { id: 'tiny', name: 'Tiny', checkpoint: dir },
        { id: 'tiny-2', checkpoint: dir },
        { id: 'tiny-secret', checkpoint: dir, restricted: true, granted_organizations: ['acme'] },
        { id: 'tiny-3', checkpoint: dir, pricing: ASAP },
        { id: 'tiny-base', checkpoint: dir, supports_chat: false },
        { id: 'tiny-short', checkpoint: dir, context_length: 64 },
      ],
      // One organization that can spend only a token a minute: its second generation is a 429.
      limits: { organizations: { thrifty: { tokens_per_minute: 1 } } },
    }),
  });
  client = new Anthropic({ baseURL: server.origin, apiKey: server.key, maxRetries: 0 });
  acmeKey = await server.keyFor('acme');
});
afterAll(async () => { await server?.close(); });
afterEach(() => { vi.restoreAllMocks(); });

const engine = () => server.service.registry.models[0]!.engine;
const user = (content: string) => [{ role: 'user' as const, content }];

async function raw(method: string, path: string, opts: { body?: string; headers?: Record<string, string> } = {}) {
  const res = await fetch(`${server.origin}${path}`, {
    method, headers: opts.headers ?? {}, ...(opts.body !== undefined && { body: opts.body }),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, json: JSON.parse(text) as any };
}

const auth = () => ({ 'x-api-key': server.key, 'content-type': 'application/json' });

/** The spec's envelope and nothing else: top-level keys exactly ['error'], the inner four always present. */
function expectSpecEnvelope(json: any, type: string, code?: string): void {
  expect(Object.keys(json)).toEqual(['error']);
  expect(Object.keys(json.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(json.error.type).toBe(type);
  expect(typeof json.error.message).toBe('string');
  expect(json.error.message.length).toBeGreaterThan(0);
  if (code !== undefined) expect(json.error.code).toBe(code);
}

/** The spec's model fields; restricted and long_context_pricing come only where they apply. */
const MODEL_KEYS = ['context_length', 'id', 'name', 'object', 'pricing', 'supports_chat', 'supports_image_input', 'supports_tools'];

describe('errors of the Messages routes in the spec\'s envelope, with Anthropic\'s types', () => {
  const ok = JSON.stringify({ model: 'tiny', max_tokens: 4, messages: user('Hi') });

  it.each([
    ['no key', '/v1/messages', 'POST', { 'content-type': 'application/json' }, ok, 401, 'authentication_error', 'missing_api_key'],
    ['a revoked or unknown key', '/v1/messages', 'POST', { 'x-api-key': 'sk-sluice-nope', 'content-type': 'application/json' }, ok, 401, 'authentication_error', 'invalid_api_key'],
    ['malformed JSON', '/v1/messages', 'POST', 'auth', '{"model": ', 400, 'invalid_request_error', 'invalid_json'],
    ['JSON nested too deep', '/v1/messages', 'POST', 'auth', `${'['.repeat(100)}${']'.repeat(100)}`, 400, 'invalid_request_error', 'json_too_deep'],
    ['a prototype key', '/v1/messages', 'POST', 'auth', '{"__proto__": {"x": 1}}', 400, 'invalid_request_error', 'forbidden_json_key'],
    ['a body that is not JSON', '/v1/messages', 'POST', 'text', 'hello', 415, 'invalid_request_error', undefined],
    ['schema validation', '/v1/messages', 'POST', 'auth', JSON.stringify({ model: 'tiny', messages: user('Hi') }), 400, 'invalid_request_error', 'invalid_request'],
    ['an unknown model', '/v1/messages', 'POST', 'auth', JSON.stringify({ model: 'nope', max_tokens: 4, messages: user('Hi') }), 404, 'not_found_error', 'model_not_found'],
    ['an unknown method', '/v1/messages', 'GET', 'auth', undefined, 404, 'not_found_error', 'unknown_route'],
    ['an unknown path below it', '/v1/messages/batches', 'GET', 'auth', undefined, 404, 'not_found_error', 'unknown_route'],
    ['count_tokens without a key', '/v1/messages/count_tokens', 'POST', { 'content-type': 'application/json' }, ok, 401, 'authentication_error', 'missing_api_key'],
    ['count_tokens with malformed JSON', '/v1/messages/count_tokens', 'POST', 'auth', '{', 400, 'invalid_request_error', 'invalid_json'],
  ] as const)('%s', async (_what, path, method, headers, body, status, type, code) => {
    const h = headers === 'auth' ? auth() : headers === 'text' ? { ...auth(), 'content-type': 'text/plain' } : headers;
    const res = await raw(method, path, { headers: h, ...(body !== undefined && { body }) });
    expect(res.status).toBe(status);
    expectSpecEnvelope(res.json, type, code);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  });

  it('the SDK raises its typed errors with the type and message of the body', async () => {
    const bad = new Anthropic({ baseURL: server.origin, apiKey: 'sk-sluice-wrong', maxRetries: 0 });
    const auth = await bad.messages.create({ model: 'tiny', max_tokens: 4, messages: user('Hi') }).catch((e: unknown) => e);
    expect(auth).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((auth as Anthropic.APIError).type).toBe('authentication_error');
    expect((auth as Anthropic.APIError).apiMessage).toMatch(/API key is not valid/);

    const invalid = await client.messages.create({ model: 'tiny', max_tokens: 4, messages: user('Hi'), temperature: 3 }).catch((e: unknown) => e);
    expect(invalid).toBeInstanceOf(Anthropic.BadRequestError);
    expect((invalid as Anthropic.APIError).type).toBe('invalid_request_error');
    expect((invalid as Anthropic.APIError).apiMessage).toMatch(/temperature/);
    expect((invalid as Anthropic.APIError).error).toEqual({
      error: { type: 'invalid_request_error', message: expect.stringMatching(/temperature/), param: 'temperature', code: 'invalid_request' },
    });

    const missing = await client.messages.create({ model: 'tiny-secret', max_tokens: 4, messages: user('Hi') }).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(Anthropic.NotFoundError);
    expect((missing as Anthropic.APIError).type).toBe('not_found_error');

    const counted = await client.messages.countTokens({ model: 'nope', messages: user('Hi') }).catch((e: unknown) => e);
    expect(counted).toBeInstanceOf(Anthropic.NotFoundError);
    expect((counted as Anthropic.APIError).type).toBe('not_found_error');
  });

  it('a 429 is rate_limit_error with Retry-After, and the SDK\'s RateLimitError', async () => {
    const thrifty = new Anthropic({ baseURL: server.origin, apiKey: await server.keyFor('thrifty'), maxRetries: 0 });
    await thrifty.messages.create({ model: 'tiny', max_tokens: 2, messages: user('Hello there') });
    const limited = await thrifty.messages.create({ model: 'tiny', max_tokens: 2, messages: user('Hello there') }).catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(Anthropic.RateLimitError);
    const err = limited as Anthropic.APIError;
    expect(err.type).toBe('rate_limit_error');
    // The spec's envelope; retry_after is an extra of the inner object, which the spec allows.
    expect(Object.keys(err.error as object)).toEqual(['error']);
    expect((err.error as any).error).toMatchObject({ type: 'rate_limit_error', code: 'rate_limit_exceeded', param: null, retry_after: expect.any(Number) });
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(0);
  });

  it('other routes answer the same envelope with their own types, Anthropic clients or not', async () => {
    const anthropicHeaders = { 'anthropic-version': '2023-06-01' };
    const chat = await raw('POST', '/v1/chat/completions', { headers: { ...auth(), ...anthropicHeaders }, body: '{"model": ' });
    expect(chat.status).toBe(400);
    expectSpecEnvelope(chat.json, 'invalid_request_error', 'invalid_json');
    const models = await raw('GET', '/v1/models', { headers: anthropicHeaders });
    expect(models.status).toBe(401);
    expectSpecEnvelope(models.json, 'authentication_error', 'missing_api_key');
    const model = await raw('GET', '/v1/models/nope', { headers: { ...auth(), ...anthropicHeaders } });
    expect(model.status).toBe(404);
    expectSpecEnvelope(model.json, 'not_found_error', 'model_not_found');
    // A path that only starts like the Messages route is not part of it.
    const near = await raw('POST', '/v1/messages-v2', { headers: auth(), body: '{}' });
    expect(near.status).toBe(404);
    expectSpecEnvelope(near.json, 'invalid_request_error', 'unknown_route');
  });

  it('keeps the envelope, message, param, code and extras, with the status\'s Anthropic type', () => {
    const cases: Array<[number, string]> = [
      [400, 'invalid_request_error'], [401, 'authentication_error'], [403, 'permission_error'], [404, 'not_found_error'],
      [409, 'invalid_request_error'], [413, 'request_too_large'], [422, 'invalid_request_error'], [429, 'rate_limit_error'],
      [500, 'api_error'], [503, 'overloaded_error'],
    ];
    for (const [status, type] of cases) {
      expect(toMessagesEnvelope(status, { error: { message: 'm', type: 'x', param: null, code: null } }))
        .toEqual({ error: { type, message: 'm', param: null, code: null } });
    }
    expect(toMessagesEnvelope(429, { error: { message: 'slow down', type: 'rate_limit_error', param: 'p', code: 'rate_limit_exceeded', retry_after: 3 } }))
      .toEqual({ error: { type: 'rate_limit_error', message: 'slow down', param: 'p', code: 'rate_limit_exceeded', retry_after: 3 } });
  });

  it('a batch line for /v1/messages fails with the body the endpoint answers', async () => {
    const openai = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const body = { model: 'tiny', max_tokens: 4, messages: user('Hi'), temperature: 3 };
    const batch = await createBatch(openai, [{ custom_id: 'bad', method: 'POST', url: '/v1/messages', body }], 'standard', '/v1/messages');
    const done = await waitForBatch(openai, batch.id);
    const [line] = await readResults(openai, done.error_file_id);
    const direct = await raw('POST', '/v1/messages', { headers: auth(), body: JSON.stringify(body) });
    expect(line!.response!.status_code).toBe(direct.status);
    expect(line!.response!.body).toEqual(direct.json);
    expectSpecEnvelope(line!.response!.body, 'invalid_request_error', 'invalid_request');
  });
});

describe('GET /v1/models for Anthropic clients', () => {
  const version = { 'anthropic-version': '2023-06-01' };

  it('lists the spec\'s model objects, exactly, whether or not an anthropic-version header is sent', async () => {
    const plain = await raw('GET', '/v1/models', { headers: { authorization: `Bearer ${server.key}` } });
    const anthropic = await raw('GET', '/v1/models', { headers: { 'x-api-key': server.key, ...version } });
    // Anthropic's paging parameters change nothing either: there is one list.
    const paged = await raw('GET', '/v1/models?limit=1&after_id=tiny', { headers: { 'x-api-key': server.key, ...version } });
    for (const res of [plain, anthropic, paged]) {
      expect(res.status).toBe(200);
      expect(Object.keys(res.json).sort()).toEqual(['data', 'object']);
      expect(res.json.object).toBe('list');
      expect(res.json.data.map((m: any) => m.id)).toEqual(['tiny', 'tiny-2', 'tiny-3', 'tiny-base', 'tiny-short']);
      for (const m of res.json.data) {
        expect(Object.keys(m).sort(), m.id).toEqual(MODEL_KEYS);
        expect(m.object).toBe('model');
      }
    }
    expect(anthropic.json).toEqual(plain.json);
    expect(paged.json).toEqual(plain.json);
    expect(plain.json.data[0]).toMatchObject({ id: 'tiny', name: 'Tiny', context_length: 2048 });
  });

  it('retrieves one model in the spec\'s shape for both SDKs; a hidden one is not found', async () => {
    const openai = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
    const viaOpenAI = await openai.models.retrieve('tiny-2');
    // The Anthropic SDK's retrieve sends anthropic-version; the object is the same.
    const viaAnthropic = await client.models.retrieve('tiny-2');
    expect(viaAnthropic).toEqual(viaOpenAI);
    expect(Object.keys(viaAnthropic).sort()).toEqual(MODEL_KEYS);
    expect(viaAnthropic).toMatchObject({ id: 'tiny-2', object: 'model', name: 'tiny-2' });

    const hidden = await client.models.retrieve('tiny-secret').catch((e: unknown) => e);
    expect(hidden).toBeInstanceOf(Anthropic.NotFoundError);
    expectSpecEnvelope((hidden as Anthropic.APIError).error, 'not_found_error', 'model_not_found');
    const acme = new Anthropic({ baseURL: server.origin, apiKey: acmeKey, maxRetries: 0 });
    const granted = await acme.models.retrieve('tiny-secret') as unknown as Record<string, unknown>;
    expect(Object.keys(granted).sort()).toEqual([...MODEL_KEYS, 'restricted'].sort());
    expect(granted['restricted']).toBe(true);
  });

  it('the Anthropic SDK\'s list reads the spec\'s list as one page', async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => m.id)).toEqual(['tiny', 'tiny-2', 'tiny-3', 'tiny-base', 'tiny-short']);
    for (const m of page.data) expect(Object.keys(m).sort()).toEqual(MODEL_KEYS);
    expect(page.hasNextPage()).toBe(false);
  });
});

describe('POST /v1/messages/count_tokens', () => {
  const conversations: Array<[string, Omit<Anthropic.MessageCountTokensParams, 'model'>]> = [
    ['one user turn', { messages: user('Tell me about rivers') }],
    ['a system prompt in blocks and several turns', {
      system: [{ type: 'text', text: 'You are terse.' }, { type: 'text', text: 'Answer in English.' }],
      messages: [...user('Hi'), { role: 'assistant', content: [{ type: 'text', text: 'Hello! How can I help?' }] },
        { role: 'user', content: [{ type: 'text', text: 'Name a river.' }, { type: 'text', text: 'A long one.' }] }],
    }],
  ];

  it.each(conversations)('counts %s as /v1/messages bills its prompt, and bills nothing', async (_what, conversation) => {
    const usageBefore = (await server.service.store.listUsage({})).length;
    const generate = vi.spyOn(engine(), 'generate');
    const counted = await client.messages.countTokens({ model: 'tiny', ...conversation });
    expect(Object.keys(counted)).toEqual(['input_tokens']);
    expect(generate).not.toHaveBeenCalled();
    expect((await server.service.store.listUsage({})).length).toBe(usageBefore);
    // Tools are accepted and never shown to the model, on both routes: the count does not change.
    const withTools = await client.messages.countTokens({
      model: 'tiny', ...conversation, tools: [{ name: 'f', input_schema: { type: 'object' } }], tool_choice: { type: 'auto' },
    });
    expect(withTools.input_tokens).toBe(counted.input_tokens);

    const message = await client.messages.create({ model: 'tiny', max_tokens: 2, temperature: 0, ...conversation } as Anthropic.MessageCreateParamsNonStreaming);
    // /v1/messages splits the prompt into cache reads and the rest; together they are the prompt.
    expect(message.usage.input_tokens + (message.usage.cache_read_input_tokens ?? 0)).toBe(counted.input_tokens);
    expect(counted.input_tokens).toBeGreaterThan(0);
  });

  it('counts a prompt the model\'s context cannot hold (the count says so) and spends no token budget', async () => {
    const long = user('river '.repeat(60));
    const counted = await client.messages.countTokens({ model: 'tiny-short', messages: long });
    expect(counted.input_tokens).toBeGreaterThan(64);
    await expect(client.messages.create({ model: 'tiny-short', max_tokens: 1, messages: long })).rejects.toBeInstanceOf(Anthropic.BadRequestError);
    // An organization out of tokens for the minute may still count.
    const thrifty = new Anthropic({ baseURL: server.origin, apiKey: await server.keyFor('thrifty'), maxRetries: 0 });
    for (let i = 0; i < 3; i++) expect((await thrifty.messages.countTokens({ model: 'tiny', messages: user('Hi') })).input_tokens).toBeGreaterThan(0);
  });

  it('validates as /v1/messages does, in the spec\'s envelope', async () => {
    const ok = { model: 'tiny', messages: user('Hi') };
    const rows: Array<[string, Record<string, unknown>, number, string, string?]> = [
      ['max_tokens (no place in a count)', { ...ok, max_tokens: 4 }, 400, 'max_tokens'],
      ['temperature', { ...ok, temperature: 0.5 }, 400, 'temperature'],
      ['stream', { ...ok, stream: true }, 400, 'stream'],
      ['messages missing', { model: 'tiny' }, 400, 'messages'],
      ['messages empty', { ...ok, messages: [] }, 400, 'messages'],
      ['an unknown block', { ...ok, messages: [{ role: 'user', content: [{ type: 'video' }] }] }, 400, 'messages[0].content[0].type'],
      ['a tool_use block', { ...ok, messages: [{ role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'f', input: {} }] }] }, 400, 'messages[0].content[0].type', 'unsupported_input'],
      ['thinking enabled', { ...ok, thinking: { type: 'enabled', budget_tokens: 1024 } }, 400, 'thinking.type', 'unsupported_parameter'],
      ['an image for a model without image input', { ...ok, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }] }, 400, 'messages[0].content[0]', 'image_input_unsupported'],
      ['a completion-only model', { ...ok, model: 'tiny-base' }, 400, 'model', 'chat_unsupported'],
      ['an unknown model', { ...ok, model: 'nope' }, 404, 'model', 'model_not_found'],
      ['a restricted model not granted', { ...ok, model: 'tiny-secret' }, 404, 'model', 'model_not_found'],
    ];
    const promptTokenIds = vi.spyOn(engine(), 'preparePrompt');
    for (const [what, body, status, param, code] of rows) {
      const res = await raw('POST', '/v1/messages/count_tokens', { headers: auth(), body: JSON.stringify(body) });
      expect(res.status, what).toBe(status);
      expectSpecEnvelope(res.json, status === 404 ? 'not_found_error' : 'invalid_request_error', code);
      expect(res.json.error.param, what).toBe(param);
    }
    // Every refusal came before the prompt was rendered.
    expect(promptTokenIds).not.toHaveBeenCalled();
    const acme = new Anthropic({ baseURL: server.origin, apiKey: acmeKey, maxRetries: 0 });
    expect((await acme.messages.countTokens({ model: 'tiny-secret', messages: user('Hi') })).input_tokens).toBeGreaterThan(0);
  });
});
