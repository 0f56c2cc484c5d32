// The model architectures sluice serves, as one table: what the TypeScript side (the checkpoint
// reader, the ONNX exporter) and the model maker (models/) know of each family. The native reader
// (kArchitectures in native/src/model/model_config.cpp) is its C++ mirror; test/architectures.test.ts
// checks that both list the same families with the same model_type and optional pieces.
//
// Adding a family: an entry here (and in the C++ table), then what its forward pass needs.

export interface ArchitectureSpec {
  /** config.json's model_type for this family (the native reader assumes it when absent). */
  modelType: string;
  /** The q, k and v projections carry biases whatever attention_bias says (Qwen2). */
  qkvBias: boolean;
  /** q and k are RMS-normalised per head before rope (Qwen3). */
  qkNorm: boolean;
  /**
   * What turns sliding-window attention on in config.json: `sliding_window` being set (Mistral),
   * or `use_sliding_window: true` (the Qwen families; Llama has neither and never slides).
   */
  slidingWindowBy: 'sliding_window' | 'use_sliding_window';
  /** The family's own config.json fields, as transformers writes them (the model maker). */
  configFields(shape: { numLayers: number; maxPositionEmbeddings: number; slidingWindow?: number | null }): Record<string, unknown>;
}

export const ARCHITECTURES = {
  LlamaForCausalLM: {
    modelType: 'llama', qkvBias: false, qkNorm: false, slidingWindowBy: 'use_sliding_window',
    configFields: () => ({ attention_bias: false, mlp_bias: false, pretraining_tp: 1 }),
  },
  MistralForCausalLM: {
    modelType: 'mistral', qkvBias: false, qkNorm: false, slidingWindowBy: 'sliding_window',
    configFields: (s) => ({ sliding_window: s.slidingWindow }),
  },
  Qwen2ForCausalLM: {
    modelType: 'qwen2', qkvBias: true, qkNorm: false, slidingWindowBy: 'use_sliding_window',
    configFields: (s) => ({ max_window_layers: s.numLayers, sliding_window: s.maxPositionEmbeddings, use_sliding_window: false }),
  },
  Qwen3ForCausalLM: {
    modelType: 'qwen3', qkvBias: false, qkNorm: true, slidingWindowBy: 'use_sliding_window',
    configFields: (s) => ({ attention_bias: false, max_window_layers: s.numLayers, sliding_window: null, use_sliding_window: false }),
  },
} as const satisfies Record<string, ArchitectureSpec>;

export type Architecture = keyof typeof ARCHITECTURES;

export const SUPPORTED_ARCHITECTURES = Object.keys(ARCHITECTURES) as Architecture[];

/** The spec of an architecture name from config.json, or undefined when sluice does not serve it. */
export function architectureSpec(name: unknown): ArchitectureSpec | undefined {
  return typeof name === 'string' && Object.hasOwn(ARCHITECTURES, name) ? ARCHITECTURES[name as Architecture] : undefined;
}

/** The spec of the family whose model_type this is (config.json without `architectures`). */
export function specOfModelType(modelType: unknown): ArchitectureSpec | undefined {
  return Object.values(ARCHITECTURES).find((a) => a.modelType === modelType);
}

/** Whether config.json turns sliding-window attention on, read the way the family spells it. */
export function usesSlidingWindow(spec: ArchitectureSpec | undefined, config: Record<string, unknown>): boolean {
  return spec?.slidingWindowBy === 'sliding_window'
    ? config['sliding_window'] !== undefined && config['sliding_window'] !== null
    : config['use_sliding_window'] === true;
}
