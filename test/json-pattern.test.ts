// JSON schema patterns rewritten for the grammar compiler (issue 27): whatever raw text between a
// JSON string's quotes the rewritten regex admits is a valid JSON string body whose value matches
// the original pattern (ECMAScript, u flag: ajv's reading); quote, backslash and control
// characters appear only escaped; unsupported constructs are refused by name.
import { describe, expect, it } from 'vitest';

import { jsonPattern, PatternError } from '../src/structured/json-pattern.js';

/** Deterministic random raw texts over an alphabet of the characters that matter. */
function* texts(alphabet: string[], count: number, maxLength: number, seed: number): Generator<string> {
  let s = seed;
  const random = () => (s = (s * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
  for (let n = 0; n < count; n++) {
    const length = Math.floor(random() * (maxLength + 1));
    let t = '';
    for (let i = 0; i < length; i++) t += alphabet[Math.floor(random() * alphabet.length)]!;
    yield t;
  }
}

const RAW = ['a', 'b', 'Z', '0', '7', ' ', '_', '-', '.', '"', '\\', 'n', 't', 'u', '\n', '\t', '\u0001', '\u007f', 'é', '\u00a0', '\u2028', '😀'];
const VALUES = ['a', 'Z', '0', ' ', '_', '"', '\\', '\n', '\t', '\r', '\u000b', '\u0001', 'é', '\u00a0', '\u2028', '😀', '/'];

const PATTERNS = [
  '^\\W+$', '^\\S{1,3}$', '^\\s*$', '^[\\s\\S]{2}$', '^\\D\\w$', '^[^a]+$', '^["\\\\]+$', '^a"b$', '^[^"]*$', '^.{0,4}$',
  '^\\n\\t$', '^[\\x00-\\x1f]$', 'a|b', '^(a|"|\\\\)+$', '^[\\w-]+\\.[a-z]{2,3}$', '^[\\u00a0-\\u00bf]?$', '^\\u{1F600}|x$',
  '^(?:[0-9]{2}|[a-z])*$', '^[^\\S\\n]+$', '^\\/path\\/\\d+$', '^\\n\\t?$', '^a"?\\\\{0,2}$', '^[\\x01"]{2}$',
];

describe('JSON-safe patterns', () => {
  it('every raw text the rewritten regex admits is a JSON string body whose value matches the original pattern', () => {
    const failures: string[] = [];
    let admitted = 0;
    for (const pattern of PATTERNS) {
      const original = new RegExp(pattern, 'u');
      const rewritten = new RegExp(jsonPattern(pattern).regex, 'u');
      // Raw texts, including unescaped quotes and backslashes, and the encodings of random values.
      const candidates = [...texts(RAW, 3000, 6, 1)];
      for (const v of texts(VALUES, 3000, 5, 2)) candidates.push(JSON.stringify(v).slice(1, -1));
      for (const text of candidates) {
        if (!rewritten.test(text)) continue;
        admitted++;
        let value: string;
        try {
          value = JSON.parse(`"${text}"`) as string;
        } catch {
          failures.push(`${pattern}: admits ${JSON.stringify(text)}, not a JSON string body`);
          continue;
        }
        if (!original.test(value)) failures.push(`${pattern}: admits ${JSON.stringify(text)}, whose value ${JSON.stringify(value)} does not match`);
        if (value.includes('\u0000') || /[\ud800-\udfff]/u.test(value)) failures.push(`${pattern}: admits NUL or a lone surrogate`);
      }
    }
    expect(failures.slice(0, 10)).toEqual([]);
    expect(admitted).toBeGreaterThan(1000);
  });

  it('keeps what the pattern names: quotes, backslashes and control characters are written escaped', () => {
    const admits = (pattern: string, value: string) => new RegExp(jsonPattern(pattern).regex, 'u').test(JSON.stringify(value).slice(1, -1));
    expect(admits('^a"b$', 'a"b')).toBe(true);
    expect(admits('^["\\\\]+$', '"\\"')).toBe(true);
    expect(admits('^\\n\\t$', '\n\t')).toBe(true);
    expect(admits('^\\s$', '\u000b')).toBe(true);
    expect(admits('^[\\x00-\\x1f]$', '\u0001')).toBe(true);
    // A quantifier after an escape covers the whole escape: \t? is all of "\\t" or nothing, never a lone backslash.
    expect(new RegExp(jsonPattern('^\\n\\t?$').regex, 'u').test('\\n\\')).toBe(false);
    expect(admits('^\\n\\t?$', '\n')).toBe(true);
    // From a negation (., [^..], \S, \W, \D) they never come.
    for (const pattern of ['^.$', '^[^a]$', '^\\S$', '^\\W$', '^\\D$']) {
      for (const value of ['"', '\\', '\u0001']) expect(admits(pattern, value), `${pattern} ${JSON.stringify(value)}`).toBe(false);
    }
    // ECMAScript's classes, not xgrammar's: \S excludes U+2028 and U+00A0, . excludes U+2028.
    expect(admits('^\\S$', '\u2028')).toBe(false);
    expect(admits('^\\S$', '\u00a0')).toBe(false);
    expect(admits('^.$', '\u2028')).toBe(false);
  });

  it('names no character above U+007F inside a class (xgrammar reads it by its low byte): all of them, a few listed, or none', () => {
    const admits = (pattern: string, value: string) => new RegExp(jsonPattern(pattern).regex, 'u').test(JSON.stringify(value).slice(1, -1));
    for (const pattern of ['^.$', '^\\S$', '^[^é]$', '^\\s$', '^[à-ÿ]$', '^[a\\u2028-\\u2029]$', '^[^a]$', '^[\\u4e00-\\u9fff0-9]$']) {
      expect(jsonPattern(pattern).regex, pattern).not.toMatch(/\[[^\]]*\\u\{/);
    }
    expect(admits('^[^a]$', 'é')).toBe(true);  // every non-ASCII character: a negated ASCII class
    expect(admits('^[à-ÿ]$', 'é')).toBe(true);  // a few: listed
    expect(admits('^\\s$', '\u3000')).toBe(true);
    // All but a few (., \S, [^é]) or many (a CJK range): only the ASCII ones are generated.
    expect(admits('^.$', 'é')).toBe(false);
    expect(admits('^.$', 'e')).toBe(true);
    expect(admits('^[\\u4e00-\\u9fff0-9]$', '中')).toBe(false);
    expect(() => jsonPattern('^[\\u4e00-\\u9fff]$')).toThrow(/more than 128 non-ASCII characters/);
  });

  it('writes a top-level alternation inside a group, so the string keeps its quotes', () => {
    expect(jsonPattern('a|').regex).toBe('^(a|)$');
    expect(jsonPattern('^ab$|^c').regex).toBe('^(ab|c)$');
  });

  it('refuses what the grammar compiler cannot read or would read wrongly, naming it', () => {
    const refused: [string, RegExp][] = [
      ['[]', /empty class/], ['^[^\\s\\S]$', /matches nothing/], ['\\p{L}', /Unicode property/], ['^\\0$', /NUL/], ['^\\uD800$', /lone surrogate/],
      ['^[^\\x20-\\u{10ffff}]$', /generated only where the pattern names them/], ['(a)\\1', /backreferences/], ['(?=a)a', /lookaround/],
      ['\\bword', /word boundaries/], ['a^b', /anchors/], ['(^a)', /anchors/], ['a$b', /anchors/],
    ];
    for (const [pattern, why] of refused) {
      expect(() => jsonPattern(pattern), pattern).toThrow(PatternError);
      expect(() => jsonPattern(pattern), pattern).toThrow(why);
    }
  });

  it('counts the grammar positions a pattern unrolls to, weighting classes by what they cost to compile', () => {
    // A run of one class is counted by the native engine, not unrolled: at most 3 positions.
    expect(jsonPattern('^[a-z]{2,5}$').positions).toBe(3);
    expect(jsonPattern('^[a-z]{2}$').positions).toBe(2);
    expect(jsonPattern('^[a-z]{0,1000}$').positions).toBe(3);
    expect(jsonPattern('^[a-z]{0,1001}$').positions).toBe(1001);  // past maxLength's limit: as unrolled
    expect(jsonPattern('^[a-z]{999,}$').positions).toBe(3);
    expect(jsonPattern('^[a-z]{1000,}$').positions).toBe(1001);
    expect(jsonPattern('^(ab|c){3}$').positions).toBe(9);
    expect(jsonPattern('^(ab|c){0,100}$').positions).toBe(300);
    expect(jsonPattern('^[a"]{0,100}$').positions).toBe(100);  // a quote is an escape: no single class
    expect(jsonPattern('^a+$').positions).toBe(2);
    expect(jsonPattern('^((a{1,1000}){1,1000}){1,1000}$').positions).toBe(3e6);
    expect(jsonPattern('^.{0,100}$').cost).toBe(3);
    expect(jsonPattern('^[0-9]{100}$').cost).toBe(0.75);
    expect(jsonPattern('^(ab|cd){0,100}$').cost).toBe(100);
  });
});
