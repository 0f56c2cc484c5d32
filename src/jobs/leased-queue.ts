// One leased queue: how work that outlives a request runs under leases (store/leases.ts), each
// piece in one place at a time, on whichever replica has room. Background responses
// (api/background-responses.ts), batch rows and chunks (batches/runner.ts) and completion webhook
// deliveries (webhooks/dispatcher.ts) are its three uses; each brings its store operations
// (LeaseStore) and a worker, and keeps its own fenced writes.
//
// The queue, for one kind of job:
// - claims while there is room (fewer than maxJobs held here), when poked and, with claimOnRenew,
//   after every renewal; a draining or closing queue claims nothing;
// - renews every ttl/3 and stops, with reason LEASE_LOST, the work whose lease the renewal no
//   longer reports (cancelled, or taken over after this process stalled past its lease); when the
//   store cannot be reached, it stops the work whose last renewed lease has run out (another
//   process may take it over) and lets the rest go on;
// - hands back the leases a renewal reports held here while no work runs for them (a worker that
//   ended without ending its job: its end could not be written), so that they run again;
// - gives each worker the owner id its fenced writes name, and a signal that aborts when the lease
//   is lost (LEASE_LOST), at close (CLOSED) or through stop(key, reason);
// - at close aborts every worker with CLOSED, waits for them, and hands back what it held, so that
//   another replica (or the next start) takes it at once; it waits for the store at most a lease's
//   length at each step (an unreachable database must not hold the shutdown: the leases expire);
// - at the start of a store one process owns (SQLite, not shared) first releases every lease the
//   process before left.
//
// NOTE: renewals and claim passes never run at once (one after the other, in order of asking): a
// renewal that ran beside a claim could find a just-claimed job held but not yet running, and
// hand it back. A renewal judges only the work that ran when it began.

import { leaseTerm, type LeaseConfig, type LeaseTerm } from '../store/leases.js';

/** Abort reason of work whose lease this process no longer holds: nothing more of it may be written. */
export const LEASE_LOST: unique symbol = Symbol('lease lost');
/** Abort reason of work stopped by close(): the queue hands its lease back. */
export const CLOSED: unique symbol = Symbol('closed');

/** What a worker gets besides its job. */
export interface JobLease {
  /** This process's replica id: the owner every fenced write of the job names. */
  owner: string;
  /** Aborts with LEASE_LOST, CLOSED, or the reason given to stop(). */
  signal: AbortSignal;
}

/**
 * What a worker resolves with: 'claim-next' asks for a claim at once (its room is free now);
 * anything else waits for the next poke or renewal.
 */
export type WorkEnd = 'claim-next' | void;

/** One kind of job's lease operations on the store. `J`: a job as its worker takes it. */
export interface LeaseStore<J> {
  /** The job's key: what renew() reports and stop()/holds() take. */
  key(job: J): string;
  /**
   * Leases to `term.owner` up to `room` due jobs (Infinity: the kind bounds itself) and returns
   * the ones to run. A claimed job it does not return stays leased here until the next renewal
   * hands it back (releaseUnrun). `closing` aborts at close: no need to prepare more work.
   */
  claim(term: LeaseTerm, room: number, closing: AbortSignal): Promise<J[]>;
  /** Extends every lease `term.owner` holds; resolves the keys still held. `held`: the keys running here. */
  renew(term: LeaseTerm, held: ReadonlySet<string>): Promise<Iterable<string>>;
  /** Hands back leases `owner` holds without running them. Absent: they stay until they expire. */
  releaseUnrun?(owner: string, keys: readonly string[]): Promise<void>;
  /** At close: hands back the leases of `jobs` (stopped or never started here), or all of `owner`'s. */
  handBack(owner: string, jobs: readonly J[]): Promise<void>;
  /** At the start of a store one process owns: hands back every lease, whoever holds it. */
  releaseAll(): Promise<void>;
}

/** How a claim pass ended, for afterClaims. */
export interface ClaimPass {
  /** Unix ms of its last claim (or of its start when it claimed nothing). */
  atMs: number;
  /** No room was left: a worker that ends asks for the next pass. */
  full: boolean;
  /** The claim failed (already logged). */
  error?: unknown;
}

