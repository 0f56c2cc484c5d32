// Structured outputs on the real engine with a random-weight model (any output is possible, so
// the grammar does all the work): a corpus of schemas covering every supported keyword, each
// output checked by an independent validator (ajv + ajv-formats); the schema checks' 400s; and
// determinism alone and batched.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import Ajv2020 from 'ajv/dist/2020.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { checkResponseSchema } from '../src/structured/schema-check.js';
import { StructuredOutputs } from '../src/structured/structured-outputs.js';
import { checkOutputs } from './helpers/validate-outputs.js';

let root: string;
let engine: Engine;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-structured-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 5 });
  engine = await Engine.load({ model: join(root, 'tiny'), backend: 'cpu', kvCacheBytes: 64 << 20, maxNumSeqs: 32 });
});
afterAll(async () => {
  await engine?.dispose();
  rmSync(root, { recursive: true, force: true });
});

type S = Record<string, unknown>;

/** Leaf schemas covering the scalar keywords. */
const LEAVES: S[] = [
  { type: 'string' }, { type: 'string', pattern: '^[a-z]{2,5}$' }, { type: 'string', pattern: '^[A-Z][a-z]?$' },
  { type: 'string', pattern: '^[a-c]{2,4}-[0-9]{1,3}$' }, { type: 'string', pattern: '^x.y$' }, { type: 'string', pattern: '^[^0-9]+$' },
  { type: 'string', format: 'date' }, { type: 'string', format: 'time' }, { type: 'string', format: 'date-time' },
  { type: 'string', format: 'uuid' }, { type: 'string', format: 'email' },
  { type: 'integer' }, { type: 'integer', minimum: 3, maximum: 17 }, { type: 'integer', minimum: -5, maximum: 5 },
  { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 100 }, { type: 'number' }, { type: 'number', minimum: 0, maximum: 1 },
  { type: 'boolean' }, { type: 'null' }, { type: ['string', 'null'] }, { type: ['integer', 'boolean'] },
  { enum: ['red', 'green', 'blue'] }, { enum: [1, 'two', null, true] }, { const: 'fixed' }, { const: 42 },
  { anyOf: [{ type: 'integer' }, { type: 'string', format: 'uuid' }] }, { oneOf: [{ type: 'boolean' }, { type: 'null' }] },
  { type: 'array', items: { type: 'integer' }, maxItems: 4 }, { type: 'array', items: { type: 'string', pattern: '^[0-9]{3}$' }, minItems: 1, maxItems: 3 },
  { type: 'array', prefixItems: [{ type: 'string', enum: ['a', 'bc'] }, { type: 'integer' }], items: false },
  { type: 'array', items: { enum: ['a', 'b'] }, minItems: 2, maxItems: 2 },
  { type: 'string', maxLength: 4 }, { type: 'string', minLength: 2, maxLength: 6 }, { type: ['string', 'null'], minLength: 3, maxLength: 3 },
];

/** Wraps leaves into objects (strict and not), nested objects, allOf, additionalProperties schemas and $ref recursion. */
function corpus(): { schema: S; strict: boolean }[] {
  const out: { schema: S; strict: boolean }[] = [];
  LEAVES.forEach((leaf, i) => {
    out.push({ schema: leaf, strict: false });
    out.push({ schema: { type: 'object', properties: { v: leaf }, required: ['v'], additionalProperties: false }, strict: true });
    const other = LEAVES[(i * 7 + 3) % LEAVES.length]!;
    out.push({ schema: { type: 'object', properties: { a: leaf, b: other }, required: ['a', 'b'], additionalProperties: false }, strict: true });
    out.push({ schema: { type: 'object', properties: { a: leaf, b: other }, required: ['a'] }, strict: false });
    out.push({ schema: { type: 'object', properties: { outer: { type: 'object', properties: { inner: leaf }, required: ['inner'], additionalProperties: false } },
      required: ['outer'], additionalProperties: false }, strict: true });
    out.push({ schema: { type: 'array', items: leaf, maxItems: 3 }, strict: false });
    out.push({ schema: { type: 'object', additionalProperties: leaf }, strict: false });
  });
  for (let i = 0; i < 6; i++) {
    out.push({ schema: { allOf: [{ type: 'object', properties: { x: LEAVES[i]! }, required: ['x'] },
      { type: 'object', properties: { y: LEAVES[i + 10]! }, required: ['y'] }, { additionalProperties: false, properties: { x: LEAVES[i]!, y: LEAVES[i + 10]! } }] },
    strict: false });
    out.push({ schema: { $defs: { node: { type: 'object', properties: { v: LEAVES[i + 11]!, next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } },
      required: ['v', 'next'], additionalProperties: false } }, $ref: '#/$defs/node' }, strict: false });
  }
  return out;
}

