// Prompt lookup ("n-gram") speculation: the next tokens are guessed by finding the sequence's last
// n tokens earlier in the sequence (its prompt and what it has generated so far) and proposing what
// followed them there. No model runs; it pays off where the output repeats its input (editing a
// given text, quoting code, filling a template), and costs nothing but a lookup where it does not.
//
// The index is incremental: each n-gram size keeps, per n-gram, the last position it ended at, so
// a step looks up a handful of n-grams instead of scanning the history. The longest size with an
// earlier occurrence wins; within a size, the most recent occurrence (the likeliest to continue as
// the text does now).

export interface NgramOptions {
  /** Longest n-gram looked up (default 4). */
  maxN: number;
  /** Shortest n-gram looked up (default 2: a single repeated token predicts little). */
  minN: number;
}

export const DEFAULT_NGRAM: NgramOptions = { maxN: 4, minN: 2 };

/** n-gram keys: the tokens joined, exact (no collisions to verify). */
function key(tokens: readonly number[], end: number, n: number): string {
  let k = '';
  for (let i = end - n + 1; i <= end; i++) k += i === end - n + 1 ? `${tokens[i]}` : `,${tokens[i]}`;
  return k;
}

/** One sequence's lookup index, fed its tokens as they come. */
export class NgramProposer {
  private readonly tokens: number[] = [];
  /** Per n (index n - minN): n-gram -> the last position it ended at, the sequence's last token excluded. */
  private readonly lastEnd: Map<string, number>[];

  constructor(readonly options: NgramOptions = DEFAULT_NGRAM) {
    const { minN, maxN } = options;
    if (!(Number.isInteger(minN) && Number.isInteger(maxN) && minN >= 1 && maxN >= minN && maxN <= 16)) {
      throw new RangeError(`n-gram sizes must satisfy 1 <= minN <= maxN <= 16, got ${minN}..${maxN}`);
    }
    this.lastEnd = Array.from({ length: maxN - minN + 1 }, () => new Map<string, number>());
  }

  get length(): number {
    return this.tokens.length;
  }

  /** Appends tokens (the prompt, then each step's accepted output). */
  append(tokens: Iterable<number>): void {
    for (const t of tokens) {
      // The n-grams ending at the previous last token become lookup-able once a token follows them.
      this.indexEndingAt(this.tokens.length - 1);
      this.tokens.push(t);
    }
  }

  /** Keeps only the first `length` tokens (a caller that rewinds). Rebuilds the index: rewinding is rare. */
  truncate(length: number): void {
    if (length >= this.tokens.length) return;
    const kept = this.tokens.slice(0, Math.max(0, length));
    this.tokens.length = 0;
    for (const m of this.lastEnd) m.clear();
    this.append(kept);
  }

  /** Up to `k` tokens that followed the latest earlier occurrence of the longest matching suffix. */
  propose(k: number): number[] {
    const t = this.tokens;
    const end = t.length - 1;
    for (let n = Math.min(this.options.maxN, t.length - 1); n >= this.options.minN; n--) {
      const prev = this.lastEnd[n - this.options.minN]!.get(key(t, end, n));
      if (prev === undefined) continue;
      // What followed the earlier occurrence, up to the present (a continuation may run into the
      // suffix itself: a period-p repetition proposes its own continuation).
      return t.slice(prev + 1, Math.min(prev + 1 + k, t.length));
    }
    return [];
  }

  private indexEndingAt(end: number): void {
    if (end < 0) return;
    const { minN, maxN } = this.options;
    for (let n = minN; n <= maxN && n <= end + 1; n++) this.lastEnd[n - minN]!.set(key(this.tokens, end, n), end);
  }
}
