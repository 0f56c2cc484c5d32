// The grammar worker (worker_threads): holds one model's xgrammar instance (WebAssembly), its
// compiled grammars and every sequence's matcher, so that compiling a schema and computing token
// masks never run on the event loop. Started by StructuredOutputs (structured-outputs.ts) from
// the compiled file dist/src/structured/grammar-worker.js. Messages, answered in order:
//   init    {tokens, special, vocabType, ...}  -> {reply, bytes, offsets}  (the tokens' bytes, "" where never allowed)
//   open    {matcher, key, kind, source}        -> {reply} | {reply, error}
//   ebnf    {kind, source}                      -> {reply, ebnf} | {reply, error}   (for the native engine)
//   masks   {ids, accepts: [matcher, token][]}  -> {reply, masks (transferred), failed: number[]}
//   close   {matcher}                           (no answer)

import { parentPort } from 'node:worker_threads';

import type * as XG from '@mlc-ai/web-xgrammar';

import { xgrammar } from './xgrammar.js';
import { buildGrammarVocabulary, CLEARS_STATE, KEEPS_STATE, tokenBytes, type GrammarVocabulary, type VocabType } from './vocabulary.js';

export type GrammarRequest =
  | { op: 'init'; reply: number; tokens: (string | undefined)[]; special: boolean[]; vocabType: VocabType; vocabSize: number;
      stopTokenIds: number[]; cacheSize: number; maxWhitespace: number }
  | { op: 'open'; reply: number; matcher: number; key: string; kind: GrammarKind; source: string }
  | { op: 'masks'; reply: number; ids: number[]; accepts: [number, number][] }
  | { op: 'ebnf'; reply: number; kind: GrammarKind; source: string }
  | { op: 'close'; matcher: number };

/** json_schema: a JSON schema's text; structural_tag: xgrammar's structural tag JSON (tool calls). */
export type GrammarKind = 'json_schema' | 'structural_tag';

export type GrammarAnswer =
  | { reply: number; error?: string; ebnf?: string; bytes?: Uint8Array; offsets?: Uint32Array }
  | { reply: number; masks: Uint32Array; failed: number[] };

interface Matcher {
  matcher: XG.GrammarMatcher;
  /** The ranged UTF-8 lead byte the output ends in alone, or 0. */
  lead: number;
  failed: boolean;
}

let state: {
  compiler: XG.GrammarCompiler;
  vocabulary: GrammarVocabulary;
  words: number;
  stopTokenIds: number[];
  cacheSize: number;
  maxWhitespace: number;
} | undefined;
const compiled = new Map<string, XG.CompiledGrammar>();
const matchers = new Map<number, Matcher>();

/** The vocabulary's bytes, concatenated, and where each token's begin (vocabSize + 1 offsets). */
function packedBytes(vocabulary: GrammarVocabulary, type: VocabType): { bytes: Uint8Array; offsets: Uint32Array } {
  const parts = vocabulary.encoded.map((t) => (t === '' ? new Uint8Array(0) : tokenBytes(t, type)));
  const offsets = new Uint32Array(parts.length + 1);
  parts.forEach((p, i) => { offsets[i + 1] = offsets[i]! + p.length; });
  const bytes = new Uint8Array(offsets[parts.length]!);
  parts.forEach((p, i) => bytes.set(p, offsets[i]!));
  return { bytes, offsets };
}

async function init(req: Extract<GrammarRequest, { op: 'init' }>): Promise<{ bytes: Uint8Array; offsets: Uint32Array }> {
  const xg = xgrammar();
  const vocabulary = buildGrammarVocabulary(req.tokens, req.special, req.vocabType, req.vocabSize);
  const info = await xg.TokenizerInfo.createTokenizerInfo(vocabulary.encoded, req.vocabType, false, req.vocabSize, req.stopTokenIds);
  state = {
    compiler: await xg.GrammarCompiler.createGrammarCompiler(info, false),
    vocabulary,
    words: Math.ceil(req.vocabSize / 32),
    stopTokenIds: req.stopTokenIds,
    cacheSize: req.cacheSize,
    maxWhitespace: req.maxWhitespace,
  };
  return packedBytes(vocabulary, req.vocabType);
}

/** The compiled grammar for `key` (least recently used out past the cache size). */
async function grammarFor(key: string, kind: GrammarKind, source: string): Promise<XG.CompiledGrammar> {
  const s = state!;
  let grammar = compiled.get(key);
  if (grammar !== undefined) {
    compiled.delete(key);
  } else {
    grammar = kind === 'json_schema'
      ? await s.compiler.compileJSONSchema(source, true, undefined, undefined, false, s.maxWhitespace)
      : await s.compiler.compileStructuralTag(source);
    while (compiled.size >= s.cacheSize) {
      const oldest = compiled.keys().next().value as string;
      compiled.get(oldest)!.dispose();  // matchers made from it keep their own reference
      compiled.delete(oldest);
    }
  }
  compiled.set(key, grammar);
  return grammar;
}

/** The grammar of a schema or structural tag as text (xgrammar's EBNF), for the native engine to compile. */
async function ebnf(req: Extract<GrammarRequest, { op: 'ebnf' }>): Promise<string> {
  const xg = xgrammar();
  const grammar = req.kind === 'json_schema'
    ? await xg.Grammar.fromJSONSchema(req.source, true, undefined, undefined, false, state!.maxWhitespace)
    : await xg.Grammar.fromStructuralTag(req.source);
  try {
    return grammar.toString();
  } finally {
    grammar.dispose();
  }
}

async function open(req: Extract<GrammarRequest, { op: 'open' }>): Promise<void> {
  const grammar = await grammarFor(req.key, req.kind, req.source);
  const matcher = await xgrammar().GrammarMatcher.createGrammarMatcher(grammar, state!.stopTokenIds);
  matchers.set(req.matcher, { matcher, lead: 0, failed: false });
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
        const { bytes, offsets } = await init(req);
        parentPort!.postMessage({ reply: req.reply, bytes, offsets }, [bytes.buffer as ArrayBuffer, offsets.buffer as ArrayBuffer]);
        return;
      }
      if (req.op === 'open') await open(req);
      else if (req.op === 'ebnf') {
        parentPort!.postMessage({ reply: req.reply, ebnf: await ebnf(req) });
        return;
      }
      else {
        const answer = await masks(req) as { reply: number; masks: Uint32Array; failed: number[] };
        parentPort!.postMessage(answer, [answer.masks.buffer as ArrayBuffer]);
        return;
      }
      parentPort!.postMessage({ reply: req.reply });
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      parentPort!.postMessage({ reply: req.reply, error: message });
      // A WebAssembly abort (its 2 GB heap exhausted, say) leaves the module unusable: end this
      // worker so that its sequences fail and the next request gets a fresh one.
      if (/abort/i.test(message)) setImmediate(() => process.exit(1));
    }
  });
});
