// The harmony template (models/chat-templates.ts HARMONY_TEMPLATE, gpt-oss's structure) rendered
// through ChatTemplate: the system message (date, reasoning level, channels), the developer
// message (instructions, tools as a TypeScript namespace), tool calls and results, which reasoning
// survives, one call per turn, the reasoning_effort the plan gives, and how such a template is told
// apart from the others.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

import {
  buildTokenizerConfig, CHATML_TEMPLATE, HARMONY_SPECIAL_TOKENS, HARMONY_TEMPLATE, LLAMA3_TEMPLATE, QWEN3_TEMPLATE, specialIds,
} from '../models/chat-templates.js';
import { ChatTemplate, type ChatMessage } from '../src/text/chat-template.js';
import { isHarmonyTemplate } from '../src/text/harmony.js';
import { toolCallFormat } from '../src/text/tool-calls.js';
import { plan, templateEffort } from '../src/serving/assistant-turn.js';
import type { ServedModel } from '../src/serving/model-registry.js';
import type { ToolsRequest } from '../src/serving/generation-request.js';

const template = new ChatTemplate(HARMONY_TEMPLATE);

const system = (effort: string, tools = false) =>
  '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n' +
  'Knowledge cutoff: 2024-06\nCurrent date: 2025-06-15\n\n' +
  `Reasoning: ${effort}\n\n` +
  '# Valid channels: analysis, commentary, final. Channel must be included for every message.' +
  (tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : '') +
  '<|end|>';

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', description: 'The city' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'], default: 'celsius' },
        days: { type: 'integer', default: 1 },
        hours: { type: 'array', items: { type: 'integer' } },
        extra: { type: 'object' },
        note: { type: ['string', 'null'] },
      },
      required: ['city'],
    },
  },
};
const now = { type: 'function', function: { name: 'now' } };
const call = (id: string, name: string, args: Record<string, unknown>) => ({ id, type: 'function' as const, function: { name, arguments: args } });

beforeAll(() => {
  vi.useFakeTimers();
  vi.setSystemTime(new Date('2025-06-15T12:00:00Z'));
});
afterAll(() => vi.useRealTimers());

