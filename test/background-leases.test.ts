// BackgroundResponses under leases, on a real store with a stand-in generation service whose runs
// last until they are aborted: claims stop at maxRuns and while the process drains; a run whose
// job is cancelled on another replica is stopped at the next renewal without writing; a job taken
// over but not run (the store failed meanwhile) is handed back and runs after all; a job whose
// response is gone is dropped; close() hands the leases back so that another replica takes the
// jobs at once. Leases of 600 ms.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import type { FastifyBaseLogger } from 'fastify';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { BackgroundResponses } from '../src/jobs/background-responses.js';
import { RequestLifecycle } from '../src/serving/lifecycle.js';
import type { GenerationService } from '../src/serving/generation-service.js';
import { leaseConfig, leaseTerm } from '../src/store/leases.js';
import { SqliteStore } from '../src/store/sqlite-store.js';
import type { BackgroundJob } from '../src/store/store.js';

const quiet = { info() {}, warn() {}, error() {}, debug() {} } as unknown as FastifyBaseLogger;

/** prepare() echoes the request; a run lasts until its signal aborts (then rejects, as the engine does). */
function standInService(): GenerationService {
  return {
    registry: { models: [] },
    prepare: async (request: Record<string, unknown>) => ({ request, window: 'standard' }),
    runChoices: (_choices: unknown, signal: AbortSignal) => new Promise((_resolve, reject) => {
      signal.addEventListener('abort', () => reject(new Error('aborted')), { once: true });
    }),
  } as unknown as GenerationService;
}

describe('background responses under leases', () => {
  let dir: string;
  let store: SqliteStore;
  let org: string;
  const open: BackgroundResponses[] = [];
  const background = (opts: { maxRuns?: number; draining?: () => boolean } = {}) => {
    const b = new BackgroundResponses({
      store, lifecycle: new RequestLifecycle({ service: standInService(), store }), deadlines: { asap: 600, standard: 600, flex: 600 }, log: quiet,
      lease: leaseConfig(600), ...opts,
    });
    open.push(b);
    return b;
  };
  /** A job whose lease is free (as a stopped replica leaves it), or held by `owner` for a minute. */
  const orphan = async (id: string, owner?: string) => {
    const now = Math.floor(Date.now() / 1000);
    const job: BackgroundJob = { responseId: id, orgId: org, deadlineAt: now + 600, request: { model: 'm' }, createdAt: now, window: 'standard' };
    const lease = owner ? leaseTerm(leaseConfig(60_000, owner)) : { owner: 'rpl_gone', nowMs: 0, untilMs: 1 };
    await store.insertBackgroundResponse({ id, status: 'in_progress', created_at: now }, job, lease);
  };
  const owners = () => store.listBackgroundJobs().then((jobs) => jobs.length);

  beforeEach(async () => {
    dir = mkdtempSync(join(os.tmpdir(), 'sluice-bg-leases-'));
    store = new SqliteStore(join(dir, 'sluice.db'));
    org = (await store.ensureOrganization('o')).id;
  });
  afterEach(async () => {
    for (const b of open.splice(0)) await b.close();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('claims free jobs up to maxRuns, and none while draining', async () => {
    for (const id of ['resp_1', 'resp_2', 'resp_3']) await orphan(id);
    let draining = true;
    const b = background({ maxRuns: 2, draining: () => draining });
    await b.recover();
    expect(b.numInProgress(org)).toBe(0);
    draining = false;
    await vi.waitFor(() => expect(b.numInProgress(org)).toBe(2), { timeout: 10_000 });
    // The third stays free for another replica.
    expect((await store.claimBackgroundJobs(leaseTerm(leaseConfig(600, 'rpl_other')), 5)).map((j) => j.responseId)).toEqual(['resp_3']);
    expect(await owners()).toBe(3);
  });

  it('stops, without writing, a run whose job was cancelled on another replica', async () => {
    await orphan('resp_1');
    const b = background();
    await b.recover();
    expect(b.numInProgress(org)).toBe(1);
    const cancelled = { id: 'resp_1', status: 'cancelled', created_at: 1 };
    expect(await store.cancelBackgroundResponse(org, cancelled)).toBe(true);
    await vi.waitFor(() => expect(b.numInProgress(org)).toBe(0), { timeout: 10_000 });
    expect(await store.getResponse(org, 'resp_1')).toEqual(cancelled);
    expect(await store.listUsage({})).toEqual([]);
  });

  it('hands back a job it took over but could not start, so that it runs after all; drops a job without a response', async () => {
    await orphan('resp_1');
    await orphan('resp_gone');
    await store.deleteResponse(org, 'resp_gone');
    const getResponse = vi.spyOn(store, 'getResponse').mockRejectedValueOnce(new Error('the database went away'));
    const b = background();
    await b.recover();
    await vi.waitFor(() => expect(b.numInProgress(org)).toBe(1), { timeout: 10_000 });
    expect(getResponse).toHaveBeenCalledTimes(3);
    expect((await store.listBackgroundJobs()).map((j) => j.responseId)).toEqual(['resp_1']);
  });

  it('close() stops the runs without an outcome and hands their leases back at once', async () => {
    await orphan('resp_1');
    await orphan('resp_2');
    const b = background();
    await b.recover();
    expect(b.numInProgress(org)).toBe(2);
    expect(await store.claimBackgroundJobs(leaseTerm(leaseConfig(600, 'rpl_other')), 5)).toEqual([]);
    await b.close();
    expect((await store.getResponse(org, 'resp_1'))!.status).toBe('in_progress');
    expect((await store.claimBackgroundJobs(leaseTerm(leaseConfig(600, 'rpl_other')), 5)).map((j) => j.responseId).sort())
      .toEqual(['resp_1', 'resp_2']);
  });

  it('cancels here a run it holds, and in the store one it does not run', async () => {
    await orphan('resp_here');
    const b = background();
    await b.recover();
    expect((await b.cancel(org, 'resp_here'))!.status).toBe('cancelled');
    expect(b.numInProgress(org)).toBe(0);
    await orphan('resp_elsewhere', 'rpl_other');
    expect((await b.cancel(org, 'resp_elsewhere'))!.status).toBe('cancelled');
    expect(await store.renewLeases(leaseTerm(leaseConfig(60_000, 'rpl_other')))).toEqual([]);
    expect(await b.cancel(org, 'resp_nope')).toBeUndefined();
    expect(await owners()).toBe(0);
  });
});