describe('structured outputs', () => {
  it('every completed output of a 200+ schema corpus parses and validates', { timeout: 240_000 }, async () => {
    const cases = corpus();
    expect(cases.length).toBeGreaterThanOrEqual(200);
    let completed = 0;
    const failures: string[] = [];
    for (let start = 0; start < cases.length; start += 32) {
      const batch = cases.slice(start, start + 32);
      const results = await Promise.all(batch.map(({ schema, strict }, j) => engine.generate({
        prompt: `case ${start + j}`, maxTokens: 160, temperature: 1, seed: start + j,
        responseFormat: { type: 'json_schema', schema, strict },
      })));
      const check = checkOutputs(results, batch.map((c) => c.schema));  // outputs cut by maxTokens are not checked
      completed += check.completed;
      failures.push(...check.failures);
    }
    expect(failures).toEqual([]);
    // Most outputs complete within the token limit (else the check above would prove little).
    expect(completed).toBeGreaterThan(cases.length / 2);
  });

  it('strings are valid UTF-8 of the allowed length whichever allowed token is taken', { timeout: 60_000 }, async () => {
    // A random walk over each step's allowed tokens, favouring tokens outside ASCII: the model's
    // sampler would rarely try the byte sequences that are valid-looking UTF-8 structure but not
    // valid UTF-8 (C0/C1/F5+ leads, overlongs, surrogates), which decode to U+FFFD.
    const tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
    const structured = engine.structuredOutputs();
    const vocab = structured.maskWords * 32;  // bits past the vocabulary must be clear too
    let seed = 11;
    const random = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
    const nonAscii = new Set<number>();
    for (const [, id] of tokenizer.vocab()) if (/[^\x00-\x7f]/.test(tokenizer.tokenText(id)) && !tokenizer.isSpecial(id)) nonAscii.add(id);
    const ajv = new Ajv2020.default({ strict: false });
    const failures: string[] = [];
    let completed = 0;
    for (const schema of [{ type: 'string' }, { type: 'string', maxLength: 3 }, { type: 'string', minLength: 2, maxLength: 5 },
      { type: 'string', pattern: '^.{2,4}$' }, { type: 'array', items: { type: 'string', maxLength: 2 }, maxItems: 3 }]) {
      for (let walk = 0; walk < 60; walk++) {
        const c = await structured.constraint({ type: 'json_schema', schema });
        const mask = new Uint32Array(structured.maskWords);
        const ids: number[] = [];
        let ended = false;
        for (let step = 0; step < 40 && !ended; step++) {
          await c.fillMask(mask, 0);
          const allowed: number[] = [];
          for (let t = 0; t < vocab; t++) if ((mask[t >>> 5]! >>> (t & 31)) & 1) allowed.push(t);
          const wide = allowed.filter((t) => nonAscii.has(t));
          const pool = wide.length > 0 && random() < 0.7 ? wide : allowed;
          const t = pool[Math.floor(random() * pool.length)]!;
          if (!c.accept(t)) throw new Error(`refused ${t} at step ${step} of ${JSON.stringify(schema)}: ${c.failure?.message} allowed=${allowed.length}`);
          if (tokenizer.eosTokenIds.has(t)) ended = true;
          else ids.push(t);
        }
        c.dispose();
        const text = tokenizer.decode(ids);
        // A walk cut short may end inside a character; nowhere else may a replacement character appear.
        if ((ended ? text : text.replace(/\ufffd{1,3}$/, '')).includes('\ufffd')) failures.push(`${JSON.stringify(schema)}: ${JSON.stringify(text)}`);
        if (!ended) continue;
        completed++;
        if (!ajv.validate(schema, JSON.parse(text))) failures.push(`${JSON.stringify(schema)}: ${JSON.stringify(text)}: ${ajv.errorsText()}`);
      }
    }
    expect(failures).toEqual([]);
    expect(completed).toBeGreaterThan(100);
  });

  it('the native engine allows exactly the tokens xgrammar allows, step by step, over the corpus', { timeout: 240_000 }, async () => {
    // xgrammar (with the UTF-8 range checks vocabulary.ts adds) is the independent reference: the
    // native engine reads the grammar text xgrammar prints, then matches tokens on its own. It runs
    // twice: as served (cheap masks filled on this thread) and with every changed mask computed on
    // the libuv pool.
    const tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
    const vocabSize = engine.structuredOutputs().maskWords * 32;
    const native = new StructuredOutputs(tokenizer, vocabSize, { engine: 'native' });
    const pooled = new StructuredOutputs(tokenizer, vocabSize, { engine: 'native', maskWorkOnEventLoop: 0 });
    const reference = new StructuredOutputs(tokenizer, vocabSize, { engine: 'xgrammar', workers: 1 });
    let seed = 3;
    const random = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
    const words = native.maskWords;
    const a = new Uint32Array(words);
    const b = new Uint32Array(words);
    const p = new Uint32Array(words);
    const mismatches: string[] = [];
    let steps = 0;
    try {
      const cases = corpus().filter((_, i) => i % 3 === 0);
      for (const { schema, strict } of cases) {
        const format = { type: 'json_schema' as const, schema, strict };
        const [n, np, x] = [await native.constraint(format), await pooled.constraint(format), await reference.constraint(format)];
        for (let step = 0; step < 40; step++) {
          await Promise.all([n.fillMask(a, 0), np.fillMask(p, 0), x.fillMask(b, 0)]);
          steps++;
          const allowed: number[] = [];
          for (let t = 0; t < vocabSize; t++) {
            const [inA, inP, inB] = [(a[t >>> 5]! >>> (t & 31)) & 1, (p[t >>> 5]! >>> (t & 31)) & 1, (b[t >>> 5]! >>> (t & 31)) & 1];
            if ((inA !== inB || inP !== inB) && mismatches.length < 10) {
              mismatches.push(`${JSON.stringify(schema)} step ${step} token ${t} ${JSON.stringify(tokenizer.tokenText(t))}: native ${inA}, native on the pool ${inP}, xgrammar ${inB}`);
            }
            if (inA) allowed.push(t);
          }
          if (allowed.length === 0) break;
          const t = allowed[Math.floor(random() * allowed.length)]!;
          expect(n.accept(t)).toBe(true);
          expect(np.accept(t)).toBe(true);
          expect(x.accept(t)).toBe(true);
          if (tokenizer.eosTokenIds.has(t)) break;
        }
        n.dispose();
        np.dispose();
        x.dispose();
      }
    } finally {
      await Promise.all([native.dispose(), pooled.dispose(), reference.dispose()]);
    }
    expect(mismatches).toEqual([]);
    expect(steps).toBeGreaterThan(1000);
  });

  it('a schema that compiles too long is refused; a matcher worker that dies has its sequences rebuilt and is replaced', { timeout: 60_000 }, async () => {
    const tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
    const vocabSize = engine.structuredOutputs().maskWords * 32;
    const impatient = new StructuredOutputs(tokenizer, vocabSize, { compileTimeoutMs: 1 });
    // Matchers on the xgrammar workers (WebAssembly) are what a worker's death could take with it.
    const structured = new StructuredOutputs(tokenizer, vocabSize, { workers: 2, engine: 'xgrammar' });
    try {
      // Many unrolled positions (a length limit is one counted run now, compiled at once).
      const err = await impatient.constraint({ type: 'json_schema', schema: { type: 'string', pattern: '^(ab|c.){0,60}$' }, param: 'text.format.schema' })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SluiceError);
      expect((err as SluiceError).param).toBe('text.format.schema');
      expect((err as SluiceError).message).toMatch(/took longer than 0.001 s to compile/);

      const mask = new Uint32Array(structured.maskWords);
      const open = tokenizer.encode('{', { addBos: false })[0]!;
      // Two sequences land on the two workers; the first's worker goes away (as on a WebAssembly abort).
      const before = await structured.constraint({ type: 'json_object' });
      const other = await structured.constraint({ type: 'json_object' });
      const workers = (structured as unknown as { workers: ({ stop(e: Error): Promise<void> } | undefined)[] }).workers;
      expect(workers.every((w) => w !== undefined)).toBe(true);
      await Promise.all([before.fillMask(mask, 0), other.fillMask(mask, 0)]);
      expect(before.accept(open)).toBe(true);
      await workers[0]!.stop(new Error('killed by the test'));
      // Its sequence goes on from where it was, on a fresh worker (rebuilt from its grammar and tokens).
      await before.fillMask(mask, 0);
      expect(before.failure).toBeUndefined();
      expect((mask[open >>> 5]! >>> (open & 31)) & 1).toBe(0);  // '{' again is not JSON
      expect(workers[0]).not.toBeUndefined();
      before.dispose();
      // The other worker's sequence goes on; a new sequence gets a live worker.
      await other.fillMask(mask, 0);
      expect(other.accept(open)).toBe(true);
      other.dispose();
      const after = await structured.constraint({ type: 'json_object' });
      await after.fillMask(mask, 0);
      expect((mask[open >>> 5]! >>> (open & 31)) & 1).toBe(1);
      expect(after.accept(open)).toBe(true);
      after.dispose();
    } finally {
      await impatient.dispose();
      await structured.dispose();
    }
  });

  it('JSON mode gives a JSON object', { timeout: 60_000 }, async () => {
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => engine.generate({
      prompt: `object ${i}`, maxTokens: 200, temperature: 1, seed: 100 + i, responseFormat: { type: 'json_object' } })));
    const completed = results.filter((r) => r.finishReason === 'stop');
    expect(completed.length).toBeGreaterThan(0);
    for (const r of completed) {
      const v = JSON.parse(r.text) as unknown;
      expect(typeof v === 'object' && v !== null && !Array.isArray(v)).toBe(true);
    }
  });

  it('same seed, same output, alone or batched; a cut value is finish reason length', async () => {
    const schema = { type: 'object', properties: { name: { type: 'string', pattern: '^[a-z]{1,6}$' }, n: { type: 'integer' } }, required: ['name', 'n'], additionalProperties: false };
    const req = (seed: number, maxTokens = 120) => ({ prompt: 'det', maxTokens, temperature: 1, seed, responseFormat: { type: 'json_schema' as const, schema, strict: true } });
    const alone = await engine.generate(req(7));
    const batched = await Promise.all([req(1), req(7), req(3)].map((r) => engine.generate(r)));
    expect(batched[1]!.text).toBe(alone.text);
    // A long shared prompt, computed once and then read from the prefix cache: the same output.
    const long = { ...req(7), prompt: 'determinism with a cached prefix '.repeat(12), promptCacheKey: 'structured' };
    const first = await engine.generate(long);
    const second = await engine.generate(long);
    expect(second.usage.cachedTokens).toBeGreaterThan(0);
    expect(second.text).toBe(first.text);
    const cut = await engine.generate(req(7, 3));
    expect(cut.finishReason).toBe('length');
    expect(() => JSON.parse(cut.text)).toThrow();
  });

  it('refuses unsupported keywords and broken schemas with the keyword and its JSON pointer', async () => {
    const refuse = async (schema: unknown, strict: boolean, message: RegExp) => {
      const err = await engine.generate({ prompt: 'x', maxTokens: 4, responseFormat: { type: 'json_schema', schema, strict, param: 'text.format.schema' } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SluiceError);
      expect((err as SluiceError).code).toBe('invalid_request');
      expect((err as SluiceError).param).toBe('text.format.schema');
      expect((err as SluiceError).message).toMatch(message);
    };
    await refuse({ type: 'object', properties: { a: { type: 'integer', multipleOf: 3 } } }, false, /'multipleOf'.*\/properties\/a\/multipleOf/);
    await refuse({ type: 'array', uniqueItems: true }, false, /'uniqueItems'.*\/uniqueItems/);
    await refuse({ type: 'object', minProperties: 1 }, false, /'minProperties'/);
    await refuse({ not: { type: 'string' } }, false, /'not'/);
    await refuse({ type: 'array', items: { type: 'string', maxLength: 1001 } }, false, /'maxLength'.*\[0, 1000\].*\/items\/maxLength/);
    await refuse({ type: 'string', minLength: 5, maxLength: 4 }, false, /'minLength' exceeds 'maxLength'.*\/minLength/);
    await refuse({ type: 'string', pattern: '^a+$', maxLength: 4 }, false, /'maxLength' together with 'pattern'.*\/maxLength/);
    // Length limits are counted runs (3 positions at most each); unrolled repetitions fill the budget.
    await refuse({ type: 'object', properties: { a: { type: 'string', pattern: '^(ab|cd){0,100}$' }, b: { type: 'string', pattern: '^(ab|cd){0,26}$' }, c: { type: 'string', maxLength: 10 } } },
      false, /unroll to more than 128 grammar positions.*\/properties\/c\/maxLength/);
    await refuse({ type: 'string', format: 'hostname' }, false, /hostname.*\/format/);
    await refuse({ type: 'string', pattern: '(?=a)b' }, false, /lookaround/);
    await refuse({ type: 'integer', minimum: 5, maximum: 1 }, false, /no integer satisfies both 'minimum' 5 and 'maximum' 1/);
    await refuse({ $ref: '#/$defs/missing' }, false, /\$ref/);
    await refuse({ type: 'object', properties: { a: { type: 'string' } }, required: ['a'] }, true, /additionalProperties.*false/);
    await refuse({ type: 'object', properties: { a: { type: 'string' }, b: { type: 'string' } }, required: ['a'], additionalProperties: false }, true,
      /'b' is not.*\/required/);
    await refuse({ type: 'string' }, true, /root schema/);
    await refuse({ type: 'object', properties: { a: {} }, required: ['b'], additionalProperties: false }, false, /'b' is not allowed/);
    await refuse({ allOf: [{ properties: { a: {} } }, { properties: { b: {} }, additionalProperties: false }] }, false, /'a' of another part/);
    // The checker alone: nesting and size limits.
    let deep: unknown = { type: 'string' };
    for (let i = 0; i < 40; i++) deep = { type: 'array', items: deep };
    expect(() => checkResponseSchema(deep, { strict: false, param: 'p' })).toThrow(/deeper than 32/);
  });
});
