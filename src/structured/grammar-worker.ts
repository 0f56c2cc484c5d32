// A grammar worker (worker_threads): one xgrammar instance (WebAssembly) for one model, in one of
// two roles, so that compiling a schema and computing token masks never run on the event loop.
// Started by StructuredOutputs (structured-outputs.ts, compile-workers.ts) from the compiled file
// dist/src/structured/grammar-worker.js.
//   - 'compile': sees untrusted schemas first. Turns a schema into grammar text (for the native
//     engine) or compiles it once against the vocabulary to prove it compiles, in time and within
//     memory, and to estimate its size; keeps nothing. Any error ends the worker; a compile past
//     its limit gets it terminated. It holds no matcher, so neither takes anyone else's sequences.
//   - 'matchers': holds compiled grammars (cached by bytes) and every sequence's matcher; compiles
//     only what a compile worker has already compiled. Any error ends it too; StructuredOutputs then
//     rebuilds its matchers elsewhere from their grammars and the tokens they had accepted.
// Messages, answered in order:
//   init    {role, tokens, special, vocabType, ...} -> {reply, bytes, offsets}  (matchers: the tokens' bytes, "" where never allowed)
//   warm    {vocabulary}                            -> {reply}                  (compile: the module loaded, the vocabulary indexed)
//   probe   {kind, source}                          -> {reply, grammarBytes, ms} | {reply, error}
//   ebnf    {kind, source}                          -> {reply, ebnf} | {reply, error}   (for the native engine)
//   open    {matcher, key, kind, source, grammarBytes, replay} -> {reply} | {reply, error}
//   masks   {ids, accepts: [matcher, token][]}      -> {reply, masks (transferred), failed: number[]}
//   close   {matcher}                               (no answer)

import { parentPort, workerData } from 'node:worker_threads';

import type * as XG from '@mlc-ai/web-xgrammar';

import { ByteLru, estimateGrammarBytes } from './grammar-cache.js';
import { exactStructuralTag, jsonSchemaGrammar, mayHoldNumericBounds } from './numeric-grammar.js';
import { xgrammar } from './xgrammar.js';
import { buildGrammarVocabulary, CLEARS_STATE, KEEPS_STATE, tokenBytes, type GrammarVocabulary, type VocabType } from './vocabulary.js';

/** Faults a test can inject into a compile (honoured only in a worker started with workerData.testHooks). */
export type GrammarFault = 'runtime-error' | 'abort' | 'hang' | 'exit';

export type GrammarRequest =
  | { op: 'init'; reply: number; role: 'compile' | 'matchers'; tokens: (string | undefined)[]; special: boolean[]; vocabType: VocabType;
      vocabSize: number; stopTokenIds: number[]; cacheSize: number; cacheBytes: number; maxWhitespace: number }
  | { op: 'warm'; reply: number; vocabulary: boolean }
  | { op: 'probe'; reply: number; kind: GrammarKind; source: string; fault?: GrammarFault }
  | { op: 'open'; reply: number; matcher: number; key: string; kind: GrammarKind; source: string; grammarBytes: number; replay: number[] }
  | { op: 'masks'; reply: number; ids: number[]; accepts: [number, number][] }
  | { op: 'ebnf'; reply: number; kind: GrammarKind; source: string; fault?: GrammarFault }
  | { op: 'close'; matcher: number };

/** json_schema: a JSON schema's text; structural_tag: xgrammar's structural tag JSON (tool calls). */
export type GrammarKind = 'json_schema' | 'structural_tag';

export type GrammarAnswer =
  | { reply: number; error?: string; ebnf?: string; bytes?: Uint8Array; offsets?: Uint32Array; grammarBytes?: number; ms?: number }
  | { reply: number; masks: Uint32Array; failed: number[] };

interface Matcher {
  matcher: XG.GrammarMatcher;
  /** The ranged UTF-8 lead byte the output ends in alone, or 0. */
  lead: number;
  failed: boolean;
}

type InitRequest = Extract<GrammarRequest, { op: 'init' }>;

let config: InitRequest | undefined;
let state: {
  compiler: XG.GrammarCompiler;
  vocabulary: GrammarVocabulary;
  words: number;
  stopTokenIds: number[];
  maxWhitespace: number;
} | undefined;
/** key -> compiled grammar (matchers role); an evicted grammar's matchers keep their own reference. */
let compiled: ByteLru<XG.CompiledGrammar> | undefined;
const matchers = new Map<number, Matcher>();
const testHooks = (workerData as { testHooks?: boolean } | null)?.testHooks === true;

