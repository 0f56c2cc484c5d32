// Reasoning and tool calling black-box, with the official openai client, against tiny-qwen3 (a
// random-weight Qwen3-shaped model whose template thinks and renders tools): reasoning items and
// usage per effort, the budget closing the think block, forced and strict tool calls that always
// validate, and a full tool loop (call -> result -> answer) on both surfaces. A model whose
// template has no tools refuses them.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import Ajv2020 from 'ajv/dist/2020.js';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../../models/make-model.js';
import { Engine } from '../../src/index.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow } from '../helpers/batches.js';

let root: string;
let server: TestServer;
let client: OpenAI;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-reasoning-'));
  await makeModel({ preset: 'tiny-qwen3', out: join(root, 'tiny-qwen3'), seed: 4 });
  server = await startTestServer({
    catalog: (tiny) => ({ models: [{ id: 'tiny', checkpoint: tiny }, { id: 'tiny-qwen3', checkpoint: join(root, 'tiny-qwen3') }] }),
  });
  client = new OpenAI({ apiKey: server.key, baseURL: server.baseUrl, maxRetries: 0 });
});
afterAll(async () => {
  if (server) await closeNow(server);
  rmSync(root, { recursive: true, force: true });
});

const ajv = new Ajv2020.default({ strict: false });
const WEATHER = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
  required: ['city', 'days'],
  additionalProperties: false,
};
const chatTool = { type: 'function' as const, function: { name: 'get_weather', description: 'Forecast for a city', parameters: WEATHER, strict: true } };
const responsesTool = { type: 'function' as const, name: 'get_weather', description: 'Forecast for a city', parameters: WEATHER, strict: true };

describe('reasoning', () => {
  it('the thinking budget closes the block and the answer follows (engine)', async () => {
    const engine = await Engine.load({ model: join(root, 'tiny-qwen3'), backend: 'cpu', kvCacheBytes: 32 << 20 });
    try {
      const tags = engine.thinkingTags()!;
      for (const seed of [1, 2, 3]) {
        const r = await engine.generate({ messages: [{ role: 'user', content: 'think' }], thinking: { budget: 6 }, maxTokens: 20, seed, temperature: 1 });
        expect(r.tokenIds[0]).toBe(tags.openId);
        const close = r.tokenIds.indexOf(tags.closeId);
        expect(close).toBeGreaterThan(0);
        expect(close).toBeLessThanOrEqual(7);  // the open tag, at most 6 reasoning tokens, the close tag
      }
    } finally {
      await engine.dispose();
    }
  });

  it('Responses: a reasoning item and reasoning tokens with effort, none without', { timeout: 120_000 }, async () => {
    const off = await client.responses.create({ model: 'tiny-qwen3', input: 'hi', max_output_tokens: 8, reasoning: { effort: 'none' } });
    expect(off.output.some((o) => o.type === 'reasoning')).toBe(false);
    expect(off.usage?.output_tokens_details.reasoning_tokens).toBe(0);
    const on = await client.responses.create({ model: 'tiny-qwen3', input: 'hi', max_output_tokens: 16, reasoning: { effort: 'low' }, temperature: 0 });
    expect(on.output[0]?.type).toBe('reasoning');
    expect(on.usage!.output_tokens_details.reasoning_tokens).toBeGreaterThan(0);
    expect(on.usage!.output_tokens_details.reasoning_tokens).toBeLessThanOrEqual(on.usage!.output_tokens);
  });

  it('every effort: none and minimal think not at all, low to xhigh open a block and count its tokens', { timeout: 120_000 }, async () => {
    for (const effort of ['none', 'minimal', 'low', 'medium', 'high', 'xhigh'] as const) {
      const r = await client.responses.create({ model: 'tiny-qwen3', input: 'hi', max_output_tokens: 6, reasoning: { effort }, temperature: 0 });
      const thinks = effort !== 'none' && effort !== 'minimal';
      expect(r.output.some((o) => o.type === 'reasoning'), effort).toBe(thinks);
      const reasoningTokens = r.usage!.output_tokens_details.reasoning_tokens;
      if (thinks) expect(reasoningTokens, effort).toBeGreaterThan(0);
      else expect(reasoningTokens, effort).toBe(0);
      expect(r.reasoning?.effort).toBe(effort);
    }
  });

  it('Chat Completions: reasoning_content and reasoning tokens; models without thinking ignore effort', { timeout: 120_000 }, async () => {
    const r = await client.chat.completions.create({ model: 'tiny-qwen3', messages: [{ role: 'user', content: 'hi' }], max_tokens: 16, reasoning_effort: 'low', temperature: 0 });
    const message = r.choices[0]!.message as { reasoning_content?: string };
    expect(typeof message.reasoning_content).toBe('string');
    expect(r.usage!.completion_tokens_details!.reasoning_tokens).toBeGreaterThan(0);
    const plain = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, reasoning_effort: 'high' });
    expect(plain.usage!.completion_tokens_details!.reasoning_tokens).toBe(0);
    expect((plain.choices[0]!.message as { reasoning_content?: string }).reasoning_content).toBeUndefined();
  });
});

