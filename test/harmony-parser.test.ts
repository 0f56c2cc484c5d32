// Reading gpt-oss output (harmony messages) into reasoning, answer and tool calls
// (src/text/harmony-parser.ts): whole, and streamed in every split of the text, which must read the
// same; tool calls with JSON arguments in both header layouts; malformed output kept as text;
// reasoning tokens counted per message; split() on a harmony plan; and the tokenizer keeping the
// markers in decoded text so there is something to read.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { HARMONY_TEMPLATE } from '../models/chat-templates.js';
import { HarmonyParser, harmonyReasoningTokens, parseHarmony, type HarmonyEvent } from '../src/text/harmony-parser.js';
import { parseToolCalls } from '../src/text/tool-calls.js';
import { IncrementalDetokenizer } from '../src/text/detokenizer.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { PromptEncoder } from '../src/text/prompt-encoder.js';
import { split } from '../src/serving/assistant-turn.js';
import type { AssistantPlan } from '../src/serving/generation-request.js';

const offered = new Set(['get_weather', 'now']);

/** What a stream of events adds up to (text of each kind, calls in order). */
function fold(events: HarmonyEvent[]) {
  const out = { reasoning: '', content: '', calls: [] as { name: string; arguments: string }[] };
  for (const e of events) {
    if (e.type === 'tool_call') out.calls.push({ name: e.name, arguments: e.arguments });
    else out[e.type] += e.text;
  }
  return out;
}

function streamed(pieces: string[]) {
  const parser = new HarmonyParser(offered);
  const events = pieces.flatMap((p) => parser.push(p));
  return { ...fold([...events, ...parser.end()]), reasoningOpen: parser.reasoningOpen, endedKinds: parser.endedKinds, tailKind: parser.tailKind };
}

const ANSWER = '<|channel|>analysis<|message|>The user greets; reply <politely>.<|end|>' +
  '<|start|>assistant<|channel|>final<|message|>Hello! 1 < 2 and <|x|> is not a marker.';
const CALL = '<|channel|>analysis<|message|>Need the weather.<|end|>' +
  '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>' +
  '{"city": "Tromsø", "days": [1, 2], "opts": {"unit": "c", "note": "say \\"hi\\""}}';

const CASES: Record<string, string> = {
  ANSWER,
  CALL,
  recipientFirst: ' to=functions.now<|channel|>commentary json<|message|>{}',
  preamble: '<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking now.<|end|>' +
    '<|start|>assistant to=functions.now<|channel|>commentary <|constrain|>json<|message|>{ }',
  noMessageMarker: '<|channel|>final The answer is 4.<|end|><|start|>assistant<|channel|>final<|message|>Four.',
  unknownChannel: '<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>summary<|message|>kept<|end|><|start|>assistant<|channel|>final<|message|>b',
  plain: 'No harmony here, just <b>text</b>.',
  cutInAnalysis: '<|channel|>analysis<|message|>Still thinking about <|',
  cutInHeader: '<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin',
};

