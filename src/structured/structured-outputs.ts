// Structured outputs for one model: JSON schemas compiled against the model's vocabulary, and
// per-sequence matchers that give the scheduler each step's allowed tokens as a bitmask and advance
// with each sampled token.
//
// Grammar work never runs on the event loop, and a schema is treated as untrusted input to the
// grammar engine (xgrammar, WebAssembly):
//   - Every compile waits in the process's compile queue (compile-queue.ts): a few at once per
//     organization and in all, organizations served in turn; its time limit starts when it leaves.
//   - xgrammar first sees a schema on a compile worker (compile-workers.ts), which holds no
//     matcher: a crash, any WebAssembly error or a compile past its limit ends that worker and
//     fails that compile alone (a 400 without engine internals; the failure is remembered).
//   - Matchers run on the native engine (native-grammar.ts) or on matcher workers
//     (grammar-worker.ts, a few per model), which compile only what a compile worker has already
//     compiled, cache grammars by estimated bytes, and batch a step's masks in one message per
//     worker. Should a matcher worker still end, each of its sequences is rebuilt on a fresh one
//     from its grammar and the tokens it had accepted, so no other sequence fails with it.

import { existsSync } from 'node:fs';
import os from 'node:os';

import { SluiceError } from '../errors.js';
import type { SluiceTokenizer } from '../text/tokenizer.js';
import { nativeAvailable } from '../native/native.js';
import { CompileQueue, sharedCompileQueue } from './compile-queue.js';
import { CompileFailed, CompileTimeout, CompileWorkers, type CompileWorkerInit } from './compile-workers.js';
import { ByteLru } from './grammar-cache.js';
import { workerPath } from './grammar-thread.js';
import type { GrammarFault, GrammarKind } from './grammar-worker.js';
import { GrammarWorker, WorkerConstraint, type WorkerGrammar } from './matcher-worker.js';
import { NativeGrammars } from './native-grammar.js';
import { checkResponseSchema } from './schema-check.js';
import type { TokenConstraint } from './token-constraint.js';
import type { VocabType } from './vocabulary.js';

/** A response format the engine enforces. */
export type ResponseFormat =
  | { type: 'json_schema'; schema: unknown; strict?: boolean; param?: string }
  | { type: 'json_object'; param?: string }
  /** xgrammar's structural tag (built by tool-grammar.ts for tool calls; its schemas already checked). */
  | { type: 'structural_tag'; tag: object; param?: string };

export interface StructuredOutputsOptions {
  /**
   * Compiled grammars kept per matcher worker (default 8): at a 152k vocabulary one takes 30-190 MB
   * of xgrammar's WebAssembly heap, which ends at 2 GB.
   */
  cacheSize?: number;
  /** Estimated bytes of compiled grammars kept per matcher worker (default 768 MiB; see estimateGrammarBytes). */
  cacheBytes?: number;
  /**
   * A schema still compiling after this long (counted from when its compile starts, not from when
   * it was queued) is refused and its compile worker replaced (default 60 s).
   */
  compileTimeoutMs?: number;
  /**
   * Matcher worker threads (default: a quarter of the CPUs, 1 to 4). A step's masks are computed
   * on all of them at once; each sequence's matcher lives on the least busy one when it starts.
   */
  workers?: number;
  /** The queue compiles wait in (default: the process's one, shared by every model). */
  compileQueue?: CompileQueue;
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
  /** Tests only: a fault to inject into the compile of `source` (see GrammarFault). */
  testFault?: (source: string) => GrammarFault | undefined;
  /**
   * Where the grammar engine's own error texts go (default: console.warn). They never reach a
   * client: its error says only what failed, in a fixed sentence.
   */
  log?: (message: string) => void;
}

/** Who asks for a constraint. */
export interface ConstraintContext {
  /** The organization (its compiles are capped and queued in turn with the others'); '' for none. */
  tenant?: string;
}

/** Whitespace allowed between JSON elements (any whitespace, as vLLM's default, but bounded). */
const MAX_WHITESPACE = 16;
/**
 * Keys the native engine compiled lately, least recently used out: half of native-grammar.ts's
 * cache of 64, which sees the same keys in the same order, so a key here is still cached there and
 * is asked for without waiting in the compile queue.
 */
const NATIVE_KNOWN = 32;

