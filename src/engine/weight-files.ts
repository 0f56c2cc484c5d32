// Reading a checkpoint's weight files ahead of the native load, to show progress while a large
// checkpoint comes off the disk. The native engine memory-maps the files and reports nothing
// until it returns: on the CPU backend pages are read at their first use (so the first requests
// would pay for the disk), on CUDA the upload reads them all inside one call. Read once ahead
// through the page cache, the load then finds them in memory, and the wait has a percentage.

import { open, readFile, stat } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';

/** Checkpoints smaller than this load in about a second: no read-ahead, no progress. */
export const READ_AHEAD_MIN_BYTES = 256 * 1024 * 1024;

/** Read-ahead is skipped when the weights exceed this share of the machine's memory (they would evict themselves). */
const MAX_SHARE_OF_MEMORY = 0.8;

const CHUNK_BYTES = 8 * 1024 * 1024;

/**
 * The safetensors files the native loader opens for `modelDir` (the shards named by
 * model.safetensors.index.json, else model.safetensors) with their sizes. Empty when they cannot
 * be listed: the native load then reports what is wrong with them.
 */
export async function weightFiles(modelDir: string): Promise<Array<{ path: string; bytes: number }>> {
  let names: string[];
  try {
    const index = JSON.parse(await readFile(join(modelDir, 'model.safetensors.index.json'), 'utf8')) as { weight_map?: unknown };
    const map = index.weight_map;
    if (map === null || typeof map !== 'object') return [];
    names = [...new Set(Object.values(map as Record<string, unknown>))].filter((n): n is string => typeof n === 'string' && !n.includes('/')).sort();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return [];
    names = ['model.safetensors'];
  }
  const files: Array<{ path: string; bytes: number }> = [];
  for (const name of names) {
    const st = await stat(join(modelDir, name)).catch(() => undefined);
    if (!st?.isFile()) return [];
    files.push({ path: join(modelDir, name), bytes: st.size });
  }
  return files;
}

/**
 * Reads the weight files of `modelDir` once, calling `onProgress(doneBytes, totalBytes)` from 0 to
 * the total, when they add up to at least `minBytes` and fit in the machine's memory; otherwise
 * does nothing. The reads run on the libuv pool, never blocking the event loop. Returns the bytes read.
 */
export async function readWeightsAhead(modelDir: string, onProgress: (doneBytes: number, totalBytes: number) => void,
  minBytes = READ_AHEAD_MIN_BYTES): Promise<number> {
  const files = await weightFiles(modelDir);
  const total = files.reduce((sum, f) => sum + f.bytes, 0);
  if (files.length === 0 || total < minBytes || total > os.totalmem() * MAX_SHARE_OF_MEMORY) return 0;
  const buffer = Buffer.allocUnsafe(CHUNK_BYTES);
  let done = 0;
  onProgress(0, total);
  for (const file of files) {
    const handle = await open(file.path, 'r');
    try {
      for (;;) {
        const { bytesRead } = await handle.read(buffer, 0, CHUNK_BYTES, null);
        if (bytesRead === 0) break;
        done += bytesRead;
        onProgress(Math.min(done, total), total);
      }
    } finally {
      await handle.close();
    }
  }
  return done;
}
