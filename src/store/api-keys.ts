// API keys: `sk-sluice-` + 32 random bytes (base64url). Only the SHA-256 hash is stored; a fast
// hash is right here because the key has 256 bits of entropy (nothing to brute-force), and the
// lookup runs on every request.

import { createHash, randomBytes } from 'node:crypto';
import type { ApiKeyInfo, Store } from './store.js';

export const KEY_PREFIX = 'sk-sluice-';
const DISPLAY_PREFIX_LENGTH = KEY_PREFIX.length + 6;

export function hashApiKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export interface CreatedKey {
  /** The plaintext key: shown once, never stored. */
  key: string;
  info: ApiKeyInfo;
}

/** `admin`: the key may also read every organization's usage (GET /v1/admin/usage). */
export async function createApiKey(store: Store, orgName: string, opts: { admin?: boolean } = {}): Promise<CreatedKey> {
  const org = await store.ensureOrganization(orgName);
  const key = KEY_PREFIX + randomBytes(32).toString('base64url');
  const id = `key_${randomBytes(8).toString('hex')}`;
  const createdAt = Math.floor(Date.now() / 1000);
  const prefix = key.slice(0, DISPLAY_PREFIX_LENGTH);
  await store.insertApiKey({ id, orgId: org.id, hash: hashApiKey(key), prefix, createdAt });
  if (opts.admin) await store.setApiKeyAdmin(id, true);
  return { key, info: { id, orgId: org.id, orgName: org.name, prefix, createdAt, revokedAt: null } };
}

/** Revokes by key id (`key_...`) or by the key itself. */
export async function revokeApiKey(store: Store, idOrKey: string): Promise<boolean> {
  const at = Math.floor(Date.now() / 1000);
  return store.revokeApiKey(idOrKey.startsWith(KEY_PREFIX) ? hashApiKey(idOrKey) : idOrKey, at);
}
