// LoRA adapters as catalog models (issue 36), black-box over HTTP with OpenAI's and Anthropic's
// official clients: an entry with `lora` is the base checkpoint with that adapter, a model of its
// own (its id in /v1/models, its rates, its grants: an organization without the grant gets 404 as
// for an unknown model, and its usage rows name it), served from the base model's engine (one
// engine, adapters and base batched together) and answering as the adapter does. Adapters loaded
// and unloaded on the running server through /v1/admin/adapters (admin keys only), under load.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

import { writeLoraAdapter } from '../../models/lora-checkpoint.js';
import { createApiKey } from '../../src/store/api-keys.js';
import { runAdapters } from '../../src/cli/adapters.js';
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
    // Residency in /metrics: both resident (no budget), loaded once each.
    const ops = (await createApiKey(server.service.store, 'ops-metrics', { admin: true })).key;
    const metrics = await (await fetch(`${server.origin}/metrics`, { headers: { authorization: `Bearer ${ops}` } })).text();
    expect(metrics).toContain('sluice_lora_adapters{model="tiny",state="resident"} 2\n');
    expect(metrics).toContain('sluice_lora_adapters{model="tiny",state="retired"} 0\n');
    expect(metrics).toContain('sluice_lora_loads_total{model="tiny"} 2\n');
    expect(metrics).toContain('sluice_lora_evictions_total{model="tiny"} 0\n');
    expect(metrics).toMatch(/sluice_lora_resident_bytes\{model="tiny"\} [1-9]\d*\n/);
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

