// The engine facade: load a model directory, turn requests into prompt tokens, run them through
// the continuous-batching loop, and return text. Library users and the API layer see only this.

import { createHash, randomBytes } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { isSluiceError, SluiceError } from '../errors.js';
import { Batcher } from '../scheduler/batcher.js';
import { SCHEDULING_WINDOWS, WindowPriorityPolicy, windowPriority, type SchedulingWindow } from '../scheduler/window-policy.js';
import { EngineObservers, type EngineObserver, type KvPoolCounts, type RequestReport } from './engine-events.js';
import { PromptEncoder, promptTextLength, type PromptText } from '../text/prompt-encoder.js';
import { PromptPool, sharedPromptPool } from '../text/prompt-pool.js';
import { Generation } from './generation.js';
import { cudaUnavailableReason, loadNativeEngine, nativeAddon, nativeUnavailableReason } from '../native/native.js';
import type { BackendName, CudaAttention, CudaGemm, CudaSampler, KvCacheDtype, MatmulPrecision, NativeEngineHandle, NativeModelInfo, Quantization } from '../native/native-types.js';
import {
  checkPromptTokenIds, promptSource, resolveMaxTokens, validateOptions,
  type GenerateChunk, type GenerateRequest, type GenerateResult, type TokenLogprob,
} from './request.js';
import type { FinishReason } from '../text/stops.js';
import { readJsonFile, SluiceTokenizer } from '../text/tokenizer.js';
import { StructuredOutputs } from '../structured/structured-outputs.js';
import type { TokenConstraint } from '../structured/token-constraint.js';
import { promptOpensThinking, ThinkingConstraint, type ThinkingTags } from '../structured/thinking.js';
import { readWeightsAhead } from './weight-files.js';
import { specOfConfig, textConfigOf } from './architectures.js';
import { loadOnnxHandle, servesOnnxByDefault } from '../native/onnx/onnx-backend.js';
import type { NativeSequenceImage } from '../native/native-types.js';
import type { ChatMessage } from '../text/chat-template.js';
import { placeImages, VisionModel, type PreparedImage } from '../vision/vision-model.js';
import { EncodingCache } from '../vision/encoding-cache.js';
import { EncodeQueue } from '../vision/encode-queue.js';
import { imageTextExpansion, type ImageTextExpansion } from '../text/image-prompt.js';
import { type SpeculationStats, type SpeculativeOptions, Speculator, speculativeOptions } from '../scheduler/speculator.js';
import { DraftModelSpeculator } from '../scheduler/draft-speculator.js';
import { AdapterSet, declaredAdapterBytes, MAX_KNOWN_ADAPTERS, MAX_RESIDENT_ADAPTERS, type AdapterSetStats, type AdapterStatus } from './adapter-set.js';

