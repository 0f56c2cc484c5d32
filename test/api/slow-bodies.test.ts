// Request bodies are timed: one that drips, stalls or takes longer than the body timeout is cut
// with a 408 in the error envelope and its connection closed, while an ordinary upload passes;
// and connections past the cap are refused. Short limits here; the defaults suit 500 MB uploads.

import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { join } from 'node:path';
import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../../models/make-model.js';
import type { TransportLimits } from '../../src/api/transport.js';
import { openService, type Service } from '../../src/service.js';
import { createApiKey } from '../../src/store/api-keys.js';
import { httpRequest, rawExchange } from '../helpers/raw-http.js';

let root: string;
let modelDir: string;
beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-slow-'));
  modelDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function start(name: string, transport: Partial<TransportLimits>): Promise<{ service: Service; origin: string; key: string }> {
  const service = await openService({
    catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] }, dataDir: join(root, name),
    engineDefaults: { backend: 'cpu', kvCacheBytes: 32 << 20, threads: 1 }, onProgress: () => {}, transport,
  });
  const origin = await service.app.listen({ host: '127.0.0.1', port: 0 });
  return { service, origin, key: service.firstKey?.key ?? (await createApiKey(service.store, 'default')).key };
}

describe('body timeout and minimum body rate', () => {
  let server: Awaited<ReturnType<typeof start>>;
  beforeAll(async () => {
    server = await start('bodies', { bodyTimeoutSeconds: 1.5, minBodyBytesPerSecond: 100, bodyRateGraceSeconds: 0.5 });
  });
  afterAll(async () => {
    server.service.app.server.closeAllConnections();
    await server.service.close();
  });

  const head = (length: number) => httpRequest('POST', '/v1/responses', {
    Host: 'x', Authorization: `Bearer ${server.key}`, 'Content-Type': 'application/json', 'Content-Length': length,
  });

  function expect408(reply: { status: number; body: string; closed: boolean }, says: string): void {
    expect(reply.status).toBe(408);
    expect(JSON.parse(reply.body)).toEqual({
      error: { message: expect.stringContaining(says), type: 'invalid_request_error', param: null, code: 'request_timeout' },
    });
    expect(reply.closed).toBe(true);
  }

  it('cuts a body that drips one byte at a time, before the drip ends', async () => {
    const body = JSON.stringify({ model: 'tiny', input: 'x'.repeat(200) });
    // 10 bytes/s, under the 100 bytes/s minimum; the whole drip would take over 20 s.
    const drip = [head(body.length), ...body.split('')];
    const reply = await rawExchange(server.origin, drip, { gapMs: 100, stopOnReply: true, waitMs: 5000 });
    expect408(reply, 'bytes/s');
  });

  it('cuts a body that stops arriving', async () => {
    const reply = await rawExchange(server.origin, `${head(100)}{"model": "tiny", `, { waitMs: 10_000 });
    expect408(reply, 'bytes/s');
  });

  it('cuts a body that keeps the minimum rate but takes longer than the body timeout', async () => {
    const body = JSON.stringify({ model: 'tiny', input: 'y'.repeat(3000) });
    const pieces: string[] = [head(body.length)];
    for (let i = 0; i < body.length; i += 50) pieces.push(body.slice(i, i + 50)); // 500 bytes/s: about 6 s in all
    const reply = await rawExchange(server.origin, pieces, { gapMs: 100, stopOnReply: true, waitMs: 5000 });
    expect408(reply, 'within 1.5 s');
  });

  it('lets an ordinary upload and request through', async () => {
    const client = new OpenAI({ baseURL: `${server.origin}/v1`, apiKey: server.key });
    const bytes = Buffer.alloc(8 << 20, 0x61);
    const file = await client.files.create({ file: await toFile(bytes, 'big.txt'), purpose: 'user_data' });
    expect(file.bytes).toBe(bytes.length);
    const res = await client.responses.create({ model: 'tiny', input: 'Hello', max_output_tokens: 2 });
    expect(['completed', 'incomplete']).toContain(res.status); // incomplete: max_output_tokens reached
  });
});

describe('connection cap', () => {
  it('closes connections past maxConnections at once, and takes new ones when some end', async () => {
    const server = await start('connections', { maxConnections: 2 });
    try {
      const { hostname, port } = new URL(server.origin);
      const connect = () => new Promise<net.Socket>((resolve) => {
        const s = net.connect(Number(port), hostname, () => resolve(s));
        s.on('error', () => {});
      });
      const first = await connect();
      const second = await connect();
      await new Promise((r) => setTimeout(r, 100)); // the server has accepted both
      const third = await connect();
      const thirdClosed = await new Promise<boolean>((resolve) => {
        third.on('close', () => resolve(true));
        third.write(httpRequest('GET', '/health', { Host: 'x' }));
        setTimeout(() => resolve(false), 3000);
      });
      expect(thirdClosed).toBe(true);
      first.destroy();
      second.destroy();
      await new Promise((r) => setTimeout(r, 100));
      const reply = await rawExchange(server.origin, httpRequest('GET', '/health', { Host: 'x', Connection: 'close' }));
      expect(reply.status).toBe(200);
    } finally {
      server.service.app.server.closeAllConnections();
      await server.service.close();
    }
  });
});
