// A counting semaphore shared by every running batch: the number of request lines in flight at
// once, across batches, never exceeds its size. Waiters queue per organization and a freed slot
// goes to the organization whose last slot is the oldest (never served first), so one
// organization's huge batch cannot hold every slot while another's batch waits; within an
// organization, in arrival order.
//
// Each organization also has a cap of its own (acquire's `cap`: its in-flight limit,
// tenant-limits.ts): it never holds more slots than that, whatever is free, so its batch lines are
// bounded per organization like its foreground requests (separately from them: a batch never takes
// the slots of the organization's own foreground requests).

import { Turns } from '../turns.js';

interface OrgSlots {
  /** Slots it holds now. */
  held: number;
  /** The most it may hold (its latest acquire's cap); 0: no cap but the pool's size. */
  cap: number;
  /** Its waiters, in arrival order. */
  waiters: Array<() => void>;
}

export class Slots {
  private free: number;
  /** org -> its slots and waiters; an org holding nothing with nobody waiting is dropped. */
  private readonly orgs = new Map<string, OrgSlots>();
  private readonly turns = new Turns();

  constructor(readonly size: number) {
    this.free = size;
  }

  /** Slots `org` holds now. */
  heldBy(org: string): number {
    return this.orgs.get(org)?.held ?? 0;
  }

  /**
   * Resolves true with a slot taken, or false (no slot taken) once `signal` aborts. `cap`: the most
   * slots `org` may hold at once (0: no cap of its own).
   */
  acquire(signal: AbortSignal, org = '', cap = 0): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    const state = this.stateOf(org);
    state.cap = cap;
    return new Promise((resolve) => {
      const grant = () => {
        signal.removeEventListener('abort', quit);
        resolve(true);
      };
      const quit = () => {
        const i = state.waiters.indexOf(grant);
        if (i !== -1) state.waiters.splice(i, 1);
        this.dropIfUnused(org, state);
        resolve(false);
      };
      state.waiters.push(grant);
      signal.addEventListener('abort', quit, { once: true });
      // Granted synchronously when a slot is free and it is this organization's turn.
      this.grantFree();
    });
  }

  /** Gives back a slot `org` holds. */
  release(org = ''): void {
    const state = this.orgs.get(org);
    if (state === undefined || state.held === 0) throw new Error(`Slots.release: ${JSON.stringify(org)} holds no slot`);
    state.held -= 1;
    this.free += 1;
    this.dropIfUnused(org, state);
    this.grantFree();
  }

  private stateOf(org: string): OrgSlots {
    let state = this.orgs.get(org);
    if (state === undefined) this.orgs.set(org, (state = { held: 0, cap: 0, waiters: [] }));
    return state;
  }

  private dropIfUnused(org: string, state: OrgSlots): void {
    if (state.held === 0 && state.waiters.length === 0) this.orgs.delete(org);
  }

  /** Hands free slots to waiters under their organization's cap, least recently served organization first. */
  private grantFree(): void {
    while (this.free > 0) {
      const eligible = [...this.orgs].filter(([, s]) => s.waiters.length > 0 && (s.cap === 0 || s.held < s.cap)).map(([org]) => org);
      const org = this.turns.next(eligible);
      if (org === undefined) return;
      const state = this.orgs.get(org)!;
      const next = state.waiters.shift()!;
      state.held += 1;
      this.free -= 1;
      this.turns.take(org);
      next();
    }
  }
}
