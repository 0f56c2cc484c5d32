// A counting semaphore shared by every running batch: the number of request lines in flight at
// once, across batches, never exceeds its size. Waiters are served in arrival order.

export class Slots {
  private free: number;
  private readonly waiters: Array<() => void> = [];

  constructor(readonly size: number) {
    this.free = size;
  }

  /** Resolves true with a slot taken, or false (no slot taken) once `signal` aborts. */
  acquire(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.free > 0) {
      this.free -= 1;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const grant = () => {
        signal.removeEventListener('abort', quit);
        resolve(true);
      };
      const quit = () => {
        const i = this.waiters.indexOf(grant);
        if (i !== -1) this.waiters.splice(i, 1);
        resolve(false);
      };
      this.waiters.push(grant);
      signal.addEventListener('abort', quit, { once: true });
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) next(); // the slot passes straight to the next waiter
    else this.free += 1;
  }
}