export interface EngineLoadOptions {
  /** Hugging Face model directory. */
  model: string;
  /**
   * 'auto' (default): cuda when the addon has it and a device is usable, else cpu (info.cudaUnavailableReason
   * says why); onnx when the directory holds an ONNX export (onnx/model.onnx) and no safetensors.
   * 'onnx': the ONNX export through onnxruntime-node's CPU execution provider (src/native/onnx/onnx-handle.ts).
   */
  backend?: BackendName | 'auto';
  /** KV cache pool size. Default: CPU, see defaultKvCacheBytes; CUDA, what gpuMemoryUtilization leaves. */
  kvCacheBytes?: number;
  /** CUDA: fraction of the device's memory for weights, activations and KV (default 0.9, as vLLM). */
  gpuMemoryUtilization?: number;
  /**
   * CUDA GEMMs of more than 8 tokens: 'native' (default, our tensor-core kernels), 'cublaslt'
   * (cuBLASLt loaded at run time; an error where the host has no libcublasLt) or 'auto'
   * (cuBLASLt where present). Decode GEMVs (8 tokens or fewer) are ours either way.
   */
  cudaGemm?: CudaGemm;
  /**
   * CUDA kernels of issue 32, off until they pass on a GPU: cudaAttention 'flash' (tensor-core
   * prefill and decode attention; default 'paged') and cudaSampler 'wide' (many blocks per row; default 'block').
   */
  cudaAttention?: CudaAttention;
  cudaSampler?: CudaSampler;
  /**
   * CUDA, off until measured on a GPU (README, "The step loop"): cudaDeviceTokens keeps sampled
   * tokens on the device and begins step N+1 before N's tokens reach the host; cudaGraphsAtLoad
   * captures every decode graph bucket up to maxNumSeqs at load; cudaMixedGraphs runs steps with
   * prefill chunks under graphs too (token buckets, pieces captured around the attention calls).
   */
  cudaDeviceTokens?: boolean;
  cudaGraphsAtLoad?: boolean;
  cudaMixedGraphs?: boolean;
  /** Tokens per KV block (default 16). */
  blockSize?: number;
  /** Compute threads (default 0 = all online CPUs). */
  threads?: number;
  /**
   * How activations meet bf16 weights (CPU, AVX512-BF16): 'f32' (default) tracks an f32
   * computation; 'bf16' rounds activations to bf16 for about twice the prefill / large-batch
   * throughput, as llama.cpp and vLLM do on CPU.
   */
  matmulPrecision?: MatmulPrecision;
  /**
   * Weights (default 'none': as the checkpoint stores them). 'int8' quantizes the matmul weights
   * (projections and lm_head) of a bf16/f16/f32 checkpoint at load into Q8_0 blocks (32 int8
   * values, one scale each), about half the bytes each decoded token reads. CPU only: backend
   * 'auto' then picks the CPU, and backends 'cuda' and 'onnx' refuse it. 'fp8' quantizes the
   * layers' projections of such a checkpoint at load into e4m3 with one scale per output row, run
   * by FP8 GEMMs with per-token activation scales: CUDA only (backend 'auto' needs a usable GPU).
   */
  quantization?: Quantization;
  /**
   * The KV cache's element type (default 'auto': the activations' float type, f32 or bf16 on the
   * CPU, the model's bf16/f16 on CUDA). 'fp8' (alias 'fp8_e4m3') stores OCP e4m3 codes with
   * per-layer scales (the checkpoint's k_scale / v_scale, else 1), as vLLM's --kv-cache-dtype fp8:
   * the same kvCacheBytes hold twice the blocks of a bf16 cache. Native backends only.
   */
  kvCacheDtype?: KvCacheDtype;
  /**
   * Vision-language models: bytes of recently encoded images kept per engine, so the same image
   * sent again by the same tenant is not encoded again (default 128 MiB; 0 turns it off).
   */
  imageCacheBytes?: number;
  /**
   * Prefix caching (default true): full KV blocks stay cached after their sequences end and a new
   * request starts after its longest cached prompt prefix (usage.cachedTokens); false computes
   * every prompt in full (benchmarks comparing on and off).
   */
  prefixCaching?: boolean;
  /**
   * Secret key of the prefix-cache block hash (SipHash-2-4): 32 hex digits. Default: random per
   * load. A service passes its deployment's persisted key so that hashes are stable across restarts
   * and replicas, and unpredictable to callers.
   */
  prefixHashKey?: string;
  /** Tokens per step. Default: CPU 512; CUDA 8192 (activations are sized for it at load). */
  maxBatchedTokens?: number;
  /** Sequences running at once. Default: CPU 64; CUDA 256 (as vLLM). */
  maxNumSeqs?: number;
  /**
   * How flex work yields to asap and standard work (see DeferralGuard in src/scheduler/planner.ts): while one of
   * those runs or waits, or did within `holdMs`, flex gets at most `rowsPerStep` decode rows per
   * step and no admissions or prefill. Default { rowsPerStep: 8, holdMs: 1000 } on the CPU and
   * { rowsPerStep: 32, holdMs: 1000 } on CUDA (DEFAULT_FLEX_DEFERRAL); false turns it off.
   */
  flexDeferral?: { rowsPerStep: number; holdMs: number } | false;
  /**
   * How a tenant flooding a window yields to the other tenants with work in it (see
   * src/scheduler/tenant-share.ts): its rows get no tokens in a step that prefills another tenant's
   * request and at most `rowsPerStep` tokens per step otherwise, while the others are active or
   * were within `holdMs`. Default { rowsPerStep: 16, holdMs: 1000 }; false turns it off.
   */
  tenantDeferral?: { rowsPerStep: number; holdMs: number } | false;
  /**
   * Plan step N+1 while step N runs: the engine starts the next step without waiting for this
   * thread. Default: on for CUDA (the device computes while the host plans); off for the CPU,
   * where the event loop and the compute threads share the cores, so overlapping them slows the
   * step more than the ~1% of planning it hides. Same outputs either way.
   */
  overlapSteps?: boolean;
  /**
   * Speculative decoding (src/scheduler/speculator.ts): `{ method: 'ngram', numSpeculativeTokens: K }`
   * proposes up to K tokens per decode row by prompt lookup and verifies them in the row's step;
   * `{ method: 'draft', draftModel: DIR }` runs a draft model, `{ method: 'eagle3', draftModel: DIR }`
   * an EAGLE-3 head (in the published layout) inside the engine;
   * greedy output is unchanged, sampled output keeps its distribution. CPU backend, or CUDA with
   * the block sampler and serial steps (an EAGLE-3 head: CPU only for now). Default: off.
   */
  speculative?: SpeculativeOptions;
  /**
   * LoRA adapters in PEFT's layout (issue 36), by name: loaded beside the model (CPU and CUDA backends) and
   * chosen per request (GenerateRequest.adapter). Sequences of many adapters and of the base model
   * share every step; their prefix-cache blocks are never shared. At most 256 (4096 with
   * loraMemoryBytes, at most 256 of them resident at once).
   */
  loraAdapters?: Record<string, string>;
  /**
   * A memory budget for the adapters' weights in the engine (f32 bytes): with it, adapters are
   * known by name and resident on demand; a request for one that is not resident loads it, first
   * retiring the least recently used idle adapters (src/engine/adapter-set.ts). Needs serial steps
   * (overlap is off with it). Default: no budget, every adapter resident.
   */
  loraMemoryBytes?: number;
  /** Notices such as an engine put out of service. Default: written to stderr. */
  onMessage?: (message: string) => void;
  /**
   * Progress of loading a large checkpoint: given, the weight files are read once ahead of the
   * native load (weight-files.ts) when they hold at least `readAheadMinBytes` (default 256 MiB)
   * and fit in memory, reporting the bytes read from 0 to the total.
   */
  onLoadProgress?: (doneBytes: number, totalBytes: number) => void;
  readAheadMinBytes?: number;
}

export interface EngineInfo extends NativeModelInfo {
  modelDir: string;
  /**
   * With backend 'auto' on the CPU: why CUDA was not used (no CUDA backend in this build, or no
   * usable device). Not a warning: auto means the CPU is a fine answer.
   */
  cudaUnavailableReason?: string;
  eosTokenIds: number[];
  hasChatTemplate: boolean;
  maxBatchedTokens: number;
  maxNumSeqs: number;
  /** Prompt + generated tokens one sequence can hold in the KV pool. */
  maxSequenceTokens: number;
  /** The model takes images in its prompts (a vision-language checkpoint: Engine.vision). */
  imageInput: boolean;
}

export interface SchedulerStats {
  /** Sequences holding KV blocks (prefilling or decoding). */
  numRunning: number;
  /** Sequences queued for admission, preempted ones included. */
  numWaiting: number;
  /** Steps submitted since load. */
  numSteps: number;
  /** Milliseconds the step loop spent on this thread (planning, applying results) since load. */
  loopMs: number;
  /** Speculative decoding: drafts verified and accepted since load (absent without it). */
  speculation?: SpeculationStats;
  /** Sequences running and waiting per completion window. */
  byWindow: Record<SchedulingWindow, { numRunning: number; numWaiting: number }>;
  /** The KV pool as the last step reported it. */
  kvPool: KvPoolCounts;
}

const GiB = 1024 ** 3;
const DEFAULT_BLOCK_SIZE = 16;
/**
 * Batch limits per backend. A CPU step costs about its rows (a bigger batch only adds latency past
 * a few dozen rows); a GPU step's cost is mostly the weights, so hundreds of rows and thousands of
 * tokens per step are nearly free.
 */
const BATCH_LIMITS = {
  cpu: { maxNumSeqs: 64, maxBatchedTokens: 512 },
  cuda: { maxNumSeqs: 256, maxBatchedTokens: 8192 },
  onnx: { maxNumSeqs: 32, maxBatchedTokens: 512 },
} as const;
/**
 * Flex rows allowed per step while urgent work runs, per backend. A CPU step costs about its rows,
 * so a few. A GPU decode step costs mostly the weights it streams (8B bf16: ~16 GB a step against
 * ~0.1 GB of KV per 8 rows at a few hundred tokens of context), so flex keeps more rows nearly for
 * free. NOTE: the CUDA figure is reasoned from the step's bytes, not yet measured (bench:serve's
 * tier case on a GPU is the check).
 */
