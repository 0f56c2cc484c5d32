// Prompt workers (src/text/prompt-pool.ts): long prompts are rendered and tokenized off the
// event loop with exactly the tokens the inline path makes; tenants take turns; a job that runs
// too long or out of memory fails alone; idle workers stop (their memory goes back). Runs the
// compiled worker (dist/): `npm run build:ts` first when running this file alone.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { PromptEncoder } from '../src/text/prompt-encoder.js';
import { PromptPool } from '../src/text/prompt-pool.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';

let root: string;
let modelDir: string;
let inline: PromptEncoder;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-prompt-pool-'));
  modelDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
  inline = new PromptEncoder(await SluiceTokenizer.load(modelDir), modelDir);
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const longText = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => String.fromCharCode(97 + ((i * 7 + salt) % 26)) + (i % 9 === 0 ? ' ' : '')).join('');

describe('PromptPool', () => {
  it('is available (the compiled worker exists)', () => {
    expect(PromptPool.available()).toBe(true);
  });

  it('gives the inline tokens for prompts and chat messages, while the event loop keeps turning', async () => {
    const pool = new PromptPool({ size: 1 });
    try {
      const prompt = longText(60_000);
      const messages = [{ role: 'system' as const, content: 'Be brief.' }, { role: 'user' as const, content: longText(30_000, 5) }];
      let ticks = 0;
      const ticker = setInterval(() => ticks++, 1);
      const [fromPrompt, fromMessages] = await Promise.all([pool.encode(modelDir, { prompt }), pool.encode(modelDir, { messages })]);
      clearInterval(ticker);
      expect(fromPrompt).toEqual(inline.encode({ prompt }));
      expect(fromMessages).toEqual(inline.encode({ messages }));
      // Tokenizing ~90k characters takes hundreds of ms; the loop ran timers all along.
      expect(ticks).toBeGreaterThan(10);
    } finally {
      await pool.close();
    }
  });

  it('serves tenants in turns: one tenant\'s pile waits behind another\'s single job', async () => {
    const pool = new PromptPool({ size: 1 });
    try {
      const done: string[] = [];
      const job = (tenant: string, name: string) => pool.encode(modelDir, { prompt: longText(5000) }, tenant).then(() => done.push(name));
      await Promise.all([job('B', 'b1'), job('B', 'b2'), job('B', 'b3'), job('A', 'a1')]);
      expect(done).toEqual(['b1', 'a1', 'b2', 'b3']);
    } finally {
      await pool.close();
    }
  });

  it('reports a template or tokenizer refusal as the same SluiceError', async () => {
    const pool = new PromptPool({ size: 1 });
    try {
      await expect(pool.encode(modelDir, { messages: [{ role: 'robot' as never, content: 'x' }] }))
        .rejects.toMatchObject({ code: 'invalid_request', param: 'messages[0].role' });
      await expect(pool.encode(join(root, 'missing'), { prompt: 'x' })).rejects.toMatchObject({ code: 'model_file_missing' });
    } finally {
      await pool.close();
    }
  });

  it('fails a job that runs too long alone; the other worker serves on', async () => {
    const pool = new PromptPool({ size: 2, jobTimeoutMs: 1500 });
    try {
      // Both workers load the tokenizer first, so only tokenizing is timed.
      await Promise.all([pool.encode(modelDir, { prompt: 'warm' }, 'a'), pool.encode(modelDir, { prompt: 'warm' }, 'b')]);
      const random = Array.from({ length: 6_000_000 }, (_, i) => String.fromCharCode(33 + ((i * 7919) % 90))).join('');
      const [long, short] = await Promise.allSettled([
        pool.encode(modelDir, { prompt: random }, 'a'),
        new Promise((r) => setTimeout(r, 100)).then(() => pool.encode(modelDir, { prompt: 'short again' }, 'b')),
      ]);
      expect(long).toMatchObject({ status: 'rejected', reason: { code: 'input_too_long' } });
      expect(short).toEqual({ status: 'fulfilled', value: inline.encode({ prompt: 'short again' }) });
      // The pool replaced the stopped worker.
      await expect(pool.encode(modelDir, { prompt: 'after' })).resolves.toEqual(inline.encode({ prompt: 'after' }));
    } finally {
      await pool.close();
    }
  });

  it('fails a job whose worker runs out of heap alone', async () => {
    const pool = new PromptPool({ size: 1, maxHeapMb: 24 });
    try {
      await expect(pool.encode(modelDir, { prompt: longText(3_000_000) })).rejects.toMatchObject({ code: 'input_too_long' });
      await expect(pool.encode(modelDir, { prompt: 'fine' })).resolves.toEqual(inline.encode({ prompt: 'fine' }));
    } finally {
      await pool.close();
    }
  });

  it('stops idle workers', async () => {
    const pool = new PromptPool({ size: 2, idleMs: 20 });
    try {
      await Promise.all([pool.encode(modelDir, { prompt: 'a b c' }), pool.encode(modelDir, { prompt: 'd e f' })]);
      expect(pool.numWorkers).toBe(2);
      for (let i = 0; i < 100 && pool.numWorkers > 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(pool.numWorkers).toBe(0);
    } finally {
      await pool.close();
    }
  });
});
