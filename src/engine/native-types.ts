// The typed boundary to the native addon (native/addon). Only src/engine/native.ts loads the
// .node file; everything else sees these types. Plans and results cross as typed arrays.

export type BackendName = 'cpu' | 'cuda';
export type MatmulPrecision = 'f32' | 'bf16';

export interface NativeLoadOptions {
  /** Hugging Face model directory (config.json, *.safetensors). */
  modelDir: string;
  backend: BackendName;
  /** Bytes for the paged KV cache pool (0: the backend's default; CUDA: from gpuMemoryUtilization). */
  kvCacheBytes: number;
  /** Tokens per KV block. */
  blockSize: number;
  /** Compute threads (0 = all online CPUs). */
  numThreads: number;
  /** Activation precision against bf16 weights (see EngineOptions::matmul_precision). */
  matmulPrecision?: MatmulPrecision;
  /** CUDA: fraction of device memory the engine may hold; the KV pool gets what weights leave. */
  gpuMemoryUtilization?: number;
  /** Keep full KV blocks cached and start new sequences after their longest cached prefix (default true). */
  prefixCaching?: boolean;
  /** Secret key of the keyed prefix-block hash: 32 hex digits (16 bytes). Default all zero. */
  prefixHashKey?: string;
}

/** What the native engine reports about the loaded model and its KV pool. */
export interface NativeModelInfo {
  architecture: string;        // e.g. "LlamaForCausalLM"
  modelType: string;           // config.json model_type
  weightDtype: 'f32' | 'f16' | 'bf16';
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  contextLength: number;       // max_position_embeddings
  weightBytes: number;         // bytes of all weight tensors as stored
  kvCacheBytes: number;        // bytes actually allocated for the pool
  blockSize: number;
  numBlocks: number;
  backend: BackendName;
  simd: string;                // CPU kernel level picked at run time, e.g. "avx512bf16"; CUDA: the device
  numThreads: number;
  matmulPrecision: MatmulPrecision;
  deviceBytes: number;         // accelerator memory held (CUDA: weights + activations + KV), 0 on CPU
  prefixCaching?: boolean;     // whether the engine reuses cached prefix blocks
  /** Set once a device fault put the engine out of service (every later step or add fails). */
  brokenReason?: string;
}

export interface NativeSamplingParams {
  temperature: number;         // 0 = greedy
  topP: number;                // 1 = off
  topK: number;                // 0 = off
  seed: bigint;                // per-sequence RNG seed
  logprobs: number;            // top-N logprobs to return per sampled token (0 = chosen token only)
}

/**
 * One step: for each i, sequence seqIds[i] computes numTokens[i] more of its known tokens
 * (prompt chunk while prefilling, 1 while decoding). A sequence whose known tokens are all
 * computed after the step samples one new token, which the engine appends to it.
 */
export interface NativeStepPlan {
  seqIds: Uint32Array;
  numTokens: Uint32Array;
}

/** A row of a step that failed on its own (the other rows ran); its sequence gained nothing. */
export interface NativeRowError {
  seqId: number;
  /** Native error code, e.g. SEQ_UNKNOWN, INVALID_ARGUMENT, INTERNAL. */
  code: string;
  message: string;
}

/** Where injectFault makes a step fail (tests of the isolation guarantees). */
export type NativeFaultPoint = 'prepare' | 'sample' | 'device';

/** Sampled tokens of one step, one row per sequence that sampled. */
export interface NativeStepResult {
  seqIds: Uint32Array;         // [n]
  tokens: Int32Array;          // [n]
  logprobs: Float32Array;      // [n] log-softmax of the raw logits at the sampled token
  topN: number;                // width of the top arrays
  topIds: Int32Array;          // [n * topN]
  topLogprobs: Float32Array;   // [n * topN]
  /** Rows that failed on their own, not in seqIds (absent or empty when none did). */
  errors?: NativeRowError[];
}

export interface NativeEngineHandle {
  info(): NativeModelInfo;
  /**
   * Registers a sequence with its prompt. Throws (code SEQ_EXISTS) if the id is in use. Returns
   * the prompt tokens served from the prefix cache (whole blocks, at most length - 1): the
   * sequence's computed-token count to start from. 0 without a hit or with prefix caching off.
   * keyed (default false): the request had a prompt cache key; once unreferenced, its cached
   * blocks are evicted only after every unkeyed cached block. cacheScope (default ''): the owner of
   * its cached blocks (an organization id); other scopes never hit them. Throws (code
   * INVALID_ARGUMENT) for a prompt or sampling parameter the engine cannot hold: that sequence only.
   */
  addSequence(seqId: number, promptTokens: Int32Array, sampling: NativeSamplingParams, keyed?: boolean,
    cacheScope?: string): number;
  /**
   * Frees a sequence and its KV blocks; unknown ids are ignored (safe to call twice). Its full
   * blocks stay cached for later prefix hits and count as free (evicted when a step needs room).
   */
  freeSequence(seqId: number): void;
  numFreeBlocks(): number;
  /** KV blocks a sequence holds now (0 for unknown ids). */
  numSequenceBlocks(seqId: number): number;
  /**
   * Runs off the JS thread. A bad row is reported in result.errors and the others run. Rejects
   * with code NO_KV_BLOCKS (nothing done) when the plan does not fit, DEVICE_FAULT when the device
   * failed for good (the engine is broken: later calls reject with ENGINE_BROKEN).
   */
  step(plan: NativeStepPlan): Promise<NativeStepResult>;
  /** Testing hook: the next step holding seqId fails that row at `point` ('device': the next step, whole). */
  injectFault?(seqId: number, point: NativeFaultPoint): void;
  /** Releases weights and the KV pool; safe to call twice. */
  dispose(): void;
}
