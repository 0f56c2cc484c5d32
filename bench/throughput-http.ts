// The HTTP side of the throughput bench (bench/throughput.ts): Chat Completions requests sent at
// given offsets (all at once, or Poisson arrivals) and one Batches API batch, against a running
// server. node:http with a keep-alive agent and no socket cap: every request gets its connection,
// and nothing times out on the client side (a saturated server answers late, not never).

import http from 'node:http';

import type { ChatBody, RequestRecord } from './throughput-child.js';

export interface HttpBase {
  /** e.g. http://127.0.0.1:PORT/v1 */
  baseUrl: string;
  key: string;
}

export interface HttpRun {
  records: RequestRecord[];
  wallMs: number;
  /** Batch: when each status (and 'all lines done') was first seen, ms after the create. */
  statusAtMs?: Record<string, number>;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

function send(base: HttpBase, method: string, path: string, body?: string | Buffer, contentType = 'application/json'): Promise<Reply> {
  const url = new URL(`${base.baseUrl}${path}`);
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method, agent,
      headers: {
        authorization: `Bearer ${base.key}`,
        ...(body !== undefined && { 'content-type': contentType, 'content-length': Buffer.byteLength(body) }),
      },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** queue, prefill and decode durations (ms) from a server-timing header. */
export function parseServerTiming(header: string | string[] | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of String(header ?? '').split(',')) {
    const m = /^\s*([\w-]+)\s*;\s*dur=([\d.]+)/.exec(part);
    if (m) out[m[1]!] = Number(m[2]);
  }
  return out;
}

/** Sends body i at offsetsMs[i] after the start; resolves when every reply is in. */
export async function runChat(base: HttpBase, bodies: ChatBody[], offsetsMs: number[]): Promise<HttpRun> {
  const t0 = performance.now();
  const one = async (body: ChatBody, at: number): Promise<RequestRecord> => {
    const wait = t0 + at - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const t = performance.now();
    try {
      const reply = await send(base, 'POST', '/chat/completions', JSON.stringify(body));
      const e2eMs = performance.now() - t;
      if (reply.status !== 200) return { ok: false, inputTokens: 0, outputTokens: 0, e2eMs, error: `${reply.status} ${reply.body.slice(0, 200)}` };
      const usage = (JSON.parse(reply.body) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
      const timing = parseServerTiming(reply.headers['server-timing']);
      return {
        ok: true, inputTokens: usage.prompt_tokens, outputTokens: usage.completion_tokens, e2eMs,
        ...(timing.queue !== undefined && timing.prefill !== undefined && { ttftMs: timing.queue + timing.prefill }),
        ...(timing.decode !== undefined && { decodeMs: timing.decode }),
      };
    } catch (err) {
      return { ok: false, inputTokens: 0, outputTokens: 0, error: (err as Error).message };
    }
  };
  const records = await Promise.all(bodies.map((b, i) => one(b, offsetsMs[i] ?? 0)));
  return { records, wallMs: performance.now() - t0 };
}

const TERMINAL = new Set(['completed', 'failed', 'expired', 'cancelled']);

/**
 * One batch of every body (POST /v1/files, then /v1/batches), polled every 100 ms to its end; the
 * wall time runs from creating the batch (after the upload) to the poll that saw it end.
 */
export async function runBatch(base: HttpBase, bodies: ChatBody[], window: string): Promise<HttpRun> {
  const jsonl = bodies.map((body, i) => JSON.stringify({ custom_id: `r${i}`, method: 'POST', url: '/v1/chat/completions', body })).join('\n') + '\n';
  const boundary = `----sluice-bench-${Date.now()}`;
  const form = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n`),
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="requests.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n`),
    Buffer.from(jsonl), Buffer.from(`\r\n--${boundary}--\r\n`),
  ]);
  const file = await send(base, 'POST', '/files', form, `multipart/form-data; boundary=${boundary}`);
  if (file.status !== 200) throw new Error(`upload failed: ${file.status} ${file.body.slice(0, 300)}`);
  const inputFileId = (JSON.parse(file.body) as { id: string }).id;
  const t0 = performance.now();
  const created = await send(base, 'POST', '/batches', JSON.stringify({ input_file_id: inputFileId, endpoint: '/v1/chat/completions', completion_window: window }));
  if (created.status !== 200) throw new Error(`batch create failed: ${created.status} ${created.body.slice(0, 300)}`);
  const id = (JSON.parse(created.body) as { id: string }).id;
  let batch: { status: string; output_file_id?: string | null; error_file_id?: string | null; request_counts?: { completed: number } };
  // When each status was first seen, and when every line was first seen done (ms from the create).
  const statusAtMs: Record<string, number> = {};
  for (;;) {
    batch = JSON.parse((await send(base, 'GET', `/batches/${id}`)).body) as typeof batch;
    statusAtMs[batch.status] ??= performance.now() - t0;
    if (batch.request_counts?.completed === bodies.length) statusAtMs['all lines done'] ??= performance.now() - t0;
    if (TERMINAL.has(batch.status)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const wallMs = performance.now() - t0;
  if (batch.status !== 'completed') throw new Error(`the batch ended ${batch.status}`);
  const records: RequestRecord[] = [];
  for (const fileId of [batch.output_file_id, batch.error_file_id]) {
    if (!fileId) continue;
    const content = await send(base, 'GET', `/files/${fileId}/content`);
    for (const line of content.body.split('\n')) {
      if (line === '') continue;
      const r = JSON.parse(line) as { response: { status_code: number; body: { usage?: { prompt_tokens: number; completion_tokens: number } } } | null; error: unknown };
      const usage = r.response?.status_code === 200 ? r.response.body.usage : undefined;
      records.push(usage ? { ok: true, inputTokens: usage.prompt_tokens, outputTokens: usage.completion_tokens }
        : { ok: false, inputTokens: 0, outputTokens: 0, error: JSON.stringify(r.error ?? r.response).slice(0, 200) });
    }
  }
  return { records, wallMs, statusAtMs };
}