/** The vocabulary's bytes, concatenated, and where each token's begin (vocabSize + 1 offsets). */
function packedBytes(vocabulary: GrammarVocabulary, type: VocabType): { bytes: Uint8Array; offsets: Uint32Array } {
  const parts = vocabulary.encoded.map((t) => (t === '' ? new Uint8Array(0) : tokenBytes(t, type)));
  const offsets = new Uint32Array(parts.length + 1);
  parts.forEach((p, i) => { offsets[i + 1] = offsets[i]! + p.length; });
  const bytes = new Uint8Array(offsets[parts.length]!);
  parts.forEach((p, i) => bytes.set(p, offsets[i]!));
  return { bytes, offsets };
}

async function init(req: InitRequest): Promise<{ bytes: Uint8Array; offsets: Uint32Array } | undefined> {
  config = req;
  compiled = new ByteLru<XG.CompiledGrammar>(req.cacheSize, req.cacheBytes, (g) => g.dispose());
  if (req.role === 'compile') return undefined;  // indexed when a probe first needs it (warm)
  await warm();
  return packedBytes(state!.vocabulary, req.vocabType);
}

/** Indexes the vocabulary for xgrammar's compiler, once. */
async function warm(): Promise<void> {
  if (state !== undefined) return;
  const req = config!;
  const xg = xgrammar();
  const vocabulary = buildGrammarVocabulary(req.tokens, req.special, req.vocabType, req.vocabSize);
  const info = await xg.TokenizerInfo.createTokenizerInfo(vocabulary.encoded, req.vocabType, false, req.vocabSize, req.stopTokenIds);
  state = {
    compiler: await xg.GrammarCompiler.createGrammarCompiler(info, false),
    vocabulary,
    words: Math.ceil(req.vocabSize / 32),
    stopTokenIds: req.stopTokenIds,
    maxWhitespace: req.maxWhitespace,
  };
}

/**
 * A schema with numeric bounds compiles from its grammar text, where our exact number rules
 * replace xgrammar's ranges (numeric-grammar.ts): the same text the native engine compiles. In a
 * structural tag, such a schema becomes a grammar content holding that text.
 */
async function compile(kind: GrammarKind, source: string): Promise<XG.CompiledGrammar> {
  const s = state!;
  if (kind === 'json_schema' && mayHoldNumericBounds(source)) return s.compiler.compileGrammar(await grammarText(kind, source));
  return kind === 'json_schema'
    ? s.compiler.compileJSONSchema(source, true, undefined, undefined, false, s.maxWhitespace)
    : s.compiler.compileStructuralTag(await exactStructuralTag(xgrammar(), source, s.maxWhitespace));
}

/** The grammar's text form: xgrammar's, with exact numeric ranges for a schema (numeric-grammar.ts). */
async function grammarText(kind: GrammarKind, source: string): Promise<string> {
  const xg = xgrammar();
  if (kind === 'json_schema') return jsonSchemaGrammar(xg, source, config!.maxWhitespace);
  const grammar = await xg.Grammar.fromStructuralTag(await exactStructuralTag(xg, source, config!.maxWhitespace));
  try {
    return grammar.toString();
  } finally {
    grammar.dispose();
  }
}

/** A test's fault, raised where the engine's own would be. */
function inject(fault: GrammarFault | undefined): void {
  if (fault === undefined || !testHooks) return;
  if (fault === 'runtime-error') throw new WebAssembly.RuntimeError('memory access out of bounds');
  if (fault === 'abort') throw new Error('[FATAL] injected. Aborted(). Build with -sASSERTIONS for more info.');
  if (fault === 'exit') process.exit(3);
  for (;;) { /* hang: a compile that never ends */ }
}

/** Compiles once to prove the grammar compiles, and estimates its size; keeps nothing. */
async function probe(req: Extract<GrammarRequest, { op: 'probe' }>): Promise<{ grammarBytes: number; ms: number }> {
  await warm();
  const t0 = performance.now();
  inject(req.fault);
  const grammar = await compile(req.kind, req.source);
  const ms = performance.now() - t0;
  grammar.dispose();
  // The length of the grammar's text form is part of the size estimate.
  return { grammarBytes: estimateGrammarBytes(ms, (await grammarText(req.kind, req.source)).length, config!.vocabSize), ms };
}

/** The compiled grammar for `key` (matchers role: only grammars a compile worker has compiled). */
async function grammarFor(key: string, kind: GrammarKind, source: string, grammarBytes: number): Promise<XG.CompiledGrammar> {
  const cached = compiled!.get(key);
  if (cached !== undefined) return cached;
  const grammar = await compile(kind, source);
  // Not kept (larger than the whole budget): the matcher holds its own reference; released below.
  if (!compiled!.set(key, grammar, grammarBytes)) uncached.add(grammar);
  return grammar;
}