describe('LoRA adapters through /v1/admin/adapters', () => {
  const admin = async (method: string, path: string, key: string, body?: unknown) => {
    const res = await fetch(`${server.baseUrl}/admin/adapters${path}`, {
      method, headers: { authorization: `Bearer ${key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
      ...(body !== undefined && { body: JSON.stringify(body) }),
    });
    return { status: res.status, json: await res.json() as any };
  };

  it('loads, lists and unloads adapters on the running server, losing no request, for admin keys only', async () => {
    const opsAdmin = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
    const dir = join(server.modelDir, '..', 'lora-hot');
    await writeLoraAdapter(server.modelDir, dir, { rank: 8, seed: 11 });

    // Other keys: 403, for every verb.
    expect((await admin('GET', '', server.key)).status).toBe(403);
    expect((await admin('POST', '', server.key, { id: 'x', base: 'tiny', dir })).status).toBe(403);
    expect((await admin('DELETE', '/tiny-support', server.key)).status).toBe(403);

    // Loaded while base requests run.
    const baseRuns = Promise.all([ask(client, 'tiny'), ask(client, 'tiny')]);
    const created = await admin('POST', '', opsAdmin, { id: 'tiny-hot', base: 'tiny', dir, pricing: ADAPTER_RATE });
    expect(created.status).toBe(201);
    expect(created.json).toMatchObject({ id: 'tiny-hot', object: 'adapter', base: 'tiny', rank: 8 });
    await baseRuns;
    expect((await client.models.list()).data.map((m) => m.id)).toContain('tiny-hot');
    const listed = await admin('GET', '', opsAdmin);
    expect(listed.json.data.map((a: { id: string }) => a.id)).toEqual(['tiny-support', 'tiny-acme-tuned', 'tiny-hot']);
    const hot = await ask(client, 'tiny-hot');
    expect(hot.model).toBe('tiny-hot');

    // Unloaded while its requests run: they finish; later ones are 404.
    const running = [ask(client, 'tiny-hot'), ask(client, 'tiny-hot'), ask(client, 'tiny-hot')];
    const engine = server.service.registry.models[0]!.engine;
    await vi.waitFor(() => expect(engine.adapters().find((a) => a.name === 'tiny-hot')?.requests).toBe(3), { interval: 1 });
    const deleted = admin('DELETE', '/tiny-hot', opsAdmin);
    const done = await Promise.all(running);
    done.forEach((c) => expect(c.choices[0]!.message.content).toBe(hot.choices[0]!.message.content));
    expect((await deleted).json).toEqual({ id: 'tiny-hot', object: 'adapter', deleted: true });
    await expect(ask(client, 'tiny-hot')).rejects.toMatchObject({ status: 404 });
    expect((await client.models.list()).data.map((m) => m.id)).not.toContain('tiny-hot');

    // Bad requests: said as such.
    expect((await admin('POST', '', opsAdmin, { id: 'tiny', base: 'tiny', dir })).json.error.param).toBe('id');
    expect((await admin('POST', '', opsAdmin, { id: 'y', base: 'tiny-support', dir })).json.error.param).toBe('base');
    const missing = await admin('POST', '', opsAdmin, { id: 'z', base: 'tiny', dir: join(dir, 'absent') });
    expect(missing.status).toBe(400);
    expect(missing.json.error.param).toBe('dir');
    expect((await admin('POST', '', opsAdmin, { id: 'w', base: 'tiny' })).status).toBe(400);
    expect((await admin('DELETE', '/tiny', opsAdmin)).status).toBe(404);
  });
});

describe('sluice adapters (the CLI of /v1/admin/adapters)', () => {
  /** Runs the command, returning what it printed. */
  const cli = async (...args: string[]) => {
    let out = '';
    const write = vi.spyOn(process.stdout, 'write').mockImplementation((chunk) => { out += String(chunk); return true; });
    try {
      await runAdapters([...args, '--url', server.origin]);
    } finally {
      write.mockRestore();
    }
    return out;
  };

  it('lists, loads and unloads adapters on the running server with an admin key', async () => {
    const key = (await createApiKey(server.service.store, 'ops-cli', { admin: true })).key;
    const dir = join(server.modelDir, '..', 'lora-cli');
    await writeLoraAdapter(server.modelDir, dir, { rank: 4, seed: 12 });
    expect(await cli('load', '--api-key', key, '--id', 'tiny-cli', '--base', 'tiny', '--dir', dir, '--restricted', '--grant', 'acme',
      '--pricing', JSON.stringify(ADAPTER_RATE))).toMatch(/^loaded tiny-cli on tiny: rank 4, \d+ bytes\n$/);
    // Restricted to acme, at its rates.
    await expect(ask(client, 'tiny-cli')).rejects.toMatchObject({ status: 404 });
    expect((await ask(acme, 'tiny-cli')).model).toBe('tiny-cli');
    const listed = await cli('list', '--api-key', key);
    expect(listed.split('\n')[0]).toBe('id\tbase\trank\tbytes\tresident\trequests');
    expect(listed).toMatch(/\ntiny-cli\ttiny\t4\t\d+\ttrue\t0\n/);
    const json = JSON.parse(await cli('list', '--api-key', key, '--json'));
    expect(json.data.map((a: { id: string }) => a.id)).toContain('tiny-cli');
    expect(await cli('unload', 'tiny-cli', '--api-key', key)).toBe('unloaded tiny-cli\n');
    await expect(ask(acme, 'tiny-cli')).rejects.toMatchObject({ status: 404 });

    // The server's refusals, and the command's own.
    await expect(cli('list', '--api-key', server.key)).rejects.toThrow(/403: adapters are managed with an admin API key/);
    await expect(cli('unload', 'nope', '--api-key', key)).rejects.toThrow(/404 \(id\)/);
    await expect(cli('load', '--api-key', key, '--id', 'x', '--base', 'tiny', '--dir', join(dir, 'absent'))).rejects.toThrow(/400 \(dir\)/);
    await expect(cli('load', '--api-key', key, '--id', 'x', '--base', 'tiny')).rejects.toThrow(/load needs --dir/);
    await expect(cli('load', '--api-key', key, '--id', 'x', '--base', 'tiny', '--dir', dir, '--pricing', '[{"tier":"soon"}]'))
      .rejects.toMatchObject({ param: 'pricing' });
    await expect(cli('list', '--api-key', key, '--id', 'x')).rejects.toThrow(/--id goes with load/);
    await expect(cli('unload', '--api-key', key)).rejects.toThrow(/unload takes the adapter id/);
    await expect(cli('drop', '--api-key', key)).rejects.toThrow(/list, load or unload/);
    const saved = process.env['SLUICE_API_KEY'];
    delete process.env['SLUICE_API_KEY'];
    try {
      await expect(cli('list')).rejects.toThrow(/admin API key is needed/);
    } finally {
      if (saved !== undefined) process.env['SLUICE_API_KEY'] = saved;
    }
    await expect(runAdapters(['list', '--api-key', key, '--url', 'http://127.0.0.1:1'])).rejects.toThrow(/cannot reach/);
  });
});
