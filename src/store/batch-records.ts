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
 * Once a batch is split into chunks (batch_chunks), its progress stays where the split began (the
 * start for a new batch) and the chunks' done flags carry it: chunks finish in any order, on any
 * replica. A batch from before chunks is split from its progress on.
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

/**
 * A run of consecutive input lines claimed and run as one piece under a lease (batch_chunks). Its
 * byte range holds `numLines` non-blank lines (blank lines inside it are skipped, not counted).
 */
export interface BatchChunkBounds {
  /** 0-based, in file order. */
  chunkNo: number;
  /** 1-based line number of its first line. */
  firstLine: number;
  /** 1-based line number of its last line. */
  lastLine: number;
  /** Byte offset where its first line starts. */
  startOffset: number;
  /** Byte offset just past its last line. */
  endOffset: number;
  numLines: number;
}

/** A chunk a replica claimed, with its batch (what running its lines needs). */
export interface ClaimedBatchChunk {
  chunk: BatchChunkBounds;
  batch: BatchRecord;
}

/** A batch row leased for its own work (Store.claimBatch), as it is once leased. */
export interface BatchClaim {
  batch: BatchRecord;
  /** Its lines are split into chunks already (false: still validating, or a batch from before chunks). */
  chunked: boolean;
  /** Chunks not done yet; none becomes done while the row is leased (the fence). */
  undoneChunks: number;
}

/** What a renewal found still held by its owner. */
export interface HeldBatchLeases {
  /** Batches whose row lease (validation, chunking, the end) is still ours. */
  batchIds: string[];
  /** `<batch id>:<chunk no>` of chunks still ours, undone, of batches still in_progress and not being ended. */
  chunkKeys: string[];
}

export const chunkKey = (batchId: string, chunkNo: number): string => `${batchId}:${chunkNo}`;

/** SQL for a completion window's claim rank (leases.ts WINDOW_RANK: asap 0, standard 1, flex and "24h" 2). */
export const WINDOW_RANK_SQL = (column: string): string => `CASE ${column} WHEN 'asap' THEN 0 WHEN 'standard' THEN 1 ELSE 2 END`;

/** A batch_chunks row (either driver) as its bounds. */
export function chunkBounds(r: Record<string, unknown>): BatchChunkBounds {
  return {
    chunkNo: r['chunk_no'] as number, firstLine: r['first_line'] as number, lastLine: r['last_line'] as number, startOffset: r['start_offset'] as number,
    endOffset: r['end_offset'] as number, numLines: r['num_lines'] as number,
  };
}
