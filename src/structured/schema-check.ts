// What a response-format JSON schema may contain before it reaches the grammar compiler. A keyword
// the engine cannot enforce is a 400 naming it and its JSON pointer, before anything is generated
// (never silently ignored: `strict` promises the output validates). Also the size limits, and
// OpenAI's strict-mode rules (every object closed with additionalProperties: false and every
// property required). allOf of objects is merged here (the compiler takes one object).
// The grammar compiler (xgrammar, WebAssembly) is untrusted with untrusted input: what aborts it or
// makes it write a wrong grammar is refused here, in plain words, never left for its own errors:
// patterns are read and rewritten in json-pattern.ts, numeric bounds in schema-bounds.ts, and the
// size once `$ref`s are followed is measured in schema-refs.ts.

import { SluiceError } from '../errors.js';
import { jsonPattern, PatternError, type JsonPattern } from './json-pattern.js';
import { checkNumericBounds } from './schema-bounds.js';
import { checkRefExpansion } from './schema-refs.js';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = { [key: string]: Json };

const ANNOTATIONS = new Set(['title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'deprecated',
  'readOnly', 'writeOnly']);
const KEYWORDS = new Set(['type', 'properties', 'required', 'additionalProperties', 'enum', 'const', 'anyOf', 'oneOf',
  'allOf', 'items', 'prefixItems', 'minItems', 'maxItems', 'minLength', 'maxLength', 'pattern', 'format', 'minimum',
  'maximum', 'exclusiveMinimum', 'exclusiveMaximum', '$ref', '$defs', 'definitions']);
const TYPES = new Set(['object', 'array', 'string', 'number', 'integer', 'boolean', 'null']);
/** Formats the grammar enforces (others would be a promise it cannot keep). */
export const SUPPORTED_FORMATS = ['date', 'time', 'date-time', 'uuid', 'email'] as const;

const DATE = '[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))';
const TIME = '([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])';
const EMAIL_LOCAL = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
const EMAIL_LABEL = '[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?';
/**
 * Exact patterns for the date formats (February 29 is never generated: a pattern cannot tell leap
 * years) and for email, ajv-formats' (the compiler's own allows "a@b" and a quoted local part
 * whose backslash pairs are not valid JSON escapes), as the grammar compiler gets them.
 */
const FORMAT_PATTERNS: Record<string, string> = Object.fromEntries(Object.entries({
  date: `^${DATE}$`, time: `^${TIME}$`, 'date-time': `^${DATE}T${TIME}$`,
  email: `^${EMAIL_LOCAL}(\\.${EMAIL_LOCAL})*@(${EMAIL_LABEL}\\.)+${EMAIL_LABEL}$`,
}).map(([format, pattern]) => [format, jsonPattern(pattern).regex]));

/**
 * maxStringLength bounds minLength and maxLength; maxGrammarPositions the string positions a
 * schema unrolls to, summed over it: each length limit and each pattern's weighted positions
 * (json-pattern.ts). Compiling a position with a wide class costs a pass over the vocabulary:
 * about 35 ms at Qwen2.5's 152k vocabulary on a 2-core Zen 5. A run of one class (a length limit,
 * `[a-z]{2,300}`) costs at most 3 positions: the native grammar engine counts its characters in
 * the matcher's state (maxLength 1000 compiles in about 50 ms); other repetitions unroll, one
 * position per copy. maxDepth and maxNodes hold inline and once '$ref's are followed (schema-refs.ts).
 */
export const SCHEMA_LIMITS = { maxDepth: 32, maxNodes: 5000, maxEnum: 1000, maxPatternLength: 1000, maxCount: 100_000,
  maxStringLength: 1000, maxGrammarPositions: 128, maxPatternPositions: 4096 };

export interface CheckedSchema {
  /** The schema to compile (allOf merged, annotations kept). */
  schema: Schema;
}

function fail(param: string, pointer: string, message: string): never {
  throw new SluiceError('invalid_request', `${message} (at ${pointer === '' ? '/' : pointer})`, { param });
}

