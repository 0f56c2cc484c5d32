// A batch left in_progress by a version before chunks (issue 18: no chunk rows, only its progress
// through the input file and its result rows) resumes: its lines from the recorded progress on are
// split into chunks under the batch row's lease, lines that already have a row (before the
// progress, and past it: they finished out of order) are not run again, and every line ends up
// exactly once in the result files. The old state is written into the SQLite file directly.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, expect, it } from 'vitest';
import { storePath } from '../../src/service.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';
import { chatLine, closeNow, countIds, createBatch, readResults, waitForBatch } from '../helpers/batches.js';

const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-batch-before-chunks-'));
afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

it('resumes a batch from before chunks at its progress, running only the lines without a row', async () => {
  const lines = Array.from({ length: 100 }, (_, i) => chatLine(`c${i}`, `Say ${i}`, { max_tokens: 2 }));
  let first: TestServer | undefined = await startTestServer({ dataDir });
  let batchId: string;
  try {
    const client = new OpenAI({ baseURL: first.baseUrl, apiKey: first.key, maxRetries: 0 });
    first.service.batches.pause(); // held in validating: its state is written below instead
    batchId = (await createBatch(client, lines, 'standard')).id;
  } finally {
    await closeNow(first);
    first = undefined;
  }

  // What the old runner left: lines 1..30 done (progress at line 31), and lines 35 and 40 done out of order.
  const done = [...Array.from({ length: 30 }, (_, i) => i + 1), 35, 40];
  const offsetOf = (lineNo: number) => lines.slice(0, lineNo - 1).reduce((sum, l) => sum + Buffer.byteLength(JSON.stringify(l)) + 1, 0);
  const db = new Database(storePath(dataDir));
  try {
    db.prepare(`UPDATE batches SET status = 'in_progress', total = 100, completed = ?, in_progress_at = created_at,
                  next_line = 31, next_offset = ?, num_chunks = NULL WHERE id = ?`).run(done.length, offsetOf(31), batchId);
    const insert = db.prepare('INSERT INTO batch_results (batch_id, line_no, ok, line) VALUES (?, ?, 1, ?)');
    for (const n of done) {
      insert.run(batchId, n, JSON.stringify({ id: `batch_req_old${n}`, custom_id: `c${n - 1}`, response: { status_code: 200, request_id: 'old', body: { old: true } }, error: null }));
    }
  } finally {
    db.close();
  }

  const second = await startTestServer({ dataDir });
  try {
    const client = new OpenAI({ baseURL: second.baseUrl, apiKey: second.key, maxRetries: 0 });
    const ended = await waitForBatch(client, batchId);
    expect(ended.status).toBe('completed');
    expect(ended.request_counts).toEqual({ total: 100, completed: 100, failed: 0 });
    const output = await readResults(client, ended.output_file_id);
    const counts = countIds(output);
    expect(counts.size).toBe(100);
    expect([...counts.values()].every((n) => n === 1)).toBe(true);
    // The rows from before were kept as they were, not run again.
    expect(output.filter((l) => l.response?.request_id === 'old').map((l) => l.custom_id).sort())
      .toEqual(done.map((n) => `c${n - 1}`).sort());
    const usage = await second.service.store.listUsage({});
    expect(usage.filter((u) => u.surface === 'batch')).toHaveLength(100 - done.length);
  } finally {
    await closeNow(second);
  }
}, 60_000);
