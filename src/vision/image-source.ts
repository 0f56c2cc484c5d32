// An image reference from a request (`image_url`: a base64 data URI or a public http(s) URL,
// spec/inference-api.md) resolved to the image's bytes, safely. Decoding the bytes to pixels is
// image-decode.ts's job; this module only fetches, bounds and identifies them.
//
// Contract: loadImageBytes resolves with bytes whose format, sniffed from their magic numbers, is
// one of JPEG, PNG, WebP or GIF, and whose size is at most `maxBytes`. Every failure the caller
// caused (a malformed or oversized data URI, a refused or unreachable URL, a non-image answer) is
// a SluiceError 'invalid_request' (HTTP 400) naming `param`; the caller's own abort is a
// SluiceError 'cancelled'. Messages never echo a data URI's payload and truncate URLs.
//
// URLs are fetched under the webhooks' address policy (webhooks/address-policy.ts), applied the
// same way callback-sender.ts applies it: a literal IP host is checked before connecting, a name is
// resolved by `guardedLookup`, which checks EVERY address of the answer and hands the socket only
// checked ones (no DNS rebinding between check and connect), and each connection is fresh
// (`agent: false`) so a pooled socket never skips the lookup. Redirects are followed by hand, each
// hop's URL checked again as if it were the first.

import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import { SluiceError } from '../errors.js';
import { guardedLookup, RefusedDestinationError, refusedLiteralHost, type ResolveAll } from '../webhooks/callback-sender.js';

export type ImageMediaType = 'image/jpeg' | 'image/png' | 'image/webp' | 'image/gif';

export interface ImageBytes {
  bytes: Buffer;
  /** The format sniffed from the bytes (a data URI's declared type must agree with it). */
  mediaType: ImageMediaType;
}

export interface ImageLimits {
  /** Largest image, in encoded bytes (a data URI's decoded payload, a URL's body). */
  maxBytes: number;
  /** The whole fetch of a URL, redirects and body included. */
  fetchTimeoutMs: number;
  /** Redirects followed before giving up. */
  maxRedirects: number;
  /** Largest decoded image, width * height (image-decode.ts). */
  maxPixels: number;
}

export const DEFAULT_IMAGE_LIMITS: ImageLimits = {
  maxBytes: 20 * 1024 * 1024,
  fetchTimeoutMs: 10_000,
  maxRedirects: 3,
  maxPixels: 50_000_000,
};

export interface LoadImageOptions {
  /** The request field the reference came from, named in errors (e.g. 'input[0].content[1].image_url'). */
  param: string;
  /** Lets URLs reach private, loopback and link-local addresses (a trusted, self-hosted setup). */
  allowPrivateAddresses: boolean;
  limits?: Partial<ImageLimits>;
  /** The caller's abort (client gone, shutdown): rejects with SluiceError 'cancelled'. */
  signal?: AbortSignal;
  /** DNS resolution of URL hosts (dns.lookup by default; tests substitute answers). */
  resolveAll?: ResolveAll;
}

const MEDIA_TYPES: readonly ImageMediaType[] = ['image/jpeg', 'image/png', 'image/webp', 'image/gif'];
const FORMAT_NAME: Record<ImageMediaType, string> = {
  'image/jpeg': 'JPEG', 'image/png': 'PNG', 'image/webp': 'WebP', 'image/gif': 'GIF',
};
const FORMAT_LIST = 'JPEG, PNG, WebP or GIF';
const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);
/** Content types that say nothing about the body: the bytes decide. */
const GENERIC_CONTENT_TYPES = new Set(['application/octet-stream', 'binary/octet-stream']);

