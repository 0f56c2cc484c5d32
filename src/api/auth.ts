// Bearer-key authentication. `Authorization: Bearer <key>` is the spec's scheme; `x-api-key: <key>`
// is accepted too because that is how Anthropic's clients send the key, and they must work by
// setting only the base URL and the key. The key resolves to its organization (request.caller).

import type { FastifyRequest } from 'fastify';
import { hashApiKey } from '../store/api-keys.js';
import type { Store } from '../store/store.js';
import type { Caller } from '../serving/generation-request.js';
import { ApiError } from '../surfaces/errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated caller; set by the auth hook on every /v1 route but the OpenAPI document. */
    caller: Caller;
  }
}

const unauthorized = (message: string, code = 'invalid_api_key') => new ApiError(401, 'authentication_error', message, null, code);

function presentedKey(request: FastifyRequest): string {
  const header = request.headers.authorization;
  if (header !== undefined) {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!match) throw unauthorized('the Authorization header must be "Bearer <API key>"');
    return match[1]!;
  }
  const apiKey = request.headers['x-api-key'];
  if (typeof apiKey === 'string' && apiKey.trim() !== '') return apiKey.trim();
  throw unauthorized('no API key: send the header "Authorization: Bearer <API key>"', 'missing_api_key');
}

export function makeAuthHook(store: Store) {
  return async function authenticate(request: FastifyRequest): Promise<void> {
    const key = presentedKey(request);
    const info = await store.findActiveKeyByHash(hashApiKey(key));
    if (!info) throw unauthorized('the API key is not valid or has been revoked');
    request.caller = { orgId: info.orgId, orgName: info.orgName, keyId: info.id };
  };
}

/**
 * An onRequest hook for operator routes (/metrics, /dashboard/data): the caller needs an admin key
 * (no key or an unknown one is 401; a key that is not an admin key is 403 with `message`).
 */
export function makeAdminHook(store: Store, message: string) {
  const authenticate = makeAuthHook(store);
  return async function requireAdmin(request: FastifyRequest): Promise<void> {
    await authenticate(request);
    if (!(await store.isAdminKey(request.caller.keyId))) throw new ApiError(403, 'permission_error', message, null, 'admin_key_required');
  };
}
