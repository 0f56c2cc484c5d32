// A thinking budget as a token constraint: the output opens a think block (unless the prompt
// already did), reasons freely (but may not end) for at most `budget` tokens, and then the close
// tag is the only token allowed, so the answer always follows. After the block, an inner constraint (a JSON
// schema or tool-call grammar) applies to the answer alone.

import { SluiceError } from '../errors.js';
import type { TokenConstraint } from './token-constraint.js';

/** A model's think tags and their token ids (each one token). */
export interface ThinkingTags {
  open: string;
  close: string;
  openId: number;
  closeId: number;
}

/** Whether the prompt ends inside an open think block (a template that opens it for the model). */
export function promptOpensThinking(promptTokenIds: readonly number[], tags: Pick<ThinkingTags, 'openId' | 'closeId'>): boolean {
  const tail = promptTokenIds.slice(-3);
  return tail.lastIndexOf(tags.openId) > tail.lastIndexOf(tags.closeId);
}

export interface ThinkingPlan {
  /** Token ids of the open and close tags (e.g. <think> and </think>: one token each). */
  openId: number;
  closeId: number;
  /** Reasoning tokens at most, between the tags; then the close tag is forced. */
  budget: number;
  /** The prompt already opened the block (a template that ends its generation prompt in <think>). */
  opened: boolean;
  /** End-of-output tokens: not allowed inside the block, so the answer always follows it. */
  eosIds: readonly number[];
}

type Phase = 'before' | 'thinking' | 'answer';

export class ThinkingConstraint implements TokenConstraint {
  private phase: Phase;
  private reasoned = 0;
  private refused: Error | undefined;

  constructor(private readonly plan: ThinkingPlan, private readonly words: number, private readonly inner?: TokenConstraint) {
    this.phase = plan.opened ? 'thinking' : 'before';
  }

  get failure(): Error | undefined {
    return this.refused ?? this.inner?.failure;
  }

  fillMask(out: Uint32Array, offset: number): Promise<void> {
    if (this.phase === 'answer' && this.inner !== undefined) return this.inner.fillMask(out, offset);
    const only = this.phase === 'before' ? this.plan.openId
      : this.phase === 'thinking' && this.reasoned >= this.plan.budget ? this.plan.closeId : undefined;
    if (only === undefined) {
      out.fill(0xffffffff, offset, offset + this.words);
      if (this.phase === 'thinking') for (const id of this.plan.eosIds) out[offset + (id >>> 5)]! &= ~(1 << (id & 31));
    } else {
      out.fill(0, offset, offset + this.words);
      out[offset + (only >>> 5)]! |= 1 << (only & 31);
    }
    return Promise.resolve();
  }

  accept(tokenId: number): boolean {
    if (this.refused !== undefined) return false;
    switch (this.phase) {
      case 'before':
        if (tokenId !== this.plan.openId) return this.refuse(tokenId);
        this.phase = 'thinking';
        return true;
      case 'thinking':
        if (tokenId === this.plan.closeId) {
          this.phase = 'answer';
          return true;
        }
        if (this.reasoned >= this.plan.budget || this.plan.eosIds.includes(tokenId)) return this.refuse(tokenId);
        this.reasoned++;
        return true;
      case 'answer':
        return this.inner === undefined || this.inner.accept(tokenId);
    }
  }

  dispose(): void {
    this.inner?.dispose();
  }

  private refuse(tokenId: number): false {
    this.refused = new SluiceError('engine_error', `the engine sampled token ${tokenId} where the thinking budget allows only its tag`);
    return false;
  }
}
