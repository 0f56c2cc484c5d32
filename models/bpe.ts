// A small byte-level BPE trainer and the tokenizer.json writer (GPT-2 / Qwen2 conventions).

import { GEMMA3_IMAGE_TOKENS, HARMONY_SPECIAL_TOKENS, QWEN2_VL_VISION_TOKENS } from './chat-templates.js';
import { CORPUS } from './corpus.js';

/** Qwen2's pre-tokenizer pattern, as it appears in tokenizer.json (Oniguruma syntax). */
export const QWEN2_SPLIT_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** The same pattern for JavaScript (no inline (?i:) groups before V8 12.4). */
const PRETOKENIZE_RE =
  /'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

/**
 * GPT-2's reversible byte -> printable character map. Returns the 256 (byte, char) pairs in
 * vocabulary order: printable bytes first ('!'..'~', '¡'..'¬', '®'..'ÿ'), then the rest mapped
 * to U+0100 and up.
 */
export function byteLevelAlphabet(): { bytes: number[]; chars: string[] } {
  const bytes: number[] = [];
  const push = (lo: number, hi: number) => {
    for (let b = lo; b <= hi; b++) bytes.push(b);
  };
  push(0x21, 0x7e);
  push(0xa1, 0xac);
  push(0xae, 0xff);
  const codes = bytes.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      codes.push(256 + n);
      n++;
    }
  }
  return { bytes, chars: codes.map((c) => String.fromCodePoint(c)) };
}

const ALPHABET = byteLevelAlphabet();
const BYTE_TO_CHAR: string[] = new Array(256);
ALPHABET.bytes.forEach((b, i) => (BYTE_TO_CHAR[b] = ALPHABET.chars[i]!));
const CHAR_TO_BYTE = new Map<string, number>();
ALPHABET.bytes.forEach((b, i) => CHAR_TO_BYTE.set(ALPHABET.chars[i]!, b));

const encoder = new TextEncoder();

/** UTF-8 bytes of `text` rendered with the byte-level alphabet (e.g. " the" -> "Ġthe"). */
export function toByteLevel(text: string): string {
  let out = '';
  for (const b of encoder.encode(text)) out += BYTE_TO_CHAR[b];
  return out;
}

/** Inverse of toByteLevel: the raw bytes behind a byte-level token string. */
export function fromByteLevel(token: string): Uint8Array {
  const out: number[] = [];
  for (const ch of token) {
    const b = CHAR_TO_BYTE.get(ch);
    if (b === undefined) throw new Error(`not a byte-level character: ${JSON.stringify(ch)}`);
    out.push(b);
  }
  return Uint8Array.from(out);
}

export function pretokenize(text: string): string[] {
  return text.match(PRETOKENIZE_RE) ?? [];
}

export interface TrainedBpe {
  /** Token strings in id order: the 256 byte characters, then one per merge. */
  tokens: string[];
  /** Merges in rank order, as [left, right] pairs of token strings. */
  merges: [string, string][];
}

/**
 * Classic BPE training: start from bytes, repeatedly merge the most frequent adjacent pair
 * (ties: the pair whose merged string sorts first), until `numMerges` merges or no pairs remain.
 */
