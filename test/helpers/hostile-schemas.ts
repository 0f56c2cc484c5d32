// Schemas from issue 27's hostile-tenant probe: each crashed or misled the grammar engine before
// the schema checks refused it. Shared by the checker's unit tests and the engine's tests.

/** `$defs` d1..dN, each an array of the one before, the root a $ref to the last (the 10 KB schema at 200). */
export function refChain(links: number): Record<string, unknown> {
  const defs: Record<string, unknown> = { d0: { type: 'integer' } };
  for (let i = 1; i <= links; i++) defs[`d${i}`] = { type: 'array', items: { $ref: `#/$defs/d${i - 1}` } };
  return { $defs: defs, $ref: `#/$defs/d${links}` };
}

/** Each level an object whose two properties are the level before: 2^levels subschemas once expanded. */
export function doubling(levels: number): Record<string, unknown> {
  const defs: Record<string, unknown> = { d0: { type: 'integer' } };
  for (let i = 1; i <= levels; i++) defs[`d${i}`] = { type: 'object', properties: { a: { $ref: `#/$defs/d${i - 1}` }, b: { $ref: `#/$defs/d${i - 1}` } } };
  return { $defs: defs, $ref: `#/$defs/d${levels}` };
}

/** [schema, what the message names (with the pointer)] for each construct the issue found crashing or misleading the engine. */
export const REFUSED: [unknown, RegExp][] = [
  [refChain(200), /deeper than 32 levels once its '\$ref's are followed/],
  [refChain(1000), /deeper than 32/],
  [doubling(14), /more than 5000 subschemas once its '\$ref's are followed.*\/\$ref\)/],
  [{ type: 'string', pattern: '[]' }, /'pattern'.*empty class.*\(at \/pattern\)/],
  [{ type: 'string', pattern: '\\p{L}+' }, /Unicode property escapes.*\(at \/pattern\)/],
  [{ type: 'string', pattern: '^\\0$' }, /NUL.*\(at \/pattern\)/],
  [{ type: 'string', pattern: '^\\uDC00$' }, /lone surrogate/],
  // ^y1.{0,1000}$ (the slow compile) is one counted run now (about 50 ms); a repeated group still unrolls.
  [{ type: 'string', pattern: '^(y.){0,200}$' }, /more than 128 grammar positions.*\(at \/pattern\)/],
  [{ type: 'string', pattern: '^((a{1,1000}){1,1000}){1,1000}$' }, /unrolls to more than 4096 characters/],
  [{ type: 'integer', minimum: 1.5, maximum: 1.7 }, /'minimum' must be a whole number for an integer.*\(at \/minimum\)/],
  [{ type: 'integer', minimum: 1e20 }, /'minimum' must be within.*\(at \/minimum\)/],
  [{ type: 'integer', exclusiveMinimum: 4, exclusiveMaximum: 5 }, /no integer satisfies both 'exclusiveMinimum' 4 and 'exclusiveMaximum' 5/],
  [{ type: 'integer', minimum: 5, maximum: 1 }, /no integer satisfies both 'minimum' 5 and 'maximum' 1/],
  [{ type: 'number', exclusiveMinimum: 5, maximum: 5 }, /no number satisfies both 'exclusiveMinimum' 5 and 'maximum' 5.*\(at \/exclusiveMinimum\)/],
  [{ type: 'number', minimum: 1e308 }, /'minimum' must be within \+-1000000000000000/],
  [{ type: 'number', minimum: 0.5 }, /'minimum' must be a whole number.*fractional bounds/],
  [{ type: 'number', maximum: Infinity }, /finite number/],
  // xgrammar writes an enum's values as they are and ignores bounds beside anyOf.
  [{ type: 'integer', minimum: 3, enum: [1, 2] }, /no value of 'enum' satisfies the bounds.*\(at \/enum\)/],
  [{ type: 'number', exclusiveMaximum: 1, const: 1 }, /'const' 1 does not satisfy the bounds.*\(at \/const\)/],
  [{ type: 'integer', minimum: 5, anyOf: [{ maximum: 10 }, { minimum: 20 }] }, /numeric bounds beside 'anyOf'.*\(at \/minimum\)/],
  [{ type: 'array', items: false, minItems: 1 }, /'minItems' 1 asks for more items than 'items': false.*\(at \/minItems\)/],
  [{ type: 'array', prefixItems: [{ type: 'integer' }], maxItems: 0 }, /'maxItems' 0 is below the number of 'prefixItems'/],
  [{ $defs: { 'a/b': { type: 'integer' } }, $ref: '#/$defs/a~1b' }, /'\$defs' name may not contain '\/'.*\(at \/\$defs\/a~1b\)/],
  [{ $defs: { 'a~b': { type: 'integer' } }, $ref: '#/$defs/a~0b' }, /may not contain/],
  [{ type: 'object', properties: { 'a"b': { type: 'integer' } } }, /property name "a\\"b".*\(at \/properties\/a"b\)/],
  [{ type: 'object', properties: { 'a\\b': { type: 'integer' } } }, /property name "a\\\\b"/],
  [{ type: 'object', properties: { 'a\nb': { type: 'integer' } } }, /property name "a\\nb"/],
  [{ type: 'object', required: ['tab\there'] }, /property name "tab\\there".*\(at \/required\/0\)/],
  [{ type: 'string', maxLength: 1001 }, /'maxLength' must be an integer in \[0, 1000\]/],
  [{ type: 'object', properties: { a: { type: 'string', maxLength: 1000 }, b: { type: 'string', pattern: '^(ab|c ){0,100}$' } } },
    /more than 128 grammar positions.*\/properties\/b\/pattern/],
];