const isSchema = (v: Json | undefined): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const escapePointer = (key: string) => key.replace(/~/g, '~0').replace(/\//g, '~1');

/**
 * Checks `schema` (param: the request field naming it, for the error) and returns what the
 * grammar compiler gets. Throws SluiceError invalid_request naming the keyword and its pointer.
 */
export function checkResponseSchema(schema: unknown, opts: { strict: boolean; param: string }): CheckedSchema {
  const { strict, param } = opts;
  if (!isSchema(schema as Json)) fail(param, '', 'the schema must be a JSON object');
  let nodes = 0;
  let positionBudget = SCHEMA_LIMITS.maxGrammarPositions;
  const spend = (cost: number, pointer: string) => {
    positionBudget -= cost;
    if (positionBudget < 0) {
      fail(param, pointer, `the string length limits and patterns in this schema unroll to more than ${SCHEMA_LIMITS.maxGrammarPositions} grammar positions`);
    }
  };
  const defs = new Set<string>();
  for (const key of ['$defs', 'definitions'] as const) {
    const d = (schema as Schema)[key];
    if (d === undefined) continue;
    if (!isSchema(d)) fail(param, `/${key}`, `'${key}' must be an object of schemas`);
    for (const name of Object.keys(d)) {
      // The compiler looks a $ref's name up as written (it does not unescape ~0 and ~1).
      if (/[/~]/.test(name)) fail(param, `/${key}/${escapePointer(name)}`, `a '${key}' name may not contain '/' or '~' (got ${JSON.stringify(name)})`);
      defs.add(`#/${key}/${name}`);
    }
  }

  const visit = (node: Json, pointer: string, depth: number, isRoot = false): Json => {
    if (++nodes > SCHEMA_LIMITS.maxNodes) fail(param, pointer, `the schema has more than ${SCHEMA_LIMITS.maxNodes} subschemas`);
    if (depth > SCHEMA_LIMITS.maxDepth) fail(param, pointer, `the schema nests deeper than ${SCHEMA_LIMITS.maxDepth} levels`);
    if (typeof node === 'boolean') {
      if (!node) fail(param, pointer, 'the schema false allows nothing');
      return node;
    }
    if (!isSchema(node)) fail(param, pointer, 'a subschema must be an object');
    let s: Schema = node;
    if (s['allOf'] !== undefined) s = mergeAllOf(s, pointer, param);
    for (const key of Object.keys(s)) {
      if (ANNOTATIONS.has(key)) continue;
      if (!KEYWORDS.has(key)) fail(param, `${pointer}/${escapePointer(key)}`, `the keyword '${key}' is not supported by structured outputs`);
      if ((key === '$defs' || key === 'definitions') && !isRoot) fail(param, `${pointer}/${key}`, `'${key}' is supported at the root only`);
    }
    const out: Schema = { ...s };
    const type = s['type'];
    if (type !== undefined) {
      const types = Array.isArray(type) ? type : [type];
      if (types.length === 0 || !types.every((t) => typeof t === 'string' && TYPES.has(t))) {
        fail(param, `${pointer}/type`, `'type' must be one of ${[...TYPES].join(', ')} or an array of them`);
      }
    }
    const count = (key: string) => {
      const v = s[key];
      if (v === undefined) return undefined;
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > SCHEMA_LIMITS.maxCount) {
        fail(param, `${pointer}/${key}`, `'${key}' must be an integer in [0, ${SCHEMA_LIMITS.maxCount}]`);
      }
      return v;
    };
    const minItems = count('minItems'), maxItems = count('maxItems');
    if (minItems !== undefined && maxItems !== undefined && minItems > maxItems) fail(param, `${pointer}/minItems`, "'minItems' exceeds 'maxItems'");
    checkItemCounts(s, minItems, maxItems, pointer, param);
    checkNumericBounds(s, out, pointer, (at, message) => fail(param, at, message));
    if (s['pattern'] !== undefined) {
      const rewritten = checkPattern(s['pattern'], `${pointer}/pattern`, param);
      spend(rewritten.cost, `${pointer}/pattern`);
      out['pattern'] = rewritten.regex;
    }
    if (s['format'] !== undefined && !(SUPPORTED_FORMATS as readonly Json[]).includes(s['format'])) {
      fail(param, `${pointer}/format`, `the format '${String(s['format'])}' is not supported (supported: ${SUPPORTED_FORMATS.join(', ')})`);
    }
    // Dates, times and emails as exact patterns (the compiler's own accept minute 60, September 31 and "a@b").
    const exact = typeof s['format'] === 'string' ? FORMAT_PATTERNS[s['format']] : undefined;
    if (exact !== undefined && s['pattern'] === undefined) {
      delete out['format'];
      out['pattern'] = exact;
    }
    const lengths = stringLengths(s, pointer, param);
    if (lengths !== undefined) {
      spend(lengths.cost, `${pointer}/${lengths.keyword}`);
      delete out['minLength'];
      delete out['maxLength'];
      out['pattern'] = lengths.pattern;
    }
    const values = s['enum'];
    if (values !== undefined && (!Array.isArray(values) || values.length === 0 || values.length > SCHEMA_LIMITS.maxEnum)) {
      fail(param, `${pointer}/enum`, `'enum' must be a non-empty array of at most ${SCHEMA_LIMITS.maxEnum} values`);
    }
    if (s['$ref'] !== undefined) {
      const ref = s['$ref'];
      if (typeof ref !== 'string' || (ref !== '#' && !defs.has(ref))) {
        fail(param, `${pointer}/$ref`, `'$ref' must name '#' or a schema under the root's $defs (got ${JSON.stringify(ref)})`);
      }
    }
    const props = s['properties'];
    if (props !== undefined) {
      if (!isSchema(props)) fail(param, `${pointer}/properties`, "'properties' must be an object of schemas");
      const p: Schema = {};
      for (const [k, v] of Object.entries(props)) {
        checkPropertyName(k, `${pointer}/properties/${escapePointer(k)}`, param);
        p[k] = visit(v, `${pointer}/properties/${escapePointer(k)}`, depth + 1);
      }
      out['properties'] = p;
    }
    const required = s['required'];
    if (required !== undefined && (!Array.isArray(required) || !required.every((r) => typeof r === 'string'))) {
      fail(param, `${pointer}/required`, "'required' must be an array of property names");
    }
    if (Array.isArray(required)) required.forEach((r, i) => checkPropertyName(r as string, `${pointer}/required/${i}`, param));
    const additional = s['additionalProperties'];
    if (additional !== undefined && typeof additional !== 'boolean') {
      out['additionalProperties'] = visit(additional, `${pointer}/additionalProperties`, depth + 1);
    }
    if (additional === false && Array.isArray(required)) {
      for (const r of required as string[]) {
        if (!isSchema(props) || !(r in props)) fail(param, `${pointer}/required`, `the required property '${r}' is not allowed by additionalProperties: false`);
      }
    }
    const isObject = type === 'object' || (Array.isArray(type) && type.includes('object')) || props !== undefined;
    if (strict && isObject) {
      if (additional !== false) fail(param, `${pointer}/additionalProperties`, "strict mode needs 'additionalProperties': false on every object");
      const keys = isSchema(props) ? Object.keys(props) : [];
      const req = new Set(Array.isArray(required) ? required as string[] : []);
      const missing = keys.find((k) => !req.has(k));
      if (missing !== undefined) fail(param, `${pointer}/required`, `strict mode needs every property required; '${missing}' is not`);
    }
    for (const key of ['anyOf', 'oneOf'] as const) {
      const v = s[key];
      if (v === undefined) continue;
      if (!Array.isArray(v) || v.length === 0) fail(param, `${pointer}/${key}`, `'${key}' must be a non-empty array of schemas`);
      if (strict && isRoot && key === 'anyOf') fail(param, `${pointer}/anyOf`, 'strict mode needs the root to be an object, not anyOf');
      // oneOf is enforced as anyOf: the grammar cannot exclude values matching two branches.
      out['anyOf'] = v.map((b, i) => visit(b, `${pointer}/${key}/${i}`, depth + 1));
      if (key === 'oneOf') delete out['oneOf'];
    }
    const items = s['items'];
    if (items !== undefined && items !== false) out['items'] = visit(items, `${pointer}/items`, depth + 1);
    const prefix = s['prefixItems'];
    if (prefix !== undefined) {
      if (!Array.isArray(prefix)) fail(param, `${pointer}/prefixItems`, "'prefixItems' must be an array of schemas");
      out['prefixItems'] = prefix.map((b, i) => visit(b, `${pointer}/prefixItems/${i}`, depth + 1));
    }
    for (const key of ['$defs', 'definitions'] as const) {
      const d = s[key];
      if (!isSchema(d)) continue;
      const o: Schema = {};
      for (const [k, v] of Object.entries(d)) o[k] = visit(v, `${pointer}/${key}/${escapePointer(k)}`, depth + 1);
      out[key] = o;
    }
    if (strict && isRoot && !isObject) fail(param, `${pointer}/type`, "strict mode needs the root schema to be 'type': 'object'");
    return out;
  };
  const checked = visit(schema as Json, '', 0, true) as Schema;
  checkRefExpansion(checked, { maxDepth: SCHEMA_LIMITS.maxDepth, maxSubschemas: SCHEMA_LIMITS.maxNodes }, (at, message) => fail(param, at, message));
  return { schema: checked };
}

