// Issue 27: minLength / maxLength up to 1,000 on the native grammar engine, whose counted
// elements keep a run's character count in the matcher's state (native/src/grammar). A random-weight
// tiny model (any output is possible, so the grammar does all the work) generates under long
// length limits; every output must finish, parse and validate (ajv, which counts code points), and
// past the limit the schema is a 400.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';
import { SCHEMA_LIMITS } from '../src/structured/schema-check.js';
import type { StructuredOutputs } from '../src/structured/structured-outputs.js';
import { checkOutputs } from './helpers/validate-outputs.js';

let root: string;
let engine: Engine;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-structured-lengths-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 11 });
  engine = await Engine.load({ model: join(root, 'tiny'), backend: 'cpu', kvCacheBytes: 64 << 20, maxNumSeqs: 16 });
});
afterAll(async () => {
  await engine?.dispose();
  rmSync(root, { recursive: true, force: true });
});

/** Code points, as JSON Schema counts a string's length. */
const codePoints = (s: string) => [...s].length;

describe('long string lengths (issue 27)', () => {
  it('maxLength 1000 and minLength 900 outputs finish, parse and validate', { timeout: 300_000 }, async () => {
    const schemas = [
      { type: 'string', maxLength: 1000 },
      { type: 'string', minLength: 900, maxLength: 1000 },
      { type: 'object', properties: { title: { type: 'string', minLength: 900, maxLength: 1000 }, note: { type: 'string', maxLength: 5 } },
        required: ['title', 'note'], additionalProperties: false },
    ];
    const cases = schemas.flatMap((schema) => [0, 1, 2, 3].map((seed) => ({ schema, seed })));
    // At most 1,000 characters, each token at least one: the string must close within the budget.
    const results = await Promise.all(cases.map(({ schema, seed }) => engine.generate({
      prompt: `lengths ${seed}`, maxTokens: 1100, temperature: 1, seed, responseFormat: { type: 'json_schema', schema, strict: false },
    })));
    // Every output must finish: a string of at most 1,000 characters closes within the budget.
    const { failures, values } = checkOutputs(results, cases.map((c) => c.schema), { requireStop: true });
    expect(failures).toEqual([]);
    const lengths = values.map((v) => codePoints(typeof v === 'string' ? v : (v as { title: string }).title));
    // On the native engine (not the xgrammar fallback, which a grammar the native reader refused would get).
    const structured = (engine as unknown as { structured: StructuredOutputs }).structured;
    for (const schema of schemas) {
      const constraint = await structured.constraint({ type: 'json_schema', schema });
      expect(constraint.constructor.name).toBe('NativeConstraint');
      constraint.dispose();
    }
    // The minLength cases really ran past 900 characters (ajv checked; this says the walk got there).
    expect(lengths.filter((n) => n >= 900).length).toBeGreaterThanOrEqual(8);
    expect(Math.max(...lengths)).toBeLessThanOrEqual(1000);
  });

  it('lengths past the limit are a 400 naming the keyword', { timeout: 60_000 }, async () => {
    expect(SCHEMA_LIMITS.maxStringLength).toBeGreaterThanOrEqual(1000);
    for (const [schema, why] of [
      [{ type: 'string', maxLength: SCHEMA_LIMITS.maxStringLength + 1 }, /'maxLength' must be an integer in \[0, 1000\].*\/maxLength/],
      [{ type: 'array', items: { type: 'string', minLength: 1001 } }, /'minLength' must be an integer in \[0, 1000\].*\/items\/minLength/],
    ] as const) {
      const err = await engine.generate({ prompt: 'x', maxTokens: 4, responseFormat: { type: 'json_schema', schema, param: 'response_format.json_schema.schema' } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SluiceError);
      expect((err as SluiceError).code).toBe('invalid_request');
      expect((err as SluiceError).message).toMatch(why);
    }
  });
});
