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

/**
 * Harmony (gpt-oss), rendering the structure of gpt-oss's published template:
 * - a system message naming the model, knowledge cutoff, today's date (strftime_now), the
 *   reasoning level (reasoning_effort, default medium) and the channels, plus where function
 *   calls go when there are tools;
 * - a developer message with the first system/developer message as "# Instructions" and the
 *   tools as a TypeScript-like namespace `functions` (each parameter typed from its JSON schema,
 *   with its description as a comment, `?` unless required, and its default);
 * - user turns; assistant answers on the final channel (their reasoning dropped); an assistant
 *   turn with tool calls as its first call `<|start|>assistant to=functions.{name}<|channel|>commentary
 *   json<|message|>{arguments}<|call|>`, after its reasoning (or text) on the analysis channel unless
 *   a later assistant turn answered; tool results from `functions.{name of the last call}` on the
 *   commentary channel, their text as a JSON string; later system messages are not rendered;
 * - the generation prompt `<|start|>assistant`; a last assistant turn without it (training)
 *   keeps its reasoning and ends in <|return|>.
 * Written for this project. Where it differs from the published one: nested object parameters are
 * written `{\n` + `a: number, b?: string` + `}` and oneOf variants `string | number` (the published
 * one leaves newlines and its own indentation between the parts, and adds the variants' comments),
 * no builtin_tools (browser, python) and no content_type, and arguments given as text are written
 * as they are (the published one writes them as a JSON string).
 */
