// Exact grammars for bounded integers and numbers. xgrammar writes numeric ranges wrong (integer
// minimum 5 allows 1..4, 18..120 allows 121..129, number maximum 1 allows 1.5; see
// schema-bounds.ts), so it never sees a bound: each bounded integer or number subschema of a
// checked schema is replaced by a sentinel, an enum of one integer literal that occurs nowhere else
// (xgrammar prints it as the string "<digits>" in the rule for that subschema), and in the grammar
// text xgrammar writes, each sentinel literal becomes a reference to a rule of ours, appended to
// the text:
//   - an integer: no leading zeros, no "-0", digit by digit against the bounds (one rule per digit
//     of each bound, shared rules for "k digits"), so a range up to 2^53 is some tens of rules;
//   - a number: an integer part and an optional fraction, no exponent, exact at the bounds
//     (maximum 1 admits 1, 1.0, 1.00 but not 1.5; exclusiveMinimum 0 admits 0.5 but neither 0
//     nor 0.0); no "-0" and no negative zero such as "-0.0".
// Bounds are whole numbers here (schema-bounds.ts refuses fractional ones) and within safe
// integers. Type lists such as ["integer", "null"] become anyOf [the sentinel, the other types],
// and a bounded schema with no type, anyOf [the sentinel, every non-numeric type].
// The grammar text uses only what both the native reader (native/src/grammar) and xgrammar's EBNF
// reader take: strings, classes, rule references, groups, '|', '*', '+'.

import { randomInt } from 'node:crypto';

import type { XGrammarModule } from './xgrammar.js';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = { [key: string]: Json };

/** One bounded numeric subschema: whole-number bounds, either side optional. */
export interface NumericRange {
  integer: boolean;
  min?: number | undefined;
  max?: number | undefined;
  /** min is exclusive (an integer's then starts at min + 1); likewise max. */
  exclusiveMin?: boolean;
  exclusiveMax?: boolean;
}

/** A checked schema with its bounded numbers replaced by sentinels (sentinel digits -> range). */
export interface NumericPlan {
  schema: Json;
  sentinels: Map<string, NumericRange>;
}

