// gpt-oss end to end over HTTP with the official openai client: test-gpt-oss (random weights in
// gpt-oss's layout, MXFP4 experts, the harmony template and tokens) serves Chat Completions and
// Responses, effort and tools reach its template, and what harmony cannot force yet is refused in
// the spec's envelope.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../../models/make-model.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow } from '../helpers/batches.js';

let root: string;
let server: TestServer;
let client: OpenAI;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-gpt-oss-'));
  await makeModel({ preset: 'test-gpt-oss', out: join(root, 'test-gpt-oss'), seed: 4 });
  server = await startTestServer({
    catalog: (tiny) => ({ models: [{ id: 'tiny', checkpoint: tiny }, { id: 'gpt-oss', checkpoint: join(root, 'test-gpt-oss') }] }),
  });
  client = new OpenAI({ apiKey: server.key, baseURL: server.baseUrl, maxRetries: 0 });
});
afterAll(async () => {
  if (server) await closeNow(server);
  rmSync(root, { recursive: true, force: true });
});

const TOOLS = [{ type: 'function' as const, function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];

describe('gpt-oss (harmony) over HTTP', () => {
  it('answers a chat completion with tools at each effort, the prompt growing with the developer message', async () => {
    const usage: number[] = [];
    for (const effort of ['low', 'high'] as const) {
      const res = await client.chat.completions.create({
        model: 'gpt-oss', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Oslo?' }],
        tools: TOOLS, reasoning_effort: effort, max_completion_tokens: 12, temperature: 0,
      });
      expect(res.choices[0]!.message.role).toBe('assistant');
      expect(['stop', 'length', 'tool_calls']).toContain(res.choices[0]!.finish_reason);
      usage.push(res.usage!.prompt_tokens);
    }
    const plain = await client.chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_completion_tokens: 4 });
    // The tools and instructions go in a developer message: the prompt is longer with them.
    expect(usage[0]).toBeGreaterThan(plain.usage!.prompt_tokens);
  });

  it('serves Responses with a reasoning effort', async () => {
    const res = await client.responses.create({ model: 'gpt-oss', input: 'Hello', reasoning: { effort: 'low' }, max_output_tokens: 12 });
    expect(['completed', 'incomplete']).toContain(res.status);
    expect(res.usage!.input_tokens).toBeGreaterThan(0);
  });

  it('refuses a forced tool call in the error envelope, naming tool_choice', async () => {
    const err = await client.chat.completions.create({
      model: 'gpt-oss', messages: [{ role: 'user', content: 'Weather?' }], tools: TOOLS, tool_choice: 'required', max_completion_tokens: 8,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('tool_choice');
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('tools_unsupported');
  });
});
