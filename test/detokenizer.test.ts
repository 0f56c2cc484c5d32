// Unit tests of incremental detokenization (src/text/detokenizer.ts): text leaves only when
// complete (no U+FFFD from a split UTF-8 sequence), special tokens are skipped, and the pieces
// add up to the whole-text decode. First with a byte-per-token fake, then with the tiny demo
// model's byte-level BPE tokenizer (tokenizer files only, made by models/make-model.ts).

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { IncrementalDetokenizer } from '../src/text/detokenizer.js';
import { SluiceTokenizer, type DecodeOptions, type TokenDecoder } from '../src/text/tokenizer.js';

/** Token id = one UTF-8 byte (0..255); id 256 is a special "<eos>" token. */
class ByteTokenizer implements TokenDecoder {
  static readonly EOS = 256;
  encode(text: string): number[] {
    return [...new TextEncoder().encode(text)];
  }
  decode(tokenIds: readonly number[], options: DecodeOptions = {}): string {
    const skip = options.skipSpecialTokens ?? true;
    let text = '';
    let bytes: number[] = [];
    const flush = () => {
      text += new TextDecoder('utf-8', { fatal: false }).decode(Uint8Array.from(bytes));
      bytes = [];
    };
    for (const id of tokenIds) {
      if (id === ByteTokenizer.EOS) {
        flush();
        if (!skip) text += '<eos>';
      } else bytes.push(id);
    }
    flush();
    return text;
  }
}

function streamAll(detok: IncrementalDetokenizer, tokenIds: readonly number[]): string[] {
  return [...tokenIds.map((id) => detok.push(id)), detok.flush()];
}

describe('IncrementalDetokenizer (byte-per-token fake)', () => {
  const tokenizer = new ByteTokenizer();
  const text = 'héllo, 世界 🎉 done';

  it('emits only complete characters and adds up to the whole text', () => {
    const pieces = streamAll(new IncrementalDetokenizer(tokenizer), tokenizer.encode(text));
    for (const piece of pieces) expect(piece).not.toContain('\uFFFD');
    expect(pieces.join('')).toBe(text);
    // The 4-byte emoji arrives as one piece after its last byte, not before.
    const emojiStart = tokenizer.encode('héllo, 世界 ').length;
    expect(pieces.slice(emojiStart, emojiStart + 3)).toEqual(['', '', '']);
    expect(pieces[emojiStart + 3]).toBe('🎉');
  });

  it('uses prompt tokens only as context (nothing of the prompt is emitted)', () => {
    const prompt = tokenizer.encode('prompt: ');
    const pieces = streamAll(new IncrementalDetokenizer(tokenizer, prompt), tokenizer.encode(text));
    expect(pieces.join('')).toBe(text);
  });

  it('handles a prompt that ends inside a character', () => {
    const bytes = tokenizer.encode('€');   // 3 bytes
    const detok = new IncrementalDetokenizer(tokenizer, bytes.slice(0, 1));
    expect(detok.push(bytes[1]!)).toBe('');
    // The prompt's partial byte is context: the character completes but its start belongs to the prompt.
    expect(detok.push(bytes[2]!) + detok.push(tokenizer.encode('x')[0]!)).not.toContain('\uFFFD');
  });

  it('skips special tokens', () => {
    const ids = [...tokenizer.encode('ok'), ByteTokenizer.EOS];
    expect(streamAll(new IncrementalDetokenizer(tokenizer), ids).join('')).toBe('ok');
  });

  it('flushes an incomplete trailing character as U+FFFD, like a whole-text decode', () => {
    const ids = tokenizer.encode('a🎉').slice(0, 3);
    const pieces = streamAll(new IncrementalDetokenizer(tokenizer), ids);
    expect(pieces.slice(0, -1).join('')).toBe('a');
    expect(pieces.at(-1)).toBe(tokenizer.decode(ids).slice(1));
    expect(pieces.at(-1)).toContain('\uFFFD');
  });
});

describe('IncrementalDetokenizer (tiny model tokenizer)', () => {
  let dir: string;
  let tokenizer: SluiceTokenizer;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-detok-'));
    await makeModel({ preset: 'tiny', out: dir, weights: false });
    tokenizer = await SluiceTokenizer.load(dir);
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('streams multi-byte text split across byte-level tokens without U+FFFD', () => {
    const text = 'Hello wörld, 世界 🎉! Ünïcödé — “quotes” and more text.';
    const ids = tokenizer.encode(text);
    // The tokenizer really splits characters across tokens here.
    expect(ids.some((id) => tokenizer.tokenText(id).includes('\uFFFD'))).toBe(true);
    const pieces = streamAll(new IncrementalDetokenizer(tokenizer), ids);
    for (const piece of pieces) expect(piece).not.toContain('\uFFFD');
    expect(pieces.join('')).toBe(text);
  });

  it('agrees with the whole-output decode after a chat prompt, special tokens skipped', () => {
    const prompt = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    const imEnd = tokenizer.tokenId('<|im_end|>')!;
    const output = [...tokenizer.encode(' Grüße aus 東京'), imEnd];
    const pieces = streamAll(new IncrementalDetokenizer(tokenizer, prompt), output);
    expect(pieces.join('')).toBe(tokenizer.decode(output));
    expect(pieces.join('')).toBe(' Grüße aus 東京');
  });
});
