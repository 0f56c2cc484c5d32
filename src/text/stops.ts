// Stop conditions for one sequence: eos token ids, a maximum number of generated tokens, and stop
// strings. Text is fed in as the detokenizer emits it; what comes out is safe to show: it never
// contains a stop string or the start of one that may still complete.

export type FinishReason = 'stop' | 'length';

export interface StopOptions {
  /** Generating one of these ids finishes with 'stop'; the token adds no text. */
  eosTokenIds: ReadonlySet<number>;
  /** Generated-token limit (>= 1); reaching it finishes with 'length'. */
  maxTokens: number;
  /** Non-empty strings; output is cut before the first occurrence of any of them. */
  stopStrings?: readonly string[];
}

export interface StopUpdate {
  /** Text that is now final and may be shown (possibly ''). */
  text: string;
  /** Set on the update that finishes the sequence; no more tokens should be pushed after it. */
  finishReason?: FinishReason;
  /** The stop string that matched, when finishReason is 'stop' because of one. */
  stopString?: string;
}

export class StopChecker {
  private readonly stopStrings: readonly string[];
  /** Text received but not yet released because it may be the start of a stop string. */
  private heldText = '';
  private numGeneratedTokens = 0;
  private finished = false;

  constructor(private readonly options: StopOptions) {
    if (!Number.isInteger(options.maxTokens) || options.maxTokens < 1) {
      throw new RangeError(`maxTokens must be an integer >= 1, got ${options.maxTokens}`);
    }
    this.stopStrings = options.stopStrings ?? [];
    if (this.stopStrings.some((s) => s.length === 0)) throw new RangeError('stop strings must be non-empty');
  }

  get isFinished(): boolean {
    return this.finished;
  }

  /**
   * Accounts one generated token and the text the detokenizer emitted for it. Checks, in order:
   * eos id, stop strings (in the held text + `textDelta`), the token limit.
   */
  push(tokenId: number, textDelta: string): StopUpdate {
    if (this.finished) throw new Error('StopChecker.push after the sequence finished');
    this.numGeneratedTokens += 1;

    if (this.options.eosTokenIds.has(tokenId)) {
      return this.finish('stop', this.heldText + textDelta);
    }

    // NOTE: searching only the held text is enough: released text has no suffix that starts a
    // stop string (that suffix would have been held), so no match can begin before heldText.
    const text = this.heldText + textDelta;
    const match = this.findFirstStop(text);
    if (match !== undefined) {
      const update = this.finish('stop', text.slice(0, match.index));
      update.stopString = match.stopString;
      return update;
    }

    if (this.numGeneratedTokens >= this.options.maxTokens) return this.finish('length', text);

    const numHeldChars = this.longestStopPrefixSuffix(text);
    this.heldText = text.slice(text.length - numHeldChars);
    return { text: text.slice(0, text.length - numHeldChars) };
  }

  private finish(reason: FinishReason, text: string): StopUpdate {
    this.finished = true;
    this.heldText = '';
    return { text, finishReason: reason };
  }

  /** Earliest occurrence of any stop string in `text` (ties: the first listed). */
  private findFirstStop(text: string): { index: number; stopString: string } | undefined {
    let best: { index: number; stopString: string } | undefined;
    for (const stopString of this.stopStrings) {
      const index = text.indexOf(stopString);
      if (index >= 0 && (best === undefined || index < best.index)) best = { index, stopString };
    }
    return best;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some stop string. */
  private longestStopPrefixSuffix(text: string): number {
    let longest = 0;
    for (const stopString of this.stopStrings) {
      for (let n = Math.min(stopString.length - 1, text.length); n > longest; n--) {
        if (text.endsWith(stopString.slice(0, n))) {
          longest = n;
          break;
        }
      }
    }
    return longest;
  }
}
