// What a checkpoint's config.json says without loading it: the context window the engine will
// serve it with. Mirrors the native reader (native/src/model/model_config.cpp, the owner of this
// fact once a model is loaded); test/checkpoint-config.test.ts checks the two agree.

import { join } from 'node:path';
import { SluiceError } from '../errors.js';
import { readJsonFile } from '../text/tokenizer.js';
import { architectureSpec, specOfModelType, usesSlidingWindow } from './architectures.js';

/** Context length the native reader defaults to when config.json has no max_position_embeddings. */
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
 * max_position_embeddings (2048 when absent), capped at the sliding window where the model uses
 * one (Mistral when `sliding_window` is set; others when `use_sliding_window` is true), since
 * beyond the window full attention would compute something else than the model.
 */
export async function checkpointContextLength(modelDir: string): Promise<number> {
  const config = (await readJsonFile(modelDir, 'config.json', { required: true }))!;
  const file = join(modelDir, 'config.json');
  let contextLength = nonNegativeInteger(config, 'max_position_embeddings', DEFAULT_MAX_POSITION_EMBEDDINGS, file);
  const architectures = config['architectures'];
  const architecture = Array.isArray(architectures) && typeof architectures[0] === 'string' ? architectures[0] : undefined;
  const modelType = typeof config['model_type'] === 'string' && config['model_type'] !== ''
    ? config['model_type'] : architectureSpec(architecture)?.modelType;
  const sliding = usesSlidingWindow(specOfModelType(modelType), config);
  if (sliding) {
    const window = nonNegativeInteger(config, 'sliding_window', 0, file);
    if (window > 0 && window < contextLength) contextLength = window;
  }
  return contextLength;
}
