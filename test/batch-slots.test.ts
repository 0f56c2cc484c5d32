// The batch line slots (src/batches/slots.ts) shared by every running batch: a bounded count,
// and freed slots handed to organizations in turns, so one organization's huge batch does not
// hold every slot while another organization's batch waits.

import { describe, expect, it } from 'vitest';
import { Slots } from '../src/batches/slots.js';

describe('Slots', () => {
  it('never grants more than its size, and a waiter that gives up takes nothing', async () => {
    const slots = new Slots(2);
    const signal = new AbortController().signal;
    expect(await slots.acquire(signal, 'a')).toBe(true);
    expect(await slots.acquire(signal, 'a')).toBe(true);
    const quitter = new AbortController();
    const gaveUp = slots.acquire(quitter.signal, 'a');
    quitter.abort();
    expect(await gaveUp).toBe(false);
    const third = slots.acquire(signal, 'a');
    slots.release('a');
    expect(await third).toBe(true);
  });

  it('hands freed slots to organizations in turns, not in arrival order', async () => {
    const slots = new Slots(1);
    const signal = new AbortController().signal;
    await slots.acquire(signal, 'big');
    const order: string[] = [];
    const waits = [
      ...Array.from({ length: 4 }, (_, i) => slots.acquire(signal, 'big').then(() => { order.push(`big${i}`); slots.release('big'); })),
      slots.acquire(signal, 'small').then(() => { order.push('small'); slots.release('small'); }),
    ];
    slots.release('big');
    await Promise.all(waits);
    // 'small' never had a slot: it goes before big's queue, though it came last.
    expect(order).toEqual(['small', 'big0', 'big1', 'big2', 'big3']);
  });

  it('never gives an organization more slots than its own cap, and gives the rest to others', async () => {
    const slots = new Slots(10);
    const signal = new AbortController().signal;
    const granted: string[] = [];
    const waits = [
      ...Array.from({ length: 8 }, () => slots.acquire(signal, 'big', 3).then(() => granted.push('big'))),
      ...Array.from({ length: 4 }, () => slots.acquire(signal, 'other', 0).then(() => granted.push('other'))),
    ];
    await new Promise((r) => setImmediate(r));
    expect(slots.heldBy('big')).toBe(3);
    expect(slots.heldBy('other')).toBe(4);
    expect(granted.filter((g) => g === 'big')).toHaveLength(3);
    // Free slots stay free rather than go over the cap; a release of big's lets its next one in.
    slots.release('big');
    await new Promise((r) => setImmediate(r));
    expect(slots.heldBy('big')).toBe(3);
    expect(granted.filter((g) => g === 'big')).toHaveLength(4);
    // A newcomer is granted at once while big's waiters are held by their cap.
    expect(await slots.acquire(signal, 'late', 1)).toBe(true);
    for (let i = 0; i < 5; i++) slots.release('big');
    await Promise.all(waits);
    expect(granted.filter((g) => g === 'big')).toHaveLength(8);
    expect(() => slots.release('nobody')).toThrow(/holds no slot/);
  });
});
