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
//
// Across windows (issue 27: one organization's asap flood held another's standard request 77 s),
// the same two rules apply to the whole engine, so buying a more urgent window buys precedence, not
// the others' share:
//   - the window floor (floorThisStep): every tenant keeps `floorShare` of its even share of
//     maxNumSeqs (at least 1) running sequences against other tenants' more urgent windows. Below
//     its floor, a tenant's waiting requests are admitted and its rows planned before everything
//     else, and it may preempt a tenant above its floor; a more urgent window preempts another
//     tenant's sequences only above that tenant's floor. Disjoint conditions, so no ping-pong.
//   - engine-wide heaviness: a tenant running more than its even share of maxNumSeqs while another
//     tenant has urgent work (any window below `deferrableFrom`, i.e. not flex under the flex
//     deferral) is heavy in every window it runs, capped as above.

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

/** Default TenantShareOptions.floorShare: a quarter of a tenant's even share of the running slots. */
export const DEFAULT_WINDOW_FLOOR_SHARE = 0.25;

export interface TenantShareOptions {
  /**
   * Fraction (0..1) of its even share of maxNumSeqs that each tenant keeps against other tenants'
   * more urgent windows; 0: none (windows are strict priority between tenants).
   */
  floorShare?: number;
  /** Priorities from this one on (flex under the flex deferral) never make another tenant heavy. */
  deferrableFrom?: number;
}

/** The window floor of one step (see the file comment). */
export class WindowFloor {
  constructor(
    /** Running sequences each tenant keeps against other tenants' more urgent windows. */
    readonly size: number,
    /** tenant -> its most urgent priority with work (running or waiting) when the step began. */
    private readonly minPriority: ReadonlyMap<string, number>,
  ) {}

  /** Whether two or more tenants have work (else nobody is ever outranked). */
  get contested(): boolean {
    return this.minPriority.size >= 2;
  }

  /** Whether another tenant has work in a window more urgent than seq's. */
  outranked(seq: Pick<SequenceView, 'priority' | 'tenant'>): boolean {
    for (const [tenant, priority] of this.minPriority) if (tenant !== seq.tenant && priority < seq.priority) return true;
    return false;
  }
}

/** tenant -> its running sequences. */
export function runningByTenant(running: readonly SequenceView[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const s of running) counts.set(s.tenant, (counts.get(s.tenant) ?? 0) + 1);
  return counts;
}

export class TenantShare {
  /** tenantKey -> when that tenant last had work in that window (ms). */
  private readonly lastSeenMs = new Map<string, number>();
  private readonly floorShare: number;
  private readonly deferrableFrom: number;

  constructor(
    private readonly maxNumSeqs: number,
    private readonly deferral: TenantDeferral | undefined,
    private readonly now: () => number,
    opts: TenantShareOptions = {},
  ) {
    this.floorShare = opts.floorShare ?? DEFAULT_WINDOW_FLOOR_SHARE;
    this.deferrableFrom = opts.deferrableFrom ?? Infinity;
  }

  /** The window floor for the step about to be planned: its size follows the tenants with work now. */
  floorThisStep(running: readonly SequenceView[], waiting: readonly SequenceView[]): WindowFloor {
    const minPriority = new Map<string, number>();
    for (const list of [running, waiting]) {
      for (const s of list) {
        const p = minPriority.get(s.tenant);
        if (p === undefined || s.priority < p) minPriority.set(s.tenant, s.priority);
      }
    }
    const size = this.floorShare === 0 ? 0 : Math.max(1, Math.floor((this.maxNumSeqs * this.floorShare) / Math.max(1, minPriority.size)));
    return new WindowFloor(size, minPriority);
  }

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
    // Across windows: tenants with urgent work (not deferrable) share the whole engine evenly.
    const urgentTenants = new Set<string>();
    for (const key of this.lastSeenMs.keys()) {
      const at = key.indexOf('\u0000');
      if (Number(key.slice(0, at)) < this.deferrableFrom) urgentTenants.add(key.slice(at + 1));
    }
    if (urgentTenants.size >= 2) {
      const share = Math.floor(this.maxNumSeqs / urgentTenants.size);
      const urgentRunning = runningByTenant(running.filter((s) => s.priority < this.deferrableFrom));
      for (const s of running) {
        if (s.priority < this.deferrableFrom && urgentRunning.get(s.tenant)! > share) (heavy ??= new Set()).add(tenantKey(s));
      }
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
