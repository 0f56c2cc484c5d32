// The schema checks that stand before any grammar engine (issue 27): every construct that crashed
// or misled xgrammar is a 400 (SluiceError invalid_request) naming it and its JSON pointer, in a
// response format and in a tool's parameters alike; $ref chains and expansions are bounded.
import { describe, expect, it } from 'vitest';

import { SluiceError } from '../src/errors.js';
import { checkResponseSchema, SCHEMA_LIMITS } from '../src/structured/schema-check.js';
import { toolGrammar } from '../src/structured/tool-grammar.js';
import { xgrammar } from '../src/structured/xgrammar.js';
import { NativeGrammars } from '../src/structured/native-grammar.js';
import { jsonSchemaGrammar } from '../src/structured/numeric-grammar.js';
import { nativeAvailable } from '../src/native/native.js';
import { refChain, doubling, REFUSED } from './helpers/hostile-schemas.js';

const refusal = (fn: () => unknown): SluiceError => {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(SluiceError);
    return err as SluiceError;
  }
  throw new Error('not refused');
};

describe('schema checks before the grammar engine (issue 27)', () => {
  it('refuses each construct that crashes or misleads the engine, naming it and its pointer, in plain words', () => {
    for (const [schema, why] of REFUSED) {
      const err = refusal(() => checkResponseSchema(schema, { strict: false, param: 'text.format.schema' }));
      expect(err.code).toBe('invalid_request');
      expect(err.param).toBe('text.format.schema');
      expect(err.message, JSON.stringify(schema).slice(0, 80)).toMatch(why);
      expect(err.message).not.toMatch(/ASSERTIONS|Aborted|FATAL|xgrammar/i);
    }
  });

  it('refuses the same constructs in a tool\'s parameters when a call is forced', () => {
    for (const [schema, why] of REFUSED) {
      for (const mode of ['required', { name: 'f' }] as const) {
        const err = refusal(() => toolGrammar({ tools: [{ name: 'g', parameters: {} }, { name: 'f', parameters: schema }], mode,
          parallel: false, format: 'hermes', param: 'tools' }));
        expect(err.param).toBe('tools[1].parameters');
        expect(err.message).toMatch(why);
      }
    }
  });

  it('keeps what is well within the limits, and rewrites bounds into the form the compiler takes', () => {
    expect(() => checkResponseSchema(refChain(15), { strict: false, param: 'p' })).not.toThrow();
    expect(() => checkResponseSchema(doubling(8), { strict: false, param: 'p' })).not.toThrow();
    // Recursion through $ref counts once.
    const list = { $defs: { node: { type: 'object', properties: { next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } } } }, $ref: '#/$defs/node' };
    expect(() => checkResponseSchema(list, { strict: false, param: 'p' })).not.toThrow();
    // Exclusive integer bounds become inclusive ones (the range's grammar is our own: numeric-grammar.ts).
    const wide = checkResponseSchema({ type: 'integer', exclusiveMinimum: 4, maximum: 9000, exclusiveMaximum: 7000 }, { strict: false, param: 'p' }).schema;
    expect(wide).toEqual({ type: 'integer', minimum: 5, maximum: 6999 });
    const small = checkResponseSchema({ type: 'integer', exclusiveMinimum: 4, maximum: 9, exclusiveMaximum: 7, title: 't' }, { strict: false, param: 'p' }).schema;
    expect(small).toEqual({ type: 'integer', minimum: 5, maximum: 6, title: 't' });
    expect(checkResponseSchema({ type: 'integer', minimum: 5, maximum: 5 }, { strict: false, param: 'p' }).schema).toEqual({ type: 'integer', minimum: 5, maximum: 5 });
    expect(checkResponseSchema({ type: ['integer', 'null'], minimum: 1, maximum: 3 }, { strict: false, param: 'p' }).schema)
      .toEqual({ type: ['integer', 'null'], minimum: 1, maximum: 3 });
    // An enum's numbers outside the bounds are dropped (xgrammar would write them all).
    expect(checkResponseSchema({ type: 'number', minimum: 3, enum: [1, 'a', 3, 4.5, 9] }, { strict: false, param: 'p' }).schema)
      .toEqual({ type: 'number', minimum: 3, enum: ['a', 3, 4.5, 9] });
    // An e-mail of at most 40 characters (refused at 33 before), and one up to the whole budget.
    expect(() => checkResponseSchema({ type: 'string', maxLength: 40 }, { strict: false, param: 'p' })).not.toThrow();
    expect(() => checkResponseSchema({ type: 'string', minLength: 1, maxLength: SCHEMA_LIMITS.maxGrammarPositions }, { strict: false, param: 'p' })).not.toThrow();
    // Narrow classes cost a quarter of a wide one: a 32-digit hex id and a 30-character IBAN tail fit together.
    const ids = { type: 'object', properties: { trace: { type: 'string', pattern: '^[0-9a-f]{32}$' }, iban: { type: 'string', pattern: '^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$' } } };
    expect(() => checkResponseSchema(ids, { strict: false, param: 'p' })).not.toThrow();
  });

  it.runIf(nativeAvailable())('hands the native grammar engine integer ranges it follows exactly (xgrammar writes 18..120 as 18..129)', { timeout: 60_000 }, async () => {
    // A vocabulary of one token per ASCII character (and a stop token), so a value is accepted
    // character by character: what the engine would let a model write.
    const bytes = Uint8Array.from({ length: 128 }, (_, i) => i);
    const offsets = Uint32Array.from({ length: 130 }, (_, i) => Math.min(i, 128));
    const stop = 128;
    const native = await NativeGrammars.create(bytes, offsets, [stop], 0);
    const xg = xgrammar();
    const writes = async (schema: object, value: string, ebnf: (source: string) => Promise<string>) => {
      const source = JSON.stringify(schema);
      const text = await ebnf(source);
      const grammar = await native.grammar(text, async () => text, 10_000, 'p');
      const c = native.constraint(grammar!);
      try {
        return [...value].every((ch) => c.accept(ch.charCodeAt(0))) && c.accept(stop);
      } finally {
        c.dispose();
      }
    };
    const xgrammarOwn = async (source: string) => {
      const g = await xg.Grammar.fromJSONSchema(source, true, undefined, undefined, false, 16);
      try {
        return g.toString();
      } finally {
        g.dispose();
      }
    };
    const ours = (source: string) => jsonSchemaGrammar(xg, source, 16);
    expect(await writes({ type: 'integer', minimum: 18, maximum: 120 }, '125', xgrammarOwn)).toBe(true);  // xgrammar's own range
    const wrong: string[] = [];
    for (const [lo, hi] of [[18, 120], [-7, 12], [53, 114], [-114, -109], [0, 255], [-300, -50], [12000, 12100], [12000, 12999], [-5000, 70000]] as const) {
      const { schema } = checkResponseSchema({ type: 'integer', minimum: lo, maximum: hi }, { strict: false, param: 'p' });
      for (let v = lo - 30; v <= hi + 30; v += hi - lo > 1000 ? 97 : 1) if ((await writes(schema, String(v), ours)) !== (v >= lo && v <= hi)) wrong.push(`${lo}..${hi}: ${v}`);
    }
    expect(wrong.slice(0, 10)).toEqual([]);
  });

  it('hands the compiler a pattern whose strings stay valid JSON', () => {
    const { schema } = checkResponseSchema({ type: 'string', pattern: '^\\W+$' }, { strict: false, param: 'p' });
    expect(schema['pattern']).toBe('^([^\\x00-\\x1f"0-9A-Z\\\\_a-z]+)$');
  });
});
