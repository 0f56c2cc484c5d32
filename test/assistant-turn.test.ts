// Reasoning and tool calls below the HTTP surfaces: the thinking-budget constraint, tool-call
// parsing in both syntaxes, splitting a generation into reasoning / answer / calls, and tool-call
// grammars driven by random walks over their allowed tokens (any walk must parse into calls whose
// arguments validate).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import Ajv2020 from 'ajv/dist/2020.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { split } from '../src/serving/assistant-turn.js';
import type { AssistantPlan } from '../src/serving/generation-request.js';
import { parseToolCalls } from '../src/text/tool-calls.js';
import { StructuredOutputs } from '../src/structured/structured-outputs.js';
import type { TokenConstraint } from '../src/structured/token-constraint.js';
import { ThinkingConstraint } from '../src/structured/thinking.js';
import { toolGrammar, type ToolMode } from '../src/structured/tool-grammar.js';

const WORDS = 4;  // a 128-token vocabulary for the constraint tests
const allowed = (mask: Uint32Array) => [...Array(WORDS * 32).keys()].filter((t) => (mask[t >>> 5]! >>> (t & 31)) & 1);

describe('thinking budget', () => {
  it('opens the block, closes it at the budget, then hands the answer to the inner constraint', async () => {
    const innerMask = new Uint32Array(WORDS);
    innerMask[0] = 0b1000;  // the inner grammar allows token 3 only
    const accepted: number[] = [];
    const inner: TokenConstraint = {
      fillMask: async (out, offset) => { out.set(innerMask, offset); },
      accept: (t) => { accepted.push(t); return t === 3; },
      dispose: () => undefined,
    };
    const c = new ThinkingConstraint({ openId: 100, closeId: 101, budget: 2, opened: false, eosIds: [99] }, WORDS, inner);
    const mask = new Uint32Array(WORDS);
    await c.fillMask(mask, 0);
    expect(allowed(mask)).toEqual([100]);
    expect(c.accept(100)).toBe(true);
    for (const t of [7, 8]) {
      await c.fillMask(mask, 0);
      expect(allowed(mask)).toHaveLength(WORDS * 32 - 1);  // everything but the end of output
      expect(allowed(mask)).not.toContain(99);
      expect(c.accept(t)).toBe(true);
    }
    await c.fillMask(mask, 0);
    expect(allowed(mask)).toEqual([101]);
    expect(c.accept(9)).toBe(false);
    expect(c.failure?.message).toMatch(/thinking budget/);
  });

  it('starts inside the block when the prompt opened it, and an early close ends it', async () => {
    const c = new ThinkingConstraint({ openId: 100, closeId: 101, budget: 50, opened: true, eosIds: [99] }, WORDS);
    const mask = new Uint32Array(WORDS);
    await c.fillMask(mask, 0);
    expect(allowed(mask)).toHaveLength(WORDS * 32 - 1);
    expect(c.accept(5)).toBe(true);
    expect(c.accept(101)).toBe(true);
    await c.fillMask(mask, 0);
    expect(allowed(mask)).toHaveLength(WORDS * 32);  // the answer: unconstrained, and it may end
    expect(c.accept(100)).toBe(true);
    expect(c.accept(99)).toBe(true);
  });
});

