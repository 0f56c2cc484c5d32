// The queue every grammar compile of this process waits in: at most `perTenant` compiles of one
// organization and `total` in all run at once, and when a slot frees the organizations waiting
// take turns (round robin by organization: the fewest compiles running, then the least recently
// served, goes first; first come first served within one). A compile's work,
// and so its time limit, starts only when it leaves the queue: time spent waiting behind other
// organizations' schemas is never counted against its own.
//
// NOTE: `total` stays well under libuv's thread pool (16 threads under the CLI, see
// src/cli/threadpool.ts), where the native grammar compile runs beside the engine's steps (the one
// running and the next); with every compile behind this queue a flood of schemas can take at most
// `total` of those threads, and the steps always find one.

export interface CompileLimits {
  /** Compiles of one organization running at once (default 1). */
  perTenant: number;
  /** Compiles running at once in all (default 2). */
  total: number;
}

export const DEFAULT_COMPILE_LIMITS: CompileLimits = { perTenant: 1, total: 2 };

interface Job {
  tenant: string;
  start(): void;
}

export class CompileQueue {
  readonly limits: CompileLimits;
  /** tenant -> its jobs waiting, oldest first. */
  private readonly waiting = new Map<string, Job[]>();
  /** tenant -> its compiles running. */
  private readonly running = new Map<string, number>();
  /** Tenants with waiting jobs, in turn order (the next to be served first). */
  private turns: string[] = [];
  private numRunning = 0;
  /** tenant -> when it last started a compile (a count), while it has compiles running or waiting. */
  private readonly lastServed = new Map<string, number>();
  private numServed = 0;

  constructor(limits: Partial<CompileLimits> = {}) {
    const total = Math.max(1, Math.floor(limits.total ?? DEFAULT_COMPILE_LIMITS.total));
    const perTenant = Math.max(1, Math.min(total, Math.floor(limits.perTenant ?? DEFAULT_COMPILE_LIMITS.perTenant)));
    this.limits = { perTenant, total };
  }

  /**
   * Runs `work` once a slot is free for `tenant` (an organization id; '' for none) and returns its
   * result; the slot is held until the work settles.
   */
  run<T>(tenant: string, work: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const job: Job = {
        tenant,
        start: () => {
          let result: Promise<T>;
          try {
            result = work();
          } catch (err) {
            result = Promise.reject(err as Error);
          }
          // The slot is free before the caller resumes.
          result.then((value) => { this.release(tenant); resolve(value); }, (err: unknown) => { this.release(tenant); reject(err); });
        },
      };
      const queue = this.waiting.get(tenant);
      if (queue === undefined) {
        this.waiting.set(tenant, [job]);
        this.turns.push(tenant);
      } else {
        queue.push(job);
      }
      this.dispatch();
    });
  }

  /** Compiles running and waiting, in all and for one tenant. */
  counts(tenant?: string): { running: number; waiting: number } {
    if (tenant === undefined) {
      let waiting = 0;
      for (const q of this.waiting.values()) waiting += q.length;
      return { running: this.numRunning, waiting };
    }
    return { running: this.running.get(tenant) ?? 0, waiting: this.waiting.get(tenant)?.length ?? 0 };
  }

  private release(tenant: string): void {
    this.numRunning--;
    const n = (this.running.get(tenant) ?? 1) - 1;
    if (n === 0) this.running.delete(tenant);
    else this.running.set(tenant, n);
    if (n === 0 && !this.waiting.has(tenant)) this.lastServed.delete(tenant);
    this.dispatch();
  }

  /**
   * Starts jobs while slots are free. The next to go is the waiting tenant with the fewest compiles
   * running (under its cap) and, among equals, the one served least recently (never: first).
   */
  private dispatch(): void {
    while (this.numRunning < this.limits.total) {
      let at = -1;
      let fewest = this.limits.perTenant;
      let oldest = Infinity;
      this.turns.forEach((t, i) => {
        const n = this.running.get(t) ?? 0;
        const served = this.lastServed.get(t) ?? -1;
        if (n < fewest || (n === fewest && at >= 0 && served < oldest)) [at, fewest, oldest] = [i, n, served];
      });
      if (at < 0) return;
      const tenant = this.turns[at]!;
      const queue = this.waiting.get(tenant)!;
      const job = queue.shift()!;
      this.turns.splice(at, 1);
      if (queue.length === 0) this.waiting.delete(tenant);
      else this.turns.push(tenant);
      this.numRunning++;
      this.running.set(tenant, (this.running.get(tenant) ?? 0) + 1);
      this.lastServed.set(tenant, this.numServed++);
      job.start();
    }
  }
}

let shared: CompileQueue | undefined;

/**
 * The process's one compile queue (every model's structured outputs share it): 2 compiles at once
 * in all, 1 where libuv's pool has fewer than 8 threads (Node's default is 4: the steps need two).
 */
export function sharedCompileQueue(): CompileQueue {
  const poolThreads = Number(process.env.UV_THREADPOOL_SIZE ?? 4) || 4;
  shared ??= new CompileQueue({ total: Math.max(1, Math.min(DEFAULT_COMPILE_LIMITS.total, Math.floor(poolThreads / 4))) });
  return shared;
}
