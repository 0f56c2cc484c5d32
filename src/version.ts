// The package's version, read from its package.json (found upward from this file, which runs as
// src/version.ts under vitest and as dist/src/version.js when built).

import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export function sluiceVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: unknown; version?: unknown };
      if (pkg.name === 'sluice' && typeof pkg.version === 'string') return pkg.version;
    }
    dir = dirname(dir);
  }
  throw new Error('cannot find the sluice package.json');
}