export function trainBpe(corpus: string, numMerges: number): TrainedBpe {
  const tokens = ALPHABET.chars.slice();
  const idOf = new Map<string, number>(tokens.map((t, i) => [t, i]));
  const merges: [string, string][] = [];

  // Distinct pre-tokens with counts, each as an array of symbol ids.
  const counts = new Map<string, number>();
  for (const piece of pretokenize(corpus)) {
    const bl = toByteLevel(piece);
    counts.set(bl, (counts.get(bl) ?? 0) + 1);
  }
  const words: number[][] = [];
  const freq: number[] = [];
  for (const [w, c] of counts) {
    words.push(Array.from(w, (ch) => idOf.get(ch)!));
    freq.push(c);
  }

  const key = (a: number, b: number) => a * 65536 + b;
  const pairCount = new Map<number, number>();
  const pairWords = new Map<number, Set<number>>();
  const addWord = (wi: number, sign: number) => {
    const w = words[wi]!;
    for (let i = 0; i + 1 < w.length; i++) {
      const k = key(w[i]!, w[i + 1]!);
      pairCount.set(k, (pairCount.get(k) ?? 0) + sign * freq[wi]!);
      if (sign > 0) {
        let s = pairWords.get(k);
        if (!s) pairWords.set(k, (s = new Set()));
        s.add(wi);
      }
    }
  };
  for (let wi = 0; wi < words.length; wi++) addWord(wi, 1);

  while (merges.length < numMerges) {
    let bestKey = -1;
    let bestCount = 0;
    let bestStr = '';
    for (const [k, c] of pairCount) {
      if (c <= 0 || c < bestCount) continue;
      const str = tokens[Math.floor(k / 65536)]! + tokens[k % 65536]!;
      if (c > bestCount || str < bestStr) {
        bestKey = k;
        bestCount = c;
        bestStr = str;
      }
    }
    if (bestKey < 0) break;
    const a = Math.floor(bestKey / 65536);
    const b = bestKey % 65536;
    const merged = tokens.length;
    tokens.push(bestStr);
    idOf.set(bestStr, merged);
    merges.push([tokens[a]!, tokens[b]!]);
    for (const wi of pairWords.get(bestKey) ?? []) {
      const w = words[wi]!;
      addWord(wi, -1);
      const out: number[] = [];
      for (let i = 0; i < w.length; i++) {
        if (i + 1 < w.length && w[i] === a && w[i + 1] === b) {
          out.push(merged);
          i++;
        } else {
          out.push(w[i]!);
        }
      }
      words[wi] = out;
      addWord(wi, 1);
    }
    pairWords.delete(bestKey);
    pairCount.delete(bestKey);
  }
  return { tokens, merges };
}

let cachedSmall: TrainedBpe | undefined;
/** The project's trained tokenizer: 256 bytes + merges learned on CORPUS (cached, deterministic). */
export function smallBpe(bpeSize: number): TrainedBpe {
  if (!cachedSmall) cachedSmall = trainBpe(CORPUS, 2048 - 256);
  const n = Math.max(0, Math.min(bpeSize, cachedSmall.tokens.length) - 256);
  return { tokens: cachedSmall.tokens.slice(0, 256 + n), merges: cachedSmall.merges.slice(0, n) };
}

/** 32-bit PRNG for filler selection (mulberry32). */
function mulberry32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/**
 * Byte-level BPE vocabulary of exactly `size` entries: trained tokens, then unreachable fillers
 * (concatenations of two or three trained ASCII tokens that no merge produces; they decode to
 * ordinary text, so random big models still print readable words).
 */
export function buildVocab(size: number): { vocab: Record<string, number>; merges: [string, string][]; trained: number } {
  const bpe = smallBpe(size);
  const tokens = bpe.tokens.slice();
  const seen = new Set(tokens);
  const ascii = bpe.tokens.slice(256).filter((t) => /^[\x21-\x7e\u0120\u010a]+$/u.test(t));
  const next = mulberry32(0x5eed);
  while (tokens.length < size) {
    const parts = 2 + (next() % 2);
    let t = '';
    for (let i = 0; i < parts; i++) t += ascii[next() % ascii.length];
    if (seen.has(t)) continue;
    seen.add(t);
    tokens.push(t);
  }
  const vocab: Record<string, number> = {};
  tokens.forEach((t, i) => (vocab[t] = i));
  return { vocab, merges: bpe.merges, trained: bpe.tokens.length };
}

export interface SpecialToken {
  id: number;
  content: string;
  /** false: an added token that decodes as text (Qwen3's <think>, <tool_call>, ...). Default true. */
  special?: boolean;
}

/** Qwen3's added tokens that are not special: think blocks and tool calls decode as text. */
export const QWEN3_TEXT_TOKENS = ['<think>', '</think>', '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>'];

