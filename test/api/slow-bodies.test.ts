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
import { DEFAULT_TRANSPORT_LIMITS, type TransportLimits } from '../../src/api/transport.js';
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

/** A connection that has sent nothing; `closed` turns true when the server closes it. */
interface Idle {
  socket: net.Socket;
  closed: boolean;
}

async function openIdle(origin: string, count: number, localAddress?: string): Promise<Idle[]> {
  const { hostname, port } = new URL(origin);
  const out: Idle[] = [];
  // In waves, so that the listen backlog never overflows.
  for (let done = 0; done < count; done += 200) {
    out.push(...await Promise.all(Array.from({ length: Math.min(200, count - done) }, () => new Promise<Idle>((resolve) => {
      const idle: Idle = { socket: net.connect({ port: Number(port), host: hostname, ...(localAddress && { localAddress }) }), closed: false };
      idle.socket.on('error', () => {});
      idle.socket.on('close', () => { idle.closed = true; });
      idle.socket.once('connect', () => resolve(idle));
    }))));
  }
  return out;
}

const settle = (ms = 200) => new Promise((r) => setTimeout(r, ms));
const health = (origin: string) => rawExchange(origin, httpRequest('GET', '/health', { Host: 'x', Connection: 'close' }), { waitMs: 5000 });

describe('connection limits', () => {
  it('answers /health past 4,100 idle unauthenticated connections from one address, under the defaults', async () => {
    const server = await start('idle-flood', {});
    try {
      const idle = await openIdle(server.origin, 4100);
      await settle(500);
      const open = idle.filter((c) => !c.closed);
      // The per-address idle cap: the newest 256 stay, the older ones were closed.
      expect(open.length).toBe(DEFAULT_TRANSPORT_LIMITS.maxIdleConnectionsPerAddress);
      expect(idle.slice(-open.length).every((c) => !c.closed)).toBe(true);
      const t0 = Date.now();
      expect((await health(server.origin)).status).toBe(200);
      expect(Date.now() - t0).toBeLessThan(3000);
      const ready = await rawExchange(server.origin, httpRequest('GET', '/ready', { Host: 'x', Connection: 'close' }));
      expect(ready.status).toBe(200);
      for (const c of idle) c.socket.destroy();
    } finally {
      server.service.app.server.closeAllConnections();
      await server.service.close();
    }
  });

  it('past maxConnections, a new connection displaces the one idle the longest', async () => {
    const server = await start('displace', { maxConnections: 20, maxIdleConnectionsPerAddress: 0 });
    try {
      const idle = await openIdle(server.origin, 30);
      await settle();
      // The first ten were displaced by the last ten; the newest twenty are open.
      expect(idle.map((c) => c.closed)).toEqual([...Array(10).fill(true), ...Array(20).fill(false)]);
      expect((await health(server.origin)).status).toBe(200);
      // And an ordinary request gets in the same way.
      const models = await rawExchange(server.origin, httpRequest('GET', '/v1/models', { Host: 'x', Connection: 'close', Authorization: `Bearer ${server.key}` }));
      expect(models.status).toBe(200);
      for (const c of idle) c.socket.destroy();
    } finally {
      server.service.app.server.closeAllConnections();
      await server.service.close();
    }
  });

  it('when every connection is busy, /health and /ready answer on the reserve and other requests get 503', async () => {
    const server = await start('busy', { maxConnections: 3, reservedConnections: 2, maxIdleConnectionsPerAddress: 0 });
    const busy: net.Socket[] = [];
    try {
      const { hostname, port } = new URL(server.origin);
      // Three uploads whose bodies never finish: busy connections (a request in progress).
      for (let i = 0; i < 3; i++) {
        const s = net.connect(Number(port), hostname);
        s.on('error', () => {});
        await new Promise((r) => s.once('connect', r));
        s.write(httpRequest('POST', '/v1/files', { Host: 'x', Authorization: `Bearer ${server.key}`, 'Content-Type': 'multipart/form-data; boundary=b', 'Content-Length': 100_000 }, '--b\r\n'));
        busy.push(s);
      }
      await settle();
      for (let i = 0; i < 3; i++) {
        expect((await health(server.origin)).status).toBe(200);
        expect((await rawExchange(server.origin, httpRequest('GET', '/ready', { Host: 'x' }))).status).toBe(200);
      }
      const refused = await rawExchange(server.origin, httpRequest('GET', '/v1/models', { Host: 'x', Authorization: `Bearer ${server.key}` }));
      expect(refused.status).toBe(503);
      expect(refused.closed).toBe(true);
      expect(JSON.parse(refused.body)).toEqual({ error: { type: 'server_error', code: 'too_many_connections', param: null, message: expect.any(String) } });
      // Idle connections on the reserve give way too: probes still get in.
      const idle = await openIdle(server.origin, 5);
      await settle();
      expect(idle.filter((c) => !c.closed).length).toBeLessThanOrEqual(2);
      expect((await health(server.origin)).status).toBe(200);
      for (const c of idle) c.socket.destroy();
      // A busy connection ends: regular requests are served again.
      busy.shift()!.destroy();
      await settle();
      const models = await rawExchange(server.origin, httpRequest('GET', '/v1/models', { Host: 'x', Connection: 'close', Authorization: `Bearer ${server.key}` }));
      expect(models.status).toBe(200);
    } finally {
      for (const s of busy) s.destroy();
      server.service.app.server.closeAllConnections();
      await server.service.close();
    }
  });

  it('keeps at most maxIdleConnectionsPerAddress idle connections per client address, the newest', async () => {
    const server = await start('per-address', { maxIdleConnectionsPerAddress: 4 });
    try {
      const mine = await openIdle(server.origin, 10);
      await settle();
      expect(mine.map((c) => c.closed)).toEqual([...Array(6).fill(true), ...Array(4).fill(false)]);
      // Another address is counted apart (Linux routes all of 127/8 to loopback).
      const other = await openIdle(server.origin, 4, '127.0.0.2');
      await settle();
      expect(other.every((c) => !c.closed)).toBe(true);
      expect(mine.filter((c) => !c.closed)).toHaveLength(4);
      // A connection that finished a request counts as idle again: a keep-alive reply displaces the oldest.
      const reply = await rawExchange(server.origin, httpRequest('GET', '/health', { Host: 'x' }), { waitMs: 300 });
      expect(reply.status).toBe(200);
      await settle();
      expect(mine.filter((c) => !c.closed)).toHaveLength(3);
      for (const c of [...mine, ...other]) c.socket.destroy();
    } finally {
      server.service.app.server.closeAllConnections();
      await server.service.close();
    }
  });
});
