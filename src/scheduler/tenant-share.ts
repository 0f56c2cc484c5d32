// Sharing a completion window between tenants (organizations), step by step. The window policy
// takes tenants in turns at admission; the Planner preempts a tenant running more than its fair
// share of slots (overFairShare below) and defers heavy tenants: a step cannot be interrupted, so
// a tenant with a few requests would otherwise wait for, and then share, the long steps of
// another tenant's flood. While two or more tenants have work in a window (or had within
// `holdMs`), a tenant running more than its fair share of that window's slots is *heavy* there:
//   - its rows get no tokens in a step that prefills a light tenant's row;
//   - otherwise its rows take at most `rowsPerStep` tokens per step together.
// On a CPU a step's cost grows with its rows, so short steps keep the light tenant's time to first
// token near idle while costing the heavy tenant little throughput (the cost per row barely
// changes); the caps lift once the other tenants have been gone for `holdMs`.

import type { SequenceView } from './policy.js';

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

  /**
   * Whether running `other` may be preempted for waiting `seq` of the same window: its tenant
   * runs more than its fair share of that window's sequences (maxNumSeqs split evenly among the
   * tenants with work there) and seq's tenant runs less. Once both hold their share, neither
   * preempts the other, so there is no ping-pong. (Independent of the deferral setting.)
   */
  overFairShare(other: SequenceView, seq: SequenceView, running: readonly SequenceView[], waiting: readonly SequenceView[]): boolean {
    if (other.priority !== seq.priority || other.tenant === seq.tenant) return false;
    const tenants = new Set<string>([seq.tenant]);
    const numRunning = new Map<string, number>();
    for (const s of running) {
      if (s.priority !== seq.priority) continue;
      tenants.add(s.tenant);
      numRunning.set(s.tenant, (numRunning.get(s.tenant) ?? 0) + 1);
    }
    for (const s of waiting) if (s.priority === seq.priority) tenants.add(s.tenant);
    const share = Math.max(1, Math.floor(this.maxNumSeqs / tenants.size));
    return (numRunning.get(other.tenant) ?? 0) > share && (numRunning.get(seq.tenant) ?? 0) < share;
  }

  get rowsPerStep(): number {
    return this.deferral?.rowsPerStep ?? Infinity;
  }
}
