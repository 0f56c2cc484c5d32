// A counting semaphore shared by every running batch: the number of request lines in flight at
// once, across batches, never exceeds its size. Waiters queue per organization and a freed slot
// goes to the organization whose last slot is the oldest (never served first), so one
// organization's huge batch cannot hold every slot while another's batch waits; within an
// organization, in arrival order.

import { Turns } from '../scheduler/turns.js';

export class Slots {
  private free: number;
  /** org -> its waiters, in arrival order. */
  private readonly waiters = new Map<string, Array<() => void>>();
  private readonly turns = new Turns();

  constructor(readonly size: number) {
    this.free = size;
  }

  /** Resolves true with a slot taken, or false (no slot taken) once `signal` aborts. */
  acquire(signal: AbortSignal, org = ''): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.free > 0 && this.waiters.size === 0) {
      this.free -= 1;
      this.turns.take(org);
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const grant = () => {
        signal.removeEventListener('abort', quit);
        resolve(true);
      };
      const quit = () => {
        const queue = this.waiters.get(org);
        const i = queue?.indexOf(grant) ?? -1;
        if (i !== -1) queue!.splice(i, 1);
        if (queue?.length === 0) this.waiters.delete(org);
        resolve(false);
      };
      let queue = this.waiters.get(org);
      if (!queue) this.waiters.set(org, (queue = []));
      queue.push(grant);
      signal.addEventListener('abort', quit, { once: true });
      this.grantFree();
    });
  }

  release(): void {
    this.free += 1;
    this.grantFree();
  }

  /** Hands free slots to waiters, least recently served organization first. */
  private grantFree(): void {
    while (this.free > 0 && this.waiters.size > 0) {
      const org = this.turns.next(this.waiters.keys())!;
      const queue = this.waiters.get(org)!;
      const next = queue.shift()!;
      if (queue.length === 0) this.waiters.delete(org);
      this.free -= 1;
      this.turns.take(org);
      next();
    }
  }
}