const DEFAULT_FLEX_DEFERRAL = {
  cpu: { rowsPerStep: 8, holdMs: 1000 }, cuda: { rowsPerStep: 32, holdMs: 1000 }, onnx: { rowsPerStep: 8, holdMs: 1000 },
} as const;
const DEFAULT_IMAGE_CACHE_BYTES = 128 * 1024 * 1024;
const DEFAULT_TENANT_DEFERRAL = { rowsPerStep: 16, holdMs: 1000 };

/**
 * Inputs up to this many characters are rendered and tokenized on the caller's thread (about 10 ms
 * at worst); longer ones on a prompt worker (prompt-pool.ts).
 */
export const INLINE_PROMPT_CHARS = 2048;

export class Engine {
  readonly info: EngineInfo;
  /** The LoRA adapters: known by name, resident within the budget. */
  private readonly adapterSet: AdapterSet;
  private readonly encoder: PromptEncoder;
  /** The vision tower's queue: batches filled fairly across tenants, with recent encodings cached. */
  private readonly imageEncoder: EncodeQueue | undefined;
  private disposed = false;

  private constructor(
    readonly tokenizer: SluiceTokenizer,
    private readonly handle: NativeEngineHandle,
    private readonly batcher: Batcher,
    modelDir: string,
    private readonly observers: EngineObservers,
    /** The vision tower and preprocessor of a vision-language model. */
    readonly vision: VisionModel | undefined,
    imageText?: ImageTextExpansion,
    imageCacheBytes = DEFAULT_IMAGE_CACHE_BYTES,
    /** The LoRA adapters loaded with the native engine, in its order (adapter i + 1), by name. */
    adapterDirs: readonly (readonly [string, string])[] = [],
    loraMemoryBytes?: number,
  ) {
    this.adapterSet = new AdapterSet(handle.loadAdapter && handle.retireAdapter && handle.checkAdapter && {
      load: (dir) => handle.loadAdapter!(dir).catch((err: unknown) => { throw nativeToSluiceError(err, 'dir'); }),
      retire: (id) => handle.retireAdapter!(id),
      check: (dir) => handle.checkAdapter!(dir).catch((err: unknown) => { throw nativeToSluiceError(err, 'dir'); }),
    }, loraMemoryBytes);
    adapterDirs.forEach(([name, dir], i) => this.adapterSet.adopt(name, dir, { id: i + 1, ...handle.info().loraAdapters![i]! }));
    this.imageEncoder = vision && new EncodeQueue((images) => vision.encodeMany(images), new EncodingCache(imageCacheBytes));
    this.info = {
      ...handle.info(),
      imageInput: vision !== undefined,
      modelDir,
      eosTokenIds: [...tokenizer.eosTokenIds],
      hasChatTemplate: tokenizer.chatTemplate !== undefined,
      maxBatchedTokens: batcher.maxBatchedTokens,
      maxNumSeqs: batcher.maxNumSeqs,
      maxSequenceTokens: batcher.maxSequenceTokens,
    };
    // The adapters known now (resident or not), by name.
    const adapterSet = this.adapterSet;
    Object.defineProperty(this.info, 'loraAdapters', {
      enumerable: true,
      get: () => (adapterSet.stats().loads === 0 ? undefined : adapterSet.list().map(({ name, rank, bytes }) => ({ name, rank, bytes }))),
    });
    this.encoder = new PromptEncoder(tokenizer, modelDir, imageText);
  }

