// The batch-file validator on its own: lines split across chunks, every per-line rule, the line
// cap enforced before a long line is buffered whole, and the empty file.

import { describe, expect, it } from 'vitest';
import { BatchFileValidator, MAX_BATCH_LINE_BYTES, type BatchFileProblem } from '../src/files/batch-file.js';

const line = (id: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/chat/completions', body: { model: 'tiny', messages: [] }, ...extra });

/** Feeds `text` in chunks of `chunkBytes` and returns the first problem (or null) and the request count. */
function validate(text: string | Buffer, chunkBytes = 7, maxLineBytes?: number): { problem: BatchFileProblem | null; numRequests: number } {
  const v = new BatchFileValidator(maxLineBytes === undefined ? {} : { maxLineBytes });
  const bytes = typeof text === 'string' ? Buffer.from(text) : text;
  for (let i = 0; i < bytes.length; i += chunkBytes) {
    const problem = v.push(bytes.subarray(i, i + chunkBytes));
    if (problem) return { problem, numRequests: v.summary().numRequests };
  }
  return { problem: v.finish(), numRequests: v.summary().numRequests };
}

describe('BatchFileValidator', () => {
  it('accepts valid lines whatever the chunking, with CRLF, blank lines and no final newline', () => {
    const text = `${line('a')}\r\n\n   \n${line('b', { url: '/v1/responses' })}\n${line('c', { url: '/v1/messages' })}`;
    for (const chunk of [1, 3, 7, 64, 1 << 20]) {
      expect(validate(text, chunk)).toEqual({ problem: null, numRequests: 3 });
    }
  });

  it('counts lines across chunk boundaries for the line number', () => {
    const text = `${line('a')}\n\n${line('b')}\n{"custom_id": 1}\n`;
    for (const chunk of [1, 5, 1000]) {
      expect(validate(text, chunk).problem).toEqual({ line: 4, message: 'line 4: custom_id must be a non-empty string' });
    }
  });

  it.each([
    ['not JSON', '{"custom_id": ', /^line 2: not valid JSON/],
    ['not an object', '[1, 2]', /^line 2: must be a JSON object/],
    ['null', 'null', /^line 2: must be a JSON object/],
    ['missing custom_id', JSON.stringify({ method: 'POST', url: '/v1/responses', body: {} }), /^line 2: custom_id must be a non-empty string$/],
    ['empty custom_id', line(''), /^line 2: custom_id must be a non-empty string$/],
    ['duplicate custom_id', line('a'), /^line 2: custom_id "a" is used on line 1 too$/],
    ['method GET', line('x', { method: 'GET' }), /^line 2: method must be "POST" \(got "GET"\)$/],
    ['unsupported url', line('x', { url: '/v1/embeddings' }), /^line 2: url must be one of "\/v1\/responses", "\/v1\/chat\/completions", "\/v1\/messages" \(got "\/v1\/embeddings"\)$/],
    ['body not an object', line('x', { body: 'hi' }), /^line 2: body must be a JSON object/],
    ['body an array', line('x', { body: [] }), /^line 2: body must be a JSON object/],
    ['unknown field', line('x', { extra: 1 }), /^line 2: "extra" is not a recognised field/],
  ])('refuses a line that is %s', (_name, bad, message) => {
    const { problem } = validate(`${line('a')}\n${bad}\n${line('z')}\n`);
    expect(problem?.line).toBe(2);
    expect(problem?.message).toMatch(message);
  });

  it('refuses invalid UTF-8', () => {
    const bytes = Buffer.concat([Buffer.from(`${line('a')}\n{"custom_id": "`), Buffer.from([0xff, 0xfe]), Buffer.from('"}\n')]);
    expect(validate(bytes).problem).toEqual({ line: 2, message: 'line 2: the line is not valid UTF-8' });
  });

  it('refuses an empty file and a file of blank lines', () => {
    expect(validate('').problem).toEqual({ line: 0, message: 'the batch file has no requests (every line is empty)' });
    expect(validate('\n\r\n  \n').problem?.line).toBe(0);
  });

  it('takes a line of exactly the cap and refuses one byte more, CRLF not counted', () => {
    const cap = 200;
    const exact = line('a', { body: { pad: '' } });
    const padded = (n: number) => line('a', { body: { pad: 'x'.repeat(n - exact.length) } });
    expect(padded(cap).length).toBe(cap);
    expect(validate(`${padded(cap)}\r\n`, 13, cap).problem).toBeNull();
    expect(validate(`${padded(cap)}`, 13, cap).problem).toBeNull();
    expect(validate(`${padded(cap + 1)}\n`, 13, cap).problem?.message).toMatch(/^line 1: the line is longer than 200 bytes/);
    expect(validate(`${padded(cap + 1)}`, 13, cap).problem?.line).toBe(1);
  });

  it('stops on an over-long line before it ends, holding no more than the cap', () => {
    const v = new BatchFileValidator({ maxLineBytes: 1000 });
    expect(v.push(Buffer.from(`${line('a')}\n{"custom_id": "b", "body": "`))).toBeNull();
    const filler = Buffer.alloc(600, 0x61);
    expect(v.push(filler)).toBeNull();
    const problem = v.push(filler);
    expect(problem).toEqual({ line: 2, message: expect.stringMatching(/^line 2: the line is longer than 1000 bytes/) });
    // Later input is ignored and the verdict stands.
    expect(v.push(Buffer.from('\n'))).toBe(problem);
    expect(v.finish()).toBe(problem);
  });

  it('uses the spec cap of 28 MiB by default', () => {
    expect(MAX_BATCH_LINE_BYTES).toBe(28 * 1024 * 1024);
    const v = new BatchFileValidator();
    const chunk = Buffer.alloc(1024 * 1024, 0x20);
    let problem: BatchFileProblem | null = null;
    let fed = 0;
    while (!problem && fed < 40) {
      problem = v.push(chunk);
      fed += 1;
    }
    expect(problem?.line).toBe(1);
    expect(fed).toBe(29); // refused within the 29th MiB, long before the line (or the input) ends
  });
});
