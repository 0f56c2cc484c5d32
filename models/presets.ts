// Model presets for the generator: the exact shapes of published checkpoints plus small
// variants for correctness tests. Shapes only; weights are random (see make-model.ts).

import type { Architecture } from '../src/engine/architectures.js';

export type { Architecture };

export type Dtype = 'f32' | 'f16' | 'bf16';

/** rope_scaling exactly as transformers' config.json spells it. */
export type RopeScaling =
  | {
      rope_type: 'llama3';
      factor: number;
      low_freq_factor: number;
      high_freq_factor: number;
      original_max_position_embeddings: number;
    }
  | { rope_type: 'linear'; factor: number };

/**
 * Tokenizer family written next to the weights.
 * - 'chatml': byte-level BPE + <|endoftext|>, <|im_start|>, <|im_end|> (Qwen style).
 * - 'qwen3': chatml plus Qwen3's text tokens <think> </think> <tool_call> </tool_call>
 *   <tool_response> </tool_response> (added, not special) and a template with thinking and tools.
 * - 'llama3': byte-level BPE + the 256 Llama 3 special tokens (<|begin_of_text|>, ... <|eot_id|>).
 */
export type TokenizerFamily = 'chatml' | 'qwen3' | 'llama3';

export interface PresetShape {
  architecture: Architecture;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  /** Rows of embed_tokens / lm_head; the tokenizer is padded (or trimmed) to exactly this size. */
  vocabSize: number;
  maxPositionEmbeddings: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  tieWordEmbeddings: boolean;
  /** Mistral only: sliding_window in config.json (null = full attention). */
  slidingWindow: number | null;
  tokenizer: TokenizerFamily;
  defaultDtype: Dtype;
}

/** Byte-level BPE entries of the small trained tokenizer (256 bytes + learned merges). */
export const SMALL_BPE_SIZE = 2048;
/** <|endoftext|>, <|im_start|>, <|im_end|>. */
export const CHATML_SPECIALS = 3;
/** Vocabulary of the tiny/test presets: trained BPE + ChatML specials = 2051. */
export const SMALL_VOCAB = SMALL_BPE_SIZE + CHATML_SPECIALS;

const llama3Scaling = (factor: number, orig: number): RopeScaling => ({
  rope_type: 'llama3',
  factor,
  low_freq_factor: 1,
  high_freq_factor: 4,
  original_max_position_embeddings: orig,
});

