// The persistence interface: organizations and their API keys, stored responses, file metadata,
// idempotency records, batches, the webhook outbox, the usage ledger and leased work, each a
// repository of its own; Store is all of them over one database. SQLite implements it for a single
// process (sqlite-store.ts) and PostgreSQL for replicas sharing one database (postgres-store.ts),
// both with the same repositories and statements (sql-store.ts). Methods are async so that a
// network store fits; objects cross as plain JSON-compatible values.
//
// Ownership: every stored object carries its organization id, and every read takes one: an object
// of another organization is simply not found.
//
// A request's end is one write: commitRequestEnd stores the terminal object with everything it
// implies (ledger row, webhook delivery, job removal, idempotency result, batch result row) in one
// transaction, so a crash or a failed write never leaves a billed request without its result, or
// a result without the callback promised for it.

import type { CompletionWindow } from '../config/catalog.js';
import type { BatchPatch, BatchProgress, BatchRecord, BatchResultRow, BatchStatus } from './batch-records.js';
import type { BatchChunkBounds, BatchClaim, ClaimedBatchChunk, HeldBatchLeases } from './batch-records.js';
import type { LeaseTerm } from './leases.js';

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

/** A background response's work, kept until the response is terminal. */
export interface BackgroundJob {
  responseId: string;
  orgId: string;
  /** Unix seconds. */
  deadlineAt: number;
  /** The GenerationRequest, JSON-compatible. */
  request: Record<string, unknown>;
  createdAt: number;
  /** Its completion window: claims take asap before standard before flex, then the oldest first. */
  window: CompletionWindow;
}

/** Organizations and their API keys (keys-repo.ts). */
export interface KeyRepository {
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
  /** Marks a key as an admin key (may read every organization's usage) or not; false when no such key. */
  setApiKeyAdmin(keyId: string, admin: boolean): Promise<boolean>;
  isAdminKey(keyId: string): Promise<boolean>;
}

/**
 * Stored responses (every response, store=false included), their input items, and background
 * responses with their jobs (responses-repo.ts; the jobs' leases are in LeaseRepository).
 */
export interface ResponseRepository {
  insertResponse(orgId: string, body: ResponseBody): Promise<void>;
  /** Replaces the stored body; false when no such response of this organization exists. */
  updateResponse(orgId: string, body: ResponseBody): Promise<boolean>;
  getResponse(orgId: string, id: string): Promise<ResponseBody | undefined>;
  /** A response's input items (OpenAI item shapes, in order); written once, when it is accepted. */
  putResponseInput(orgId: string, responseId: string, items: Record<string, unknown>[]): Promise<void>;
  getResponseInput(orgId: string, responseId: string): Promise<Record<string, unknown>[] | undefined>;
  /** Deletes a response and its input items; false when no such response of this organization exists. */
  deleteResponse(orgId: string, id: string): Promise<boolean>;
  /** Stores the in_progress response, its input items (when given) and its job, leased to `lease.owner`, in one transaction. */
  insertBackgroundResponse(body: ResponseBody, job: BackgroundJob, lease: LeaseTerm, inputItems?: Record<string, unknown>[]): Promise<void>;
  /** Stores the terminal response and drops its job in one transaction (no lease check: a stale job's cleanup). */
  finishBackgroundResponse(orgId: string, body: ResponseBody): Promise<void>;
  /** Every job, of every organization and lease, oldest first. */
  listBackgroundJobs(): Promise<BackgroundJob[]>;
  getBackgroundJob(orgId: string, responseId: string): Promise<BackgroundJob | undefined>;
  /**
   * Cancels a background response wherever it runs, in one transaction: while its job exists and
   * the stored response is in_progress, stores `cancelled` (the cancelled object), deletes the job
   * and adds `delivery`; false (nothing written) when the job is gone or the response ended. The
   * replica running it finds at its next renewal that the job is gone, and stops without writing.
   */
  cancelBackgroundResponse(orgId: string, cancelled: ResponseBody, delivery?: WebhookDelivery): Promise<boolean>;
}

