// What the Messages surface keeps of Anthropic's conventions inside the spec's shapes. Its errors
// are the spec's envelope like every other route's ({error: {message, type, param, code}} and no
// other top-level field); only the inner `type` is the name Anthropic's API gives the status,
// which Anthropic's clients read (error.type) to raise their typed errors. Models are listed in
// the spec's shape for every client, whatever headers it sends.

import type { ErrorEnvelope } from '../errors.js';

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

/**
 * The envelope a Messages route answers for `status`: the same object, same message, param, code
 * and extras (retry_after), with Anthropic's `type` for the status. Still the spec's envelope.
 */
export function toMessagesEnvelope(status: number, body: ErrorEnvelope): ErrorEnvelope {
  return { error: { ...body.error, type: anthropicErrorType(status) } };
}
