// Streaming validation of a batch input file (JSONL, one request per line). The validator is fed
// the upload's chunks as they arrive and holds at most one line at a time: a line is split out by
// scanning for "\n" in the chunks, never by readline, so a line over the cap is refused as soon as
// the bytes seen of it pass the cap, instead of being buffered whole. Chunks are kept by reference
// until their line ends: callers must not modify a chunk after pushing it.
//
// Memory: the current line (<= 28 MiB) plus one map entry per request (custom_id -> line number,
// kept to report where a duplicate was first used).

import { TextDecoder } from 'node:util';
import { jsonTextDeeperThan } from '../json-shape.js';

/** The spec's per-line cap: 28 MiB, counted without the line terminator ("\n" or "\r\n"). */
export const MAX_BATCH_LINE_BYTES = 28 * 1024 * 1024;

/**
 * Requests per batch file (OpenAI's cap). Each costs a result row, a custom_id held while the
 * file is checked, and a line of the result files; past this a file is refused at upload.
 */
export const MAX_BATCH_REQUESTS = 50_000;

/**
 * Nesting past which a line is refused at upload: parsing it would hold the event loop (V8 takes
 * about a second per million levels). Lines nested deeper than a request body may be
 * (MAX_JSON_DEPTH, 64) but within this run as error lines (json_too_deep), like any bad body.
 */
export const MAX_BATCH_LINE_DEPTH = 1000;

/** The operation paths a batch request may target. */
export const BATCH_URLS: readonly string[] = ['/v1/responses', '/v1/chat/completions', '/v1/messages'];

const LINE_FIELDS = new Set(['custom_id', 'method', 'url', 'body']);
const NEWLINE = 0x0a;
const CR = 0x0d;

/** Why a batch file was refused. `line` is 1-based; 0 for a problem of the whole file. */
export interface BatchFileProblem {
  line: number;
  message: string;
}

export interface BatchFileSummary {
  /** Non-empty lines, one request each. */
  numRequests: number;
}

/**
 * Feed chunks with `push`, then call `finish`. Both return the first problem found, or null;
 * after a problem the validator ignores further input and keeps returning that problem.
 */
export class BatchFileValidator {
  private readonly maxLineBytes: number;
  /** Pieces of the line not yet terminated by "\n"; their total is pendingBytes. */
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  /** 1-based number of the line being assembled. */
  private lineNo = 1;
  private numRequests = 0;
  /** custom_id -> the line that used it first. */
  private readonly seenIds = new Map<string, number>();
  private problem: BatchFileProblem | null = null;
  private finished = false;
  private readonly utf8 = new TextDecoder('utf-8', { fatal: true });

  private readonly maxRequests: number;

  constructor(opts: { maxLineBytes?: number; maxRequests?: number } = {}) {
    this.maxLineBytes = opts.maxLineBytes ?? MAX_BATCH_LINE_BYTES;
    this.maxRequests = opts.maxRequests ?? MAX_BATCH_REQUESTS;
  }

  push(chunk: Buffer): BatchFileProblem | null {
    if (this.problem || this.finished) return this.problem;
    let start = 0;
    while (start < chunk.length) {
      const nl = chunk.indexOf(NEWLINE, start);
      const end = nl === -1 ? chunk.length : nl;
      // One byte of slack: a "\r" before the "\n" is a terminator, not content (checkLine strips it).
      if (this.pendingBytes + (end - start) > this.maxLineBytes + 1) return this.fail(this.lineNo, this.tooLong());
      if (nl === -1) {
        this.pending.push(chunk.subarray(start));
        this.pendingBytes += chunk.length - start;
        return null;
      }
      const line = this.pending.length === 0 ? chunk.subarray(start, end) : Buffer.concat([...this.pending, chunk.subarray(start, end)]);
      this.pending = [];
      this.pendingBytes = 0;
      const problem = this.checkLine(line);
      if (problem) return problem;
      this.lineNo += 1;
      start = nl + 1;
    }
    return null;
  }

  /** Ends the input: checks the last line (which may lack "\n") and that there was a request. */
  finish(): BatchFileProblem | null {
    if (this.problem || this.finished) return this.problem;
    this.finished = true;
    if (this.pendingBytes > 0) {
      const problem = this.checkLine(Buffer.concat(this.pending));
      this.pending = [];
      this.pendingBytes = 0;
      if (problem) return problem;
    }
    if (this.numRequests === 0) return this.fail(0, 'the batch file has no requests (every line is empty)');
    return null;
  }

  summary(): BatchFileSummary {
    return { numRequests: this.numRequests };
  }

  private tooLong(): string {
    const mib = this.maxLineBytes === MAX_BATCH_LINE_BYTES ? ' (28 MiB)' : '';
    return `line ${this.lineNo}: the line is longer than ${this.maxLineBytes} bytes${mib}, the cap per line`;
  }

  private fail(line: number, message: string): BatchFileProblem {
    this.problem = { line, message };
    this.pending = [];
    this.pendingBytes = 0;
    return this.problem;
  }

  private checkLine(raw: Buffer): BatchFileProblem | null {
    const n = this.lineNo;
    let bytes = raw;
    if (bytes.length > 0 && bytes[bytes.length - 1] === CR) bytes = bytes.subarray(0, bytes.length - 1);
    if (bytes.length > this.maxLineBytes) return this.fail(n, this.tooLong());
    let text: string;
    try {
      text = this.utf8.decode(bytes);
    } catch {
      return this.fail(n, `line ${n}: the line is not valid UTF-8`);
    }
    if (n === 1 && text.charCodeAt(0) === 0xfeff) text = text.slice(1); // a byte-order mark some editors write
    if (text.trim() === '') return null;
    if (this.numRequests === this.maxRequests) {
      return this.fail(n, `line ${n}: the file has more than ${this.maxRequests} requests, the most a batch may have`);
    }
    if (jsonTextDeeperThan(text, MAX_BATCH_LINE_DEPTH)) {
      return this.fail(n, `line ${n}: nested deeper than ${MAX_BATCH_LINE_DEPTH} levels`);
    }

    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      return this.fail(n, `line ${n}: not valid JSON (${(err as Error).message})`);
    }
    if (!isObject(value)) return this.fail(n, `line ${n}: must be a JSON object with custom_id, method, url and body`);
    for (const key of Object.keys(value)) {
      if (!LINE_FIELDS.has(key)) return this.fail(n, `line ${n}: "${key}" is not a recognised field (expected custom_id, method, url, body)`);
    }
    const id = value['custom_id'];
    if (typeof id !== 'string' || id === '') return this.fail(n, `line ${n}: custom_id must be a non-empty string`);
    const firstUse = this.seenIds.get(id);
    if (firstUse !== undefined) return this.fail(n, `line ${n}: custom_id ${JSON.stringify(id)} is used on line ${firstUse} too`);
    if (value['method'] !== 'POST') return this.fail(n, `line ${n}: method must be "POST" (got ${show(value['method'])})`);
    const url = value['url'];
    if (typeof url !== 'string' || !BATCH_URLS.includes(url)) {
      return this.fail(n, `line ${n}: url must be one of ${BATCH_URLS.map((u) => `"${u}"`).join(', ')} (got ${show(url)})`);
    }
    if (!isObject(value['body'])) return this.fail(n, `line ${n}: body must be a JSON object (the request for ${url})`);
    this.seenIds.set(id, n);
    this.numRequests += 1;
    return null;
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function show(value: unknown): string {
  const s = JSON.stringify(value);
  if (s === undefined) return 'nothing';
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}
