// Sharing a completion window between tenants (organizations), step by step. The window policy
// already takes tenants in turns at admission and the Batcher preempts a tenant running more than
// its fair share of slots; this is the third part: a step cannot be interrupted, so a tenant with
// a few requests would otherwise wait for, and then share, the long steps of another tenant's
// flood. While two or more tenants have work in a window (or had within `holdMs`), a tenant running
// more than its fair share of that window's slots is *heavy* there:
//   - its rows get no tokens in a step that prefills a light tenant's row;
//   - otherwise its rows take at most `rowsPerStep` tokens per step together.
// On a CPU a step's cost grows with its rows, so short steps keep the light tenant's time to first
// token near idle while costing the heavy tenant little throughput (the cost per row barely
// changes); the caps lift once the other tenants have been gone for `holdMs`.

import type { SequenceView } from './batch-policy.js';

export interface TenantDeferral {
  /** Tokens per step a heavy tenant's rows of one window may take together. */
  rowsPerStep: number;
  /** How long a tenant counts as active in a window after its last work there. */
  holdMs: number;
}

/** The (window, tenant) pair a sequence belongs to. */
export const tenantKey = (seq: Pick<SequenceView, 'priority' | 'tenant'>): string => `${seq.priority}\u0000${seq.tenant}`;

const NONE: ReadonlySet<string> = new Set();

export class TenantShare {
  /** tenantKey -> when that tenant last had work in that window (ms). */
  private readonly lastSeenMs = new Map<string, number>();

  constructor(
    private readonly maxNumSeqs: number,
    private readonly deferral: TenantDeferral | undefined,
    private readonly now: () => number,
  ) {}

  /** The heavy tenantKeys of the step about to be planned (see the file comment). */
  heavyThisStep(running: readonly SequenceView[], waiting: readonly SequenceView[]): ReadonlySet<string> {
    if (!this.deferral) return NONE;
    const now = this.now();
    const numRunning = new Map<string, number>();
    for (const s of running) {
      const key = tenantKey(s);
      numRunning.set(key, (numRunning.get(key) ?? 0) + 1);
      this.lastSeenMs.set(key, now);
    }
    for (const s of waiting) this.lastSeenMs.set(tenantKey(s), now);
    // priority -> tenants active in it
    const numActive = new Map<string, number>();
    for (const [key, at] of this.lastSeenMs) {
      if (now - at > this.deferral.holdMs) {
        this.lastSeenMs.delete(key);
        continue;
      }
      const priority = key.slice(0, key.indexOf('\u0000'));
      numActive.set(priority, (numActive.get(priority) ?? 0) + 1);
    }
    let heavy: Set<string> | undefined;
    for (const [key, n] of numRunning) {
      const tenants = numActive.get(key.slice(0, key.indexOf('\u0000'))) ?? 0;
      if (tenants >= 2 && n > Math.floor(this.maxNumSeqs / tenants)) (heavy ??= new Set()).add(key);
    }
    return heavy ?? NONE;
  }

  get rowsPerStep(): number {
    return this.deferral?.rowsPerStep ?? Infinity;
  }
}
