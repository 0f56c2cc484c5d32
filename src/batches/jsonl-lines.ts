// Reads a JSONL file line by line from a byte offset, with each line's number and byte range, so a
// runner can record "everything before this byte is done" and resume there. Holds one line (plus
// the current chunk) at a time: memory does not grow with the number of lines.

import type { Readable } from 'node:stream';

const NEWLINE = 0x0a;
const CR = 0x0d;

export interface JsonlLine {
  /** 1-based line number in the whole file. */
  lineNo: number;
  /** Byte offset where the line starts. */
  start: number;
  /** Byte offset just past its terminator: where the next line starts. */
  end: number;
  /** The line without "\n", "\r\n" or a first-line byte-order mark. */
  text: string;
}

/**
 * Yields every line of `stream`, which must begin at byte `startOffset` of the file, the first
 * being line `firstLine`. Blank lines are yielded too (callers skip them) so numbering stays exact.
 */
export async function* jsonlLines(stream: Readable, startOffset = 0, firstLine = 1): AsyncGenerator<JsonlLine> {
  let pending: Buffer[] = [];
  let lineNo = firstLine;
  let lineStart = startOffset;
  let pos = startOffset;
  const emit = (bytes: Buffer, end: number): JsonlLine => {
    let body = bytes;
    if (body.length > 0 && body[body.length - 1] === CR) body = body.subarray(0, body.length - 1);
    let text = body.toString('utf8');
    if (lineNo === 1 && text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    const line = { lineNo, start: lineStart, end, text };
    lineNo += 1;
    lineStart = end;
    return line;
  };
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    let from = 0;
    while (from < chunk.length) {
      const nl = chunk.indexOf(NEWLINE, from);
      if (nl === -1) {
        pending.push(chunk.subarray(from));
        break;
      }
      const piece = chunk.subarray(from, nl);
      const bytes = pending.length === 0 ? piece : Buffer.concat([...pending, piece]);
      pending = [];
      yield emit(bytes, pos + nl + 1);
      from = nl + 1;
    }
    pos += chunk.length;
  }
  if (pending.length > 0) yield emit(Buffer.concat(pending), pos);
}
