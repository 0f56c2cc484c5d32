// The leased queue (src/jobs/leased-queue.ts) on an in-memory store of leased rows, with fake
// timers and clock: renewal every ttl/3 keeps a long job's lease, a lost lease (or one that ran
// out while the store was unreachable) aborts the worker with LEASE_LOST, claims stop at maxJobs
// and while draining, a worker's end makes room at once, a job held without work is handed back
// at the next renewal, a job re-claimed while it runs here is not started twice, add() is not
// handed back mid-write, and close() aborts with CLOSED, waits and hands back what it held.
// The real stores' lease operations are covered by the background, batch and webhook lease tests.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { CLOSED, LEASE_LOST, LeasedQueue, type JobLease, type LeasedQueueOptions, type WorkEnd } from '../src/jobs/leased-queue.js';
import { leaseConfig, type LeaseTerm } from '../src/store/leases.js';

const TTL_MS = 300;

interface Row {
  owner: string | null;
  untilMs: number;
  done: boolean;
}

/** Leased rows keyed by id; a job is its id. */
class FakeLeases {
  readonly rows = new Map<string, Row>();
  renewals: number[] = [];
  releaseAllCalls = 0;
  handedBack: string[][] = [];
  releasedUnrun: string[] = [];
  /** Set: renew() rejects (the database is unreachable). */
  unreachable = false;
  /** Set: claim() waits for it before answering. */
  claimGate: Promise<void> | undefined;

  add(...ids: string[]): void {
    for (const id of ids) this.rows.set(id, { owner: null, untilMs: 0, done: false });
  }

  async claim(term: LeaseTerm, room: number): Promise<string[]> {
    await this.claimGate;
    const due = [...this.rows].filter(([, r]) => !r.done && (r.owner === null || r.untilMs <= term.nowMs)).slice(0, room);
    for (const [, row] of due) Object.assign(row, { owner: term.owner, untilMs: term.untilMs });
    return due.map(([id]) => id);
  }

  async renew(term: LeaseTerm): Promise<string[]> {
    this.renewals.push(term.nowMs);
    if (this.unreachable) throw new Error('the database went away');
    const held = [...this.rows].filter(([, r]) => !r.done && r.owner === term.owner);
    for (const [, row] of held) row.untilMs = term.untilMs;
    return held.map(([id]) => id);
  }

  /** A fenced end: written only while `owner` holds the row. */
  finish(id: string, owner: string): boolean {
    const row = this.rows.get(id)!;
    if (row.owner !== owner || row.done) return false;
    Object.assign(row, { done: true, owner: null, untilMs: 0 });
    return true;
  }

  free(ids: Iterable<string>): void {
    for (const id of ids) Object.assign(this.rows.get(id)!, { owner: null, untilMs: 0 });
  }

  ownedBy(owner: string): string[] {
    return [...this.rows].filter(([, r]) => r.owner === owner).map(([id]) => id).sort();
  }
}

/** A worker per job that runs until told to end (or aborted), recording how each ended. */
class Workers {
  private readonly ends = new Map<string, (end: WorkEnd) => void>();
  readonly started: string[] = [];
  readonly aborted = new Map<string, unknown>();

  constructor(private readonly leases: FakeLeases) {}

  readonly work = (id: string, lease: JobLease): Promise<WorkEnd> => {
    this.started.push(id);
    return new Promise<WorkEnd>((resolve) => {
      lease.signal.addEventListener('abort', () => {
        this.aborted.set(id, lease.signal.reason);
        resolve();
      }, { once: true });
      this.ends.set(id, (end) => {
        this.leases.finish(id, lease.owner);
        resolve(end);
      });
    });
  };

  /** Ends job `id` with its fenced write. */
  end(id: string, end: WorkEnd = undefined): void {
    this.ends.get(id)!(end);
  }
}

