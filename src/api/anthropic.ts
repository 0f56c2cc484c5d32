// Anthropic's conventions where the API speaks to Anthropic clients: the Messages routes answer
// errors in Anthropic's envelope, and an `anthropic-version` header asks for Anthropic's model
// objects. Every other route keeps the spec's envelope ({error: {message, type, param, code}}).

import type { ErrorEnvelope } from './errors.js';

/** `{type: "error", error: {type, message}}`; `param` and `code` ride along when known, as extras. */
export interface AnthropicErrorEnvelope {
  type: 'error';
  error: { type: string; message: string; param?: string; code?: string | number; [extra: string]: unknown };
}

/**
 * Anthropic's error type for an HTTP status: the names its API uses and its clients know
 * (https://docs.anthropic.com/en/api/errors). 4xx without a name of their own (408, 409, 415,
 * 422, ...) are invalid requests; 503 (shutting down, engine out of service) is Anthropic's
 * "overloaded" (retry later, elsewhere); any other 5xx is api_error.
 */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 401: return 'authentication_error';
    case 402: return 'billing_error';
    case 403: return 'permission_error';
    case 404: return 'not_found_error';
    case 413: return 'request_too_large';
    case 429: return 'rate_limit_error';
    case 503: case 529: return 'overloaded_error';
    default: return status >= 500 ? 'api_error' : 'invalid_request_error';
  }
}

/** The spec's envelope, as rendered for `status`, in Anthropic's shape (same message, param, code and extras). */
export function toAnthropicEnvelope(status: number, body: ErrorEnvelope): AnthropicErrorEnvelope {
  const { message, type: _specType, param, code, ...extras } = body.error;
  return {
    type: 'error',
    error: {
      type: anthropicErrorType(status),
      message,
      ...(param !== null && { param }),
      ...(code !== null && { code }),
      ...extras,
    },
  };
}

/**
 * Whether a request is to the Messages surface: `${prefix}/messages` or a path below it
 * (count_tokens, an unknown sub-path), judged from the raw URL so that errors raised before any
 * route matched (auth, body parsing, validation, unknown method) are covered too.
 */
export function isMessagesPath(url: string, prefix: string): boolean {
  const path = url.split('?')[0]!;
  const base = `${prefix}/messages`;
  return path === base || path === `${base}/` || path.startsWith(`${base}/`);
}

/** Anthropic's clients send `anthropic-version` on every request; OpenAI's never do. */
export function isAnthropicClient(headers: Record<string, string | string[] | undefined>): boolean {
  return headers['anthropic-version'] !== undefined;
}