describe('the harmony template', () => {
  it('renders the system message, then the generation prompt', () => {
    expect(template.render([{ role: 'user', content: 'Hi' }]))
      .toBe(`${system('medium')}<|start|>user<|message|>Hi<|end|><|start|>assistant`);
  });

  it('names the reasoning level the request asks for', () => {
    for (const effort of ['low', 'medium', 'high']) {
      expect(template.render([{ role: 'user', content: 'Hi' }], { reasoningEffort: effort }))
        .toBe(`${system(effort)}<|start|>user<|message|>Hi<|end|><|start|>assistant`);
    }
  });

  it('puts the instructions and the tools in a developer message, the tools as a TypeScript namespace', () => {
    const text = template.render([
      { role: 'developer', content: 'Answer in French.' },
      { role: 'user', content: 'Weather in Oslo?' },
    ], { tools: [weather, now], reasoningEffort: 'high' });
    expect(text).toBe(
      system('high', true) +
      '<|start|>developer<|message|># Instructions\n\nAnswer in French.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n' +
      '// Current weather in a city\ntype get_weather = (_: {\n' +
      '// The city\ncity: string,\n' +
      'unit?: "celsius" | "fahrenheit", // default: celsius,\n' +
      'days?: number, // default: 1,\n' +
      'hours?: number[],\n' +
      'extra?: object,\n' +
      'note?: string | null,\n' +
      '}) => any;\n\n' +
      // A function without a description gets an empty comment, as the published template writes it.
      '// \ntype now = () => any;\n\n' +
      '} // namespace functions<|end|>' +
      '<|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant');
    // Tools without instructions: the developer message holds the tools alone.
    expect(template.render([{ role: 'user', content: 'x' }], { tools: [now] })).toBe(
      system('medium', true) +
      '<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// \ntype now = () => any;\n\n} // namespace functions<|end|>' +
      '<|start|>user<|message|>x<|end|><|start|>assistant');
  });

  it('renders a conversation with tool calls and results, keeping only the reasoning of calls not yet answered', () => {
    const messages: ChatMessage[] = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: '', reasoning_content: 'Need the tool.', tool_calls: [call('c1', 'get_weather', { city: 'Oslo' })] },
      { role: 'tool', content: '{"temp": 3}', tool_call_id: 'c1' },
      { role: 'assistant', content: 'It is 3 °C.', reasoning_content: 'Answer now.' },
      { role: 'user', content: 'And now, in Bergen?' },
      { role: 'assistant', content: '', reasoning_content: 'Two calls.', tool_calls: [call('c2', 'get_weather', { city: 'Bergen' }), call('c3', 'now', {})] },
      { role: 'tool', content: '12:00', tool_call_id: 'c3' },
      { role: 'tool', content: 'rain', tool_call_id: 'c2' },
    ];
    expect(template.render(messages, { tools: [weather, now] })).toBe(
      system('medium', true) +
      '<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n' +
      '// Current weather in a city\ntype get_weather = (_: {\n// The city\ncity: string,\nunit?: "celsius" | "fahrenheit", // default: celsius,\n' +
      'days?: number, // default: 1,\nhours?: number[],\nextra?: object,\nnote?: string | null,\n}) => any;\n\n' +
      '// \ntype now = () => any;\n\n} // namespace functions<|end|>' +
      '<|start|>user<|message|>Weather in Oslo?<|end|>' +
      // Answered by the final message after it: the call's reasoning is dropped, as is the answer's.
      '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>' +
      '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp\\": 3}"<|end|>' +
      '<|start|>assistant<|channel|>final<|message|>It is 3 °C.<|end|>' +
      '<|start|>user<|message|>And now, in Bergen?<|end|>' +
      // Not answered yet: the reasoning stays. Two calls become two turns, each before its result.
      '<|start|>assistant<|channel|>analysis<|message|>Two calls.<|end|>' +
      '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Bergen"}<|call|>' +
      '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"rain"<|end|>' +
      '<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>' +
      '<|start|>functions.now to=assistant<|channel|>commentary<|message|>"12:00"<|end|>' +
      '<|start|>assistant');
  });

  it('renders a call turn\'s text as its analysis, joined to its reasoning when it has both', () => {
    const turn = (content: string, reasoning?: string): ChatMessage[] => [
      { role: 'user', content: 'Time?' },
      { role: 'assistant', content, ...(reasoning !== undefined && { reasoning_content: reasoning }), tool_calls: [call('c1', 'now', {})] },
      { role: 'tool', content: '12:00', tool_call_id: 'c1' },
    ];
    const tail = '<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>' +
      '<|start|>functions.now to=assistant<|channel|>commentary<|message|>"12:00"<|end|><|start|>assistant';
    const head = `${system('medium')}<|start|>user<|message|>Time?<|end|>`;
    expect(template.render(turn('Checking the clock.'))).toBe(`${head}<|start|>assistant<|channel|>analysis<|message|>Checking the clock.<|end|>${tail}`);
    expect(template.render(turn('Checking the clock.', 'The user wants the time.')))
      .toBe(`${head}<|start|>assistant<|channel|>analysis<|message|>The user wants the time.\nChecking the clock.<|end|>${tail}`);
  });

  it('keeps the last turn\'s reasoning and ends it in <|return|> without a generation prompt (training)', () => {
    expect(template.render([{ role: 'user', content: 'Q' }, { role: 'assistant', content: 'A', reasoning_content: 'R' }], { addGenerationPrompt: false }))
      .toBe(`${system('medium')}<|start|>user<|message|>Q<|end|>` +
        '<|start|>assistant<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>A<|return|>');
  });

  it('refuses channel tags inside a turn and a tool result with no call before it', () => {
    expect(() => template.render([{ role: 'user', content: 'Q' }, { role: 'assistant', content: '<|channel|>final<|message|>A' }, { role: 'user', content: 'Q2' }]))
      .toThrow(expect.objectContaining({ code: 'chat_template_error' }));
    expect(() => template.render([{ role: 'user', content: 'Q' }, { role: 'tool', content: 'r' }]))
      .toThrow(expect.objectContaining({ code: 'chat_template_error' }));
  });
});

