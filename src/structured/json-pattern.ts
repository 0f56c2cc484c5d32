// A JSON schema `pattern` read as ECMAScript (the `u` flag, as ajv and JSON Schema read it) and
// written again as the regex the grammar compiler (xgrammar) gets, which it matches against the
// raw text between a JSON string's quotes. So the rewrite:
//   - keeps every JSON string valid: `"`, `\` and control characters are written as their JSON
//     escapes (`\"`, `\\`, `\n`, `\u0001`) where the pattern names them, and are never produced
//     by `.`, negated classes or \D \S \W (a JSON string holds them only escaped; xgrammar would
//     let them through raw);
//   - computes every class with the ECMAScript meaning (xgrammar's \s and \S differ) and writes it
//     with ASCII members only (xgrammar misreads a class member above U+007F, see setParts): the
//     non-ASCII characters as a negated ASCII class when all are in, one by one when few, else
//     not at all (a subset: `.` and \S then write ASCII only); never a lone surrogate or NUL (not
//     valid in UTF-8 text, and PostgreSQL refuses NUL in text);
//   - puts the whole pattern in a group (xgrammar reads a top-level `a|b` without its quotes) and
//     drops the anchors (xgrammar matches the whole string: a subset of what an unanchored
//     pattern allows, as the pattern then holds of the whole value).
// Everything else is refused with a 400 before any grammar engine sees it: constructs xgrammar
// aborts on or reads wrongly (\p{..}, backreferences, lookaround, \b, anchors inside the
// pattern, classes that match nothing), and patterns whose unrolled size (a grammar position per
// character, each compiled against the whole vocabulary) passes the caller's limit.

/** Why a pattern is refused (the caller adds the JSON pointer). */
export class PatternError extends Error {}

/** Sorted, disjoint, inclusive code-point ranges. */
type Ranges = [number, number][];

type Term =
  | { kind: 'set'; ranges: Ranges; wide: boolean }
  | { kind: 'group'; alts: Term[][] }
  | { kind: 'repeat'; term: Term; min: number; max: number }
  | { kind: 'start' }
  | { kind: 'end' };

const MAX_CODE_POINT = 0x10ffff;
const DIGITS: Ranges = [[0x30, 0x39]];
const WORD: Ranges = [[0x30, 0x39], [0x41, 0x5a], [0x5f, 0x5f], [0x61, 0x7a]];
/** ECMAScript WhiteSpace and LineTerminator. */
const SPACE: Ranges = [[0x09, 0x0d], [0x20, 0x20], [0xa0, 0xa0], [0x1680, 0x1680], [0x2000, 0x200a], [0x2028, 0x2029],
  [0x202f, 0x202f], [0x205f, 0x205f], [0x3000, 0x3000], [0xfeff, 0xfeff]];
const LINE_TERMINATORS: Ranges = [[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]];
/** Never generated: NUL and the surrogates. */
const NEVER: Ranges = [[0, 0], [0xd800, 0xdfff]];
/** Written only as JSON escapes: control characters, quote and backslash. */
const ESCAPED: Ranges = [[0, 0x1f], [0x22, 0x22], [0x5c, 0x5c]];
const SHORT_ESCAPES: Record<number, string> = { 0x08: 'b', 0x09: 't', 0x0a: 'n', 0x0c: 'f', 0x0d: 'r', 0x22: '"', 0x5c: '\\\\' };

