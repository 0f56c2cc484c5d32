// The deployment's secret key of the prefix-cache block hash (SipHash-2-4, native/src/kv/
// block_hash.h): 16 random bytes kept as 32 hex digits in <data-dir>/prefix-hash.key (0600),
// made at the first start and read at every later one. Secret so that callers cannot predict or
// collide block hashes; persistent so that hashes stay the same across restarts (and, once
// replicas share a data volume, across replicas).

import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SluiceError } from '../errors.js';

const FILE = 'prefix-hash.key';
const KEY = /^[0-9a-f]{32}$/;

export function loadOrCreatePrefixHashKey(dataDir: string): string {
  const path = join(dataDir, FILE);
  try {
    // 'wx': only if there is none yet, so two starts can never write two different keys.
    writeFileSync(path, `${randomBytes(16).toString('hex')}\n`, { flag: 'wx', mode: 0o600 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const key = readFileSync(path, 'utf8').trim();
  if (!KEY.test(key)) {
    throw new SluiceError('invalid_argument', `${path} must hold 32 lowercase hexadecimal digits (the prefix hash key); ` +
      'delete it to make a new one');
  }
  return key;
}
