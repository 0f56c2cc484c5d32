// The typed boundary to the native addon (native/addon). Only src/native/native.ts loads the
// .node file; everything else sees these types. Plans and results cross as typed arrays.

/** 'onnx': an ONNX export run by onnxruntime-node's CPU execution provider (src/native/onnx), not the native addon. */
export type BackendName = 'cpu' | 'cuda' | 'onnx';
export type MatmulPrecision = 'f32' | 'bf16';
export type CudaGemm = 'native' | 'cublaslt' | 'auto';
/** CUDA kernels of issue 32 behind flags (EngineOptions::cuda_attention / cuda_sampler). */
export type CudaAttention = 'paged' | 'flash';
export type CudaSampler = 'block' | 'wide';
/** Weights as stored ('none') or quantized at load to Q8_0 blocks ('int8', CPU only). */
export type Quantization = 'none' | 'int8' | 'fp8';
/** The KV cache's element type (EngineOptions::kv_cache_dtype): the activations' float type, or OCP e4m3 with per-layer scales. */
export type KvCacheDtype = 'auto' | 'fp8' | 'fp8_e4m3';

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
  /** Weight quantization at load (see EngineOptions::quantization). */
  quantization?: Quantization;
  /** The KV cache's element type (default 'auto'); 'fp8' holds twice the blocks of bf16 in the same bytes. */
  kvCacheDtype?: KvCacheDtype;
  /**
   * CUDA: fraction of device memory the engine may hold; the KV pool gets what weights and
   * activations leave. Engines on one device must split it (fractions adding up to at most 1).
   */
  gpuMemoryUtilization?: number;
  /** CUDA GEMMs of more than 8 tokens: our kernels, cuBLASLt loaded at run time, or cuBLASLt where present. */
  cudaGemm?: CudaGemm;
  /** CUDA attention: 'paged' (default) or the tensor-core 'flash' kernels, prefill and decode (awaiting their first device run). */
  cudaAttention?: CudaAttention;
  /** CUDA sampling: 'block' (default, one block per row) or 'wide' (many blocks per row; awaiting its first device run). */
  cudaSampler?: CudaSampler;
  /** The scheduler's limits; CUDA sizes its activations for them at load (0: the backend's default). */
  maxNumSeqs?: number;
  maxBatchedTokens?: number;
  /** Keep full KV blocks cached and start new sequences after their longest cached prefix (default true). */
  prefixCaching?: boolean;
  /** Secret key of the keyed prefix-block hash: 32 hex digits (16 bytes). Default all zero. */
  prefixHashKey?: string;
  /**
   * Pipelined steps (EngineOptions::cuda_device_tokens, default false until measured on a GPU):
   * sampled tokens stay on the device and the addon begins step N+1 before N's tokens reach the
   * host. On the CPU it runs the same engine path with host-resolved tokens (tests only).
   */
  cudaDeviceTokens?: boolean;
  /** CUDA: capture the decode graph of every batch bucket up to maxNumSeqs at load (default false). */
  cudaGraphsAtLoad?: boolean;
  /** CUDA: steps with prefill chunks under graphs too, captured in pieces around attention (default false). */
  cudaMixedGraphs?: boolean;
  /**
   * Speculative decoding with an EAGLE-3 head (its directory, in the published layout): the engine
   * keeps the head's context from every step's hidden states and drafts for the rows that ask
   * (NativeStepPlan.numNextDrafts). CPU backend only.
   */
  eagle3Dir?: string;
  /** LoRA adapters in PEFT's layout (issue 36); NativeSequenceAdd.adapter i + 1 is loraAdapters[i]. CPU and CUDA backends. */
  loraAdapters?: string[];
  /** Device bytes kept out of the KV pool for the adapters' device copies (CUDA; the CPU ignores it). */
  loraReserveBytes?: number;
}

