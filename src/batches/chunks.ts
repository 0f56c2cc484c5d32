// A batch's lines split into chunks: runs of BATCH_CHUNK_LINES consecutive non-blank lines, each
// claimed and run by one replica at a time under a lease (store/leases.ts, batches/runner.ts).
// The boundaries are found while the input is read anyway (validation, or for a batch from before
// chunks, from its recorded progress on), and written with the batch's move to in_progress.

import type { Readable } from 'node:stream';
import type { BatchChunkBounds } from '../store/batch-records.js';
import { jsonlLines, type JsonlLine } from './jsonl-lines.js';

/**
 * Lines per chunk: small enough that a 100-line batch spreads over replicas and a dead replica's
 * unfinished work is a few lines; large enough that claims (one transaction per chunk) cost
 * little next to the lines' generations.
 */
export const BATCH_CHUNK_LINES = 32;

/** Collects chunk boundaries from non-blank lines given in file order. */
export class ChunkSplitter {
  readonly chunks: BatchChunkBounds[] = [];
  private open: BatchChunkBounds | undefined;

  constructor(private readonly chunkLines = BATCH_CHUNK_LINES) {}

  add(line: JsonlLine): void {
    if (!this.open) {
      this.open = { chunkNo: this.chunks.length, firstLine: line.lineNo, lastLine: line.lineNo, startOffset: line.start, endOffset: line.end, numLines: 0 };
      this.chunks.push(this.open);
    }
    this.open.lastLine = line.lineNo;
    this.open.endOffset = line.end;
    this.open.numLines += 1;
    if (this.open.numLines === this.chunkLines) this.open = undefined;
  }
}

/**
 * The chunks of the non-blank lines from byte `startOffset` (line `firstLine`) to the end of the
 * stream, which must begin at that offset. Undefined when `signal` aborts first.
 */
export async function splitIntoChunks(stream: Readable, startOffset: number, firstLine: number, signal: AbortSignal,
  chunkLines = BATCH_CHUNK_LINES): Promise<BatchChunkBounds[] | undefined> {
  const splitter = new ChunkSplitter(chunkLines);
  for await (const line of jsonlLines(stream, startOffset, firstLine)) {
    if (signal.aborted) return undefined;
    if (line.text.trim() !== '') splitter.add(line);
  }
  return signal.aborted ? undefined : splitter.chunks;
}