/**
 * A property name is written into the grammar as the JSON string's raw text: xgrammar aborts on
 * one holding a quote or a control character, and reads a backslash as an escape.
 */
function checkPropertyName(name: string, pointer: string, param: string): void {
  // eslint-disable-next-line no-control-regex
  if (/["\\\u0000-\u001f]/.test(name)) {
    fail(param, pointer, `the property name ${JSON.stringify(name)} holds a quote, backslash or control character, which structured outputs do not support`);
  }
}

/** items: false allows the prefixItems only, and the compiler always writes every one of them. */
function checkItemCounts(s: Schema, minItems: number | undefined, maxItems: number | undefined, pointer: string, param: string): void {
  const prefix = Array.isArray(s['prefixItems']) ? s['prefixItems'].length : 0;
  if (s['items'] === false && minItems !== undefined && minItems > prefix) {
    fail(param, `${pointer}/minItems`, `'minItems' ${minItems} asks for more items than 'items': false with ${prefix} 'prefixItems' allows`);
  }
  if (maxItems !== undefined && maxItems < prefix) {
    fail(param, `${pointer}/maxItems`, `'maxItems' ${maxItems} is below the number of 'prefixItems' (${prefix}), which structured outputs always write`);
  }
}

/** One JSON string character as it appears in the output: no escapes, no control characters. */
const PLAIN_CHAR = '[^\\x00-\\x1f"\\\\]';

/**
 * minLength / maxLength as a pattern counting characters (code points, as JSON Schema counts
 * them). The strings it admits hold no escapes: every character is written as itself.
 */
function stringLengths(s: Schema, pointer: string, param: string): { pattern: string; cost: number; keyword: string } | undefined {
  const bound = (key: string) => {
    const v = s[key];
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > SCHEMA_LIMITS.maxStringLength) {
      fail(param, `${pointer}/${key}`, `'${key}' must be an integer in [0, ${SCHEMA_LIMITS.maxStringLength}] (longer limits are not supported by structured outputs)`);
    }
    return v;
  };
  const min = bound('minLength'), max = bound('maxLength');
  if (min === undefined && max === undefined) return undefined;
  const keyword = min !== undefined ? 'minLength' : 'maxLength';
  if (min !== undefined && max !== undefined && min > max) fail(param, `${pointer}/minLength`, "'minLength' exceeds 'maxLength'");
  for (const other of ['pattern', 'format', 'enum', 'const']) {
    if (s[other] !== undefined) fail(param, `${pointer}/${keyword}`, `'${keyword}' together with '${other}' is not supported by structured outputs`);
  }
  // One class repeated: counted, not unrolled (see SCHEMA_LIMITS), at most 3 positions.
  return { pattern: `^${PLAIN_CHAR}{${min ?? 0},${max ?? ''}}$`, cost: Math.min(3, Math.max(min ?? 0, max ?? 0, 1)), keyword };
}