/** File metadata (files-repo.ts; the bytes live in FileStorage). */
export interface FileRepository {
  insertFile(file: FileRecord): Promise<void>;
  getFile(orgId: string, id: string): Promise<FileRecord | undefined>;
  /** Newest first. */
  listFiles(orgId: string, opts: { limit: number; purpose?: string; after?: string }): Promise<FileRecord[]>;
  deleteFile(orgId: string, id: string): Promise<boolean>;
}

/** Idempotency keys, per organization and scope (the endpoint) (idempotency-repo.ts). */
export interface IdempotencyRepository {
  /**
   * A new key is recorded in progress, leased to `lease.owner` until `lease.untilMs`; an in-progress
   * key whose lease expired (its replica died) is taken over: 'new' for this caller, now its owner.
   * renewLeases extends the lease while the request runs.
   */
  beginIdempotency(orgId: string, scope: string, key: string, requestHash: string, at: number, lease: LeaseTerm): Promise<IdempotencyBegin>;
  completeIdempotency(orgId: string, scope: string, key: string, statusCode: number, body: unknown): Promise<void>;
  /** Forgets an in-progress key whose request failed before producing a result worth replaying. */
  abandonIdempotency(orgId: string, scope: string, key: string, leaseOwner?: string): Promise<void>;
  /**
   * Forgets every in-progress key: called at startup by a process that owns the store alone, so
   * that a key whose request died with the previous process can be retried (instead of 409
   * forever). Returns how many were released.
   */
  releasePendingIdempotency(): Promise<number>;
}

/** Batches, their result rows and their split into chunks (batches-repo.ts). */
export interface BatchRepository {
  insertBatch(batch: BatchRecord): Promise<void>;
  getBatch(orgId: string, id: string): Promise<BatchRecord | undefined>;
  /**
   * Newest first: below `after` (older than it) and above `before` (newer than it; the `limit`
   * nearest to it). A cursor that is not a batch of this organization is ignored.
   */
  listBatches(orgId: string, opts: { limit: number; after?: string; before?: string }): Promise<BatchRecord[]>;
  /** Batches of every organization in a status a restart resumes, oldest first. */
  listUnfinishedBatches(): Promise<BatchRecord[]>;
  /** Compare-and-set: applies `patch` only while the status is one of `from`; the batch after it, else undefined. */
  transitionBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch): Promise<BatchRecord | undefined>;
  /**
   * Records a finished line, counts it as completed or failed, and advances the progress, in one
   * transaction. A line already recorded is neither stored nor counted again (returns false).
   */
  recordBatchResult(id: string, result: BatchResultRow, progress: BatchProgress): Promise<boolean>;
  /** Line numbers >= fromLine (and <= toLine when given) that have a result, ascending. */
  listBatchResultLines(id: string, fromLine: number, toLine?: number): Promise<number[]>;
  /** Up to `limit` results after line `afterLine`, in line order. */
  listBatchResults(id: string, afterLine: number, limit: number): Promise<BatchResultRow[]>;
  /**
   * Ends a batch in one transaction: the compare-and-set of transitionBatch, then its result files'
   * records (an id already recorded is kept), then its result rows are dropped.
   */
  finishBatch(id: string, from: readonly BatchStatus[], patch: BatchPatch, files: FileRecord[]): Promise<BatchRecord | undefined>;
  /**
   * Unfinished batches whose next step is the batch row's own work and whose row lease is free,
   * expired at `nowMs` or `owner`'s: validating, finalizing, cancelling, and in_progress ones not
   * split into chunks yet (from before chunks), with no chunk left undone, with errors (their
   * input vanished) or past expires_at. Claim order: window, then age.
   */
  listBatchWork(owner: string, nowMs: number): Promise<BatchRecord[]>;
  /**
   * In one transaction, while the status is one of `from` and the row lease is `owner`'s: applies
   * `patch`, records `chunks` (their lines now claimable) and hands the row lease back. Undefined
   * (nothing written) otherwise.
   */
  startBatchChunks(id: string, owner: string, from: readonly BatchStatus[], patch: BatchPatch, chunks: BatchChunkBounds[]): Promise<BatchRecord | undefined>;
}

