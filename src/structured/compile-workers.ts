// The compile workers of one model: grammar workers in the 'compile' role (grammar-worker.ts),
// where every schema is first seen by xgrammar. Each runs one compile at a time, so a compile's
// time limit starts when its work does; a compile that errs in any way (an abort, a WebAssembly
// RuntimeError, any exception) or runs past its limit ends its worker, and the next compile gets a
// fresh one. They hold no matcher: ending one fails only the compile it was running. Callers wait
// in the compile queue (compile-queue.ts) first, which bounds how many run at once.

import { SluiceError } from '../errors.js';
import { GrammarThread, GrammarTimeout, publicCompileError } from './grammar-thread.js';
import type { GrammarFault, GrammarKind, GrammarRequest } from './grammar-worker.js';

/** What a compile worker is started with (the model's vocabulary, as the matchers' workers get it). */
export type CompileWorkerInit = Omit<Extract<GrammarRequest, { op: 'init' }>, 'op' | 'reply' | 'role'>;

/** A compile that ran past its time limit. */
export class CompileTimeout extends Error {}
/** A compile the grammar engine failed (its worker was replaced); `message` is the engine's own text. */
export class CompileFailed extends Error {}

/** Indexing the vocabulary (untimed by the compile limit; about a second at 152k tokens) has this long. */
const WARM_TIMEOUT_MS = 120_000;

export class CompileWorkers {
  private readonly idle: GrammarThread[] = [];
  /** Workers whose module is loaded (false) or vocabulary indexed too (true). */
  private readonly warmed = new WeakMap<GrammarThread, boolean>();
  private numBusy = 0;
  private readonly waiters: (() => void)[] = [];
  private disposed = false;
  /** Settles when the prewarmed worker is ready (see prewarm). */
  private warming: Promise<void> | undefined;
  /** Compile workers started, and ended after a failed call, so far. */
  started = 0;
  recycled = 0;

  constructor(private readonly init: () => CompileWorkerInit, private readonly size: number, private readonly testHooks = false) {}

  /** Compiles the grammar once against the vocabulary (proving it compiles in time) and estimates its bytes. */
  probe(kind: GrammarKind, source: string, timeoutMs: number, fault?: GrammarFault): Promise<{ grammarBytes: number; ms: number }> {
    return this.run(true, { op: 'probe', reply: 0, kind, source, ...(fault !== undefined && { fault }) }, timeoutMs)
      .then((a) => a as { grammarBytes: number; ms: number });
  }

  /** xgrammar's text form of the grammar (for the native engine). */
  ebnf(kind: GrammarKind, source: string, timeoutMs: number, fault?: GrammarFault): Promise<string> {
    return this.run(false, { op: 'ebnf', reply: 0, kind, source, ...(fault !== undefined && { fault }) }, timeoutMs)
      .then((a) => (a as { ebnf: string }).ebnf);
  }

  /**
   * Starts a compile worker in the background (when none is started yet) and loads its module, and
   * its vocabulary index when `vocabulary`, so that the first compile does not wait for them.
   */
  prewarm(vocabulary: boolean): void {
    if (this.idle.length > 0 || this.numBusy > 0 || this.disposed) return;
    this.numBusy++;
    const worker = this.spawn();
    this.warming = worker.call({ op: 'warm', reply: 0, vocabulary }, WARM_TIMEOUT_MS).then(
      () => { this.warmed.set(worker, vocabulary); this.release(worker, true); },
      () => this.release(worker, false))
      .finally(() => { this.warming = undefined; });
  }

  async dispose(): Promise<void> {
    this.disposed = true;
    const stopped = new SluiceError('engine_disposed', 'the engine has been disposed');
    await Promise.all(this.idle.splice(0).map((w) => w.stop(stopped)));
  }

  private async run(needsVocabulary: boolean, req: GrammarRequest, timeoutMs: number): Promise<unknown> {
    const worker = await this.acquire(needsVocabulary);
    let healthy = false;
    try {
      const warmed = this.warmed.get(worker);
      if (warmed === undefined || (needsVocabulary && !warmed)) {
        await worker.call({ op: 'warm', reply: 0, vocabulary: needsVocabulary }, WARM_TIMEOUT_MS).catch((err: Error) => {
          throw new SluiceError('engine_error', `the grammar engine could not start: ${publicCompileError(err.message)}`);
        });
        this.warmed.set(worker, needsVocabulary);
      }
      // The worker has nothing ahead of this call: the time limit starts with the work. Whatever
      // ends it (an error, its thread's exit, the limit) is this compile's own failure.
      const answer = await worker.call(req, timeoutMs).catch((err: Error) => {
        throw err instanceof GrammarTimeout ? new CompileTimeout() : new CompileFailed(err.message);
      });
      healthy = true;
      return answer;
    } finally {
      this.release(worker, healthy);
    }
  }

  private async acquire(needsVocabulary: boolean): Promise<GrammarThread> {
    for (;;) {
      if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
      // A warmed idle worker first when the vocabulary is needed.
      let at = needsVocabulary ? this.idle.findIndex((w) => this.warmed.get(w) === true) : -1;
      if (at < 0 && this.idle.length > 0) at = this.idle.length - 1;
      if (at >= 0) {
        const [worker] = this.idle.splice(at, 1);
        this.numBusy++;
        return worker!;
      }
      if (this.warming !== undefined) {
        await this.warming;  // the worker being prewarmed, rather than a second one
        continue;
      }
      if (this.numBusy < this.size) {
        this.numBusy++;
        return this.spawn();
      }
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
  }

  private spawn(): GrammarThread {
    const worker = new GrammarThread(this.testHooks);
    this.started++;
    void worker.call({ op: 'init', reply: 0, role: 'compile', ...this.init() }).catch(() => undefined);
    return worker;
  }

  /** Back to the pool; a worker whose call failed in any way is ended (it may be corrupt). */
  private release(worker: GrammarThread, healthy: boolean): void {
    this.numBusy--;
    if (healthy && worker.dead === undefined && !this.disposed) {
      this.idle.push(worker);
    } else {
      this.recycled++;
      void worker.stop(new SluiceError('engine_error', 'the grammar engine was recycled after a failed compile'));
    }
    this.waiters.shift()?.();
  }
}