function normalize(ranges: Ranges): Ranges {
  const sorted = ranges.filter(([a, b]) => a <= b).sort((x, y) => x[0] - y[0]);
  const out: Ranges = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

const union = (...sets: Ranges[]): Ranges => normalize(sets.flat().map(([a, b]) => [a, b]));

function complement(set: Ranges): Ranges {
  const out: Ranges = [];
  let next = 0;
  for (const [a, b] of normalize(set)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= MAX_CODE_POINT) out.push([next, MAX_CODE_POINT]);
  return out;
}

const subtract = (set: Ranges, minus: Ranges): Ranges => complement(union(complement(set), minus));
const intersect = (a: Ranges, b: Ranges): Ranges => complement(union(complement(a), complement(b)));
const size = (set: Ranges): number => set.reduce((n, [a, b]) => n + b - a + 1, 0);

/** A recursive-descent reader of the ECMAScript (u flag) regex grammar; the pattern already compiles with `new RegExp(p, 'u')`. */
class Reader {
  private i = 0;
  constructor(private readonly s: string) {}

  read(): Term[][] {
    const alts = this.disjunction();
    if (this.i < this.s.length) throw new PatternError(`unexpected '${this.s[this.i]}' at offset ${this.i}`);
    return alts;
  }

  private disjunction(): Term[][] {
    const alts = [this.alternative()];
    while (this.s[this.i] === '|') {
      this.i++;
      alts.push(this.alternative());
    }
    return alts;
  }

  private alternative(): Term[] {
    const terms: Term[] = [];
    while (this.i < this.s.length && this.s[this.i] !== '|' && this.s[this.i] !== ')') {
      const c = this.s[this.i]!;
      if (c === '^' || c === '$') {
        this.i++;
        terms.push({ kind: c === '^' ? 'start' : 'end' });
        continue;
      }
      terms.push(this.quantified(this.atom()));
    }
    return terms;
  }

  private quantified(term: Term): Term {
    const c = this.s[this.i];
    let min: number, max: number;
    if (c === '*') [min, max] = [0, Infinity];
    else if (c === '+') [min, max] = [1, Infinity];
    else if (c === '?') [min, max] = [0, 1];
    else if (c === '{') {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(this.s.slice(this.i));
      if (m === null) throw new PatternError(`a malformed repetition at offset ${this.i}`);
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] === '' ? Infinity : Number(m[3]);
      this.i += m[0].length - 1;
    } else {
      return term;
    }
    this.i++;
    if (this.s[this.i] === '?') this.i++;  // lazy: the same strings match
    return { kind: 'repeat', term, min, max };
  }

  private atom(): Term {
    const c = this.s[this.i]!;
    if (c === '(') {
      this.i++;
      if (this.s.startsWith('?:', this.i)) this.i += 2;
      else if (/^\?<[A-Za-z_$]/.test(this.s.slice(this.i))) this.i = this.s.indexOf('>', this.i) + 1;
      else if (this.s[this.i] === '?') throw new PatternError('lookaround assertions are not supported');
      const alts = this.disjunction();
      if (this.s[this.i] !== ')') throw new PatternError('an unclosed group');
      this.i++;
      return { kind: 'group', alts };
    }
    if (c === '.') {
      this.i++;
      return { kind: 'set', ranges: complement(LINE_TERMINATORS), wide: true };
    }
    if (c === '[') return this.charClass();
    if (c === '\\') {
      this.i++;
      const e = this.s[this.i]!;
      if (e === 'b' || e === 'B') throw new PatternError('word boundaries (\\b, \\B) are not supported');
      if (/[1-9]/.test(e) || e === 'k') throw new PatternError('backreferences are not supported');
      const cls = this.classEscape();
      if (cls !== undefined) return { kind: 'set', ...cls };
      const v = this.characterEscape();
      return { kind: 'set', ranges: [[v, v]], wide: false };
    }
    const cp = this.s.codePointAt(this.i)!;
    this.i += cp > 0xffff ? 2 : 1;
    return { kind: 'set', ranges: [[cp, cp]], wide: false };
  }

  /** \d \D \s \S \w \W (and the refused \p, \P) at this.i, or undefined. */
  private classEscape(): { ranges: Ranges; wide: boolean } | undefined {
    const e = this.s[this.i]!;
    const sets: Record<string, Ranges> = { d: DIGITS, s: SPACE, w: WORD };
    if (e === 'p' || e === 'P') throw new PatternError('Unicode property escapes (\\p{...}, \\P{...}) are not supported');
    const lower = e.toLowerCase();
    if (!(lower in sets)) return undefined;
    this.i++;
    return e === lower ? { ranges: sets[lower]!, wide: false } : { ranges: complement(sets[lower]!), wide: true };
  }

  /** One escaped character after a backslash (this.i at the letter after it): its code point. */
  private characterEscape(): number {
    const s = this.s;
    const e = s[this.i++]!;
    const controls: Record<string, number> = { f: 0x0c, n: 0x0a, r: 0x0d, t: 0x09, v: 0x0b };
    if (e in controls) return controls[e]!;
    if (e === 'c') return s.charCodeAt(this.i++) % 32;
    if (e === '0') return 0;
    if (e === 'x') {
      this.i += 2;
      return parseInt(s.slice(this.i - 2, this.i), 16);
    }
    if (e === 'u') {
      if (s[this.i] === '{') {
        const end = s.indexOf('}', this.i);
        const v = parseInt(s.slice(this.i + 1, end), 16);
        this.i = end + 1;
        return v;
      }
      let v = parseInt(s.slice(this.i, this.i + 4), 16);
      this.i += 4;
      // \uD83D\uDE00 is one code point under the u flag.
      if (v >= 0xd800 && v <= 0xdbff && /^\\u[dD][c-fC-F][0-9a-fA-F]{2}/.test(s.slice(this.i))) {
        v = 0x10000 + ((v - 0xd800) << 10) + (parseInt(s.slice(this.i + 2, this.i + 6), 16) - 0xdc00);
        this.i += 6;
      }
      return v;
    }
    const cp = s.codePointAt(this.i - 1)!;  // an identity escape: \. \/ \- ...
    if (cp > 0xffff) this.i++;
    return cp;
  }

  private charClass(): Term {
    this.i++;  // [
    const negated = this.s[this.i] === '^';
    if (negated) this.i++;
    const explicit: Ranges = [];
    const wide: Ranges = [];
    const member = (): { ranges: Ranges; wide: boolean } => {
      if (this.s[this.i] === '\\') {
        this.i++;
        if (this.s[this.i] === 'b') {
          this.i++;
          return { ranges: [[8, 8]], wide: false };  // [\b] is a backspace
        }
        const cls = this.classEscape();
        if (cls !== undefined) return cls;
        const v = this.characterEscape();
        return { ranges: [[v, v]], wide: false };
      }
      const cp = this.s.codePointAt(this.i)!;
      this.i += cp > 0xffff ? 2 : 1;
      return { ranges: [[cp, cp]], wide: false };
    };
    while (this.s[this.i] !== ']') {
      if (this.i >= this.s.length) throw new PatternError('an unclosed character class');
      const lo = member();
      if (this.s[this.i] === '-' && this.s[this.i + 1] !== ']' && !lo.wide && lo.ranges.length === 1) {
        this.i++;
        const hi = member();
        explicit.push([lo.ranges[0]![0], hi.ranges[0]![1]]);
        continue;
      }
      (lo.wide ? wide : explicit).push(...lo.ranges);
    }
    this.i++;
    if (negated) return { kind: 'set', ranges: complement(union(explicit, wide)), wide: true };
    if (explicit.length + wide.length === 0) throw new PatternError('the empty class [] matches nothing');
    // Members named one by one may be written escaped; those from \D \S \W come as from a negation.
    return { kind: 'set', ranges: union(explicit, subtract(wide, ESCAPED)), wide: false };
  }
}

