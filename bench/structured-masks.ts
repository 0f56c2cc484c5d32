// Token-mask measurements of the structured-outputs bench (structured.ts): seeded walks through
// grammars, timed one sequence at a time and 32 in a step through StructuredOutputs (whichever
// grammar engine it runs), and, for comparison, the same walks computed by xgrammar's matcher in
// this thread (no worker, no messages) and the round trip of a worker that computes nothing.
import { Worker } from 'node:worker_threads';

import type { SluiceTokenizer } from '../src/text/tokenizer.js';
import { checkResponseSchema } from '../src/structured/schema-check.js';
import type { StructuredOutputs } from '../src/structured/structured-outputs.js';
import type { TokenConstraint } from '../src/structured/token-constraint.js';
import { buildGrammarVocabulary } from '../src/structured/vocabulary.js';
import { xgrammar } from '../src/structured/xgrammar.js';

/** A walk still going after this many tokens is cut (counted as not completed). */
export const MAX_WALK = 300;

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};
export const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
export const stats = (xs: number[]) => ({ n: xs.length, p50: quantile(xs, 0.5), p99: quantile(xs, 0.99), mean: mean(xs) });
export type Stats = ReturnType<typeof stats>;
const hrUs = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1000;

/** Per-token facts the walks pick by. */
export interface TokenClasses {
  vocabSize: number;
  /** [id]: the token's text ('' for ids the tokenizer lacks). */
  text: string[];
  /** [id]: 1 when blank (whitespace only). */
  blank: Uint8Array;
  /** [id]: 1 when the text has a '"'. */
  quoted: Uint8Array;
  /** Ids whose text has a '"' (inside a string: they end it). */
  quotes: Int32Array;
  /** Ids whose text has an '@' (inside an email: the way to its end). */
  ats: Int32Array;
  /** Ids whose text has a '"', ']' or '}' and no '[' or '{' (outside strings: they end values and containers, open none). */
  closers: Int32Array;
  /** Ids whose text has a ']' or '}' and no '[' or '{'. */
  enders: Int32Array;
  eos: number[];
}

