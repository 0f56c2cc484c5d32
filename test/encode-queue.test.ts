// The vision tower's queue (src/vision/encode-queue.ts): batches filled one image per organization
// in turn, within the image and pixel limits; the same image asked for twice at once encoded once;
// cached encodings answered without the tower; a failing image failing only its own request; an
// image whose requests all gave up never encoded. The tower here records its batches and returns
// each image's first hash byte as its output, so every answer can be traced to its image.
import { describe, expect, it } from 'vitest';
import type { NativeImage } from '../src/native/native.js';
import { EncodeQueue } from '../src/vision/encode-queue.js';
import { EncodingCache } from '../src/vision/encoding-cache.js';
import type { PreparedImage } from '../src/vision/vision-model.js';

function image(id: number, side = 28): PreparedImage {
  const hash = new Uint8Array(32);
  hash[0] = id;
  const resized = { width: side, height: side, hash, byteLength: side * side * 3, pixels: () => new Uint8Array(0) } as NativeImage;
  return { resized, gridH: side / 28, gridW: side / 28, numTokens: (side / 28) ** 2, hash };
}

/** A tower that records its batches and answers each image with [its id]; ids in `bad` fail the batch. */
function tower(bad = new Set<number>()) {
  const batches: number[][] = [];
  let release: (() => void) | undefined;
  let gate = Promise.resolve();
  const encode = async (images: readonly PreparedImage[]) => {
    const ids = images.map((im) => im.hash[0]!);
    batches.push(ids);
    await gate;
    if (ids.some((id) => bad.has(id))) throw new Error(`image ${ids.find((id) => bad.has(id))} is bad`);
    return ids.map((id) => new Float32Array([id]));
  };
  return {
    batches, encode,
    /** Holds every batch until the returned function is called. */
    hold: () => {
      gate = new Promise<void>((r) => { release = r; });
      return () => release!();
    },
  };
}

const answer = (p: Promise<Float32Array>) => p.then((f) => f[0]);

describe('the vision encode queue', () => {
  it('fills each batch with one image per organization in turn, so one organization\'s many images never hold another\'s back', async () => {
    const t = tower();
    const release = t.hold();
    const q = new EncodeQueue(t.encode, new EncodingCache(1 << 20), { maxImages: 3, maxPixels: 1 << 30 });
    const first = q.encode('a', image(1));  // starts alone at once
    const many = [2, 3, 4, 5, 6].map((id) => q.encode('a', image(id)));
    const b = q.encode('b', image(20));
    const c = [30, 31].map((id) => q.encode('c', image(id)));
    expect(q.waitingImages).toBe(8);
    release();
    expect(await Promise.all([answer(first), ...many.map(answer), answer(b), ...c.map(answer)])).toEqual([1, 2, 3, 4, 5, 6, 20, 30, 31]);
    expect(t.batches).toEqual([[1], [2, 20, 30], [3, 31, 4], [5, 6]]);
  });

  it('sends an image larger than the pixel limit alone, and never exceeds the limit otherwise', async () => {
    const t = tower();
    const release = t.hold();
    const q = new EncodeQueue(t.encode, new EncodingCache(1 << 20), { maxImages: 16, maxPixels: 56 * 56 * 2 + 28 * 28 });
    const all = [q.encode('a', image(1)), q.encode('a', image(2, 112)), q.encode('b', image(3, 56)), q.encode('c', image(4, 56)), q.encode('d', image(5, 28))];
    release();
    await Promise.all(all);
    expect(t.batches).toEqual([[1], [2], [3, 4, 5]]);
    const q2 = new EncodeQueue(t.encode, new EncodingCache(1 << 20), { maxImages: 16, maxPixels: 56 * 56 * 2 });
    await Promise.all([q2.encode('a', image(6)), q2.encode('b', image(7, 56)), q2.encode('c', image(8, 56)), q2.encode('d', image(9))]);
    expect(t.batches.slice(3)).toEqual([[6], [7, 8], [9]]);
  });

  it('encodes the same image asked for twice at once once, and answers it again from the cache', async () => {
    const t = tower();
    const release = t.hold();
    const cache = new EncodingCache(1 << 20);
    const q = new EncodeQueue(t.encode, cache);
    const same = [q.encode('a', image(7)), q.encode('a', image(7))];
    // Another organization's copy is its own.
    const other = q.encode('b', image(7));
    release();
    expect(await Promise.all([...same, other].map(answer))).toEqual([7, 7, 7]);
    expect(t.batches.flat()).toEqual([7, 7]);
    expect(await answer(q.encode('a', image(7)))).toBe(7);
    expect(t.batches.flat()).toEqual([7, 7]);
  });

  it("fails only the request whose image fails, when a batch fails", async () => {
    const t = tower(new Set([2]));
    const release = t.hold();
    const q = new EncodeQueue(t.encode, new EncodingCache(1 << 20));
    const first = q.encode('a', image(1));
    const rest = [q.encode('a', image(2)), q.encode('b', image(3)), q.encode('c', image(4))];
    release();
    expect(await answer(first)).toBe(1);
    await expect(rest[0]).rejects.toThrow(/image 2 is bad/);
    expect(await Promise.all(rest.slice(1).map(answer))).toEqual([3, 4]);
    // The failed batch, then each of its images alone.
    expect(t.batches).toEqual([[1], [2, 3, 4], [2], [3], [4]]);
  });

  it('drops an image whose requests all gave up before its batch, and keeps it for a request still waiting', async () => {
    const t = tower();
    const release = t.hold();
    const q = new EncodeQueue(t.encode, new EncodingCache(1 << 20));
    const first = q.encode('a', image(1));
    const gone = new AbortController(), kept = new AbortController();
    const dropped = q.encode('a', image(2), gone.signal);
    const shared = [q.encode('b', image(3), kept.signal), q.encode('b', image(3))];
    gone.abort(new Error('client went away'));
    kept.abort(new Error('one of two went away'));
    await expect(dropped).rejects.toThrow(/client went away/);
    await expect(shared[0]).rejects.toThrow(/one of two/);
    release();
    expect(await answer(first)).toBe(1);
    expect(await answer(shared[1]!)).toBe(3);
    expect(t.batches).toEqual([[1], [3]]);
    // An aborted signal is refused before anything queues.
    await expect(q.encode('a', image(9), gone.signal)).rejects.toThrow(/client went away/);
    expect(q.waitingImages).toBe(0);
  });
});