describe('tool-call parsing', () => {
  const offered = new Set(['get_weather', 'now']);
  it('reads hermes blocks, keeps the text around them, and leaves unknown or broken calls as text', () => {
    expect(parseToolCalls('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n' +
      '<tool_call>\n{"name": "now", "arguments": "{}"}\n</tool_call>', 'hermes', offered)).toEqual({
      content: 'Let me check.',
      calls: [{ name: 'get_weather', arguments: '{"city":"Oslo"}' }, { name: 'now', arguments: '{}' }],
    });
    const unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>';
    expect(parseToolCalls(unknown, 'hermes', offered)).toEqual({ content: unknown, calls: [] });
    const broken = '<tool_call>\n{"name": "now", "arguments": {\n</tool_call>';
    expect(parseToolCalls(broken, 'hermes', offered)).toEqual({ content: broken, calls: [] });
  });

  it('reads Llama 3.1 JSON calls, one or several, with or without the python tag', () => {
    expect(parseToolCalls('{"name": "get_weather", "parameters": {"city": "Lima"}}', 'llama3_json', offered).calls)
      .toEqual([{ name: 'get_weather', arguments: '{"city":"Lima"}' }]);
    expect(parseToolCalls('<|python_tag|>{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Rome"}}', 'llama3_json', offered).calls)
      .toEqual([{ name: 'now', arguments: '{}' }, { name: 'get_weather', arguments: '{"city":"Rome"}' }]);
    expect(parseToolCalls('The weather is {"sunny"}', 'llama3_json', offered)).toEqual({ content: 'The weather is {"sunny"}', calls: [] });
  });

  it('reads a call\'s JSON to its end, so a string holding the closing tag or a separator stays in the arguments (issue 27)', () => {
    const note = 'ends with </tool_call> and <tool_call> inside';
    const text = `<tool_call>\n{"name": "get_weather", "arguments": {"city": ${JSON.stringify(note)}}}\n</tool_call>\n`
      + '<tool_call>\n{"name": "now", "arguments": {"q": "\\"}</tool_call>\\""}}\n</tool_call>';
    expect(parseToolCalls(text, 'hermes', offered)).toEqual({
      content: '',
      calls: [{ name: 'get_weather', arguments: JSON.stringify({ city: note }) }, { name: 'now', arguments: JSON.stringify({ q: '"}</tool_call>"' }) }],
    });
    // Text after a call's JSON but before its closing tag: not a call.
    const trailing = '<tool_call>\n{"name": "now", "arguments": {}} and more\n</tool_call>';
    expect(parseToolCalls(trailing, 'hermes', offered)).toEqual({ content: trailing, calls: [] });
    expect(parseToolCalls('{"name": "get_weather", "parameters": {"city": "a; {\\"b\\": 1}"}}; {"name": "now", "parameters": {}}', 'llama3_json', offered).calls)
      .toEqual([{ name: 'get_weather', arguments: JSON.stringify({ city: 'a; {"b": 1}' }) }, { name: 'now', arguments: '{}' }]);
  });
});

describe('splitting a generation', () => {
  const tags = { open: '<think>', close: '</think>', openId: 10, closeId: 11 };
  const plan: AssistantPlan = { tags, enableThinking: true, thinking: { budget: 8 }, toolFormat: 'hermes', toolNames: ['now'] };
  it('separates reasoning, answer and calls, and counts reasoning tokens through the close tag', () => {
    const turn = split(plan, [1, 2], {
      text: '<think>\nhmm\n</think>\n\nSure.<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
      tokenIds: [10, 20, 21, 11, 30, 31, 32],
    });
    expect(turn).toEqual({ reasoning: 'hmm', reasoningTokens: 4, content: 'Sure.', toolCalls: [{ name: 'now', arguments: '{}' }] });
  });

  it('a block cut by the token limit is all reasoning; a prompt that opened the block needs no open tag', () => {
    expect(split(plan, [1, 2], { text: '<think>\nstill going', tokenIds: [10, 20, 21] }))
      .toMatchObject({ reasoning: 'still going', reasoningTokens: 3, content: '' });
    expect(split(plan, [1, 10], { text: 'inside</think>\n\nanswer', tokenIds: [20, 11, 30] }))
      .toMatchObject({ reasoning: 'inside', reasoningTokens: 2, content: 'answer' });
    expect(split({ ...plan, enableThinking: false }, [1, 2], { text: 'plain', tokenIds: [30] }))
      .toMatchObject({ reasoning: undefined, reasoningTokens: 0, content: 'plain' });
  });
});

