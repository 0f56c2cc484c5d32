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
    slots.release();
    expect(await third).toBe(true);
  });

  it('hands freed slots to organizations in turns, not in arrival order', async () => {
    const slots = new Slots(1);
    const signal = new AbortController().signal;
    await slots.acquire(signal, 'big');
    const order: string[] = [];
    const waits = [
      ...Array.from({ length: 4 }, (_, i) => slots.acquire(signal, 'big').then(() => { order.push(`big${i}`); slots.release(); })),
      slots.acquire(signal, 'small').then(() => { order.push('small'); slots.release(); }),
    ];
    slots.release();
    await Promise.all(waits);
    // 'small' never had a slot: it goes before big's queue, though it came last.
    expect(order).toEqual(['small', 'big0', 'big1', 'big2', 'big3']);
  });
});
