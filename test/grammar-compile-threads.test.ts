// Grammar compiles run on threads of their own, never on libuv's pool, where the engine's steps
// wait for a thread (issue 27: sixteen slow compiles stalled every organization's generation).
// A child process with a one-thread pool fills that thread with a long pbkdf2, then compiles a
// grammar: the compile must settle while the pool's only thread is still busy.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const root = join(import.meta.dirname, '..');

const CHILD = `
import { pbkdf2 } from 'node:crypto';
import { nativeAddon } from './dist/src/native/native.js';
const addon = nativeAddon();
const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
const offsets = Uint32Array.from({ length: 257 }, (_, i) => i);
const vocabulary = new addon.GrammarVocabulary(await addon.grammarVocabulary(bytes, offsets, Int32Array.of()));
const order = [];
// About a second of work on the pool's only thread.
const poolBusy = new Promise((resolve) => pbkdf2('x', 'salt', 1_500_000, 64, 'sha512', () => { order.push('pool'); resolve(); }));
const compiled = addon.compileGrammar(vocabulary, 'root ::= "{" [a-z]{1,8} "}"', 10_000)
  .then((g) => { order.push('compile'); return new addon.CompiledGrammar(g); });
const grammar = await compiled;
await poolBusy;
const matcher = new addon.GrammarMatcher(grammar);
console.log(JSON.stringify({ order, acceptsBrace: matcher.accept(123), rejectsDigit: !matcher.accept(48) }));
`;

describe('grammar compiles off the libuv pool', () => {
  it('settles while the only thread of the pool is busy', () => {
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', CHILD], {
      cwd: root, encoding: 'utf8', env: { ...process.env, UV_THREADPOOL_SIZE: '1' }, timeout: 60_000,
    });
    expect(child.status, child.stderr).toBe(0);
    const result = JSON.parse(child.stdout.trim().split('\n').pop()!) as { order: string[]; acceptsBrace: boolean; rejectsDigit: boolean };
    expect(result.order).toEqual(['compile', 'pool']);
    // The compiled grammar is real: '{' opens it, a digit cannot follow.
    expect(result.acceptsBrace).toBe(true);
    expect(result.rejectsDigit).toBe(true);
  });
});
