// Prompt lookup speculation (src/speculative/ngram-proposer.ts) against a brute-force search: the
// longest suffix (maxN down to minN) found earlier, its latest occurrence, and up to k of the
// tokens that followed it, for every prefix of random sequences over small vocabularies (many
// repeats), fed a token at a time and in chunks.
import { describe, expect, it } from 'vitest';
import { NgramProposer } from '../src/speculative/ngram-proposer.js';

function bruteForce(t: readonly number[], k: number, minN: number, maxN: number): number[] {
  const end = t.length - 1;
  for (let n = Math.min(maxN, t.length - 1); n >= minN; n--) {
    for (let p = end - 1; p >= n - 1; p--) {
      let same = true;
      for (let i = 0; i < n && same; i++) same = t[p - i] === t[end - i];
      if (same) return t.slice(p + 1, Math.min(p + 1 + k, t.length));
    }
  }
  return [];
}

describe('n-gram (prompt lookup) proposals', () => {
  it('continue the latest earlier occurrence of the longest matching suffix', () => {
    const p = new NgramProposer({ minN: 2, maxN: 3 });
    // "5 6 7 8 9 | 1 6 7 2 | 5 6 7": the 3-gram 5 6 7 occurred at the start (-> 8 9 1), the 2-gram 6 7 later (-> 2 ...).
    p.append([5, 6, 7, 8, 9, 1, 6, 7, 2, 5, 6, 7]);
    expect(p.propose(3)).toEqual([8, 9, 1]);
    p.append([4]);
    expect(p.propose(3)).toEqual([]);  // "7 4" never occurred
    // A repetition proposes its own continuation, up to the present.
    const r = new NgramProposer({ minN: 2, maxN: 4 });
    r.append([1, 2, 3, 1, 2, 3, 1, 2]);
    expect(r.propose(5)).toEqual([3, 1, 2]);
  });

  it('agrees with a brute-force search at every prefix, token by token or in chunks', () => {
    let seed = 11;
    const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
    for (let trial = 0; trial < 60; trial++) {
      const vocab = 2 + (trial % 5);
      const [minN, maxN] = trial % 3 === 0 ? [1, 1] : trial % 3 === 1 ? [2, 4] : [3, 5];
      const k = 1 + (trial % 6);
      const seq = Array.from({ length: 80 }, () => rand(vocab));
      const one = new NgramProposer({ minN, maxN });
      const chunked = new NgramProposer({ minN, maxN });
      let fed = 0;
      for (let i = 1; i <= seq.length; i++) {
        one.append([seq[i - 1]!]);
        const want = bruteForce(seq.slice(0, i), k, minN, maxN);
        expect(one.propose(k), `trial ${trial} prefix ${i}`).toEqual(want);
        if (i % 7 === 0 || i === seq.length) {
          chunked.append(seq.slice(fed, i));
          fed = i;
          expect(chunked.propose(k)).toEqual(want);
        }
      }
      // Rewinding gives the proposals of the shorter sequence.
      one.truncate(40);
      expect(one.length).toBe(40);
      expect(one.propose(k)).toEqual(bruteForce(seq.slice(0, 40), k, minN, maxN));
    }
  });

  it('refuses sizes it cannot hold', () => {
    expect(() => new NgramProposer({ minN: 0, maxN: 3 })).toThrow(/1 <= minN <= maxN <= 16/);
    expect(() => new NgramProposer({ minN: 4, maxN: 3 })).toThrow(/1 <= minN <= maxN <= 16/);
    expect(() => new NgramProposer({ minN: 1, maxN: 17 })).toThrow(/1 <= minN <= maxN <= 16/);
  });
});
