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
  if (family === 'chatml') {
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
      special: true,
    };
  }
  const chatml = family === 'chatml';
  return {
    add_bos_token: false,
    add_eos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: added,
    additional_special_tokens: chatml ? ['<|im_start|>', '<|im_end|>'] : [],
    bos_token: chatml ? null : '<|begin_of_text|>',
    chat_template: chatml ? CHATML_TEMPLATE : LLAMA3_TEMPLATE,
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