/** Added tokens of a family: the ChatML ones, then Qwen3's text tokens, Qwen2-VL's vision tokens or Gemma 3's image tokens; Llama 3's 256; gpt-oss's 9. */
export function numAddedTokens(family: TokenizerFamilyName): number {
  if (family === 'harmony') return HARMONY_SPECIAL_TOKENS.length;
  if (family === 'qwen2-vl') return 3 + QWEN2_VL_VISION_TOKENS.length;
  if (family === 'gemma3-vl') return 3 + GEMMA3_IMAGE_TOKENS.length;
  return family === 'chatml' ? 3 : family === 'qwen3' ? 3 + QWEN3_TEXT_TOKENS.length : 256;
}

type TokenizerFamilyName = 'chatml' | 'qwen3' | 'llama3' | 'harmony' | 'qwen2-vl' | 'gemma3-vl';

/** Special tokens of a family, with ids starting at `firstId`. */
export function specialTokens(family: TokenizerFamilyName, firstId: number): SpecialToken[] {
  // gpt-oss: the named tokens of o200k_harmony in its order, on consecutive ids (its reserved ones left out).
  if (family === 'harmony') return HARMONY_SPECIAL_TOKENS.map((content, i) => ({ id: firstId + i, content }));
  if (family === 'chatml' || family === 'qwen3' || family === 'qwen2-vl' || family === 'gemma3-vl') {
    const chatml = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map((content, i) => ({ id: firstId + i, content }));
    if (family === 'chatml') return chatml;
    if (family === 'qwen2-vl') return [...chatml, ...QWEN2_VL_VISION_TOKENS.map((content, i) => ({ id: firstId + 3 + i, content }))];
    if (family === 'gemma3-vl') return [...chatml, ...GEMMA3_IMAGE_TOKENS.map((content, i) => ({ id: firstId + 3 + i, content }))];
    return [...chatml, ...QWEN3_TEXT_TOKENS.map((content, i) => ({ id: firstId + 3 + i, content, special: false }))];
  }
  // Llama 3.1 layout of its 256 reserved ids.
  const named: Record<number, string> = {
    0: '<|begin_of_text|>',
    1: '<|end_of_text|>',
    4: '<|finetune_right_pad_id|>',
    6: '<|start_header_id|>',
    7: '<|end_header_id|>',
    8: '<|eom_id|>',
    9: '<|eot_id|>',
    10: '<|python_tag|>',
  };
  const out: SpecialToken[] = [];
  let reserved = 0;
  for (let i = 0; i < 256; i++) {
    out.push({ id: firstId + i, content: named[i] ?? `<|reserved_special_token_${reserved++}|>` });
  }
  return out;
}

export interface BuiltTokenizer {
  json: unknown;
  specials: SpecialToken[];
  /** Trained (reachable) BPE entries; the rest of the BPE vocabulary is filler. */
  trained: number;
}

const built = new Map<string, BuiltTokenizer>();

/** tokenizer.json (Hugging Face `tokenizers` format) for a byte-level BPE with specials.
 * Memoised per (size, family); treat the result as read-only. */
export function buildTokenizerJson(vocabSize: number, family: TokenizerFamilyName): BuiltTokenizer {
  const key = `${family}:${vocabSize}`;
  let t = built.get(key);
  if (!t) {
    t = buildTokenizerJsonUncached(vocabSize, family);
    built.set(key, t);
  }
  return t;
}

function buildTokenizerJsonUncached(vocabSize: number, family: TokenizerFamilyName): BuiltTokenizer {
  const nSpecial = numAddedTokens(family);
  if (vocabSize < 256 + nSpecial) {
    throw new Error(`vocabSize ${vocabSize} too small for the byte alphabet plus ${nSpecial} specials`);
  }
  const bpeSize = vocabSize - nSpecial;
  const { vocab, merges, trained } = buildVocab(bpeSize);
  const specials = specialTokens(family, bpeSize);
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  const json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: specials.map((s) => ({
      id: s.id,
      content: s.content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: s.special !== false,
    })),
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: QWEN2_SPLIT_PATTERN }, behavior: 'Isolated', invert: false },
        byteLevel,
      ],
    },
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  return { json, specials, trained };
}