describe('tool-call grammars', () => {
  let root: string;
  let tokenizer: SluiceTokenizer;
  let structured: StructuredOutputs;
  let vocabSize: number;
  const blank = new Set<number>();
  beforeAll(async () => {
    root = mkdtempSync(join(os.tmpdir(), 'sluice-tools-'));
    await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 5, weights: false });
    tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
    vocabSize = tokenizer.vocab().size;
    for (let t = 0; t < vocabSize; t++) if (tokenizer.tokenText(t).trim() === '') blank.add(t);
    structured = new StructuredOutputs(tokenizer, vocabSize);
  });
  afterAll(async () => {
    await structured?.dispose();
    rmSync(root, { recursive: true, force: true });
  });

  const weather = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false };
  const tools = [{ name: 'get_weather', parameters: weather, strict: true }, { name: 'now', parameters: { type: 'object', properties: {}, additionalProperties: false } }];

  /** Walks allowed tokens (seeded) until the end of the output; returns the text. */
  async function walk(mode: ToolMode, parallel: boolean, seed: number): Promise<string | undefined> {
    const format = toolGrammar({ tools, mode, parallel, format: 'hermes', param: 'tools' })!;
    const c = await structured.constraint(format);
    const mask = new Uint32Array(structured.maskWords);
    const ids: number[] = [];
    let s = seed;
    const random = () => (s = (s * 1103515245 + 12345) & 0x7fffffff) / 0x80000000;
    try {
      for (let step = 0; step < 120; step++) {
        await c.fillMask(mask, 0);
        const ok: number[] = [];
        for (let t = 0; t < vocabSize; t++) if ((mask[t >>> 5]! >>> (t & 31)) & 1) ok.push(t);
        // Ends and non-blank tokens first, so walks finish in a few dozen steps.
        const eos = ok.filter((t) => tokenizer.eosTokenIds.has(t));
        const solid = ok.filter((t) => !blank.has(t));
        const pool = solid.length > 0 && random() < 0.8 ? solid : ok;
        const t = eos.length > 0 && random() < 0.5 ? eos[0]! : pool[Math.floor(random() * pool.length)]!;
        expect(c.accept(t)).toBe(true);
        if (tokenizer.eosTokenIds.has(t)) return tokenizer.decode(ids);
        ids.push(t);
      }
      return undefined;
    } finally {
      c.dispose();
    }
  }

  it('forced calls always parse, name an offered function and carry arguments that validate', { timeout: 60_000 }, async () => {
    const ajv = new Ajv2020.default({ strict: false });
    const schemas = new Map(tools.map((t) => [t.name, t.parameters]));
    let finished = 0;
    for (const [mode, parallel] of [['required', false], ['required', true], [{ name: 'get_weather' }, false]] as [ToolMode, boolean][]) {
      for (let seed = 1; seed <= 6; seed++) {
        const text = await walk(mode, parallel, seed);
        if (text === undefined) continue;
        finished++;
        const { content, calls } = parseToolCalls(text, 'hermes', new Set(schemas.keys()));
        expect(content, text).toBe('');
        expect(calls.length).toBeGreaterThanOrEqual(1);
        if (!parallel) expect(calls).toHaveLength(1);
        if (typeof mode === 'object') expect(calls.every((c) => c.name === mode.name)).toBe(true);
        for (const call of calls) expect(ajv.validate(schemas.get(call.name)!, JSON.parse(call.arguments)), `${text}: ${ajv.errorsText()}`).toBe(true);
      }
    }
    expect(finished).toBeGreaterThan(12);
  });

  it('auto with a strict function allows text, and any call it opens validates', { timeout: 60_000 }, async () => {
    for (let seed = 1; seed <= 8; seed++) {
      const text = await walk('auto', true, seed);
      if (text === undefined) continue;
      for (const block of text.matchAll(/<tool_call>([\s\S]*?)<\/tool_call>/g)) {
        const call = JSON.parse(block[1]!) as { name: string; arguments: unknown };
        expect(['get_weather', 'now']).toContain(call.name);
      }
    }
  });
});
