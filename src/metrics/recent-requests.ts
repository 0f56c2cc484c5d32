// The most recent requests the app answered, for the dashboard (api/dashboard-route.ts): a bounded
// ring filled by the access-log hook (api/request-log.ts) with what the access line says. It names
// organizations, so only admin keys read it. Memory is bounded by the capacity: each entry holds
// short strings only (the route template, never the raw URL; a request id of at most 128 characters).

export interface RecentRequest {
  /** When the reply was sent, ISO 8601. */
  time: string;
  request_id: string;
  method: string;
  /** The route template (`unmatched` for 404s), as in the access log. */
  route: string;
  status: number;
  /** The caller's organization name; null before authentication. */
  organization: string | null;
  /** Generation routes only, as the access log counts them. */
  tokens: { prompt: number; completion: number; cached: number } | null;
  duration_ms: number;
}

export const DEFAULT_RECENT_REQUESTS = 50;

export class RecentRequests {
  // NOTE: a fixed array used as a ring: `next` is where the next entry goes; entries before it
  // (wrapping around) are older. No shifting, so recording is O(1) on every request.
  private readonly entries: (RecentRequest | undefined)[];
  private next = 0;

  constructor(readonly capacity = DEFAULT_RECENT_REQUESTS) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${capacity}`);
    this.entries = new Array<RecentRequest | undefined>(capacity);
  }

  record(entry: RecentRequest): void {
    this.entries[this.next] = entry;
    this.next = (this.next + 1) % this.capacity;
  }

  /** Newest first, at most `capacity`. */
  list(): RecentRequest[] {
    const out: RecentRequest[] = [];
    for (let i = 1; i <= this.capacity; i++) {
      const entry = this.entries[(this.next - i + this.capacity) % this.capacity];
      if (entry === undefined) break;
      out.push(entry);
    }
    return out;
  }
}
