// The fixed conversations and model outputs the published-template check runs (our own text),
// and what each model family's template must show for them. See check-published-templates.ts.

import type { ChatMessage, ChatToolCall } from '../../src/text/chat-template.js';
import type { ToolCallFormat } from '../../src/text/tool-calls.js';

export interface Family {
  label: string;
  /** File names looked for in --dir (llama.cpp's models/templates names them so). */
  file: string;
  format: ToolCallFormat;
  /** Qwen3 style: enable_thinking on and off are both rendered. */
  thinks: boolean;
  bosToken: string;
  eosToken: string;
  /** The assistant header the prompt must end with (thinking left on). */
  generationPrompt: string;
  /** Our own template of the same structure (models/chat-templates.ts), compared byte for byte. */
  ours?: 'QWEN3_TEMPLATE';
}

const CHATML_GEN = '<|im_start|>assistant\n';
const LLAMA_GEN = '<|start_header_id|>assistant<|end_header_id|>\n\n';
const qwen = { format: 'hermes' as const, bosToken: '', eosToken: '<|im_end|>', generationPrompt: CHATML_GEN };
const llama = { format: 'llama3_json' as const, thinks: false, bosToken: '<|begin_of_text|>', eosToken: '<|eot_id|>', generationPrompt: LLAMA_GEN };

export const FAMILIES: Family[] = [
  { label: 'Qwen2.5', file: 'Qwen-Qwen2.5-7B-Instruct.jinja', thinks: false, ...qwen },
  { label: 'Qwen3', file: 'Qwen-Qwen3-0.6B.jinja', thinks: true, ...qwen, ours: 'QWEN3_TEMPLATE' },
  { label: 'Llama 3.1', file: 'meta-llama-Llama-3.1-8B-Instruct.jinja', ...llama },
  { label: 'Llama 3.2', file: 'meta-llama-Llama-3.2-3B-Instruct.jinja', ...llama },
  { label: 'Llama 3.3', file: 'meta-llama-Llama-3.3-70B-Instruct.jinja', ...llama },
];

/** Chat Completions tools, as the server hands them to a template. */
export const TOOLS = [
  { type: 'function', function: { name: 'lookup_tide', description: 'High and low water for a harbour on a day',
    parameters: { type: 'object', properties: { harbour: { type: 'string' }, day: { type: 'string', description: 'ISO date' } }, required: ['harbour'] } } },
  { type: 'function', function: { name: 'convert_units', description: 'Converts a length',
    parameters: { type: 'object', properties: { metres: { type: 'number' }, to: { type: 'string', enum: ['feet', 'fathoms'] } }, required: ['metres', 'to'] } } },
];
export const TOOL_NAMES = new Set(['lookup_tide', 'convert_units']);

export const call = (id: string, name: string, args: Record<string, unknown>): ChatToolCall =>
  ({ id, type: 'function', function: { name, arguments: args } });

export const TIDE_CALL = call('call_1', 'lookup_tide', { harbour: 'Stavanger', day: '2025-03-01' });
export const UNITS_CALL = call('call_2', 'convert_units', { metres: 1.8, to: 'feet' });
export const TIDE_RESULT = '{"high": "06:12", "low": "12:40"}';
export const UNITS_RESULT = '{"feet": 5.9}';
export const REASONING = 'The harbour is named; ask the tide tool.';
export const SECOND_QUESTION = 'And the range in feet?';

export interface Conversation {
  name: string;
  messages: ChatMessage[];
  tools: boolean;
  /** The calls that must appear in the template's own call form, and the results that follow them. */
  calls: ChatToolCall[];
  results: string[];
  /** Text the prompt must hold (beyond calls and results). */
  holds: string[];
  /** reasoning_content given to an assistant turn after the last user message (Qwen3 shows it). */
  reasoningAfterLastQuery?: string;
}

