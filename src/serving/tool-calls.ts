// Tool calls in a model's own syntax: which syntax a chat template teaches, and parsing it out of
// the generated text. Two syntaxes are recognised:
//   - hermes (Qwen2.5, Qwen3 and other Hermes-style templates): one block per call,
//       <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
//   - llama3_json (Llama 3.1 / 3.2 / 3.3): the whole answer is a JSON call (or several joined
//     by ";"), {"name": "get_weather", "parameters": {"city": "Paris"}}, perhaps after <|python_tag|>.
// A block that does not parse, or names a function the request did not offer, stays text.

export type ToolCallFormat = 'hermes' | 'llama3_json';

export interface ParsedToolCall {
  name: string;
  /** The arguments as a JSON object's text (OpenAI's `arguments` string). */
  arguments: string;
}

/** The syntax a chat template teaches, or undefined when it does not render tools at all. */
export function toolCallFormat(template: string | undefined): ToolCallFormat | undefined {
  if (template === undefined || !/\btools\b/.test(template)) return undefined;
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
 * Splits an answer into its tool calls and the text around them. `offered`: the function names
 * the request offered (calls to others stay text).
 */
export function parseToolCalls(text: string, format: ToolCallFormat, offered: ReadonlySet<string>): { content: string; calls: ParsedToolCall[] } {
  const calls: ParsedToolCall[] = [];
  if (format === 'hermes') {
    const content = text.replace(/<tool_call>([\s\S]*?)<\/tool_call>/g, (block, body: string) => {
      const call = callOf(parseJson(body.trim()), 'arguments', offered);
      if (call === undefined) return block;
      calls.push(call);
      return '';
    });
    return { content: calls.length > 0 ? content.trim() : text, calls };
  }
  const body = text.trim().replace(/^<\|python_tag\|>/, '').trim();
  if (!body.startsWith('{')) return { content: text, calls };
  const whole = parseJson(body);
  const parts = whole !== undefined ? [whole] : body.split(/;\s*(?=\{)/).map((p) => parseJson(p.trim()));
  for (const part of parts) {
    const call = callOf(part, 'parameters', offered);
    if (call === undefined) return { content: text, calls: [] };
    calls.push(call);
  }
  return { content: '', calls };
}