/** The image format of `bytes` by its magic numbers, or undefined when it is none of the four. */
export function sniffImageType(bytes: Uint8Array): ImageMediaType | undefined {
  const ascii = (from: number, to: number): string => String.fromCharCode(...bytes.subarray(from, to));
  if (bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return 'image/jpeg';
  if (bytes.length >= 8 && ascii(0, 8) === '\x89PNG\r\n\x1a\n') return 'image/png';
  if (bytes.length >= 12 && ascii(0, 4) === 'RIFF' && ascii(8, 12) === 'WEBP') return 'image/webp';
  if (bytes.length >= 6 && (ascii(0, 6) === 'GIF87a' || ascii(0, 6) === 'GIF89a')) return 'image/gif';
  return undefined;
}

/** At most `max` characters of `text`, quoted, for an error message. */
function quoted(text: string, max = 64): string {
  return JSON.stringify(text.length > max ? `${text.slice(0, max)}...` : text);
}

function invalid(param: string, message: string, cause?: unknown): SluiceError {
  return new SluiceError('invalid_request', `${param}: ${message}`, { param, cause });
}

/**
 * The image `ref` points at: a `data:<media-type>;base64,<data>` URI or an http(s) URL. Rejects
 * with SluiceError (see the file's contract).
 */
export async function loadImageBytes(ref: string, opts: LoadImageOptions): Promise<ImageBytes> {
  const limits: ImageLimits = { ...DEFAULT_IMAGE_LIMITS, ...opts.limits };
  if (/^data:/i.test(ref)) return decodeDataUri(ref, opts.param, limits.maxBytes);
  let url: URL;
  try {
    url = new URL(ref);
  } catch {
    throw invalid(opts.param, `must be an http(s) URL or a base64 data URI (got ${quoted(ref)})`);
  }
  checkScheme(url, opts.param);
  return fetchImage(url, opts, limits);
}

// --- data URIs ---------------------------------------------------------------------------------

function decodeDataUri(ref: string, param: string, maxBytes: number): ImageBytes {
  const comma = ref.indexOf(',');
  // The header is short; a missing comma within a sane distance means a malformed URI.
  if (comma < 0 || comma > 256) throw invalid(param, 'a data URI must have the form data:<media-type>;base64,<data>');
  const header = ref.slice(5, comma).split(';').map((p) => p.trim());
  const declaredRaw = (header[0] ?? '').toLowerCase();
  if (header.length < 2 || header[header.length - 1]!.toLowerCase() !== 'base64') {
    throw invalid(param, 'a data URI must be base64-encoded (data:<media-type>;base64,<data>)');
  }
  const declared = (declaredRaw === 'image/jpg' ? 'image/jpeg' : declaredRaw) as ImageMediaType;
  if (!MEDIA_TYPES.includes(declared)) {
    throw invalid(param, `the data URI's media type ${quoted(declaredRaw)} is not supported; use one of ${MEDIA_TYPES.join(', ')}`);
  }
  const payloadLength = ref.length - comma - 1;
  // Bound the size from the length alone, before scanning or decoding anything: 4 characters
  // carry 3 bytes, so a longer payload cannot decode to maxBytes or fewer.
  if (payloadLength > Math.ceil(maxBytes / 3) * 4) {
    throw invalid(param, `the image is larger than the ${maxBytes}-byte limit (about ${Math.floor(payloadLength / 4) * 3} bytes)`);
  }
  const payload = ref.slice(comma + 1);
  if (payload.length === 0) throw invalid(param, 'the data URI holds no data');
  // Node's decoder skips what is not base64; the data is valid exactly when encoding the bytes
  // gives it back. (Both in native code: a regular expression over megabytes held the event loop;
  // it runs only to word the refusal.)
  const bytes = Buffer.from(payload, 'base64');
  if (bytes.toString('base64') !== payload) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(payload)) {
      throw invalid(param, "the data URI's data is not valid base64 (only A-Z, a-z, 0-9, '+', '/' and '=' padding at the end are allowed)");
    }
    throw invalid(param, "the data URI's base64 data is not correctly padded (its length must be a multiple of 4)");
  }
  if (bytes.length > maxBytes) throw invalid(param, `the image is larger than the ${maxBytes}-byte limit (${bytes.length} bytes)`);
  const actual = sniffImageType(bytes);
  if (actual === undefined) throw invalid(param, `the data URI says ${declared} but its data is not a ${FORMAT_LIST} image`);
  if (actual !== declared) throw invalid(param, `the data URI says ${declared} but holds ${FORMAT_NAME[actual]} data`);
  return { bytes, mediaType: actual };
}

// --- URLs --------------------------------------------------------------------------------------

function checkScheme(url: URL, param: string): void {
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw invalid(param, `only http(s) URLs and base64 data URIs are supported (got a ${quoted(url.protocol, 16)} URL)`);
  }
}

type Hop =
  | { kind: 'redirect'; location: string }
  | { kind: 'body'; bytes: Buffer };

/** Why a hop failed in a way the caller should hear about as such. */
class HopError extends Error {}

