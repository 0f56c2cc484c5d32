// A least-recently-used cache bounded by entries and by bytes (each entry's size given by its
// owner: for a compiled grammar, an estimate, see estimateGrammarBytes). An entry larger than the
// whole budget is not kept. `evicted` is called for each entry that leaves (not for a replaced
// value of the same key: the caller owns that).

export class ByteLru<V> {
  /** key -> value and its bytes; Map order is use order, least recent first. */
  private readonly entries = new Map<string, { value: V; bytes: number }>();
  private numBytes = 0;

  constructor(private readonly maxEntries: number, private readonly maxBytes: number,
    private readonly evicted: (value: V, key: string) => void = () => undefined) {}

  get size(): number { return this.entries.size; }
  get bytes(): number { return this.numBytes; }

  /** The value for `key`, now the most recently used; undefined when absent. */
  get(key: string): V | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.value;
  }

  /** The value for `key` without marking it used; undefined when absent. */
  peek(key: string): V | undefined {
    return this.entries.get(key)?.value;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** Keeps `value` as the most recently used, evicting the least recently used past either bound; false if it alone is over the byte budget (then not kept). */
  set(key: string, value: V, bytes: number): boolean {
    const old = this.entries.get(key);
    if (old !== undefined) {
      this.entries.delete(key);
      this.numBytes -= old.bytes;
    }
    if (bytes > this.maxBytes) return false;
    this.evictPast(this.maxEntries - 1, this.maxBytes - bytes);
    this.entries.set(key, { value, bytes });
    this.numBytes += bytes;
    return true;
  }

  delete(key: string): void {
    const entry = this.entries.get(key);
    if (entry === undefined) return;
    this.entries.delete(key);
    this.numBytes -= entry.bytes;
  }

  /** Evicts every entry. */
  clear(): void {
    this.evictPast(0, -1);
  }

  private evictPast(entries: number, bytes: number): void {
    while (this.entries.size > 0 && (this.entries.size > entries || this.numBytes > bytes)) {
      const [key, entry] = this.entries.entries().next().value as [string, { value: V; bytes: number }];
      this.entries.delete(key);
      this.numBytes -= entry.bytes;
      this.evicted(entry.value, key);
    }
  }
}

/**
 * An estimate of a compiled grammar's bytes in xgrammar's WebAssembly heap (the module reports no
 * size): its token-mask cache is one mask per grammar position, and building those masks is what a
 * compile spends its time on, so the estimate grows with the compile's time and the grammar's text.
 * Calibrated at Qwen2.5's 151,936-token vocabulary on a 2-core EPYC (30-190 MB for 100-1,700 ms
 * compiles; 11 MB for a 100-character pattern); over, not under, on a busy machine.
 */
export function estimateGrammarBytes(compileMs: number, textChars: number, vocabSize: number): number {
  const scale = Math.max(0.05, vocabSize / 151_936);
  return Math.round((1 << 20) + 64 * textChars + scale * 200_000 * Math.max(0, compileMs));
}