/** What the rewrite found: the regex for the grammar compiler and the grammar positions it unrolls to. */
export interface JsonPattern {
  regex: string;
  /** Characters matched by the unrolled pattern, summed over its branches (repetitions multiplied out). */
  positions: number;
  /**
   * The positions weighted by what compiling each costs: a pass over the vocabulary that follows
   * every token the class lets through. Measured at Qwen2.5's 152k vocabulary (2-core Zen 5):
   * about 35 ms for a class with lowercase letters or space (most tokens), 5 ms for [a-z], 0.1 ms
   * for digits. Weight 1 for a class holding space, a non-ASCII character or 10+ lowercase
   * letters, else 1/4 (an upper bound for digit, hex and upper-case classes).
   */
  cost: number;
}

/**
 * Reads `pattern` (which `new RegExp(pattern, 'u')` accepts) and writes the regex the grammar
 * compiler gets. Throws PatternError naming a construct it refuses.
 */
export function jsonPattern(pattern: string): JsonPattern {
  const alts = new Reader(pattern).read();
  for (const terms of alts) {
    // Anchors at the ends of a top-level branch only (xgrammar anchors the whole pattern anyway).
    const inner = terms.filter((t, k) => !((t.kind === 'start' && k === 0) || (t.kind === 'end' && k === terms.length - 1)));
    if (inner.some((t) => t.kind === 'start' || t.kind === 'end') || hasAnchor(inner)) {
      throw new PatternError("anchors (^, $) are supported only at the start and end of the pattern or of a top-level '|' branch");
    }
    terms.splice(0, terms.length, ...inner);
  }
  return {
    regex: `^(${alts.map(writeSeq).join('|')})$`,
    positions: alts.reduce((n, t) => n + seqPositions(t, () => 1), 0),
    cost: alts.reduce((n, t) => n + seqPositions(t, setCost), 0),
  };
}

