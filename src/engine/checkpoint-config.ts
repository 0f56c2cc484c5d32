// What a checkpoint's config.json says without loading it: the context window the engine will
// serve it with. Mirrors the native reader (native/src/model/model_config.cpp, the owner of this
// fact once a model is loaded); test/checkpoint-config.test.ts checks the two agree.

import { join } from 'node:path';
import { SluiceError } from '../errors.js';
import { readJsonFile } from '../text/tokenizer.js';
import { specOfConfig, textConfigOf, windowCapsContext } from './architectures.js';

/** Context length the native reader defaults to when config.json has no max_position_embeddings (unknown families). */
const DEFAULT_MAX_POSITION_EMBEDDINGS = 2048;

const present = (v: unknown) => v !== undefined && v !== null;

function nonNegativeInteger(config: Record<string, unknown>, key: string, fallback: number, file: string): number {
  const v = config[key];
  if (!present(v)) return fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
    throw new SluiceError('model_file_invalid', `${file}: field "${key}" must be a non-negative integer`);
  }
  return v;
}

/**
 * The context length Engine.load would report for `modelDir` (engine.info.contextLength):
 * max_position_embeddings (when absent, the family's default: 2048, Gemma 3's 131072), capped at
 * the sliding window where the family serves one that way (Mistral and Mixtral when
 * `sliding_window` is set; the Qwen families when `use_sliding_window` is true), since beyond the
 * window full attention would compute something else than the model. Gemma 3's windowed layers
 * are computed as such: its window never caps the context. Multimodal checkpoints
 * (Gemma3ForConditionalGeneration) are read from their text_config.
 */
export async function checkpointContextLength(modelDir: string): Promise<number> {
  const config = (await readJsonFile(modelDir, 'config.json', { required: true }))!;
  const file = join(modelDir, 'config.json');
  const spec = specOfConfig(config);
  const text = textConfigOf(spec, config);
  if (!text) throw new SluiceError('model_file_invalid', `${file}: field "${spec!.textConfig}" must be an object`);
  const where = spec?.textConfig ? `${file} ${spec.textConfig}` : file;
  const fallback = spec?.defaultContextLength ?? DEFAULT_MAX_POSITION_EMBEDDINGS;
  let contextLength = nonNegativeInteger(text, 'max_position_embeddings', fallback, where);
  if (windowCapsContext(spec, text)) {
    const window = nonNegativeInteger(text, 'sliding_window', 0, where);
    if (window > 0 && window < contextLength) contextLength = window;
  }
  return contextLength;
}
