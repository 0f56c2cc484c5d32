// The process's image preparation slots (src/vision/preparation-slots.ts): at most `limit`
// preparations run at once, the rest start in arrival order as slots free, a failing one frees its
// slot, and one whose request is cancelled while waiting leaves the line without running.
import { describe, expect, it } from 'vitest';
import { PreparationSlots } from '../src/vision/preparation-slots.js';

/** A preparation that runs until its release() is called, recording when it starts. */
function gated(started: number[], id: number) {
  let release!: (fail?: boolean) => void;
  const done = new Promise<void>((resolve, reject) => { release = (fail) => (fail ? reject(new Error(`job ${id} failed`)) : resolve()); });
  return { work: async () => { started.push(id); await done; return id; }, release };
}

describe('image preparation slots', () => {
  it('runs at most `limit` at once and starts the rest in arrival order, a failure freeing its slot', async () => {
    const slots = new PreparationSlots(2);
    const started: number[] = [];
    const jobs = [1, 2, 3, 4, 5].map((id) => gated(started, id));
    const results = jobs.map((j) => slots.run(j.work).catch((e: Error) => e.message));
    await Promise.resolve();
    expect(started).toEqual([1, 2]);
    jobs[1]!.release(true);
    await expect(results[1]).resolves.toBe('job 2 failed');
    expect(started).toEqual([1, 2, 3]);
    jobs[0]!.release();
    jobs[2]!.release();
    await Promise.all([results[0], results[2]]);
    expect(started).toEqual([1, 2, 3, 4, 5]);
    jobs[3]!.release();
    jobs[4]!.release();
    expect(await Promise.all(results)).toEqual([1, 'job 2 failed', 3, 4, 5]);
    // All slots free again: the next one starts at once.
    const again = gated(started, 6);
    const r = slots.run(again.work);
    await Promise.resolve();
    expect(started.at(-1)).toBe(6);
    again.release();
    expect(await r).toBe(6);
  });

  it('lets a cancelled request leave the line without running its preparation', async () => {
    const slots = new PreparationSlots(1);
    const started: number[] = [];
    const first = gated(started, 1), second = gated(started, 2), third = gated(started, 3);
    const controller = new AbortController();
    const r1 = slots.run(first.work);
    const r2 = slots.run(second.work, controller.signal);
    const r3 = slots.run(third.work);
    controller.abort(new Error('client went away'));
    await expect(r2).rejects.toThrow(/client went away/);
    first.release();
    expect(await r1).toBe(1);
    await Promise.resolve();
    expect(started).toEqual([1, 3]);
    third.release();
    expect(await r3).toBe(3);
    await expect(slots.run(second.work, controller.signal)).rejects.toThrow(/client went away/);
    expect(() => new PreparationSlots(0)).toThrow(/positive integer/);
  });
});
