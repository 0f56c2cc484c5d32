// The bytes of uploaded files, one plain file per file id under `<dataDir>/files/`, or under a files
// directory of its own (`--files-dir`: a volume every replica sees). Metadata lives in the Store;
// this module knows nothing of organizations or HTTP. Its interface is kept narrow (temp, commit,
// remove, open for reading) so that an object store could stand behind it later.
//
// Invariant: a name without the temp prefix exists only for a completely written file. Uploads are
// written to `.upload-<random>` in the same directory and renamed into place (atomic on one file
// system), so a crash or an aborted upload can leave only temp files, which `open` sweeps.
//
// Modes: the directory is 0700 and every file 0600 (uploads and batch results are the callers'
// data, readable by the service's user only).

import { randomBytes } from 'node:crypto';
import { createWriteStream, type ReadStream, type WriteStream } from 'node:fs';
import { chmod, mkdir, open, readdir, rename, rm, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';

const TEMP_PREFIX = '.upload-';
/** File ids are made by the API (`file-` + hex); anything else never reaches the file system. */
const FILE_ID = /^file-[0-9a-f]{8,64}$/;
/**
 * In a shared files directory, temp files untouched this long are swept at open. An upload in
 * progress keeps writing (a stalled body is cut off by the body timeout and the minimum body rate),
 * so only the leftovers of a crashed process get a day old.
 */
export const SHARED_TEMP_STALE_MS = 24 * 60 * 60 * 1000;

export interface FileStorageOptions {
  /**
   * The directory of the bytes when it is not `<dataDir>/files` (created 0700 if missing). It may
   * be shared by several processes (replicas on one volume): then only stale temp files are swept
   * at open, never another process's upload in progress.
   */
  filesDir?: string;
}

export interface TempFile {
  path: string;
  /** Open for writing; flushed to disk (fsync) before it closes, so a committed file survives a crash. */
  stream: WriteStream;
}

export interface OpenedFile {
  /** Closes its descriptor when it ends or is destroyed. */
  stream: ReadStream;
  bytes: number;
}

export class FileStorage {
  private constructor(readonly dir: string) {}

  /**
   * Creates the directory if needed (0700; an existing one is tightened to 0700) and removes temp
   * files left by uploads that never finished.
   */
  static async open(dataDir: string, opts: FileStorageOptions = {}): Promise<FileStorage> {
    const shared = opts.filesDir !== undefined;
    const dir = shared ? resolve(opts.filesDir!) : join(dataDir, 'files');
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    // NOTE: in <dataDir>/files every temp file is a dead one: one process owns the data directory
    // (its lock). A files directory of its own may be shared by running replicas: only stale ones.
    const staleBefore = Date.now() - SHARED_TEMP_STALE_MS;
    for (const name of await readdir(dir)) {
      if (!name.startsWith(TEMP_PREFIX)) continue;
      const path = join(dir, name);
      if (shared) {
        const info = await stat(path).catch(() => undefined);
        if (info === undefined || info.mtimeMs >= staleBefore) continue;
      }
      await rm(path, { force: true });
    }
    return new FileStorage(dir);
  }

  static isFileId(id: string): boolean {
    return FILE_ID.test(id);
  }

  /** A new, empty temp file in the files directory. */
  createTemp(): TempFile {
    const path = join(this.dir, `${TEMP_PREFIX}${randomBytes(12).toString('hex')}`);
    return { path, stream: createWriteStream(path, { flags: 'wx', flush: true, mode: 0o600 }) };
  }

  /** Removes a temp file; a missing one is fine (the upload may have failed before creating it). */
  async discardTemp(temp: TempFile): Promise<void> {
    // A stream destroyed before its open finished still creates the file, so wait for it to close.
    if (!temp.stream.closed) {
      const closed = new Promise<void>((resolve) => temp.stream.once('close', () => resolve()));
      temp.stream.destroy();
      await closed;
    }
    await rm(temp.path, { force: true });
  }

  /** Moves a completely written temp file to its id's name. */
  async commit(temp: TempFile, id: string): Promise<void> {
    await rename(temp.path, this.pathOf(id));
  }

  /** Removes a file's bytes; false when there were none. Readers that already opened it keep reading. */
  async remove(id: string): Promise<boolean> {
    try {
      await rm(this.pathOf(id));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
  }

  /**
   * Opens a file for reading, or undefined when its bytes are gone. The descriptor is opened before
   * the stream exists, so a delete that lands after this call cannot fail the read (POSIX unlink).
   * `start`: the byte offset the stream begins at (`bytes` is still the whole file's size).
   */
  async openRead(id: string, opts: { start?: number } = {}): Promise<OpenedFile | undefined> {
    let handle;
    try {
      handle = await open(this.pathOf(id), 'r');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw err;
    }
    try {
      const { size } = await handle.stat();
      return { stream: handle.createReadStream({ autoClose: true, start: opts.start ?? 0 }), bytes: size };
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  private pathOf(id: string): string {
    if (!FILE_ID.test(id)) throw new Error(`not a file id: ${JSON.stringify(id)}`);
    return join(this.dir, id);
  }
}
