// Incremental detokenization: tokens arrive one at a time; text leaves only when complete.
//
// Technique (prefix offsets): keep a small window of recent tokens split at two offsets.
// prefixText = decode(window[0, readOffset)) is text already emitted (plus context);
// fullText = decode(window[0, end)). When fullText is longer than prefixText and does not end in
// U+FFFD (the decoder's rendering of an incomplete UTF-8 sequence), the new suffix is complete
// text: emit it and slide the window. Decoding a window (not single tokens) keeps tokenizers that
// merge across tokens (leading-space handling, byte fallback, multi-token characters) correct.

import type { TokenDecoder } from './tokenizer.js';

/** Prompt tokens decoded ahead of the first generated token, so its leading space survives. */
const NUM_CONTEXT_TOKENS = 6;

export class IncrementalDetokenizer {
  /** Invariant: 0 <= readOffset <= windowTokenIds.length; window[0, readOffset) is emitted/context. */
  private windowTokenIds: number[];
  private readOffset: number;

  /**
   * @param decoder decodes with special tokens skipped (they never appear in the text).
   * @param promptTokenIds the prompt; only its last few tokens are used, as decoding context.
   */
  constructor(private readonly decoder: TokenDecoder, promptTokenIds: readonly number[] = []) {
    this.windowTokenIds = promptTokenIds.slice(Math.max(0, promptTokenIds.length - NUM_CONTEXT_TOKENS));
    this.readOffset = this.windowTokenIds.length;
  }

  /** Adds one generated token; returns the text it completes ('' while a character is incomplete). */
  push(tokenId: number): string {
    this.windowTokenIds.push(tokenId);
    const prefixText = this.decode(this.windowTokenIds.slice(0, this.readOffset));
    const fullText = this.decode(this.windowTokenIds);
    if (fullText.length <= prefixText.length || fullText.endsWith('\uFFFD')) return '';
    this.slide();
    return fullText.slice(prefixText.length);
  }

  /**
   * Releases text still held back at the end of generation (an incomplete character is emitted
   * as U+FFFD, as a whole-text decode would). Call once, when the sequence finishes.
   */
  flush(): string {
    const prefixText = this.decode(this.windowTokenIds.slice(0, this.readOffset));
    const fullText = this.decode(this.windowTokenIds);
    this.slide();
    return fullText.length > prefixText.length ? fullText.slice(prefixText.length) : '';
  }

  /** Everything in the window becomes context; tokens before the old read offset are dropped. */
  private slide(): void {
    this.windowTokenIds = this.windowTokenIds.slice(this.readOffset);
    this.readOffset = this.windowTokenIds.length;
  }

  private decode(tokenIds: readonly number[]): string {
    return this.decoder.decode(tokenIds, { skipSpecialTokens: true });
  }
}
