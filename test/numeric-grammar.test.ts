// Issue 27: bounded integers and numbers come from a grammar of our own (numeric-grammar.ts), not
// xgrammar's ranges. For many random ranges, every integer or decimal text in a window around the
// bounds (and around 0) is accepted, character by character, by the native grammar engine iff it
// is a JSON number in our form (no exponent, no leading zeros, no negative zero) whose value
// satisfies the bounds; xgrammar's EBNF reader (the fallback) takes the same text and agrees.
import { describe, expect, it } from 'vitest';

import { nativeAvailable } from '../src/native/native.js';
import { NativeGrammars } from '../src/structured/native-grammar.js';
import { exactStructuralTag, jsonSchemaGrammar, NumericGrammarError, numericPlan, numericRangeGrammar, type NumericRange, withNumericRules } from '../src/structured/numeric-grammar.js';
import { checkResponseSchema } from '../src/structured/schema-check.js';
import { toolGrammar } from '../src/structured/tool-grammar.js';
import { xgrammar } from '../src/structured/xgrammar.js';

const MAX = BigInt(Number.MAX_SAFE_INTEGER);

function rng(seed: number): () => number {
  let s = seed;
  return () => (s = (s * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
}

/** A random bound: small, medium, large or near the safe-integer limit. */
function randomBound(random: () => number, limit: bigint): bigint {
  const scale = [10n, 1000n, 10n ** 7n, limit][Math.floor(random() * 4)]!;
  const magnitude = BigInt(Math.floor(random() * Number(scale > 2n ** 50n ? 2n ** 50n : scale)));
  const v = scale === limit && random() < 0.5 ? limit - magnitude % 1000n : magnitude;
  return random() < 0.5 ? -v : v;
}

function randomRanges(integer: boolean, count: number, seed: number): NumericRange[] {
  const random = rng(seed);
  const limit = integer ? MAX : 10n ** 15n;
  const out: NumericRange[] = [];
  while (out.length < count) {
    let lo: bigint | undefined = random() < 0.15 ? undefined : randomBound(random, limit);
    let hi: bigint | undefined = random() < 0.15 ? undefined : randomBound(random, limit);
    if (lo !== undefined && hi !== undefined && lo > hi) [lo, hi] = [hi, lo];
    if (lo !== undefined && hi !== undefined && random() < 0.2) hi = lo + BigInt(Math.floor(random() * 3));  // narrow
    const exclusiveMin = !integer && random() < 0.5, exclusiveMax = !integer && random() < 0.5;
    if (lo !== undefined && hi !== undefined && (lo === hi && (exclusiveMin || exclusiveMax))) continue;  // empty: refused earlier
    out.push({ integer, min: lo === undefined ? undefined : Number(lo), max: hi === undefined ? undefined : Number(hi), exclusiveMin, exclusiveMax });
  }
  return out;
}

const FRACTIONS = ['', '.0', '.00', '.5', '.05', '.000001', '.999', '.10'];

/** Texts to try: integers (and, for numbers, decimals) around each bound and 0, and malformed ones. */
function candidates(r: NumericRange): string[] {
  const centres = [0n, ...[r.min, r.max].filter((b) => b !== undefined).map((b) => BigInt(b!))];
  const out = new Set<string>(['-0', '00', '01', '-01', '1e2', '1E0', '+1', '-', '.5', '1.', '0.5e1', '--1']);
  for (const c of centres) {
    for (let d = -12n; d <= 12n; d++) {
      const v = c + d;
      for (const f of r.integer ? ['', '.0'] : FRACTIONS) {
        out.add(`${v}${f}`);
        if (v === 0n) out.add(`-0${f}`);
        if (v < 0n && f !== '') out.add(`-${-v - 1n}${f}`);  // between v and v + 1
      }
    }
  }
  return [...out];
}

/** a - b as a sign, for a decimal text a and an integer b (exact: no floating point). */
function compare(text: string, b: bigint): number {
  const m = /^(-?)(\d+)(?:\.(\d+))?$/.exec(text)!;
  const scale = 10n ** BigInt(m[3]?.length ?? 0);
  const value = (BigInt(m[2]!) * scale + BigInt(m[3] ?? '0')) * (m[1] === '-' ? -1n : 1n);
  const bound = b * scale;
  return value < bound ? -1 : value > bound ? 1 : 0;
}

/** Whether a text must be accepted: a JSON number in our form whose value is in the range. */
function expected(r: NumericRange, text: string): boolean {
  const form = r.integer ? /^-?(0|[1-9]\d*)$/ : /^-?(0|[1-9]\d*)(\.\d+)?$/;
  if (!form.test(text)) return false;
  JSON.parse(text);  // every text of this form is JSON
  if (/^-0(\.0*)?$/.test(text)) return false;  // negative zero is never written
  if (r.min !== undefined) {
    const c = compare(text, BigInt(r.min));
    if (c < 0 || (c === 0 && r.exclusiveMin === true)) return false;
  }
  if (r.max !== undefined) {
    const c = compare(text, BigInt(r.max));
    if (c > 0 || (c === 0 && r.exclusiveMax === true)) return false;
  }
  return true;
}

/** A vocabulary of one token per ASCII character and a stop token: texts are accepted character by character. */
async function asciiEngine(): Promise<{ accepts(key: string, grammar: string, text: string): Promise<boolean> }> {
  const bytes = Uint8Array.from({ length: 128 }, (_, i) => i);
  const offsets = Uint32Array.from({ length: 130 }, (_, i) => Math.min(i, 128));
  const stop = 128;
  const native = await NativeGrammars.create(bytes, offsets, [stop], 0);
  return {
    async accepts(key, grammar, text) {
      const compiled = await native.grammar(key, async () => grammar, 10_000, 'p');
      if (compiled === undefined) throw new Error(`the native reader refused:\n${grammar}`);
      const c = native.constraint(compiled);
      try {
        return [...text].every((ch) => c.accept(ch.charCodeAt(0))) && c.accept(stop);
      } finally {
        c.dispose();
      }
    },
  };
}

const describe_ = ['integer', 'number'] as const;

describe('exact numeric grammars (issue 27)', () => {
  for (const kind of describe_) {
    it.runIf(nativeAvailable())(`admits exactly the ${kind}s of random ranges (native engine)`, { timeout: 120_000 }, async () => {
      const engine = await asciiEngine();
      const ranges = [
        ...randomRanges(kind === 'integer', 120, kind === 'integer' ? 11 : 12),
        // The cases and the edges.
        { integer: kind === 'integer', min: 5 }, { integer: kind === 'integer', min: 18, max: 120 }, { integer: kind === 'integer', min: 0, max: 1 },
        { integer: kind === 'integer', max: -11 }, { integer: kind === 'integer', max: -10 }, { integer: kind === 'integer', min: 12000, max: 12999 },
        { integer: kind === 'integer', min: -Number.MAX_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER }, { integer: kind === 'integer', min: 0, exclusiveMin: true },
        { integer: kind === 'integer', min: -1, max: 1, exclusiveMin: true, exclusiveMax: true }, { integer: kind === 'integer', min: 0, max: 0 },
        { integer: kind === 'integer', min: -1, max: 0, exclusiveMax: true }, { integer: kind === 'integer', min: 0, max: 1, exclusiveMin: true },
      ];
      const wrong: string[] = [];
      let checked = 0;
      for (const r of ranges) {
        const grammar = numericRangeGrammar(r);
        for (const text of candidates(r)) {
          const got = await engine.accepts(JSON.stringify(r), grammar, text);
          checked++;
          if (got !== expected(r, text)) wrong.push(`${JSON.stringify(r)} ${text}: ${got}`);
        }
      }
      expect(wrong.slice(0, 10)).toEqual([]);
      expect(checked).toBeGreaterThan(10_000);
    });
  }

  it('writes grammar text that xgrammar reads and follows the same way (the fallback)', { timeout: 120_000 }, async () => {
    const xg = xgrammar();
    const wrong: string[] = [];
    for (const r of [...randomRanges(true, 8, 21), ...randomRanges(false, 8, 22), { integer: false, max: 1 }, { integer: false, min: 0, exclusiveMin: true }]) {
      const grammar = await xg.Grammar.fromEBNF(numericRangeGrammar(r));
      try {
        for (const text of candidates(r)) {
          if (await xg.Testings.isGrammarAcceptString(grammar, text) !== expected(r, text)) wrong.push(`${JSON.stringify(r)} ${text}`);
        }
      } finally {
        grammar.dispose();
      }
    }
    expect(wrong.slice(0, 10)).toEqual([]);
  });

  it('refuses grammar text that holds a placeholder anywhere but as its own literal, and never reuses a rule name', () => {
    const sentinels = new Map<string, NumericRange>([['123456789012345', { integer: true, min: 1 }]]);
    expect(() => withNumericRules('root ::= (("[123456789012345"))', sentinels)).toThrow(NumericGrammarError);
    const text = withNumericRules('root ::= (("123456789012345") | sluice_num_0)\nsluice_num_0 ::= "x"', sentinels);
    expect(text).toMatch(/^root ::= \(\(sluice_numx_0\) \| sluice_num_0\)$/m);
    expect(text).toMatch(/^sluice_num_0 ::= "x"$/m);
    expect(text).not.toMatch(/123456789012345/);
  });

  it('keeps wide ranges small: rules per bound digit, shared "k digits" rules', () => {
    const grammar = numericRangeGrammar({ integer: true, min: -Number.MAX_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER });
    expect(grammar.split('\n').length).toBeLessThan(60);
    expect(grammar.length).toBeLessThan(6000);
  });

  it('takes bounded numbers away from xgrammar: type lists, untyped bounds and nested schemas', () => {
    const plan = numericPlan({
      type: 'object',
      properties: {
        a: { type: ['integer', 'null'], minimum: 5 },
        b: { minimum: 0 },
        c: { type: 'array', items: { type: 'number', exclusiveMaximum: 1 } },
        d: { type: 'string', minimum: 3 },
        e: { type: 'integer' },
      },
      $defs: { n: { type: 'integer', maximum: 9 } },
    })!;
    expect(plan.sentinels.size).toBe(4);
    const props = (plan.schema as { properties: Record<string, { anyOf?: unknown[]; items?: unknown; enum?: unknown; type?: unknown }> }).properties;
    expect(props['a']!.anyOf).toEqual([expect.objectContaining({ enum: [expect.any(Number)] }), { type: 'null' }]);
    expect(props['b']!.anyOf![1]).toEqual({ type: ['string', 'boolean', 'null', 'array', 'object'] });
    expect(props['c']!.items).toEqual({ enum: [expect.any(Number)] });
    expect(props['d']).toEqual({ type: 'string' });
    expect(props['e']).toEqual({ type: 'integer' });
    expect([...plan.sentinels.values()]).toContainEqual({ integer: false, max: 1, exclusiveMin: false, exclusiveMax: true });
    expect(numericPlan({ type: 'object', properties: { minimum: { type: 'integer' } } })).toBeUndefined();
    const small = numericPlan(checkResponseSchema({ type: 'integer', minimum: 1, maximum: 7 }, { strict: false, param: 'p' }).schema)!;
    expect(small.schema).toEqual({ enum: [expect.any(Number)] });
    expect([...small.sentinels.values()]).toEqual([{ integer: true, min: 1, max: 7, exclusiveMin: false, exclusiveMax: false }]);
    // Bounds beside an enum of other values, or anyOf, stay as they are.
    expect(numericPlan({ type: 'integer', minimum: 1, maximum: 7, enum: [1, 3] })).toBeUndefined();
  });

  it.runIf(nativeAvailable())('makes a checked schema\'s grammar exact end to end (issue cases)', { timeout: 60_000 }, async () => {
    const engine = await asciiEngine();
    const xg = xgrammar();
    const cases: [object, string[], string[]][] = [
      [{ type: 'integer', minimum: 5 }, ['5', '9', '10', '123456'], ['1', '4', '0', '-5']],
      [{ type: 'number', minimum: 0, maximum: 1 }, ['0', '0.5', '1', '1.0', '1.00'], ['1.5', '1.01', '-0.5', '2']],
      [{ type: 'integer', minimum: 18, maximum: 120 }, ['18', '99', '120'], ['121', '129', '17']],
      [{ type: ['integer', 'null'], minimum: 1, maximum: 3 }, ['1', '3', 'null'], ['0', '4']],
      [{ type: 'number', exclusiveMinimum: 0 }, ['0.5', '0.001', '7'], ['0', '0.0', '-0.5']],
      [{ type: 'integer', exclusiveMinimum: 4, exclusiveMaximum: 7 }, ['5', '6'], ['4', '7']],
      [{ type: 'object', properties: { n: { type: 'integer', maximum: -11 } }, required: ['n'], additionalProperties: false }, ['{"n":-11}', '{"n": -500}'], ['{"n":-10}', '{"n":0}']],
      [{ $defs: { p: { type: 'integer', minimum: 10, maximum: 300 } }, type: 'array', items: { $ref: '#/$defs/p' } }, ['[10]', '[300, 11]'], ['[9]', '[301]', '[10, 0]']],
      [{ type: 'object', additionalProperties: { type: 'number', maximum: 0 } }, ['{"a":0}', '{"a":-2.5}', '{}'], ['{"a":0.5}', '{"a":1}']],
      [{ minimum: 3, maximum: 7 }, ['3', '7.0', '"x"', 'null', '[1]'], ['2', '7.5', '-0']],
      [{ type: ['integer', 'array'], maximum: 2, items: { $ref: '#/$defs/p' }, $defs: { p: { type: 'number', exclusiveMinimum: 0, maximum: 1 } } },
        ['2', '-7', '[0.5, 1]', '[]'], ['3', '[0]', '[1.5]']],
    ];
    const wrong: string[] = [];
    for (const [schema, yes, no] of cases) {
      const source = JSON.stringify(checkResponseSchema(schema, { strict: false, param: 'p' }).schema);
      const text = await jsonSchemaGrammar(xg, source, 16);
      for (const v of [...yes, ...no]) {
        if (await engine.accepts(source, text, v) !== yes.includes(v)) wrong.push(`${source} ${v}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it('holds tool calls\' argument schemas to the same exact numbers (structural tags on xgrammar)', { timeout: 60_000 }, async () => {
    const xg = xgrammar();
    const tools = [
      { name: 'book', strict: true, parameters: { type: 'object', properties: { days: { type: 'integer', minimum: 1, maximum: 7 }, share: { type: 'number', minimum: 0, maximum: 1 } }, required: ['days', 'share'], additionalProperties: false } },
      { name: 'wait', strict: true, parameters: { type: 'object', properties: { s: { type: 'integer', minimum: 5 } }, required: ['s'], additionalProperties: false } },
    ];
    const format = toolGrammar({ tools, mode: 'required', parallel: true, format: 'hermes', param: 'tools' }) as { tag: object };
    const source = await exactStructuralTag(xg, JSON.stringify(format.tag), 16);
    expect(source).not.toMatch(/"json_schema"/);
    const grammar = await xg.Grammar.fromStructuralTag(source);
    const call = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;
    const wrong: string[] = [];
    try {
      for (const [text, ok] of [
        [call('book', '{"days": 7, "share": 1.0}'), true], [call('book', '{"days": 8, "share": 1}'), false], [call('book', '{"days": 3, "share": 1.5}'), false],
        [call('wait', '{"s": 5}'), true], [call('wait', '{"s": 4}'), false], [`${call('wait', '{"s": 12}')}\n${call('book', '{"days": 1, "share": 0.25}')}`, true],
      ] as const) {
        if (await xg.Testings.isGrammarAcceptString(grammar, text) !== ok) wrong.push(text);
      }
    } finally {
      grammar.dispose();
    }
    expect(wrong).toEqual([]);
  });
});