export const HARMONY_TEMPLATE = `{%- macro ts_type(s) -%}
{%- set t = s['type'] -%}
{%- if t == 'array' -%}
{#- s['items'] of a schema without items is the mapping's items() method: test for a mapping. -#}
{%- set item = s['items'] if s['items'] is mapping else none -%}
{%- if item is none -%}{{- 'any[]' -}}
{%- elif item['type'] in ['string', 'number', 'boolean'] -%}{{- item['type'] + '[]' -}}
{%- elif item['type'] == 'integer' -%}{{- 'number[]' -}}
{%- else -%}{%- set inner = ts_type(item) -%}{{- ('any' if inner == 'object | object' or inner | length > 50 else inner) + '[]' -}}
{%- endif -%}
{%- if s['nullable'] -%}{{- ' | null' -}}{%- endif -%}
{%- elif t is defined and t is not string and t is iterable and t is not mapping -%}{{- t | join(' | ') -}}
{%- elif s['oneOf'] -%}
{%- for v in s['oneOf'] -%}{{- (' | ' if not loop.first else '') + ts_type(v) -}}{%- endfor -%}
{%- elif t == 'string' -%}
{%- if s['enum'] -%}{{- '"' + s['enum'] | join('" | "') + '"' -}}
{%- else -%}{{- 'string' + (' | null' if s['nullable'] else '') -}}
{%- endif -%}
{%- elif t == 'number' or t == 'integer' -%}{{- 'number' -}}
{%- elif t == 'boolean' -%}{{- 'boolean' -}}
{%- elif t == 'object' and s['properties'] -%}
{{- '{\n' -}}
{%- for name, p in s['properties'] | items -%}
{{- (', ' if not loop.first else '') + name + ('' if name in (s['required'] or []) else '?') + ': ' + ts_type(p) -}}
{%- endfor -%}
{{- '}' -}}
{%- elif t == 'object' -%}{{- 'object' -}}
{%- else -%}{{- 'any' -}}
{%- endif -%}
{%- endmacro -%}
{%- macro functions_namespace(tools) -%}
{{- '## functions\n\nnamespace functions {\n\n' -}}
{%- for tool in tools -%}
{%- set f = tool['function'] if tool['function'] is defined else tool -%}
{%- set params = f['parameters'] -%}
{{- '// ' + f['description'] + '\ntype ' + f['name'] + ' = ' -}}
{%- if params and params['properties'] -%}
{{- '(_: {\n' -}}
{%- for name, p in params['properties'] | items -%}
{%- if p['description'] -%}{{- '// ' + p['description'] + '\n' -}}{%- endif -%}
{{- name + ('' if name in (params['required'] or []) else '?') + ': ' + ts_type(p) -}}
{%- if p['default'] is defined -%}
{%- if p['enum'] -%}{{- ', // default: ' ~ p['default'] -}}
{%- elif p['oneOf'] -%}{{- '// default: ' ~ p['default'] -}}
{%- else -%}{{- ', // default: ' + (p['default'] | tojson) -}}
{%- endif -%}
{%- endif -%}
{{- ',\n' -}}
{%- endfor -%}
{{- '}) => any;\n\n' -}}
{%- else -%}{{- '() => any;\n\n' -}}
{%- endif -%}
{%- endfor -%}
{{- '} // namespace functions' -}}
{%- endmacro -%}
{{- '<|start|>system<|message|>' + (model_identity if model_identity is defined else 'You are ChatGPT, a large language model trained by OpenAI.') -}}
{{- '\nKnowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') -}}
{{- '\n\nReasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') -}}
{{- '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- '<|end|>' -}}
{%- set first = messages[0] if messages else none -%}
{%- set instructions = first['content'] if first and first['role'] in ['system', 'developer'] else '' -%}
{%- set turns = messages[1:] if first and first['role'] in ['system', 'developer'] else messages -%}
{%- if instructions or tools -%}
{{- '<|start|>developer<|message|>' -}}
{%- if instructions -%}{{- '# Instructions\n\n' + instructions + '\n\n' -}}{%- endif -%}
{%- if tools -%}{{- '# Tools\n\n' + functions_namespace(tools) -}}{%- endif -%}
{{- '<|end|>' -}}
{%- endif -%}
{%- set last = namespace(call=none) -%}
{%- for m in turns -%}
{%- set text = m['content'] if m['content'] is string else '' -%}
{%- if m['role'] == 'user' -%}
{{- '<|start|>user<|message|>' + text + '<|end|>' -}}
{%- elif m['role'] == 'assistant' -%}
{%- set thinking = m['thinking'] if m['thinking'] is string else '' -%}
{%- if '<|channel|>analysis<|message|>' in text or '<|channel|>final<|message|>' in text or '<|channel|>analysis<|message|>' in thinking or '<|channel|>final<|message|>' in thinking -%}
{{- raise_exception('an assistant turn holds <|channel|> tags: give its reasoning as thinking and its answer as content') -}}
{%- endif -%}
{%- if m['tool_calls'] -%}
{%- if text and thinking -%}{{- raise_exception('an assistant turn with tool calls has both content and thinking: give its analysis in one of them') -}}{%- endif -%}
{%- set later = namespace(answered=false) -%}
{%- for n in turns[loop.index:] -%}{%- if n['role'] == 'assistant' and not n['tool_calls'] -%}{%- set later.answered = true -%}{%- endif -%}{%- endfor -%}
{%- if (text or thinking) and not later.answered -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + (text or thinking) + '<|end|>' -}}{%- endif -%}
{%- set call = m['tool_calls'][0]['function'] if m['tool_calls'][0]['function'] is defined else m['tool_calls'][0] -%}
{{- '<|start|>assistant to=functions.' + call['name'] + '<|channel|>commentary json<|message|>' -}}
{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) + '<|call|>' -}}
{%- set last.call = call['name'] -%}
{%- elif loop.last and not add_generation_prompt -%}
{%- if thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + thinking + '<|end|>' -}}{%- endif -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text + '<|return|>' -}}
{%- else -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text + '<|end|>' -}}
{%- set last.call = none -%}
{%- endif -%}
{%- elif m['role'] == 'tool' -%}
{%- if last.call is none -%}{{- raise_exception('a tool result follows no assistant tool call') -}}{%- endif -%}
{{- '<|start|>functions.' + last.call + ' to=assistant<|channel|>commentary<|message|>' + (text | tojson) + '<|end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}`;

