// The Files API end to end: a real server, the official openai client for the happy paths and raw
// fetch / node:http for the refusals. After every refusal the files directory and the listing must
// be exactly as before: a failed upload leaves no bytes and no row.

import { request as httpRequest } from 'node:http';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileUploadLimits } from '../../src/api/routes/files.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { uploadWithRawFilename } from '../helpers/raw-upload.js';

let server: TestServer;
let client: OpenAI;

const line = (id: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/chat/completions', body: { model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }, ...extra });
const jsonl = (...lines: string[]) => `${lines.join('\n')}\n`;

const filesDir = () => join(server.dataDir, 'files');
const onDisk = async () => (await readdir(filesDir())).sort();
const listedIds = async (key = server.key) => {
  const res = await fetch(`${server.baseUrl}/files`, { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  return ((await res.json()) as { data: { id: string }[] }).data.map((f) => f.id);
};

/** Uploads a raw form with fetch; parts go in the given order. */
async function postForm(parts: [string, string | Blob, string?][], key = server.key): Promise<Response> {
  const form = new FormData();
  for (const [name, value, filename] of parts) {
    if (typeof value === 'string' && filename === undefined) form.append(name, value);
    else form.append(name, typeof value === 'string' ? new Blob([value]) : value, filename ?? 'x.jsonl');
  }
  return fetch(`${server.baseUrl}/files`, { method: 'POST', headers: { authorization: `Bearer ${key}` }, body: form });
}

async function expectError(res: Response, status: number, fields: { type?: string; code?: string | null; param?: string | null; message?: RegExp }) {
  expect(res.status).toBe(status);
  const body = (await res.json()) as { error: Record<string, unknown> };
  expect(Object.keys(body)).toEqual(['error']);
  if (fields.type) expect(body.error['type']).toBe(fields.type);
  if (fields.code !== undefined) expect(body.error['code']).toBe(fields.code);
  if (fields.param !== undefined) expect(body.error['param']).toBe(fields.param);
  if (fields.message) expect(body.error['message']).toMatch(fields.message);
}

/** Polls until `check` holds (the server finishes cleaning after the client has gone). */
async function eventually(check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeAll(async () => {
  server = await startTestServer();
  client = new OpenAI({ baseURL: server.baseUrl, apiKey: server.key, maxRetries: 0 });
});
afterAll(async () => server?.close());

describe('files with the openai client', () => {
  it('uploads, lists, retrieves, downloads and deletes a batch file', async () => {
    const text = jsonl(line('a'), line('b', { url: '/v1/responses' }), line('c', { url: '/v1/messages' }));
    const before = Math.floor(Date.now() / 1000);
    const created = await client.files.create({ file: await toFile(Buffer.from(text), 'requests.jsonl'), purpose: 'batch' });
    expect(created).toEqual({
      id: expect.stringMatching(/^file-[0-9a-f]{24}$/), object: 'file', bytes: Buffer.byteLength(text),
      created_at: expect.any(Number), filename: 'requests.jsonl', purpose: 'batch', status: 'uploaded', status_details: null,
    });
    expect(created.created_at).toBeGreaterThanOrEqual(before);
    expect(await onDisk()).toContain(created.id);

    expect(await client.files.retrieve(created.id)).toEqual(created);
    const page = await client.files.list();
    expect(page.data[0]).toEqual(created);

    const content = await client.files.content(created.id);
    expect(content.headers.get('content-length')).toBe(String(Buffer.byteLength(text)));
    expect(await content.text()).toBe(text);

    expect(await client.files.delete(created.id)).toEqual({ id: created.id, object: 'file', deleted: true });
    expect(await onDisk()).not.toContain(created.id);
    await expect(client.files.retrieve(created.id)).rejects.toMatchObject({ status: 404 });
    await expect(client.files.delete(created.id)).rejects.toMatchObject({ status: 404 });
  });

  it('streams an upload from a Node stream and stores other purposes unchecked', async () => {
    async function* chunks() {
      for (let i = 0; i < 64; i += 1) yield Buffer.alloc(16 * 1024, i);
    }
    const created = await client.files.create({ file: await toFile(chunks(), 'blob.bin'), purpose: 'user_data' });
    expect(created).toMatchObject({ bytes: 64 * 16 * 1024, purpose: 'user_data', filename: 'blob.bin' });
    const bytes = Buffer.from(await (await client.files.content(created.id)).arrayBuffer());
    expect(bytes.length).toBe(64 * 16 * 1024);
    expect(bytes[16 * 1024 * 63]).toBe(63);
    await client.files.delete(created.id);
  });

  it('lists newest first with limit, has_more, after and purpose', async () => {
    const ids: string[] = [];
    for (const [i, purpose] of (['batch', 'assistants', 'batch'] as const).entries()) {
      ids.push((await client.files.create({ file: await toFile(Buffer.from(jsonl(line(`r${i}`))), `f${i}.jsonl`), purpose })).id);
    }
    const newest = [...ids].reverse();
    const first = await client.files.list({ limit: 2 });
    expect(first.data.map((f) => f.id)).toEqual(newest.slice(0, 2));
    expect(first.has_more).toBe(true);
    const raw = await (await fetch(`${server.baseUrl}/files?limit=2`, { headers: { authorization: `Bearer ${server.key}` } })).json();
    expect(raw).toMatchObject({ object: 'list', has_more: true, first_id: newest[0], last_id: newest[1] });

    const second = await client.files.list({ limit: 2, after: newest[1]! });
    expect(second.data.map((f) => f.id)).toEqual([newest[2]]);
    expect(second.has_more).toBe(false);

    const all: string[] = [];
    for await (const f of client.files.list({ limit: 1 })) all.push(f.id);
    expect(all).toEqual(newest);

    expect((await client.files.list({ purpose: 'batch' })).data.map((f) => f.id)).toEqual([ids[2], ids[0]]);
    for (const id of ids) await client.files.delete(id);
    const empty = await (await fetch(`${server.baseUrl}/files`, { headers: { authorization: `Bearer ${server.key}` } })).json();
    expect(empty).toEqual({ object: 'list', data: [], has_more: false, first_id: null, last_id: null });
  });

  it('refuses bad list parameters', async () => {
    const get = (q: string) => fetch(`${server.baseUrl}/files?${q}`, { headers: { authorization: `Bearer ${server.key}` } });
    await expectError(await get('limit=0'), 400, { param: 'limit' });
    await expectError(await get('limit=10001'), 400, { param: 'limit' });
    await expectError(await get('after=file-0123456789abcdef01234567'), 400, { param: 'after' });
  });
});

describe('organizations and keys', () => {
  it("keeps another organization's files out of sight", async () => {
    const created = await client.files.create({ file: await toFile(Buffer.from(jsonl(line('a'))), 'mine.jsonl'), purpose: 'batch' });
    const other = new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('other'), maxRetries: 0 });
    for (const call of [() => other.files.retrieve(created.id), () => other.files.content(created.id), () => other.files.delete(created.id)]) {
      await expect(call()).rejects.toMatchObject({ status: 404, error: { type: 'not_found_error', param: 'file_id' } });
    }
    expect((await other.files.list()).data).toEqual([]);
    expect(await client.files.retrieve(created.id)).toEqual(created);
    await client.files.delete(created.id);
  });

  it('answers 401 in the envelope without a key', async () => {
    await expectError(await fetch(`${server.baseUrl}/files`), 401, { type: 'authentication_error', code: 'missing_api_key' });
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([jsonl(line('a'))]), 'x.jsonl');
    await expectError(await fetch(`${server.baseUrl}/files`, { method: 'POST', body: form }), 401, { type: 'authentication_error' });
    expect(await onDisk()).toEqual([]);
  });

  it('answers 404 for an unknown id', async () => {
    await expect(client.files.retrieve('file-0123456789abcdef01234567')).rejects.toMatchObject({ status: 404 });
    await expect(client.files.content('../sluice.db')).rejects.toMatchObject({ status: 404 });
  });
});

describe('refused uploads leave nothing behind', () => {
  const ok = jsonl(line('a'), line('b'));
  const bigLine = () => `${line('a')}\n${line('big', { body: { pad: 'x'.repeat(28 * 1024 * 1024) } })}\n${line('z')}\n`;

  it.each<[string, [string, string | Blob, string?][], number, { code?: string | null; param?: string | null; message?: RegExp; type?: string }]>([
    ['no file', [['purpose', 'batch']], 400, { param: 'file', message: /^file is required$/ }],
    ['no purpose', [['file', ok, 'x.jsonl']], 400, { param: 'purpose', message: /^purpose is required$/ }],
    ['unknown purpose (after file)', [['file', ok, 'x.jsonl'], ['purpose', 'training']], 400,
      { param: 'purpose', message: /^purpose must be one of "batch", "assistants", "fine-tune", "vision", "user_data", "evals" \(got "training"\)$/ }],
    ['unknown purpose (before file)', [['purpose', 'training'], ['file', ok, 'x.jsonl']], 400, { param: 'purpose' }],
    ['file sent as a plain field', [['purpose', 'batch'], ['file', ok]], 400, { param: 'file' }],
    ['two files', [['purpose', 'batch'], ['file', ok, 'a.jsonl'], ['file', ok, 'b.jsonl']], 400, { param: 'file', message: /only one file/ }],
    ['an unknown field', [['purpose', 'batch'], ['file', ok, 'x.jsonl'], ['expires_after', '1']], 400, { param: 'expires_after' }],
    ['a line that is not JSON', [['file', `${line('a')}\nnope\n`, 'x.jsonl'], ['purpose', 'batch']], 400, { message: /^invalid batch file: line 2: not valid JSON/ }],
    ['a line that is not an object', [['purpose', 'batch'], ['file', '"hello"\n', 'x.jsonl']], 400, { message: /line 1: must be a JSON object/ }],
    ['a missing custom_id', [['file', `${JSON.stringify({ method: 'POST', url: '/v1/responses', body: {} })}\n`, 'x.jsonl'], ['purpose', 'batch']], 400,
      { message: /line 1: custom_id must be a non-empty string/ }],
    ['a duplicate custom_id', [['file', jsonl(line('a'), line('b'), line('a')), 'x.jsonl'], ['purpose', 'batch']], 400,
      { message: /^invalid batch file: line 3: custom_id "a" is used on line 1 too$/ }],
    ['method GET', [['file', jsonl(line('a', { method: 'GET' })), 'x.jsonl'], ['purpose', 'batch']], 400, { message: /line 1: method must be "POST"/ }],
    ['an unsupported url', [['file', jsonl(line('a', { url: '/v1/embeddings' })), 'x.jsonl'], ['purpose', 'batch']], 400, { message: /line 1: url must be one of/ }],
    ['a body that is not an object', [['file', jsonl(line('a', { body: null })), 'x.jsonl'], ['purpose', 'batch']], 400, { message: /line 1: body must be a JSON object/ }],
    ['an empty file', [['file', '', 'x.jsonl'], ['purpose', 'batch']], 400, { message: /no requests/ }],
    ['blank lines only', [['purpose', 'batch'], ['file', '\n\n', 'x.jsonl']], 400, { message: /no requests/ }],
  ])('%s', async (_name, parts, status, expected) => {
    const before = await listedIds();
    const isBatchProblem = expected.message?.source.includes('line') || expected.message?.source.includes('requests');
    await expectError(await postForm(parts), status, {
      type: 'invalid_request_error', param: isBatchProblem ? 'file' : expected.param, code: isBatchProblem ? 'invalid_batch_file' : 'invalid_request', ...expected,
    });
    expect(await onDisk()).toEqual([]);
    expect(await listedIds()).toEqual(before);
  });

  it('refuses a line over 28 MiB, with purpose before or after the file', async () => {
    const text = bigLine();
    for (const order of ['purpose first', 'file first']) {
      const parts: [string, string, string?][] = [['file', text, 'big.jsonl']];
      if (order === 'purpose first') parts.unshift(['purpose', 'batch']);
      else parts.push(['purpose', 'batch']);
      await expectError(await postForm(parts), 400, { code: 'invalid_batch_file', param: 'file', message: /line 2: the line is longer than 29360128 bytes/ });
      expect(await onDisk()).toEqual([]);
    }
    // The same bytes are fine as an opaque file.
    const stored = await postForm([['purpose', 'user_data'], ['file', text, 'big.jsonl']]);
    expect(stored.status).toBe(200);
    await client.files.delete(((await stored.json()) as { id: string }).id);
  });

  it('refuses a file over the size limit with 413', async () => {
    const saved = fileUploadLimits.maxFileBytes;
    fileUploadLimits.maxFileBytes = 64 * 1024;
    try {
      const before = await listedIds();
      const big = jsonl(...Array.from({ length: 2000 }, (_, i) => line(`r${i}`)));
      await expectError(await postForm([['purpose', 'batch'], ['file', big, 'big.jsonl']]), 413,
        { type: 'request_too_large', code: 'file_too_large', param: 'file', message: /larger than the limit of 65536 bytes/ });
      await expect(client.files.create({ file: await toFile(Buffer.from(big), 'big.jsonl'), purpose: 'batch' }))
        .rejects.toMatchObject({ status: 413, error: { code: 'file_too_large' } });
      // Far over the limit by its Content-Length: refused before any byte is written.
      await expectError(await postForm([['purpose', 'user_data'], ['file', new Blob([Buffer.alloc(3 << 20)]), 'huge.bin']]), 413,
        { type: 'request_too_large', code: 'file_too_large' });
      expect(await onDisk()).toEqual([]);
      expect(await listedIds()).toEqual(before);
      // Exactly the limit is fine.
      const exact = Buffer.alloc(64 * 1024, 0x61);
      const res = await postForm([['purpose', 'vision'], ['file', new Blob([exact]), 'a.bin']]);
      expect(res.status).toBe(200);
      await client.files.delete(((await res.json()) as { id: string }).id);
    } finally {
      fileUploadLimits.maxFileBytes = saved;
    }
  });

  it('removes the bytes when the store refuses the row', async () => {
    const store = server.service.store;
    const insertFile = store.insertFile;
    store.insertFile = async () => { throw new Error('disk full'); };
    try {
      await expectError(await postForm([['purpose', 'batch'], ['file', ok, 'x.jsonl']]), 500, { type: 'server_error' });
    } finally {
      store.insertFile = insertFile;
    }
    expect(await onDisk()).toEqual([]);
  });

  it('cleans up after a client that aborts mid-upload', async () => {
    const before = await listedIds();
    const boundary = 'sluice-test-boundary';
    const req = httpRequest(`${server.baseUrl}/files`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.key}`, 'content-type': `multipart/form-data; boundary=${boundary}`, 'content-length': String(10 << 20) },
    });
    req.on('error', () => {}); // the abort below
    req.write(`--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n`);
    req.write(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n`);
    req.write(jsonl(...Array.from({ length: 500 }, (_, i) => line(`r${i}`))));
    // The upload is under way once its temp file exists.
    await eventually(async () => (await onDisk()).length > 0);
    req.destroy();
    await eventually(async () => (await onDisk()).length === 0);
    expect(await listedIds()).toEqual(before);
  });

  it('keeps the connection usable after a refusal mid-file', async () => {
    // A bad first line with purpose first is refused before the rest is read; the client still gets the 400.
    const rest = 'x'.repeat(4 << 20);
    await expectError(await postForm([['purpose', 'batch'], ['file', `nope\n${rest}`, 'x.jsonl']]), 400, { code: 'invalid_batch_file' });
    expect(await listedIds()).toBeInstanceOf(Array);
    expect(await onDisk()).toEqual([]);
  });

  it('refuses a filename holding a NUL or another control character (400; the same on PostgreSQL)', async () => {
    const before = await listedIds();
    for (const filename of ['a\u0000b.jsonl', '\u0000', 'tab\there.txt', 'del\u007f.txt']) {
      const res = await uploadWithRawFilename(`${server.baseUrl}/files`, server.key, filename, '{"a":1}\n');
      expect(res.status).toBe(400);
      expect(Object.keys(res.body)).toEqual(['error']);
      expect(res.body.error).toMatchObject({ type: 'invalid_request_error', param: 'file', code: 'invalid_request' });
      expect(res.body.error.message).toMatch(/filename contains the control character U\+00(00|09|7F)/);
    }
    expect(await onDisk()).toEqual([]);
    expect(await listedIds()).toEqual(before);
    // Other characters are kept as given.
    const ok = await uploadWithRawFilename(`${server.baseUrl}/files`, server.key, 'ünï cødé ✓.txt', '{"a":1}\n');
    expect(ok.status).toBe(200);
    expect(ok.body.filename).toBe('ünï cødé ✓.txt');
    await client.files.delete(ok.body.id);
  });

  it('answers 415 for a body that is not multipart', async () => {
    const res = await fetch(`${server.baseUrl}/files`, {
      method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' }, body: '{"purpose":"batch"}',
    });
    await expectError(res, 415, { code: 'unsupported_media_type' });
  });
});

