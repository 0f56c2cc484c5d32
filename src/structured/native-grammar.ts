// Structured outputs on the native grammar engine (native/src/grammar): grammars compiled in C++
// against the model's vocabulary and matchers whose masks for a step are filled on the libuv pool
// in one call. xgrammar (WebAssembly, on the grammar worker) still turns a JSON schema or a
// structural tag into grammar text; a grammar the native reader refuses stays on xgrammar.

import { SluiceError } from '../errors.js';
import {
  nativeAddon, type NativeCompiledGrammar, type NativeGrammarMatcher, type NativeGrammarVocabulary,
} from '../native/native.js';
import { ByteLru } from './grammar-cache.js';
import type { TokenConstraint } from './token-constraint.js';

/**
 * Compiled grammars kept: at most 64, and at most 512 MiB by their reported sizes (a grammar with
 * many long-string positions holds a mask cache per position: a tenant's schema of 25
 * `^x.{1000}$` properties was measured at 119 MB), least recently used evicted first.
 */
const GRAMMAR_CACHE_ENTRIES = 64;
const GRAMMAR_CACHE_BYTES = 512 * 2 ** 20;
/**
 * Mask work (TokenMatcher::fill_mask_within's units: suffixes walked) done on the JS thread per
 * tick: about 100 us on a 2-core Zen 5 at a 152k vocabulary (measured: work up to 4,096 took at most
 * 92 us). Masks past it, or whose caches are not compiled yet, go to the libuv pool, whose round
 * trip (50-100 us, and milliseconds when the cores are busy with a forward pass) is worth paying
 * only for those.
 */
export const SYNC_MASK_WORK_PER_TICK = 4096;

export class NativeGrammars {
  /** Grammar key -> its compile (in flight: 0 bytes until it settles, then the grammar's size). */
  private readonly compiled: ByteLru<Promise<NativeCompiledGrammar | undefined>>;
  /** Masks waiting for the pool; `ahead`: the drafts whose prefixes' masks follow the first. */
  private pending: { constraint: NativeConstraint; out: Uint32Array; offset: number; ahead?: readonly number[]; resolve(): void }[] = [];
  /** Mask work left for the JS thread in this tick (undefined: none asked yet this tick). */
  private syncWorkLeft: number | undefined;

  private constructor(private readonly vocabulary: NativeGrammarVocabulary, readonly words: number,
    private readonly syncWorkPerTick: number, cacheBytes: number) {
    this.compiled = new ByteLru(GRAMMAR_CACHE_ENTRIES, cacheBytes);
  }

  /**
   * Indexes a vocabulary (bytes and offsets as the grammar worker packs them). `syncWorkPerTick`:
   * mask work done on the JS thread per tick (default SYNC_MASK_WORK_PER_TICK; 0 sends every mask
   * that must be computed to the pool). `cacheBytes`: the compiled grammars' byte budget.
   */
  static async create(bytes: Uint8Array, offsets: Uint32Array, stopIds: number[], syncWorkPerTick = SYNC_MASK_WORK_PER_TICK,
    cacheBytes = GRAMMAR_CACHE_BYTES): Promise<NativeGrammars> {
    const addon = nativeAddon();
    const vocabulary = new addon.GrammarVocabulary(await addon.grammarVocabulary(bytes, offsets, Int32Array.from(stopIds)));
    return new NativeGrammars(vocabulary, Math.ceil(vocabulary.size / 32), syncWorkPerTick, cacheBytes);
  }

  /**
   * The compiled grammar for `key` (cached), or undefined when the native reader does not take this
   * grammar text (the caller then uses xgrammar). A compile past `timeoutMs` is a 400.
   */
  async grammar(key: string, text: () => Promise<string>, timeoutMs: number, param: string): Promise<NativeCompiledGrammar | undefined> {
    let entry = this.compiled.get(key);  // now the most recently used
    if (entry === undefined) {
      const compile = text().then(async (ebnf) => {
        const addon = nativeAddon();
        try {
          return new addon.CompiledGrammar(await addon.compileGrammar(this.vocabulary, ebnf, timeoutMs));
        } catch (err) {
          if (/time limit/.test((err as Error).message)) {
            throw new SluiceError('invalid_request', `the schema took longer than ${timeoutMs / 1000} s to compile into a grammar`, { param });
          }
          return undefined;  // a construct the native reader does not take
        }
      });
      entry = compile;
      this.compiled.set(key, compile, 0);
      // A compiled grammar is charged its size once known (if its compile is still the cached one:
      // an eviction in between keeps it out); a grammar the reader refused stays at 0 bytes, so it
      // is not tried again; a failed compile is not cached.
      compile.then((grammar) => {
        if (grammar !== undefined && this.compiled.peek(key) === compile) this.compiled.set(key, compile, grammar.bytes);
      }, () => { if (this.compiled.peek(key) === compile) this.compiled.delete(key); });
    }
    return entry;
  }

  constraint(grammar: NativeCompiledGrammar): TokenConstraint {
    return new NativeConstraint(this, new (nativeAddon().GrammarMatcher)(grammar));
  }