/** What the native engine reports about the loaded model and its KV pool. */
export interface NativeModelInfo {
  architecture: string;        // e.g. "LlamaForCausalLM"
  modelType: string;           // config.json model_type
  weightDtype: 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4' | 'f8_e4m3';  // the projections as held (q8_0: --quantization int8 or 8-bit GPTQ; q4: AWQ / GPTQ 4-bit; f8_e4m3: FP8 on CUDA)
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  contextLength: number;       // max_position_embeddings
  weightBytes: number;         // bytes of all weight tensors as stored
  kvCacheBytes: number;        // bytes actually allocated for the pool
  kvCacheDtype: 'f32' | 'f16' | 'bf16' | 'f8_e4m3';  // what the pool holds (f8_e4m3: kvCacheDtype 'fp8')
  blockSize: number;
  numBlocks: number;
  backend: BackendName;
  simd: string;                // CPU kernel level picked at run time, e.g. "avx512bf16"; CUDA: the device
  numThreads: number;
  matmulPrecision: MatmulPrecision;
  deviceBytes: number;         // accelerator memory held (CUDA: weights + activations + KV), 0 on CPU
  prefixCaching?: boolean;     // whether the engine reuses cached prefix blocks
  /** Whether steps verify NativeStepPlan.drafts (the CPU engine); otherwise drafts are ignored. */
  draftVerification?: boolean;
  /** The EAGLE-3 head loaded with eagle3Dir: its draft vocabulary, the target layers it reads, its bytes. */
  eagle3?: { draftVocabSize: number; auxLayers: number[]; weightBytes: number; kvBytes: number };
  /** The LoRA adapters loaded (by id: NativeLoadOptions.loraAdapters 1.., then loadAdapter's): rank and f32 bytes (and the facade's name). */
  loraAdapters?: { id?: number; name?: string; rank: number; bytes: number }[];
  /**
   * Models with sliding-window layers on the CPU: the widest window (tokens), and the blocks of
   * those layers' KV, kept apart from numBlocks (the full-attention layers'): a sequence holds
   * only the ones its window reads. kvCacheBytes counts both. Absent otherwise.
   */
  window?: number;
  numWindowBlocks?: number;
  windowBlocksInUse?: number;
  windowKvBytes?: number;
  /** Set once a device fault put the engine out of service (every later step or add fails). */
  brokenReason?: string;
}

export interface NativeSamplingParams {
  temperature: number;         // 0 = greedy
  topP: number;                // 1 = off
  topK: number;                // 0 = off
  seed: bigint;                // per-sequence RNG seed
  logprobs: number;            // top-N logprobs to return per sampled token (0 = chosen token only)
  minP?: number;               // vLLM's min_p in [0, 1]; 0 or absent = off (sluice::SamplingParams::min_p)
}

/** A sequence registered at the start of a step (StepPlan.adds). */
export interface NativeSequenceAdd {
  seqId: number;
  promptTokens: Int32Array;
  sampling: NativeSamplingParams;
  /** The request had a prompt cache key: once unreferenced, its cached blocks are evicted after every unkeyed one. */
  keyed?: boolean;
  /** The owner of its cached blocks (an organization id); other scopes never hit them. Default ''. */
  cacheScope?: string;
  /** Vision-language models: the prompt's images, in prompt order (sluice::SequenceImage). */
  images?: readonly NativeSequenceImage[];
  /** The LoRA adapter (1-based index into NativeLoadOptions.loraAdapters); 0 or absent: the base model. */
  adapter?: number;
}

/**
 * An image in a prompt: its encoder output replaces the input rows of gridH * gridW placeholder
 * tokens (the model's image token) from promptTokens[offset], row-major; M-RoPE positions follow
 * the grid. `hash`: SHA-256 of the pixels fed to the encoder (prefix-cache blocks holding the
 * image are keyed by it).
 */
export interface NativeSequenceImage {
  offset: number;
  gridH: number;
  gridW: number;
  /** [gridH * gridW, hidden_size] */
  embeds: Float32Array;
  hash: Uint8Array;
}

/**
 * One step, the whole boundary between the scheduler and the engine. The engine applies, in order:
 * `frees` (ended or preempted sequences; unknown ids ignored); the rows of sequences it already
 * has claim their KV blocks (a row that does not fit is skipped: rowStatus NO_KV_BLOCKS); each
 * add maps its cached prefix and is admitted only when its whole prompt's remaining blocks fit
 * (else addStatus NO_KV_BLOCKS, nothing kept), its rows claiming their blocks at once; then the
 * forward pass and sampling. Row i computes at most numTokens[i] of seqIds[i]'s uncomputed tokens
 * (fewer when fewer are left: a plan made ahead of the last result stays valid); a row that
 * computes its sequence's last known token samples one new token, which the engine appends.
 */
export interface NativeStepPlan {
  seqIds: Uint32Array;
  numTokens: Uint32Array;
  frees?: Uint32Array;
  adds?: NativeSequenceAdd[];
  /**
   * Sequences whose next sample is constrained (structured outputs); their token masks come later,
   * through provideMasks(maskSlot, ...), while the step's forward pass runs.
   */
  constrained?: Uint32Array;
  maskSlot?: number;
  /**
   * Speculative decoding: row i proposes numDrafts[i] tokens to follow its pending token, drafts
   * flat in row order. A decode row of an unconstrained sequence computes them with its pending
   * token (numTokens[i] must allow 1 + drafts; they are cut to it and to the context) and gains the
   * accepted ones plus one sampled token, each from the distribution a token-by-token run samples
   * (greedy: the same tokens). Other rows, and engines without draftVerification, ignore them.
   */
  numDrafts?: Uint32Array;
  drafts?: Int32Array;
  /** An engine with an EAGLE-3 head: row i asks for up to numNextDrafts[i] drafts to follow the token it samples. */
  numNextDrafts?: Uint32Array;
}