/** The pino-compatible subset the queue logs with. */
export interface QueueLog {
  warn?(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export interface LeasedQueueOptions<J> {
  /** Names the kind in log lines ("background responses"). */
  name: string;
  lease: LeaseConfig;
  store: LeaseStore<J>;
  /** Whether other processes use the store at once; false: releaseAll() at start. */
  shared: boolean;
  /** Runs one job under its lease; must not throw (a throw is logged and ends the work). */
  work(job: J, lease: JobLease): Promise<WorkEnd>;
  /** Jobs held here at once (claims stop at this many); default no limit of the queue's own. */
  maxJobs?: number;
  /** Claim after every successful renewal (ttl/3), besides when poked. */
  claimOnRenew?: boolean;
  /** True while the process drains: nothing is claimed, work goes on. */
  draining?: () => boolean;
  /** Told after every claim pass (a webhook dispatcher then sleeps until the next due delivery). */
  afterClaims?(pass: ClaimPass): Promise<void> | void;
  log: QueueLog;
}

interface Held<J> {
  job: J;
  controller: AbortController;
  done: Promise<void>;
  /** Until when (Unix ms) this process's last claim or renewal of the lease holds it. */
  leaseUntilMs: number;
}

export class LeasedQueue<J> {
  readonly owner: string;
  /** key -> the work running here. */
  private readonly held = new Map<string, Held<J>>();
  /** Keys being leased here by add(): not running yet, not to be handed back by a renewal. */
  private readonly adding = new Set<string>();
  /** Jobs leased to this process after close() began: handed back with the rest. */
  private readonly unstarted: J[] = [];
  private readonly closing = new AbortController();
  private readonly maxJobs: number;
  private started = false;
  private drained = false;
  /** Set first thing in close(): nothing is claimed, renewed or started after it. */
  private closed = false;
  private shutdown: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** The end of the renewals and claim passes asked for so far (they run one after the other). */
  private tail: Promise<void> = Promise.resolve();
  private renewal: Promise<void> | undefined;
  /** A claim pass waiting its turn, and the one running (asked again: it claims once more). */
  private claimQueued: Promise<void> | undefined;
  private claimRunning: Promise<void> | undefined;
  private claimAgain = false;

  constructor(private readonly opts: LeasedQueueOptions<J>) {
    this.owner = opts.lease.owner;
    this.maxJobs = opts.maxJobs ?? Infinity;
  }

  /** Jobs running here now. */
  get size(): number {
    return this.held.size;
  }

  jobs(): IterableIterator<J> {
    return [...this.held.values()].map((h) => h.job).values();
  }

  get(key: string): J | undefined {
    return this.held.get(key)?.job;
  }

  holds(key: string): boolean {
    return this.held.has(key);
  }

  /**
   * Releases every lease at the start of a store one process owns, then renews every ttl/3. Claims
   * begin with the first poke(). A rejected releaseAll() rejects this (nothing started).
   */
  async start(): Promise<void> {
    if (this.started || this.closed) return;
    if (!this.opts.shared) await this.opts.store.releaseAll();
    if (this.closed) return;
    this.started = true;
    this.timer = setInterval(() => this.renewSoon(), Math.max(1, Math.floor(this.opts.lease.ttlMs / 3)));
    this.timer.unref();
  }

  /**
   * Claims now: after the renewal or pass running, or, when a pass is running, once more after it.
   * Resolves when that pass has ended; never rejects (failures are logged).
   */
  poke(): Promise<void> {
    if (!this.started || this.closed) return Promise.resolve();
    if (this.claimQueued) return this.claimQueued;
    if (this.claimRunning) {
      this.claimAgain = true;
      return this.claimRunning;
    }
    const pass: Promise<void> = this.serial(async () => {
      this.claimQueued = undefined;
      this.claimRunning = pass;
      try {
        await this.claimPass();
      } finally {
        this.claimRunning = undefined;
        // Asked again after its last claim (while afterClaims ran): not lost.
        if (this.claimAgain) {
          this.claimAgain = false;
          void this.poke();
        }
      }
    });
    this.claimQueued = pass;
    return pass;
  }

  /** Claims nothing from now on; what runs goes on to its end. */
  drain(): void {
    this.drained = true;
  }

  /**
   * Leases `job` to this process through `write` (which stores it leased under `term`), then runs
   * it here. While `write` runs, a renewal does not hand the job back. Rejects as `write` does.
   */
  async add(job: J, write: (term: LeaseTerm) => Promise<void>): Promise<void> {
    const key = this.opts.store.key(job);
    this.adding.add(key);
    try {
      const term = leaseTerm(this.opts.lease);
      await write(term);
      this.begin(job, term.untilMs);
    } finally {
      this.adding.delete(key);
    }
  }

  /** Aborts the work of `key` with `reason`; resolves when it has ended (undefined: none runs here). */
  stop(key: string, reason: unknown): Promise<void> | undefined {
    const held = this.held.get(key);
    if (!held) return undefined;
    held.controller.abort(reason);
    return held.done;
  }

  /** Resolves once no work runs here and no claim is pending (tests). */
  async idle(): Promise<void> {
    while (this.held.size > 0 || this.claimQueued || this.claimRunning) {
      await Promise.all([this.claimQueued, this.claimRunning, ...[...this.held.values()].map((h) => h.done)]);
    }
  }

  /**
   * Stops renewing and claiming, aborts every worker with CLOSED, waits for them, and hands back
   * what this process held. Safe to call twice.
   */
  close(): Promise<void> {
    this.closed = true;
    this.shutdown ??= this.shutDown();
    return this.shutdown;
  }

  private async shutDown(): Promise<void> {
    const { ttlMs } = this.opts.lease;
    clearInterval(this.timer);
    this.closing.abort(CLOSED);
    const stopped = [...this.held.values()];
    for (const held of stopped) held.controller.abort(CLOSED);
    await settledWithin(this.tail, ttlMs);
    await Promise.all(stopped.map((h) => h.done));
    const jobs = [...stopped.map((h) => h.job), ...this.unstarted.splice(0)];
    if (!this.started && jobs.length === 0) return;
    const handedBack = this.opts.store.handBack(this.owner, jobs).catch((err: unknown) => {
      (this.opts.log.warn ?? this.opts.log.error).call(this.opts.log, { err },
        `${this.opts.name}: could not hand back leases at close; they expire on their own`);
    });
    await settledWithin(handedBack, ttlMs);
  }

  private claiming(): boolean {
    return this.started && !this.closed && !this.drained && !this.opts.draining?.();
  }

  /** Runs `fn` after every renewal and claim pass asked for before it. */
  private serial(fn: () => Promise<void>): Promise<void> {
    const run = this.tail.then(fn);
    this.tail = run.catch(() => {});
    return this.tail;
  }

  /** The timer's tick: one renewal at a time (a slow store skips ticks), then a claim if asked for. */
  private renewSoon(): void {
    if (this.closed || this.renewal) return;
    this.renewal = this.serial(async () => {
      const renewed = await this.renew();
      if (renewed && this.opts.claimOnRenew) void this.poke();
    }).finally(() => { this.renewal = undefined; });
  }

  /** One renewal; false when the store could not be reached. */
  private async renew(): Promise<boolean> {
    if (this.closed) return false;
    const { store, log, name } = this.opts;
    const checked = [...this.held.values()];
    const term = leaseTerm(this.opts.lease);
    let stillHeld: Set<string>;
    try {
      stillHeld = new Set(await store.renew(term, new Set(this.held.keys())));
    } catch (err) {
      if (this.closed) return false;
      log.error({ err }, `${name}: could not renew leases; retrying`);
      const now = Date.now();
      for (const held of checked) if (held.leaseUntilMs <= now) held.controller.abort(LEASE_LOST);
      return false;
    }
    for (const held of checked) {
      if (stillHeld.has(store.key(held.job))) held.leaseUntilMs = term.untilMs;
      else held.controller.abort(LEASE_LOST);
    }
    const unrun = [...stillHeld].filter((key) => !this.held.has(key) && !this.adding.has(key));
    if (unrun.length > 0 && store.releaseUnrun && !this.closed) {
      await store.releaseUnrun(this.owner, unrun)
        .catch((err: unknown) => log.error({ err, keys: unrun }, `${name}: could not hand back leases held without work; retrying`));
    }
    return true;
  }

  /** Claims while there is room and it is asked again; then tells afterClaims. */
  private async claimPass(): Promise<void> {
    const { store, log, name } = this.opts;
    const pass: ClaimPass = { atMs: Date.now(), full: false };
    try {
      do {
        this.claimAgain = false;
        if (!this.claiming()) break;
        const room = this.maxJobs - this.held.size;
        if (room <= 0) {
          pass.full = true;
          break;
        }
        const term = leaseTerm(this.opts.lease);
        pass.atMs = term.nowMs;
        const jobs = await store.claim(term, room, this.closing.signal);
        for (const job of jobs) this.begin(job, term.untilMs);
      } while (this.claimAgain);
    } catch (err) {
      if (this.closed) return;
      pass.error = err;
      log.error({ err }, `${name}: could not claim work; retrying`);
    }
    if (this.closed || !this.opts.afterClaims) return;
    try {
      await this.opts.afterClaims(pass);
    } catch (err) {
      log.error({ err }, `${name}: failed after a claim`);
    }
  }

  /** Runs a job leased until `leaseUntilMs`, unless closing (it is handed back) or already running here. */
  private begin(job: J, leaseUntilMs: number): void {
    const key = this.opts.store.key(job);
    if (this.closed) {
      this.unstarted.push(job);
      return;
    }
    const running = this.held.get(key);
    if (running) {
      // Its lease lapsed while this process stalled and the claim took it back: the work running
      // here goes on under the new lease, not a second one.
      running.leaseUntilMs = leaseUntilMs;
      return;
    }
    const held: Held<J> = { job, controller: new AbortController(), done: Promise.resolve(), leaseUntilMs };
    this.held.set(key, held);
    held.done = this.opts.work(job, { owner: this.owner, signal: held.controller.signal })
      .catch((err: unknown) => {
        this.opts.log.error({ err, job: key }, `${this.opts.name}: work failed`);
      })
      .then((end) => {
        if (this.held.get(key) === held) this.held.delete(key);
        if (end === 'claim-next') void this.poke();
      });
  }
}

/** Resolves once `work` settles or `ms` have passed, whichever comes first; never rejects. */
async function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<void>((resolve) => { timer = setTimeout(resolve, ms); });
  try {
    await Promise.race([work.then(() => {}, () => {}), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
