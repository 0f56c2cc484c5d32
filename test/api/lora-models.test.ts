// LoRA adapters as catalog models (issue 36), black-box over HTTP with OpenAI's and Anthropic's
// official clients: an entry with `lora` is the base checkpoint with that adapter, a model of its
// own (its id in /v1/models, its rates, its grants: an organization without the grant gets 404 as
// for an unknown model, and its usage rows name it), served from the base model's engine (one
// engine, adapters and base batched together) and answering as the adapter does.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { writeLoraAdapter } from '../../models/lora-checkpoint.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

let server: TestServer;
let client: OpenAI;
let acme: OpenAI;
const ADAPTER_RATE = [{ tier: 'asap' as const, input_per_1m_tokens: 5, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 7 }];

beforeAll(async () => {
  server = await startTestServer({
    beforeOpen: async (dir) => {
      await writeLoraAdapter(dir, join(dir, '..', 'lora-open'), { rank: 8, seed: 4 });
      await writeLoraAdapter(dir, join(dir, '..', 'lora-acme'), { rank: 4, seed: 5 });
    },
    catalog: (dir) => ({
      models: [
        { id: 'tiny', checkpoint: dir },
        { id: 'tiny-support', checkpoint: dir, lora: join(dir, '..', 'lora-open'), pricing: ADAPTER_RATE },
        { id: 'tiny-acme-tuned', checkpoint: dir, lora: join(dir, '..', 'lora-acme'), restricted: true, granted_organizations: ['acme'] },
      ],
    }),
  });
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
  acme = new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('acme'), maxRetries: 0 });
}, 120_000);
afterAll(async () => { await server?.close(); });

const ask = (c: OpenAI, model: string) =>
  c.chat.completions.create({ model, messages: [{ role: 'user', content: 'Tell me a story' }], temperature: 0, max_completion_tokens: 12 });

describe('LoRA adapters as catalog models', () => {
  it('lists each adapter as a model with its rates, restricted ones to granted organizations only', async () => {
    const ids = (await client.models.list()).data.map((m) => m.id);
    expect(ids).toEqual(['tiny', 'tiny-support']);
    const acmeIds = (await acme.models.list()).data.map((m) => m.id);
    expect(acmeIds).toEqual(['tiny', 'tiny-support', 'tiny-acme-tuned']);
    const support = (await client.models.retrieve('tiny-support')) as unknown as { pricing: unknown };
    expect(support.pricing).toEqual(ADAPTER_RATE);
    // One engine serves all three entries.
    const engines = new Set(server.service.registry.models.map((m) => m.engine));
    expect(engines.size).toBe(1);
    expect([...engines][0]!.info.loraAdapters!.map((a) => a.name)).toEqual(['tiny-support', 'tiny-acme-tuned']);
  });

  it('answers as the adapter, batched beside the base model, and writes usage rows naming it', async () => {
    const [base, tuned, again] = await Promise.all([ask(client, 'tiny'), ask(client, 'tiny-support'), ask(client, 'tiny-support')]);
    expect(tuned.model).toBe('tiny-support');
    expect(tuned.choices[0]!.message.content).not.toBe(base.choices[0]!.message.content);
    expect(again.choices[0]!.message.content).toBe(tuned.choices[0]!.message.content);
    // The same as the engine with the adapter gives directly.
    const direct = await server.service.registry.models[0]!.engine.generate({
      messages: [{ role: 'user', content: 'Tell me a story' }], temperature: 0, maxTokens: 12, adapter: 'tiny-support' });
    expect(tuned.choices[0]!.message.content).toBe(direct.text);
    const rows = (await server.service.store.listUsage({})).filter((r) => r.requestId === tuned.id);
    expect(rows).toHaveLength(1);
    expect(rows[0]!.model).toBe('tiny-support');
    expect(rows[0]!.tier).toBe('asap');
    // Its own rates: 5 per million input tokens, 7 per million output tokens.
    expect(Number(rows[0]!.outputCost)).toBeCloseTo(rows[0]!.outputTokens * 7e-6, 12);
  });

  it('answers a restricted adapter to its organization and 404 to others, on every surface', async () => {
    const c = await ask(acme, 'tiny-acme-tuned');
    expect(c.model).toBe('tiny-acme-tuned');
    await expect(ask(client, 'tiny-acme-tuned')).rejects.toMatchObject({ status: 404 });
    const anthropic = new Anthropic({ baseURL: server.origin, apiKey: server.key, maxRetries: 0 });
    await expect(anthropic.messages.create({ model: 'tiny-acme-tuned', max_tokens: 4, messages: [{ role: 'user', content: 'Hi' }] }))
      .rejects.toMatchObject({ status: 404 });
    const acmeAnthropic = new Anthropic({ baseURL: server.origin, apiKey: await server.keyFor('acme'), maxRetries: 0 });
    const m = await acmeAnthropic.messages.create({ model: 'tiny-acme-tuned', max_tokens: 4, messages: [{ role: 'user', content: 'Hi' }] });
    expect(m.model).toBe('tiny-acme-tuned');
  });
});
