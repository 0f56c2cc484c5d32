// An in-test fake of NativeEngineHandle for the Batcher's unit tests. It keeps exact block
// accounting (and rejects a plan that does not fit with NO_KV_BLOCKS, as the native engine does)
// and samples a token that depends only on the sequence's tokens, so output is identical whether
// or not a sequence was preempted and recomputed.

import type {
  NativeEngineHandle, NativeModelInfo, NativeSamplingParams, NativeStepPlan, NativeStepResult,
} from '../../src/engine/native-types.js';

interface FakeSequence {
  tokens: number[];
  numComputedTokens: number;
  numBlocks: number;
}

export class FakeHandle implements NativeEngineHandle {
  readonly sequences = new Map<number, FakeSequence>();
  readonly plans: Array<Array<{ seqId: number; numTokens: number }>> = [];
  /** seqIds freed before they finished (the Batcher tells the fake nothing about why). */
  readonly freedSeqIds: number[] = [];
  numRejectedSteps = 0;
  maxLiveSequences = 0;
  failNextStep: Error | undefined;
  /** Called after each accepted step's plan is recorded, before its result goes back (1 = first step). */
  onStep: ((numSteps: number) => void) | undefined;
  /** Fault hooks by prompt: refuse the sequence at addSequence, or fail its row in a step. */
  refuseAdd: ((prompt: readonly number[]) => Error | undefined) | undefined;
  failRow: ((prompt: readonly number[]) => string | undefined) | undefined;
  /** Tenants (cache scopes) given to addSequence, by seqId. */
  readonly scopes = new Map<number, string>();
  private numUsedBlocks = 0;

  constructor(readonly numBlocks: number, readonly blockSize: number) {}

  info(): NativeModelInfo {
    return {
      architecture: 'Fake', modelType: 'fake', weightDtype: 'f32', vocabSize: 1000, hiddenSize: 8, numLayers: 1,
      numHeads: 1, numKvHeads: 1, headDim: 8, contextLength: 4096, weightBytes: 0, kvCacheBytes: 0,
      blockSize: this.blockSize, numBlocks: this.numBlocks, backend: 'cpu', simd: 'none', numThreads: 1,
    };
  }

  /** No prefix cache: every prompt is computed in full (returns 0 cached tokens). */
  addSequence(seqId: number, promptTokens: Int32Array, _sampling: NativeSamplingParams, _keyed?: boolean, scope?: string): number {
    if (this.sequences.has(seqId)) throw Object.assign(new Error(`seq ${seqId} exists`), { code: 'SEQ_EXISTS' });
    const refused = this.refuseAdd?.([...promptTokens]);
    if (refused) throw refused;
    this.scopes.set(seqId, scope ?? '');
    this.sequences.set(seqId, { tokens: [...promptTokens], numComputedTokens: 0, numBlocks: 0 });
    this.maxLiveSequences = Math.max(this.maxLiveSequences, this.sequences.size);
    return 0;
  }

  freeSequence(seqId: number): void {
    const seq = this.sequences.get(seqId);
    if (!seq) return;
    this.numUsedBlocks -= seq.numBlocks;
    this.sequences.delete(seqId);
    this.freedSeqIds.push(seqId);
  }

  numFreeBlocks(): number {
    return this.numBlocks - this.numUsedBlocks;
  }

  numSequenceBlocks(seqId: number): number {
    return this.sequences.get(seqId)?.numBlocks ?? 0;
  }

  async step(plan: NativeStepPlan): Promise<NativeStepResult> {
    await new Promise((resolve) => setImmediate(resolve));
    if (this.failNextStep) {
      const err = this.failNextStep;
      this.failNextStep = undefined;
      throw err;
    }
    const rows = [...plan.seqIds].map((seqId, i) => ({ seqId, numTokens: plan.numTokens[i]! }));
    let numNewBlocks = 0;
    for (const { seqId, numTokens } of rows) {
      const seq = this.sequences.get(seqId);
      if (!seq) throw new Error(`step names unknown seq ${seqId}`);
      if (numTokens < 1 || seq.numComputedTokens + numTokens > seq.tokens.length) {
        throw new Error(`seq ${seqId}: bad numTokens ${numTokens}`);
      }
      numNewBlocks += Math.max(0, Math.ceil((seq.numComputedTokens + numTokens) / this.blockSize) - seq.numBlocks);
    }
    if (numNewBlocks > this.numFreeBlocks()) {
      this.numRejectedSteps++;
      throw Object.assign(new Error('no KV blocks'), { code: 'NO_KV_BLOCKS' });
    }
    this.plans.push(rows);
    this.onStep?.(this.plans.length);
    const sampled: Array<{ seqId: number; token: number }> = [];
    const errors: Array<{ seqId: number; code: string; message: string }> = [];
    for (const { seqId, numTokens } of rows) {
      const seq = this.sequences.get(seqId)!;
      const failure = this.failRow?.(seq.tokens);
      if (failure !== undefined) {
        errors.push({ seqId, code: 'INTERNAL', message: failure });
        continue;
      }
      seq.numComputedTokens += numTokens;
      const numBlocks = Math.ceil(seq.numComputedTokens / this.blockSize);
      this.numUsedBlocks += numBlocks - seq.numBlocks;
      seq.numBlocks = numBlocks;
      if (seq.numComputedTokens === seq.tokens.length) {
        const token = seq.tokens.reduce((h, t) => (h * 31 + t) % 997, 7);
        seq.tokens.push(token);
        sampled.push({ seqId, token });
      }
    }
    return {
      seqIds: Uint32Array.from(sampled, (s) => s.seqId),
      tokens: Int32Array.from(sampled, (s) => s.token),
      logprobs: new Float32Array(sampled.length).fill(-0.5),
      topN: 0,
      topIds: new Int32Array(0),
      topLogprobs: new Float32Array(0),
      errors,
    };
  }

  dispose(): void {}
}