function hasAnchor(terms: Term[]): boolean {
  return terms.some((t) => t.kind === 'start' || t.kind === 'end' || (t.kind === 'group' && t.alts.some(hasAnchor))
    || (t.kind === 'repeat' && hasAnchor([t.term])));
}

type SetWeight = (ranges: Ranges) => number;

function seqPositions(terms: Term[], weight: SetWeight): number {
  return terms.reduce((n, t) => n + termPositions(t, weight), 0);
}

function termPositions(t: Term, weight: SetWeight): number {
  switch (t.kind) {
    case 'set': return weight(t.ranges);
    case 'group': return t.alts.reduce((n, a) => n + seqPositions(a, weight), 0);
    // Copies unroll, and an unbounded tail is a loop: one more copy. A run of one class up to
    // MAX_COUNTED_RUN characters costs at most 3 positions: the native grammar engine counts a run
    // of 4 or more characters in the matcher's state (shorter ones stay unrolled).
    case 'repeat': {
      const copies = t.max === Infinity ? Math.max(t.min, 1) + 1 : t.max;
      const counted = oneClass(t.term) && copies <= MAX_COUNTED_RUN;
      return termPositions(t.term, weight) * (counted ? Math.min(copies, 3) : copies);
    }
    default: return 0;
  }
}

/** The longest run of one class counted as one (as maxLength's limit); longer ones count as unrolled. */
const MAX_COUNTED_RUN = 1000;

/** A set the grammar compiler gets as one class or one character (not a group of escapes or characters). */
function oneClass(t: Term): t is Extract<Term, { kind: 'set' }> {
  if (t.kind !== 'set') return false;
  const parts = setParts(t.ranges, t.wide);
  return parts.length === 1 && !parts[0]!.startsWith('(');
}

const LOWER: Ranges = [[0x61, 0x7a]];
const setCost: SetWeight = (ranges) => (size(intersect(ranges, [[0x20, 0x20], [0x80, MAX_CODE_POINT]])) > 0
  || size(intersect(ranges, LOWER)) >= 10 ? 1 : 0.25);

const writeSeq = (terms: Term[]): string => terms.map(writeTerm).join('');

function writeTerm(t: Term): string {
  switch (t.kind) {
    case 'set': {
      const parts = setParts(t.ranges, t.wide);
      return parts.length === 1 ? parts[0]! : `(${parts.join('|')})`;
    }
    case 'group': return `(${t.alts.map(writeSeq).join('|')})`;
    case 'repeat': {
      const q = t.max === Infinity ? (t.min === 0 ? '*' : t.min === 1 ? '+' : `{${t.min},}`)
        : t.min === 0 && t.max === 1 ? '?' : t.min === t.max ? `{${t.min}}` : `{${t.min},${t.max}}`;
      // A set is one character, one class or a group already; a repeat needs one.
      const inner = writeTerm(t.term);
      return (t.term.kind === 'repeat' ? `(${inner})` : inner) + q;
    }
    default: return '';
  }
}