export class StructuredOutputs {
  /** Mask words per row: ceil(logits width / 32). */
  readonly maskWords: number;
  private readonly cacheSize: number;
  private readonly cacheBytes: number;
  private readonly compileTimeoutMs: number;
  private readonly workers: (GrammarWorker | undefined)[];
  private readonly compiles: CompileWorkers;
  private readonly queue: CompileQueue;
  private vocabulary: { tokens: (string | undefined)[]; special: boolean[] } | undefined;
  private disposed = false;
  private readonly engine: 'native' | 'xgrammar';
  private native: Promise<NativeGrammars | undefined> | undefined;
  private readonly maskWorkOnEventLoop: number | undefined;
  private readonly testFault: ((source: string) => GrammarFault | undefined) | undefined;
  private readonly log: (message: string) => void;
  /** key -> the compiled grammar's estimated bytes, for grammars a compile worker compiled. */
  private readonly proven = new ByteLru<number>(4096, 64 << 20);
  /** key -> why its compile failed (answered again without a compile). */
  private readonly refused = new ByteLru<string>(1024, 16 << 20);
  /** Keys the native engine holds compiled (see NATIVE_KNOWN). */
  private readonly nativeKnown = new ByteLru<true>(NATIVE_KNOWN, Infinity);
  /** key -> its compile in progress, shared by every request for the same grammar. */
  private readonly inFlight = new Map<string, Promise<unknown>>();

  constructor(private readonly tokenizer: SluiceTokenizer, private readonly vocabSize: number, opts: StructuredOutputsOptions = {}) {
    this.maskWords = Math.ceil(vocabSize / 32);
    this.cacheSize = opts.cacheSize ?? 8;
    this.cacheBytes = opts.cacheBytes ?? 768 << 20;
    this.compileTimeoutMs = opts.compileTimeoutMs ?? 60_000;
    this.engine = opts.engine ?? (nativeAvailable() ? 'native' : 'xgrammar');
    this.maskWorkOnEventLoop = opts.maskWorkOnEventLoop;
    this.testFault = opts.testFault;
    this.log = opts.log ?? ((message) => console.warn(message));
    this.queue = opts.compileQueue ?? sharedCompileQueue();
    const size = opts.workers ?? Math.min(4, Math.max(1, Math.floor(os.availableParallelism() / 4)));
    this.workers = new Array<GrammarWorker | undefined>(Math.max(1, Math.floor(size))).fill(undefined);
    this.compiles = new CompileWorkers(() => this.workerInit(), this.queue.limits.total, opts.testFault !== undefined);
  }

  /** Checks the format (400 on a schema it cannot enforce) and returns a fresh matcher for one sequence. */
  async constraint(format: ResponseFormat, context: ConstraintContext = {}): Promise<TokenConstraint> {
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
    const param = format.param ?? 'response_format';
    const kind: GrammarKind = format.type === 'structural_tag' ? 'structural_tag' : 'json_schema';
    const source = format.type === 'json_object' ? '{"type":"object"}'
      : format.type === 'structural_tag' ? JSON.stringify(format.tag)
        : JSON.stringify(checkResponseSchema(format.schema, { strict: format.strict === true, param }).schema);
    return this.compiled(kind, source, param, context.tenant ?? '');
  }

  /**
   * A matcher for a grammar given as xgrammar takes it (the schema already checked, or a structural
   * tag): the layer under constraint()'s schema check.
   */
  async compiled(kind: GrammarKind, source: string, param: string, tenant: string): Promise<TokenConstraint> {
    const worker = this.leastBusyWorker();
    await worker.ready;
    const key = `${kind}:${source}`;
    const refusal = this.refused.get(key);
    if (refusal !== undefined) throw new SluiceError('invalid_request', refusal, { param });
    // Structural tags (tool calls) stay on xgrammar: the grammar text it prints for one is not the
    // grammar its own compiler builds (it allows whitespace the compiled one does not), so the
    // printed form is not a faithful hand-over yet.
    if (this.engine === 'native' && kind === 'json_schema') {
      const native = await (this.native ??= worker.packed === undefined ? Promise.resolve(undefined)
        : NativeGrammars.create(worker.packed.bytes, worker.packed.offsets, [...this.tokenizer.eosTokenIds], this.maskWorkOnEventLoop)
          .then((n) => { worker.packed = undefined; return n; }, () => undefined));
      if (native !== undefined) {
        const compile = () => native.grammar(key, () => this.grammarText(kind, source, param), this.compileTimeoutMs, param);
        const grammar = this.nativeKnown.get(key) !== undefined ? await compile()
          : await this.once(`native:${key}`, tenant, compile).then((g) => { this.nativeKnown.set(key, true, 0); return g; });
        if (grammar !== undefined) return native.constraint(grammar);
      }
    }
    const grammarBytes: number = this.proven.get(key) ?? await this.once<number>(`probe:${key}`, tenant, () => this.compileWorkerCall<number>(key, param, (timeoutMs) =>
      this.compiles.probe(kind, source, timeoutMs, this.testFault?.(source)).then((p) => {
        this.proven.set(key, p.grammarBytes, key.length);
        return p.grammarBytes;
      })));
    const grammar: WorkerGrammar = { key, kind, source, grammarBytes };
    const constraint = new WorkerConstraint(this, grammar, this.maskWords);
    await this.open(constraint);  // the least busy worker now, after the compile
    return constraint;
  }

