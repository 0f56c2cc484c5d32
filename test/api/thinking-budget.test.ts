// Thinking spends the output budget (OpenAI's semantics), and the reply says so. On tiny-qwen3 (a
// random-weight Qwen3-shaped model whose template thinks) the default effort allows 2,048
// thinking tokens, so a small limit ends the output inside the think block:
//   - Responses: status incomplete, incomplete_details.reason max_output_tokens, and the reasoning
//     item alone (incomplete): no message item whose empty text would pass for the answer; the
//     same object from GET /v1/responses/{id};
//   - Chat Completions: finish_reason length, empty content beside reasoning_content, and every
//     completion token a reasoning token.
// An output cut after the think block closed keeps its message item.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../../models/make-model.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let root: string;
let server: TestServer;
let client: OpenAI;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-thinking-'));
  await makeModel({ preset: 'tiny-qwen3', out: join(root, 'tiny-qwen3'), seed: 4 });
  server = await startTestServer({ catalog: () => ({ models: [{ id: 'tiny-qwen3', checkpoint: join(root, 'tiny-qwen3') }] }) });
  client = new OpenAI({ apiKey: server.key, baseURL: server.baseUrl, maxRetries: 0 });
});
afterAll(async () => {
  await server?.close();
  rmSync(root, { recursive: true, force: true });
});

describe('a token limit reached while the model thinks', () => {
  it('Responses: incomplete, reason max_output_tokens, the reasoning item alone (also when read back)', { timeout: 120_000 }, async () => {
    // No effort given: the default, medium (2,048 thinking tokens), far above the limit.
    const r = await client.responses.create({ model: 'tiny-qwen3', input: 'What is 2 + 2?', max_output_tokens: 12, temperature: 0 });
    expect(r.status).toBe('incomplete');
    expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' });
    expect(r.output.map((o) => o.type)).toEqual(['reasoning']);
    const reasoning = r.output[0] as OpenAI.Responses.ResponseReasoningItem;
    expect(reasoning.status).toBe('incomplete');
    expect(reasoning.content![0]!.text.length).toBeGreaterThan(0);
    expect(r.output_text).toBe('');
    expect(r.usage!.output_tokens).toBe(12);
    expect(r.usage!.output_tokens_details.reasoning_tokens).toBe(12);
    const stored = await client.responses.retrieve(r.id);
    expect(stored.status).toBe('incomplete');
    expect(stored.output).toEqual(r.output);
  });

  it('Responses: an output cut after the think block closed keeps its message item', { timeout: 120_000 }, async () => {
    // effort low: at most 512 thinking tokens, then the block closes and the answer begins.
    const r = await client.responses.create({
      model: 'tiny-qwen3', input: 'What is 2 + 2?', max_output_tokens: 600, reasoning: { effort: 'low' }, temperature: 0,
    });
    expect(r.output.map((o) => o.type)).toEqual(['reasoning', 'message']);
    expect(r.usage!.output_tokens_details.reasoning_tokens).toBeLessThanOrEqual(514);
    expect(r.usage!.output_tokens_details.reasoning_tokens).toBeLessThan(r.usage!.output_tokens);
    if (r.status === 'incomplete') expect((r.output[1] as OpenAI.Responses.ResponseOutputMessage).status).toBe('incomplete');
    // Thinking off: cut in the answer, the message item is there too.
    const off = await client.responses.create({
      model: 'tiny-qwen3', input: 'What is 2 + 2?', max_output_tokens: 3, reasoning: { effort: 'none' }, temperature: 0,
    });
    expect(off.status).toBe('incomplete');
    expect(off.output.map((o) => o.type)).toEqual(['message']);
    expect(off.output_text.length).toBeGreaterThan(0);
  });

  it('Chat Completions: finish_reason length, empty content, every completion token a reasoning token', { timeout: 120_000 }, async () => {
    const r = await client.chat.completions.create({
      model: 'tiny-qwen3', messages: [{ role: 'user', content: 'What is 2 + 2?' }], max_completion_tokens: 12, temperature: 0,
    });
    const choice = r.choices[0]!;
    expect(choice.finish_reason).toBe('length');
    expect(choice.message.content).toBe('');
    expect((choice.message as { reasoning_content?: string }).reasoning_content!.length).toBeGreaterThan(0);
    expect(r.usage!.completion_tokens).toBe(12);
    expect(r.usage!.completion_tokens_details!.reasoning_tokens).toBe(12);
  });
});