  /**
   * A row's mask, filled at once on this thread when that is cheap (its matcher's state unchanged
   * since its last mask, as inside a free string, or little work within this tick's budget: most
   * masks take a few microseconds); else queued, the rows asked for in one tick being filled in
   * one pool call per buffer.
   */
  mask(constraint: NativeConstraint, out: Uint32Array, offset: number): Promise<void> {
    if (this.syncWorkLeft === undefined) {
      this.syncWorkLeft = this.syncWorkPerTick;
      queueMicrotask(() => { this.syncWorkLeft = undefined; });
    }
    let work = -1;
    try {
      work = constraint.matcher.fillMaskWithin(out, offset, this.syncWorkLeft);
    } catch (err) {
      constraint.fail(new SluiceError('engine_error', `the output grammar could not be followed: ${(err as Error).message}`));
      out.fill(0xffffffff, offset, offset + this.words);  // the sequence is ending: its token is dropped
      return Promise.resolve();
    }
    if (work >= 0) {
      this.syncWorkLeft -= work;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      if (this.pending.push({ constraint, out, offset, resolve }) === 1) queueMicrotask(() => this.flush());
    });
  }

  /**
   * Speculative decoding: the masks after each prefix of `drafts`, from `offset` (1 + drafts.length
   * of them), always on the pool with the tick's other masks (a lookahead moves the matcher there
   * and back, so no mask of it is filled on this thread).
   */
  masksAhead(constraint: NativeConstraint, drafts: readonly number[], out: Uint32Array, offset: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.pending.push({ constraint, out, offset, ahead: drafts, resolve }) === 1) queueMicrotask(() => this.flush());
    });
  }

  private flush(): void {
    const batch = this.pending;
    this.pending = [];
    const byBuffer = new Map<Uint32Array, typeof batch>();
    for (const r of batch) {
      const group = byBuffer.get(r.out);
      if (group) group.push(r);
      else byBuffer.set(r.out, [r]);
    }
    for (const [out, rows] of byBuffer) {
      const settle = (failed: ArrayLike<number>, why?: Error) => {
        const bad = new Set(Array.from(failed));
        rows.forEach((r, i) => {
          if (why !== undefined || bad.has(i)) {
            r.constraint.fail(new SluiceError('engine_error', `the output grammar could not be followed: ${why?.message ?? 'too many parse stacks'}`));
            // The sequence is ending: its tokens are dropped.
            out.fill(0xffffffff, r.offset, r.offset + this.words * (1 + (r.ahead?.length ?? 0)));
          }
          r.resolve();
        });
      };
      const matchers = rows.map((r) => r.constraint.matcher), offsets = Uint32Array.from(rows.map((r) => r.offset));
      const ahead = rows.some((r) => r.ahead !== undefined && r.ahead.length > 0);
      const filled = ahead
        ? nativeAddon().fillGrammarMasks(matchers, out, offsets, Int32Array.from(rows.flatMap((r) => r.ahead ?? [])),
          Uint32Array.from(rows.map((r) => r.ahead?.length ?? 0)))
        : nativeAddon().fillGrammarMasks(matchers, out, offsets);
      filled.then((failed) => settle(failed), (err: Error) => settle([], err));
    }
  }
}

class NativeConstraint implements TokenConstraint {
  failure: Error | undefined;
  private disposed = false;

  constructor(private readonly owner: NativeGrammars, readonly matcher: NativeGrammarMatcher) {}

  fillMask(out: Uint32Array, offset: number): Promise<void> {
    if (this.disposed || this.failure !== undefined) {
      out.fill(0xffffffff, offset, offset + this.owner.words);  // an ended sequence: its token is dropped
      return Promise.resolve();
    }
    return this.owner.mask(this, out, offset);
  }

  fail(error: Error): void {
    this.failure ??= error;
  }

  countAhead(tokens: readonly number[]): number {
    if (this.disposed || this.failure !== undefined || tokens.length === 0) return 0;
    try {
      return this.matcher.countAhead(Int32Array.from(tokens.slice(0, 64)));
    } catch {
      return 0;  // drafts are optional: the next accept() reports what is wrong
    }
  }

  fillMasksAhead(tokens: readonly number[], out: Uint32Array, offset: number): Promise<void> {
    if (this.disposed || this.failure !== undefined) {
      out.fill(0xffffffff, offset, offset + this.owner.words * (1 + tokens.length));  // an ended sequence
      return Promise.resolve();
    }
    if (tokens.length === 0) return this.owner.mask(this, out, offset);
    return this.owner.masksAhead(this, tokens, out, offset);
  }

  accept(tokenId: number): boolean {
    if (this.disposed || this.failure !== undefined) return false;
    let ok: boolean;
    try {
      ok = this.matcher.accept(tokenId);
    } catch (err) {
      this.fail(new SluiceError('engine_error', `the output grammar could not be followed: ${(err as Error).message}`));
      return false;
    }
    if (!ok) this.fail(new SluiceError('engine_error', `the engine sampled token ${tokenId}, which the output grammar does not allow`));
    return ok;
  }

  dispose(): void {
    this.disposed = true;  // the matcher's memory goes with the last reference
  }
}
