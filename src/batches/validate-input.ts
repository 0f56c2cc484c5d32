// The `validating` step of a batch: reads the input file once, line by line, and checks what the
// upload could not know: that every request targets the batch's endpoint. Counts the requests
// (request_counts.total). Upload already checked JSON, custom_id uniqueness, method and url.
// Records the chunk boundaries on the way (chunks.ts), so the lines are read once before they run.

import type { Readable } from 'node:stream';
import type { BatchErrorItem } from '../store/batch-records.js';
import type { BatchChunkBounds } from '../store/batch-records.js';
import { BATCH_CHUNK_LINES, ChunkSplitter } from './chunks.js';
import { jsonlLines } from './jsonl-lines.js';

/** Errors reported at most per batch (OpenAI lists a sample too); the count is still exact. */
export const MAX_REPORTED_ERRORS = 100;

export interface InputCheck {
  /** Non-blank lines: one request each. */
  numRequests: number;
  /** Empty when the batch may run. */
  errors: BatchErrorItem[];
  /** The requests' chunks, in file order. */
  chunks: BatchChunkBounds[];
}

export async function checkBatchInput(stream: Readable, endpoint: string, signal: AbortSignal, chunkLines = BATCH_CHUNK_LINES): Promise<InputCheck> {
  const errors: BatchErrorItem[] = [];
  const splitter = new ChunkSplitter(chunkLines);
  let numRequests = 0;
  const report = (item: BatchErrorItem) => { if (errors.length < MAX_REPORTED_ERRORS) errors.push(item); };
  for await (const line of jsonlLines(stream)) {
    if (signal.aborted) break;
    if (line.text.trim() === '') continue;
    numRequests += 1;
    splitter.add(line);
    let url: unknown;
    try {
      url = (JSON.parse(line.text) as { url?: unknown }).url;
    } catch {
      report({ code: 'invalid_json_line', message: `line ${line.lineNo} is not valid JSON`, line: line.lineNo, param: null });
      continue;
    }
    if (url !== endpoint) {
      report({
        code: 'mismatched_endpoint',
        message: `line ${line.lineNo}: url ${JSON.stringify(url)} differs from the batch's endpoint "${endpoint}"; every request of a batch must target its endpoint`,
        line: line.lineNo,
        param: 'url',
      });
    }
  }
  if (numRequests === 0 && !signal.aborted) {
    report({ code: 'empty_file', message: 'the input file has no requests', line: null, param: 'input_file_id' });
  }
  return { numRequests, errors, chunks: splitter.chunks };
}