/**
 * Qwen2-VL / Qwen2.5-VL style: ChatML turns, a default system turn ("You are a helpful
 * assistant.") when the first message is not a system one, and content parts rendered in order:
 * an image part (type image or image_url, or a part holding an image or image_url key) as
 * <|vision_start|><|image_pad|><|vision_end|>, a video part as <|vision_start|><|video_pad|><|vision_end|>,
 * a text part as its text; add_vision_id numbers them ("Picture 1: ", "Video 1: ").
 * Written for this project: it renders the same structure as Qwen2.5-VL's published template.
 */
export const QWEN2_VL_TEMPLATE = `{%- set seen = namespace(images=0, videos=0) -%}
{%- for m in messages -%}
{%- if loop.first and m['role'] != 'system' -%}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}{%- endif -%}
{{- '<|im_start|>' + m['role'] + '\n' -}}
{%- if m['content'] is string -%}
{{- m['content'] -}}
{%- elif m['content'] is not none -%}
{%- for part in m['content'] -%}
{%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part or 'image_url' in part -%}
{%- set seen.images = seen.images + 1 -%}
{%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif part['type'] == 'video' or 'video' in part -%}
{%- set seen.videos = seen.videos + 1 -%}
{%- if add_vision_id -%}{{- 'Video ' ~ seen.videos ~ ': ' -}}{%- endif -%}
{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- elif 'text' in part -%}
{{- part['text'] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}`;

/**
 * ChatML turns for Gemma 3 with images (the maker's 'gemma3-vl' tokenizer): content parts in
 * order, an image part (type image or image_url, or a part holding an image or image_url key) as
 * <start_of_image>, which Gemma 3's processor expands to "\n\n<start_of_image>" + mm_tokens_per_image
 * x <image_soft_token> + "<end_of_image>\n\n" before tokenizing (as the published template writes
 * <start_of_image> for its image parts), a text part as its text.
 */
export const GEMMA3_VL_TEMPLATE =
  "{%- for message in messages -%}" +
  "{{- '<|im_start|>' + message['role'] + '\n' -}}" +
  "{%- if message['content'] is string -%}" +
  "{{- message['content'] -}}" +
  "{%- elif message['content'] is not none -%}" +
  "{%- for part in message['content'] -%}" +
  "{%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part or 'image_url' in part -%}" +
  "{{- '<start_of_image>' -}}" +
  "{%- elif 'text' in part -%}{{- part['text'] -}}" +
  "{%- endif -%}" +
  "{%- endfor -%}" +
  "{%- endif -%}" +
  "{{- '<|im_end|>\n' -}}" +
  "{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}";

export interface SpecialIds {
  /** config.json bos_token_id. */
  bos: number;
  /** config.json eos_token_id (the chat end-of-turn token first). */
  eos: number[];
  pad: number;
}

/**
 * gpt-oss's special tokens (o200k_harmony's named ones), in id order: a tokenizer family 'harmony'
 * writes these, special, with HARMONY_TEMPLATE (specialIds and buildTokenizerConfig take it already).
 */
export const HARMONY_SPECIAL_TOKENS = [
  '<|startoftext|>', '<|endoftext|>', '<|return|>', '<|constrain|>', '<|channel|>', '<|start|>', '<|end|>', '<|message|>', '<|call|>',
] as const;

/**
 * Qwen2-VL's vision tokens, special, in its order (ids 151652..151656 in the published
 * vocabulary): an image part is <|vision_start|><|image_pad|><|vision_end|>, the processor
 * repeating <|image_pad|> once per merged patch; <|video_pad|> likewise for videos.
 */
export const QWEN2_VL_VISION_TOKENS = ['<|vision_start|>', '<|vision_end|>', '<|vision_pad|>', '<|image_pad|>', '<|video_pad|>'] as const;

/**
 * Gemma 3's image tokens as published (special; ids 255999, 256000 and 262144 there): the
 * processor's image text is <start_of_image>, one <image_soft_token> per image row, <end_of_image>.
 */
export const GEMMA3_IMAGE_TOKENS = ['<start_of_image>', '<end_of_image>', '<image_soft_token>'] as const;

/** The families chat templates are written for: the presets' and harmony (gpt-oss). */
type TemplateFamily = TokenizerFamily | 'harmony';

