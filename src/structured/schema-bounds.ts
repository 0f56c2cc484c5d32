// Numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) as the grammar compiler
// can take them. xgrammar aborts on an integer bound that is not a whole number or passes int64,
// and on an integer range with no integer in it; it writes a number bound out digit by digit (1e308
// is 309 grammar positions), reads an empty number range as its one endpoint (exclusiveMinimum 5
// with maximum 5 gives 5), writes a fractional bound's decimal point as "any character" (minimum
// 0.5 allows `0"5`). So: bounds are whole numbers (safe integers; within 1e15 for a number), and a
// range with nothing in it is a 400. Its ranges are also wrong inside, erratically (integer 18..120
// allows 121..129, 12000..12999 allows 11005; minimum 5 allows 1..4; maximum -11 allows -10;
// number maximum 1 allows 1.5), and its own matcher, the fallback, does not follow an enum of
// integers exactly either (-309 passes an enum of -300..-50): so xgrammar never writes a bounded
// number: numeric-grammar.ts replaces each with an exact grammar of its own (in a response
// schema's grammar text, and as a grammar content inside a tool call's structural tag). xgrammar
// also writes an enum's values whatever the bounds beside it, and ignores whatever stands beside
// anyOf / oneOf: an enum keeps the values within the bounds, and bounds beside a choice are a 400.

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = { [key: string]: Json };
type Fail = (pointer: string, message: string) => never;

const KEYS = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'] as const;
/** A number bound's magnitude limit. */
export const NUMBER_BOUND_LIMITS = { maxMagnitude: 1e15 };

/**
 * Checks the bounds of schema `s` at `pointer` and writes the ones the compiler gets into `out`
 * (for an integer-only schema, exclusive bounds as inclusive ones). Throws through `fail`.
 */
export function checkNumericBounds(s: Schema, out: Schema, pointer: string, fail: Fail): void {
  if (!KEYS.some((k) => s[k] !== undefined)) return;
  const type = s['type'];
  const types = type === undefined ? [] : Array.isArray(type) ? type : [type];
  const integer = types.includes('integer');
  const integerOnly = integer && !types.includes('number');
  for (const key of KEYS) {
    const v = s[key];
    if (v === undefined) continue;
    const at = `${pointer}/${key}`;
    if (typeof v !== 'number' || !Number.isFinite(v)) fail(at, `'${key}' must be a finite number`);
    if (!Number.isInteger(v)) {
      fail(at, integer ? `'${key}' must be a whole number for an integer (got ${v})`
        : `'${key}' must be a whole number (got ${v}): fractional bounds are not supported by structured outputs`);
    }
    if (integerOnly && !Number.isSafeInteger(v)) fail(at, `'${key}' must be within +-${Number.MAX_SAFE_INTEGER} for an integer (got ${v})`);
    if (!integerOnly && Math.abs(v) > NUMBER_BOUND_LIMITS.maxMagnitude) {
      fail(at, `'${key}' must be within +-${NUMBER_BOUND_LIMITS.maxMagnitude} (got ${v}): larger bounds are not supported by structured outputs`);
    }
  }
  const num = (k: string) => s[k] as number | undefined;
  let [lo, loKey, loOpen] = pick(num('minimum'), num('exclusiveMinimum'), 'minimum', 'exclusiveMinimum', (a, b) => a > b);
  let [hi, hiKey, hiOpen] = pick(num('maximum'), num('exclusiveMaximum'), 'maximum', 'exclusiveMaximum', (a, b) => a < b);
  if (integerOnly) {
    // One inclusive bound each side (the tighter of the two given).
    for (const k of KEYS) delete out[k];
    if (lo !== undefined) {
      if (loOpen) lo += 1;
      out['minimum'] = lo;
      loOpen = false;
    }
    if (hi !== undefined) {
      if (hiOpen) hi -= 1;
      out['maximum'] = hi;
      hiOpen = false;
    }
  }
  if (lo !== undefined && hi !== undefined && (lo > hi || (lo === hi && (loOpen || hiOpen)))) {
    const what = integerOnly ? 'integer' : 'number';
    fail(`${pointer}/${loKey}`, `no ${what} satisfies both '${loKey}' ${s[loKey!]} and '${hiKey}' ${s[hiKey!]}`);
  }
  // An enum's or const's values must satisfy the bounds themselves (xgrammar writes them as they
  // are); bounds beside a choice are refused (xgrammar ignores what stands beside anyOf / oneOf).
  const inRange = (v: number) => (lo === undefined || v > lo || (v === lo && !loOpen)) && (hi === undefined || v < hi || (v === hi && !hiOpen));
  for (const key of ['anyOf', 'oneOf']) {
    if (s[key] !== undefined) fail(`${pointer}/${loKey ?? hiKey}`, `numeric bounds beside '${key}' are not supported by structured outputs: put them inside each branch`);
  }
  const values = s['enum'];
  if (Array.isArray(values)) {
    const kept = values.filter((v) => typeof v !== 'number' || inRange(v));
    if (kept.length === 0) fail(`${pointer}/enum`, `no value of 'enum' satisfies the bounds`);
    out['enum'] = kept;
  }
  if (typeof s['const'] === 'number' && !inRange(s['const'])) fail(`${pointer}/const`, `'const' ${s['const']} does not satisfy the bounds`);
}

/** The tighter of an inclusive and an exclusive bound: [value, keyword, exclusive]. */
function pick(inclusive: number | undefined, exclusive: number | undefined, inKey: string, exKey: string,
  tighter: (a: number, b: number) => boolean): [number | undefined, string | undefined, boolean] {
  if (exclusive !== undefined && (inclusive === undefined || tighter(exclusive, inclusive) || exclusive === inclusive)) return [exclusive, exKey, true];
  if (inclusive !== undefined) return [inclusive, inKey, false];
  return [undefined, undefined, false];
}