describe('tools', () => {
  it('tool_choice required gives calls whose arguments validate; a tool loop ends in an answer (Chat Completions)', { timeout: 120_000 }, async () => {
    for (const seed of [1, 2, 3, 4]) {
      const r = await client.chat.completions.create({
        model: 'tiny-qwen3', messages: [{ role: 'user', content: 'weather in Oslo?' }], tools: [chatTool], tool_choice: 'required',
        reasoning_effort: 'none', max_tokens: 120, seed, parallel_tool_calls: false,
      });
      const choice = r.choices[0]!;
      if (choice.finish_reason === 'length') continue;
      expect(choice.finish_reason).toBe('tool_calls');
      const calls = choice.message.tool_calls!;
      expect(calls).toHaveLength(1);
      const call = calls[0]! as { id: string; function: { name: string; arguments: string } };
      expect(call.function.name).toBe('get_weather');
      expect(ajv.validate(WEATHER, JSON.parse(call.function.arguments)), call.function.arguments).toBe(true);
      // The loop: the call and its result go back; the model answers (no tools forced now).
      const answer = await client.chat.completions.create({
        model: 'tiny-qwen3', reasoning_effort: 'none', max_tokens: 8, tools: [chatTool], tool_choice: 'none',
        messages: [{ role: 'user', content: 'weather in Oslo?' }, choice.message, { role: 'tool', tool_call_id: call.id, content: '{"temp": 3}' }],
      });
      expect(answer.choices[0]!.message.tool_calls).toBeUndefined();
      // The call and its result reached the prompt: longer than the question alone.
      const alone = await client.chat.completions.create({
        model: 'tiny-qwen3', reasoning_effort: 'none', max_tokens: 1, messages: [{ role: 'user', content: 'weather in Oslo?' }],
      });
      expect(answer.usage!.prompt_tokens).toBeGreaterThan(alone.usage!.prompt_tokens + 10);
      return;
    }
    throw new Error('no forced call finished within the token limit');
  });

  it('Responses: function_call items, then function_call_output back in, then an answer', { timeout: 120_000 }, async () => {
    // Random weights: a call may run past the token limit (status incomplete); the first that ends counts.
    let first: OpenAI.Responses.Response | undefined;
    for (let attempt = 0; attempt < 8 && first?.status !== 'completed'; attempt++) {
      first = await client.responses.create({
        model: 'tiny-qwen3', input: 'weather in Oslo?', tools: [responsesTool], tool_choice: 'required', reasoning: { effort: 'none' },
        max_output_tokens: 160, parallel_tool_calls: false,
      });
    }
    expect(first!.status).toBe('completed');
    const calls = first!.output.filter((o) => o.type === 'function_call');
    expect(calls.length).toBeGreaterThanOrEqual(1);
    for (const call of calls) expect(ajv.validate(WEATHER, JSON.parse(call.arguments)), call.arguments).toBe(true);
    const second = await client.responses.create({
      model: 'tiny-qwen3', reasoning: { effort: 'none' }, max_output_tokens: 8, tools: [responsesTool], tool_choice: 'none',
      input: [{ role: 'user', content: 'weather in Oslo?' }, ...calls, ...calls.map((c) => ({ type: 'function_call_output' as const, call_id: c.call_id, output: '{"temp": 3}' }))],
    });
    expect(second.output.some((o) => o.type === 'message')).toBe(true);
    const alone = await client.responses.create({ model: 'tiny-qwen3', reasoning: { effort: 'none' }, max_output_tokens: 1, input: 'weather in Oslo?' });
    expect(second.usage!.input_tokens).toBeGreaterThan(alone.usage!.input_tokens + 10);
    expect(first!.usage!.output_tokens).toBeGreaterThan(0);
  });

  it('store=false seals the reasoning; replayed in a tool loop it reaches the model; a changed or foreign blob is a 400', { timeout: 120_000 }, async () => {
    const stored = await client.responses.create({ model: 'tiny-qwen3', input: 'hi', max_output_tokens: 8, reasoning: { effort: 'low' } });
    expect(stored.output[0]).not.toHaveProperty('encrypted_content');
    let first: OpenAI.Responses.Response | undefined;
    for (let attempt = 0; attempt < 8 && first?.status !== 'completed'; attempt++) {
      first = await client.responses.create({
        model: 'tiny-qwen3', input: 'weather in Oslo?', store: false, tools: [responsesTool], tool_choice: 'required',
        parallel_tool_calls: false, reasoning: { effort: 'low' }, max_output_tokens: 720,
      });
    }
    expect(first!.status).toBe('completed');
    const reasoning = first!.output.find((o) => o.type === 'reasoning') as { encrypted_content?: string } | undefined;
    const calls = first!.output.filter((o) => o.type === 'function_call');
    expect(typeof reasoning?.encrypted_content).toBe('string');
    expect(calls.length, JSON.stringify(first!.output)).toBeGreaterThan(0);
    const results = calls.map((c) => ({ type: 'function_call_output' as const, call_id: c.call_id, output: '{"temp": 3}' }));
    const replay = (items: unknown[]) => client.responses.create({
      model: 'tiny-qwen3', store: false, reasoning: { effort: 'none' }, max_output_tokens: 1,
      input: [{ role: 'user', content: 'weather in Oslo?' }, ...items, ...calls, ...results] as OpenAI.Responses.ResponseInput,
    });
    const withReasoning = await replay([reasoning]);
    const without = await replay([]);
    expect(withReasoning.usage!.input_tokens).toBeGreaterThan(without.usage!.input_tokens);
    const blob = reasoning!.encrypted_content!;
    const changed = `${blob.slice(0, 20)}${blob[20] === 'A' ? 'B' : 'A'}${blob.slice(21)}`;
    const tampered = await replay([{ ...reasoning, encrypted_content: changed }]).catch((e: unknown) => e);
    expect(tampered).toBeInstanceOf(OpenAI.BadRequestError);
    expect((tampered as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('input[1].encrypted_content');
    const foreign = new OpenAI({ apiKey: await server.keyFor('other-org'), baseURL: server.baseUrl, maxRetries: 0 });
    const crossOrg = await foreign.responses.create({
      model: 'tiny-qwen3', max_output_tokens: 1, input: [{ role: 'user', content: 'x' }, reasoning as never],
    }).catch((e: unknown) => e);
    expect(crossOrg).toBeInstanceOf(OpenAI.BadRequestError);
  });

  it('a named function is the one called; tools for a model without them are a 400; the catalog says which models take tools', { timeout: 60_000 }, async () => {
    const other = { type: 'function' as const, function: { name: 'now', parameters: { type: 'object', properties: {}, additionalProperties: false } } };
    const r = await client.chat.completions.create({
      model: 'tiny-qwen3', messages: [{ role: 'user', content: 'x' }], tools: [chatTool, other], reasoning_effort: 'none',
      tool_choice: { type: 'function', function: { name: 'now' } }, max_tokens: 40,
    });
    if (r.choices[0]!.finish_reason !== 'length') {
      expect((r.choices[0]!.message.tool_calls ?? []).map((c) => (c as { function: { name: string } }).function.name)).toEqual(['now']);
    }
    const refused = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], tools: [chatTool] })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    expect((refused as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('tools_unsupported');
    const models = await client.models.list();
    const byId = new Map(models.data.map((m) => [m.id, m as unknown as { supports_tools: boolean }]));
    expect(byId.get('tiny-qwen3')!.supports_tools).toBe(true);
    expect(byId.get('tiny')!.supports_tools).toBe(false);
  });
});