describe('reading harmony output', () => {
  it('splits analysis and final into reasoning and content', () => {
    expect(parseHarmony(ANSWER, offered)).toEqual({
      reasoning: 'The user greets; reply <politely>.', content: 'Hello! 1 < 2 and <|x|> is not a marker.', calls: [],
      reasoningOpen: false, endedKinds: ['reasoning'], tailKind: 'content',
    });
  });

  it('reads a commentary message to an offered function as a call with its JSON arguments, in either header layout', () => {
    expect(parseHarmony(CALL, offered)).toMatchObject({
      reasoning: 'Need the weather.', content: '',
      calls: [{ name: 'get_weather', arguments: JSON.stringify({ city: 'Tromsø', days: [1, 2], opts: { unit: 'c', note: 'say "hi"' } }) }],
      tailKind: 'tool_call',
    });
    expect(parseHarmony(CASES['recipientFirst']!, offered)).toMatchObject({ reasoning: undefined, content: '', calls: [{ name: 'now', arguments: '{}' }] });
    // A preamble on the commentary channel is content; an empty body is no arguments.
    expect(parseHarmony(CASES['preamble']!, offered)).toMatchObject({ reasoning: 'Plan.', content: 'Checking now.', calls: [{ name: 'now', arguments: '{}' }] });
    // The same through the tool-call syntax's own entry point.
    expect(parseToolCalls(CALL, 'harmony', offered)).toEqual({ content: '', calls: [{ name: 'get_weather', arguments: expect.any(String) }] });
  });

  it('keeps a call that is not one as text where its channel goes: unoffered, other recipients, bad JSON', () => {
    const unoffered = '<|channel|>commentary to=functions.delete_all <|constrain|>json<|message|>{"now": true}';
    expect(parseHarmony(unoffered, offered)).toMatchObject({ content: unoffered, calls: [] });
    const browser = '<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query": "x"}';
    expect(parseHarmony(browser, offered)).toMatchObject({
      reasoning: 'Search.\n<|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query": "x"}', content: '', calls: [],
    });
    const broken = '<|channel|>commentary to=functions.now <|constrain|>json<|message|>{"a": ';
    expect(parseHarmony(broken, offered)).toMatchObject({ content: broken, calls: [] });
    expect(parseHarmony('<|channel|>commentary to=functions.now json<|message|>[1]', offered)).toMatchObject({ calls: [] });
    // Nothing is a call when no function was offered.
    expect(parseHarmony(CASES['recipientFirst']!, new Set())).toMatchObject({ content: CASES['recipientFirst'], calls: [] });
  });

  it('loses no text of malformed output: no <|message|>, unknown channels, no harmony at all, overlong headers', () => {
    expect(parseHarmony(CASES['noMessageMarker']!, offered)).toMatchObject({ reasoning: undefined, content: '<|channel|>final The answer is 4.\nFour.' });
    expect(parseHarmony(CASES['unknownChannel']!, offered)).toMatchObject({ reasoning: 'a', content: 'kept\nb', endedKinds: ['reasoning', 'content'] });
    expect(parseHarmony(CASES['plain']!, offered)).toMatchObject({ reasoning: undefined, content: CASES['plain'], calls: [] });
    const long = `<|start|>assistant${'x'.repeat(300)}<|message|>y`;
    expect(parseHarmony(`<|channel|>final<|message|>a<|end|>${long}`, offered)).toMatchObject({ content: `a\n${long}` });
    // A bare role header is harmony without a channel: its text is content.
    expect(parseHarmony('<|channel|>final<|message|>a<|end|><|start|>assistant<|message|>b', offered)).toMatchObject({ content: 'a\nb' });
  });

  it('knows when the output was cut inside its reasoning, and drops a header cut short', () => {
    expect(parseHarmony(CASES['cutInAnalysis']!, offered)).toMatchObject({ reasoning: 'Still thinking about <|', content: '', reasoningOpen: true });
    expect(parseHarmony(CASES['cutInHeader']!, offered)).toMatchObject({ reasoning: 'Done.', content: '', reasoningOpen: false });
  });

  it('reads the same streamed in any two or three pieces as whole', () => {
    for (const [name, text] of Object.entries(CASES)) {
      const whole = parseHarmony(text, offered);
      const expected = { reasoning: whole.reasoning ?? '', content: whole.content, calls: whole.calls, reasoningOpen: whole.reasoningOpen,
        endedKinds: whole.endedKinds, tailKind: whole.tailKind };
      for (let i = 0; i <= text.length; i++) {
        expect(streamed([text.slice(0, i), text.slice(i)]), `${name} split at ${i}`).toEqual(expected);
        for (let j = i + 1; j < text.length; j += 7) {
          expect(streamed([text.slice(0, i), text.slice(i, j), text.slice(j)]), `${name} split at ${i}, ${j}`).toEqual(expected);
        }
      }
      expect(streamed([...text]), `${name} a character at a time`).toEqual(expected);
    }
  });

  it('streams reasoning and content as they come, holding back only what may be a marker', () => {
    const parser = new HarmonyParser(offered);
    expect(parser.push('<|channel|>analysis<|mes')).toEqual([]);
    expect(parser.push('sage|>Thinking')).toEqual([{ type: 'reasoning', text: 'Thinking' }]);
    expect(parser.push(' more<|e')).toEqual([{ type: 'reasoning', text: ' more' }]);
    expect(parser.push('nd|><|start|>assistant<|channel|>final<|message|>Hi')).toEqual([{ type: 'content', text: 'Hi' }]);
    expect(parser.push(' <')).toEqual([{ type: 'content', text: ' ' }]);
    expect(parser.push('3')).toEqual([{ type: 'content', text: '<3' }]);
    expect(parser.end()).toEqual([]);
    // A call is one event, when its message ends.
    const calls = new HarmonyParser(offered);
    expect(calls.push('<|channel|>commentary to=functions.now <|constrain|>json<|message|>{"a"')).toEqual([]);
    expect(calls.push(': 1}')).toEqual([]);
    expect(calls.end()).toEqual([{ type: 'tool_call', name: 'now', arguments: '{"a":1}' }]);
  });
});

