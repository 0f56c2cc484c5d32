// What the Store keeps of batches: the batch row (status, timestamps, counts, progress through
// the input file) and one result row per finished request line. Plain JSON-compatible values, so
// a network store can carry them as they are.

export const BATCH_STATUSES = [
  'validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled',
] as const;
export type BatchStatus = (typeof BATCH_STATUSES)[number];

/** Statuses a batch leaves only by its runner's work; a restart resumes batches in these. */
export const UNFINISHED_BATCH_STATUSES: readonly BatchStatus[] = ['validating', 'in_progress', 'finalizing', 'cancelling'];

/** One problem found while validating the input file (OpenAI's batch `errors.data` item). */
export interface BatchErrorItem {
  code: string;
  message: string;
  /** 1-based input line, or null for a problem of the whole file. */
  line: number | null;
  param: string | null;
}

export interface BatchRequestCounts {
  total: number;
  completed: number;
  failed: number;
}

/**
 * How far the runner got through the input file. Invariant: every non-blank line before
 * `nextLine` has a result row; lines at or after it may have one too (they finished out of order).
 */
export interface BatchProgress {
  /** 1-based. */
  nextLine: number;
  /** Byte offset in the input file where `nextLine` starts. */
  nextOffset: number;
}

/** The Unix-seconds timestamps of a batch's transitions; null until it happens. */
export interface BatchTimes {
  inProgressAt: number | null;
  finalizingAt: number | null;
  completedAt: number | null;
  failedAt: number | null;
  expiredAt: number | null;
  cancellingAt: number | null;
  cancelledAt: number | null;
}

export interface BatchRecord extends BatchTimes {
  id: string;
  orgId: string;
  /** The creating caller's organization name and key id: model access is judged as theirs. */
  orgName: string;
  keyId: string;
  endpoint: string;
  inputFileId: string;
  /** As the caller gave it ("24h" included). */
  completionWindow: string;
  status: BatchStatus;
  errors: BatchErrorItem[] | null;
  outputFileId: string | null;
  errorFileId: string | null;
  metadata: Record<string, string> | null;
  requestCounts: BatchRequestCounts;
  progress: BatchProgress;
  createdAt: number;
  expiresAt: number;
}

/** The fields a transition may set. Counts of finished lines change only through recordBatchResult. */
export type BatchPatch = Partial<BatchTimes> & {
  status?: BatchStatus;
  errors?: BatchErrorItem[] | null;
  outputFileId?: string | null;
  errorFileId?: string | null;
  total?: number;
};

/** One finished request line. */
export interface BatchResultRow {
  lineNo: number;
  /** true: a line of the output file; false: of the error file. */
  ok: boolean;
  /** The JSONL line to write, without its newline. */
  line: string;
}
