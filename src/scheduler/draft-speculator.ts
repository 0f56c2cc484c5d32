// Speculative decoding with a draft model (issue 35): a smaller checkpoint with the target's
// tokenizer, run in a native engine of its own (its own KV pool), proposes each decoding
// sequence's next K tokens greedily before the plan; the target verifies them as it verifies
// prompt lookup's (speculator.ts), so greedy output is unchanged whatever the draft says.
//
// Before each plan (when no step is in flight), for the sequences that may draft: one draft step
// adds each with its prompt and generated tokens and samples its first draft (the draft engine's
// prefix cache holds the blocks of the last call, so only the tokens since are computed), then
// K - 1 single-token steps sample the rest, all sequences batched. The draft sequences are freed
// by the next call's first step (their full blocks stay cached for it). A greedy draft is a point
// mass, which verify_draft_token checks exactly. A draft engine failure costs only the drafts.

import type { NativeEngineHandle, NativeSamplingParams, NativeStepPlan } from '../native/native-types.js';
import { ADD_ADMITTED, ROW_RAN } from '../native/native-types.js';
import type { Sequence } from './sequence.js';
import { Speculator, type SpeculativeOptions } from './speculator.js';

const GREEDY: NativeSamplingParams = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };

export class DraftModelSpeculator extends Speculator {
  /** Per sequence: the drafts computed for it when it knew `length` tokens. */
  private readonly drafts = new WeakMap<Sequence, { length: number; tokens: number[] }>();
  /** Draft engine sequences to free at the next call. */
  private held: number[] = [];
  private nextId = 1;
  private disposed = false;

  /** `draft`: the draft model's engine, owned from here on (dispose() frees it). */
  constructor(private readonly draft: NativeEngineHandle, options: SpeculativeOptions) {
    super(options);
  }

  override async prepare(running: readonly Sequence[]): Promise<void> {
    if (this.disposed) return;
    const seqs = this.active(running.length) ? running.filter((s) => this.mayDraft(s)) : [];
    const frees = this.held;
    this.held = [];
    if (seqs.length === 0) {
      if (frees.length > 0) await this.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.from(frees) });
      return;
    }
    const ids = seqs.map(() => this.nextId++ >>> 0);
    this.held = ids;
    const k = Math.min(this.options.numSpeculativeTokens, this.options.maxDraftTokensPerStep);
    const out = seqs.map(() => [] as number[]);
    const want = seqs.map((s) => Math.min(k, s.request.maxTokens - s.numGeneratedTokens - 1));
    const first = await this.step({
      seqIds: Uint32Array.from(ids), numTokens: new Uint32Array(ids.length).fill(1 << 30), frees: Uint32Array.from(frees),
      adds: seqs.map((s, i) => ({
        seqId: ids[i]!, promptTokens: Int32Array.from([...s.request.promptTokenIds, ...s.generatedTokenIds]), sampling: GREEDY,
        cacheScope: s.request.tenant ?? '',
      })),
    });
    const alive = seqs.map((_, i) => first !== undefined && first.addStatus[i] === ADD_ADMITTED && first.rowStatus[i] === ROW_RAN);
    const collect = (res: Awaited<ReturnType<DraftModelSpeculator['step']>>) => {
      if (res === undefined) return;
      for (let j = 0; j < res.seqIds.length; j++) {
        const i = ids.indexOf(res.seqIds[j]!);
        if (i >= 0 && alive[i]) out[i]!.push(res.tokens[j]!);
      }
    };
    collect(first);
    for (let round = 1; round < k; round++) {
      const rows = ids.filter((_, i) => alive[i] && out[i]!.length === round && out[i]!.length < want[i]!);
      if (rows.length === 0) break;
      const res = await this.step({ seqIds: Uint32Array.from(rows), numTokens: new Uint32Array(rows.length).fill(1) });
      if (res === undefined) break;
      res.rowStatus.forEach((status, r) => { if (status !== ROW_RAN) alive[ids.indexOf(rows[r]!)] = false; });
      collect(res);
    }
    seqs.forEach((s, i) => {
      this.drafts.set(s, { length: s.numPromptTokens + s.numGeneratedTokens, tokens: alive[i] ? out[i]!.slice(0, want[i]!) : [] });
    });
  }

  protected override lookup(seq: Sequence, k: number): number[] {
    const d = this.drafts.get(seq);
    // Drafts computed for the sequence as it is now (not before its last tokens came).
    if (d === undefined || d.length !== seq.numPromptTokens + seq.numGeneratedTokens) return [];
    return d.tokens.slice(0, k);
  }

  override dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.draft.dispose();
  }

  /** One draft engine step; undefined when it fails (the drafts are skipped, nothing else). */
  private async step(plan: NativeStepPlan) {
    try {
      return await this.draft.step(plan);
    } catch {
      return undefined;
    }
  }
}
