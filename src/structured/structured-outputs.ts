// Structured outputs for one model: JSON schemas compiled (xgrammar, WebAssembly) against the
// model's vocabulary, and per-sequence matchers that give the scheduler each step's allowed
// tokens as a bitmask and advance with each sampled token. Compiled grammars are cached by
// schema (least recently used out).

import { SluiceError } from '../errors.js';
import type { SluiceTokenizer } from '../engine/tokenizer.js';
import { checkResponseSchema } from './schema-check.js';
import { xgrammar } from './xgrammar.js';

import type * as XG from '@mlc-ai/web-xgrammar';

/** A response format the engine enforces. */
export type ResponseFormat =
  | { type: 'json_schema'; schema: unknown; strict?: boolean; param?: string }
  | { type: 'json_object'; param?: string };

/** What the scheduler needs of a constrained sequence (see Batcher). */
export interface TokenConstraint {
  /** Writes the allowed next tokens into out[offset, offset + words) (bit v = token v). */
  fillMask(out: Uint32Array, offset: number): Promise<void>;
  /** Advances with a sampled token; false if the grammar does not allow it. */
  accept(tokenId: number): boolean;
  dispose(): void;
}

const CACHE_SIZE = 256;
/** Whitespace allowed between JSON elements (any whitespace, as vLLM's default, but bounded). */
const MAX_WHITESPACE = 16;

export class StructuredOutputs {
  private compiler: Promise<XG.GrammarCompiler> | undefined;
  private readonly cache = new Map<string, Promise<XG.CompiledGrammar>>();
  /** Mask words per row: ceil(logits width / 32). */
  readonly maskWords: number;

  constructor(private readonly tokenizer: SluiceTokenizer, private readonly vocabSize: number) {
    this.maskWords = Math.ceil(vocabSize / 32);
  }

  /** Checks the format (400 on a schema it cannot enforce) and returns a fresh matcher for one sequence. */
  async constraint(format: ResponseFormat): Promise<TokenConstraint> {
    const param = format.param ?? 'response_format';
    let key: string;
    let compile: (c: XG.GrammarCompiler) => Promise<XG.CompiledGrammar>;
    if (format.type === 'json_object') {
      key = 'json_object';
      compile = (c) => c.compileJSONSchema('{"type":"object"}', true, undefined, undefined, false, MAX_WHITESPACE);
    } else {
      const { schema } = checkResponseSchema(format.schema, { strict: format.strict === true, param });
      const text = JSON.stringify(schema);
      key = `schema:${text}`;
      compile = (c) => c.compileJSONSchema(text, true, undefined, undefined, false, MAX_WHITESPACE);
    }
    let compiled = this.cache.get(key);
    if (compiled === undefined) {
      compiled = this.getCompiler().then(compile);
      this.cache.set(key, compiled);
      while (this.cache.size > CACHE_SIZE) {
        const oldest = this.cache.keys().next().value as string;
        const evicted = this.cache.get(oldest)!;
        this.cache.delete(oldest);
        void evicted.then((g) => g.dispose(), () => undefined);
      }
    } else {
      this.cache.delete(key);
      this.cache.set(key, compiled);
    }
    let grammar: XG.CompiledGrammar;
    try {
      grammar = await compiled;
    } catch (err) {
      this.cache.delete(key);
      throw new SluiceError('invalid_request', `the schema cannot be compiled into a grammar: ${(err as Error).message ?? String(err)}`, { param });
    }
    const matcher = await xgrammar().GrammarMatcher.createGrammarMatcher(grammar, [...this.tokenizer.eosTokenIds]);
    return new XGrammarConstraint(matcher, this.maskWords);
  }

  private getCompiler(): Promise<XG.GrammarCompiler> {
    this.compiler ??= (async () => {
      const xg = xgrammar();
      const info = await xg.TokenizerInfo.createTokenizerInfo(encodedVocab(this.tokenizer, this.vocabSize), vocabType(this.tokenizer),
        false, this.vocabSize, [...this.tokenizer.eosTokenIds]);
      return xg.GrammarCompiler.createGrammarCompiler(info, false);
    })();
    return this.compiler;
  }
}

class XGrammarConstraint implements TokenConstraint {
  private disposed = false;
  private filling = 0;
  constructor(private readonly matcher: XG.GrammarMatcher, private readonly words: number) {}

  async fillMask(out: Uint32Array, offset: number): Promise<void> {
    if (this.disposed) {
      out.fill(0xffffffff, offset, offset + this.words);  // an ended sequence: its token is dropped
      return;
    }
    this.filling++;
    try {
      const mask = await this.matcher.getNextTokenBitmask();
      out.set(new Uint32Array(mask.buffer, mask.byteOffset, Math.min(this.words, mask.length)), offset);
    } finally {
      // A dispose() that came while the mask was being computed happens now.
      if (--this.filling === 0 && this.disposed) this.matcher.dispose();
    }
  }

  accept(tokenId: number): boolean {
    return !this.disposed && this.matcher.acceptToken(tokenId);
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    if (this.filling === 0) this.matcher.dispose();
  }
}

/**
 * Token strings by id as the tokenizer stores them. "" (never allowed in JSON) for special tokens
 * and for tokens holding a control character other than tab, newline and carriage return: JSON
 * never has one raw (in strings it is escaped), and the compiler's length-limited string rule
 * would otherwise let one through.
 */
function encodedVocab(tokenizer: SluiceTokenizer, vocabSize: number): string[] {
  const out = new Array<string>(vocabSize).fill('');
  for (const [token, id] of tokenizer.vocab()) {
    if (id < 0 || id >= vocabSize || tokenizer.isSpecial(id)) continue;
    if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/.test(tokenizer.tokenText(id))) continue;
    out[id] = token;
  }
  return out;
}

/** byte_fallback for sentencepiece vocabularies (<0x0A> byte tokens), byte_level otherwise. */
function vocabType(tokenizer: SluiceTokenizer): string {
  return tokenizer.tokenId('<0x0A>') !== undefined ? 'byte_fallback' : 'byte_level';
}
