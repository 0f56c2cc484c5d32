// The one place errors become HTTP: every failure leaves as {error: {message, type, param, code}}
// with its status. SluiceErrors from the engine are mapped by code; fastify's own errors
// (malformed JSON, wrong content type, body too large, unknown route) keep their status; anything
// else is a 500 whose message hides internals.

import { isSluiceError } from '../errors.js';

export type ErrorType =
  | 'invalid_request_error'   // 400, 404 of a route, 405, 409, 413, 415
  | 'authentication_error'    // 401
  | 'permission_error'        // 403
  | 'not_found_error'         // 404 for an id
  | 'conflict_error'          // 409
  | 'request_too_large'       // 413
  | 'rate_limit_error'        // 429
  | 'server_error'            // 500, 503
  ;

export interface ErrorEnvelope {
  /** The spec's four fields; some errors add their own (retry_after on a 429). */
  error: { message: string; type: string; param: string | null; code: string | null; [extra: string]: unknown };
}

/** An expected API failure: thrown by routes and hooks, rendered by renderError. */
export class ApiError extends Error {
  constructor(
    readonly statusCode: number,
    readonly type: ErrorType,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

export const invalidRequest = (message: string, param: string | null = null, code: string | null = null) =>
  new ApiError(400, 'invalid_request_error', message, param, code);

export const notFound = (message: string, param: string | null = null, code: string | null = 'not_found') =>
  new ApiError(404, 'not_found_error', message, param, code);

/** SluiceError codes of the engine facade -> status and envelope code. Unlisted codes are 500. */
const SLUICE_CODE_STATUS: Record<string, number> = {
  invalid_request: 400,
  context_length_exceeded: 400,
  request_too_large: 400,
  no_chat_template: 400,
  chat_template_error: 400,
  model_not_found: 404,
  unsupported_completion_window: 400,
  image_input_unsupported: 400,
  unsupported_input: 400,
  chat_unsupported: 400,
  tools_unsupported: 400,
  input_too_long: 400,
  rate_limit_exceeded: 429,
  cancelled: 499,
  engine_disposed: 503,
  engine_broken: 503,
};

/** fastify error codes -> envelope code (status comes from the error). */
const FASTIFY_CODES: Record<string, string> = {
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_content_length',
  FST_ERR_CTP_BODY_TOO_LARGE: 'request_too_large',
  FST_REQ_FILE_TOO_LARGE: 'file_too_large',
  FST_INVALID_MULTIPART_CONTENT_TYPE: 'unsupported_media_type',
};

export interface RenderedError {
  statusCode: number;
  body: ErrorEnvelope;
  /** Headers the reply must carry (Retry-After of a 429); both error handlers apply them. */
  headers?: Record<string, string>;
  /** True when the error is a bug or an internal failure that should be logged with its stack. */
  internal: boolean;
}

export function envelope(type: string, message: string, param: string | null = null, code: string | null = null): ErrorEnvelope {
  return { error: { message, type, param, code } };
}

export function typeForStatus(status: number): ErrorType {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 409) return 'conflict_error';
  if (status === 413) return 'request_too_large';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

export function renderError(err: unknown): RenderedError {
  if (err instanceof ApiError) {
    return { statusCode: err.statusCode, body: envelope(err.type, err.message, err.param, err.code), internal: false };
  }
  if (isSluiceError(err)) {
    const status = SLUICE_CODE_STATUS[err.code] ?? 500;
    if (err.code === 'engine_broken') {
      // Its message is written to be shown to clients (what broke, that a restart is needed).
      return { statusCode: 503, body: envelope('server_error', err.message, null, err.code), internal: false };
    }
    if (status === 429) return renderRateLimit(err);
    if (status >= 500) {
      return {
        statusCode: status,
        body: envelope('server_error', status === 503 ? 'the model is shutting down; retry shortly' : 'the engine failed to run this request', null, err.code),
        internal: status === 500,
      };
    }
    return { statusCode: status, body: envelope(typeForStatus(status), err.message, err.param ?? null, err.code), internal: false };
  }
  const e = err as { statusCode?: unknown; code?: unknown; message?: unknown };
  // fastify's own client errors (JSON parse, content type, body limit) carry a 4xx statusCode.
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    const code = typeof e.code === 'string' ? (FASTIFY_CODES[e.code] ?? (e.code.startsWith('FST_') ? null : e.code)) : null;
    const isJsonSyntax = err instanceof SyntaxError || e.code === 'FST_ERR_CTP_INVALID_JSON_BODY';
    const message = isJsonSyntax ? `the request body is not valid JSON: ${String(e.message)}` : String(e.message);
    return {
      statusCode: e.statusCode,
      body: envelope(typeForStatus(e.statusCode), message, null, isJsonSyntax ? 'invalid_json' : code),
      internal: false,
    };
  }
  return { statusCode: 500, body: envelope('server_error', 'internal server error', null, 'internal_error'), internal: true };
}

/**
 * rate_limit_exceeded: a 429 whose error carries, when the limiter knows it, the seconds until a
 * retry may succeed (`retryAfterSeconds` on the error): sent as `Retry-After` (whole seconds,
 * rounded up) and as `error.retry_after`.
 */
function renderRateLimit(err: Error & { code: string; param?: string | undefined }): RenderedError {
  const body = envelope('rate_limit_error', err.message, err.param ?? null, err.code);
  const seconds = (err as { retryAfterSeconds?: unknown }).retryAfterSeconds;
  if (typeof seconds !== 'number' || !Number.isFinite(seconds) || seconds < 0) return { statusCode: 429, body, internal: false };
  const whole = Math.ceil(seconds);
  body.error['retry_after'] = whole;
  return { statusCode: 429, body, headers: { 'retry-after': String(whole) }, internal: false };
}
