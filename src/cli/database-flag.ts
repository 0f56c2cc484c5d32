// `--database-url URL` (or SLUICE_DATABASE_URL, which keeps the password out of the process list)
// for `sluice serve`, `sluice keys` and `sluice usage`: the PostgreSQL database of a deployment
// of several replicas. Without it they use the SQLite file in the data directory, as always.

import { checkDatabaseUrl, openPostgresStore } from '../store/database-url.js';
import { SqliteStore } from '../store/sqlite-store.js';
import type { Store } from '../store/store.js';
import { storePath } from '../service.js';

export const DATABASE_URL_ENV = 'SLUICE_DATABASE_URL';

export const DATABASE_URL_HELP = `  --database-url URL   keep keys, responses, files' metadata, batches and usage in PostgreSQL
                       (postgres://user:password@host:5432/database) instead of the SQLite file
                       in the data directory; SLUICE_DATABASE_URL does the same without putting
                       the password on the command line`;

/** The checked URL from the flag or the environment, or undefined for SQLite. */
export function databaseUrlFlag(flag: string | undefined): string | undefined {
  const raw = flag ?? (process.env[DATABASE_URL_ENV] || undefined);
  return raw === undefined ? undefined : checkDatabaseUrl(raw);
}

/** The store `sluice keys` / `sluice usage` work on: PostgreSQL at `url`, else the data directory's SQLite file. */
export async function openCliStore(url: string | undefined, dataDir: string): Promise<Store> {
  return url === undefined ? new SqliteStore(storePath(dataDir)) : openPostgresStore(url);
}