describe('reasoning tokens and split()', () => {
  // Token ids: 1 <|channel|>, 2 analysis, 3 <|message|>, 7 <|end|>, 8 <|start|>, 9 assistant, 10 final, 11.. words.
  const tokenIds = [1, 2, 3, 11, 12, 7, 8, 9, 1, 10, 3, 13];
  const text = '<|channel|>analysis<|message|>Hmm ok<|end|><|start|>assistant<|channel|>final<|message|>Yes';

  it('counts the tokens of the analysis messages, headers and <|end|> included', () => {
    expect(harmonyReasoningTokens(parseHarmony(text, offered), tokenIds, 7)).toBe(6);
    expect(harmonyReasoningTokens(parseHarmony('<|channel|>analysis<|message|>Hmm', offered), [1, 2, 3, 11], 7)).toBe(4);
    expect(harmonyReasoningTokens(parseHarmony('Plain', offered), [11], 7)).toBe(0);
  });

  it('splits a generation on a harmony plan into reasoning, answer and calls', () => {
    const plan: AssistantPlan = { toolNames: ['now'], toolFormat: 'harmony', harmony: { endId: 7 } };
    expect(split(plan, [8, 9], { text, tokenIds })).toEqual({ reasoning: 'Hmm ok', reasoningTokens: 6, content: 'Yes', toolCalls: [] });
    expect(split(plan, [8, 9], { text: '<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}', tokenIds: [1, 2, 3, 11, 7, 8, 9] }))
      .toEqual({ reasoning: 'Hm', reasoningTokens: 5, content: '', toolCalls: [{ name: 'now', arguments: '{}' }] });
    expect(split(plan, [8, 9], { text: '<|channel|>analysis<|message|>Hm', tokenIds: [1, 2, 3, 11] }))
      .toEqual({ reasoning: 'Hm', reasoningTokens: 4, content: '', toolCalls: [], reasoningOpen: true });
    // Without tools offered, a call is text.
    const noTools: AssistantPlan = { toolNames: [], harmony: { endId: 7 } };
    expect(split(noTools, [8, 9], { text: ' to=functions.now<|channel|>commentary json<|message|>{}', tokenIds: [11] }))
      .toMatchObject({ content: ' to=functions.now<|channel|>commentary json<|message|>{}', toolCalls: [] });
  });
});

describe('a harmony tokenizer', () => {
  let dir: string;
  const MARKERS = ['<|return|>', '<|constrain|>', '<|channel|>', '<|start|>', '<|end|>', '<|message|>', '<|call|>'];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-harmony-'));
    await makeModel({ preset: 'tiny', out: dir, weights: false });
    // The tiny ChatML tokenizer with harmony's special tokens added, its template and eos ids.
    const json = JSON.parse(await readFile(join(dir, 'tokenizer.json'), 'utf8'));
    const first = Math.max(...json.added_tokens.map((t: { id: number }) => t.id)) + 1;
    for (const [i, content] of MARKERS.entries()) {
      json.added_tokens.push({ id: first + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
    }
    await writeFile(join(dir, 'tokenizer.json'), JSON.stringify(json));
    const config = JSON.parse(await readFile(join(dir, 'tokenizer_config.json'), 'utf8'));
    await writeFile(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...config, chat_template: HARMONY_TEMPLATE, eos_token: '<|return|>' }));
    await writeFile(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [first, first + 6] }));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('keeps the structural markers in decoded text, not its eos tokens or other special tokens', async () => {
    const tokenizer = await SluiceTokenizer.load(dir);
    const id = (t: string) => tokenizer.tokenId(t)!;
    expect(tokenizer.structuralTokenIds).toEqual(new Set(['<|constrain|>', '<|channel|>', '<|start|>', '<|end|>', '<|message|>'].map(id)));
    // The prompt: every marker one token.
    const prompt = new PromptEncoder(tokenizer, dir).encode({ messages: [{ role: 'user', content: 'Hi' }], reasoningEffort: 'low' });
    expect(tokenizer.decode(prompt, { skipSpecialTokens: false })).toContain('Reasoning: low');
    const assistant = tokenizer.encode('assistant', { addBos: false });
    expect(prompt.slice(-1 - assistant.length)).toEqual([id('<|start|>'), ...assistant]);
    // An output: markers stay, other special tokens (and eos) go, streamed or whole alike.
    const output = [
      id('<|channel|>'), ...tokenizer.encode('analysis', { addBos: false }), id('<|message|>'), ...tokenizer.encode('Think.', { addBos: false }),
      id('<|im_start|>'), id('<|end|>'), id('<|start|>'), ...tokenizer.encode('assistant', { addBos: false }),
      id('<|channel|>'), ...tokenizer.encode('final', { addBos: false }), id('<|message|>'), ...tokenizer.encode('Hi there', { addBos: false }), id('<|return|>'),
    ];
    const text = '<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi there';
    expect(tokenizer.decode(output)).toBe(text);
    const detokenizer = new IncrementalDetokenizer(tokenizer, prompt);
    expect(output.map((t) => detokenizer.push(t)).join('') + detokenizer.flush()).toBe(text);
    expect(parseHarmony(text, new Set())).toMatchObject({ reasoning: 'Think.', content: 'Hi there' });
  });
});