  /** Opens (or, after its worker ended, rebuilds) a sequence's matcher on `worker`, replaying its tokens. */
  async open(constraint: WorkerConstraint, worker = this.leastBusyWorker()): Promise<void> {
    await worker.ready;
    const id = worker.nextMatcherId++;
    worker.open++;
    const { key, kind, source, grammarBytes } = constraint.grammar;
    try {
      // Its compile already finished within the limit on a compile worker: twice that is a backstop.
      await worker.call({ op: 'open', reply: 0, matcher: id, key, kind, source, grammarBytes, replay: constraint.tokens }, 2 * this.compileTimeoutMs);
    } catch (err) {
      worker.open--;
      throw this.hidden(err, 'engine_error', 'the grammar engine could not start a matcher');
    }
    constraint.attach(worker, id);
  }

  /** Runs one compile of `name` in the compile queue under `tenant`; requests for the same name share it. */
  private once<T>(name: string, tenant: string, work: () => Promise<T>): Promise<T> {
    let entry = this.inFlight.get(name) as Promise<T> | undefined;
    if (entry === undefined) {
      entry = this.queue.run(tenant, work).finally(() => this.inFlight.delete(name));
      this.inFlight.set(name, entry);
    }
    return entry;
  }

  /** A call on a compile worker, its failures as 400s (remembered, except time-outs). */
  private async compileWorkerCall<T>(key: string, param: string, call: (timeoutMs: number) => Promise<T>): Promise<T> {
    try {
      return await call(this.compileTimeoutMs);
    } catch (err) {
      if (err instanceof CompileTimeout) {
        throw new SluiceError('invalid_request', `the schema took longer than ${this.compileTimeoutMs / 1000} s to compile into a grammar`, { param });
      }
      if (err instanceof CompileFailed) {
        const refusal = this.hidden(err, 'invalid_request', 'the schema cannot be compiled into a grammar', param);
        this.refused.set(key, refusal.message, key.length);
        throw refusal;
      }
      throw err;
    }
  }

  /** xgrammar's text form of a schema's (or structural tag's) grammar, made on a compile worker. */
  private grammarText(kind: GrammarKind, source: string, param: string): Promise<string> {
    return this.compileWorkerCall(`${kind}:${source}`, param, (timeoutMs) => this.compiles.ebnf(kind, source, timeoutMs, this.testFault?.(source)));
  }

  /**
   * The error a client gets for `err`: a SluiceError as it is; anything else (the grammar engine's
   * own text, which may hold its internals) as `sentence` alone, the detail logged.
   */
  private hidden(err: unknown, code: 'engine_error' | 'invalid_request', sentence: string, param?: string): SluiceError {
    if (err instanceof SluiceError) return err;
    this.log(`structured outputs: ${sentence}: ${err instanceof Error ? err.message : String(err)}`);
    return new SluiceError(code, sentence, param === undefined ? undefined : { param });
  }

  /** Stops the workers; constraints still in use fail. Safe to call twice. */
  async dispose(): Promise<void> {
    this.disposed = true;
    const stopped = new SluiceError('engine_disposed', 'the engine has been disposed');
    await Promise.all([...this.workers.map((w) => w?.stop(stopped)), this.compiles.dispose()]);
    this.workers.fill(undefined);
  }

  get isDisposed(): boolean {
    return this.disposed;
  }

  /** The vocabulary every grammar worker indexes. */
  private workerInit(): CompileWorkerInit {
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
    return { ...this.vocabulary, vocabType: vocabType(this.tokenizer), vocabSize: this.vocabSize,
      stopTokenIds: [...this.tokenizer.eosTokenIds], cacheSize: this.cacheSize, cacheBytes: this.cacheBytes, maxWhitespace: MAX_WHITESPACE };
  }

  /** The worker with the fewest open matchers, started (or restarted, after a death) when its slot needs one. */
  private leastBusyWorker(): GrammarWorker {
    if (this.disposed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
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
    const worker = new GrammarWorker();
    // The first compile will need a compile worker too: started beside this one's indexing.
    this.compiles.prewarm(this.engine === 'xgrammar');
    worker.ready = worker.call({ op: 'init', reply: 0, role: 'matchers', ...this.workerInit() })
      .then((a) => {
        // The vocabulary's bytes, kept until the native engine has indexed them once.
        if (this.engine === 'native' && this.native === undefined) {
          const { bytes, offsets } = a as { bytes?: Uint8Array; offsets?: Uint32Array };
          if (bytes !== undefined && offsets !== undefined) worker.packed = { bytes, offsets };
        }
      }, (err: Error) => {
        throw this.hidden(err, 'engine_error', 'the grammar engine could not index the vocabulary');
      });
    worker.ready.catch(() => undefined);
    this.workers[best] = worker;
    return worker;
  }
}

/** byte_fallback for sentencepiece vocabularies (<0x0A> byte tokens), byte_level otherwise. */
function vocabType(tokenizer: SluiceTokenizer): VocabType {
  return tokenizer.tokenId('<0x0A>') !== undefined ? 'byte_fallback' : 'byte_level';
}