/**
 * allOf of object schemas becomes one object: properties joined (a property named twice must be
 * the same schema), required unioned, additionalProperties false if any part closes the object.
 */
function mergeAllOf(s: Schema, pointer: string, param: string): Schema {
  const parts = s['allOf'];
  if (!Array.isArray(parts) || parts.length === 0) fail(param, `${pointer}/allOf`, "'allOf' must be a non-empty array of schemas");
  const { allOf: _drop, ...rest } = s;
  const merged: Schema = { ...rest, type: 'object' };
  const props: Schema = isSchema(rest['properties']) ? { ...rest['properties'] } : {};
  const required = new Set<string>(Array.isArray(rest['required']) ? rest['required'] as string[] : []);
  let closed = rest['additionalProperties'] === false;
  parts.forEach((part, i) => {
    const at = `${pointer}/allOf/${i}`;
    if (!isSchema(part) || (part['type'] !== undefined && part['type'] !== 'object')) {
      fail(param, at, 'allOf is supported for object schemas only');
    }
    for (const key of Object.keys(part)) {
      if (!ANNOTATIONS.has(key) && !['type', 'properties', 'required', 'additionalProperties'].includes(key)) {
        fail(param, `${at}/${escapePointer(key)}`, `the keyword '${key}' inside allOf is not supported (objects with properties, required and additionalProperties only)`);
      }
    }
    if (isSchema(part['properties'])) {
      for (const [k, v] of Object.entries(part['properties'])) {
        if (k in props && JSON.stringify(props[k]) !== JSON.stringify(v)) {
          fail(param, `${at}/properties/${escapePointer(k)}`, `allOf parts give the property '${k}' different schemas`);
        }
        props[k] = v;
      }
    }
    if (Array.isArray(part['required'])) for (const r of part['required']) if (typeof r === 'string') required.add(r);
    if (part['additionalProperties'] === false) closed = true;
    else if (part['additionalProperties'] !== undefined && part['additionalProperties'] !== true) {
      fail(param, `${at}/additionalProperties`, 'allOf parts may close the object (false) but not constrain extra properties');
    }
  });
  merged['properties'] = props;
  if (required.size > 0) merged['required'] = [...required];
  if (closed) {
    // A part closed with additionalProperties: false admits only its own properties.
    parts.forEach((part, i) => {
      if (!isSchema(part) || part['additionalProperties'] !== false) return;
      const own = isSchema(part['properties']) ? part['properties'] : {};
      const outside = Object.keys(props).find((k) => !(k in own));
      if (outside !== undefined) {
        fail(param, `${pointer}/allOf/${i}/additionalProperties`, `this allOf part closes the object, so the property '${outside}' of another part can never appear`);
      }
    });
    merged['additionalProperties'] = false;
  }
  return merged;
}

