// Speculative decoding on the scheduler's side (issue 35): which decode rows carry drafts, and the
// drafts themselves. The engine verifies them (NativeStepPlan.drafts): greedy rows gain exactly
// the tokens they would have sampled one by one, sampled rows tokens from the same distribution.
//
// Proposers: prompt lookup (ngram-proposer.ts) over the sequence's prompt and generated tokens, fed
// incrementally; a draft model (draft-speculator.ts), run before each plan; or an EAGLE-3 head
// (eagle3-speculator.ts), run in the engine a step ahead. Drafts go only where they are known to be
// right to verify: a decode row (its one pending token is the last generated one) with no step of
// it in flight (under overlap the plan would guess from tokens not yet known), at most
// maxTokens - generated - 1 of them (never past max_tokens), and under an output grammar only
// where its engine can look ahead (native grammars: the masks after each prefix of the drafts come
// with the step), cut to the drafts it allows.
//
// Load: a verification computes K + 1 tokens to gain 1 + accepted, so it pays at low load, where a
// step is bound by reading the weights, and costs at high load, where it is bound by compute. Rows
// draft only while at most maxSpeculativeSeqs sequences run, and a step carries at most
// maxDraftTokensPerStep drafts; a sequence whose drafts keep failing (acceptance under
// MIN_ACCEPTANCE over its last drafts) drafts one token at a time until they agree again, and one
// whose drafts almost never agree drafts once every PROBE_EVERY tokens. Prompt lookup proposes
// nothing without a match, and then costs nothing.

import { SluiceError } from '../errors.js';
import type { Sequence } from './sequence.js';
import { DEFAULT_NGRAM, NgramProposer } from '../speculative/ngram-proposer.js';

export type SpeculativeMethod = 'ngram' | 'draft' | 'eagle3';

export interface SpeculativeOptions {
  method: SpeculativeMethod;
  /** method 'draft': the draft model's checkpoint directory (the target's tokenizer); 'eagle3': the head's. */
  draftModel?: string;
  /** Drafts a decode row verifies at most (K), 1..MAX_SPECULATIVE_TOKENS. */
  numSpeculativeTokens: number;
  /** Rows draft only while at most this many sequences run (default DEFAULT_MAX_SPECULATIVE_SEQS). */
  maxSpeculativeSeqs?: number;
  /** Draft tokens one step carries at most, all rows together (default DEFAULT_MAX_DRAFT_TOKENS_PER_STEP). */
  maxDraftTokensPerStep?: number;
}

export const MAX_SPECULATIVE_TOKENS = 16;
/** K when a catalog or the command line names a method alone. */
export const DEFAULT_SPECULATIVE_TOKENS = 4;
export const DEFAULT_MAX_SPECULATIVE_SEQS = 8;
export const DEFAULT_MAX_DRAFT_TOKENS_PER_STEP = 32;
/** Below this acceptance over a sequence's recent drafts, it drafts one token at a time. */
export const MIN_ACCEPTANCE = 0.2;
/** A sequence whose drafts (almost) never agree drafts once per this many tokens. */
export const PROBE_EVERY = 8;
/** Drafts a sequence's acceptance is averaged over (an exponential moving average's span). */
const ACCEPTANCE_SPAN = 16;

/** Checks and completes the options (invalid_argument naming the field). */
export function speculativeOptions(o: SpeculativeOptions, param = 'speculative'): Required<Omit<SpeculativeOptions, 'draftModel'>> & Pick<SpeculativeOptions, 'draftModel'> {
  if (o.method !== 'ngram' && o.method !== 'draft' && o.method !== 'eagle3') {
    throw new SluiceError('invalid_argument',
      `${param}.method must be 'ngram', 'draft' or 'eagle3', got ${JSON.stringify(o.method)}`, { param: `${param}.method` });
  }
  if ((o.method === 'draft' || o.method === 'eagle3') && (typeof o.draftModel !== 'string' || o.draftModel === '')) {
    throw new SluiceError('invalid_argument',
      `${param}.draftModel must name the ${o.method === 'draft' ? "draft model's" : "EAGLE-3 head's"} directory`, { param: `${param}.draftModel` });
  }
  const int = (v: unknown, name: string, lo: number, hi: number): number => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) {
      throw new SluiceError('invalid_argument', `${param}.${name} must be an integer in [${lo}, ${hi}], got ${JSON.stringify(v)}`, { param: `${param}.${name}` });
    }
    return v;
  };
  return {
    method: o.method,
    ...(o.draftModel !== undefined && { draftModel: o.draftModel }),
    numSpeculativeTokens: int(o.numSpeculativeTokens, 'numSpeculativeTokens', 1, MAX_SPECULATIVE_TOKENS),
    maxSpeculativeSeqs: int(o.maxSpeculativeSeqs ?? DEFAULT_MAX_SPECULATIVE_SEQS, 'maxSpeculativeSeqs', 1, 4096),
    maxDraftTokensPerStep: int(o.maxDraftTokensPerStep ?? DEFAULT_MAX_DRAFT_TOKENS_PER_STEP, 'maxDraftTokensPerStep', 1, 1 << 16),
  };
}

/** Whether seq may draft at all: no output grammar, or one that can look ahead (token-constraint.ts). */
export function speculatesUnder(seq: Sequence): boolean {
  return seq.request.constraint === undefined || seq.request.constraint.countAhead !== undefined;
}