const BOUND_KEYS = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'] as const;
const NON_NUMERIC = ['string', 'boolean', 'null', 'array', 'object'];
const isSchema = (v: Json | undefined): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Replaces every bounded integer or number subschema of `schema` (as checkResponseSchema returns
 * it) by a sentinel; undefined when it has none (xgrammar's grammar needs no change).
 */
export function numericPlan(schema: Json): NumericPlan | undefined {
  const text = JSON.stringify(schema);
  const sentinels = new Map<string, NumericRange>();
  const fresh = (range: NumericRange): Schema => {
    for (;;) {
      // 15 random digits (a safe integer), never in the schema's text (so never in a literal xgrammar writes from it).
      const digits = String(randomInt(100_000, 1_000_000)) + String(randomInt(0, 1e9)).padStart(9, '0');
      if (text.includes(digits) || sentinels.has(digits)) continue;
      sentinels.set(digits, range);
      return { enum: [Number(digits)] };
    }
  };
  const visit = (node: Json, root = false): Json => {
    if (!isSchema(node)) return node;
    if (root) {
      // The root's $defs stay at the root, whatever its own schema becomes ($refs resolve from there).
      const { $defs, definitions, ...own } = node;
      const out = visit(own) as Schema;
      const defs = (d: Json | undefined) => (isSchema(d) ? Object.fromEntries(Object.entries(d).map(([k, v]) => [k, visit(v)])) : d);
      return { ...out, ...($defs !== undefined && { $defs: defs($defs) }), ...(definitions !== undefined && { definitions: defs(definitions) }) };
    }
    const s: Schema = { ...node };
    for (const key of ['properties', '$defs', 'definitions'] as const) {
      const d = s[key];
      if (isSchema(d)) s[key] = Object.fromEntries(Object.entries(d).map(([k, v]) => [k, visit(v)]));
    }
    for (const key of ['additionalProperties', 'items'] as const) if (isSchema(s[key])) s[key] = visit(s[key]);
    for (const key of ['anyOf', 'oneOf', 'prefixItems'] as const) {
      const list = s[key];
      if (Array.isArray(list)) s[key] = list.map((b) => visit(b));
    }
    const range = boundsOf(s);
    if (range === undefined) return s;
    const rest: Schema = { ...s };
    for (const k of [...BOUND_KEYS, 'type']) delete rest[k];
    const type = s['type'];
    const types = type === undefined ? ['number', ...NON_NUMERIC] : Array.isArray(type) ? type as string[] : [type as string];
    const numeric = types.filter((t) => t === 'integer' || t === 'number');
    const others = types.filter((t) => t !== 'integer' && t !== 'number');
    if (numeric.length === 0) {  // bounds on a non-numeric type constrain nothing
      for (const k of BOUND_KEYS) delete s[k];
      return s;
    }
    range.integer = !numeric.includes('number');
    const sentinel = fresh(range);
    if (others.length === 0) return sentinel;
    // Keywords beside the type (properties, pattern, ...) stay with the other types' branch.
    return { anyOf: [sentinel, { ...rest, type: others.length === 1 ? others[0]! : others }] };
  };
  const out = visit(schema, true);
  return sentinels.size === 0 ? undefined : { schema: out, sentinels };
}

/**
 * The bounds of a subschema xgrammar would write itself: bounded, and not restricted by enum,
 * const, anyOf/oneOf or $ref beside them (schema-bounds.ts has already checked an enum's or
 * const's values against the bounds, and refused bounds beside anyOf/oneOf).
 */
function boundsOf(s: Schema): NumericRange | undefined {
  if (!BOUND_KEYS.some((k) => typeof s[k] === 'number')) return undefined;
  if (['enum', 'const', 'anyOf', 'oneOf', '$ref'].some((k) => s[k] !== undefined)) return undefined;
  const num = (k: string) => (typeof s[k] === 'number' ? s[k] as number : undefined);
  const range: NumericRange = { integer: false, exclusiveMin: false, exclusiveMax: false };
  const min = num('minimum'), xmin = num('exclusiveMinimum'), max = num('maximum'), xmax = num('exclusiveMaximum');
  if (xmin !== undefined && (min === undefined || xmin >= min)) [range.min, range.exclusiveMin] = [xmin, true];
  else if (min !== undefined) range.min = min;
  if (xmax !== undefined && (max === undefined || xmax <= max)) [range.max, range.exclusiveMax] = [xmax, true];
  else if (max !== undefined) range.max = max;
  return range;
}

/** Thrown when xgrammar's text does not hold the sentinels as expected (the schema is then refused). */
export class NumericGrammarError extends Error {}

/**
 * xgrammar's grammar text for a plan's schema, with each sentinel literal replaced by a reference
 * to an exact rule of ours, and those rules appended.
 */
export function withNumericRules(ebnf: string, sentinels: Map<string, NumericRange>): string {
  let prefix = 'sluice_num';
  while (ebnf.includes(prefix)) prefix += 'x';
  const rules = new NumericRules(prefix);
  const names = new Map<string, string>();
  const out = ebnf.replace(/"(\d{15})"/g, (literal, digits: string) => {
    const range = sentinels.get(digits);
    if (range === undefined) return literal;
    let name = names.get(digits);
    if (name === undefined) {
      name = rules.range(range);
      names.set(digits, name);
    }
    return name;
  });
  for (const digits of sentinels.keys()) {
    if (out.includes(digits)) throw new NumericGrammarError('a numeric bound could not be placed in the grammar');
  }
  return `${out.replace(/\s*$/, '')}\n${rules.text()}`;
}

/** A grammar (root rule and ours) admitting exactly the range's JSON numbers: for tests and tools. */
export function numericRangeGrammar(range: NumericRange): string {
  const rules = new NumericRules('sluice_num');
  return `root ::= ${rules.range(range)}\n${rules.text()}`;
}

/** The rules of one grammar text, made as needed and shared between its ranges. */
class NumericRules {
  private readonly rules = new Map<string, string>();
  private count = 0;

  constructor(private readonly prefix: string) {}

  text(): string {
    return [...this.rules].map(([name, body]) => `${name} ::= ${body}`).join('\n') + '\n';
  }

  /** A rule admitting exactly the range; its name. */
  range(r: NumericRange): string {
    let min = r.min === undefined ? undefined : BigInt(r.min);
    let max = r.max === undefined ? undefined : BigInt(r.max);
    if (r.integer) {
      if (min !== undefined && r.exclusiveMin === true) min += 1n;
      if (max !== undefined && r.exclusiveMax === true) max -= 1n;
    }
    const parts = r.integer ? this.integerParts(min, max) : this.numberParts(min, r.exclusiveMin === true, max, r.exclusiveMax === true);
    if (parts.length === 0) throw new NumericGrammarError(`a numeric range with no value in it: ${JSON.stringify(r)}`);
    return this.define(`${this.prefix}_${this.count++}`, parts.join(' | '));
  }

  private define(name: string, body: string): string {
    if (!this.rules.has(name)) this.rules.set(name, body);
    return name;
  }

  /** Integers in [min, max]: the non-negative ones, then "-" and the magnitudes of the negative ones. */
  private integerParts(min: bigint | undefined, max: bigint | undefined): string[] {
    const parts: string[] = [];
    const lo = min === undefined || min < 0n ? 0n : min;
    if (max === undefined || max >= lo) parts.push(this.uint(lo, max));
    const negLo = max === undefined || max > -1n ? 1n : -max;  // magnitudes of the negative values
    const negHi = min === undefined ? undefined : -min;
    if (negHi === undefined || negHi >= negLo) parts.push(`"-" ${this.uint(negLo, negHi)}`);
    return parts;
  }

  /** Numbers between min and max (each optional, inclusive unless marked): non-negative, then negative. */
  private numberParts(min: bigint | undefined, xmin: boolean, max: bigint | undefined, xmax: boolean): string[] {
    const parts: string[] = [];
    // Non-negative values: magnitude from max(min, 0) to max.
    const [a, ax] = min === undefined || min < 0n ? [0n, false] : [min, xmin];
    const pos = this.magnitude(a, ax, max, xmax);
    if (pos !== undefined) parts.push(pos);
    // Negative values: magnitude above 0 (no negative zero), from -max to -min.
    const [b, bx] = max === undefined || max >= 0n ? [0n, true] : [-max, xmax];
    const neg = min === undefined ? this.magnitude(b, bx, undefined, false) : this.magnitude(b, bx, -min, xmin);
    if (neg !== undefined) parts.push(`"-" ${neg}`);
    return parts;
  }

  /**
   * Unsigned decimals "I" or "I.F" with a value m between a and b (b optional), as an expression;
   * undefined when none. Integer parts strictly inside take any fraction; at a (exclusive) only a
   * non-zero one; at b (inclusive) only a zero one.
   */
  private magnitude(a: bigint, ax: boolean, b: bigint | undefined, bx: boolean): string | undefined {
    if (b !== undefined && (b < a || (b === a && (ax || bx)))) return undefined;
    const alts: string[] = [];
    const from = ax ? a + 1n : a;
    const to = b === undefined ? undefined : b - 1n;
    if (to === undefined || from <= to) alts.push(`${this.uint(from, to)} ${this.fraction('any')}`);
    if (ax) alts.push(`"${a}" ${this.fraction('nonzero')}`);
    if (b !== undefined && !bx) alts.push(`"${b}" ${this.fraction('zero')}`);
    return alts.length === 1 ? alts[0]! : `(${alts.join(' | ')})`;
  }

  private fraction(kind: 'any' | 'zero' | 'nonzero'): string {
    const body = kind === 'any' ? '"" | "." [0-9]+' : kind === 'zero' ? '"" | "." "0"+' : '"." "0"* [1-9] [0-9]*';
    return this.define(`${this.prefix}_frac_${kind}`, body);
  }

  /** Decimal integers in [lo, hi] (hi optional), no leading zeros, as a rule's name. */
  private uint(lo: bigint, hi: bigint | undefined): string {
    const key = `${this.prefix}_u_${lo}_${hi ?? 'inf'}`;
    if (this.rules.has(key)) return key;
    const alts: string[] = [];
    const loLen = String(lo).length;
    const hiLen = hi === undefined ? loLen : String(hi).length;
    for (let n = loLen; n <= hiLen; n++) {
      const first = n === 1 ? 0n : 10n ** BigInt(n - 1);
      const last = 10n ** BigInt(n) - 1n;
      const x = lo > first ? lo : first;
      const y = hi !== undefined && hi < last ? hi : last;
      if (x <= y) alts.push(this.sameLength(String(x), String(y)));
    }
    if (hi === undefined) alts.push(`[1-9] ${loLen > 0 ? `${this.anyDigits(loLen)} ` : ''}[0-9]*`);  // more digits than lo
    return this.define(key, alts.map((a) => `(${a})`).join(' | '));
  }

  /** Digit strings of one length from x to y (x <= y, no leading zeros in x unless it is "0"...). */
  private sameLength(x: string, y: string): string {
    let p = 0;
    while (p < x.length && x[p] === y[p]) p++;
    const prefix = p > 0 ? `"${x.slice(0, p)}" ` : '';
    if (p === x.length) return `"${x}"`;
    const xs = x.slice(p), ys = y.slice(p);
    const a = Number(xs[0]), b = Number(ys[0]);
    if (xs.length === 1) return `${prefix}${digitClass(a, b)}`;
    const rest = xs.length - 1;
    // From x's digit: suffixes >= x's; the digits between: anything; y's digit: suffixes <= y's
    // (x's and y's digits join the middle when their suffixes allow anything).
    const alts: string[] = [];
    const lowAll = /^0*$/.test(xs.slice(1)), highAll = /^9*$/.test(ys.slice(1));
    if (!lowAll) alts.push(`"${a}" ${this.atLeast(xs.slice(1))}`);
    const from = lowAll ? a : a + 1, to = highAll ? b : b - 1;
    if (from <= to) alts.push(`${digitClass(from, to)} ${this.anyDigits(rest)}`);
    if (!highAll) alts.push(`"${b}" ${this.atMost(ys.slice(1))}`);
    return alts.length === 1 ? `${prefix}${alts[0]!}` : `${prefix}(${alts.join(' | ')})`;
  }

  /** Digit strings of s's length that are >= s (leading zeros allowed: a suffix). */
  private atLeast(s: string): string {
    if (/^0*$/.test(s)) return this.anyDigits(s.length);
    const name = `${this.prefix}_ge_${s}`;
    if (this.rules.has(name)) return name;
    const d = Number(s[0]);
    const body = s.length === 1 ? digitClass(d, 9)
      : [`"${d}" ${this.atLeast(s.slice(1))}`, ...(d < 9 ? [`${digitClass(d + 1, 9)} ${this.anyDigits(s.length - 1)}`] : [])].join(' | ');
    return this.define(name, body);
  }

  /** Digit strings of s's length that are <= s. */
  private atMost(s: string): string {
    if (/^9*$/.test(s)) return this.anyDigits(s.length);
    const name = `${this.prefix}_le_${s}`;
    if (this.rules.has(name)) return name;
    const d = Number(s[0]);
    const body = s.length === 1 ? digitClass(0, d)
      : [`"${d}" ${this.atMost(s.slice(1))}`, ...(d > 0 ? [`${digitClass(0, d - 1)} ${this.anyDigits(s.length - 1)}`] : [])].join(' | ');
    return this.define(name, body);
  }

  /** Exactly k digits, as one shared rule per k. */
  private anyDigits(k: number): string {
    if (k === 1) return '[0-9]';
    return this.define(`${this.prefix}_d${k}`, `[0-9] ${this.anyDigits(k - 1)}`);
  }
}

function digitClass(a: number, b: number): string {
  return a === b ? `"${a}"` : `[${a}-${b}]`;
}

/**
 * The grammar text of a checked schema's JSON (as xgrammar writes it, with anyWhitespace and at
 * most `maxWhitespace` whitespace characters between elements), its bounded numbers exact.
 */
export async function jsonSchemaGrammar(xg: XGrammarModule, source: string, maxWhitespace: number): Promise<string> {
  const plan = mayHoldNumericBounds(source) ? numericPlan(JSON.parse(source) as Json) : undefined;
  const grammar = await xg.Grammar.fromJSONSchema(plan === undefined ? source : JSON.stringify(plan.schema), true, undefined, undefined, false, maxWhitespace);
  try {
    const text = grammar.toString();
    return plan === undefined ? text : withNumericRules(text, plan.sentinels);
  } finally {
    grammar.dispose();
  }
}

/** Whether a schema's text may hold a numeric bound (a cheap test before reading it). */
export function mayHoldNumericBounds(source: string): boolean {
  return BOUND_TEXT.test(source);
}

const BOUND_TEXT = /"(minimum|maximum|exclusiveMinimum|exclusiveMaximum)"/;

/**
 * A structural tag (tool calls, tool-grammar.ts) whose JSON-schema contents with numeric bounds
 * are given as grammar contents instead: the schema's grammar text with exact numbers. (The tag
 * itself still goes to xgrammar as a tag: the text it prints for one is not a faithful hand-over,
 * and its matcher stays xgrammar's.)
 */
export async function exactStructuralTag(xg: XGrammarModule, source: string, maxWhitespace: number): Promise<string> {
  if (!mayHoldNumericBounds(source)) return source;
  const visit = async (node: unknown): Promise<unknown> => {
    if (Array.isArray(node)) return Promise.all(node.map(visit));
    if (typeof node !== 'object' || node === null) return node;
    const o = node as Record<string, unknown>;
    if (o['type'] === 'json_schema' && 'json_schema' in o) {
      const schema = JSON.stringify(o['json_schema']);
      return mayHoldNumericBounds(schema) ? { type: 'grammar', grammar: await jsonSchemaGrammar(xg, schema, maxWhitespace) } : o;
    }
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o)) out[k] = await visit(v);
    return out;
  };
  return JSON.stringify(await visit(JSON.parse(source)));
}
