// Helpers of the batch tests: JSONL request lines, upload, polling a batch, and reading its result
// files back with the official openai client.

import OpenAI, { toFile } from 'openai';
import type { Batch } from 'openai/resources/batches';
import type { TestServer } from './api-server.js';

export type BatchEndpoint = '/v1/responses' | '/v1/chat/completions' | '/v1/messages';

export const TERMINAL = ['completed', 'failed', 'expired', 'cancelled'];

export interface RequestLine {
  custom_id: string;
  method: 'POST';
  url: BatchEndpoint;
  body: Record<string, unknown>;
}

export const chatLine = (id: string, content: string, extra: Record<string, unknown> = {}): RequestLine => ({
  custom_id: id, method: 'POST', url: '/v1/chat/completions',
  body: { model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 1, temperature: 0, ...extra },
});

export async function uploadLines(client: OpenAI, lines: RequestLine[]): Promise<string> {
  const text = `${lines.map((l) => JSON.stringify(l)).join('\n')}\n`;
  const file = await client.files.create({ file: await toFile(Buffer.from(text), 'in.jsonl'), purpose: 'batch' });
  return file.id;
}

export async function createBatch(client: OpenAI, lines: RequestLine[], window = '24h', endpoint: BatchEndpoint = '/v1/chat/completions'): Promise<Batch> {
  const input_file_id = await uploadLines(client, lines);
  // The SDK's types list only OpenAI's endpoints and the 24h window; the service takes more.
  return client.batches.create({ input_file_id, endpoint, completion_window: window } as unknown as OpenAI.Batches.BatchCreateParams);
}

/** Polls until `until` holds for the batch (default: a terminal status). */
export async function waitForBatch(client: OpenAI, id: string, until: (b: Batch) => boolean = (b) => TERMINAL.includes(b.status),
  ms = 60_000): Promise<Batch> {
  const deadline = Date.now() + ms;
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (until(b)) return b;
    if (Date.now() > deadline) throw new Error(`batch ${id} is still ${b.status} (${JSON.stringify(b.request_counts)})`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface ResultLine {
  id: string;
  custom_id: string;
  response: { status_code: number; request_id: string; body: Record<string, any> } | null;
  error: { code: string; message: string } | null;
}

/** The parsed lines of a result file; [] for a null id. */
export async function readResults(client: OpenAI, fileId: string | null | undefined): Promise<ResultLine[]> {
  if (!fileId) return [];
  const text = await (await client.files.content(fileId)).text();
  return text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as ResultLine);
}

/** custom_id -> how many times it appears across the given result lines. */
export function countIds(...lists: ResultLine[][]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const list of lists) for (const l of list) counts.set(l.custom_id, (counts.get(l.custom_id) ?? 0) + 1);
  return counts;
}

/**
 * Closes a test server at once. A keep-alive connection whose last response is still being wrapped
 * up when close starts is not idle then, so fastify would wait for it until keepAliveTimeout
 * (72 s); the client here is done with it, so it is dropped.
 */
export async function closeNow(server: TestServer): Promise<void> {
  const closing = server.close();
  server.service.app.server.closeAllConnections();
  await closing;
}