  /** Loads tokenizer and weights. Errors are SluiceError (model_file_missing, backend_unavailable, ...). */
  static async load(opts: EngineLoadOptions): Promise<Engine> {
    if (typeof opts?.model !== 'string' || opts.model === '') {
      throw new SluiceError('invalid_argument', 'model must be the path of a model directory', { param: 'model' });
    }
    const modelDir = resolve(opts.model);
    const dirStat = await stat(modelDir).catch(() => undefined);
    if (!dirStat?.isDirectory()) {
      throw new SluiceError('model_file_missing', `model directory ${modelDir} does not exist`, { param: 'model' });
    }
    const config = (await readJsonFile(modelDir, 'config.json', { required: true }))!;
    const tokenizer = await SluiceTokenizer.load(modelDir);
    const onMessage = opts.onMessage ?? ((message: string) => process.stderr.write(`sluice: ${message}\n`));
    const limitsFor = (backend: BackendName) => batchLimits(backend, opts);
    const loraMemoryBytes = loraBudget(opts);
    // Without a budget every adapter is resident: at most the engine's slots.
    const adapterNames = loraAdapterNames(opts.loraAdapters, loraMemoryBytes === undefined ? MAX_RESIDENT_ADAPTERS : MAX_KNOWN_ADAPTERS);
    // With a budget, adapters are added after the load, each within it; without, loaded with the engine.
    const adaptersAtLoad = loraMemoryBytes === undefined ? adapterNames : [];
    const maxNumSeqs = limitsFor('cpu').maxNumSeqs;
    const base = {
      modelDir,
      kvCacheBytes: opts.kvCacheBytes ?? defaultKvCacheBytes(config, maxNumSeqs),
      blockSize: opts.blockSize ?? DEFAULT_BLOCK_SIZE,
      numThreads: opts.threads ?? 0,
      matmulPrecision: opts.matmulPrecision ?? 'f32',
      quantization: opts.quantization ?? 'none',
      kvCacheDtype: opts.kvCacheDtype ?? 'auto',
      gpuMemoryUtilization: opts.gpuMemoryUtilization ?? 0.9,
      cudaGemm: opts.cudaGemm ?? 'auto',
      prefixCaching: opts.prefixCaching ?? true,
      prefixHashKey: opts.prefixHashKey ?? randomBytes(16).toString('hex'),
      // An EAGLE-3 head runs inside the engine, reading its hidden states.
      ...(opts.speculative?.method === 'eagle3' && { eagle3Dir: await eagle3HeadDir(opts.speculative) }),
      ...(adaptersAtLoad.length > 0 && { loraAdapters: adaptersAtLoad.map((n) => opts.loraAdapters![n]!) }),
      // CUDA keeps the adapters' device copies out of the KV pool: the budget, else those loaded now.
      ...((loraMemoryBytes !== undefined || adaptersAtLoad.length > 0) && {
        loraReserveBytes: loraMemoryBytes ?? (await Promise.all(adaptersAtLoad.map((n) => declaredAdapterBytes(opts.loraAdapters![n]!))))
          .reduce((a, b) => a + b, 0),
      }),
    };
    if (!/^[0-9a-f]{32}$/i.test(base.prefixHashKey)) {
      throw new SluiceError('invalid_argument', 'prefixHashKey must be 32 hexadecimal digits (16 bytes)', { param: 'prefixHashKey' });
    }
    // On CUDA the KV pool defaults to what gpuMemoryUtilization leaves (kvCacheBytes 0).
    const cudaBase = {
      ...base, backend: 'cuda' as const, kvCacheBytes: opts.kvCacheBytes ?? 0, ...limitsFor('cuda'),
      cudaDeviceTokens: opts.cudaDeviceTokens ?? false, cudaGraphsAtLoad: opts.cudaGraphsAtLoad ?? false,
      cudaMixedGraphs: opts.cudaMixedGraphs ?? false,
      cudaAttention: opts.cudaAttention ?? 'paged', cudaSampler: opts.cudaSampler ?? 'block',
    };
    if (!['paged', 'flash'].includes(cudaBase.cudaAttention)) {
      throw new SluiceError('invalid_argument', `cudaAttention must be 'paged' or 'flash', got ${String(cudaBase.cudaAttention)}`, { param: 'cudaAttention' });
    }
    if (!['block', 'wide'].includes(cudaBase.cudaSampler)) {
      throw new SluiceError('invalid_argument', `cudaSampler must be 'block' or 'wide', got ${String(cudaBase.cudaSampler)}`, { param: 'cudaSampler' });
    }
    const cpuBase = { ...base, backend: 'cpu' as const, ...limitsFor('cpu') };
    const g = base.gpuMemoryUtilization;
    if (typeof g !== 'number' || !(g > 0 && g <= 1)) {
      throw new SluiceError('invalid_argument', `gpuMemoryUtilization must be in (0, 1], got ${String(g)}`, { param: 'gpuMemoryUtilization' });
    }
    if (base.matmulPrecision !== 'f32' && base.matmulPrecision !== 'bf16') {
      throw new SluiceError('invalid_argument', `matmulPrecision must be 'f32' or 'bf16', got ${String(base.matmulPrecision)}`, { param: 'matmulPrecision' });
    }
    if (!['none', 'int8', 'fp8'].includes(base.quantization)) {
      throw new SluiceError('invalid_argument', `quantization must be 'none', 'int8' or 'fp8', got ${String(base.quantization)}`, { param: 'quantization' });
    }
    if (!['auto', 'fp8', 'fp8_e4m3'].includes(base.kvCacheDtype)) {
      throw new SluiceError('invalid_argument', `kvCacheDtype must be 'auto', 'fp8' or 'fp8_e4m3', got ${String(base.kvCacheDtype)}`, { param: 'kvCacheDtype' });
    }
    if (!['native', 'cublaslt', 'auto'].includes(base.cudaGemm)) {
      throw new SluiceError('invalid_argument', `cudaGemm must be 'native', 'cublaslt' or 'auto', got ${String(base.cudaGemm)}`, { param: 'cudaGemm' });
    }
    checkPositiveInteger(base.kvCacheBytes, 'kvCacheBytes');
    checkPositiveInteger(base.blockSize, 'blockSize');
    if (opts.imageCacheBytes !== undefined && !(Number.isSafeInteger(opts.imageCacheBytes) && opts.imageCacheBytes >= 0)) {
      throw new SluiceError('invalid_argument', `imageCacheBytes must be an integer >= 0, got ${String(opts.imageCacheBytes)}`, { param: 'imageCacheBytes' });
    }
    if (!Number.isInteger(base.numThreads) || base.numThreads < 0) {
      throw new SluiceError('invalid_argument', `threads must be an integer >= 0, got ${base.numThreads}`, { param: 'threads' });
    }
    let requested = opts.backend ?? 'auto';
    if (requested === 'auto' && servesOnnxByDefault(modelDir)) requested = 'onnx';
    // Q8_0 kernels exist on the CPU backend only; backend 'auto' then loads the CPU one.
    if (base.quantization === 'int8' && requested !== 'auto' && requested !== 'cpu') {
      throw new SluiceError('invalid_argument',
        `quantization 'int8' is supported by the cpu backend only, not ${String(requested)}: drop quantization or use backend cpu`, { param: 'quantization' });
    }
    if (base.kvCacheDtype !== 'auto' && requested === 'onnx') {
      throw new SluiceError('invalid_argument',
        `kvCacheDtype '${base.kvCacheDtype}' needs a native backend (cpu or cuda); the onnx backend keeps its KV in f32`, { param: 'kvCacheDtype' });
    }
    if (base.quantization === 'fp8' && requested !== 'auto' && requested !== 'cuda') {
      throw new SluiceError('invalid_argument',
        `quantization 'fp8' is supported by the cuda backend only, not ${String(requested)}: use quantization 'int8' on the cpu`, { param: 'quantization' });
    }
    const noNativeReason = requested === 'onnx' ? undefined : nativeUnavailableReason();
    if (noNativeReason !== undefined) throw new SluiceError('native_unavailable', noNativeReason);

    if (opts.onLoadProgress && requested !== 'onnx') await readWeightsAhead(modelDir, opts.onLoadProgress, opts.readAheadMinBytes);

    let handle: NativeEngineHandle;
    let noCudaReason: string | undefined;
    if (requested === 'onnx') {
      handle = await loadOnnxHandle({ ...base, ...limitsFor('onnx') });
    } else if (requested === 'cuda' || requested === 'cpu') {
      if (requested === 'cuda' && !nativeAddon().cudaCompiled) {
        throw new SluiceError('backend_unavailable',
          'this build of sluice has no CUDA backend; use backend cpu (or rebuild with CUDA)', { param: 'backend' });
      }
      handle = await loadHandle(requested === 'cuda' ? cudaBase : cpuBase);
    } else if (requested === 'auto') {
      // No message on the CPU path: a machine without a GPU is nothing to report at every start.
      // The reason is kept in info.cudaUnavailableReason; callers say which backend runs.
      noCudaReason = nativeAddon().cudaCompiled ? cudaUnavailableReason() : 'this build has no CUDA backend';
      if (base.quantization === 'fp8' && noCudaReason !== undefined) {
        throw new SluiceError('backend_unavailable', `quantization 'fp8' needs the cuda backend, and it is unavailable: ${noCudaReason}`, { param: 'quantization' });
      }
      handle = await loadHandle(noCudaReason === undefined && base.quantization !== 'int8' ? cudaBase : cpuBase);
    } else {
      throw new SluiceError('invalid_argument', `backend must be cpu, cuda, onnx or auto, got ${String(requested)}`, { param: 'backend' });
    }

    let vision: VisionModel | undefined;
    let speculator: Speculator | undefined;
    let engine: Engine;
    try {
      if (opts.speculative?.method === 'draft') {
        speculator = await loadDraftSpeculator(opts.speculative, modelDir, handle, { ...cpuBase, prefixHashKey: base.prefixHashKey });
      }
      // The vision tower runs where the decoder does: a CUDA engine's on its device.
      if (requested !== 'onnx') {
        vision = await VisionModel.load(modelDir, config, base.numThreads, handle.info().backend === 'cuda' ? 'cuda' : 'cpu');
      }
      const flex = opts.flexDeferral === undefined ? DEFAULT_FLEX_DEFERRAL[handle.info().backend] : opts.flexDeferral;
      const tenants = opts.tenantDeferral === undefined ? DEFAULT_TENANT_DEFERRAL : opts.tenantDeferral;
      const observers = new EngineObservers();
      const batcher = new Batcher(handle, {
        onStep: (report) => observers.step(report),
        ...limitsFor(handle.info().backend), policy: new WindowPriorityPolicy(),
        // Speculation drafts only for rows with no step in flight: serial steps when it is on.
        // Adapters loaded on demand (a LoRA budget) are installed between serial steps.
        overlap: opts.overlapSteps ?? (handle.info().backend === 'cuda' && opts.speculative === undefined && loraMemoryBytes === undefined),
        ...(opts.speculative && (speculator ? { speculator } : { speculative: opts.speculative })),
        ...(flex && { deferral: { fromPriority: windowPriority('flex'), ...flex } }),
        ...(tenants && { tenantDeferral: tenants }),
        onBroken: (reason) => onMessage(`the engine of ${modelDir} is out of service and fails every request: ${reason}`),
      });
      engine = new Engine(tokenizer, handle, batcher, modelDir, observers, vision, vision && imageTextExpansion(config, tokenizer),
        opts.imageCacheBytes, adaptersAtLoad.map((n) => [n, opts.loraAdapters![n]!] as const), loraMemoryBytes);
      if (noCudaReason !== undefined) engine.info.cudaUnavailableReason = noCudaReason;
    } catch (err) {
      vision?.dispose();
      speculator?.dispose();
      handle.dispose();
      throw err;
    }
    // With a budget, each adapter is checked and added now (the engine owns every resource from here).
    try {
      for (const name of adaptersAtLoad.length === 0 ? adapterNames : []) await engine.loadAdapter(name, opts.loraAdapters![name]!);
    } catch (err) {
      await engine.dispose();
      throw err;
    }
    return engine;
  }

