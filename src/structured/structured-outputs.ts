// Structured outputs for one model: JSON schemas compiled (xgrammar, WebAssembly) against the
// model's vocabulary, and per-sequence matchers that give the scheduler each step's allowed
// tokens as a bitmask and advance with each sampled token.
//
// All grammar work runs on worker threads (grammar-worker.ts), a few per model: compiling a schema
// can take seconds and a step's masks for a full batch milliseconds, neither of which may hold up
// the event loop. A sequence's matcher lives on one worker; the masks a step needs from a worker
// are asked for in one message (requests made in the same tick are coalesced), with the tokens
// sampled since, and the workers compute theirs in parallel. Compiled grammars are cached by schema
// in each worker. If a worker dies (a WebAssembly abort) or a compile runs past its time limit,
// its sequences fail and the next request starts a fresh one in its place.

import { existsSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';

import { SluiceError } from '../errors.js';
import type { SluiceTokenizer } from '../engine/tokenizer.js';
import type { GrammarAnswer, GrammarKind, GrammarRequest } from './grammar-worker.js';
import { nativeAvailable } from '../engine/native.js';
import { NativeGrammars } from './native-grammar.js';
import { checkResponseSchema } from './schema-check.js';
import type { VocabType } from './vocabulary.js';

/** A response format the engine enforces. */
export type ResponseFormat =
  | { type: 'json_schema'; schema: unknown; strict?: boolean; param?: string }
  | { type: 'json_object'; param?: string }
  /** xgrammar's structural tag (built by tool-grammar.ts for tool calls; its schemas already checked). */
  | { type: 'structural_tag'; tag: object; param?: string };

/** What the scheduler needs of a constrained sequence (see Batcher). */
export interface TokenConstraint {
  /** Writes the allowed next tokens into out[offset, offset + words) (bit v = token v). */
  fillMask(out: Uint32Array, offset: number): Promise<void>;
  /** Advances with a sampled token; false if the grammar does not allow it (see `failure`). */
  accept(tokenId: number): boolean;
  /** Why the constraint can go no further (its grammar engine stopped), once it cannot. */
  readonly failure?: Error | undefined;
  dispose(): void;
}

export interface StructuredOutputsOptions {
  /**
   * Compiled grammars kept per worker (default 8): at a 152k vocabulary one takes 30-190 MB of
   * xgrammar's WebAssembly heap, which ends at 2 GB.
   */
  cacheSize?: number;
  /** A schema still compiling after this long is refused and its worker replaced (default 60 s). */
  compileTimeoutMs?: number;
  /**
   * Grammar worker threads (default: a quarter of the CPUs, 1 to 4). A step's masks are computed
   * on all of them at once; each sequence's matcher lives on the least busy one when it starts,
   * and a schema is compiled once on each worker that needs it.
   */
  workers?: number;
  /**
   * Which engine matches tokens: 'native' (default where the addon is built: the C++ grammar
   * engine, fed grammar text that xgrammar makes from the schema) or 'xgrammar' (its WebAssembly
   * matcher on the workers, also the fallback for a grammar the native reader does not take).
   */
  engine?: 'native' | 'xgrammar';
  /**
   * Native engine: mask work done on the JS thread per tick, in suffixes walked (default 4,096,
   * about 100 us; see native-grammar.ts). 0 computes every changed mask on the libuv pool.
   */
  maskWorkOnEventLoop?: number;
}

/** Whitespace allowed between JSON elements (any whitespace, as vLLM's default, but bounded). */
const MAX_WHITESPACE = 16;

/** The compiled worker file, next to this module's compiled form. */
function workerPath(): string {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.js')) return here.replace(/structured-outputs\.js$/, 'grammar-worker.js');
  // Running from TypeScript sources (tests): use the compiled tree of this package.
  return here.replace(/src[/\\]structured[/\\]structured-outputs\.ts$/, 'dist/src/structured/grammar-worker.js');
}

export class StructuredOutputs {
  /** Mask words per row: ceil(logits width / 32). */
  readonly maskWords: number;
  private readonly cacheSize: number;
  private readonly compileTimeoutMs: number;
  private readonly workers: (GrammarWorker | undefined)[];
  private vocabulary: { tokens: (string | undefined)[]; special: boolean[] } | undefined;
  private disposed = false;
  private readonly engine: 'native' | 'xgrammar';
  private native: Promise<NativeGrammars | undefined> | undefined;
  private readonly maskWorkOnEventLoop: number | undefined;

  constructor(private readonly tokenizer: SluiceTokenizer, private readonly vocabSize: number, opts: StructuredOutputsOptions = {}) {
    this.maskWords = Math.ceil(vocabSize / 32);
    this.cacheSize = opts.cacheSize ?? 8;
    this.compileTimeoutMs = opts.compileTimeoutMs ?? 60_000;
    this.engine = opts.engine ?? (nativeAvailable() ? 'native' : 'xgrammar');
    this.maskWorkOnEventLoop = opts.maskWorkOnEventLoop;
    const size = opts.workers ?? Math.min(4, Math.max(1, Math.floor(os.availableParallelism() / 4)));
    this.workers = new Array<GrammarWorker | undefined>(Math.max(1, Math.floor(size))).fill(undefined);
  }

  /** Checks the format (400 on a schema it cannot enforce) and returns a fresh matcher for one sequence. */
  async constraint(format: ResponseFormat): Promise<TokenConstraint> {
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
    const param = format.param ?? 'response_format';
    const kind: GrammarKind = format.type === 'structural_tag' ? 'structural_tag' : 'json_schema';
    const source = format.type === 'json_object' ? '{"type":"object"}'
      : format.type === 'structural_tag' ? JSON.stringify(format.tag)
        : JSON.stringify(checkResponseSchema(format.schema, { strict: format.strict === true, param }).schema);
    const worker = this.leastBusyWorker();
    await worker.ready;
    const key = `${kind}:${source}`;
    // Structural tags (tool calls) stay on xgrammar: the grammar text it prints for one is not the
    // grammar its own compiler builds (it allows whitespace the compiled one does not), so the
    // printed form is not a faithful hand-over yet.
    if (this.engine === 'native' && kind === 'json_schema') {
      const native = await (this.native ??= worker.packed === undefined ? Promise.resolve(undefined)
        : NativeGrammars.create(worker.packed.bytes, worker.packed.offsets, [...this.tokenizer.eosTokenIds], this.maskWorkOnEventLoop)
          .then((n) => { worker.packed = undefined; return n; }, () => undefined));
      if (native !== undefined) {
        const grammar = await native.grammar(key, () => this.grammarText(worker, kind, source, param), this.compileTimeoutMs, param);
        if (grammar !== undefined) return native.constraint(grammar);
      }
    }
    const id = worker.nextMatcherId++;
    worker.open++;
    try {
      await worker.call({ op: 'open', reply: 0, matcher: id, key, kind, source }, this.compileTimeoutMs);
    } catch (err) {
      worker.open--;
      if (err instanceof CompileTimeout) {
        throw new SluiceError('invalid_request', `the schema took longer than ${this.compileTimeoutMs / 1000} s to compile into a grammar`, { param });
      }
      if (err instanceof SluiceError) throw err;
      throw new SluiceError('invalid_request', `the schema cannot be compiled into a grammar: ${(err as Error).message}`, { param });
    }
    return new WorkerConstraint(worker, id, this.maskWords);
  }

  /** xgrammar's text form of a schema's (or structural tag's) grammar, made on a worker. */
  private async grammarText(worker: GrammarWorker, kind: GrammarKind, source: string, param: string): Promise<string> {
    try {
      const answer = await worker.call({ op: 'ebnf', reply: 0, kind, source }, this.compileTimeoutMs) as { ebnf: string };
      return answer.ebnf;
    } catch (err) {
      if (err instanceof CompileTimeout) {
        throw new SluiceError('invalid_request', `the schema took longer than ${this.compileTimeoutMs / 1000} s to compile into a grammar`, { param });
      }
      if (err instanceof SluiceError) throw err;
      throw new SluiceError('invalid_request', `the schema cannot be compiled into a grammar: ${(err as Error).message}`, { param });
    }
  }

  /** Stops the workers; constraints still in use fail. Safe to call twice. */
  async dispose(): Promise<void> {
    this.disposed = true;
    const stopped = new SluiceError('engine_disposed', 'the engine has been disposed');
    await Promise.all(this.workers.map((w) => w?.stop(stopped)));
    this.workers.fill(undefined);
  }

  /** The worker with the fewest open matchers, started (or restarted, after a death) when its slot needs one. */
  private leastBusyWorker(): GrammarWorker {
    let best = 0;
    let bestLoad = Infinity;
    this.workers.forEach((w, i) => {
      const load = w === undefined || w.dead !== undefined ? 0.5 : w.open;  // an idle live worker first
      if (load < bestLoad) [best, bestLoad] = [i, load];
    });
    const current = this.workers[best];
    if (current !== undefined && current.dead === undefined) return current;
    if (!existsSync(workerPath())) {
      throw new SluiceError('engine_error', `structured outputs need the compiled grammar worker ${workerPath()} (npm run build:ts)`);
    }
    if (this.vocabulary === undefined) {
      const tokens = new Array<string | undefined>(this.vocabSize);
      const special = new Array<boolean>(this.vocabSize).fill(false);
      for (const [token, id] of this.tokenizer.vocab()) {
        if (id < 0 || id >= this.vocabSize) continue;
        tokens[id] = token;
        special[id] = this.tokenizer.isSpecial(id);
      }
      this.vocabulary = { tokens, special };
    }
    const worker = new GrammarWorker();
    worker.ready = worker.call({ op: 'init', reply: 0, ...this.vocabulary, vocabType: vocabType(this.tokenizer), vocabSize: this.vocabSize,
      stopTokenIds: [...this.tokenizer.eosTokenIds], cacheSize: this.cacheSize, maxWhitespace: MAX_WHITESPACE })
      .then((a) => {
        // The vocabulary's bytes, kept until the native engine has indexed them once.
        if (this.engine === 'native' && this.native === undefined) {
          const { bytes, offsets } = a as { bytes?: Uint8Array; offsets?: Uint32Array };
          if (bytes !== undefined && offsets !== undefined) worker.packed = { bytes, offsets };
        }
      }, (err: Error) => {
        throw err instanceof SluiceError ? err : new SluiceError('engine_error', `the grammar engine could not index the vocabulary: ${err.message}`);
      });
    worker.ready.catch(() => undefined);
    this.workers[best] = worker;
    return worker;
  }
}

class CompileTimeout extends Error {}

interface MaskRequest {
  constraint: WorkerConstraint;
  out: Uint32Array;
  offset: number;
  resolve(): void;
}

/** One worker thread and the calls waiting on it. */
class GrammarWorker {
  nextMatcherId = 1;
  /** Matchers open on this worker (the load a new sequence is placed by). */
  open = 0;
  /** Settles when the vocabulary is indexed (rejects if it could not be). */
  ready: Promise<void> = Promise.resolve();
  /** Why the worker stopped, once it has. */
  dead: Error | undefined;
  /** The vocabulary's bytes from init (for the native engine's index). */
  packed: { bytes: Uint8Array; offsets: Uint32Array } | undefined;
  private readonly worker: Worker;
  private readonly pending = new Map<number, { resolve(a: GrammarAnswer): void; reject(e: Error): void; timer?: NodeJS.Timeout }>();
  private nextReply = 1;
  /** Tokens sampled since the last masks request: [matcher, token], in order. */
  private accepts: [number, number][] = [];
  private batch: MaskRequest[] = [];

  constructor() {
    this.worker = new Worker(workerPath());
    this.worker.unref();
    this.worker.on('message', (a: GrammarAnswer) => this.answer(a));
    this.worker.on('error', (err) => this.fail(new SluiceError('engine_error', `the grammar engine failed: ${err.message}`)));
    this.worker.on('exit', (code) => this.fail(new SluiceError('engine_error', `the grammar engine stopped (exit code ${code})`)));
  }

  call(req: GrammarRequest, timeoutMs?: number): Promise<GrammarAnswer> {
    if (this.dead) return Promise.reject(this.dead);
    const reply = this.nextReply++;
    return new Promise((resolve, reject) => {
      const entry: { resolve(a: GrammarAnswer): void; reject(e: Error): void; timer?: NodeJS.Timeout } = { resolve, reject };
      if (timeoutMs !== undefined) {
        entry.timer = setTimeout(() => {
          this.pending.delete(reply);
          reject(new CompileTimeout());
          void this.stop(new SluiceError('engine_error', 'the grammar engine was restarted: a schema took too long to compile'));
        }, timeoutMs);
      }
      if (this.pending.size === 0) this.worker.ref();
      this.pending.set(reply, entry);
      this.worker.postMessage({ ...req, reply });
    });
  }

  accept(matcher: number, token: number): void {
    this.accepts.push([matcher, token]);
  }

  close(matcher: number): void {
    this.open--;
    if (this.dead) return;
    this.accepts = this.accepts.filter(([m]) => m !== matcher);
    this.worker.postMessage({ op: 'close', matcher } satisfies GrammarRequest);
  }

  /** Queues a mask; the masks asked for in one tick go to the worker in one message. */
  mask(req: MaskRequest): void {
    if (this.batch.push(req) === 1) queueMicrotask(() => this.flush());
  }

  async stop(reason: Error): Promise<void> {
    this.fail(reason);
    await this.worker.terminate();
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
    }, (err: Error) => {
      for (const r of batch) {
        r.constraint.fail(err);
        r.constraint.received(undefined, r.out, r.offset);
        r.resolve();
      }
    });
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

  private fail(reason: Error): void {
    this.dead ??= reason;
    for (const entry of this.pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(this.dead);
    }
    this.pending.clear();
  }
}

class WorkerConstraint implements TokenConstraint {
  failure: Error | undefined;
  private disposed = false;
  /** The mask the last sampled token was drawn under (for accept's check). */
  private lastMask: Uint32Array | undefined;

  constructor(private readonly worker: GrammarWorker, readonly id: number, readonly words: number) {}

  fillMask(out: Uint32Array, offset: number): Promise<void> {
    if (this.disposed || this.failure !== undefined || this.worker.dead !== undefined) {
      if (this.worker.dead !== undefined) this.fail(this.worker.dead);
      this.received(undefined, out, offset);  // an ended sequence: its token is dropped
      return Promise.resolve();
    }
    return new Promise((resolve) => this.worker.mask({ constraint: this, out, offset, resolve }));
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
    this.worker.accept(this.id, tokenId);
    return true;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.worker.close(this.id);
  }
}

/** byte_fallback for sentencepiece vocabularies (<0x0A> byte tokens), byte_level otherwise. */
function vocabType(tokenizer: SluiceTokenizer): VocabType {
  return tokenizer.tokenId('<0x0A>') !== undefined ? 'byte_fallback' : 'byte_level';
}