async function fetchImage(first: URL, opts: LoadImageOptions, limits: ImageLimits): Promise<ImageBytes> {
  const { param } = opts;
  if (opts.signal?.aborted) throw new SluiceError('cancelled', 'the request was cancelled', { cause: opts.signal.reason });
  // One deadline over every hop and the body; the caller's abort feeds the same controller.
  const controller = new AbortController();
  const timeout = new Error('fetch timeout');
  const timer = setTimeout(() => controller.abort(timeout), limits.fetchTimeoutMs);
  const onCallerAbort = (): void => controller.abort(opts.signal!.reason);
  opts.signal?.addEventListener('abort', onCallerAbort, { once: true });
  const lookup = guardedLookup(opts.allowPrivateAddresses, opts.resolveAll);
  try {
    let url = first;
    for (let redirects = 0; ; redirects++) {
      const refused = refusedLiteralHost(url, opts.allowPrivateAddresses);
      if (refused !== undefined) throw invalid(param, `refused: the URL's host ${refused}; image URLs must reach a public address`);
      const hop = await getOnce(url, controller.signal, lookup, limits.maxBytes);
      if (hop.kind === 'body') {
        const mediaType = sniffImageType(hop.bytes);
        if (mediaType === undefined) throw invalid(param, `the URL's content is not a ${FORMAT_LIST} image`);
        return { bytes: hop.bytes, mediaType };
      }
      if (redirects >= limits.maxRedirects) throw invalid(param, `the URL redirected more than ${limits.maxRedirects} times`);
      try {
        url = new URL(hop.location, url);
      } catch {
        throw invalid(param, `the URL redirected to an invalid URL ${quoted(hop.location)}`);
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        throw invalid(param, `the URL redirected to a ${quoted(url.protocol, 16)} URL; only http(s) is followed`);
      }
    }
  } catch (err) {
    if (err instanceof SluiceError) throw err;
    if (controller.signal.aborted) {
      if (controller.signal.reason === timeout) {
        throw invalid(param, `fetching the image took longer than ${limits.fetchTimeoutMs} ms`, err);
      }
      throw new SluiceError('cancelled', 'the request was cancelled', { cause: opts.signal?.reason });
    }
    if (err instanceof RefusedDestinationError) {
      throw invalid(param, `refused: the URL's host ${err.message}; image URLs must reach a public address`, err);
    }
    if (err instanceof HopError) throw invalid(param, err.message, err);
    // Node's network messages name their code ("connect ECONNREFUSED 1.2.3.4:80", "getaddrinfo ENOTFOUND x").
    const { code, message } = err as NodeJS.ErrnoException;
    throw invalid(param, `could not fetch the image: ${code && !message.includes(code) ? `${code} ${message}` : message}`, err);
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onCallerAbort);
  }
}

/**
 * One GET of `url`: its redirect target, or its body (at most `maxBytes`). Rejects with HopError
 * for an answer that is no image (status, content type, size), with the abort reason when
 * `signal` fires, and with the network error (RefusedDestinationError from the lookup) otherwise.
 */
function getOnce(url: URL, signal: AbortSignal, lookup: LookupFunction, maxBytes: number): Promise<Hop> {
  const send = url.protocol === 'https:' ? https.request : http.request;
  return new Promise<Hop>((resolve, reject) => {
    let settled = false;
    const finish = (outcome: () => void): void => {
      if (settled) return;
      settled = true;
      signal.removeEventListener('abort', onAbort);
      outcome();
    };
    const fail = (err: unknown): void => finish(() => {
      reject(err);
      req.destroy();
    });
    const onAbort = (): void => fail(signal.reason);
    const req = send(url, {
      method: 'GET',
      headers: { accept: MEDIA_TYPES.join(', '), 'user-agent': 'sluice (image fetch)' },
      lookup,
      // A fresh connection per hop: a pooled socket would skip the lookup's check.
      agent: false,
    }, (res) => {
      const status = res.statusCode ?? 0;
      if (REDIRECT_STATUSES.has(status)) {
        const location = res.headers.location;
        res.resume();
        if (!location) return fail(new HopError(`the URL answered ${status} without a Location header`));
        return finish(() => {
          resolve({ kind: 'redirect', location });
          req.destroy();
        });
      }
      if (status < 200 || status > 299) {
        return fail(new HopError(`fetching the image failed: the server answered ${status}${res.statusMessage ? ` ${res.statusMessage}` : ''}`));
      }
      const contentType = (res.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
      if (contentType && !contentType.startsWith('image/') && !GENERIC_CONTENT_TYPES.has(contentType)) {
        return fail(new HopError(`the URL serves ${quoted(contentType)}, not an image`));
      }
      const declaredLength = Number(res.headers['content-length']);
      if (Number.isFinite(declaredLength) && declaredLength > maxBytes) {
        return fail(new HopError(`the image is larger than the ${maxBytes}-byte limit (${declaredLength} bytes)`));
      }
      const chunks: Buffer[] = [];
      let received = 0;
      res.on('data', (chunk: Buffer) => {
        received += chunk.length;
        if (received > maxBytes) return fail(new HopError(`the image is larger than the ${maxBytes}-byte limit`));
        chunks.push(chunk);
      });
      res.on('end', () => {
        if (received === 0) return fail(new HopError('the URL answered with an empty body'));
        finish(() => resolve({ kind: 'body', bytes: Buffer.concat(chunks, received) }));
      });
      res.on('error', fail);
      res.on('close', () => {
        if (!res.complete) fail(new HopError('the connection closed before the whole image arrived'));
      });
    });
    req.on('error', fail);
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    req.end();
  });
}
