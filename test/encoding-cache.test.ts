// The cache of encoded images (src/vision/encoding-cache.ts): keyed by owner, hash and grid, least
// recently used first out within its byte budget.
import { describe, expect, it } from 'vitest';
import { EncodingCache } from '../src/vision/encoding-cache.js';

const rows = (n: number, v: number) => new Float32Array(n).fill(v);

describe('EncodingCache', () => {
  it('keeps owners apart and evicts the least recently used within its budget', () => {
    const cache = new EncodingCache(3 * 400);  // three entries of 100 floats
    const h = new Uint8Array(32).fill(7);
    const key = (owner: string, grid = 10) => EncodingCache.key(owner, h, grid, 10);
    expect(key('a')).not.toBe(key('b'));
    expect(key('a', 10)).not.toBe(key('a', 11));
    cache.set(key('a'), rows(100, 1));
    cache.set(key('b'), rows(100, 2));
    cache.set(key('c'), rows(100, 3));
    expect(cache.get(key('a'))![0]).toBe(1);  // a is now the most recently used
    cache.set(key('d'), rows(100, 4));         // b goes
    expect(cache.get(key('b'))).toBeUndefined();
    expect([key('a'), key('c'), key('d')].map((k) => cache.get(k)![0])).toEqual([1, 3, 4]);
    expect(cache.usedBytes).toBe(1200);
    cache.set(key('a'), rows(200, 5));         // replacing makes room for itself
    expect(cache.usedBytes).toBeLessThanOrEqual(1200);
    expect(cache.get(key('a'))![0]).toBe(5);
    cache.set(key('e'), rows(1000, 6));        // larger than the whole budget: not kept
    expect(cache.get(key('e'))).toBeUndefined();
    const off = new EncodingCache(0);
    off.set(key('a'), rows(1, 1));
    expect(off.size).toBe(0);
  });
});