/** Completion webhook deliveries: the outbox a request's end writes to (webhooks-repo.ts). */
export interface WebhookOutbox {
  insertWebhookDelivery(delivery: WebhookDelivery): Promise<void>;
  /**
   * Takes up to `limit` pending deliveries due at `lease.nowMs` and leases them to `lease.owner`
   * until `lease.untilMs` (their next attempt moves there too), in one transaction, so no other
   * claim takes them while they are being sent. The holder renews the lease while its attempt runs
   * (renewWebhookLeases); a process that dies mid-attempt leaves them due again at the lease's end.
   * Fair: deliveries with an unexpired lease count as in flight, and a claim never brings an
   * organization above `caps.perOrg` nor a receiver host above `caps.perHost` in flight; among
   * the rest it takes each organization's oldest due delivery first, then each one's second, ...
   * (round robin over organizations; within a host, round robin over its organizations too).
   */
  claimDueWebhookDeliveries(lease: LeaseTerm, limit: number, caps: WebhookClaimCaps): Promise<WebhookDelivery[]>;
  /**
   * Records an attempt's outcome (or, after a shutdown abort, just the next attempt time) and ends
   * the lease, only while `owner` holds it (a fence: a process that stalled past its lease cannot
   * overwrite what the process that took the delivery over records). False: nothing was written.
   * A delivery that ends (delivered or failed) forgets its token.
   */
  updateWebhookDelivery(id: string, owner: string, update: WebhookDeliveryUpdate): Promise<boolean>;
  /**
   * The earliest next attempt time (ms) after `afterMs` of a pending delivery (a lease's end
   * included); undefined when there is none.
   */
  nextWebhookAttemptMs(afterMs: number): Promise<number | undefined>;
  /** Deliveries still pending (logged when sending starts after a restart). */
  countPendingWebhookDeliveries(): Promise<number>;
}

/**
 * The usage ledger (usage-repo.ts). Rows are written by commitRequestEnd, idempotent on (surface,
 * requestId): a request run again after a restart is not recorded twice.
 */
export interface UsageLedger {
  /** Ledger rows completed at or after `sinceMs` (Unix ms), of one organization when named; in insertion order. */
  listUsage(filter: { orgName?: string; sinceMs?: number }): Promise<UsageRecord[]>;
}

/**
 * Leased work (leases.ts, leases-repo.ts): the claims, renewals, hand-backs and fenced ends of
 * background jobs, in-progress idempotency keys, batch rows and chunks and webhook deliveries. The
 * batch row's lease covers its validation, its split into chunks and its end; each chunk's lease
 * covers running its lines (batches/runner.ts). The fair webhook claim is the outbox's.
 */
