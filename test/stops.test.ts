// Unit tests of stop conditions (src/text/stops.ts): eos ids, token limit, stop strings that
// span tokens, and the hold-back that keeps partial stop strings out of streamed text.

import { describe, expect, it } from 'vitest';
import { StopChecker, type StopUpdate } from '../src/text/stops.js';

const EOS = 99;

/** Feeds (tokenId, text) pairs until the checker finishes; returns every update. */
function feed(checker: StopChecker, deltas: Array<string | number>): StopUpdate[] {
  const updates: StopUpdate[] = [];
  for (const delta of deltas) {
    updates.push(typeof delta === 'number' ? checker.push(delta, '') : checker.push(1, delta));
    if (checker.isFinished) break;
  }
  return updates;
}

const textOf = (updates: StopUpdate[]) => updates.map((u) => u.text).join('');

describe('StopChecker', () => {
  it('finishes with stop on an eos id, releasing held text', () => {
    const checker = new StopChecker({ eosTokenIds: new Set([EOS]), maxTokens: 10, stopStrings: ['###'] });
    const updates = feed(checker, ['hello #', EOS, 'never']);
    expect(updates.map((u) => u.text)).toEqual(['hello ', '#']);
    expect(updates.at(-1)!.finishReason).toBe('stop');
    expect(updates.at(-1)!.stopString).toBeUndefined();
  });

  it('finishes with length at maxTokens, releasing held text', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 3, stopStrings: ['END'] });
    const updates = feed(checker, ['a', 'b', 'cE', 'd']);
    expect(updates).toHaveLength(3);
    expect(textOf(updates)).toBe('abcE');
    expect(updates[2]!.finishReason).toBe('length');
  });

  it('cuts the text before a stop string inside one delta', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 10, stopStrings: ['\n\n'] });
    const updates = feed(checker, ['one\n\ntwo']);
    expect(updates).toEqual([{ text: 'one', finishReason: 'stop', stopString: '\n\n' }]);
  });

  it('matches a stop string spanning tokens and never streams part of it', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 10, stopStrings: ['END'] });
    const updates = feed(checker, ['foo E', 'N', 'D bar']);
    expect(updates.map((u) => u.text)).toEqual(['foo ', '', '']);
    expect(updates[2]!.finishReason).toBe('stop');
    expect(updates[2]!.stopString).toBe('END');
  });

  it('releases held text once it can no longer start a stop string', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 10, stopStrings: ['xyz'] });
    const updates = feed(checker, ['hello x', 'y', 'a', 'b']);
    expect(updates.map((u) => u.text)).toEqual(['hello ', '', 'xya', 'b']);
    expect(updates.every((u) => u.finishReason === undefined)).toBe(true);
  });

  it('handles self-overlapping stop strings', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 10, stopStrings: ['abab'] });
    const updates = feed(checker, ['xab', 'a', 'bab']);
    expect(textOf(updates)).toBe('x');
    expect(updates.at(-1)!.finishReason).toBe('stop');
  });

  it('cuts at the earliest of several stop strings', () => {
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 10, stopStrings: ['world', 'lo'] });
    const updates = feed(checker, ['hello world']);
    expect(updates).toEqual([{ text: 'hel', finishReason: 'stop', stopString: 'lo' }]);
  });

  it('streams text that never contains a prefix of a stop string at its end', () => {
    const stop = '</answer>';
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 100, stopStrings: [stop] });
    const pieces = ['The <', '/ans', 'wer is 4 <', '/', 'answer', '> trailing'];
    const updates = feed(checker, pieces);
    let streamed = '';
    for (const u of updates) {
      streamed += u.text;
      expect(streamed.includes(stop)).toBe(false);
    }
    expect(streamed).toBe('The </answer is 4 ');
    expect(updates.at(-1)!.finishReason).toBe('stop');
  });

  it('rejects bad options and pushes after finishing', () => {
    expect(() => new StopChecker({ eosTokenIds: new Set(), maxTokens: 0 })).toThrow(RangeError);
    expect(() => new StopChecker({ eosTokenIds: new Set(), maxTokens: 1, stopStrings: [''] })).toThrow(RangeError);
    const checker = new StopChecker({ eosTokenIds: new Set(), maxTokens: 1 });
    expect(checker.push(1, 'a').finishReason).toBe('length');
    expect(() => checker.push(1, 'b')).toThrow();
  });
});