describe('leased queue', () => {
  let leases: FakeLeases;
  let workers: Workers;
  const queues: LeasedQueue<string>[] = [];
  const errors: string[] = [];

  function queue(opts: Partial<LeasedQueueOptions<string>> = {}, owner = 'rpl_here'): LeasedQueue<string> {
    const q = new LeasedQueue<string>({
      name: 'test jobs',
      lease: leaseConfig(TTL_MS, owner),
      shared: true,
      log: { error: (_obj, msg) => void errors.push(msg) },
      claimOnRenew: true,
      store: {
        key: (id) => id,
        claim: (term, room) => leases.claim(term, room),
        renew: (term) => leases.renew(term),
        releaseUnrun: async (_owner, keys) => {
          leases.releasedUnrun.push(...keys);
          leases.free(keys);
        },
        handBack: async (who, jobs) => {
          leases.handedBack.push([...jobs]);
          leases.free(leases.ownedBy(who));
        },
        releaseAll: async () => {
          leases.releaseAllCalls++;
          leases.free(leases.rows.keys());
        },
      },
      work: workers.work,
      ...opts,
    });
    queues.push(q);
    return q;
  }

  /** Lets the promise chains run, moving the fake clock by `ms`. */
  const elapse = (ms = 0) => vi.advanceTimersByTimeAsync(ms);

  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    leases = new FakeLeases();
    workers = new Workers(leases);
    errors.length = 0;
  });
  afterEach(async () => {
    const closing = Promise.all(queues.splice(0).map((q) => q.close()));
    await elapse(TTL_MS);
    await closing;
    vi.useRealTimers();
  });

  it('renews every ttl/3, so a job that runs for many lease lengths stays here and no other owner can claim it', async () => {
    leases.add('job_1');
    const q = queue();
    await q.start();
    await q.poke();
    expect(workers.started).toEqual(['job_1']);
    const startedAt = Date.now();
    await elapse(10 * TTL_MS);
    // One renewal every 100 ms.
    expect(leases.renewals.map((t) => t - startedAt)).toEqual(Array.from({ length: 30 }, (_, i) => 100 * (i + 1)));
    expect(leases.rows.get('job_1')!.untilMs).toBeGreaterThan(Date.now());
    expect(await leases.claim({ owner: 'rpl_other', nowMs: Date.now(), untilMs: Date.now() + TTL_MS }, 5)).toEqual([]);
    expect(q.holds('job_1')).toBe(true);
    workers.end('job_1');
    await elapse();
    expect(q.size).toBe(0);
    expect(leases.rows.get('job_1')).toEqual({ owner: null, untilMs: 0, done: true });
  });

  it('aborts a worker with LEASE_LOST at the first renewal after its job was taken over, and its fenced end writes nothing', async () => {
    leases.add('job_1', 'job_2');
    const q = queue();
    await q.start();
    await q.poke();
    // Another replica takes job_1 over (as after this process stalled past its lease).
    Object.assign(leases.rows.get('job_1')!, { owner: 'rpl_other', untilMs: Date.now() + 60_000 });
    await elapse(TTL_MS / 3);
    expect(workers.aborted).toEqual(new Map([['job_1', LEASE_LOST]]));
    expect(q.holds('job_1')).toBe(false);
    expect(leases.finish('job_1', 'rpl_here')).toBe(false);
    expect(leases.rows.get('job_1')!.owner).toBe('rpl_other');
    // job_2 still holds.
    expect(q.holds('job_2')).toBe(true);
  });

  it('while the store is unreachable, stops only the work whose lease has run out', async () => {
    leases.add('job_1');
    const q = queue();
    await q.start();
    await q.poke();
    leases.unreachable = true;
    // The renewals at 100 and 200 ms fail; the lease taken at 0 still holds until 300 ms.
    await elapse(2 * TTL_MS / 3);
    expect(workers.aborted.size).toBe(0);
    expect(errors).toEqual(['test jobs: could not renew leases; retrying', 'test jobs: could not renew leases; retrying']);
    await elapse(TTL_MS / 3);
    expect(workers.aborted).toEqual(new Map([['job_1', LEASE_LOST]]));
    expect(q.size).toBe(0);
  });

  it('claims no more than maxJobs, none while draining, and at once when a worker ends asking for it', async () => {
    leases.add('job_1', 'job_2', 'job_3', 'job_4');
    let draining = true;
    const q = queue({ maxJobs: 2, draining: () => draining });
    await q.start();
    await q.poke();
    await elapse(TTL_MS);
    expect(workers.started).toEqual([]);
    draining = false;
    await elapse(TTL_MS / 3);
    expect(workers.started).toEqual(['job_1', 'job_2']);
    expect(leases.ownedBy('rpl_here')).toEqual(['job_1', 'job_2']);
    // A worker's end frees room: the next job is claimed without waiting for a renewal.
    workers.end('job_1', 'claim-next');
    await elapse();
    expect(workers.started).toEqual(['job_1', 'job_2', 'job_3']);
    q.drain();
    workers.end('job_2', 'claim-next');
    await elapse(TTL_MS);
    expect(workers.started).toEqual(['job_1', 'job_2', 'job_3']);
    expect(leases.ownedBy('rpl_here')).toEqual(['job_3']);
  });

  it('hands back at the next renewal a job it holds without work, so that it is claimed and runs again', async () => {
    leases.add('job_1');
    // The first run ends without its fenced end (as when the end could not be stored).
    let runs = 0;
    const q = queue({
      work: async (id, lease) => {
        runs++;
        if (runs === 1) return undefined;
        return workers.work(id, lease);
      },
    });
    await q.start();
    await q.poke();
    expect(runs).toBe(1);
    expect(leases.ownedBy('rpl_here')).toEqual(['job_1']);
    await elapse(TTL_MS / 3);
    expect(leases.releasedUnrun).toEqual(['job_1']);
    // Claimed again right after that renewal.
    expect(runs).toBe(2);
    expect(q.holds('job_1')).toBe(true);
  });

  it('does not start a second worker for a job claimed again while it runs here; the claim renews its lease', async () => {
    leases.add('job_1');
    const q = queue({ claimOnRenew: false });
    await q.start();
    await q.poke();
    // The process stalls past its lease (no renewal ran); its next claim takes the job back.
    leases.rows.get('job_1')!.untilMs = Date.now() - 1;
    vi.setSystemTime(Date.now() + 2 * TTL_MS);
    await q.poke();
    expect(workers.started).toEqual(['job_1']);
    expect(leases.rows.get('job_1')).toMatchObject({ owner: 'rpl_here', untilMs: Date.now() + TTL_MS });
    expect(workers.aborted.size).toBe(0);
  });

  it('does not hand back a job that add() is still storing', async () => {
    const q = queue();
    await q.start();
    let stored!: () => void;
    const adding = q.add('job_new', async (term) => {
      leases.rows.set('job_new', { owner: term.owner, untilMs: term.untilMs, done: false });
      await new Promise<void>((resolve) => { stored = resolve; });
    });
    await elapse(TTL_MS / 3);
    expect(leases.renewals).toHaveLength(1);
    expect(leases.releasedUnrun).toEqual([]);
    stored();
    await adding;
    expect(workers.started).toEqual(['job_new']);
    expect(q.holds('job_new')).toBe(true);
  });

  it('close() aborts the workers with CLOSED, waits for them, and hands back what they held and what a late claim took', async () => {
    leases.add('job_1', 'job_2');
    const q = queue({ maxJobs: 2 });
    await q.start();
    await q.poke();
    leases.add('job_3');
    workers.end('job_2', 'claim-next');
    // The claim that follows job_2's end answers only after close() began.
    let answer!: () => void;
    leases.claimGate = new Promise<void>((resolve) => { answer = resolve; });
    await elapse();
    const closed = q.close();
    expect(workers.aborted).toEqual(new Map([['job_1', CLOSED]]));
    answer();
    await elapse();
    await closed;
    expect(workers.started).toEqual(['job_1', 'job_2']);
    expect(leases.handedBack).toEqual([['job_1', 'job_3']]);
    expect(leases.ownedBy('rpl_here')).toEqual([]);
    // Closed: nothing is renewed or claimed any more.
    const renewals = leases.renewals.length;
    await elapse(TTL_MS);
    expect(leases.renewals).toHaveLength(renewals);
    await q.poke();
    expect(workers.started).toEqual(['job_1', 'job_2']);
  });

  it('releases every lease at the start of a store one process owns, and none on a shared one', async () => {
    leases.add('job_1');
    Object.assign(leases.rows.get('job_1')!, { owner: 'rpl_dead', untilMs: Date.now() + 60_000 });
    const shared = queue({}, 'rpl_a');
    await shared.start();
    await shared.poke();
    expect(leases.releaseAllCalls).toBe(0);
    expect(workers.started).toEqual([]);
    const lone = queue({ shared: false }, 'rpl_b');
    await lone.start();
    await lone.poke();
    expect(leases.releaseAllCalls).toBe(1);
    expect(workers.started).toEqual(['job_1']);
    expect(leases.ownedBy('rpl_b')).toEqual(['job_1']);
  });
});
