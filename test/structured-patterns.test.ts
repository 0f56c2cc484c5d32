// Issue 27 on the real engine with a random-weight model (any output is possible, so the grammar
// does all the work): patterns whose classes hold or exclude quotes, backslashes, control and
// space characters, bounds and longer strings, and bounded integers and numbers (on the native
// engine and on the xgrammar fallback) yield only outputs that parse and validate (ajv);
// each hostile schema is a 400 in plain words, and structured outputs keep working after it.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { StructuredOutputs } from '../src/structured/structured-outputs.js';
import { REFUSED } from './helpers/hostile-schemas.js';
import { checkOutputs } from './helpers/validate-outputs.js';

let root: string;
let engine: Engine;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-structured-patterns-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 7 });
  engine = await Engine.load({ model: join(root, 'tiny'), backend: 'cpu', kvCacheBytes: 64 << 20, maxNumSeqs: 32 });
});
afterAll(async () => {
  await engine?.dispose();
  rmSync(root, { recursive: true, force: true });
});

const PATTERNS = [
  '^\\W{1,12}$', '^\\S{1,12}$', '^[\\s\\S]{1,12}$', '^\\s{1,6}$', '^[^a-z]{1,12}$', '^["\\\\]{1,6}$', '^[a"\\\\ ]{1,8}$', '^.{1,12}$',
  '^\\D{2,10}$', '^x"y\\\\z$', '^\\n\\t?$', '^[\\x01-\\x1f]{1,4}$', '^(a|"|\\\\)+$', 'a|b', '^[^"]{0,10}$', '^\\w+@\\w+\\.[a-z]{2,3}$',
];

/** Schemas that must come out valid: the patterns alone and in objects, bounds, and lengths up to the limit. */
function corpus(): object[] {
  const out: object[] = [];
  for (const pattern of PATTERNS) {
    out.push({ type: 'string', pattern });
    out.push({ type: 'object', properties: { v: { type: 'string', pattern } }, required: ['v'], additionalProperties: false });
  }
  out.push({ type: 'integer', exclusiveMinimum: 4, exclusiveMaximum: 7 }, { type: 'integer', minimum: -3, exclusiveMaximum: -1 },
    { type: 'integer', minimum: 5, maximum: 5 }, { type: 'integer', minimum: 18, maximum: 120 }, { type: 'integer', minimum: -300, maximum: -50 },
    { type: 'string', maxLength: 40 }, { type: 'string', minLength: 100, maxLength: 128 },
    { type: 'array', prefixItems: [{ type: 'integer' }, { type: 'string', pattern: '^\\W$' }], items: false, minItems: 2 });
  out.push(...NUMERIC);
  return out;
}

/**
 * Bounded integers and numbers (our own grammar, numeric-grammar.ts): xgrammar's ranges let 1..4
 * through minimum 5, 1.5 through maximum 1 and 121..129 through 18..120. Some fixed, some random.
 */
const NUMERIC: object[] = (() => {
  const out: object[] = [
    { type: 'integer', minimum: 5 }, { type: 'number', minimum: 0, maximum: 1 }, { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 },
    { type: 'integer', maximum: -11 }, { type: ['integer', 'null'], minimum: 1000, maximum: 100_000 }, { minimum: 3, maximum: 7 },
    { type: 'integer', minimum: -Number.MAX_SAFE_INTEGER, maximum: -Number.MAX_SAFE_INTEGER + 500 }, { type: 'number', maximum: -3, exclusiveMinimum: -5 },
    { type: 'object', properties: { age: { type: 'integer', minimum: 18, maximum: 120 }, score: { type: 'number', minimum: 0, maximum: 1 }, n: { type: ['number', 'string'], exclusiveMinimum: 10 } },
      required: ['age', 'score', 'n'], additionalProperties: false },
    { type: 'array', items: { type: 'integer', exclusiveMinimum: -3, exclusiveMaximum: 300 }, minItems: 1, maxItems: 4 },
  ];
  let seed = 27;
  const random = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
  for (let i = 0; i < 8; i++) {
    const a = Math.round((random() - 0.5) * 10 ** (1 + Math.floor(random() * 6)));
    const b = a + Math.floor(random() * 10 ** (1 + Math.floor(random() * 5)));
    out.push(i % 2 === 0 ? { type: 'integer', minimum: a, maximum: b } : { type: 'number', exclusiveMinimum: a, maximum: b + 1 });
  }
  return out;
})();

/** Generates under each schema with seeds 0..5, 32 at a time; every completed output must parse and validate (ajv). */
async function expectValidOutputs(schemas: object[]): Promise<void> {
  const cases = schemas.flatMap((schema) => [0, 1, 2, 3, 4, 5].map((seed) => ({ schema, seed })));
  const failures: string[] = [];
  let completed = 0;
  for (let start = 0; start < cases.length; start += 32) {
    const batch = cases.slice(start, start + 32);
    const results = await Promise.all(batch.map(({ schema, seed }) => engine.generate({
      prompt: `pattern ${seed}`, maxTokens: 200, temperature: 1, seed, responseFormat: { type: 'json_schema', schema, strict: false },
    })));
    const check = checkOutputs(results, batch.map((c) => c.schema));
    completed += check.completed;
    failures.push(...check.failures);
  }
  expect(failures).toEqual([]);
  expect(completed).toBeGreaterThan(cases.length / 2);
}

describe('structured outputs under hostile patterns and bounds (issue 27)', () => {
  it('every completed output parses as JSON and validates', { timeout: 240_000 }, async () => {
    await expectValidOutputs(corpus());
  });

  it('bounded numbers stay exact on the xgrammar fallback too (it compiles the same grammar text)', { timeout: 240_000 }, async () => {
    const tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
    const { vocab_size: vocabSize } = JSON.parse(readFileSync(join(root, 'tiny', 'config.json'), 'utf8')) as { vocab_size: number };
    const internals = engine as unknown as { structured?: StructuredOutputs };
    const native = internals.structured;
    const fallback = new StructuredOutputs(tokenizer, vocabSize, { engine: 'xgrammar' });
    internals.structured = fallback;
    try {
      await expectValidOutputs(NUMERIC);
    } finally {
      await fallback.dispose();
      internals.structured = native;
    }
  });

  it('each hostile schema is a 400 in plain words before the grammar engine, which keeps serving', { timeout: 120_000 }, async () => {
    for (const [schema, why] of REFUSED) {
      const err = await engine.generate({ prompt: 'x', maxTokens: 4, responseFormat: { type: 'json_schema', schema, param: 'response_format.json_schema.schema' } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SluiceError);
      expect((err as SluiceError).code).toBe('invalid_request');
      expect((err as SluiceError).param).toBe('response_format.json_schema.schema');
      expect((err as SluiceError).message).toMatch(why);
      expect((err as SluiceError).message).not.toMatch(/ASSERTIONS|Aborted|FATAL/);
    }
    const after = await engine.generate({ prompt: 'after', maxTokens: 60, temperature: 1, seed: 3,
      responseFormat: { type: 'json_schema', schema: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'], additionalProperties: false } } });
    if (after.finishReason === 'stop') expect(typeof (JSON.parse(after.text) as { n: unknown }).n).toBe('number');
    else expect(after.finishReason).toBe('length');
  });
});
