// A fake of the native engine's plan/result contract (NativeEngineHandle.step) for the Batcher's
// unit tests: frees, then rows of known sequences claim blocks, then adds (admitted only when the
// whole prompt fits), then their rows; every outcome is a value, as the native engine reports it.
// No prefix cache. A sampled token depends only on the sequence's tokens, so output is identical
// whether or not a sequence was preempted and recomputed, and whatever the batch.

import type {
  NativeEngineHandle, NativeModelInfo, NativeRowError, NativeStepPlan, NativeStepResult,
} from '../../src/native/native-types.js';

interface FakeSequence {
  tokens: number[];
  numComputedTokens: number;
  numBlocks: number;
}

export class FakeHandle implements NativeEngineHandle {
  readonly sequences = new Map<number, FakeSequence>();
  /** Rows of each step with rows, as the engine ran them (seqId, tokens actually computed). */
  readonly plans: Array<Array<{ seqId: number; numTokens: number }>> = [];
  /** seqIds freed before they finished (the Batcher tells the fake nothing about why). */
  readonly freedSeqIds: number[] = [];
  /** Rows and adds that did not fit (status NO_KV_BLOCKS). */
  numRejected = 0;
  maxLiveSequences = 0;
  failNextStep: Error | undefined;
  /** Called after each step's rows are recorded, before its result goes back (1 = first step). */
  onStep: ((numSteps: number) => void) | undefined;
  /** Fault hooks by prompt: refuse the sequence at its add, or fail its row in a step. */
  refuseAdd: ((prompt: readonly number[]) => { code: string; message: string } | undefined) | undefined;
  failRow: ((prompt: readonly number[]) => string | undefined) | undefined;
  /** Tenants (cache scopes) given with each add, by seqId. */
  readonly scopes = new Map<number, string>();
  /** Steps submitted but not settled, at most (the Batcher overlaps one step with the next). */
  maxQueuedSteps = 0;
  private numUsedBlocks = 0;
  private queue: Promise<unknown> = Promise.resolve();
  private numQueued = 0;

  constructor(readonly numBlocks: number, readonly blockSize: number) {}

  info(): NativeModelInfo {
    return {
      architecture: 'Fake', modelType: 'fake', weightDtype: 'f32', vocabSize: 1000, hiddenSize: 8, numLayers: 1,
      numHeads: 1, numKvHeads: 1, headDim: 8, contextLength: 4096, weightBytes: 0, kvCacheBytes: 0,
      blockSize: this.blockSize, numBlocks: this.numBlocks, backend: 'cpu', simd: 'none', numThreads: 1,
      matmulPrecision: 'f32', deviceBytes: 0,
    };
  }

  /** Test-only: blocks not held by any sequence. */
  numFreeBlocks(): number {
    return this.numBlocks - this.numUsedBlocks;
  }

  /** Steps run one at a time in submission order, as the addon queues them. */
  step(plan: NativeStepPlan): Promise<NativeStepResult> {
    const copy: NativeStepPlan = {
      seqIds: plan.seqIds.slice(), numTokens: plan.numTokens.slice(), frees: plan.frees?.slice(),
      adds: plan.adds?.map((a) => ({ ...a, promptTokens: a.promptTokens.slice() })),
    };
    this.numQueued++;
    this.maxQueuedSteps = Math.max(this.maxQueuedSteps, this.numQueued);
    const run = this.queue.then(async () => {
      await new Promise((resolve) => setImmediate(resolve));
      try {
        return this.run(copy);
      } finally {
        this.numQueued--;
      }
    });
    this.queue = run.catch(() => {});
    return run;
  }