/**
 * Regular expressions as ECMAScript reads them (JSON Schema's dialect), rewritten for the grammar
 * compiler (json-pattern.ts): literals, classes, escapes (\d \w \s ...), groups, alternation,
 * quantifiers, anchors at the ends.
 */
function checkPattern(pattern: Json, pointer: string, param: string): JsonPattern {
  if (typeof pattern !== 'string' || pattern.length === 0 || pattern.length > SCHEMA_LIMITS.maxPatternLength) {
    fail(param, pointer, `'pattern' must be a regular expression of 1 to ${SCHEMA_LIMITS.maxPatternLength} characters`);
  }
  try {
    new RegExp(pattern, 'u');
  } catch (err) {
    fail(param, pointer, `'pattern' is not a valid regular expression: ${(err as Error).message}`);
  }
  let rewritten: JsonPattern;
  try {
    rewritten = jsonPattern(pattern);
  } catch (err) {
    if (err instanceof PatternError) fail(param, pointer, `'pattern' is not supported by structured outputs: ${err.message}`);
    throw err;
  }
  if (rewritten.positions > SCHEMA_LIMITS.maxPatternPositions) {
    fail(param, pointer, `'pattern' unrolls to more than ${SCHEMA_LIMITS.maxPatternPositions} characters (repetition counts multiplied out)`);
  }
  return rewritten;
}
