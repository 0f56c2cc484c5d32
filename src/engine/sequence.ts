// One sequence as the Batcher sees it: the request a submitter hands in (prompt, limits,
// sampling, priority, callbacks) and the Batcher's mutable state for it. Only the Batcher
// creates and mutates Sequence objects; policies read them through SequenceView.

import type { NativeSamplingParams } from './native-types.js';
import type { SequenceView } from './batch-policy.js';

/** One sampled token as routed to its sequence. */
export interface SampledToken {
  tokenId: number;
  /** Logprob of the sampled token. */
  logprob: number;
  topIds: Int32Array;          // [topN] most likely ids, best first
  topLogprobs: Float32Array;   // [topN]
}

export type SequenceOutcome =
  | { kind: 'finished' }                 // the sink asked to stop, or maxTokens were generated
  | { kind: 'cancelled' }                // the request's AbortSignal fired
  | { kind: 'failed'; error: Error };    // engine failure, disposal, or an exception in the sink

/** Callbacks of one sequence. Called on the JS thread, between steps; never after onEnd. */
export interface SequenceSink {
  /**
   * The sequence got its first step (called once, not again after a preemption);
   * numCachedTokens: prompt tokens served from the prefix cache at that admission.
   */
  onScheduled?(numCachedTokens: number): void;
  /** A sampled token; return true to finish the sequence now (a stop condition was met). */
  onToken(token: SampledToken): boolean;
  /** Called exactly once. */
  onEnd(outcome: SequenceOutcome): void;
}

export interface SequenceRequest {
  promptTokenIds: readonly number[];
  /** Upper bound on generated tokens (>= 1); the sequence finishes when it is reached. */
  maxTokens: number;
  sampling: NativeSamplingParams;
  /** 0 is the most urgent (default 0); see SequenceView.priority. */
  priority?: number;
  /** Had a prompt cache key: its cached blocks get the keyed retention class (kept longer). */
  keyed?: boolean;
  /**
   * The key itself, already scoped to its tenant by the submitter: the policy co-schedules
   * requests sharing a hot key.
   */
  promptCacheKey?: string;
  /**
   * Who the request belongs to (an organization id; '' or absent: nobody in particular). Its
   * cached prefix blocks are visible to the same tenant only, and the policy shares each window
   * fairly between tenants.
   */
  tenant?: string;
  signal?: AbortSignal | undefined;
  sink: SequenceSink;
}

export type SequenceState = 'waiting' | 'running' | 'done';

export class Sequence implements SequenceView {
  state: SequenceState = 'waiting';
  /** Native id while running (a fresh id per admission). */
  seqId = 0;
  admittedOrder = -1;
  wasScheduled = false;
  cancelRequested = false;
  readonly generatedTokenIds: number[] = [];
  /** Tokens the native engine holds for this sequence (prompt at admission + samples since). */
  numKnownTokens = 0;
  /** Tokens whose KV has been computed. Invariant while running: numComputedTokens < numKnownTokens. */
  numComputedTokens = 0;
  /** Prompt tokens served from the prefix cache at the admission that first ran (usage). */
  numCachedPromptTokens = 0;
  removeAbortListener: () => void = () => {};

  constructor(readonly request: SequenceRequest, readonly arrivalOrder: number) {}

  get priority(): number {
    return this.request.priority ?? 0;
  }

  get promptCacheKey(): string | undefined {
    return this.request.promptCacheKey;
  }

  get tenant(): string {
    return this.request.tenant ?? '';
  }

  get numPromptTokens(): number {
    return this.request.promptTokenIds.length;
  }
  get numGeneratedTokens(): number {
    return this.generatedTokenIds.length;
  }
}