export function tokenClasses(tokenizer: SluiceTokenizer, vocabSize: number): TokenClasses {
  const text = new Array<string>(vocabSize).fill('');
  const blank = new Uint8Array(vocabSize);
  const quoted = new Uint8Array(vocabSize);
  const quotes: number[] = [];
  const ats: number[] = [];
  const closers: number[] = [];
  const enders: number[] = [];
  for (const [, id] of tokenizer.vocab()) {
    if (id < 0 || id >= vocabSize) continue;
    const t = tokenizer.tokenText(id);
    text[id] = t;
    if (t.trim() === '') blank[id] = 1;
    if (t.includes('"')) {
      quoted[id] = 1;
      quotes.push(id);
    }
    if (t.includes('@')) ats.push(id);
    const opens = /[[{]/.test(t);
    if (/["\]}]/.test(t) && !opens) closers.push(id);
    if (/[\]}]/.test(t) && !opens) enders.push(id);
  }
  return { vocabSize, text, blank, quoted, quotes: Int32Array.from(quotes), ats: Int32Array.from(ats), closers: Int32Array.from(closers),
    enders: Int32Array.from(enders), eos: [...tokenizer.eosTokenIds] };
}

const allowed = (mask: Uint32Array, at: number, id: number) => ((mask[at + (id >>> 5)]! >>> (id & 31)) & 1) === 1;

/** One sequence walking its grammar: picks allowed tokens (seeded) and tracks whether it is inside a string. */
class Walk {
  steps = 0;
  done = false;
  inString = false;
  private escaped = false;
  private s: number;

  constructor(private readonly accept: (tokenId: number) => boolean, seed: number, private readonly classes: TokenClasses) {
    this.s = seed >>> 0 || 1;
  }

  private random(): number {
    // mulberry32
    let t = (this.s = (this.s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  private among(ids: Int32Array, mask: Uint32Array, at: number): number | undefined {
    const ok: number[] = [];
    for (const id of ids) if (allowed(mask, at, id)) ok.push(id);
    return ok.length === 0 ? undefined : ok[Math.floor(this.random() * ok.length)];
  }

  /**
   * The next token under the mask at mask[at, at + words): an end of output when allowed; else,
   * inside a string, with probability 0.08 (1 past 150 tokens) one with a quote (or an '@', for
   * emails), so that text runs about 12 tokens; outside strings, with a probability growing from 0.1
   * to 1 over 150 tokens, one that closes and opens nothing (past 120 tokens one that closes a
   * container); else any allowed non-blank token, inside a string one without a quote (a model
   * writing text does not end it at random).
   */
  pick(mask: Uint32Array, at: number, words: number): number {
    const c = this.classes;
    for (const id of c.eos) if (allowed(mask, at, id)) return id;
    const late = Math.min(1, this.steps / 150);
    if (this.random() < (this.inString ? (late === 1 ? 1 : 0.08) : 0.1 + 0.9 * late)) {
      const id = this.inString
        ? this.among(c.quotes, mask, at) ?? this.among(c.ats, mask, at)
        : (this.steps > 120 ? this.among(c.enders, mask, at) : undefined) ?? this.among(c.closers, mask, at);
      if (id !== undefined) return id;
    }
    for (let tries = 0; tries < 64; tries++) {
      const id = Math.floor(this.random() * c.vocabSize);
      if (allowed(mask, at, id) && c.blank[id] === 0 && !(this.inString && c.quoted[id] === 1)) return id;
    }
    // A narrow mask: choose among all its tokens.
    const ok: number[] = [];
    for (let w = 0; w < words; w++) {
      let bits = mask[at + w]!;
      while (bits !== 0) {
        const low = bits & -bits;
        ok.push(w * 32 + 31 - Math.clz32(low));
        bits ^= low;
      }
    }
    const solid = ok.filter((id) => c.blank[id] === 0);
    const pool = solid.length > 0 ? solid : ok;
    return pool[Math.floor(this.random() * pool.length)]!;
  }

  advance(token: number): void {
    if (!this.accept(token)) throw new Error(`the walk picked token ${token}, which its grammar refused`);
    this.steps++;
    if (this.classes.eos.includes(token)) {
      this.done = true;
      return;
    }
    for (const ch of this.classes.text[token]!) {
      if (!this.inString) this.inString = ch === '"';
      else if (this.escaped) this.escaped = false;
      else if (ch === '\\') this.escaped = true;
      else if (ch === '"') this.inString = false;
    }
  }
}

const popcount = (mask: Uint32Array, from = 0, to = mask.length) => {
  let n = 0;
  for (let w = from; w < to; w++) for (let v = mask[w]!; v !== 0; n++) v &= v - 1;
  return n;
};
/**
 * A state of free text: more than half the vocabulary allowed (inside a string without a pattern,
 * format or enum). Its masks are the slow ones: every token that holds a quote could end the string
 * there, and whether what follows the quote fits depends on the grammar's stack, so each is checked.
 */
const isFreeText = (allowedTokens: number, vocabSize: number) => allowedTokens > vocabSize / 2;

/** Times of one mask per token while walking each schema to its end, split by free text or not. */
async function walkEach<C extends Pick<TokenConstraint, 'accept' | 'dispose'>>(list: object[], words: number, classes: TokenClasses,
  open: (schema: object) => Promise<C>, fill: (constraint: C, mask: Uint32Array) => Promise<void>) {
  const mask = new Uint32Array(words);
  const freeText: number[] = [];
  const other: number[] = [];
  const lengths: number[] = [];
  const perSchema: { tokens: number; meanUs: number; maxUs: number }[] = [];
  let completed = 0;
  for (let i = 0; i < list.length; i++) {
    const constraint = await open(list[i]!);
    const walk = new Walk((t) => constraint.accept(t), 1 + i, classes);
    const times: number[] = [];
    while (!walk.done && walk.steps < MAX_WALK) {
      const t0 = process.hrtime.bigint();
      await fill(constraint, mask);
      const us = hrUs(t0);
      times.push(us);
      (isFreeText(popcount(mask), classes.vocabSize) ? freeText : other).push(us);
      walk.advance(walk.pick(mask, 0, words));
    }
    constraint.dispose();
    lengths.push(walk.steps);
    perSchema.push({ tokens: walk.steps, meanUs: mean(times), maxUs: Math.max(...times) });
    if (walk.done) completed++;
  }
  return {
    perTokenUs: stats([...freeText, ...other]), freeTextUs: stats(freeText), otherUs: stats(other),
    walks: { n: list.length, completed, tokens: stats(lengths) }, perSchema,
  };
}

/** (a) Each schema walked alone through StructuredOutputs: the time until fillMask resolves, per token. */
export function masksAlone(structured: StructuredOutputs, classes: TokenClasses, list: object[]) {
  return walkEach(list, structured.maskWords, classes, (schema) => structured.constraint({ type: 'json_schema', schema }),
    (c, mask) => c.fillMask(mask, 0));
}

/**
 * The same walks (same seeds, so the same tokens) computed by xgrammar in this thread, as the
 * grammar worker compiles and runs them (same vocabulary preparation and compile options; not its
 * check of multi-byte UTF-8 leads, which these walks almost never meet): the mask's compute time
 * with no worker and no messages.
 */
export async function masksInThread(tokenizer: SluiceTokenizer, classes: TokenClasses, list: object[]) {
  const xg = xgrammar();
  const { vocabSize, eos } = classes;
  const tokens = new Array<string | undefined>(vocabSize);
  const special = new Array<boolean>(vocabSize).fill(false);
  for (const [token, id] of tokenizer.vocab()) if (id < vocabSize) [tokens[id], special[id]] = [token, tokenizer.isSpecial(id)];
  const vocabulary = buildGrammarVocabulary(tokens, special, 'byte_level', vocabSize);  // Qwen's byte-level BPE
  const info = await xg.TokenizerInfo.createTokenizerInfo(vocabulary.encoded, 'byte_level', false, vocabSize, eos);
  const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
  const words = Math.ceil(vocabSize / 32);
  try {
    return await walkEach(list, words, classes, async (schema) => {
      const source = JSON.stringify(checkResponseSchema(schema, { strict: false, param: 'schema' }).schema);
      // The worker's options: any whitespace, at most 16 in a row (MAX_WHITESPACE).
      const grammar = await compiler.compileJSONSchema(source, true, undefined, undefined, false, 16);
      const matcher = await xg.GrammarMatcher.createGrammarMatcher(grammar, eos);
      return { matcher, accept: (t: number) => matcher.acceptToken(t), dispose: () => (matcher.dispose(), grammar.dispose()) };
    }, async (c, mask) => {
      const bits = await c.matcher.getNextTokenBitmask();
      mask.set(new Uint32Array(bits.buffer, bits.byteOffset, words));
    });
  } finally {
    compiler.dispose();
    info.dispose();
  }
}

/** (b) `rows` sequences asking in the same tick for `steps` steps; a finished one is replaced by a fresh one. */
export async function masksBatched(structured: StructuredOutputs, classes: TokenClasses, list: object[], rows: number, steps: number) {
  const words = structured.maskWords;
  const masks = new Uint32Array(rows * words);
  let started = 0;
  const start = async () => {
    const n = started++;
    const constraint = await structured.constraint({ type: 'json_schema', schema: list[n % list.length] });
    return { constraint, walk: new Walk((t) => constraint.accept(t), 1000 + n, classes) };
  };
  const seqs = await Promise.all(Array.from({ length: rows }, start));
  const stepUs: number[] = [];
  let completed = 0;
  let freeTextRows = 0;
  for (let step = 0; step < steps; step++) {
    const t0 = process.hrtime.bigint();
    await Promise.all(seqs.map((q, r) => q.constraint.fillMask(masks, r * words)));
    stepUs.push(hrUs(t0));
    for (let r = 0; r < rows; r++) {
      if (isFreeText(popcount(masks, r * words, (r + 1) * words), classes.vocabSize)) freeTextRows++;
      const { constraint, walk } = seqs[r]!;
      walk.advance(walk.pick(masks, r * words, words));
      if (walk.done || walk.steps >= MAX_WALK) {
        if (walk.done) completed++;
        constraint.dispose();
        seqs[r] = await start();
      }
    }
  }
  for (const q of seqs) q.constraint.dispose();
  return {
    perRowUs: stats(stepUs.map((us) => us / rows)), stepUs: stats(stepUs),
    freeTextRowsPercent: (100 * freeTextRows) / (steps * rows), sequencesCompleted: completed,
  };
}

/**
 * The floor of a fillMask round trip: a worker that answers each message with `rows` masks of
 * zeros (transferred, as the grammar worker answers) and computes nothing.
 */
export async function echoRoundTrip(words: number, rows: number, n: number): Promise<Stats> {
  const worker = new Worker(`const { parentPort } = require('node:worker_threads');
    parentPort.on('message', (m) => { const out = new Uint32Array(m.words * m.rows); parentPort.postMessage(out, [out.buffer]); });`, { eval: true });
  const masks = new Uint32Array(rows * words);
  const times: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const t0 = process.hrtime.bigint();
      const answer = await new Promise<Uint32Array>((resolve) => {
        worker.once('message', resolve);
        worker.postMessage({ words, rows });
      });
      masks.set(answer);
      times.push(hrUs(t0));
    }
  } finally {
    await worker.terminate();
  }
  return stats(times.slice(Math.min(10, n >> 1)));  // past the worker's start
}