  /** Runs a request to completion. Rejects with SluiceError (invalid_request, cancelled, ...). */
  /** Why the engine is out of service (a device fault); undefined while it serves. */
  get brokenReason(): string | undefined {
    return this.batcher.brokenReason;
  }

  /**
   * Testing hook for the fault-isolation tests: the next step fails as an unrecoverable device
   * fault, which puts this engine out of service for good.
   */
  injectDeviceFault(): void {
    this.handle.injectFault?.(0, 'device');
  }

  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const tokenIds: number[] = [];
    const logprobs: TokenLogprob[] = [];
    let text = '';
    let last: GenerateChunk | undefined;
    let promptTokenIds: number[] = [];
    for await (const chunk of this.run(req, (ids) => { promptTokenIds = ids; })) {
      text += chunk.text;
      tokenIds.push(...chunk.tokenIds);
      if (chunk.logprobs) logprobs.push(...chunk.logprobs);
      last = chunk;
    }
    if (last?.finishReason === undefined || !last.usage || !last.timings) {
      throw new Error('Engine.generate: the generation ended without a final chunk');
    }
    const result: GenerateResult = {
      text,
      tokenIds,
      promptTokenIds,
      finishReason: last.finishReason as FinishReason,
      usage: last.usage,
      timings: last.timings,
    };
    if (last.stopSequence !== undefined) result.stopSequence = last.stopSequence;
    if (req.logprobs !== undefined) result.logprobs = logprobs;
    return result;
  }

  /**
   * Streams a request: one chunk per generated token, the last with finishReason, usage and
   * timings. Errors (validation included) are thrown from the iteration. Leaving the loop early
   * cancels the request.
   */
  stream(req: GenerateRequest): AsyncIterable<GenerateChunk> {
    return this.run(req, () => {});
  }

  /** Prompt tokens of a request as the engine would run them (chat template and bos applied). */
  promptTokenIds(req: Pick<GenerateRequest, 'prompt' | 'messages' | 'promptTokenIds'>): number[] {
    switch (promptSource(req)) {
      case 'prompt':
        return this.encoder.encode({ prompt: req.prompt! });
      case 'messages':
        return this.encoder.encode({ messages: req.messages! });
      case 'promptTokenIds':
        return checkPromptTokenIds(req.promptTokenIds, this.info.vocabSize);
    }
  }

  /**
   * The longest input text (UTF-16 code units, all messages together) that can fit in
   * `contextLength` tokens: contextLength × the most bytes one token stands for. Longer input is
   * refused before anything renders or tokenizes it.
   */
  maxInputChars(contextLength = this.info.contextLength): number {
    return contextLength * this.tokenizer.maxTokenBytes;
  }

  /**
   * promptTokenIds for untrusted text: the same tokens, but an input over maxInputChars is refused
   * at once (input_too_long), and one over INLINE_PROMPT_CHARS is rendered and tokenized on a
   * prompt worker, never on the event loop. `tenant` orders the workers' queue fairly.
   */
  async preparePrompt(req: PromptText, opts: { contextLength?: number; tenant?: string } = {}): Promise<number[]> {
    const chars = promptTextLength(req);
    const limit = this.maxInputChars(opts.contextLength);
    if (chars > limit) {
      throw new SluiceError('input_too_long',
        `the input has ${chars} characters; this model's context of ${opts.contextLength ?? this.info.contextLength} tokens holds ` +
        `at most ${limit} (${this.tokenizer.maxTokenBytes} per token at most)`, { param: 'input' });
    }
    if (chars <= INLINE_PROMPT_CHARS || !PromptPool.available()) return this.encoder.encode(req);
    return sharedPromptPool().encode(this.info.modelDir, req, opts.tenant ?? '');
  }

  /**
   * What the scheduler holds right now (for metrics and tests; changes with every step). NOTE: no
   * free-block count: the native pool may not be queried while a step runs.
   */
  schedulerStats(): SchedulerStats {
    const { running, waiting } = this.batcher.countsByPriority();
    const byWindow = Object.fromEntries(SCHEDULING_WINDOWS.map((w) => {
      const p = windowPriority(w);
      return [w, { numRunning: running[p] ?? 0, numWaiting: waiting[p] ?? 0 }];
    })) as SchedulerStats['byWindow'];
    return {
      numRunning: this.batcher.numRunning, numWaiting: this.batcher.numWaiting, ...this.batcher.stats, byWindow,
      kvPool: this.batcher.kvPool,
    };
  }

  /**
   * Subscribes to a report per engine step and one per request that reached the scheduler (see
   * engine-events.ts); returns the function that unsubscribes.
   */
  observe(observer: EngineObserver): () => void {
    return this.observers.add(observer);
  }

  private structured: StructuredOutputs | undefined;
  /** This model's structured-outputs compiler (built on first use: it indexes the vocabulary). */
  structuredOutputs(): StructuredOutputs {
    this.structured ??= new StructuredOutputs(this.tokenizer, this.info.vocabSize);
    return this.structured;
  }

  /** The model's think tags when each is one token (<think> / </think>), else undefined. */
  thinkingTags(): ThinkingTags | undefined {
    const openId = this.tokenizer.tokenId('<think>');
    const closeId = this.tokenizer.tokenId('</think>');
    if (openId === undefined || closeId === undefined) return undefined;
    return { open: '<think>', close: '</think>', openId, closeId };
  }

  /**
   * The prompt with its images' placeholders expanded (vision.ts placeImages), and where each image
   * starts. A model without image input refuses images; a vision-language model refuses a prompt
   * whose image tokens do not pair up with its images.
   */
  placeImages(tokenIds: number[], images: readonly PreparedImage[]): { tokenIds: number[]; offsets: number[] } {
    if (this.vision === undefined) {
      if (images.length > 0) throw new SluiceError('image_input_unsupported', 'this model does not take image input', { param: 'images' });
      return { tokenIds, offsets: [] };
    }
    return placeImages(tokenIds, images, this.vision.imageTokenId);
  }

  /** Image parts in messages need a model that takes images, and one image each (GenerateRequest.images). */
  private checkImageParts(messages: readonly ChatMessage[], images: readonly PreparedImage[]): void {
    const parts = messages.reduce((n, m) => n + (Array.isArray(m?.content) ? m.content.filter((p) => p?.type === 'image').length : 0), 0);
    if (parts > 0 && this.vision === undefined) {
      throw new SluiceError('image_input_unsupported', 'this model does not take image input', { param: 'messages' });
    }
    if (parts !== images.length) {
      throw new SluiceError('invalid_request', `the messages hold ${parts} image part${parts === 1 ? '' : 's'} for ${images.length} image${images.length === 1 ? '' : 's'}`,
        { param: 'images' });
    }
  }

  /** Runs the vision tower over a request's images (queued together, so batched); rejects once `signal` aborts. */
  private async encodeImages(images: readonly PreparedImage[], offsets: readonly number[], tenant: string,
    signal: AbortSignal): Promise<NativeSequenceImage[]> {
    const embeds = await Promise.all(images.map((image) => this.imageEncoder!.encode(tenant, image, signal)));
    return images.map((image, k) => ({ offset: offsets[k]!, gridH: image.gridH, gridW: image.gridW, embeds: embeds[k]!, hash: image.hash }));
  }

  private async outputConstraint(req: GenerateRequest, promptTokenIds: readonly number[]): Promise<TokenConstraint | undefined> {
    const budget = req.thinking === undefined || req.thinking === false ? undefined : req.thinking.budget;
    const tags = this.thinkingTags();
    if (budget !== undefined && tags === undefined) {
      throw new SluiceError('invalid_request', 'this model has no single-token <think> and </think> tags, so it has no thinking budget',
        { param: 'thinking' });
    }
    const inner = req.responseFormat === undefined ? undefined : await this.structuredOutputs().constraint(req.responseFormat, { tenant: req.tenant ?? '' });
    if (budget === undefined) return inner;
    // Templates that open the block in the generation prompt: the output starts inside it.
    const opened = promptOpensThinking(promptTokenIds, tags!);
    return new ThinkingConstraint({ openId: tags!.openId, closeId: tags!.closeId, budget, opened, eosIds: [...this.tokenizer.eosTokenIds] },
      Math.ceil(this.info.vocabSize / 32), inner);
  }

  /** Stops accepting requests, fails pending ones (engine_disposed), frees the model. Safe to call twice. */
  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    this.adapterSet.close();
    await this.batcher.dispose();
    await this.structured?.dispose();
    this.vision?.dispose();
    this.handle.dispose();
  }

  private reportRequest(window: SchedulingWindow, tenant: string, numPromptTokens: number, generation: Generation,
    outcome: RequestReport['outcome'], finishReason: FinishReason | undefined): void {
    const p = generation.progress();
    const report: RequestReport = {
      window, tenant, outcome, numPromptTokens, numGeneratedTokens: p.numGeneratedTokens, numCachedTokens: p.numCachedTokens,
      decodeMs: p.decodeMs, e2eMs: p.elapsedMs,
    };
    if (outcome === 'finished' && finishReason !== undefined) report.finishReason = finishReason;
    if (p.queuedMs !== undefined) report.queuedMs = p.queuedMs;
    if (p.firstTokenMs !== undefined) report.firstTokenMs = p.firstTokenMs;
    this.observers.requestEnd(report);
  }

  private async *run(req: GenerateRequest, onPrompt: (promptTokenIds: number[]) => void): AsyncGenerator<GenerateChunk> {
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
    const options = validateOptions(req);
    if (options.sampling.topK > this.info.vocabSize) {
      throw new SluiceError('invalid_request', `topK must be at most the vocabulary size ${this.info.vocabSize}, got ${options.sampling.topK}`,
        { param: 'topK' });
    }
    const tenant = checkTenant(req.tenant);
    // Held to the end: an unload waits for the requests accepted with its adapter, and it is not
    // retired to make room for another meanwhile. One not resident is loaded first.
    const lease = req.adapter === undefined ? undefined
      : this.adapterSet.tryAcquire(req.adapter) ?? await this.adapterSet.acquire(req.adapter, req.signal);
    try {
      yield* this.runAccepted(req, onPrompt, options, tenant, lease?.id);
    } finally {
      lease?.release();
    }
  }

  private async *runAccepted(req: GenerateRequest, onPrompt: (promptTokenIds: number[]) => void,
    options: ReturnType<typeof validateOptions>, tenant: string, adapter: number | undefined): AsyncGenerator<GenerateChunk> {
    const source = promptSource(req);
    if (source === 'messages') this.checkImageParts(req.messages!, req.images ?? []);
    const renderedTokenIds = source === 'promptTokenIds' ? this.promptTokenIds(req)
      : await this.preparePrompt(source === 'prompt' ? { prompt: req.prompt! } : {
        messages: req.messages!,
        ...(req.tools !== undefined && { tools: req.tools }),
        ...(req.thinking !== undefined && { enableThinking: req.thinking !== false }),
      }, { tenant });
    const { tokenIds: promptTokenIds, offsets: imageOffsets } = this.placeImages(renderedTokenIds, req.images ?? []);
    const maxTokens = resolveMaxTokens(promptTokenIds.length, options.maxTokens, this.info.contextLength,
      this.batcher.maxSequenceTokens);
    onPrompt(promptTokenIds);

    // Our own controller, so that leaving the iteration early cancels even without req.signal.
    const controller = new AbortController();
    const userSignal = req.signal;
    const forwardAbort = () => controller.abort(userSignal?.reason);
    if (userSignal?.aborted) forwardAbort();
    else userSignal?.addEventListener('abort', forwardAbort, { once: true });

    // Structured outputs (compiled or taken from the cache, checked before anything runs) and the
    // thinking budget.
    // (No await without either: the request reaches the scheduler in this same tick.)
    const images = imageOffsets.length === 0 ? undefined : await this.encodeImages(req.images!, imageOffsets, tenant, controller.signal);
    const constraint = req.responseFormat === undefined && (req.thinking === undefined || req.thinking === false)
      ? undefined : await this.outputConstraint(req, promptTokenIds);
    const generation = new Generation({
      tokenizer: this.tokenizer,
      promptTokenIds,
      maxTokens,
      stopStrings: options.stopStrings,
      logprobs: options.logprobs,
      cancelReason: () => controller.signal.reason,
    });
    let submitted = false;
    // A consumer that stops reading early cancels the request.
    let outcome: RequestReport['outcome'] = 'cancelled';
    let finishReason: FinishReason | undefined;
    try {
      this.batcher.submit({
        promptTokenIds, maxTokens, sampling: options.sampling, priority: windowPriority(options.completionWindow),
        ...(images !== undefined && { images }),
        keyed: options.promptCacheKey !== undefined, signal: controller.signal, sink: generation, tenant,
        ...(adapter !== undefined && { adapter }),
        ...(constraint !== undefined && { constraint }),
        // A key groups requests of its own tenant only.
        ...(options.promptCacheKey !== undefined && { promptCacheKey: `${tenant}\u0000${options.promptCacheKey}` }),
      });
      submitted = true;
      for await (const chunk of generation.chunks) {
        finishReason ??= chunk.finishReason;
        yield chunk;
      }
      outcome = 'finished';
    } catch (err) {
      outcome = isSluiceError(err) && err.code === 'cancelled' ? 'cancelled' : 'failed';
      throw err;
    } finally {
      userSignal?.removeEventListener('abort', forwardAbort);
      if (!generation.isEnded) controller.abort(new SluiceError('cancelled', 'the consumer stopped reading the stream'));
      constraint?.dispose();
      if (submitted) this.reportRequest(options.completionWindow, tenant, promptTokenIds.length, generation, outcome, finishReason);
    }
  }

  /**
   * Loads a LoRA adapter (PEFT layout) while serving: requests may name it once this resolves.
   * The files are read off the event loop and the adapter joins the engine between two steps
   * (with a budget, after idle adapters are retired to make room; it may be retired later and is
   * then loaded again on demand).
   */
  async loadAdapter(name: string, dir: string): Promise<{ name: string; rank: number; bytes: number }> {
    loraAdapterNames({ [name]: dir });
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
    const { rank, bytes } = await this.adapterSet.add(name, dir);
    return { name, rank, bytes };
  }

  /**
   * Unloads a LoRA adapter: requests naming it from now on are refused; those already accepted
   * finish with it first (this resolves after them), so none is lost.
   */
  async unloadAdapter(name: string): Promise<void> {
    await this.adapterSet.remove(name);
  }

  /** The adapters known to the engine: resident or not, with their requests accepted and not ended. */
  adapters(): AdapterStatus[] {
    return this.adapterSet.list();
  }

  /** Adapter residency: how many are known and resident, their bytes, the budget, loads and evictions. */
  adapterStats(): AdapterSetStats {
    return this.adapterSet.stats();
  }
}