/** Grammars too large to cache, disposed once their matcher is made. */
const uncached = new Set<XG.CompiledGrammar>();

/** The grammar of a schema or structural tag as text (xgrammar's EBNF, exact numbers), for the native engine to compile. */
async function ebnf(req: Extract<GrammarRequest, { op: 'ebnf' }>): Promise<string> {
  inject(req.fault);
  return grammarText(req.kind, req.source);
}

async function open(req: Extract<GrammarRequest, { op: 'open' }>): Promise<void> {
  const grammar = await grammarFor(req.key, req.kind, req.source, req.grammarBytes);
  const matcher = await xgrammar().GrammarMatcher.createGrammarMatcher(grammar, state!.stopTokenIds);
  if (uncached.delete(grammar)) grammar.dispose();
  const m: Matcher = { matcher, lead: 0, failed: false };
  for (const token of req.replay) accept(m, token);  // a matcher rebuilt after its worker ended
  matchers.set(req.matcher, m);
}

function accept(m: Matcher, token: number): void {
  if (m.failed) return;
  if (!m.matcher.acceptToken(token)) {
    m.failed = true;
    return;
  }
  const after = state!.vocabulary.after[token] ?? CLEARS_STATE;
  if (after !== KEEPS_STATE) m.lead = after;
}

async function masks(req: Extract<GrammarRequest, { op: 'masks' }>): Promise<GrammarAnswer> {
  const { words, vocabulary } = state!;
  for (const [id, token] of req.accepts) {
    const m = matchers.get(id);
    if (m !== undefined) accept(m, token);
  }
  const out = new Uint32Array(req.ids.length * words);
  const tail = vocabulary.after.length % 32;
  const tailMask = tail === 0 ? 0 : (2 ** tail - 1) >>> 0;
  const failed: number[] = [];
  for (let row = 0; row < req.ids.length; row++) {
    const id = req.ids[row]!;
    const m = matchers.get(id);
    const at = row * words;
    if (m === undefined || m.failed) {
      failed.push(id);
      out.fill(0xffffffff, at, at + words);
      continue;
    }
    const mask = await m.matcher.getNextTokenBitmask();
    out.set(new Uint32Array(mask.buffer, mask.byteOffset, Math.min(words, mask.length)), at);
    const allowed = m.lead === 0 ? undefined : vocabulary.allowedAfterLead.get(m.lead);
    if (allowed !== undefined) for (let w = 0; w < words; w++) out[at + w]! &= allowed[w]!;
    if (tailMask !== 0) out[at + words - 1]! &= tailMask;  // no ids past the vocabulary
  }
  return { reply: req.reply, masks: out, failed };
}

// One request at a time, in arrival order (a masks request must see the matchers its opens made).
let queue: Promise<void> = Promise.resolve();

parentPort?.on('message', (req: GrammarRequest) => {
  queue = queue.then(async () => {
    if (req.op === 'close') {
      matchers.get(req.matcher)?.matcher.dispose();
      matchers.delete(req.matcher);
      return;
    }
    try {
      if (req.op === 'init') {
        const packed = await init(req);
        if (packed === undefined) parentPort!.postMessage({ reply: req.reply });
        else parentPort!.postMessage({ reply: req.reply, ...packed }, [packed.bytes.buffer as ArrayBuffer, packed.offsets.buffer as ArrayBuffer]);
      } else if (req.op === 'masks') {
        const answer = await masks(req) as { reply: number; masks: Uint32Array; failed: number[] };
        parentPort!.postMessage(answer, [answer.masks.buffer as ArrayBuffer]);
      } else if (req.op === 'ebnf') {
        parentPort!.postMessage({ reply: req.reply, ebnf: await ebnf(req) });
      } else if (req.op === 'probe') {
        parentPort!.postMessage({ reply: req.reply, ...await probe(req) });
      } else {
        if (req.op === 'open') await open(req);
        else if (req.vocabulary) await warm();
        else (await xgrammar().Grammar.builtinJSONGrammar()).dispose();  // the WebAssembly module instantiated
        parentPort!.postMessage({ reply: req.reply });
      }
    } catch (err) {
      const message = err instanceof Error ? `${err.name === 'Error' ? '' : `${err.name}: `}${err.message}` : String(err);
      parentPort!.postMessage({ reply: req.reply, error: message });
      // Any error out of the WebAssembly module (an abort, "memory access out of bounds", any
      // RuntimeError, a C++ exception) may leave its heap corrupt: this instance ends, and the
      // next request gets a fresh one (a matchers worker's sequences are rebuilt there).
      setImmediate(() => process.exit(1));
    }
  });
});
