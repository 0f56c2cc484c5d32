// Chat templates and tokenizer_config.json for the generated tokenizers.

import type { SpecialToken } from './bpe.js';
import type { TokenizerFamily } from './presets.js';

/**
 * ChatML (Qwen style): every message is `<|im_start|>{role}\n{content}<|im_end|>\n`;
 * add_generation_prompt appends `<|im_start|>assistant\n`. Content may be a string or a list of
 * OpenAI-style parts ({type: "text", text}); non-text parts are skipped.
 */
export const CHATML_TEMPLATE =
  "{%- for message in messages -%}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' -}}" +
  "{%- if message['content'] is string -%}" +
  "{{- message['content'] -}}" +
  "{%- elif message['content'] is not none -%}" +
  "{%- for part in message['content'] -%}" +
  "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}" +
  "{%- endfor -%}" +
  "{%- endif -%}" +
  "{{- '<|im_end|>\\n' -}}" +
  "{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/**
 * Llama 3 style: `<|begin_of_text|>` then per message
 * `<|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>` (text parts joined, then trimmed);
 * add_generation_prompt appends the assistant header.
 */
export const LLAMA3_TEMPLATE =
  "{{- bos_token -}}" +
  "{%- for message in messages -%}" +
  "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}" +
  "{%- set ns = namespace(text='') -%}" +
  "{%- if message['content'] is string -%}" +
  "{%- set ns.text = message['content'] -%}" +
  "{%- elif message['content'] is not none -%}" +
  "{%- for part in message['content'] -%}" +
  "{%- if part['type'] == 'text' -%}{%- set ns.text = ns.text + part['text'] -%}{%- endif -%}" +
  "{%- endfor -%}" +
  "{%- endif -%}" +
  "{{- ns.text | trim + '<|eot_id|>' -}}" +
  "{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}";

/**
 * Qwen3 style: ChatML turns, plus
 * - tools: listed in the system turn (after the caller's system text) as JSON lines inside
 *   <tools></tools>, with how to call them: a <tool_call>{"name", "arguments"}</tool_call> block each;
 * - assistant tool_calls rendered as those blocks (arguments given as an object or its JSON text);
 * - tool results as a user turn of <tool_response> blocks (consecutive results share the turn);
 * - reasoning_content of the assistant turns after the last user query as a <think> block;
 * - enable_thinking=false: the generation prompt closes an empty think block.
 * Written for this project: it renders the same structure as Qwen3's published template.
 */
export const QWEN3_TEMPLATE = `{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nThese functions can be called. Their signatures, one JSON object per line:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nTo call functions, answer with one block per call:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages and messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set text = m['content'] if m['content'] is string else '' -%}
{%- if m['role'] == 'system' and loop.first -%}
{%- elif m['role'] == 'user' or m['role'] == 'system' -%}
{{- '<|im_start|>' + m['role'] + '\n' + text + '<|im_end|>\n' -}}
{%- elif m['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if m['reasoning_content'] is string and loop.index0 > ns.last_query -%}{{- '<think>\n' + m['reasoning_content'] + '\n</think>\n\n' -}}{%- endif -%}
{{- text -}}
{%- if m['tool_calls'] -%}
{%- for call in m['tool_calls'] -%}
{%- set f = call['function'] if call['function'] else call -%}
{%- if text or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + f['name'] + '", "arguments": ' -}}
{%- if f['arguments'] is string -%}{{- f['arguments'] -}}{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif m['role'] == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}`;

export interface SpecialIds {
  /** config.json bos_token_id. */
  bos: number;
  /** config.json eos_token_id (the chat end-of-turn token first). */
  eos: number[];
  pad: number;
}

/** Which special ids play which role for a family. */
export function specialIds(family: TokenizerFamily, specials: SpecialToken[]): SpecialIds {
  const id = (content: string) => {
    const t = specials.find((s) => s.content === content);
    if (!t) throw new Error(`missing special token ${content}`);
    return t.id;
  };
  if (family === 'chatml' || family === 'qwen3') {
    return { bos: id('<|endoftext|>'), eos: [id('<|im_end|>'), id('<|endoftext|>')], pad: id('<|endoftext|>') };
  }
  return {
    bos: id('<|begin_of_text|>'),
    eos: [id('<|end_of_text|>'), id('<|eom_id|>'), id('<|eot_id|>')],
    pad: id('<|finetune_right_pad_id|>'),
  };
}

/** tokenizer_config.json as transformers writes it for a PreTrainedTokenizerFast. */
export function buildTokenizerConfig(
  family: TokenizerFamily,
  specials: SpecialToken[],
  modelMaxLength: number,
): Record<string, unknown> {
  const added: Record<string, unknown> = {};
  for (const s of specials) {
    added[String(s.id)] = {
      content: s.content,
      lstrip: false,
      normalized: false,
      rstrip: false,
      single_word: false,
      special: s.special !== false,
    };
  }
  const chatml = family === 'chatml' || family === 'qwen3';
  return {
    add_bos_token: false,
    add_eos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: added,
    additional_special_tokens: chatml ? ['<|im_start|>', '<|im_end|>'] : [],
    bos_token: chatml ? null : '<|begin_of_text|>',
    chat_template: family === 'qwen3' ? QWEN3_TEMPLATE : chatml ? CHATML_TEMPLATE : LLAMA3_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: chatml ? '<|im_end|>' : '<|eot_id|>',
    errors: 'replace',
    model_max_length: modelMaxLength,
    pad_token: chatml ? '<|endoftext|>' : '<|finetune_right_pad_id|>',
    split_special_tokens: false,
    tokenizer_class: 'PreTrainedTokenizerFast',
    unk_token: null,
  };
}
