// The contract between a constrained sequence and its grammar engine, in a module of its own so
// that the engines (native-grammar.ts, matcher-worker.ts, thinking.ts) and structured-outputs.ts,
// which builds them, do not import each other.

/** What the scheduler needs of a constrained sequence (see Batcher). */
export interface TokenConstraint {
  /** Writes the allowed next tokens into out[offset, offset + words) (bit v = token v). */
  fillMask(out: Uint32Array, offset: number): Promise<void>;
  /** Advances with a sampled token; false if the grammar does not allow it (see `failure`). */
  accept(tokenId: number): boolean;
  /** Why the constraint can go no further (its grammar engine stopped), once it cannot. */
  readonly failure?: Error | undefined;
  dispose(): void;
}
