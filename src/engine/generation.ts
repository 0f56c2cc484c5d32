// One request's output side: the Batcher's sink that detokenizes, applies stops, collects
// logprobs and timings, and hands chunks to the consumer through an async queue.

import { performance } from 'node:perf_hooks';
import { SluiceError } from '../errors.js';
import type { SampledToken, SequenceOutcome, SequenceSink } from '../scheduler/batcher.js';
import { IncrementalDetokenizer } from '../text/detokenizer.js';
import type { GenerateChunk, Timings, TokenLogprob } from './request.js';
import { StopChecker } from '../text/stops.js';
import type { SluiceTokenizer } from '../text/tokenizer.js';

/** Unbounded single-consumer queue: push/close/fail from the producer, async iteration for the consumer. */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private closed = false;
  private error: Error | undefined;
  private wake: (() => void) | undefined;

  push(item: T): void {
    this.items.push(item);
    this.notify();
  }

  /** Ends iteration after the queued items; with an error, iteration throws it after them. */
  close(error?: Error): void {
    this.closed = true;
    this.error = error;
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      if (this.items.length > 0) {
        yield this.items.shift()!;
        continue;
      }
      if (this.closed) {
        if (this.error) throw this.error;
        return;
      }
      await new Promise<void>((resolve) => { this.wake = resolve; });
    }
  }
}

export interface GenerationOptions {
  tokenizer: SluiceTokenizer;
  promptTokenIds: readonly number[];
  maxTokens: number;
  stopStrings: readonly string[];
  /** Top alternatives per token; undefined = no logprobs. */
  logprobs: number | undefined;
  /** Why the request was cancelled, when its AbortSignal fired. */
  cancelReason: () => unknown;
}

export interface GenerationProgress {
  numGeneratedTokens: number;
  numCachedTokens: number;
  /** Submission -> first scheduled step; absent until then. */
  queuedMs?: number;
  /** Submission -> first token; absent until then. */
  firstTokenMs?: number;
  /** First token -> latest token. */
  decodeMs: number;
  elapsedMs: number;
}

/** Sink of one sequence. Chunks come out of `chunks`; the last one carries finishReason. */
export class Generation implements SequenceSink {
  readonly chunks = new AsyncQueue<GenerateChunk>();
  private readonly detokenizer: IncrementalDetokenizer;
  private readonly stops: StopChecker;
  private readonly submittedAtMs = performance.now();
  private scheduledAtMs: number | undefined;
  private firstTokenAtMs: number | undefined;
  private lastTokenAtMs: number | undefined;
  private numGeneratedTokens = 0;
  private numCachedTokens = 0;
  private ended = false;

  constructor(private readonly options: GenerationOptions) {
    this.detokenizer = new IncrementalDetokenizer(options.tokenizer, options.promptTokenIds);
    this.stops = new StopChecker({
      eosTokenIds: options.tokenizer.eosTokenIds,
      maxTokens: options.maxTokens,
      stopStrings: options.stopStrings,
    });
  }

  get isEnded(): boolean {
    return this.ended;
  }

  onScheduled(numCachedTokens = 0, atMs = performance.now()): void {
    this.scheduledAtMs = atMs;
    this.numCachedTokens = numCachedTokens;
  }

  onToken(token: SampledToken): boolean {
    const nowMs = performance.now();
    this.firstTokenAtMs ??= nowMs;
    this.lastTokenAtMs = nowMs;
    this.numGeneratedTokens += 1;
    const update = this.stops.push(token.tokenId, this.detokenizer.push(token.tokenId));
    let text = update.text;
    // Finished without a stop string: release a trailing incomplete character too.
    if (update.finishReason !== undefined && update.stopString === undefined) text += this.detokenizer.flush();

    const chunk: GenerateChunk = { text, tokenIds: [token.tokenId] };
    if (this.options.logprobs !== undefined) chunk.logprobs = [this.tokenLogprob(token, this.options.logprobs)];
    if (update.finishReason !== undefined) {
      chunk.finishReason = update.finishReason;
      if (update.stopString !== undefined) chunk.stopSequence = update.stopString;
      chunk.usage = {
        promptTokens: this.options.promptTokenIds.length,
        completionTokens: this.numGeneratedTokens,
        cachedTokens: this.numCachedTokens,
      };
      chunk.timings = this.timings(nowMs);
    }
    this.chunks.push(chunk);
    return update.finishReason !== undefined;
  }

  onEnd(outcome: SequenceOutcome): void {
    if (this.ended) return;
    this.ended = true;
    switch (outcome.kind) {
      case 'finished':
        // The Batcher also ends a sequence at maxTokens; the StopChecker has reported it already.
        if (!this.stops.isFinished) this.chunks.close(new Error('Generation: finished without a finish reason'));
        else this.chunks.close();
        return;
      case 'cancelled': {
        const reason = this.options.cancelReason();
        this.chunks.close(new SluiceError('cancelled', 'the request was cancelled', { cause: reason }));
        return;
      }
      case 'failed':
        this.chunks.close(outcome.error);
        return;
    }
  }

  /** Where the generation got to so far (ms since its submission), for the engine's request reports. */
  progress(): GenerationProgress {
    const nowMs = performance.now();
    const out: GenerationProgress = {
      numGeneratedTokens: this.numGeneratedTokens,
      numCachedTokens: this.numCachedTokens,
      decodeMs: this.firstTokenAtMs === undefined ? 0 : this.lastTokenAtMs! - this.firstTokenAtMs,
      elapsedMs: nowMs - this.submittedAtMs,
    };
    if (this.scheduledAtMs !== undefined) out.queuedMs = this.scheduledAtMs - this.submittedAtMs;
    if (this.firstTokenAtMs !== undefined) out.firstTokenMs = this.firstTokenAtMs - this.submittedAtMs;
    return out;
  }

  private tokenLogprob(token: SampledToken, numTop: number): TokenLogprob {
    const { tokenizer } = this.options;
    const top = [];
    for (let i = 0; i < Math.min(numTop, token.topIds.length); i++) {
      const id = token.topIds[i]!;
      top.push({ id, token: tokenizer.tokenText(id), logprob: token.topLogprobs[i]! });
    }
    return { id: token.tokenId, token: tokenizer.tokenText(token.tokenId), logprob: token.logprob, top };
  }

  private timings(endAtMs: number): Timings {
    const scheduledAtMs = this.scheduledAtMs ?? this.submittedAtMs;
    const firstTokenAtMs = this.firstTokenAtMs ?? endAtMs;
    const decodeMs = endAtMs - firstTokenAtMs;
    return {
      queuedMs: scheduledAtMs - this.submittedAtMs,
      prefillMs: firstTokenAtMs - scheduledAtMs,
      decodeMs,
      tokensPerSecond: this.numGeneratedTokens > 1 && decodeMs > 0 ? (this.numGeneratedTokens - 1) / (decodeMs / 1000) : 0,
    };
  }
}
