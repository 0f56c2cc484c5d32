// HTTP calls of the chaos clients. A call either got a whole reply (status and body), or it did
// not: the connection was refused or died with the server (`cut`), or nothing came back within
// the timeout. Only whole 2xx replies count as accepted requests.

export interface Reply {
  status: number;
  body: any;
  headers: Headers;
}

export type Outcome =
  | { kind: 'reply'; reply: Reply }
  | { kind: 'cut'; error: string }
  | { kind: 'timeout' };

/** A valid request to a live server finishes far sooner; longer is a hang worth reporting. */
export const REQUEST_TIMEOUT_MS = 30_000;

export interface CallOptions {
  json?: unknown;
  form?: FormData;
  headers?: Record<string, string>;
}

export async function call(baseUrl: string, key: string, method: string, path: string, opts: CallOptions = {}): Promise<Outcome> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}`, ...opts.headers };
  let body: string | FormData | undefined;
  if (opts.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.json);
  } else if (opts.form) {
    body = opts.form; // fetch sets the multipart content type with its boundary
  }
  try {
    const res = await fetch(`${baseUrl}${path}`, { method, headers, body, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    // The body too must arrive whole: a reply cut mid-body is not an answer.
    const text = await res.text();
    return { kind: 'reply', reply: { status: res.status, body: parseBody(res.headers, text), headers: res.headers } };
  } catch (err) {
    const e = err as Error & { cause?: { code?: string; message?: string } };
    if (e.name === 'TimeoutError') return { kind: 'timeout' };
    return { kind: 'cut', error: e.cause?.code ?? e.cause?.message ?? e.message };
  }
}

/** JSON replies parsed; anything else (file contents, JSONL) as text. */
function parseBody(headers: Headers, text: string): unknown {
  const type = (headers.get('content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/json') return text;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** A JSONL file with purpose `batch`, uploaded as multipart. */
export function batchUpload(text: string, filename: string): FormData {
  const form = new FormData();
  form.append('purpose', 'batch');
  form.append('file', new Blob([text], { type: 'application/jsonl' }), filename);
  return form;
}

/** Deep equality of JSON values (object key order ignored). */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((v, i) => sameJson(v, bb[i]));
  }
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && sameJson((a as any)[k], (b as any)[k]));
}

/** Runs `fn` over `items`, at most `limit` at a time. */
export async function forEachLimit<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const lanes = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) await fn(items[next++]!);
  });
  await Promise.all(lanes);
}
