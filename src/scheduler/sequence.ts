// One sequence as the scheduler sees it: the request a submitter hands in (prompt, limits,
// sampling, priority, callbacks) and the scheduler's state for it. Only the scheduler (roster,
// planner, batcher) creates and mutates Sequence objects; policies read them through SequenceView.
//
// Ownership: the native engine owns a running sequence's tokens, computed count and KV blocks.
// The counts here are the engine's own figures as its last step result reported them
// (reported*), never computed on this side; planning ahead of a result predicts from them
// (predicted*) and the engine clamps whatever the prediction got wrong.

import type { NativeSamplingParams, NativeSequenceImage } from '../native/native-types.js';
import type { TokenConstraint } from '../structured/token-constraint.js';
import type { SequenceView } from './policy.js';

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
   * The sequence's first step ran (called once, not again after a preemption; before the
   * first token when that step sampled one); numCachedTokens: prompt tokens served from the
   * prefix cache at that admission; atMs: when the step that admitted it was submitted (the
   * Batcher's clock, performance.now() by default).
   */
  onScheduled?(numCachedTokens: number, atMs?: number): void;
  /** A sampled token; return true to finish the sequence now (a stop condition was met). */
  onToken(token: SampledToken): boolean;
  /** Called exactly once. */
  onEnd(outcome: SequenceOutcome): void;
}

export interface SequenceRequest {
  promptTokenIds: readonly number[];
  /** Vision-language models: the prompt's images (their placeholders are in promptTokenIds); re-sent with every add, preemptions included. */
  images?: readonly NativeSequenceImage[];
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
  /** The LoRA adapter (1-based, NativeSequenceAdd.adapter); absent: the base model. */
  adapter?: number;
  signal?: AbortSignal | undefined;
  sink: SequenceSink;
  /** Structured outputs: each sample is restricted to the tokens this allows (the submitter disposes it). */
  constraint?: TokenConstraint;
}

export type SequenceState = 'waiting' | 'running' | 'done';

/** A step that holds a row (or the add) of this sequence and has not reported yet. */
export interface InFlightRow {
  /** The step's serial number (Batcher). */
  step: number;
  /** The row's token bound. */
  numTokens: number;
}

export class Sequence implements SequenceView {
  state: SequenceState = 'waiting';
  /** Native id while running (a fresh id per admission). */
  seqId = 0;
  admittedOrder = -1;
  wasScheduled = false;
  cancelRequested = false;
  readonly generatedTokenIds: number[] = [];
  /** Reported: tokens whose KV the engine has computed (0 until the add reports its prefix hit). */
  reportedComputed = 0;
  /** Reported: known tokens the engine has not computed yet (the prompt, until the add reports). */
  reportedPending = 0;
  /** Reported: KV blocks the engine holds for it. */
  reportedBlocks = 0;
  /** Steps submitted with a row of this sequence and not yet reported (oldest first; at most two). */
  readonly inFlight: InFlightRow[] = [];
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

  /**
   * Where the sequence will be once its in-flight rows have run, assuming they run (the planner's
   * view while steps are in flight): computed and pending tokens, tokens sampled meanwhile.
   */
  predicted(): { computed: number; pending: number; samples: number } {
    let computed = this.reportedComputed;
    let pending = this.reportedPending;
    let samples = 0;
    for (const row of this.inFlight) {
      const n = Math.min(row.numTokens, pending);
      computed += n;
      pending -= n;
      if (pending === 0) {
        pending = 1;  // it sampled: the new token is known and uncomputed
        samples++;
      }
    }
    return { computed, pending, samples };
  }
}
