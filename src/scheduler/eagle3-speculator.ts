// Speculative decoding with an EAGLE-3 head (issue 35): the head runs inside the native engine
// (EngineOptions eagle3Dir, native/src/speculative/eagle3_head.h), reading the target's hidden
// states of each step. A plan asks it for drafts to follow each row's sampled token
// (numNextDrafts); the step returns them (nextDrafts) and the next plan proposes them for the
// engine to verify, as it verifies prompt lookup's (speculator.ts). The head's drafts are greedy
// (point masses), so greedy output is unchanged and sampled output keeps the target's distribution.

import type { Sequence } from './sequence.js';
import { Speculator, speculatesUnder } from './speculator.js';

export class Eagle3Speculator extends Speculator {
  /** Per sequence: the drafts the last step made for it, when it knew `length` tokens. */
  private readonly drafts = new WeakMap<Sequence, { length: number; tokens: number[] }>();

  override nextDrafts(seq: Sequence): number {
    // Drafts follow a token this step samples and verify in the next one, which must leave room
    // for the pending token and at least one draft before max_tokens; a grammar must look ahead.
    if (!speculatesUnder(seq) || seq.numGeneratedTokens + 2 >= seq.request.maxTokens) return 0;
    return Math.min(this.draftLimit(seq, 1), this.options.maxDraftTokensPerStep);
  }

  override receive(seq: Sequence, drafts: number[]): void {
    this.drafts.set(seq, { length: seq.numPromptTokens + seq.numGeneratedTokens, tokens: drafts });
  }

  protected override lookup(seq: Sequence, k: number): number[] {
    const d = this.drafts.get(seq);
    // Drafts made for the sequence as it is now (not before its last tokens came).
    if (d === undefined || d.length !== seq.numPromptTokens + seq.numGeneratedTokens) return [];
    return d.tokens.slice(0, k);
  }
}