export interface LeaseRepository {
  /**
   * Leases to `lease.owner` up to `limit` jobs whose lease is free or expired at `lease.nowMs`,
   * asap before standard before flex, then oldest first, and returns them in that order.
   * Concurrent claims (other replicas) never return the same job.
   */
  claimBackgroundJobs(lease: LeaseTerm, limit: number): Promise<BackgroundJob[]>;
  /**
   * Extends to `lease.untilMs` every lease `lease.owner` holds (background jobs and in-progress
   * idempotency keys), one UPDATE per table; returns the ids of the background jobs it still holds.
   * A run whose job is not among them lost it (cancelled elsewhere, or taken over after expiry).
   */
  renewLeases(lease: LeaseTerm): Promise<string[]>;
  /** Hands back every lease `owner` holds (owner NULL, expiry 0): others may claim them at once. */
  releaseLeases(owner: string): Promise<void>;
  /** Hands back one job's lease while `owner` holds it (a job it claimed but does not run). */
  releaseBackgroundJob(responseId: string, owner: string): Promise<void>;
  /**
   * Hands back every lease, whoever holds it: only for a store one process owns (not shared), at
   * its start, when the previous process is known to be dead.
   */
  releaseAllLeases(): Promise<void>;
  /**
   * Extends to `lease.untilMs` the lease of every pending delivery `lease.owner` still holds (its
   * next attempt moves there too); returns their ids. A delivery missing from them was taken over
   * by another process after its lease ran out.
   */
  renewWebhookLeases(lease: LeaseTerm): Promise<string[]>;
  /**
   * Hands back every delivery lease, whoever holds it: only for a store one process owns (not
   * shared), at its start, when the previous process is known to be dead. The deliveries are due
   * again at `nowMs` (or earlier, when their lease had already run out). Returns how many.
   */
  releaseAllWebhookLeases(nowMs: number): Promise<number>;
  /**
   * Leases the batch row to `lease.owner` while it is unfinished and its lease is free, expired or
   * already the owner's (a compare-and-set); the batch as it now is, else undefined. Taking it is
   * also a barrier: a line commit that began before it has committed, and none passes the fence after it.
   */
  claimBatch(id: string, lease: LeaseTerm): Promise<BatchClaim | undefined>;
  /**
   * Leases to `lease.owner` up to `limit` chunks, not done, lease free or expired, of in_progress
   * batches not past expires_at whose row nobody holds, none of `skipBatchIds` nor of an
   * organization in `skipOrgIds`; asap before standard before flex, then the batch's age, then
   * chunk order. Concurrent claims never return the same chunk.
   */
  claimBatchChunks(lease: LeaseTerm, limit: number, skipBatchIds: readonly string[], skipOrgIds?: readonly string[]): Promise<ClaimedBatchChunk[]>;
  /** Extends `lease.owner`'s batch row and chunk leases (one UPDATE per table); what it still holds. */
  renewBatchLeases(lease: LeaseTerm): Promise<HeldBatchLeases>;
  /** Marks a chunk done and frees it, only while it is `owner`'s and its batch in_progress (fenced). */
  finishBatchChunk(batchId: string, chunkNo: number, owner: string): Promise<boolean>;
  /** Hands back the row lease of a batch, or with `chunkNo` one chunk's, if `owner` holds it. */
  releaseBatchLease(batchId: string, owner: string, chunkNo?: number): Promise<void>;
  /**
   * Hands back every batch row and chunk lease of `owner` (owner NULL, expiry 0), or of everyone
   * when undefined (a store one process owns, at its start); how many.
   */
  releaseBatchLeases(owner?: string): Promise<number>;
}

/**
 * The whole store: the repositories above over one database, plus the end of a request as one unit
 * of work. SqliteStore and PostgresStore implement it with the same repositories (sql-store.ts).
 */
export interface Store extends KeyRepository, ResponseRepository, FileRepository, IdempotencyRepository, BatchRepository,
  WebhookOutbox, UsageLedger, LeaseRepository {
  /**
   * True when other processes may use this store at the same time (PostgreSQL): leases of other
   * replicas are then live, and only expiry frees them. False for SQLite, which one process owns
   * (the data directory lock): the leases a previous process left are released at start.
   */
  readonly shared: boolean;

  /**
   * Writes every part of `end` that is present in one transaction: all of them or none. Ledger and
   * batch result rows already recorded are kept as they are (a request run again after a restart).
   */
  commitRequestEnd(end: RequestEnd): Promise<RequestEndCommit>;
  /** Hands the space of deleted rows back to the file system (run after large deletions, e.g. a batch's results). */
  reclaimSpace(): Promise<void>;
  close(): Promise<void>;
}

/** One row of the usage ledger: a finished request and its exact cost (billing/ledger.ts). */
export interface UsageRecord {
  id: string;
  orgId: string;
  orgName: string;
  keyId: string;
  model: string;
  /** The completion window the request ran in. */
  tier: string;
  /** responses | chat.completions | messages | batch */
  surface: string;
  /** The object id (resp_..., chatcmpl-..., msg_...) or, for a batch line, `<batch id>:<line number>`. */
  requestId: string;
  /** Every prompt token, cached ones included. */
  inputTokens: number;
  cachedTokens: number;
  outputTokens: number;
  /** Exact USD amounts as plain decimal strings (money.ts); cost = input + cached + output. */
  inputCost: string;
  cachedCost: string;
  outputCost: string;
  cost: string;
  /** Whether the long-context multipliers applied. */
  longContext: boolean;
  /** Unix milliseconds. */
  completedAtMs: number;
}

