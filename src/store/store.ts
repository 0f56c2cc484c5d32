// The persistence interface: organizations and their API keys, stored responses, file metadata and
// idempotency records. SQLite implements it for a single process (sqlite-store.ts); a PostgreSQL
// store shared by replicas will implement the same methods. Methods are async so that a network
// store fits; objects cross as plain JSON-compatible values.
//
// Ownership: every stored object carries its organization id, and every read takes one: an object
// of another organization is simply not found.

export interface Organization {
  id: string;
  name: string;
  /** Unix seconds. */
  createdAt: number;
}

export interface ApiKeyInfo {
  id: string;
  orgId: string;
  orgName: string;
  /** The first characters of the key, for recognising it in listings; never enough to use it. */
  prefix: string;
  createdAt: number;
  revokedAt: number | null;
}

/** A response object as the API returns it (Responses surface). */
export type ResponseBody = Record<string, unknown> & { id: string; status: string };

export interface FileRecord {
  id: string;
  orgId: string;
  bytes: number;
  createdAt: number;
  filename: string;
  purpose: string;
  status: string;
  statusDetails: string | null;
}

export type IdempotencyBegin =
  /** The key is new: the caller runs the request and then calls completeIdempotency. */
  | { state: 'new' }
  /** The same key and body are being processed right now by another request. */
  | { state: 'in_progress' }
  /** Done before: replay this status and body. */
  | { state: 'done'; statusCode: number; body: unknown }
  /** The key was used with a different request body. */
  | { state: 'mismatch' };

export interface Store {
  // Organizations and keys.
  ensureOrganization(name: string): Promise<Organization>;
  getOrganizationByName(name: string): Promise<Organization | undefined>;
  /** Records a key by its SHA-256 hash; the plaintext is never stored. */
  insertApiKey(key: { id: string; orgId: string; hash: string; prefix: string; createdAt: number }): Promise<void>;
  /** The active (not revoked) key with this hash, with its organization. */
  findActiveKeyByHash(hash: string): Promise<ApiKeyInfo | undefined>;
  listApiKeys(): Promise<ApiKeyInfo[]>;
  /** Revokes by key id or by the full plaintext's hash; false when no active key matched. */
  revokeApiKey(idOrHash: string, at: number): Promise<boolean>;
  countActiveApiKeys(): Promise<number>;

  // Responses (every response is stored, store=false included).
  insertResponse(orgId: string, body: ResponseBody): Promise<void>;
  /** Replaces the stored body; false when no such response of this organization exists. */
  updateResponse(orgId: string, body: ResponseBody): Promise<boolean>;
  getResponse(orgId: string, id: string): Promise<ResponseBody | undefined>;

  // File metadata (the bytes live in FileStorage).
  insertFile(file: FileRecord): Promise<void>;
  getFile(orgId: string, id: string): Promise<FileRecord | undefined>;
  /** Newest first. */
  listFiles(orgId: string, opts: { limit: number; purpose?: string; after?: string }): Promise<FileRecord[]>;
  deleteFile(orgId: string, id: string): Promise<boolean>;

  // Idempotency keys, per organization and scope (the endpoint).
  beginIdempotency(orgId: string, scope: string, key: string, requestHash: string, at: number): Promise<IdempotencyBegin>;
  completeIdempotency(orgId: string, scope: string, key: string, statusCode: number, body: unknown): Promise<void>;
  /** Forgets an in-progress key whose request failed before producing a result worth replaying. */
  abandonIdempotency(orgId: string, scope: string, key: string): Promise<void>;
  /**
   * Forgets every in-progress key: called at startup by a process that owns the store alone, so
   * that a key whose request died with the previous process can be retried (instead of 409
   * forever). Returns how many were released.
   */
  releasePendingIdempotency(): Promise<number>;

  close(): Promise<void>;
}