export const PRESETS: Record<string, PresetShape> = {
  // ~3.4M params demo model.
  tiny: {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 256,
    intermediateSize: 688,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  // The tiny shape as Qwen3, with Qwen3's tokenizer features: a model that thinks and calls tools.
  'tiny-qwen3': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 256,
    intermediateSize: 688,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: SMALL_BPE_SIZE + CHATML_SPECIALS + 6,
    maxPositionEmbeddings: 4096,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'qwen3',
    defaultDtype: 'bf16',
  },
  'qwen2.5-0.5b': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 896,
    intermediateSize: 4864,
    numLayers: 24,
    numHeads: 14,
    numKvHeads: 2,
    headDim: 64,
    vocabSize: 151936,
    maxPositionEmbeddings: 32768,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  'qwen3-0.6b': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 1024,
    intermediateSize: 3072,
    numLayers: 28,
    numHeads: 16,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 151936,
    maxPositionEmbeddings: 40960,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },
  'llama-3.2-1b': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 2048,
    intermediateSize: 8192,
    numLayers: 16,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 64,
    vocabSize: 128256,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-5,
    ropeTheta: 500000,
    ropeScaling: llama3Scaling(32, 8192),
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'llama3',
    defaultDtype: 'bf16',
  },
  'llama-3.1-8b': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 4096,
    intermediateSize: 14336,
    numLayers: 32,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 128256,
    maxPositionEmbeddings: 131072,
    rmsNormEps: 1e-5,
    ropeTheta: 500000,
    ropeScaling: llama3Scaling(8, 8192),
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'llama3',
    defaultDtype: 'bf16',
  },
  // Mistral-7B-v0.3 shape.
  'mistral-7b': {
    architecture: 'MistralForCausalLM',
    hiddenSize: 4096,
    intermediateSize: 14336,
    numLayers: 32,
    numHeads: 32,
    numKvHeads: 8,
    headDim: 128,
    vocabSize: 32768,
    maxPositionEmbeddings: 32768,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'bf16',
  },

  // ---- Small variants for the float64 correctness suite (2 layers, vocab = tiny tokenizer). ----
  // llama3 rope scaling with original_max_position_embeddings 64: with theta 1e4 and head_dim 32,
  // frequencies 0-1 stay, 2-4 are interpolated, 5-15 are divided by the factor.
  'test-llama': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 128,
    intermediateSize: 352,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: llama3Scaling(8, 64),
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // Linear rope scaling, tied embeddings, 3 query heads sharing 1 kv head (MQA).
  'test-llama-linear': {
    architecture: 'LlamaForCausalLM',
    hiddenSize: 96,
    intermediateSize: 256,
    numLayers: 2,
    numHeads: 3,
    numKvHeads: 1,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: { rope_type: 'linear', factor: 4 },
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // q/k/v biases, tied, GQA 8:2 with head_dim 16.
  'test-qwen2': {
    architecture: 'Qwen2ForCausalLM',
    hiddenSize: 128,
    intermediateSize: 384,
    numLayers: 2,
    numHeads: 8,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: true,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  // q_norm/k_norm, head_dim 48 != hidden/heads (32), untied.
  'test-qwen3': {
    architecture: 'Qwen3ForCausalLM',
    hiddenSize: 128,
    intermediateSize: 384,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 48,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-6,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
  'test-mistral': {
    architecture: 'MistralForCausalLM',
    hiddenSize: 128,
    intermediateSize: 448,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 32,
    vocabSize: SMALL_VOCAB,
    maxPositionEmbeddings: 2048,
    rmsNormEps: 1e-5,
    ropeTheta: 1000000,
    ropeScaling: null,
    tieWordEmbeddings: false,
    slidingWindow: null,
    tokenizer: 'chatml',
    defaultDtype: 'f32',
  },
};

/** Preset merged with overrides, validated. Throws on unknown presets or inconsistent shapes. */
export function resolvePreset(preset: string, overrides: Partial<PresetShape> = {}): PresetShape {
  const base = PRESETS[preset];
  if (!base) {
    throw new Error(`unknown preset "${preset}" (known: ${Object.keys(PRESETS).join(', ')})`);
  }
  const s: PresetShape = { ...base, ...overrides };
  const positive: (keyof PresetShape)[] = [
    'hiddenSize', 'intermediateSize', 'numLayers', 'numHeads', 'numKvHeads', 'headDim',
    'vocabSize', 'maxPositionEmbeddings',
  ];
  for (const k of positive) {
    const v = s[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) {
      throw new Error(`preset field ${k} must be a positive integer, got ${String(v)}`);
    }
  }
  if (s.numHeads % s.numKvHeads !== 0) {
    throw new Error(`numHeads (${s.numHeads}) must be a multiple of numKvHeads (${s.numKvHeads})`);
  }
  if (s.headDim % 2 !== 0) throw new Error(`headDim must be even, got ${s.headDim}`);
  return s;
}

export function dtypeBytes(dtype: Dtype): number {
  return dtype === 'f32' ? 4 : 2;
}

export function safetensorsDtype(dtype: Dtype): 'F32' | 'F16' | 'BF16' {
  return dtype === 'f32' ? 'F32' : dtype === 'f16' ? 'F16' : 'BF16';
}

export function torchDtype(dtype: Dtype): 'float32' | 'float16' | 'bfloat16' {
  return dtype === 'f32' ? 'float32' : dtype === 'f16' ? 'float16' : 'bfloat16';
}
