// Turns between tenants (organizations): the one served least recently goes next, and one never
// served goes before everyone served. Used wherever a shared resource hands out one unit at a time
// (admissions in a window, prompt workers, batch line slots) so that a tenant with a pile of work
// cannot keep another waiting behind all of it.

export class Turns {
  /** tenant -> the turn it last took (1, 2, ...); never served: absent (0). */
  private readonly last = new Map<string, number>();
  private count = 0;

  /** When `tenant` last took a turn; 0 if never. Smaller goes first. */
  lastTurn(tenant: string): number {
    return this.last.get(tenant) ?? 0;
  }

  /** Of `tenants`, the one whose last turn is the oldest (the first of them on a tie). */
  next(tenants: Iterable<string>): string | undefined {
    let best: string | undefined;
    let oldest = Infinity;
    for (const t of tenants) {
      const at = this.lastTurn(t);
      if (at < oldest) [best, oldest] = [t, at];
    }
    return best;
  }

  /** Records that `tenant` took a turn now. */
  take(tenant: string): void {
    this.last.set(tenant, ++this.count);
  }
}
