// Recently encoded images, so that the same image sent again (a conversation's earlier turns, a
// retried request) is not run through the vision tower again: the tower costs seconds on a CPU.
// Entries are owned by an organization (the key holds it): one organization's image never answers
// another's, so neither can tell by timing what the other sent. Least recently used first out,
// within a byte budget.

export class EncodingCache {
  private readonly entries = new Map<string, Float32Array>();
  private bytes = 0;

  constructor(readonly maxBytes: number) {}

  /** The key of an image (its pixels' SHA-256 and its token grid) for `owner`. */
  static key(owner: string, hash: Uint8Array, gridH: number, gridW: number): string {
    return `${owner}\u0000${Buffer.from(hash).toString('hex')}\u0000${gridH}x${gridW}`;
  }

  get(key: string): Float32Array | undefined {
    const hit = this.entries.get(key);
    if (hit === undefined) return undefined;
    this.entries.delete(key);  // most recently used last
    this.entries.set(key, hit);
    return hit;
  }

  set(key: string, value: Float32Array): void {
    if (value.byteLength > this.maxBytes) return;
    const old = this.entries.get(key);
    if (old !== undefined) {
      this.entries.delete(key);
      this.bytes -= old.byteLength;
    }
    for (const [k, v] of this.entries) {
      if (this.bytes + value.byteLength <= this.maxBytes) break;
      this.entries.delete(k);
      this.bytes -= v.byteLength;
    }
    this.entries.set(key, value);
    this.bytes += value.byteLength;
  }

  get size(): number {
    return this.entries.size;
  }

  get usedBytes(): number {
    return this.bytes;
  }
}
