// Structured outputs through HTTP with the official openai client, on every surface that takes a
// schema: Chat Completions response_format, Responses text.format (foreground and background), and
// batch lines of both. Refused schemas are 400s naming the field and are never billed; served ones
// validate (ajv, an independent validator); a value cut by the token limit is never reported as
// complete.
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { testCatalog } from '../helpers/api-catalog.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { closeNow, createBatch, readResults, waitForBatch, type RequestLine } from '../helpers/batches.js';
import { createApiKey } from '../../src/store/api-keys.js';

let server: TestServer;
let client: OpenAI;
let adminKey: string;

beforeAll(async () => {
  server = await startTestServer({ catalog: testCatalog });
  client = new OpenAI({ apiKey: server.key, baseURL: server.baseUrl, maxRetries: 0 });
  adminKey = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
});
afterAll(async () => { if (server) await closeNow(server); });

const ajv = new Ajv2020.default({ strict: false });
addFormats.default(ajv);

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer', minimum: 0, maximum: 99 }, role: { enum: ['a', 'b'] } },
  required: ['name', 'age', 'role'],
  additionalProperties: false,
};

/** Schemas refused before anything runs, with the JSON pointer (or words) the message must name. */
const REFUSED: [string, Record<string, unknown>, boolean, RegExp][] = [
  ['unsupported keyword', { type: 'object', properties: { a: { type: 'string', contentEncoding: 'base64' } } }, false, /contentEncoding.*\/properties\/a\/contentEncoding/],
  ['unknown format', { type: 'string', format: 'hostname' }, false, /hostname/],
  ['bad $ref', { $ref: '#/$defs/none' }, false, /\$ref/],
  ['strict open object', { type: 'object', properties: { a: { type: 'string' } }, required: ['a'] }, true, /additionalProperties/],
  ['maxLength over 1000', { type: 'object', properties: { a: { type: 'string', maxLength: 1001 } }, required: ['a'], additionalProperties: false }, true, /maxLength/],
  // Issue 27: schemas that crashed or misled the grammar engine, refused before it sees them.
  ['an empty class in a pattern', { type: 'string', pattern: '[]' }, false, /empty class.*\/pattern/],
  ['a quote in a property name', { type: 'object', properties: { 'a"b': { type: 'integer' } } }, false, /property name.*\/properties\/a"b/],
  ['no integer in range', { type: 'integer', exclusiveMinimum: 4, exclusiveMaximum: 5 }, false, /no integer satisfies/],
];

async function totalRequests(): Promise<number> {
  const res = await fetch(`${server.baseUrl}/admin/usage`, { headers: { authorization: `Bearer ${adminKey}` } });
  return ((await res.json()) as { total: { requests: number } }).total.requests;
}

describe('structured outputs over HTTP', () => {
  it('refuses unenforceable schemas with a 400 naming the field, on both surfaces, and bills nothing', async () => {
    const before = await totalRequests();
    for (const [what, schema, strict, message] of REFUSED) {
      const chat = await client.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: 'x' }], max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict } },
      }).catch((e: unknown) => e);
      expect(chat, what).toBeInstanceOf(OpenAI.BadRequestError);
      expect((chat as InstanceType<typeof OpenAI.BadRequestError>).param, what).toBe('response_format.json_schema.schema');
      expect((chat as Error).message, what).toMatch(message);
      for (const background of [false, true]) {
        const resp = await client.responses.create({
          model: 'tiny', input: 'x', max_output_tokens: 4, background,
          text: { format: { type: 'json_schema', name: 'x', schema, strict } },
        }).catch((e: unknown) => e);
        expect(resp, what).toBeInstanceOf(OpenAI.BadRequestError);
        expect((resp as InstanceType<typeof OpenAI.BadRequestError>).param, what).toBe('text.format.schema');
        expect((resp as Error).message, what).toMatch(message);
      }
    }
    expect(await totalRequests()).toBe(before);
  });

  it('serves schemas on Chat Completions and Responses: completed outputs validate, cut ones say so', { timeout: 120_000 }, async () => {
    let completed = 0;
    for (let seed = 0; seed < 6; seed++) {
      const chat = await client.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: `person ${seed}` }], max_tokens: 96, seed, temperature: 1,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
      });
      const choice = chat.choices[0]!;
      if (choice.finish_reason === 'stop') {
        completed++;
        expect(ajv.validate(PERSON, JSON.parse(choice.message.content!)), choice.message.content!).toBe(true);
      } else {
        expect(choice.finish_reason).toBe('length');
      }
      const resp = await client.responses.create({
        model: 'tiny', input: `person ${seed}`, max_output_tokens: 96, temperature: 1,
        text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } },
      });
      if (resp.status === 'completed') {
        completed++;
        expect(ajv.validate(PERSON, JSON.parse(resp.output_text)), resp.output_text).toBe(true);
      } else {
        expect(resp.status).toBe('incomplete');
      }
    }
    expect(completed).toBeGreaterThanOrEqual(4);

    const object = await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'an object' }], max_tokens: 64, seed: 9, response_format: { type: 'json_object' },
    });
    if (object.choices[0]!.finish_reason === 'stop') {
      const v = JSON.parse(object.choices[0]!.message.content!) as unknown;
      expect(typeof v === 'object' && v !== null && !Array.isArray(v)).toBe(true);
    }

    // Three tokens cannot hold the object: never reported as complete JSON.
    const cutChat = await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'cut' }], max_tokens: 3,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
    });
    expect(cutChat.choices[0]!.finish_reason).toBe('length');
    const cutResp = await client.responses.create({
      model: 'tiny', input: 'cut', max_output_tokens: 3, text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } },
    });
    expect(cutResp.status).toBe('incomplete');
    expect(cutResp.incomplete_details?.reason).toBe('max_output_tokens');
  });

  it('background responses enforce the schema', { timeout: 120_000 }, async () => {
    const started = await client.responses.create({
      model: 'tiny', input: 'background person', max_output_tokens: 64, background: true, temperature: 0,
      text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } },
    });
    let done = started;
    const deadline = Date.now() + 60_000;
    while (done.status === 'in_progress' || done.status === 'queued') {
      if (Date.now() > deadline) throw new Error('the background response did not end');
      await new Promise((r) => setTimeout(r, 50));
      done = await client.responses.retrieve(started.id);
    }
    expect(['completed', 'incomplete']).toContain(done.status);
    if (done.status === 'completed') expect(ajv.validate(PERSON, JSON.parse(done.output_text)), done.output_text).toBe(true);
  });

  it('batch lines of both surfaces: served schemas validate, a refused one is its own error line', { timeout: 120_000 }, async () => {
    const schemaLines: RequestLine[] = [0, 1, 2].map((i) => ({
      custom_id: `chat-${i}`, method: 'POST', url: '/v1/chat/completions',
      body: { model: 'tiny', messages: [{ role: 'user', content: `p${i}` }], max_tokens: 96, seed: i,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } } },
    }));
    schemaLines.push({
      custom_id: 'chat-bad', method: 'POST', url: '/v1/chat/completions',
      body: { model: 'tiny', messages: [{ role: 'user', content: 'bad' }], max_tokens: 8,
        response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: REFUSED[0]![1] } } },
    });
    const chatBatch = await createBatch(client, schemaLines, 'standard');
    const respLines: RequestLine[] = [0, 1, 2].map((i) => ({
      custom_id: `resp-${i}`, method: 'POST', url: '/v1/responses',
      body: { model: 'tiny', input: `p${i}`, max_output_tokens: 96, text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } } },
    }));
    respLines.push({
      custom_id: 'resp-bad', method: 'POST', url: '/v1/responses',
      body: { model: 'tiny', input: 'bad', max_output_tokens: 8, text: { format: { type: 'json_schema', name: 'bad', schema: REFUSED[0]![1] } } },
    });
    const respBatch = await createBatch(client, respLines, 'standard', '/v1/responses');
    let validated = 0;
    for (const id of [chatBatch.id, respBatch.id]) {
      const batch = await waitForBatch(client, id, undefined, 100_000);
      expect(batch.status).toBe('completed');
      const lines = [...await readResults(client, batch.output_file_id), ...await readResults(client, batch.error_file_id)];
      expect(lines).toHaveLength(4);
      for (const line of lines) {
        if (line.custom_id.endsWith('-bad')) {
          expect(line.response?.status_code).toBe(400);
          expect(JSON.stringify(line.response?.body)).toMatch(/contentEncoding/);
          continue;
        }
        expect(line.response?.status_code, JSON.stringify(line)).toBe(200);
        const body = line.response!.body;
        const text = line.custom_id.startsWith('chat')
          ? (body['choices'][0].finish_reason === 'stop' ? body['choices'][0].message.content as string : undefined)
          : (body['status'] === 'completed' ? body['output'][0].content[0].text as string : undefined);
        if (text === undefined) continue;
        validated++;
        expect(ajv.validate(PERSON, JSON.parse(text)), text).toBe(true);
      }
    }
    expect(validated).toBeGreaterThanOrEqual(2);
  });
});
