// POST /v1/responses and GET /v1/responses/{id}, black-box over HTTP with the official openai
// client (shapes, storage, background) and raw fetch (the table of rejection rules).
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { testCatalog } from '../helpers/api-catalog.js';

let server: TestServer;
let client: OpenAI;
let acmeKey: string;

beforeAll(async () => {
  server = await startTestServer({ catalog: testCatalog });
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key });
  acmeKey = await server.keyFor('acme');
});
afterAll(async () => { await server?.close(); });

async function post(body: unknown, key = server.key): Promise<{ status: number; body: Record<string, any> }> {
  const res = await fetch(`${server.baseUrl}/responses`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() as Record<string, any> };
}

/** The engine's own greedy answer for a conversation, bypassing HTTP. */
async function engineGreedy(messages: Array<{ role: 'user' | 'system' | 'developer' | 'assistant'; content: string }>, maxTokens: number) {
  const engine = server.service.registry.models[0]!.engine;
  return engine.generate({ messages, maxTokens, temperature: 0 });
}

describe('creating responses', () => {
  it('returns the Response object with every required field, output as a message item, and usage', async () => {
    const r = await client.responses.create({ model: 'tiny', input: 'Hello there', max_output_tokens: 6, temperature: 0 });
    const want = await engineGreedy([{ role: 'user', content: 'Hello there' }], 6);
    expect(r.id).toMatch(/^resp_[0-9a-f]{32}$/);
    expect(r.object).toBe('response');
    expect(Math.abs(r.created_at - Date.now() / 1000)).toBeLessThan(60);
    expect(r.model).toBe('tiny');
    expect(r.metadata).toEqual({});
    expect(r.output).toHaveLength(1);
    const item = r.output[0] as any;
    expect(item).toMatchObject({ type: 'message', role: 'assistant' });
    expect(item.content).toEqual([{ type: 'output_text', text: want.text, annotations: [], logprobs: [] }]);
    expect(r.output_text).toBe(want.text); // the SDK's own reading of the output items
    expect(r.usage).toEqual({
      input_tokens: want.usage.promptTokens,
      input_tokens_details: { cached_tokens: 0, reasoning_tokens: 0 },
      output_tokens: want.usage.completionTokens,
      output_tokens_details: { cached_tokens: 0, reasoning_tokens: 0 },
      total_tokens: want.usage.promptTokens + want.usage.completionTokens,
    });
    if (want.finishReason === 'length') {
      expect(r.status).toBe('incomplete');
      expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' });
      expect(item.status).toBe('incomplete');
    } else {
      expect(r.status).toBe('completed');
      expect(r.incomplete_details).toBeNull();
    }
    expect(r.error).toBeNull();
    expect((r as any).completion_window).toBe('standard');
  });

  it('reports the engine timings in a Server-Timing header', async () => {
    const res = await fetch(`${server.baseUrl}/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', input: 'hi', max_output_tokens: 3 }),
    });
    const timing = res.headers.get('server-timing') ?? '';
    const durations = Object.fromEntries([...timing.matchAll(/(\w+);dur=([\d.]+)/g)].map((m) => [m[1], Number(m[2])]));
    expect(Object.keys(durations)).toEqual(['queue', 'prefill', 'decode']);
    for (const d of Object.values(durations)) expect(d).toBeGreaterThanOrEqual(0);
  });

  it('is incomplete with reason max_output_tokens when the limit cuts it', async () => {
    const r = await client.responses.create({ model: 'tiny', input: 'Count', max_output_tokens: 1, temperature: 0 });
    const want = await engineGreedy([{ role: 'user', content: 'Count' }], 1);
    expect(r.usage!.output_tokens).toBe(1);
    expect(r.status).toBe(want.finishReason === 'length' ? 'incomplete' : 'completed');
  });

  it('accepts input as a string, a message array and {messages}, with instructions as a leading developer turn', async () => {
    const turns = [{ role: 'user' as const, content: 'Tell me about rivers' }];
    const forms = [
      'Tell me about rivers',
      turns,
      [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Tell me about rivers' }] }],
      { messages: turns },
    ];
    const texts: string[] = [];
    for (const input of forms) {
      const { status, body } = await post({ model: 'tiny', input, max_output_tokens: 8, temperature: 0 });
      expect(status).toBe(200);
      texts.push(body['output'][0].content[0].text);
    }
    expect(new Set(texts).size).toBe(1);
    expect(texts[0]).toBe((await engineGreedy(turns, 8)).text);

    const withInstructions = await post({ model: 'tiny', input: 'Tell me about rivers', instructions: 'Be brief.', max_output_tokens: 8, temperature: 0 });
    const want = await engineGreedy([{ role: 'developer', content: 'Be brief.' }, ...turns], 8);
    expect(withInstructions.body['output'][0].content[0].text).toBe(want.text);
    expect(withInstructions.body['instructions']).toBe('Be brief.');
  });

  it('runs a completion-only model on the raw string prompt', async () => {
    const { status, body } = await post({ model: 'tiny-base', input: 'Once upon a time', max_output_tokens: 5, temperature: 0 });
    expect(status).toBe(200);
    const engine = server.service.registry.models[0]!.engine;
    const want = await engine.generate({ prompt: 'Once upon a time', maxTokens: 5, temperature: 0 });
    expect(body['output'][0].content[0].text).toBe(want.text);
    expect(body['completion_window']).toBe('standard'); // no rates published: every window, standard by default
  });

  it('accepts unknown extra fields and echoes metadata, text format and sampling settings', async () => {
    const format = { type: 'json_schema', name: 'answer', schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['a'],
      additionalProperties: false }, strict: true };
    const { status, body } = await post({
      model: 'tiny', input: 'hi', max_output_tokens: 2, temperature: 0.5, top_p: 0.9, user: 'u-1',
      metadata: { completion_window: 'asap', note: 'x' }, text: { format }, some_future_field: { a: 1 },
      reasoning: { effort: 'low', generate_summary: 'auto' }, store: false, truncation: 'disabled', stream: false,
    });
    expect(status).toBe(200);
    expect(body).toMatchObject({
      metadata: { completion_window: 'asap', note: 'x' }, text: { format }, temperature: 0.5, top_p: 0.9, user: 'u-1',
      store: false, completion_window: 'asap', truncation: 'disabled', max_output_tokens: 2,
    });
  });

  it('picks the default window from the rates: standard where priced, else asap; flex never', async () => {
    expect((await post({ model: 'tiny-asap', input: 'hi', max_output_tokens: 1 })).body['completion_window']).toBe('asap');
    const flexOnly = await post({ model: 'tiny-flex', input: 'hi', max_output_tokens: 1 });
    expect(flexOnly.status).toBe(400);
    expect(flexOnly.body['error'].param).toBe('metadata.completion_window');
  });
});

describe('stored responses', () => {
  it('GET returns the same object the POST returned, store=false included', async () => {
    for (const store of [true, false]) {
      const created = await client.responses.create({ model: 'tiny', input: 'Hello', max_output_tokens: 3, store });
      const got = await client.responses.retrieve(created.id);
      const { output_text: _a, ...createdBody } = created as any;
      const { output_text: _b, ...gotBody } = got as any;
      expect(gotBody).toEqual(createdBody);
    }
  });

  it('unknown ids and another organization\'s responses are 404', async () => {
    const created = await client.responses.create({ model: 'tiny', input: 'Hello', max_output_tokens: 1 });
    for (const [id, key] of [['resp_doesnotexist', server.key], [created.id, acmeKey]] as const) {
      const res = await fetch(`${server.baseUrl}/responses/${id}`, { headers: { authorization: `Bearer ${key}` } });
      expect(res.status).toBe(404);
      expect((await res.json() as any).error).toMatchObject({ type: 'not_found_error', param: 'response_id' });
    }
  });

  it('background=true returns in_progress at once and completes through the engine', async () => {
    const { status, body } = await post({ model: 'tiny', input: 'Tell me about rivers', max_output_tokens: 12, temperature: 0, background: true });
    expect(status).toBe(200);
    expect(body['status']).toBe('in_progress');
    expect(body['background']).toBe(true);
    expect(body['output']).toEqual([]);
    let polled = body;
    for (let i = 0; i < 200 && polled['status'] === 'in_progress'; i++) {
      await new Promise((r) => setTimeout(r, 25));
      polled = await client.responses.retrieve(body['id']) as any;
    }
    const want = await engineGreedy([{ role: 'user', content: 'Tell me about rivers' }], 12);
    expect(polled['status']).toBe(want.finishReason === 'length' ? 'incomplete' : 'completed');
    expect(polled['output'][0].content[0].text).toBe(want.text);
    expect(polled['usage'].output_tokens).toBe(want.usage.completionTokens);
  });

  it('flex runs when background=true', async () => {
    const { status, body } = await post({
      model: 'tiny-flex', input: 'hi', max_output_tokens: 2, background: true, metadata: { completion_window: 'flex' },
    });
    expect(status).toBe(200);
    expect(body['completion_window']).toBe('flex');
  });
});

describe('rejections', () => {
  const ok = { model: 'tiny', input: 'hi', max_output_tokens: 2 };
  const image = { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=' };
  const rows: Array<[string, Record<string, unknown>, number, string | null, string?]> = [
    ['model missing', { input: 'hi' }, 400, 'model'],
    ['input missing', { model: 'tiny' }, 400, 'input'],
    ['input empty string', { ...ok, input: '' }, 400, 'input'],
    ['input empty array', { ...ok, input: [] }, 400, 'input'],
    ['{messages} empty', { ...ok, input: { messages: [] } }, 400, 'input.messages'],
    ['input a number', { ...ok, input: 5 }, 400, 'input'],
    ['max_output_tokens 0', { ...ok, max_output_tokens: 0 }, 400, 'max_output_tokens'],
    ['max_output_tokens not an integer', { ...ok, max_output_tokens: 1.5 }, 400, 'max_output_tokens'],
    ['temperature below 0', { ...ok, temperature: -0.01 }, 400, 'temperature'],
    ['temperature above 2', { ...ok, temperature: 2.01 }, 400, 'temperature'],
    ['temperature a string', { ...ok, temperature: '1' }, 400, 'temperature'],
    ['top_p above 1', { ...ok, top_p: 1.01 }, 400, 'top_p'],
    ['top_p below 0', { ...ok, top_p: -0.5 }, 400, 'top_p'],
    ['stream true', { ...ok, stream: true }, 400, 'stream'],
    ['truncation auto', { ...ok, truncation: 'auto' }, 400, 'truncation'],
    ['user over 256', { ...ok, user: 'u'.repeat(257) }, 400, 'user'],
    ['background not boolean', { ...ok, background: 'yes' }, 400, 'background'],
    ['store not boolean', { ...ok, store: 'no' }, 400, 'store'],
    ['text.format unknown type', { ...ok, text: { format: { type: 'xml' } } }, 400, 'text.format.type'],
    ['json_schema without name', { ...ok, text: { format: { type: 'json_schema', schema: {} } } }, 400, 'text.format.name'],
    ['reasoning.effort unknown', { ...ok, reasoning: { effort: 'max' } }, 400, 'reasoning.effort'],
    ['reasoning.generate_summary unknown', { ...ok, reasoning: { generate_summary: 'long' } }, 400, 'reasoning.generate_summary'],
    ['metadata value not a string', { ...ok, metadata: { a: 1 } }, 400, 'metadata.a'],
    ['completion_window unknown', { ...ok, metadata: { completion_window: 'fast' } }, 400, 'metadata.completion_window'],
    ['window the model does not price', { ...ok, metadata: { completion_window: 'flex' }, background: true }, 400, 'metadata.completion_window', 'unsupported_completion_window'],
    ['flex without background', { ...ok, model: 'tiny-flex', metadata: { completion_window: 'flex' } }, 400, 'background'],
    ['role unknown', { ...ok, input: [{ role: 'robot', content: 'hi' }] }, 400, 'input[0].role'],
    ['message without content', { ...ok, input: [{ role: 'user' }] }, 400, 'input[0].content'],
    ['extra field in a message', { ...ok, input: [{ role: 'user', content: 'hi', mood: 'x' }] }, 400, 'input[0].mood'],
    ['empty content array', { ...ok, input: [{ role: 'user', content: [] }] }, 400, 'input[0].content'],
    ['input_text without text', { ...ok, input: [{ role: 'user', content: [{ type: 'input_text' }] }] }, 400, 'input[0].content[0].text'],
    ['image to a model without image input', { ...ok, input: [{ role: 'user', content: [{ type: 'input_text', text: 'see' }, image] }] }, 400, 'input[0].content[1]', 'image_input_unsupported'],
    ['image URL not http(s) or data', { ...ok, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'ftp://x/y.png' }] }] }, 400, 'input[0].content[0].image_url'],
    ['image detail unknown', { ...ok, input: [{ role: 'user', content: [{ ...image, detail: 'max' }] }] }, 400, 'input[0].content[0].detail'],
    ['audio input', { ...ok, input: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AA==', format: 'wav' } }] }] }, 400, 'input[0].content[0].type', 'unsupported_input'],
    ['file input', { ...ok, input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'file-1' }] }] }, 400, 'input[0].content[0].type', 'unsupported_input'],
    ['unknown part type', { ...ok, input: [{ role: 'user', content: [{ type: 'input_video', url: 'x' }] }] }, 400, 'input[0].content[0].type'],
    ['item type named like an Object property', { ...ok, input: [{ type: 'constructor', role: 'user', content: 'hi' }] }, 400, 'input[0].type'],
    ['item reference', { ...ok, input: [{ type: 'item_reference', id: 'msg_1' }] }, 400, 'input[0].type', 'unsupported_input'],
    ['conversation to a completion-only model', { ...ok, model: 'tiny-base', input: [{ role: 'user', content: 'hi' }] }, 400, 'input', 'chat_unsupported'],
    ['prompt + max output over the context', { ...ok, model: 'tiny-base', max_output_tokens: 64 }, 400, 'max_output_tokens', 'context_length_exceeded'],
    ['max output alone over the context', { ...ok, max_output_tokens: 5000 }, 400, 'max_output_tokens', 'context_length_exceeded'],
    ['unknown model', { ...ok, model: 'nope' }, 404, 'model', 'model_not_found'],
    ['restricted model not granted (answered as unknown)', { ...ok, model: 'tiny-restricted' }, 404, 'model', 'model_not_found'],
  ];

  it.each(rows)('%s', async (_name, body, status, param, code) => {
    const before = await server.service.store.listApiKeys(); // any cheap call: the store stays usable
    const res = await post(body);
    expect(res.status).toBe(status);
    expect(Object.keys(res.body)).toEqual(['error']);
    expect(res.body['error'].param).toBe(param);
    expect(typeof res.body['error'].message).toBe('string');
    expect(res.body['error'].type).toBe(status === 404 ? 'not_found_error' : 'invalid_request_error');
    if (code) expect(res.body['error'].code).toBe(code);
    expect(before.length).toBeGreaterThan(0);
  });

  it('a granted organization may use the restricted model', async () => {
    const res = await post({ model: 'tiny-restricted', input: 'hi', max_output_tokens: 1 }, acmeKey);
    expect(res.status).toBe(200);
    expect(res.body['completion_window']).toBe('asap');
  });

  it('a rejected request stores nothing and the image check runs before the model', async () => {
    const engine = server.service.registry.models[0]!.engine;
    const spy = { calls: 0 };
    const original = engine.generate.bind(engine);
    engine.generate = async (req) => { spy.calls++; return original(req); };
    try {
      const res = await post({ model: 'tiny', input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/cat.png' }] }] });
      expect(res.status).toBe(400);
      expect(spy.calls).toBe(0);
    } finally {
      engine.generate = original;
    }
  });
});
