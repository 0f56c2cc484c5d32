// Multi-turn Responses with the official openai client: previous_response_id chains (the model sees
// every earlier turn's input and output), input_items listing and paging, delete, and other
// organizations' ids answered 404 everywhere.
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow } from '../helpers/batches.js';

let server: TestServer;
let client: OpenAI;
let other: OpenAI;

beforeAll(async () => {
  server = await startTestServer();
  client = new OpenAI({ apiKey: server.key, baseURL: server.baseUrl, maxRetries: 0 });
  other = new OpenAI({ apiKey: await server.keyFor('someone-else'), baseURL: server.baseUrl, maxRetries: 0 });
});
afterAll(async () => { if (server) await closeNow(server); });

const ask = (input: string, previous?: string) => client.responses.create({
  model: 'tiny', input, max_output_tokens: 4, temperature: 0, ...(previous !== undefined && { previous_response_id: previous }),
});

describe('previous_response_id', () => {
  it('a three-turn chain: each turn sees every earlier input and output', async () => {
    const alone = await ask('third question');
    const one = await ask('first question');
    const two = await ask('second question', one.id);
    const three = await ask('third question', two.id);
    expect(two.previous_response_id).toBe(one.id);
    expect(three.previous_response_id).toBe(two.id);
    // The second turn's prompt holds the first turn's input and output: more tokens than both
    // inputs alone; the third holds the second's whole prompt and its output.
    expect(two.usage!.input_tokens).toBeGreaterThan(one.usage!.input_tokens + one.usage!.output_tokens);
    expect(three.usage!.input_tokens).toBeGreaterThan(two.usage!.input_tokens + two.usage!.output_tokens);
    expect(three.usage!.input_tokens).toBeGreaterThan(alone.usage!.input_tokens + one.usage!.input_tokens);
    // Instructions are not carried to later turns (OpenAI's rule).
    const instructed = await client.responses.create({ model: 'tiny', input: 'x', instructions: 'a long instruction '.repeat(20), max_output_tokens: 2, temperature: 0 });
    const after = await ask('y', instructed.id);
    const plain = await ask('y', (await client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 2, temperature: 0 })).id);
    // (The greedy outputs may differ with and without instructions; the 20 repetitions would add ~60 tokens.)
    expect(Math.abs(after.usage!.input_tokens - plain.usage!.input_tokens)).toBeLessThan(6);
  });

  it('input_items lists what each request sent, newest first by default, in pages', async () => {
    const r = await client.responses.create({
      model: 'tiny', max_output_tokens: 2,
      input: [{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }, { role: 'user', content: 'c' }],
    });
    const page = await client.responses.inputItems.list(r.id, { limit: 2 });
    expect(page.data.map((i) => (i as { content: { text: string }[] }).content[0]!.text)).toEqual(['c', 'b']);
    expect(page.has_more).toBe(true);
    const rest = await client.responses.inputItems.list(r.id, { limit: 2, after: page.data[1]!.id });
    expect(rest.data.map((i) => (i as { content: { text: string }[] }).content[0]!.text)).toEqual(['a']);
    expect(rest.has_more).toBe(false);
    const asc = await client.responses.inputItems.list(r.id, { order: 'asc' });
    expect(asc.data.map((i) => (i as { role: string }).role)).toEqual(['user', 'assistant', 'user']);
  });

  it("another organization's response is a 404 to retrieve, list, delete and continue; deleting ends the chain", async () => {
    const mine = await ask('private');
    for (const attempt of [
      () => other.responses.retrieve(mine.id),
      () => other.responses.inputItems.list(mine.id),
      () => other.responses.delete(mine.id),
      () => other.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 2, previous_response_id: mine.id }),
    ]) {
      const err = await attempt().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    }
    await expect(client.responses.retrieve(mine.id)).resolves.toMatchObject({ id: mine.id });
    const deleted = await fetch(`${server.baseUrl}/responses/${mine.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${server.key}` } });
    expect(await deleted.json()).toEqual({ id: mine.id, object: 'response', deleted: true });
    expect(await client.responses.retrieve(mine.id).catch((e: unknown) => e)).toBeInstanceOf(OpenAI.NotFoundError);
    const continued = await ask('more', mine.id).catch((e: unknown) => e);
    expect(continued).toBeInstanceOf(OpenAI.NotFoundError);
    expect((continued as InstanceType<typeof OpenAI.NotFoundError>).param).toBe('previous_response_id');
  });
});
