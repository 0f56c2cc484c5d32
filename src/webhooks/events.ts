// Which objects trigger a completion callback, and where it goes (spec, "Events"). Pure functions:
// the dispatcher persists and sends; the routes only hand over the final object and its metadata.
//
// metadata.webhook_token is a credential, not data: no object the service returns, stores or
// sends carries it (withoutWebhookToken); only the request's metadata (and so a background job's
// stored request) and the pending delivery row hold it.

import { isSluiceError } from '../errors.js';

/** Where a callback goes and the bearer credential it carries (null: no Authorization header). */
export interface WebhookTarget {
  url: string;
  token: string | null;
}

/** Why metadata names no usable target: no URL at all, or a URL / token that cannot be sent. */
export type NoTarget = 'no_url' | 'unusable_url' | 'unusable_token';

/** Printable ASCII, not ending in whitespace (fetch would trim it and send a different token). */
const SENDABLE_TOKEN = /^[\x20-\x7e]*[\x21-\x7e]$/;

/**
 * The target named by request metadata, or why there is none. No callback is sent when the URL is
 * missing, not parsable, not http(s), or carries credentials (fetch refuses those), nor when the
 * token cannot travel in an HTTP header (non-ASCII, control characters, trailing space): sending
 * without it would be refused by the receiver anyway. None of these affect the request.
 * An empty webhook_token counts as not set: `Bearer ` with no credential authenticates nothing.
 */
export function webhookTargetOf(metadata: unknown): WebhookTarget | NoTarget {
  if (metadata === null || typeof metadata !== 'object') return 'no_url';
  const { completion_webhook: url, webhook_token: token } = metadata as Record<string, unknown>;
  if (url === undefined || url === '') return 'no_url';
  if (typeof url !== 'string' || !URL.canParse(url)) return 'unusable_url';
  const parsed = new URL(url);
  if ((parsed.protocol !== 'http:' && parsed.protocol !== 'https:') || parsed.username !== '' || parsed.password !== '') return 'unusable_url';
  if (typeof token !== 'string' || token === '') return { url, token: null };
  return SENDABLE_TOKEN.test(token) ? { url, token } : 'unusable_token';
}

/** The metadata key that holds the callback's bearer credential. */
const TOKEN_KEY = 'webhook_token';

/**
 * `metadata` without the webhook token, for echoing in objects (a new object when it had one).
 * Anything that is not a plain object comes back as it is.
 */
export function publicMetadata<T>(metadata: T): T {
  if (metadata === null || typeof metadata !== 'object' || Array.isArray(metadata) || !(TOKEN_KEY in metadata)) return metadata;
  const { [TOKEN_KEY]: _token, ...rest } = metadata as Record<string, unknown>;
  return rest as T;
}

/** An object whose `metadata` no longer holds the webhook token (the same object when it held none). */
export function withoutWebhookToken<T extends Record<string, unknown>>(body: T): T {
  const metadata = body['metadata'];
  const cleaned = publicMetadata(metadata);
  return cleaned === metadata ? body : { ...body, metadata: cleaned };
}

/**
 * Statuses that send no callback. The spec's trigger is "a terminal status: completed or failed".
 * NOTE: `incomplete` (the token limit cut the output) is a finished generation with a usable
 * result, so it is sent like completed; `cancelled` is not: the caller itself asked to stop (or
 * disconnected), so there is nobody to tell. Objects without a status (chat.completion) are sent.
 */
const SILENT_STATUSES = new Set(['in_progress', 'queued', 'cancelled']);

export function sendsCallback(body: Record<string, unknown>): boolean {
  return !(typeof body['status'] === 'string' && SILENT_STATUSES.has(body['status']));
}

/**
 * The callback body of a chat completion whose generation failed, or undefined when it was
 * cancelled (its client went away). Chat Completions has no stored object and no failed shape of
 * its own, so the receiver gets the chat.completion envelope it would have got (id, object,
 * created, model, no choices) with the Response object's `status: failed` and `error: {code,
 * message}`, which is how the spec says a failure is recognised. Codes as on Responses: an
 * engine fault is `server_error` without internals.
 */
export function failedChatCompletion(parts: { id: string; created: number; model: string }, err: unknown): (Record<string, unknown> & { id: string }) | undefined {
  if (isSluiceError(err) && err.code === 'cancelled') return undefined;
  const error = isSluiceError(err) && err.code !== 'engine_error'
    ? { code: err.code, message: err.message }
    : { code: 'server_error', message: 'the engine failed while generating this completion' };
  return { ...parts, object: 'chat.completion', status: 'failed', choices: [], error };
}