/** The batch limits an engine on `backend` gets: the caller's, or the backend's defaults. */
export function batchLimits(backend: BackendName, opts: Pick<EngineLoadOptions, 'maxNumSeqs' | 'maxBatchedTokens'> = {}):
  { maxNumSeqs: number; maxBatchedTokens: number } {
  const maxNumSeqs = opts.maxNumSeqs ?? BATCH_LIMITS[backend].maxNumSeqs;
  return { maxNumSeqs, maxBatchedTokens: opts.maxBatchedTokens ?? Math.max(BATCH_LIMITS[backend].maxBatchedTokens, maxNumSeqs) };
}

/**
 * Default KV pool: room for min(maxNumSeqs, 8) full contexts, at most 2 GiB. Bytes per token are
 * estimated from config.json with 4-byte elements (the CPU backend keeps KV in f32); the pool is
 * reserved, and on the CPU backend pages are committed only as they are used.
 */
export function defaultKvCacheBytes(config: Record<string, unknown>, maxNumSeqs: number): number {
  // Multimodal checkpoints (Gemma 3) keep the text model's fields under text_config.
  const text = textConfigOf(specOfConfig(config), config) ?? {};
  const num = (key: string): number | undefined => {
    const v = text[key];
    return typeof v === 'number' && Number.isFinite(v) && v > 0 ? v : undefined;
  };
  const numLayers = num('num_hidden_layers');
  const numHeads = num('num_attention_heads');
  const hiddenSize = num('hidden_size');
  if (numLayers === undefined || numHeads === undefined || hiddenSize === undefined) return GiB;
  const numKvHeads = num('num_key_value_heads') ?? numHeads;
  const headDim = num('head_dim') ?? hiddenSize / numHeads;
  const contextLength = num('max_position_embeddings') ?? 4096;
  const bytesPerToken = 2 * numLayers * numKvHeads * headDim * 4;
  const bytes = bytesPerToken * contextLength * Math.min(maxNumSeqs, 8);
  return Math.min(2 * GiB, Math.ceil(bytes));
}

