// `--database-url` / the `databaseUrl` option: which PostgreSQL database the service's store is in.
// Only postgres:// and postgresql:// URLs are accepted. The password never appears in a log or an
// error line: every message names the URL through redactDatabaseUrl, and a driver's error text is
// scrubbed of the password too before it is shown.

import { SluiceError } from '../errors.js';
import { PostgresStore, type PostgresStoreOptions } from './postgres-store.js';

/**
 * The URL as given, when it is a postgres:// or postgresql:// URL (a host, or none with
 * ?host=/var/run/postgresql for a Unix socket); SluiceError invalid_argument otherwise.
 */
export function checkDatabaseUrl(raw: string, param = 'database-url'): string {
  // Checked on the text: pg also takes what WHATWG URLs refuse (a password without a host, for a socket).
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(raw)?.[1]?.toLowerCase();
  if (scheme !== 'postgres' && scheme !== 'postgresql') {
    // Named by its scheme only, never in full (it may hold a password).
    throw new SluiceError('invalid_argument',
      `--${param} must be a postgres:// or postgresql:// URL (postgres://user:password@host:5432/database), got ${
        scheme === undefined ? 'something that is not a URL' : `a ${scheme}:// URL`}`, { param });
  }
  return raw;
}

/** The URL with its password replaced by "***" (the rest as given): safe for logs and errors. */
export function redactDatabaseUrl(raw: string): string {
  try {
    const url = new URL(raw);
    if (url.password !== '') url.password = '***';
    // A password in the query string (?password=...) is redacted as well.
    if (url.searchParams.has('password')) url.searchParams.set('password', '***');
    return url.toString();
  } catch {
    // Not a WHATWG URL (postgres://user:password@/db?host=/socket): cut the password out of the text.
    return raw.replace(/^([a-z][a-z0-9+.-]*:\/\/[^:@/]*):[^@/]*@/i, '$1:***@').replace(/([?&]password=)[^&]*/gi, '$1***');
  }
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** `text` with every occurrence of the URL's password replaced by "***". */
export function scrubPassword(text: string, raw: string): string {
  let secrets: string[] = [];
  try {
    const url = new URL(raw);
    secrets = [url.password, safeDecode(url.password), url.searchParams.get('password') ?? ''];
  } catch {
    const m = /^[a-z][a-z0-9+.-]*:\/\/[^:@/]*:([^@/]*)@/i.exec(raw);
    secrets = m?.[1] ? [m[1], safeDecode(m[1])] : [];
  }
  let out = text;
  for (const secret of secrets) if (secret.length > 0) out = out.split(secret).join('***');
  return out;
}

/** How long the first connection may take before startup fails (an unreachable host must not hang it). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

/** A driver error's text: an AggregateError (every address refused) has an empty message of its own. */
function describeError(err: unknown): string {
  const e = err as Error & { code?: string; errors?: unknown[] };
  if (e?.message) return e.message;
  if (Array.isArray(e?.errors) && e.errors.length > 0) return e.errors.map((x) => describeError(x)).join('; ');
  return e?.code ?? String(err);
}

/**
 * Opens the PostgreSQL store at `url` (checked first), or throws SluiceError store_unavailable
 * saying which database (password redacted) could not be reached and why.
 */
export async function openPostgresStore(url: string, opts: PostgresStoreOptions = {}): Promise<PostgresStore> {
  checkDatabaseUrl(url);
  try {
    return await PostgresStore.open(url, { connectTimeoutMs: DEFAULT_CONNECT_TIMEOUT_MS, ...opts });
  } catch (err) {
    const why = scrubPassword(describeError(err), url);
    throw new SluiceError('store_unavailable', `cannot open the PostgreSQL database ${redactDatabaseUrl(url)}: ${why}`);
  }
}