/** Which special ids play which role for a family. */
export function specialIds(family: TemplateFamily, specials: SpecialToken[]): SpecialIds {
  const id = (content: string) => {
    const t = specials.find((s) => s.content === content);
    if (!t) throw new Error(`missing special token ${content}`);
    return t.id;
  };
  if (family === 'harmony') {
    // gpt-oss's generation_config: <|return|> ends an answer, <|call|> a tool call.
    return { bos: id('<|startoftext|>'), eos: [id('<|return|>'), id('<|endoftext|>'), id('<|call|>')], pad: id('<|endoftext|>') };
  }
  if (family === 'chatml' || family === 'qwen3' || family === 'qwen2-vl' || family === 'gemma3-vl') {
    return { bos: id('<|endoftext|>'), eos: [id('<|im_end|>'), id('<|endoftext|>')], pad: id('<|endoftext|>') };
  }
  return {
    bos: id('<|begin_of_text|>'),
    eos: [id('<|end_of_text|>'), id('<|eom_id|>'), id('<|eot_id|>')],
    pad: id('<|finetune_right_pad_id|>'),
  };
}

/** config.json's vision token ids (Qwen2-VL family): where the tokenizer put its vision tokens. */
export interface VisionTokenIds {
  vision_start_token_id: number;
  vision_end_token_id: number;
  vision_token_id: number;
  image_token_id: number;
  video_token_id: number;
}

export function visionTokenIds(specials: SpecialToken[]): VisionTokenIds {
  const id = (content: string) => {
    const t = specials.find((s) => s.content === content);
    if (!t) throw new Error(`missing special token ${content}`);
    return t.id;
  };
  return {
    vision_start_token_id: id('<|vision_start|>'),
    vision_end_token_id: id('<|vision_end|>'),
    vision_token_id: id('<|vision_pad|>'),
    image_token_id: id('<|image_pad|>'),
    video_token_id: id('<|video_pad|>'),
  };
}

/** config.json's image token ids (Gemma 3): where the tokenizer put its image tokens. */
export interface Gemma3ImageTokenIds {
  boi_token_index: number;
  eoi_token_index: number;
  image_token_index: number;
}

export function gemma3ImageTokenIds(specials: SpecialToken[]): Gemma3ImageTokenIds {
  const id = (content: string) => {
    const t = specials.find((s) => s.content === content);
    if (!t) throw new Error(`missing special token ${content}`);
    return t.id;
  };
  return { boi_token_index: id('<start_of_image>'), eoi_token_index: id('<end_of_image>'), image_token_index: id('<image_soft_token>') };
}

/** tokenizer_config.json as transformers writes it for a PreTrainedTokenizerFast. */
export function buildTokenizerConfig(
  family: TemplateFamily,
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
  const chatml = family === 'chatml' || family === 'qwen3' || family === 'qwen2-vl' || family === 'gemma3-vl';
  const vl = family === 'qwen2-vl';
  const gemmaVl = family === 'gemma3-vl';
  if (family === 'harmony') {
    return {
      added_tokens_decoder: added,
      bos_token: '<|startoftext|>',
      chat_template: HARMONY_TEMPLATE,
      clean_up_tokenization_spaces: false,
      eos_token: '<|return|>',
      model_input_names: ['input_ids', 'attention_mask'],
      model_max_length: modelMaxLength,
      pad_token: '<|endoftext|>',
      tokenizer_class: 'PreTrainedTokenizerFast',
    };
  }
  return {
    add_bos_token: false,
    add_eos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: added,
    additional_special_tokens: chatml
      ? ['<|im_start|>', '<|im_end|>', ...(vl ? QWEN2_VL_VISION_TOKENS : []), ...(gemmaVl ? GEMMA3_IMAGE_TOKENS : [])]
      : [],
    bos_token: chatml ? null : '<|begin_of_text|>',
    chat_template: family === 'qwen3' ? QWEN3_TEMPLATE : vl ? QWEN2_VL_TEMPLATE : gemmaVl ? GEMMA3_VL_TEMPLATE : chatml ? CHATML_TEMPLATE : LLAMA3_TEMPLATE,
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