/** Tenant ids are opaque strings (an organization id), at most 256 characters. */
function checkTenant(tenant: unknown): string {
  if (tenant === undefined) return '';
  if (typeof tenant !== 'string' || tenant.length > 256) {
    throw new SluiceError('invalid_request', 'tenant must be a string of at most 256 characters', { param: 'tenant' });
  }
  return tenant;
}

function checkPositiveInteger(value: number, param: string): void {
  if (!Number.isInteger(value) || value < 1) {
    throw new SluiceError('invalid_argument', `${param} must be an integer >= 1, got ${value}`, { param });
  }
}

/** loadNativeEngine with native error codes (MODEL_FILE_MISSING) mapped to SluiceError codes. */
/** The LoRA memory budget (loraMemoryBytes), checked; it needs serial steps. */
function loraBudget(opts: EngineLoadOptions): number | undefined {
  const budget = opts.loraMemoryBytes;
  if (budget === undefined) return undefined;
  if (!Number.isSafeInteger(budget) || budget < 1) {
    throw new SluiceError('invalid_argument', `loraMemoryBytes must be a positive integer, got ${String(budget)}`, { param: 'loraMemoryBytes' });
  }
  if (opts.overlapSteps === true) {
    throw new SluiceError('invalid_argument', 'loraMemoryBytes loads adapters between serial steps: it cannot be used with overlapSteps',
      { param: 'loraMemoryBytes' });
  }
  return budget;
}

