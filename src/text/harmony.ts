// OpenAI's harmony chat format (gpt-oss): how its chat template is recognised, which special tokens
// carry its message structure, and what its template needs of the messages and tools. Reading the
// output is harmony-parser.ts.

import { HARMONY } from './harmony-parser.js';

/**
 * Whether a chat template writes harmony: its messages are <|start|>{header}<|message|>...<|end|>
 * and it names channels (the published gpt-oss template, models/chat-templates.ts HARMONY_TEMPLATE).
 */
export function isHarmonyTemplate(template: string | undefined): boolean {
  return template !== undefined && [HARMONY.start, HARMONY.channel, HARMONY.message, HARMONY.end].every((m) => template.includes(m));
}

/**
 * The special tokens a harmony model's decoded text keeps, so its output can be read back into
 * messages (those among the model's eos tokens, <|return|> and <|call|>, still add no text).
 */
export const HARMONY_STRUCTURE_TOKENS: readonly string[] = Object.values(HARMONY);

/** The reasoning levels harmony's system message names ("Reasoning: medium" by default). */
export type HarmonyEffort = 'low' | 'medium' | 'high';

interface TemplateMessage {
  role: string;
  content: string;
  tool_calls?: unknown[];
  thinking?: string;
  reasoning_content?: string;
}

interface TemplateTool {
  type?: string;
  function?: { name: string; description?: string };
}

/**
 * What the published gpt-oss template needs beyond the common input, without which it fails or
 * renders something else:
 *   - a tool without a description gets '' (the template writes "// " + description unguarded);
 *   - an assistant turn with tool calls and both text and reasoning gets them as one reasoning
 *     text (the template raises on both: it renders either as the analysis before the call, and
 *     a gpt-oss turn read back by split() has both when the model wrote a preamble).
 * One call per turn (it renders only the first) is ChatTemplate's parallel-call probe's business.
 */
export function harmonyTemplateInput<M extends TemplateMessage>(messages: M[], tools: readonly unknown[] | undefined): { messages: M[]; tools: readonly unknown[] | undefined } {
  const out = messages.map((m) => {
    if (m.role !== 'assistant' || (m.tool_calls?.length ?? 0) === 0 || m.content === '' || !m.thinking) return m;
    const thinking = `${m.thinking}\n${m.content}`;
    return { ...m, content: '', thinking, reasoning_content: thinking };
  });
  const described = tools?.map((t) => {
    const fn = (t as TemplateTool | null)?.function;
    return fn !== undefined && fn.description === undefined ? { ...(t as TemplateTool), function: { ...fn, description: '' } } : t;
  });
  return { messages: out, tools: described };
}
