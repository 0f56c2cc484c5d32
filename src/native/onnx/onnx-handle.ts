// The ONNX Runtime backend: a decoder-only ONNX export (optimum / onnx-community layout: inputs
// input_ids, attention_mask, position_ids, past_key_values.{i}.key/value; outputs logits,
// present.{i}.key/value) run by onnxruntime-node's CPU execution provider behind the same step
// contract as the native engine (NativeEngineHandle), so the Batcher, the facade and every HTTP
// surface use it unchanged.
//
// Limits, as the export allows:
// - KV lives per sequence as the export's past/present tensors (f32, [1, kvHeads, tokens, headDim]
//   per layer), not in a paged pool: no prefix cache (addCached is 0), and the "blocks" reported
//   to the scheduler are an accounting of kvCacheBytes so admission and preemption behave.
// - A prefill row runs alone (one session run per row and chunk). Decode rows of a step run
//   together as one batch: pasts left-padded to the longest, attention_mask zero on the padding,
//   position_ids per row; each present is cut back to its own length afterwards.
// - Token masks (structured outputs) are applied to the logits here, before sampling.

import { closeSync, fstatSync, openSync, readdirSync, readFileSync, readSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type * as Ort from 'onnxruntime-node';
import {
  ADD_ADMITTED, ADD_FAILED, ADD_NO_KV_BLOCKS, ROW_FAILED, ROW_NO_KV_BLOCKS, ROW_RAN,
  type NativeEngineHandle, type NativeModelInfo, type NativeRowError, type NativeSamplingParams,
  type NativeStepPlan, type NativeStepResult,
} from '../native-types.js';
import { applyMask, sampleToken, streamSeed } from './sampler.js';
import { decodeBatch, type PastKv } from './onnx-batch.js';
import { importOnnxRuntime } from './onnx-runtime.js';

export interface OnnxLoadOptions {
  /** The model directory (config.json, tokenizer files). */
  modelDir: string;
  /** The graph: onnx/model.onnx or model.onnx inside modelDir. */
  modelPath: string;
  kvCacheBytes: number;
  blockSize: number;
  /** onnxruntime intra-op threads (0: its default, all cores). */
  numThreads: number;
  /** Decode rows per session run (the rest wait for the next run of the same step). */
  maxDecodeBatch: number;
}

interface OnnxSequence {
  tokens: number[];
  numComputedTokens: number;
  numBlocks: number;
  sampling: NativeSamplingParams;
  /** [2 * layers] past key, value per layer: [1, kvHeads, numComputedTokens, headDim]; null before the first run. */
  past: PastKv | null;
}

const MASK_WAIT_MS = 60_000;

export class OnnxEngineHandle implements NativeEngineHandle {
  private readonly sequences = new Map<number, OnnxSequence>();
  private numUsedBlocks = 0;
  private queue: Promise<unknown> = Promise.resolve();
  private readonly masks = new Map<number, Uint32Array | null>();
  private readonly maskWaiters = new Map<number, (masks: Uint32Array | null) => void>();
  private disposed = false;

  private constructor(
    private readonly ort: typeof Ort,
    private readonly session: Ort.InferenceSession,
    private readonly modelInfo: NativeModelInfo,
    private readonly maxDecodeBatch: number,
    /** Whether the export takes position_ids (some exports derive them from attention_mask). */
    private readonly takesPositionIds: boolean,
  ) {}

  static async load(opts: OnnxLoadOptions): Promise<OnnxEngineHandle> {
    const ort = await importOnnxRuntime();
    const config = JSON.parse(readFileSync(join(opts.modelDir, 'config.json'), 'utf8')) as Record<string, any>;
    const session = await ort.InferenceSession.create(opts.modelPath, {
      executionProviders: ['cpu'],
      graphOptimizationLevel: 'all',
      ...(opts.numThreads > 0 && { intraOpNumThreads: opts.numThreads }),
    });
    try {
      const numLayers = session.inputNames.filter((n) => /^past_key_values\.\d+\.key$/.test(n)).length;
      for (const name of ['input_ids', 'attention_mask']) {
        if (!session.inputNames.includes(name)) throw new Error(`${opts.modelPath} has no ${name} input (not a decoder export)`);
      }
      if (numLayers === 0 || !session.outputNames.includes('logits') || !session.outputNames.includes('present.0.key')) {
        throw new Error(`${opts.modelPath} has no past_key_values / present tensors (export it with its KV cache, e.g. optimum's text-generation-with-past)`);
      }
      const pastMeta = session.inputMetadata.find((m) => m.name === 'past_key_values.0.key');
      if (pastMeta && pastMeta.isTensor && pastMeta.type !== 'float32') {
        throw new Error(`${opts.modelPath} keeps its KV cache in ${pastMeta.type}; this backend runs f32 KV only`);
      }
      const numHeads = config.num_attention_heads as number;
      const numKvHeads = (config.num_key_value_heads ?? numHeads) as number;
      const headDim = (config.head_dim ?? config.hidden_size / numHeads) as number;
      const bytesPerToken = 2 * numLayers * numKvHeads * headDim * 4;
      const numBlocks = Math.floor(opts.kvCacheBytes / (opts.blockSize * bytesPerToken));
      let contextLength = (config.max_position_embeddings ?? 2048) as number;
      const sliding = config.model_type === 'mistral' ? config.sliding_window != null : config.use_sliding_window === true;
      if (sliding && config.sliding_window > 0 && config.sliding_window < contextLength) contextLength = config.sliding_window;
      const quantization = readQuantization(opts.modelPath);
      const info: NativeModelInfo = {
        architecture: config.architectures?.[0] ?? 'unknown',
        modelType: config.model_type ?? 'unknown',
        weightDtype: 'f32',
        vocabSize: config.vocab_size,
        hiddenSize: config.hidden_size,
        numLayers,
        numHeads,
        numKvHeads,
        headDim,
        contextLength,
        weightBytes: exportBytes(opts.modelPath),
        kvCacheBytes: numBlocks * opts.blockSize * bytesPerToken,
        kvCacheDtype: 'f32',
        blockSize: opts.blockSize,
        numBlocks,
        backend: 'onnx',
        simd: `onnxruntime ${ort.env.versions.common} cpu${quantization ? ` ${quantization}` : ''}`,
        numThreads: opts.numThreads,
        matmulPrecision: 'f32',
        deviceBytes: 0,
        prefixCaching: false,
      };
      return new OnnxEngineHandle(ort, session, info, Math.max(1, opts.maxDecodeBatch), session.inputNames.includes('position_ids'));
    } catch (err) {
      await session.release();
      throw err;
    }
  }

  info(): NativeModelInfo {
    return { ...this.modelInfo };
  }

  step(plan: NativeStepPlan): Promise<NativeStepResult> {
    const copy: NativeStepPlan = {
      seqIds: plan.seqIds.slice(), numTokens: plan.numTokens.slice(), frees: plan.frees?.slice(),
      adds: plan.adds?.map((a) => ({ ...a, promptTokens: a.promptTokens.slice() })),
      constrained: plan.constrained?.slice(),
    };
    if (plan.maskSlot !== undefined) copy.maskSlot = plan.maskSlot;
    const run = this.queue.then(() => this.run(copy));
    this.queue = run.catch(() => {});
    return run;
  }

  provideMasks(maskSlot: number, masks: Uint32Array | null): void {
    const waiter = this.maskWaiters.get(maskSlot);
    if (waiter) {
      this.maskWaiters.delete(maskSlot);
      waiter(masks);
    } else this.masks.set(maskSlot, masks);
  }

  private waitMasks(slot: number): Promise<Uint32Array | null> {
    if (this.masks.has(slot)) {
      const m = this.masks.get(slot)!;
      this.masks.delete(slot);
      return Promise.resolve(m);
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.maskWaiters.delete(slot);
        resolve(null);
      }, MASK_WAIT_MS);
      this.maskWaiters.set(slot, (m) => {
        clearTimeout(timer);
        resolve(m);
      });
    });
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.sequences.clear();
    void this.queue.finally(() => this.session.release());
  }

  private async run(plan: NativeStepPlan): Promise<NativeStepResult> {
    if (this.disposed) throw Object.assign(new Error('the engine has been disposed'), { code: 'ENGINE_BROKEN' });
    for (const id of plan.frees ?? []) this.free(id);
    const { blockSize, numBlocks } = this.modelInfo;
    const n = plan.seqIds.length;
    const rowStatus = new Uint8Array(n).fill(ROW_FAILED);
    const rowComputed = new Uint32Array(n);
    const rowPending = new Uint32Array(n);
    const rowBlocks = new Uint32Array(n);
    const errors: NativeRowError[] = [];
    const claimed: Array<{ i: number; count: number }> = [];
    const seen = new Set<number>();
    let numClaimed = 0;
    const free = () => numBlocks - this.numUsedBlocks - numClaimed;
    const claim = (i: number) => {
      const seqId = plan.seqIds[i]!;
      const seq = this.sequences.get(seqId);
      const uncomputed = seq ? seq.tokens.length - seq.numComputedTokens : 0;
      if (!seq || seen.has(seqId) || plan.numTokens[i]! < 1 || uncomputed < 1) {
        errors.push({ seqId, code: seq ? 'INVALID_ARGUMENT' : 'SEQ_UNKNOWN', message: seq ? 'the row has nothing to compute' : 'unknown sequence' });
        return;
      }
      seen.add(seqId);
      const count = Math.min(plan.numTokens[i]!, uncomputed);
      const need = Math.max(0, Math.ceil((seq.numComputedTokens + count) / blockSize) - seq.numBlocks);
      if (need > free()) {
        rowStatus[i] = ROW_NO_KV_BLOCKS;
        return;
      }
      numClaimed += need;
      claimed.push({ i, count });
    };
    // Rows of sequences already here claim first, then each add with its rows (admitted only when its whole prompt fits).
    const deferred = new Set<number>();
    for (let i = 0; i < n; i++) {
      if (this.sequences.has(plan.seqIds[i]!)) claim(i);
      else deferred.add(i);
    }
    const adds = plan.adds ?? [];
    const addStatus = new Uint8Array(adds.length).fill(ADD_FAILED);
    const addCached = new Int32Array(adds.length).fill(-1);
    adds.forEach((add, a) => {
      const problem = this.sequences.has(add.seqId) ? 'the sequence exists' : add.promptTokens.length === 0 ? 'empty prompt'
        : add.promptTokens.length > this.modelInfo.contextLength ? `the prompt exceeds the context of ${this.modelInfo.contextLength} tokens`
          : add.promptTokens.some((t) => t < 0 || t >= this.modelInfo.vocabSize) ? 'a prompt token is outside the vocabulary' : undefined;
      if (problem !== undefined) {
        errors.push({ seqId: add.seqId, code: problem === 'the sequence exists' ? 'SEQ_EXISTS' : 'INVALID_ARGUMENT', message: problem });
        return;
      }
      const fits = Math.ceil(add.promptTokens.length / blockSize) <= free();
      if (fits) {
        this.sequences.set(add.seqId, { tokens: [...add.promptTokens], numComputedTokens: 0, numBlocks: 0, sampling: add.sampling, past: null });
        addCached[a] = 0;
      }
      addStatus[a] = fits ? ADD_ADMITTED : ADD_NO_KV_BLOCKS;
      for (const i of [...deferred]) {
        if (plan.seqIds[i] !== add.seqId) continue;
        deferred.delete(i);
        if (fits) claim(i);
        else rowStatus[i] = ROW_NO_KV_BLOCKS;
      }
    });
    for (const i of deferred) claim(i);
    claimed.sort((x, y) => x.i - y.i);

    // Forward: decode rows (one token after a computed past) in batches, other rows alone.
    const logitsOf = new Map<number, Float32Array>();  // row index -> [vocab] logits at its last token
    const decodeRows = claimed.filter(({ i, count }) => count === 1 && this.sequences.get(plan.seqIds[i]!)!.past !== null);
    const prefillRows = claimed.filter((r) => !decodeRows.includes(r));
    for (const { i, count } of prefillRows) {
      try {
        logitsOf.set(i, await this.runAlone(this.sequences.get(plan.seqIds[i]!)!, count));
      } catch (err) {
        errors.push({ seqId: plan.seqIds[i]!, code: 'INTERNAL', message: (err as Error).message });
        claimed.splice(claimed.findIndex((r) => r.i === i), 1);
      }
    }
    for (let at = 0; at < decodeRows.length; at += this.maxDecodeBatch) {
      const group = decodeRows.slice(at, at + this.maxDecodeBatch);
      const seqs = group.map(({ i }) => this.sequences.get(plan.seqIds[i]!)!);
      let rows: Awaited<ReturnType<typeof decodeBatch>>;
      try {
        rows = await decodeBatch(this.ort, this.session, this.modelInfo, this.takesPositionIds, seqs.map((s) => ({
          token: s.tokens[s.numComputedTokens]!, position: s.numComputedTokens, past: s.past!,
        })));
      } catch (err) {
        // The group's rows fail on their own (their sequences are unchanged); the step goes on.
        for (const row of group) {
          errors.push({ seqId: plan.seqIds[row.i]!, code: 'INTERNAL', message: (err as Error).message });
          claimed.splice(claimed.indexOf(row), 1);
        }
        continue;
      }
      group.forEach(({ i }, r) => {
        seqs[r]!.past = rows[r]!.present;
        seqs[r]!.numComputedTokens += 1;
        logitsOf.set(i, rows[r]!.logits);
      });
    }

    // Sampling: rows that computed their sequence's last known token draw one new token.
    let masks: Uint32Array | null | undefined;
    if (plan.constrained && plan.constrained.length > 0 && plan.maskSlot !== undefined) masks = await this.waitMasks(plan.maskSlot);
    const words = Math.ceil(this.modelInfo.vocabSize / 32);
    const sampled: Array<{ seqId: number; token: number; logprob: number; top: Int32Array; topLogprobs: Float32Array }> = [];
    let topN = 0;
    for (const { i } of claimed) topN = Math.max(topN, this.sequences.get(plan.seqIds[i]!)!.sampling.logprobs);
    for (const { i, count } of claimed) {
      const seqId = plan.seqIds[i]!;
      const seq = this.sequences.get(seqId)!;
      const numBlocksNow = Math.ceil(seq.numComputedTokens / blockSize);
      this.numUsedBlocks += numBlocksNow - seq.numBlocks;
      seq.numBlocks = numBlocksNow;
      if (seq.numComputedTokens === seq.tokens.length) {
        const logits = logitsOf.get(i)!;
        const c = plan.constrained ? plan.constrained.indexOf(seqId) : -1;
        if (c >= 0 && (masks === null || masks === undefined || !applyMask(logits, masks.subarray(c * words, (c + 1) * words)))) {
          errors.push({ seqId, code: 'INVALID_ARGUMENT', message: masks ? 'the output grammar allows no token at this point' : 'the token mask did not come' });
          continue;
        }
        const top = new Int32Array(topN);
        const topLogprobs = new Float32Array(topN);
        const s = sampleToken(logits, seq.sampling, streamSeed(seq.sampling.seed, seq.tokens.length), topN, top, topLogprobs);
        seq.tokens.push(s.token);
        sampled.push({ seqId, token: s.token, logprob: s.logprob, top, topLogprobs });
      }
      rowStatus[i] = ROW_RAN;
      rowComputed[i] = count;
      rowPending[i] = seq.tokens.length - seq.numComputedTokens;
      rowBlocks[i] = seq.numBlocks;
    }
    const topIds = new Int32Array(sampled.length * topN);
    const topLogprobs = new Float32Array(sampled.length * topN);
    sampled.forEach((s, r) => {
      topIds.set(s.top, r * topN);
      topLogprobs.set(s.topLogprobs, r * topN);
    });
    return {
      seqIds: Uint32Array.from(sampled, (s) => s.seqId),
      tokens: Int32Array.from(sampled, (s) => s.token),
      logprobs: Float32Array.from(sampled, (s) => s.logprob),
      topN, topIds, topLogprobs,
      errors, rowStatus, rowComputed, rowPending, rowBlocks, addStatus, addCached,
      numFreeBlocks: numBlocks - this.numUsedBlocks, numEvictableBlocks: 0, numCachedBlocks: 0,
    };
  }

  /** Runs `count` uncomputed tokens of one sequence; returns the logits at the last of them. */
  private async runAlone(seq: OnnxSequence, count: number): Promise<Float32Array> {
    const { ort } = this;
    const { numLayers, numKvHeads, headDim, vocabSize } = this.modelInfo;
    const start = seq.numComputedTokens;
    const ids = seq.tokens.slice(start, start + count);
    const feeds: Record<string, Ort.Tensor> = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, count]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(start + count).fill(1n), [1, start + count]),
    };
    if (this.takesPositionIds) feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids, (_, k) => BigInt(start + k)), [1, count]);
    for (let l = 0; l < numLayers; l++) {
      for (const [j, kind] of ['key', 'value'].entries()) {
        feeds[`past_key_values.${l}.${kind}`] = new ort.Tensor('float32', seq.past?.[2 * l + j] ?? new Float32Array(0), [1, numKvHeads, start, headDim]);
      }
    }
    const out = await this.session.run(feeds);
    const past: PastKv = [];
    for (let l = 0; l < numLayers; l++) {
      past.push(out[`present.${l}.key`]!.data as Float32Array, out[`present.${l}.value`]!.data as Float32Array);
    }
    seq.past = past;
    seq.numComputedTokens += count;
    const logits = out.logits!.data as Float32Array;
    // logits [1, count, vocab] (or [1, 1, vocab] for exports that keep only the last position)
    const last = logits.length / vocabSize - 1;
    return logits.slice(last * vocabSize, (last + 1) * vocabSize);
  }

  private free(seqId: number): void {
    const seq = this.sequences.get(seqId);
    if (!seq) return;
    this.numUsedBlocks -= seq.numBlocks;
    this.sequences.delete(seqId);
  }
}

/** Bytes of the graph file and the external data files beside it (the weights, as stored). */
function exportBytes(modelPath: string): number {
  const dir = dirname(modelPath);
  return readdirSync(dir).filter((f) => /\.onnx(_data)?$|\.onnx\.data$/.test(f)).reduce((sum, f) => sum + statSync(join(dir, f)).size, 0);
}

/** The quantization sluice's exporter recorded in model.onnx's metadata, read without loading it (best effort). */
function readQuantization(modelPath: string): string | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(modelPath, 'r');
    const size = fstatSync(fd).size;
    const tail = Buffer.alloc(Math.min(size, 4096));
    readSync(fd, tail, 0, tail.length, size - tail.length);
    return /sluice\.quantization\x12\x04(fp32|int4)/.exec(tail.toString('latin1'))?.[1];
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