  private run(plan: NativeStepPlan): NativeStepResult {
    if (this.failNextStep) {
      const err = this.failNextStep;
      this.failNextStep = undefined;
      throw err;
    }
    for (const id of plan.frees ?? []) this.free(id);
    const n = plan.seqIds.length;
    const rowStatus = new Uint8Array(n).fill(2);
    const rowComputed = new Uint32Array(n);
    const rowPending = new Uint32Array(n);
    const rowBlocks = new Uint32Array(n);
    const errors: NativeRowError[] = [];
    const claimed: Array<{ i: number; count: number }> = [];
    const seen = new Set<number>();
    let numClaimed = 0;
    const claim = (i: number) => {
      const seqId = plan.seqIds[i]!;
      const seq = this.sequences.get(seqId);
      const uncomputed = seq ? seq.tokens.length - seq.numComputedTokens : 0;
      if (!seq || seen.has(seqId) || plan.numTokens[i]! < 1 || uncomputed < 1) {
        errors.push({ seqId, code: seq ? 'INVALID_ARGUMENT' : 'SEQ_UNKNOWN', message: 'bad row' });
        return;
      }
      seen.add(seqId);
      const count = Math.min(plan.numTokens[i]!, uncomputed);
      const need = Math.max(0, Math.ceil((seq.numComputedTokens + count) / this.blockSize) - seq.numBlocks);
      if (need > this.numFreeBlocks() - numClaimed) {
        rowStatus[i] = 1;
        this.numRejected++;
        return;
      }
      numClaimed += need;
      claimed.push({ i, count });
    };
    const deferred = new Set<number>();
    for (let i = 0; i < n; i++) {
      if (this.sequences.has(plan.seqIds[i]!)) claim(i);
      else deferred.add(i);
    }
    const adds = plan.adds ?? [];
    const addStatus = new Uint8Array(adds.length).fill(2);
    const addCached = new Int32Array(adds.length).fill(-1);
    adds.forEach((add, a) => {
      const prompt = [...add.promptTokens];
      const refused = this.refuseAdd?.(prompt);
      if (this.sequences.has(add.seqId) || refused) {
        errors.push({ seqId: add.seqId, ...(refused ?? { code: 'SEQ_EXISTS', message: 'exists' }) });
        return;
      }
      const fits = Math.ceil(prompt.length / this.blockSize) <= this.numFreeBlocks() - numClaimed;
      if (!fits) this.numRejected++;
      else {
        this.sequences.set(add.seqId, { tokens: prompt, numComputedTokens: 0, numBlocks: 0 });
        this.scopes.set(add.seqId, add.cacheScope ?? '');
        this.maxLiveSequences = Math.max(this.maxLiveSequences, this.sequences.size);
        addCached[a] = 0;
      }
      addStatus[a] = fits ? 0 : 1;
      for (const i of [...deferred]) {
        if (plan.seqIds[i] !== add.seqId) continue;
        deferred.delete(i);
        if (fits) claim(i);
        else rowStatus[i] = 1;
      }
    });
    for (const i of deferred) claim(i);
    claimed.sort((x, y) => x.i - y.i);
    if (n > 0) {
      // (A step that only frees is not recorded.)
      this.plans.push(claimed.map(({ i, count }) => ({ seqId: plan.seqIds[i]!, numTokens: count })));
      this.onStep?.(this.plans.length);
    }
    const sampled: Array<{ seqId: number; token: number }> = [];
    for (const { i, count } of claimed) {
      const seqId = plan.seqIds[i]!;
      const seq = this.sequences.get(seqId)!;
      const failure = this.failRow?.(seq.tokens);
      if (failure !== undefined) {
        errors.push({ seqId, code: 'INTERNAL', message: failure });
        continue;
      }
      seq.numComputedTokens += count;
      const numBlocks = Math.ceil(seq.numComputedTokens / this.blockSize);
      this.numUsedBlocks += numBlocks - seq.numBlocks;
      seq.numBlocks = numBlocks;
      if (seq.numComputedTokens === seq.tokens.length) {
        const token = seq.tokens.reduce((h, t) => (h * 31 + t) % 997, 7);
        seq.tokens.push(token);
        sampled.push({ seqId, token });
      }
      rowStatus[i] = 0;
      rowComputed[i] = count;
      rowPending[i] = seq.tokens.length - seq.numComputedTokens;
      rowBlocks[i] = seq.numBlocks;
    }
    return {
      seqIds: Uint32Array.from(sampled, (s) => s.seqId),
      tokens: Int32Array.from(sampled, (s) => s.token),
      logprobs: new Float32Array(sampled.length).fill(-0.5),
      topN: 0,
      topIds: new Int32Array(0),
      topLogprobs: new Float32Array(0),
      errors, rowStatus, rowComputed, rowPending, rowBlocks, addStatus, addCached,
      numFreeBlocks: this.numFreeBlocks(), numEvictableBlocks: 0, numCachedBlocks: 0,
    };
  }

  private free(seqId: number): void {
    const seq = this.sequences.get(seqId);
    if (!seq) return;
    this.numUsedBlocks -= seq.numBlocks;
    this.sequences.delete(seqId);
    this.freedSeqIds.push(seqId);
  }

  /** Token masks handed in (the fake samples unconstrained; structured outputs are tested on the real engine). */
  provideMasks(): void {}

  dispose(): void {}
}