describe('telling harmony apart', () => {
  it('recognises the harmony template, and only it, as writing harmony and calling tools in it', () => {
    expect(isHarmonyTemplate(HARMONY_TEMPLATE)).toBe(true);
    expect(toolCallFormat(HARMONY_TEMPLATE)).toBe('harmony');
    for (const other of [CHATML_TEMPLATE, LLAMA3_TEMPLATE, QWEN3_TEMPLATE]) expect(isHarmonyTemplate(other)).toBe(false);
    expect(toolCallFormat(QWEN3_TEMPLATE)).toBe('hermes');
    expect(isHarmonyTemplate(undefined)).toBe(false);
  });

  it('gives a harmony tokenizer family the template, bos, pad and gpt-oss\'s eos tokens', () => {
    const specials = HARMONY_SPECIAL_TOKENS.map((content, i) => ({ id: 100 + i, content }));
    // <|startoftext|> 100, <|endoftext|> 101, <|return|> 102, <|call|> 108.
    expect(specialIds('harmony', specials)).toEqual({ bos: 100, eos: [102, 101, 108], pad: 101 });
    expect(buildTokenizerConfig('harmony', specials, 4096)).toMatchObject({
      chat_template: HARMONY_TEMPLATE, bos_token: '<|startoftext|>', eos_token: '<|return|>', pad_token: '<|endoftext|>', model_max_length: 4096,
    });
  });
});

describe('the plan of a harmony model', () => {
  const model = (entry: Record<string, unknown> = {}): ServedModel => ({
    id: 'gpt-oss-test',
    entry,
    engine: { tokenizer: { chatTemplate: HARMONY_TEMPLATE, tokenId: (t: string) => (t === '<|end|>' ? 7 : undefined) }, thinkingTags: () => undefined },
  }) as unknown as ServedModel;
  const tools = (extra: Partial<ToolsRequest> = {}): ToolsRequest => ({
    defs: [{ name: 'now' }], choice: 'auto', parallel: true, param: 'tools', choiceParam: 'tool_choice', ...extra,
  });

  it('maps efforts onto the three levels and reads the output as harmony', () => {
    expect(['none', 'minimal', 'low', 'medium', 'high', 'xhigh'].map((e) => templateEffort(e as never)))
      .toEqual(['low', 'low', 'low', 'medium', 'high', 'high']);
    expect(plan(model(), { chat: true, effort: 'high' })).toEqual({ toolNames: [], reasoningEffort: 'high', harmony: { endId: 7 } });
    // No effort: the catalog's default, else the template's own (medium); no thinking budget.
    expect(plan(model({ default_reasoning_effort: 'low' }), { chat: true })).toMatchObject({ reasoningEffort: 'low' });
    expect(plan(model(), { chat: true })).toEqual({ toolNames: [], harmony: { endId: 7 } });
    expect(plan(model(), { chat: true, effort: 'none', tools: tools() })).toMatchObject({
      reasoningEffort: 'low', toolFormat: 'harmony', toolNames: ['now'],
      tools: [{ type: 'function', function: { name: 'now', parameters: { type: 'object', properties: {} } } }],
    });
  });

  it('refuses what would need a grammar of harmony calls, naming the field', () => {
    expect(() => plan(model(), { chat: true, tools: tools({ choice: 'required' }) }))
      .toThrow(expect.objectContaining({ code: 'tools_unsupported', param: 'tool_choice' }));
    expect(() => plan(model(), { chat: true, tools: tools({ choice: { name: 'now' } }) }))
      .toThrow(expect.objectContaining({ code: 'tools_unsupported', param: 'tool_choice' }));
    expect(() => plan(model(), { chat: true, tools: tools({ defs: [{ name: 'now' }, { name: 'later', strict: true }] }) }))
      .toThrow(expect.objectContaining({ code: 'tools_unsupported', param: 'tools[1].strict' }));
    expect(() => plan(model(), { chat: true, tools: tools(), outputFormat: { type: 'json_schema', schema: {}, schemaParam: 'text.format.schema' } }))
      .toThrow(expect.objectContaining({ code: 'tools_unsupported', param: 'text.format.schema' }));
  });
});