export const CONVERSATIONS: Conversation[] = [
  {
    name: 'multi-turn',
    tools: true,
    messages: [
      { role: 'system', content: 'Answer in one sentence.' },
      { role: 'user', content: 'When is high water in Stavanger on 1 March 2025?' },
      { role: 'assistant', content: '', tool_calls: [TIDE_CALL], reasoning_content: 'Old reasoning, before the last question.' },
      { role: 'tool', content: TIDE_RESULT, tool_call_id: 'call_1' },
      { role: 'assistant', content: 'High water is at 06:12.' },
      { role: 'user', content: SECOND_QUESTION },
    ],
    calls: [TIDE_CALL], results: [TIDE_RESULT],
    holds: ['Answer in one sentence.', 'High water is at 06:12.', SECOND_QUESTION],
  },
  {
    name: 'tool-loop',
    tools: true,
    messages: [
      { role: 'user', content: 'When is high water in Stavanger on 1 March 2025?' },
      { role: 'assistant', content: '', tool_calls: [TIDE_CALL], reasoning_content: REASONING },
      { role: 'tool', content: TIDE_RESULT, tool_call_id: 'call_1' },
    ],
    calls: [TIDE_CALL], results: [TIDE_RESULT], holds: [], reasoningAfterLastQuery: REASONING,
  },
  {
    name: 'parallel',
    tools: true,
    messages: [
      { role: 'user', content: 'Tide in Stavanger, and 1.8 m in feet?' },
      { role: 'assistant', content: '', tool_calls: [TIDE_CALL, UNITS_CALL] },
      { role: 'tool', content: TIDE_RESULT, tool_call_id: 'call_1' },
      { role: 'tool', content: UNITS_RESULT, tool_call_id: 'call_2' },
    ],
    calls: [TIDE_CALL, UNITS_CALL], results: [TIDE_RESULT, UNITS_RESULT], holds: [],
  },
  {
    name: 'no-tools',
    tools: false,
    messages: [
      { role: 'user', content: 'Name a fjord.' },
      { role: 'assistant', content: 'Lysefjorden.' },
      { role: 'developer', content: 'Keep it short.' },
      { role: 'user', content: 'Another?' },
    ],
    calls: [], results: [], holds: ['Lysefjorden.', 'Another?'],
  },
];

/** A call in the form the model writes it and its template shows it (the documented syntax). */
export function callForm(format: ToolCallFormat, c: ChatToolCall): string {
  // Python's json.dumps spacing, as the templates' tojson writes it (flat arguments only).
  const args = `{${Object.entries(c.function.arguments).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(', ')}}`;
  return format === 'hermes'
    ? `<tool_call>\n{"name": "${c.function.name}", "arguments": ${args}}\n</tool_call>`
    : `{"name": "${c.function.name}", "parameters": ${args}}`;
}

/** Model outputs in each syntax, and the calls they hold. */
export function modelOutputs(format: ToolCallFormat): Array<{ name: string; text: string; calls: ChatToolCall[] }> {
  if (format === 'hermes') {
    return [
      { name: 'one call', text: callForm(format, TIDE_CALL), calls: [TIDE_CALL] },
      { name: 'text + two calls', text: `Checking both.\n${callForm(format, TIDE_CALL)}\n${callForm(format, UNITS_CALL)}`, calls: [TIDE_CALL, UNITS_CALL] },
      { name: 'compact JSON', text: `<tool_call>{"name":"lookup_tide","arguments":${JSON.stringify(TIDE_CALL.function.arguments)}}</tool_call>`, calls: [TIDE_CALL] },
    ];
  }
  return [
    { name: 'one call', text: callForm(format, TIDE_CALL), calls: [TIDE_CALL] },
    { name: 'after <|python_tag|>', text: `<|python_tag|>${callForm(format, TIDE_CALL)}`, calls: [TIDE_CALL] },
    { name: 'two joined by ;', text: `${callForm(format, TIDE_CALL)}; ${callForm(format, UNITS_CALL)}`, calls: [TIDE_CALL, UNITS_CALL] },
  ];
}
