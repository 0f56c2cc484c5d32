// Writes a batch's output and error files from its result rows, in input line order, a page of rows
// at a time (memory does not grow with the number of lines).
//
// Idempotent across crashes: the file ids are derived from the batch id, each file is written to a
// temp file and renamed into place, and the caller records the File rows and the terminal status
// in one store transaction afterwards. A crash before that transaction leaves at most complete
// files under those ids, which the next attempt overwrites; no line can appear twice.

import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { finished } from 'node:stream/promises';
import type { FileStorage, TempFile } from '../files/file-storage.js';
import type { BatchRecord } from '../store/batch-records.js';
import type { FileRecord, Store } from '../store/store.js';

/** Purpose of the files a batch produces (OpenAI's). */
export const BATCH_OUTPUT_PURPOSE = 'batch_output';

/** Result rows read per store call. */
const PAGE_ROWS = 256;

/** `file-` + 24 hex digits, fixed per batch and kind, so a retried finalize writes the same files. */
export function resultFileId(batchId: string, kind: 'output' | 'error'): string {
  return `file-${createHash('sha256').update(`${batchId}\0${kind}`).digest('hex').slice(0, 24)}`;
}

class ResultWriter {
  private temp: TempFile | undefined;
  bytes = 0;

  constructor(private readonly storage: FileStorage) {}

  async write(line: string): Promise<void> {
    this.temp ??= this.storage.createTemp();
    const data = Buffer.from(`${line}\n`, 'utf8');
    this.bytes += data.length;
    if (!this.temp.stream.write(data)) await once(this.temp.stream, 'drain');
  }

  /** Renames the written file to `id`; false when nothing was written (no file is made). */
  async commit(id: string): Promise<boolean> {
    if (!this.temp) return false;
    this.temp.stream.end();
    await finished(this.temp.stream);
    await this.storage.commit(this.temp, id);
    this.temp = undefined;
    return true;
  }

  async discard(): Promise<void> {
    if (this.temp) await this.storage.discardTemp(this.temp);
  }
}

export interface WrittenResults {
  /** The File rows to record with the terminal status (one per non-empty file). */
  files: FileRecord[];
  outputFileId: string | null;
  errorFileId: string | null;
}

export async function writeResultFiles(store: Store, storage: FileStorage, batch: BatchRecord): Promise<WrittenResults> {
  const output = new ResultWriter(storage);
  const errors = new ResultWriter(storage);
  try {
    let afterLine = 0;
    for (;;) {
      const rows = await store.listBatchResults(batch.id, afterLine, PAGE_ROWS);
      for (const row of rows) await (row.ok ? output : errors).write(row.line);
      if (rows.length < PAGE_ROWS) break;
      afterLine = rows[rows.length - 1]!.lineNo;
    }
    const now = Math.floor(Date.now() / 1000);
    const files: FileRecord[] = [];
    const commit = async (writer: ResultWriter, kind: 'output' | 'error'): Promise<string | null> => {
      const id = resultFileId(batch.id, kind);
      if (!(await writer.commit(id))) return null;
      files.push({
        id, orgId: batch.orgId, bytes: writer.bytes, createdAt: now, filename: `${batch.id}_${kind}.jsonl`,
        purpose: BATCH_OUTPUT_PURPOSE, status: 'uploaded', statusDetails: null,
      });
      return id;
    };
    const outputFileId = await commit(output, 'output');
    const errorFileId = await commit(errors, 'error');
    return { files, outputFileId, errorFileId };
  } catch (err) {
    await output.discard();
    await errors.discard();
    throw err;
  }
}
