// Tool calls in a model's own syntax: which syntax a chat template teaches, and parsing it out of
// the generated text. Three syntaxes are recognised:
//   - hermes (Qwen2.5, Qwen3 and other Hermes-style templates): one block per call,
//       <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
//   - llama3_json (Llama 3.1 / 3.2 / 3.3): the whole answer is a JSON call (or several joined
//     by ";"), {"name": "get_weather", "parameters": {"city": "Paris"}}, perhaps after <|python_tag|>.
//   - harmony (gpt-oss): a commentary message to the function,
//       <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
//     read with the rest of the output's messages (harmony-parser.ts; split() takes the reasoning too).
// A block that does not parse, or names a function the request did not offer, stays text. A call's
// JSON is read with a scanner that knows strings, so an argument holding "</tool_call>" or "; {"
// stays inside the arguments.

import { parseHarmony } from './harmony-parser.js';
import { isHarmonyTemplate } from './harmony.js';

export type ToolCallFormat = 'hermes' | 'llama3_json' | 'harmony';

export interface ParsedToolCall {
  name: string;
  /** The arguments as a JSON object's text (OpenAI's `arguments` string). */
  arguments: string;
}

/** The syntax a chat template teaches, or undefined when it does not render tools at all. */
export function toolCallFormat(template: string | undefined): ToolCallFormat | undefined {
  if (template === undefined || !/\btools\b/.test(template)) return undefined;
  if (isHarmonyTemplate(template)) return 'harmony';
  if (template.includes('<tool_call>')) return 'hermes';
  if (template.includes('<|python_tag|>') || template.includes('ipython')) return 'llama3_json';
  return undefined;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** One call from parsed JSON, when it names an offered function and has object arguments. */
function callOf(value: unknown, argsKey: 'arguments' | 'parameters', offered: ReadonlySet<string>): ParsedToolCall | undefined {
  if (!isObject(value) || typeof value['name'] !== 'string' || !offered.has(value['name'])) return undefined;
  let args: unknown = value[argsKey] ?? value['arguments'] ?? {};
  if (typeof args === 'string') {
    try {
      args = JSON.parse(args) as unknown;
    } catch {
      return undefined;
    }
  }
  if (!isObject(args)) return undefined;
  return { name: value['name'], arguments: JSON.stringify(args) };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/**
 * The end (exclusive) of the JSON object or array that opens at text[start], skipping strings and
 * their escapes; -1 when it is not closed (or text[start] opens neither).
 */
export function jsonValueEnd(text: string, start: number): number {
  if (text[start] !== '{' && text[start] !== '[') return -1;
  let depth = 0;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++;
      if (i >= text.length) return -1;
    } else if (c === '{' || c === '[') {
      depth++;
    } else if (c === '}' || c === ']') {
      if (--depth === 0) return i + 1;
    }
  }
  return -1;
}

const skipSpace = (text: string, i: number): number => {
  while (i < text.length && /\s/.test(text[i]!)) i++;
  return i;
};

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/** Hermes blocks: <tool_call>, a JSON object read to its end, </tool_call>. */
function hermesCalls(text: string, offered: ReadonlySet<string>): { content: string; calls: ParsedToolCall[] } {
  const calls: ParsedToolCall[] = [];
  let content = '';
  let from = 0;
  for (let open = text.indexOf(OPEN); open >= 0; open = text.indexOf(OPEN, from)) {
    const start = skipSpace(text, open + OPEN.length);
    const end = jsonValueEnd(text, start);
    const close = end < 0 ? -1 : skipSpace(text, end);
    const call = close >= 0 && text.startsWith(CLOSE, close) ? callOf(parseJson(text.slice(start, end)), 'arguments', offered) : undefined;
    if (call === undefined) {
      // Not a call: the block stays text, up to its closing tag (or the next opening one).
      const next = text.indexOf(CLOSE, open + OPEN.length);
      const stop = next < 0 ? text.length : next + CLOSE.length;
      content += text.slice(from, stop);
      from = stop;
      continue;
    }
    calls.push(call);
    content += text.slice(from, open);
    from = close + CLOSE.length;
  }
  content += text.slice(from);
  return { content: calls.length > 0 ? content.trim() : text, calls };
}

/** JSON objects joined by ';' (the separator read outside strings only). */
function jsonSequence(body: string): unknown[] | undefined {
  const parts: unknown[] = [];
  let i = 0;
  while (true) {
    i = skipSpace(body, i);
    const end = jsonValueEnd(body, i);
    if (end < 0) return undefined;
    const part = parseJson(body.slice(i, end));
    if (part === undefined) return undefined;
    parts.push(part);
    i = skipSpace(body, end);
    if (i >= body.length) return parts;
    if (body[i] !== ';') return undefined;
    i++;
  }
}

/**
 * Splits an answer into its tool calls and the text around them. `offered`: the function names
 * the request offered (calls to others stay text).
 */
export function parseToolCalls(text: string, format: ToolCallFormat, offered: ReadonlySet<string>): { content: string; calls: ParsedToolCall[] } {
  if (format === 'hermes') return hermesCalls(text, offered);
  if (format === 'harmony') {
    const turn = parseHarmony(text, offered);
    return { content: turn.content, calls: turn.calls };
  }
  const calls: ParsedToolCall[] = [];
  const body = text.trim().replace(/^<\|python_tag\|>/, '').trim();
  if (!body.startsWith('{')) return { content: text, calls };
  const parts = jsonSequence(body);
  if (parts === undefined) return { content: text, calls };
  for (const part of parts) {
    const call = callOf(part, 'parameters', offered);
    if (call === undefined) return { content: text, calls: [] };
    calls.push(call);
  }
  return { content: '', calls };
}
