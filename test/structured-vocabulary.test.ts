// The grammar engine's view of a vocabulary: token bytes, UTF-8 fragment checks, and the masks for
// the four lead bytes whose second byte is range-limited (E0, ED, F0, F4).
import { describe, expect, it } from 'vitest';

import { buildGrammarVocabulary, CLEARS_STATE, isUtf8Fragment, KEEPS_STATE, tokenBytes } from '../src/structured/vocabulary.js';

const bytes = (...b: number[]) => Uint8Array.from(b);
/** A byte-level token string for raw bytes (the GPT-2 alphabet: non-printable bytes move to U+0100 on). */
function byteLevel(...b: number[]): string {
  const printable = (x: number) => (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
  const shifted = new Map<number, number>();
  for (let x = 0, n = 0; x < 256; x++) if (!printable(x)) shifted.set(x, 0x100 + n++);
  return b.map((x) => String.fromCodePoint(printable(x) ? x : shifted.get(x)!)).join('');
}

describe('grammar vocabulary', () => {
  it('reads byte-level and byte-fallback tokens as bytes', () => {
    expect([...tokenBytes('\u0120hello', 'byte_level')]).toEqual([0x20, ...Buffer.from('hello')]);
    expect([...tokenBytes(byteLevel(0xe2, 0x82, 0xac), 'byte_level')]).toEqual([0xe2, 0x82, 0xac]);
    expect([...tokenBytes('<0x0A>', 'byte_fallback')]).toEqual([0x0a]);
    expect([...tokenBytes('\u2581caf\u00e9', 'byte_fallback')]).toEqual([0x20, ...Buffer.from('café')]);
  });

  it('tells UTF-8 fragments from bytes that can never be valid', () => {
    for (const ok of [bytes(0x61), bytes(0xc3, 0xa9), bytes(0xa9, 0x61), bytes(0x82, 0xac), bytes(0xe2), bytes(0xe2, 0x82),
      bytes(0xe0, 0xa0, 0x80), bytes(0xed, 0x9f, 0xbf), bytes(0xf0, 0x9f, 0x98, 0x80), bytes(0xf4, 0x8f), bytes(0x61, 0xf0)]) {
      expect(isUtf8Fragment(ok), [...ok].join(' ')).toBe(true);
    }
    for (const bad of [bytes(0xc0, 0x80), bytes(0xc1), bytes(0xf5), bytes(0xff), bytes(0x61, 0xe0, 0x80), bytes(0xed, 0xa0),
      bytes(0xf0, 0x80), bytes(0xf4, 0x90), bytes(0xc3, 0x41), bytes(0x80, 0x80, 0x80, 0x80)]) {
      expect(isUtf8Fragment(bad), [...bad].join(' ')).toBe(false);
    }
  });

  it('drops specials, control characters and invalid UTF-8, and masks what may follow a ranged lead', () => {
    const tokens = [byteLevel(0x61), byteLevel(0xe0), byteLevel(0xa0, 0x80), byteLevel(0x85), byteLevel(0xc0, 0xaa),
      byteLevel(0x01), '<|end|>', byteLevel(0x09), byteLevel(0xed, 0x9f), byteLevel(0x61, 0xf4), undefined];
    const special = tokens.map((t) => t === '<|end|>');
    const v = buildGrammarVocabulary(tokens, special, 'byte_level', tokens.length);
    expect(v.encoded).toEqual([tokens[0], tokens[1], tokens[2], tokens[3], '', '', '', tokens[7], tokens[8], tokens[9], '']);
    expect([...v.after]).toEqual([CLEARS_STATE, 0xe0, CLEARS_STATE, CLEARS_STATE, KEEPS_STATE, KEEPS_STATE, KEEPS_STATE,
      CLEARS_STATE, CLEARS_STATE, 0xf4, KEEPS_STATE]);
    const allowed = (lead: number) => tokens.map((_, id) => (v.allowedAfterLead.get(lead)![id >>> 5]! >>> (id & 31)) & 1);
    // After a lone E0 only A0-BF may follow: token 2 (A0 80) yes, token 3 (85) no; after ED, 85 yes and A0 no.
    expect(allowed(0xe0)[2]).toBe(1);
    expect(allowed(0xe0)[3]).toBe(0);
    expect(allowed(0xed)[2]).toBe(0);
    expect(allowed(0xed)[3]).toBe(1);
    expect(allowed(0xf4)[3]).toBe(1);
    expect(allowed(0xf0)[3]).toBe(0);
  });
});