/** The LoRA adapters' names, checked (at most `max`, each naming a directory string). */
function loraAdapterNames(adapters: Record<string, string> | undefined, max = MAX_KNOWN_ADAPTERS): string[] {
  if (adapters === undefined) return [];
  if (typeof adapters !== 'object' || adapters === null || Array.isArray(adapters)) {
    throw new SluiceError('invalid_argument', 'loraAdapters must map adapter names to directories', { param: 'loraAdapters' });
  }
  const names = Object.keys(adapters);
  if (names.length > max) {
    throw new SluiceError('invalid_argument', `at most ${max} LoRA adapters${max === MAX_RESIDENT_ADAPTERS ? ' without loraMemoryBytes' : ''}, got ${names.length}`,
      { param: 'loraAdapters' });
  }
  for (const name of names) {
    if (name === '' || name.length > 256 || typeof adapters[name] !== 'string' || adapters[name] === '') {
      throw new SluiceError('invalid_argument', `loraAdapters.${name}: a name of 1..256 characters and a directory`, { param: 'loraAdapters' });
    }
  }
  return names;
}

/** The EAGLE-3 head's directory of speculative: {method: 'eagle3', draftModel}, checked to exist. */
async function eagle3HeadDir(spec: SpeculativeOptions): Promise<string> {
  const dir = speculativeOptions(spec).draftModel!;
  const s = await stat(dir).catch(() => undefined);
  if (!s?.isDirectory()) {
    throw new SluiceError('invalid_argument', `speculative EAGLE-3 head ${dir} is not a directory`, { param: 'speculative.draftModel' });
  }
  return dir;
}

/** The draft model engine's KV pool at most (it holds at most maxSpeculativeSeqs sequences). */
const DRAFT_KV_CACHE_BYTES = 512 << 20;

/**
 * The draft model's engine (CPU, the target's block size, threads and prefix-hash key) and its
 * speculator, for speculative: {method: 'draft', draftModel}. The draft must have the target's
 * tokenizer (the same tokenizer.json bytes) and no larger a vocabulary (its tokens are the
 * target's ids).
 */
async function loadDraftSpeculator(spec: SpeculativeOptions, targetDir: string, target: NativeEngineHandle,
  base: Omit<Parameters<typeof loadNativeEngine>[0], 'modelDir'>): Promise<Speculator> {
  const options = speculativeOptions(spec);
  const draftDir = options.draftModel!;
  const hash = async (dir: string) => {
    try {
      return createHash('sha256').update(await readFile(join(dir, 'tokenizer.json'))).digest('hex');
    } catch (err) {
      throw new SluiceError('invalid_argument', `speculative draft model ${dir}: no tokenizer.json to compare with the target's (${(err as Error).message})`,
        { param: 'speculative.draftModel', cause: err });
    }
  };
  if (await hash(draftDir) !== await hash(targetDir)) {
    throw new SluiceError('invalid_argument', `speculative draft model ${draftDir} has another tokenizer than ${targetDir}: a draft must share the target's`,
      { param: 'speculative.draftModel' });
  }
  // At most maxSpeculativeSeqs sequences draft at once: a pool of the target's size would be idle.
  const kvCacheBytes = Math.min(base.kvCacheBytes ?? DRAFT_KV_CACHE_BYTES, DRAFT_KV_CACHE_BYTES);
  // The target's LoRA adapters are not the draft's (its shapes differ): it drafts as the base model.
  const { loraAdapters: _adapters, loraReserveBytes: _reserve, ...draftBase } = base;
  const draft = await loadHandle({ ...draftBase, modelDir: draftDir, prefixCaching: true, kvCacheBytes });
  if (draft.info().vocabSize > target.info().vocabSize) {
    const n = draft.info().vocabSize;
    draft.dispose();
    throw new SluiceError('invalid_argument', `speculative draft model ${draftDir} has ${n} tokens, more than the target's ${target.info().vocabSize}`,
      { param: 'speculative.draftModel' });
  }
  return new DraftModelSpeculator(draft, options);
}

/** A native call's error as a SluiceError with the native code (MODEL_FILE_MISSING -> model_file_missing). */
function nativeToSluiceError(err: unknown, param: string): SluiceError {
  const nativeCode = (err as { code?: unknown }).code;
  const code = typeof nativeCode === 'string' ? nativeCode.toLowerCase() : 'engine_error';
  return new SluiceError(code, (err as Error).message, { param, cause: err });
}

async function loadHandle(options: Parameters<typeof loadNativeEngine>[0]): Promise<NativeEngineHandle> {
  try {
    return await loadNativeEngine(options);
  } catch (err) {
    const nativeCode = (err as { code?: unknown }).code;
    const code = typeof nativeCode === 'string' ? nativeCode.toLowerCase() : 'engine_error';
    throw new SluiceError(code, `cannot load ${options.modelDir} on ${options.backend}: ${(err as Error).message}`,
      { cause: err });
  }
}
