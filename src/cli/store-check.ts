// `sluice keys` and `sluice usage` open the store of a data directory that `sluice serve` made.
// A directory without one is most likely a mistyped --data-dir (or a server not started yet):
// they say so instead of creating an empty store there.

import { existsSync } from 'node:fs';
import { storePath } from '../service.js';

export function storeExists(dataDir: string): boolean {
  return existsSync(storePath(dataDir));
}

export function noStoreMessage(dataDir: string): string {
  return `no store in ${storePath(dataDir)}: is --data-dir right? (sluice serve makes it on its first start)`;
}

export function warnNoStore(dataDir: string): void {
  process.stderr.write(`sluice: warning: ${noStoreMessage(dataDir)}\n`);
}