describe('concurrency and the OpenAPI document', () => {
  it('survives a delete while the content is being streamed', async () => {
    const size = 24 << 20;
    const res = await postForm([['purpose', 'vision'], ['file', new Blob([Buffer.alloc(size, 0x62)]), 'big.bin']]);
    const { id } = (await res.json()) as { id: string };
    const download = await fetch(`${server.baseUrl}/files/${id}/content`, { headers: { authorization: `Bearer ${server.key}` } });
    expect(download.status).toBe(200);
    expect(download.headers.get('content-type')).toBe('application/octet-stream');
    const reader = download.body!.getReader();
    let received = (await reader.read()).value!.length;
    expect((await client.files.delete(id)).deleted).toBe(true);
    await expect(client.files.retrieve(id)).rejects.toMatchObject({ status: 404 });
    for (let r = await reader.read(); !r.done; r = await reader.read()) received += r.value.length;
    expect(received).toBe(size);
    expect(await onDisk()).toEqual([]);
    expect((await client.files.list()).data.map((f) => f.id)).not.toContain(id);
  });

  it('lists the file operations with their schemas', async () => {
    const doc = (await (await fetch(`${server.baseUrl}/openapi.json`)).json()) as { paths: Record<string, Record<string, any>> };
    const path = (suffix: string) => doc.paths[Object.keys(doc.paths).find((p) => p.endsWith(suffix))!]!;
    const upload = path('/files')['post'];
    expect(Object.keys(upload.requestBody.content)).toEqual(['multipart/form-data']);
    expect(upload.requestBody.content['multipart/form-data'].schema.required).toEqual(['file', 'purpose']);
    expect(upload.responses['200'].content['application/json'].schema.properties.status_details).toBeDefined();
    expect(upload.responses['413']).toBeDefined();
    expect(path('/files')['get'].responses['200'].content['application/json'].schema.properties.has_more).toBeDefined();
    expect(path('/files/{file_id}')['delete'].responses['200']).toBeDefined();
    expect(path('/files/{file_id}/content')['get'].responses['200'].content['application/octet-stream']).toBeDefined();
  });
});
