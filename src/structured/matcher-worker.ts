// The matcher workers' side on the JS thread: one GrammarWorker per matcher worker thread (its
// open matchers, the masks asked for in one tick sent in one message, the tokens sampled since),
// and WorkerConstraint, one sequence's matcher there. A sequence keeps its grammar and every token
// it accepted, so that when its worker ends (any error ends one) it is rebuilt on a live worker in
// the same state instead of failing (at most MAX_REBUILDS times).

import { SluiceError } from '../errors.js';
import { GrammarThread } from './grammar-thread.js';
import type { GrammarAnswer, GrammarKind } from './grammar-worker.js';
import type { TokenConstraint } from './token-constraint.js';

/** Times a sequence's matcher is rebuilt after its worker ends before the sequence fails. */
const MAX_REBUILDS = 2;

/** What a constraint needs of its owner (StructuredOutputs). */
export interface MatcherOwner {
  /** Opens the constraint's matcher on the least busy live worker, replaying its tokens. */
  open(constraint: WorkerConstraint): Promise<void>;
  readonly isDisposed: boolean;
}

/** A grammar a compile worker has compiled, as a matcher worker is given it. */
export interface WorkerGrammar {
  key: string;
  kind: GrammarKind;
  source: string;
  grammarBytes: number;
}

interface MaskRequest {
  constraint: WorkerConstraint;
  out: Uint32Array;
  offset: number;
  resolve(): void;
}

/** One matcher worker thread: its open matchers and the masks asked for in this tick. */
export class GrammarWorker extends GrammarThread {
  nextMatcherId = 1;
  /** Matchers open on this worker (the load a new sequence is placed by). */
  open = 0;
  /** Settles when the vocabulary is indexed (rejects if it could not be). */
  ready: Promise<void> = Promise.resolve();
  /** The vocabulary's bytes from init (for the native engine's index). */
  packed: { bytes: Uint8Array; offsets: Uint32Array } | undefined;
  /** Tokens sampled since the last masks request: [matcher, token], in order. */
  private accepts: [number, number][] = [];
  private batch: MaskRequest[] = [];

  accept(matcher: number, token: number): void {
    this.accepts.push([matcher, token]);
  }

  close(matcher: number): void {
    this.open--;
    if (this.dead) return;
    this.accepts = this.accepts.filter(([m]) => m !== matcher);
    this.post({ op: 'close', matcher });
  }

  /** Queues a mask; the masks asked for in one tick go to the worker in one message. */
  mask(req: MaskRequest): void {
    if (this.batch.push(req) === 1) queueMicrotask(() => this.flush());
  }

  private flush(): void {
    const batch = this.batch;
    const accepts = this.accepts;
    this.batch = [];
    this.accepts = [];
    const words = batch[0]!.constraint.words;
    this.call({ op: 'masks', reply: 0, ids: batch.map((r) => r.constraint.id), accepts }).then((a) => {
      const { masks, failed } = a as Extract<GrammarAnswer, { masks: Uint32Array }>;
      const failedIds = new Set(failed);
      batch.forEach((r, row) => {
        if (failedIds.has(r.constraint.id)) r.constraint.fail(new SluiceError('engine_error', 'the output grammar refused a sampled token'));
        r.constraint.received(masks.subarray(row * words, (row + 1) * words), r.out, r.offset);
        r.resolve();
      });
    }, () => {
      // The worker ended (any error ends it): each sequence is rebuilt elsewhere and asks again.
      for (const r of batch) void r.constraint.fillMask(r.out, r.offset).then(r.resolve);
    });
  }
}

export class WorkerConstraint implements TokenConstraint {
  failure: Error | undefined;
  /** Every token accepted so far (replayed into a rebuilt matcher). */
  readonly tokens: number[] = [];
  worker: GrammarWorker | undefined;
  id = 0;
  private disposed = false;
  private rebuilds = 0;
  private rebuilding: Promise<void> | undefined;
  /** The mask the last sampled token was drawn under (for accept's check). */
  private lastMask: Uint32Array | undefined;

  constructor(private readonly owner: MatcherOwner, readonly grammar: WorkerGrammar, readonly words: number) {}

  attach(worker: GrammarWorker, id: number): void {
    this.worker = worker;
    this.id = id;
  }

  async fillMask(out: Uint32Array, offset: number): Promise<void> {
    if (this.worker?.dead !== undefined && !this.disposed && this.failure === undefined) await this.rebuild();
    if (this.disposed || this.failure !== undefined || this.worker === undefined || this.worker.dead !== undefined) {
      this.received(undefined, out, offset);  // an ended sequence: its token is dropped
      return;
    }
    const worker = this.worker;
    return new Promise((resolve) => worker.mask({ constraint: this, out, offset, resolve }));
  }

  /** A new matcher on a live worker, from the grammar and the tokens accepted so far; fails the sequence past MAX_REBUILDS. */
  private rebuild(): Promise<void> {
    this.rebuilding ??= (async () => {
      const dead = this.worker!.dead!;
      if (this.rebuilds++ >= MAX_REBUILDS || this.owner.isDisposed) {
        this.fail(dead);
        return;
      }
      try {
        await this.owner.open(this);
      } catch (err) {
        this.fail(err as Error);
      }
    })().finally(() => { this.rebuilding = undefined; });
    return this.rebuilding;
  }

  /** Called with the row's mask (or undefined: allow all, the sequence is ending). */
  received(mask: Uint32Array | undefined, out: Uint32Array, offset: number): void {
    if (mask === undefined || this.failure !== undefined) {
      out.fill(0xffffffff, offset, offset + this.words);
      this.lastMask = undefined;
      return;
    }
    out.set(mask, offset);
    this.lastMask = mask;
  }

  fail(error: Error): void {
    this.failure ??= error;
  }

  accept(tokenId: number): boolean {
    if (this.disposed || this.failure !== undefined) return false;
    const mask = this.lastMask;
    if (mask === undefined || tokenId < 0 || tokenId >= mask.length * 32 || ((mask[tokenId >>> 5]! >>> (tokenId & 31)) & 1) === 0) {
      this.fail(new SluiceError('engine_error', `the engine sampled token ${tokenId}, which the output grammar does not allow`));
      return false;
    }
    this.tokens.push(tokenId);
    this.worker!.accept(this.id, tokenId);
    return true;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.worker?.close(this.id);
  }
}