/** pending: attempts remain; delivered: a 2xx came back; failed: every attempt failed. */
export type WebhookDeliveryState = 'pending' | 'delivered' | 'failed';

/** One completion callback to send: persisted before its first attempt so restarts resume it. */
export interface WebhookDelivery {
  id: string;
  orgId: string;
  /** The `id` of the object sent (response or chat completion): the receiver's deduplication key. */
  objectId: string;
  url: string;
  /** The URL's host[:port], lower case: the receiver, the unit of per-host fairness. */
  host: string;
  /** The bearer credential while the delivery is pending; null sends no Authorization header. */
  token: string | null;
  /** The exact JSON text to POST. */
  body: string;
  state: WebhookDeliveryState;
  /** Attempts made so far (a shutdown-aborted attempt is not counted). */
  attempts: number;
  /** Unix milliseconds: backoff delays are sub-second in tests. */
  nextAttemptAtMs: number;
  lastError: string | null;
  /** Unix seconds. */
  createdAt: number;
}

export type WebhookDeliveryUpdate = Pick<WebhookDelivery, 'state' | 'attempts' | 'nextAttemptAtMs' | 'lastError'>;

/** Attempts in flight allowed per organization and per receiver host, counted across processes. */
export interface WebhookClaimCaps {
  perOrg: number;
  perHost: number;
}

/** Everything a request's end writes (commitRequestEnd); each part is optional. */
export interface RequestEnd {
  /**
   * The terminal Responses object: `foreground` inserts it with its input items (when given);
   * `background` replaces the stored in_progress object and deletes its job, only while the job
   * exists and is leased to `leaseOwner` (the fence: otherwise nothing of the end is written, see
   * RequestEndCommit).
   */
  response?: { orgId: string; body: ResponseBody; kind: 'foreground'; inputItems?: Record<string, unknown>[] }
    | { orgId: string; body: ResponseBody; kind: 'background'; leaseOwner: string };
  /** Its ledger row, when the request is billed (it ended with a result). */
  usage?: UsageRecord;
  /** Its completion webhook delivery, when one is due. */
  delivery?: WebhookDelivery;
  /**
   * Messages: the result an idempotency key replays (completeIdempotency). With `leaseOwner`,
   * fenced: written only while the key is still in progress and leased to that replica (another
   * replica takes a key over when its lease expires); otherwise nothing of the end is written.
   */
  idempotency?: { orgId: string; scope: string; key: string; statusCode: number; body: unknown; leaseOwner?: string };
  /**
   * A batch line: its result row and the batch's progress (recordBatchResult). With `lease`, fenced:
   * written only while chunk `chunkNo` is `owner`'s and not done, and the batch is in_progress with
   * its row lease free (nobody is ending it); otherwise nothing of the end is written.
   */
  batchResult?: { batchId: string; result: BatchResultRow; progress: BatchProgress; lease?: { owner: string; chunkNo: number } };
}

export interface RequestEndCommit {
  /** False when the batch line already had a result row (it was neither stored nor counted again). */
  batchResultRecorded: boolean;
  /**
   * True when a background end was refused because its job is gone or leased to another replica:
   * nothing at all was written (no response, ledger row, delivery).
   */
  backgroundLeaseLost?: true;
  /**
   * True when a fenced idempotent end was refused because its key is no longer this replica's
   * (taken over after its lease expired, or already completed): nothing was written.
   */
  idempotencyLeaseLost?: true;
  /** True when a fenced batch line was refused (chunk lease lost, or its batch left in_progress): nothing was written. */
  batchLeaseLost?: true;
}
