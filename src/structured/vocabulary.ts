// The model's vocabulary as the grammar engine sees it, made safe for JSON output.
//
// xgrammar matches tokens byte by byte and follows UTF-8's lead/continuation structure, but not
// its ranges: it accepts the lead bytes C0, C1 and F5-F7, overlong forms (E0 80, F0 80) and
// surrogates (ED A0), all of which decode to U+FFFD, so a constrained string could come out as
// replacement characters (and longer than its maxLength). Here:
//   - a token that can never be part of valid UTF-8 (an invalid byte, or a bad sequence inside
//     it), a special token, or a token holding a control character other than tab, newline and
//     carriage return (JSON never has one raw) becomes "" and is never allowed;
//   - for the four lead bytes whose second byte is range-limited (E0, ED, F0, F4), a mask of the
//     tokens that may follow when the output ends in that lead alone.

/** How a token changes the pending-lead state (see GrammarVocabulary.after). */
export const KEEPS_STATE = 0xff;
export const CLEARS_STATE = 0;

const RANGED_LEADS: Record<number, readonly [number, number]> = {
  0xe0: [0xa0, 0xbf], 0xed: [0x80, 0x9f], 0xf0: [0x90, 0xbf], 0xf4: [0x80, 0x8f],
};

export type VocabType = 'byte_level' | 'byte_fallback';

export interface GrammarVocabulary {
  /** Token strings by id for the compiler ("" = never allowed). */
  encoded: string[];
  /** Per token: KEEPS_STATE (no bytes), CLEARS_STATE, or the ranged lead byte the token ends in. */
  after: Uint8Array;
  /** Ranged lead byte -> mask of the tokens allowed next (bit v = token v). */
  allowedAfterLead: Map<number, Uint32Array>;
}

let byteLevelTable: Map<string, number> | undefined;

/** The byte-level BPE alphabet: printable bytes stand for themselves, the rest map to U+0100 on. */
function byteLevelBytes(): Map<string, number> {
  if (byteLevelTable) return byteLevelTable;
  const table = new Map<string, number>();
  let shifted = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table.set(String.fromCodePoint(printable ? b : 0x100 + shifted++), b);
  }
  return (byteLevelTable = table);
}

const encoder = new TextEncoder();

/** The bytes a token stands for, read the way the grammar compiler reads it. */
export function tokenBytes(token: string, type: VocabType): Uint8Array {
  if (type === 'byte_fallback') {
    const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(token);
    if (byte) return Uint8Array.of(parseInt(byte[1]!, 16));
    return encoder.encode(token.replace(/\u2581/g, ' '));
  }
  const table = byteLevelBytes();
  const out: number[] = [];
  for (const ch of token) {
    const b = table.get(ch);
    if (b !== undefined) out.push(b);
    else out.push(...encoder.encode(ch));  // an added token's plain text
  }
  return Uint8Array.from(out);
}

const isContinuation = (b: number) => (b & 0xc0) === 0x80;

/** Continuation bytes a lead byte needs, or -1 for a byte that never starts a character. */
function trailBytes(b: number): number {
  if (b < 0x80) return 0;
  if (b >= 0xc2 && b <= 0xdf) return 1;
  if (b >= 0xe0 && b <= 0xef) return 2;
  if (b >= 0xf0 && b <= 0xf4) return 3;
  return -1;
}

/**
 * Whether `bytes` can be a piece of valid UTF-8: up to three continuation bytes first (the end of a
 * character begun earlier), then whole characters, then perhaps the start of one.
 */
export function isUtf8Fragment(bytes: Uint8Array): boolean {
  let i = 0;
  while (i < bytes.length && i < 3 && isContinuation(bytes[i]!)) i++;
  while (i < bytes.length) {
    const lead = bytes[i]!;
    const trail = trailBytes(lead);
    if (trail < 0) return false;
    const range = RANGED_LEADS[lead];
    for (let k = 1; k <= trail; k++) {
      if (i + k >= bytes.length) return true;  // cut at the token's end
      const b = bytes[i + k]!;
      if (!isContinuation(b)) return false;
      if (k === 1 && range !== undefined && (b < range[0] || b > range[1])) return false;
    }
    i += trail + 1;
  }
  return true;
}

const hasRawControl = (bytes: Uint8Array) => bytes.some((b) => b < 0x20 && b !== 0x09 && b !== 0x0a && b !== 0x0d);

/**
 * Builds the compiler's view of a vocabulary. `tokens[id]` is the tokenizer's stored string
 * (undefined for ids past the tokenizer's vocabulary), `special[id]` marks special tokens.
 */
export function buildGrammarVocabulary(tokens: readonly (string | undefined)[], special: readonly boolean[], type: VocabType,
  vocabSize: number): GrammarVocabulary {
  const words = Math.ceil(vocabSize / 32);
  const encoded = new Array<string>(vocabSize).fill('');
  const after = new Uint8Array(vocabSize).fill(KEEPS_STATE);
  const allowedAfterLead = new Map<number, Uint32Array>();
  for (const lead of Object.keys(RANGED_LEADS)) allowedAfterLead.set(Number(lead), new Uint32Array(words).fill(0xffffffff));
  const forbid = (lead: number, id: number) => { allowedAfterLead.get(lead)![id >>> 5]! &= ~(1 << (id & 31)); };
  for (let id = 0; id < vocabSize; id++) {
    const token = tokens[id];
    if (token === undefined || token === '' || special[id]) continue;
    const bytes = tokenBytes(token, type);
    if (bytes.length === 0 || hasRawControl(bytes) || !isUtf8Fragment(bytes)) continue;
    encoded[id] = token;
    const last = bytes[bytes.length - 1]!;
    after[id] = RANGED_LEADS[last] !== undefined ? last : CLEARS_STATE;
    for (const [lead, [lo, hi]] of Object.entries(RANGED_LEADS)) {
      if (bytes[0]! < lo || bytes[0]! > hi) forbid(Number(lead), id);
    }
  }
  return { encoded, after, allowedAfterLead };
}
