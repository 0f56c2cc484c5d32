// The native engine's compiled-grammar cache is bounded by bytes, not only by count (issue 27: one
// tenant's schema held 119 MB; 64 of them could hold gigabytes). A grammar past the budget evicts
// the least recently used; a refused grammar is remembered; a failed compile is not.
import { describe, expect, it } from 'vitest';

import { nativeAddon } from '../src/native/native.js';
import { NativeGrammars } from '../src/structured/native-grammar.js';

const nativeAvailable = () => {
  try {
    return typeof nativeAddon().compileGrammar === 'function';
  } catch {
    return false;
  }
};

// One token per ASCII character and a stop token.
const bytes = Uint8Array.from({ length: 128 }, (_, i) => i);
const offsets = Uint32Array.from({ length: 130 }, (_, i) => Math.min(i, 128));

describe.runIf(nativeAvailable())('native grammar cache', () => {
  it('evicts by bytes, least recently used first', async () => {
    const probe = await NativeGrammars.create(bytes, offsets, [128], 0);
    const one = (await probe.grammar('probe', async () => 'root ::= [a-z]{1,40}', 10_000, 'p'))!;
    expect(one.bytes).toBeGreaterThan(0);
    // Room for two such grammars, not three.
    const native = await NativeGrammars.create(bytes, offsets, [128], 0, Math.floor(one.bytes * 2.5));
    const texts: string[] = [];
    const compile = (key: string, text: string) => native.grammar(key, async () => { texts.push(key); return text; }, 10_000, 'p');
    await compile('a', 'root ::= [a-z]{1,40}');
    await compile('b', 'root ::= [b-z]{1,40}');
    await compile('a', 'root ::= [a-z]{1,40}');  // a hit: a is now the most recently used
    await compile('c', 'root ::= [c-z]{1,40}');  // over the budget: b goes
    await compile('a', 'root ::= [a-z]{1,40}');
    expect(texts).toEqual(['a', 'b', 'c']);
    await compile('b', 'root ::= [b-z]{1,40}');
    expect(texts).toEqual(['a', 'b', 'c', 'b']);
  });

  it('remembers a grammar the native reader refuses, and forgets a failed compile', async () => {
    const native = await NativeGrammars.create(bytes, offsets, [128], 0);
    let calls = 0;
    const refused = () => native.grammar('refused', async () => { calls++; return 'root ::= missing'; }, 10_000, 'p');
    expect(await refused()).toBeUndefined();
    expect(await refused()).toBeUndefined();
    expect(calls).toBe(1);
    let failures = 0;
    const failing = () => native.grammar('failing', async () => { failures++; throw new Error('no text'); }, 10_000, 'p');
    await expect(failing()).rejects.toThrow('no text');
    await expect(failing()).rejects.toThrow('no text');
    expect(failures).toBe(2);
  });
});