/**
 * A set as a regex over the JSON string's raw text. Plain characters: the ASCII ones as one class,
 * the non-ASCII ones as a negated ASCII class when all are in, else one by one when they are few
 * (MAX_LISTED); more are left out (a subset: what is generated still matches). NOTE: xgrammar
 * (0.1.27) reads a class member above U+007F by its low byte ([a\u2028-\u2029] admits '(' and ')',
 * [^\u2028] excludes '(') and the native reader refuses such classes, so no class here names one.
 * Unless the set came from a negation: quote, backslash and control characters as JSON escapes.
 */
function setParts(set: Ranges, wide: boolean): string[] {
  const plain = subtract(set, union(NEVER, ESCAPED));
  const escaped = wide ? [] : subtract(intersect(set, ESCAPED), NEVER);
  const parts: string[] = [];
  const ascii = intersect(plain, [[0, 0x7f]]);
  const nonAscii = intersect(plain, [[0x80, MAX_CODE_POINT]]);
  if (size(nonAscii) === size(NON_ASCII)) {
    // Every non-ASCII character: name the ASCII ones left out (ESCAPED among them).
    parts.push(`[^${writeRanges(subtract([[0, 0x7f]], ascii))}]`);
  } else {
    if (ascii.length === 1 && ascii[0]![0] === ascii[0]![1]) parts.push(writeChar(ascii[0]![0], false));
    else if (ascii.length > 0) parts.push(`[${writeRanges(ascii)}]`);
    if (size(nonAscii) <= MAX_LISTED) for (const [a, b] of nonAscii) for (let c = a; c <= b; c++) parts.push(writeChar(c, false));
  }
  for (const [a, b] of escaped) {
    for (let c = a; c <= b; c++) {
      const short = SHORT_ESCAPES[c];
      // A group: an escape is two or six characters, and a quantifier after it means all of them.
      parts.push(short !== undefined ? `(\\\\${short === '"' ? '"' : short})` : `(\\\\u00${c.toString(16).padStart(2, '0')})`);
    }
  }
  if (parts.length === 0) {
    throw new PatternError(set.length === 0 ? 'a character class matches nothing'
      : subtract(set, NEVER).length === 0 ? 'it needs NUL (\\0) or a lone surrogate (U+D800 to U+DFFF), which are never generated'
        : size(nonAscii) > MAX_LISTED ? `a class of more than ${MAX_LISTED} non-ASCII characters (and not all of them) is supported only beside ASCII ones`
          : 'a negated class (or ., \\D, \\S, \\W) here matches only control characters, quote or backslash, which are generated only where the pattern names them');
  }
  return parts;
}

/** Non-ASCII characters of a class written one by one (more are left out, see setParts). */
const MAX_LISTED = 128;
const NON_ASCII: Ranges = subtract([[0x80, MAX_CODE_POINT]], NEVER);

const writeRanges = (ranges: Ranges): string =>
  ranges.map(([a, b]) => (a === b ? writeChar(a, true) : `${writeChar(a, true)}-${writeChar(b, true)}`)).join('');

function writeChar(c: number, inClass: boolean): string {
  if ((c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a)) return String.fromCharCode(c);
  if (c >= 0x20 && c < 0x7f) {
    const ch = String.fromCharCode(c);
    const special = inClass ? '\\]^-[' : '\\^$.*+?()[]{}|/';
    return special.includes(ch) ? `\\${ch}` : ch;
  }
  return c < 0x80 ? `\\x${c.toString(16).padStart(2, '0')}` : `\\u{${c.toString(16)}}`;
}
