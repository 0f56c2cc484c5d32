// How a vision-language model's rendered prompt spells its images before tokenizing, where the
// published processor rewrites the text (Gemma 3: each <start_of_image> the template wrote becomes
// "\n\n<start_of_image>" + mm_tokens_per_image x <image_soft_token> + "<end_of_image>\n\n").
// Qwen2-VL expands its placeholder token after tokenizing instead (vision/vision-model.ts placeImages),
// so it has none. No native code here: the prompt workers import it.

import type { SluiceTokenizer } from './tokenizer.js';

export interface ImageTextExpansion {
  /** What the chat template writes for an image. */
  marker: string;
  /** What the processor puts in its place. */
  text: string;
}

/** The expansion of a checkpoint's config.json, or undefined when its images need none (or it takes none). */
export function imageTextExpansion(config: Record<string, unknown>, tokenizer: SluiceTokenizer): ImageTextExpansion | undefined {
  const architectures = config['architectures'];
  if (!Array.isArray(architectures) || architectures[0] !== 'Gemma3ForConditionalGeneration' || config['vision_config'] === undefined) return undefined;
  const count = config['mm_tokens_per_image'];
  const tokens = ['<start_of_image>', '<image_soft_token>', '<end_of_image>'] as const;
  const keys = ['boi_token_index', 'image_token_index', 'eoi_token_index'] as const;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1) return undefined;
  // The published token strings, where the tokenizer has them at the ids the config names.
  if (tokens.some((t, i) => tokenizer.tokenId(t) === undefined || tokenizer.tokenId(t) !== config[keys[i]])) return undefined;
  return { marker: tokens[0], text: `\n\n${tokens[0]}${tokens[1].repeat(count)}${tokens[2]}\n\n` };
}
