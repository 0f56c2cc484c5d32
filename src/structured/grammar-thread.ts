// One grammar worker thread (grammar-worker.ts) and the calls waiting on it: each call is one
// message and one answer, matched by reply number. A call's time limit starts when it is posted,
// so callers post timed work only to a worker with nothing ahead of it (compile workers: one call
// at a time, after the vocabulary is indexed). The worker is dead once it exits, errs, or is
// stopped; every call waiting on it is then rejected with the reason.

import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';

import { SluiceError } from '../errors.js';
import type { GrammarAnswer, GrammarRequest } from './grammar-worker.js';

/** A call that ran past its time limit (the worker is stopped with it). */
export class GrammarTimeout extends Error {}

/** The compiled worker file, next to this module's compiled form. */
export function workerPath(): string {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.js')) return here.replace(/grammar-thread\.js$/, 'grammar-worker.js');
  // Running from TypeScript sources (tests): use the compiled tree of this package.
  return here.replace(/src[/\\]structured[/\\]grammar-thread\.ts$/, 'dist/src/structured/grammar-worker.js');
}

type Pending = { resolve(a: GrammarAnswer): void; reject(e: Error): void; timer?: NodeJS.Timeout };

export class GrammarThread {
  /** Why the worker stopped, once it has. */
  dead: Error | undefined;
  protected readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextReply = 1;

  constructor(testHooks = false) {
    this.worker = new Worker(workerPath(), { workerData: { testHooks } });
    this.worker.unref();
    this.worker.on('message', (a: GrammarAnswer) => this.answer(a));
    // What the engine said stays out of the message: it reaches clients (a sequence's failure).
    this.worker.on('error', () => this.fail(new SluiceError('engine_error', 'the grammar engine failed')));
    this.worker.on('exit', (code) => this.fail(new SluiceError('engine_error', `the grammar engine stopped (exit code ${code})`)));
  }

  /**
   * Posts one request; its answer, or a rejection: the worker's error text as an Error, a
   * GrammarTimeout past `timeoutMs` (the worker is then stopped), or the worker's death.
   */
  call(req: GrammarRequest, timeoutMs?: number): Promise<GrammarAnswer> {
    if (this.dead) return Promise.reject(this.dead);
    const reply = this.nextReply++;
    return new Promise((resolve, reject) => {
      const entry: Pending = { resolve, reject };
      if (timeoutMs !== undefined) {
        entry.timer = setTimeout(() => {
          this.pending.delete(reply);
          reject(new GrammarTimeout());
          void this.stop(new SluiceError('engine_error', 'the grammar engine was restarted: a grammar took too long to compile'));
        }, timeoutMs);
      }
      if (this.pending.size === 0) this.worker.ref();
      this.pending.set(reply, entry);
      this.worker.postMessage({ ...req, reply });
    });
  }

  /** Posts a message that has no answer. */
  post(req: GrammarRequest): void {
    if (!this.dead) this.worker.postMessage(req);
  }

  async stop(reason: Error): Promise<void> {
    this.fail(reason);
    await this.worker.terminate();
  }

  private answer(a: GrammarAnswer): void {
    const entry = this.pending.get(a.reply);
    if (entry === undefined) return;  // timed out meanwhile
    this.pending.delete(a.reply);
    clearTimeout(entry.timer);
    if (this.pending.size === 0) this.worker.unref();
    if ('error' in a && a.error !== undefined) {
      entry.reject(new Error(a.error));
    } else {
      entry.resolve(a);
    }
  }

  protected fail(reason: Error): void {
    this.dead ??= reason;
    for (const entry of this.pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(this.dead);
    }
    this.pending.clear();
  }
}

/**
 * The text a client sees for a grammar engine's error: a schema the engine itself refuses keeps
 * the engine's reason, minus its log prefix; anything from inside the WebAssembly module (aborts,
 * runtime errors, build hints such as "-sASSERTIONS") becomes one plain sentence.
 */
export function publicCompileError(message: string): string {
  if (/abort|assert|runtimeerror|memory access|out of bounds|unreachable|wasm|webassembly|stack|exit code|stopped|restarted|internal/i.test(message)) {
    return 'the grammar engine cannot compile this schema';
  }
  const text = message.replace(/^\s*\[[^\]]*\]\s*/, '').replace(/^[\w./-]+\.(cc|cpp|h):\d+:\s*/, '').replace(/\s+/g, ' ').trim();
  return text.length === 0 ? 'the grammar engine cannot compile this schema' : text.slice(0, 200);
}
