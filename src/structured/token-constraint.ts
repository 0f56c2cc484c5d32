// The contract between a constrained sequence and its grammar engine, in a module of its own so
// that the engines (native-grammar.ts, matcher-worker.ts, thinking.ts) and structured-outputs.ts,
// which builds them, do not import each other.

/** What the scheduler needs of a constrained sequence (see Batcher). */
export interface TokenConstraint {
  /** Writes the allowed next tokens into out[offset, offset + words) (bit v = token v). */
  fillMask(out: Uint32Array, offset: number): Promise<void>;
  /** Advances with a sampled token; false if the grammar does not allow it (see `failure`). */
  accept(tokenId: number): boolean;
  /**
   * Speculative decoding (engines that can look ahead without moving): how many of `tokens` the
   * grammar accepts one after another from here. The state is unchanged.
   */
  countAhead?(tokens: readonly number[]): number;
  /**
   * Speculative decoding: the masks after each prefix of `tokens` (1 + tokens.length of them, from
   * `offset`, `words` apart), each what fillMask would write after accepting that prefix. The state
   * is unchanged.
   */
  fillMasksAhead?(tokens: readonly number[], out: Uint32Array, offset: number): Promise<void>;
  /** Why the constraint can go no further (its grammar engine stopped), once it cannot. */
  readonly failure?: Error | undefined;
  dispose(): void;
}