/** How one sequence's drafts have fared, and its prompt-lookup index once it has one. */
interface SequenceState {
  /** Exponential moving average of accepted / drafted, per draft. */
  acceptance: number;
  proposer?: NgramProposer;
}

/** Draft and acceptance counts since the speculator was made. */
export interface SpeculationStats {
  numDraftTokens: number;
  numAcceptedTokens: number;
}

export class Speculator {
  readonly options: ReturnType<typeof speculativeOptions>;
  private readonly states = new WeakMap<Sequence, SequenceState>();
  readonly stats: SpeculationStats = { numDraftTokens: 0, numAcceptedTokens: 0 };

  constructor(options: SpeculativeOptions) {
    this.options = speculativeOptions(options);
  }

  /** Whether rows may draft in a step planned while `numRunning` sequences run. */
  active(numRunning: number): boolean {
    return numRunning <= this.options.maxSpeculativeSeqs;
  }

  /**
   * Up to `limit` drafts to follow seq's pending token (its last generated one), or none when the
   * row must not draft (see the file comment). Call only for a decode row.
   */
  propose(seq: Sequence, limit: number): number[] {
    const constraint = seq.request.constraint;
    if (seq.inFlight.length > 0 || (constraint !== undefined && constraint.countAhead === undefined) || seq.numGeneratedTokens === 0) return [];
    const k = Math.min(limit, this.options.numSpeculativeTokens, seq.request.maxTokens - seq.numGeneratedTokens - 1,
      this.draftLimit(seq));
    if (k < 1) return [];
    const drafts = this.lookup(seq, k);
    // Under an output grammar, only the drafts it allows in a row (the rest could never be kept).
    return constraint === undefined || drafts.length === 0 ? drafts : drafts.slice(0, constraint.countAhead!(drafts));
  }

  /**
   * Drafts to ask the engine for while seq's row runs, to follow the token it samples (an EAGLE-3
   * head drafts in the engine, one step ahead); the planner asks only while active(). Undefined:
   * the proposer drafts on its own.
   */
  nextDrafts?(seq: Sequence): number;

  /** The drafts the engine made for seq in the step just applied (to follow its tokens as they are now). */
  receive?(seq: Sequence, drafts: number[]): void;

  /**
   * Drafts seq may verify at a time: K; 1 while its drafts keep failing; and once they almost never
   * agree (under MIN_ACCEPTANCE / 4), one draft every PROBE_EVERY tokens only, so that a proposer
   * with a cost of its own (a draft model, an EAGLE-3 head) stops paying it. `ahead`: the drafts are
   * for the row after the next (an EAGLE-3 head drafts one step ahead).
   */
  protected draftLimit(seq: Sequence, ahead = 0): number {
    const acceptance = this.state(seq).acceptance;
    if (acceptance < MIN_ACCEPTANCE / 4) return (seq.numGeneratedTokens + ahead) % PROBE_EVERY === 0 ? 1 : 0;
    return acceptance < MIN_ACCEPTANCE ? 1 : this.options.numSpeculativeTokens;
  }

  /** Whether propose() would consider seq's next row at all (a decode row it may draft for). */
  mayDraft(seq: Sequence): boolean {
    return seq.state === 'running' && seq.inFlight.length === 0 && speculatesUnder(seq) &&
      seq.numGeneratedTokens > 0 && seq.numGeneratedTokens < seq.request.maxTokens - 1 && seq.reportedPending === 1;
  }

  /**
   * Work to do before the next plan (a draft model proposes then); the batcher awaits it when no
   * step is in flight. Prompt lookup has none.
   */
  prepare?(running: readonly Sequence[]): Promise<void>;

  /** Frees what the speculator holds (a draft model's engine). The batcher calls it on dispose. */
  dispose(): void {}

  /**
   * At most k tokens to follow seq's known tokens (its prompt and generated tokens, the pending
   * one last): prompt lookup. A subclass may propose otherwise (tests propose known continuations).
   */
  protected lookup(seq: Sequence, k: number): number[] {
    const state = this.state(seq);
    state.proposer ??= new NgramProposer(DEFAULT_NGRAM);
    const proposer = state.proposer;
    if (proposer.length === 0) proposer.append(seq.request.promptTokenIds);
    const known = seq.numPromptTokens + seq.numGeneratedTokens;
    // Generated tokens only grow (a preempted sequence keeps them), so the proposer only appends.
    if (proposer.length < known) proposer.append(seq.generatedTokenIds.slice(proposer.length - seq.numPromptTokens));
    return proposer.propose(k);
  }

  /** A row's verification: `drafted` drafts, `accepted` of them kept. */
  record(seq: Sequence, drafted: number, accepted: number): void {
    if (drafted === 0) return;
    this.stats.numDraftTokens += drafted;
    this.stats.numAcceptedTokens += accepted;
    const state = this.state(seq);
    const w = Math.min(1, drafted / ACCEPTANCE_SPAN);
    state.acceptance += w * (accepted / drafted - state.acceptance);
  }

  private state(seq: Sequence): SequenceState {
    let state = this.states.get(seq);
    if (state === undefined) {
      state = { acceptance: 1 };
      this.states.set(seq, state);
    }
    return state;
  }
}
