// Helpers the surface adapters share: ids, image URL checks, metadata and sampling fields.

import { randomBytes } from 'node:crypto';
import { invalidRequest } from '../errors.js';

/** `resp_` + 32 hex digits, etc. Random, so ids reveal nothing about volume or order. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

export const nowSeconds = (): number => Math.floor(Date.now() / 1000);

const DATA_URI = /^data:([a-z0-9.+-]+\/[a-z0-9.+-]+);base64,([A-Za-z0-9+/=\s]+)$/i;

/** An image reference must be a public http(s) URL or a base64 data URI; anything else is a 400. */
export function checkImageUrl(url: unknown, param: string): void {
  if (typeof url !== 'string' || url === '') throw invalidRequest(`${param} is required: an http(s) URL or a base64 data URI`, param);
  if (url.startsWith('data:')) {
    if (!DATA_URI.test(url)) throw invalidRequest(`${param} must be a data URI of the form data:<media-type>;base64,<data>`, param);
    return;
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw invalidRequest(`${param} must be an http(s) URL or a base64 data URI`, param);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw invalidRequest(`${param} must be an http(s) URL or a base64 data URI (got a ${parsed.protocol} URL)`, param);
  }
}

/** The metadata key that picks the completion window. */
export function completionWindowOf(metadata: Record<string, string> | null | undefined): string | undefined {
  return metadata?.['completion_window'];
}

/** stream=true on an endpoint without streaming: its own clear 400 rather than a schema mismatch. */
export function refuseStreaming(body: unknown): void {
  if ((body as { stream?: unknown } | null)?.stream === true) {
    throw invalidRequest('streaming is not available on this endpoint: send stream=false or leave it out', 'stream', 'unsupported_parameter');
  }
}

/**
 * Runs on the raw body, before schema validation, so that input kinds the service refuses (audio,
 * files, item references, tool blocks) get a 400 saying why instead of a schema mismatch.
 * `refused` maps a `type` to the reason. Checks each item's content parts, and with
 * `checkItems` the items' own `type` too (Responses input items).
 */
export function refuseListedTypes(items: unknown, base: string, refused: Readonly<Record<string, string>>,
  checkItems = false): void {
  if (!Array.isArray(items)) return;
  const check = (value: unknown, param: string) => {
    const type = (value as { type?: unknown } | null)?.type;
    if (typeof type === 'string' && Object.hasOwn(refused, type)) {
      throw invalidRequest(`${param} is of type ${type}: ${refused[type]}`, `${param}.type`, 'unsupported_input');
    }
  };
  items.forEach((item, i) => {
    if (checkItems) check(item, `${base}[${i}]`);
    const content = (item as { content?: unknown } | null)?.content;
    if (Array.isArray(content)) content.forEach((part, j) => check(part, `${base}[${i}].content[${j}]`));
  });
}
