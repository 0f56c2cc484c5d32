// Rows of the SQL stores (SQLite and PostgreSQL share their table layouts) as the Store
// interface's records, and the column names a batch transition may write. One copy for both
// stores, so a new column is mapped once.

import type { BatchPatch, BatchRecord, BatchStatus } from './batch-records.js';
import { WINDOW_OF_RANK } from './leases.js';
import { flag, type Row } from './sql-driver.js';
import type { ApiKeyInfo, BackgroundJob, FileRecord, UsageRecord, WebhookDelivery } from './store.js';

export type { Row };

export function keyInfo(row: Row): ApiKeyInfo {
  return {
    id: row['id'] as string,
    orgId: row['org_id'] as string,
    orgName: row['org_name'] as string,
    prefix: row['prefix'] as string,
    createdAt: row['created_at'] as number,
    revokedAt: (row['revoked_at'] as number | null) ?? null,
  };
}

export function fileRecord(row: Row): FileRecord {
  return {
    id: row['id'] as string,
    orgId: row['org_id'] as string,
    bytes: row['bytes'] as number,
    createdAt: row['created_at'] as number,
    filename: row['filename'] as string,
    purpose: row['purpose'] as string,
    status: row['status'] as string,
    statusDetails: (row['status_details'] as string | null) ?? null,
  };
}

export function usageRecord(row: Row): UsageRecord {
  return {
    id: row['id'] as string,
    orgId: row['org_id'] as string,
    orgName: row['org_name'] as string,
    keyId: row['key_id'] as string,
    model: row['model'] as string,
    tier: row['tier'] as string,
    surface: row['surface'] as string,
    requestId: row['request_id'] as string,
    inputTokens: row['input_tokens'] as number,
    cachedTokens: row['cached_tokens'] as number,
    outputTokens: row['output_tokens'] as number,
    inputCost: row['input_cost'] as string,
    cachedCost: row['cached_cost'] as string,
    outputCost: row['output_cost'] as string,
    cost: row['cost'] as string,
    longContext: flag(row['long_context']),
    completedAtMs: row['completed_at_ms'] as number,
  };
}

export function webhookDelivery(row: Row): WebhookDelivery {
  return {
    id: row['id'] as string,
    orgId: row['org_id'] as string,
    objectId: row['object_id'] as string,
    url: row['url'] as string,
    host: row['host'] as string,
    token: (row['token'] as string | null) ?? null,
    body: row['body'] as string,
    state: row['state'] as WebhookDelivery['state'],
    attempts: row['attempts'] as number,
    nextAttemptAtMs: row['next_attempt_at_ms'] as number,
    lastError: (row['last_error'] as string | null) ?? null,
    createdAt: row['created_at'] as number,
  };
}

/** BatchPatch field -> column. Only these columns are ever written by a transition. */
export const BATCH_PATCH_COLUMNS: Record<keyof BatchPatch, string> = {
  status: 'status',
  errors: 'errors',
  outputFileId: 'output_file_id',
  errorFileId: 'error_file_id',
  total: 'total',
  inProgressAt: 'in_progress_at',
  finalizingAt: 'finalizing_at',
  completedAt: 'completed_at',
  failedAt: 'failed_at',
  expiredAt: 'expired_at',
  cancellingAt: 'cancelling_at',
  cancelledAt: 'cancelled_at',
};

/** A value as JSON text for a TEXT column; null stays null. */
export const jsonText = (value: unknown): string | null => (value === null || value === undefined ? null : JSON.stringify(value));
/** A nullable integer column. */
export const numOrNull = (value: unknown): number | null => (value as number | null) ?? null;

export function batchRecord(row: Row): BatchRecord {
  return {
    id: row['id'] as string,
    orgId: row['org_id'] as string,
    orgName: row['org_name'] as string,
    keyId: row['key_id'] as string,
    endpoint: row['endpoint'] as string,
    inputFileId: row['input_file_id'] as string,
    completionWindow: row['completion_window'] as string,
    status: row['status'] as BatchStatus,
    errors: row['errors'] === null ? null : JSON.parse(row['errors'] as string),
    outputFileId: (row['output_file_id'] as string | null) ?? null,
    errorFileId: (row['error_file_id'] as string | null) ?? null,
    metadata: row['metadata'] === null ? null : JSON.parse(row['metadata'] as string),
    requestCounts: { total: row['total'] as number, completed: row['completed'] as number, failed: row['failed'] as number },
    progress: { nextLine: row['next_line'] as number, nextOffset: row['next_offset'] as number },
    createdAt: row['created_at'] as number,
    expiresAt: row['expires_at'] as number,
    inProgressAt: numOrNull(row['in_progress_at']),
    finalizingAt: numOrNull(row['finalizing_at']),
    completedAt: numOrNull(row['completed_at']),
    failedAt: numOrNull(row['failed_at']),
    expiredAt: numOrNull(row['expired_at']),
    cancellingAt: numOrNull(row['cancelling_at']),
    cancelledAt: numOrNull(row['cancelled_at']),
  };
}

export function backgroundJob(row: Row): BackgroundJob {
  return {
    responseId: row['response_id'] as string,
    orgId: row['org_id'] as string,
    deadlineAt: row['deadline_at'] as number,
    request: JSON.parse(row['request'] as string) as Record<string, unknown>,
    createdAt: row['created_at'] as number,
    window: WINDOW_OF_RANK[row['window_rank'] as number] ?? 'standard',
  };
}