/** rowStatus values. */
export const ROW_RAN = 0;
export const ROW_NO_KV_BLOCKS = 1;
export const ROW_FAILED = 2;
/** addStatus values. */
export const ADD_ADMITTED = 0;
export const ADD_NO_KV_BLOCKS = 1;
export const ADD_FAILED = 2;

/** A row of a step that failed on its own (the other rows ran); its sequence gained nothing. */
export interface NativeRowError {
  seqId: number;
  /** Native error code, e.g. SEQ_UNKNOWN, INVALID_ARGUMENT, INTERNAL. */
  code: string;
  message: string;
}

/** Where injectFault makes a step fail (tests of the isolation guarantees). */
export type NativeFaultPoint = 'prepare' | 'sample' | 'device';

/** What one step did: sampled tokens per sampling row, and every per-row and per-add outcome as a value. */
export interface NativeStepResult {
  seqIds: Uint32Array;         // [m] sequences that sampled, plan order (a verifying row's tokens in position order)
  tokens: Int32Array;          // [m]
  logprobs: Float32Array;      // [m] log-softmax of the raw logits at the sampled token
  topN: number;                // width of the top arrays
  topIds: Int32Array;          // [m * topN]
  topLogprobs: Float32Array;   // [m * topN]
  /** Rows and adds that failed on their own (ROW_FAILED / ADD_FAILED), with the native code. */
  errors: NativeRowError[];
  rowStatus: Uint8Array;       // [n] ROW_*
  rowComputed: Uint32Array;    // [n] tokens computed by this step
  rowPending: Uint32Array;     // [n] known but uncomputed tokens after it (1 after a sample)
  rowBlocks: Uint32Array;      // [n] KV blocks the sequence holds after it
  rowDrafted?: Uint32Array;    // [n] drafts the row verified (absent: an engine that verifies none)
  rowAccepted?: Uint32Array;   // [n] of those, accepted (rowComputed = 1 + accepted)
  /** EAGLE-3 (numNextDrafts): row i's drafts to follow its last sampled token, nextDrafts flat in row order. */
  rowNextDrafts?: Uint32Array;
  nextDrafts?: Int32Array;
  addStatus: Uint8Array;       // [a] ADD_*
  addCached: Int32Array;       // [a] prompt tokens served from the prefix cache (-1 unless admitted)
  /** The pool after the step: blocks an allocation can get (free + evictable). */
  numFreeBlocks: number;
  numEvictableBlocks: number;
  numCachedBlocks: number;
}

export interface NativeEngineHandle {
  /** Waits for a running step (the facade reads it once, at load). */
  info(): NativeModelInfo;
  /**
   * Runs one plan off the JS thread. Steps are queued and run in submission order, so step N+1
   * may be submitted while step N runs (the engine starts it without waiting for JavaScript).
   * Rejects only for a malformed plan or a fault of the whole step: DEVICE_FAULT when the device
   * failed for good (the engine is broken: later steps reject with ENGINE_BROKEN).
   */
  step(plan: NativeStepPlan): Promise<NativeStepResult>;
  /**
   * The token masks of a submitted step's constrained rows: constrained.length rows of
   * ceil(vocabSize / 32) words (bit v = token v allowed), or null when they will not come (those
   * rows fail). The step waits for them before sampling (at most 60 s). One call per slot.
   */
  provideMasks(maskSlot: number, masks: Uint32Array | null): void;
  /** Testing hook: the next step holding seqId fails that row at `point` ('device': the next step, whole). */
  injectFault?(seqId: number, point: NativeFaultPoint): void;
  /**
   * LoRA adapters while serving (native engines with serial steps): loadAdapter reads one (on the
   * pool) and installs it in its turn among the steps; retireAdapter takes it from new sequences
   * (those using it finish with it). Ids are NativeSequenceAdd.adapter values.
   */
  loadAdapter?(dir: string): Promise<{ id: number; rank: number; bytes: number }>;
  retireAdapter?(id: number): Promise<void>;
  /** What loadAdapter checks (config, tensor names, dtypes, shapes), without reading the matrices. */
  checkAdapter?(dir: string): Promise<{ rank: number; bytes: number }>;
  /** Releases weights and the KV pool; safe to call twice. */
  dispose(): void;
}
