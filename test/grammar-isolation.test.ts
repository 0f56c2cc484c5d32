// Grammar compilation isolated from other organizations (issue 27): the compile queue's caps and
// turn order, a byte-bounded grammar cache, and on the real grammar workers (xgrammar, WebAssembly;
// dist/ built): a compile that crashes, errs or loops fails only its own request, never another
// organization's open matcher or new compile; a compile's time limit starts when its work does;
// a matcher worker that ends has its sequences rebuilt, not failed. Faults are injected through
// StructuredOutputs' test hook, and real crashes go through the layer under the schema check.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { CompileQueue, sharedCompileQueue } from '../src/structured/compile-queue.js';
import { ByteLru } from '../src/structured/grammar-cache.js';
import { publicCompileError } from '../src/structured/grammar-thread.js';
import type { GrammarFault } from '../src/structured/grammar-worker.js';
import { StructuredOutputs } from '../src/structured/structured-outputs.js';
import type { TokenConstraint } from '../src/structured/token-constraint.js';

/** A job whose end the test decides. */
function deferred(): { promise: Promise<void>; resolve(): void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => { resolve = r; });
  return { promise, resolve };
}

describe('compile queue', () => {
  it('caps compiles per organization and in all, and serves waiting organizations in turn', async () => {
    const queue = new CompileQueue({ perTenant: 1, total: 2 });
    const started: string[] = [];
    const ends = new Map<string, () => void>();
    let running = 0;
    let maxRunning = 0;
    const perTenant = new Map<string, number>();
    const job = (tenant: string, name: string) => queue.run(tenant, async () => {
      started.push(name);
      running++;
      maxRunning = Math.max(maxRunning, running);
      perTenant.set(tenant, (perTenant.get(tenant) ?? 0) + 1);
      expect(perTenant.get(tenant)).toBe(1);
      const d = deferred();
      ends.set(name, d.resolve);
      await d.promise;
      running--;
      perTenant.set(tenant, perTenant.get(tenant)! - 1);
      return name;
    });
    const all = [job('a', 'a1'), job('a', 'a2'), job('a', 'a3'), job('b', 'b1'), job('c', 'c1')];
    await Promise.resolve();
    expect(started).toEqual(['a1', 'b1']);
    expect(queue.counts()).toEqual({ running: 2, waiting: 3 });
    ends.get('b1')!();
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual(['a1', 'b1', 'c1']);  // a is at its cap: c goes
    ends.get('a1')!();
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual(['a1', 'b1', 'c1', 'a2']);
    for (const name of ['c1', 'a2']) ends.get(name)!();
    await new Promise((r) => setImmediate(r));
    ends.get('a3')!();
    expect(await Promise.all(all)).toEqual(['a1', 'a2', 'a3', 'b1', 'c1']);
    expect(maxRunning).toBe(2);
  });

  it('round robin, not first come first served: one organization flooding waits its turn', async () => {
    const queue = new CompileQueue({ perTenant: 2, total: 2 });
    const started: string[] = [];
    const gates: (() => void)[] = [];
    const job = (tenant: string, name: string) => queue.run(tenant, async () => {
      started.push(name);
      const d = deferred();
      gates.push(d.resolve);
      await d.promise;
    });
    const flood = Array.from({ length: 10 }, (_, i) => job('flood', `f${i}`));
    const others = [job('x', 'x0'), job('y', 'y0'), job('x', 'x1')];
    await Promise.resolve();
    expect(started).toEqual(['f0', 'f1']);
    const finishOne = async () => { gates.shift()!(); await new Promise((r) => setImmediate(r)); };
    await finishOne();
    await finishOne();
    await finishOne();
    await finishOne();
    // x and y are not behind the flood's eight waiting compiles: each takes the next free slot.
    expect(started.slice(0, 6)).toEqual(['f0', 'f1', 'x0', 'y0', 'f2', 'x1']);
    while (gates.length > 0) await finishOne();
    await Promise.all([...flood, ...others]);
    expect(started.length).toBe(13);
  });

  it('a failing job frees its slot', async () => {
    const queue = new CompileQueue({ perTenant: 1, total: 1 });
    await expect(queue.run('a', () => Promise.reject(new Error('bad')))).rejects.toThrow('bad');
    await expect(queue.run('a', () => { throw new Error('sync'); })).rejects.toThrow('sync');
    expect(await queue.run('a', async () => 7)).toBe(7);
    expect(queue.counts()).toEqual({ running: 0, waiting: 0 });
  });
});

describe('grammar cache', () => {
  it('evicts least recently used entries by bytes, not only by count, and keeps nothing larger than the budget', () => {
    const evicted: string[] = [];
    const cache = new ByteLru<string>(100, 1000, (_, key) => evicted.push(key));
    cache.set('a', 'A', 400);
    cache.set('b', 'B', 400);
    expect(cache.get('a')).toBe('A');  // b is now the least recent
    cache.set('c', 'C', 400);
    expect(evicted).toEqual(['b']);
    expect(cache.bytes).toBe(800);
    expect(cache.set('huge', 'H', 1001)).toBe(false);
    expect(cache.has('huge')).toBe(false);
    expect(cache.size).toBe(2);
    cache.set('d', 'D', 900);
    expect(evicted).toEqual(['b', 'a', 'c']);
    expect(cache.bytes).toBe(900);
    const counted = new ByteLru<number>(2, Infinity);
    counted.set('x', 1, 1); counted.set('y', 2, 1); counted.set('z', 3, 1);
    expect(counted.has('x')).toBe(false);
  });

  it('engine internals never reach the error text', () => {
    for (const raw of ['[FATAL] x.cc:12: Aborted(). Build with -sASSERTIONS for more info.', 'RuntimeError: memory access out of bounds',
      'RuntimeError: unreachable', 'the grammar engine stopped (exit code 1)']) {
      expect(publicCompileError(raw)).toBe('the grammar engine cannot compile this schema');
    }
    expect(publicCompileError('[12:00:00] /src/json_schema_converter.cc:88: Unsupported type "foo"')).toBe('Unsupported type "foo"');
  });
});

let root: string;
let tokenizer: SluiceTokenizer;
let vocabSize: number;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-grammar-isolation-'));
  await makeModel({ preset: 'tiny', out: join(root, 'tiny'), seed: 5 });
  tokenizer = await SluiceTokenizer.load(join(root, 'tiny'));
  vocabSize = (JSON.parse(readFileSync(join(root, 'tiny', 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size;
});
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

const faults: Record<string, GrammarFault> = {
  '{"type":"string","title":"runtime-error"}': 'runtime-error',
  '{"type":"string","title":"abort"}': 'abort',
  '{"type":"string","title":"exit"}': 'exit',
  '{"type":"string","title":"hang"}': 'hang',
};

/** Walks a constraint a few tokens along its masks (the first allowed token that does not end the output). */
async function walk(c: TokenConstraint, words: number, steps: number): Promise<void> {
  const mask = new Uint32Array(words);
  const eos = new Set(tokenizer.eosTokenIds);
  for (let i = 0; i < steps; i++) {
    await c.fillMask(mask, 0);
    expect(c.failure).toBeUndefined();
    let token = -1;
    for (let t = 0; t < words * 32 && token < 0; t++) if (((mask[t >>> 5]! >>> (t & 31)) & 1) === 1 && !eos.has(t)) token = t;
    if (token < 0) return;
    expect(c.accept(token)).toBe(true);
  }
}

describe.each(['xgrammar', 'native'] as const)('grammar workers (%s engine)', (engine) => {
  it('a compile that crashes or errs in any way fails its own request only; its worker is recycled', { timeout: 120_000 }, async () => {
    const structured = new StructuredOutputs(tokenizer, vocabSize, {
      engine, workers: 1, compileQueue: new CompileQueue({ perTenant: 1, total: 2 }), testFault: (source) => faults[source],
    });
    try {
      // Organization B has a sequence under way (a tool call's structural tag: always on the matcher workers).
      const tag = { type: 'structural_tag', format: { type: 'json_schema', json_schema: { type: 'object' } } };
      const bOpen = await structured.constraint({ type: 'structural_tag', tag }, { tenant: 'b' });
      await walk(bOpen, structured.maskWords, 2);
      const compiles = (structured as unknown as { compiles: { started: number; recycled: number } }).compiles;
      for (const [i, source] of Object.keys(faults).filter((s) => faults[s] !== 'hang').entries()) {
        const before = compiles.recycled;
        const err = await structured.compiled('json_schema', source, 'response_format', 'a').catch((e: unknown) => e);
        expect(err).toBeInstanceOf(SluiceError);
        expect((err as SluiceError).code).toBe('invalid_request');
        expect((err as SluiceError).message).not.toMatch(/ASSERTIONS|Aborted|RuntimeError|memory access/);
        // Any failure recycles the instance; the next compile works.
        expect(compiles.recycled).toBe(before + 1);
        const fresh = await structured.constraint({ type: 'json_schema', schema: { type: 'integer', minimum: i } }, { tenant: 'b' });
        await walk(fresh, structured.maskWords, 1);
        fresh.dispose();
        // The same schema again is answered from memory, without a compile.
        const again = compiles.started;
        await expect(structured.compiled('json_schema', source, 'response_format', 'a')).rejects.toThrow(/cannot be compiled/);
        expect(compiles.started).toBe(again);
      }
      // A real engine crash, below the schema check that would refuse it up front.
      const crash = await structured.compiled('json_schema', '{"type":"string","pattern":"[]"}', 'response_format', 'a').catch((e: unknown) => e);
      if (crash instanceof SluiceError) expect(crash.message).not.toMatch(/ASSERTIONS|Aborted/);
      else (crash as TokenConstraint).dispose();
      // B's open matcher goes on; B's new compiles work.
      await walk(bOpen, structured.maskWords, 3);
      bOpen.dispose();
      const bNew = await structured.constraint({ type: 'json_schema', schema: { type: 'array', items: { type: 'integer' } } }, { tenant: 'b' });
      await walk(bNew, structured.maskWords, 3);
      bNew.dispose();
    } finally {
      await structured.dispose();
    }
  });

  it('a compile that fails with any text of the engine\'s own answers one fixed sentence; the text is only logged', { timeout: 120_000 }, async () => {
    const logged: string[] = [];
    const structured = new StructuredOutputs(tokenizer, vocabSize, { engine, workers: 1, compileQueue: new CompileQueue({ perTenant: 1, total: 1 }), log: (m) => logged.push(m) });
    try {
      // Below the schema check (which refuses an empty range): the grammar step fails with a plain-looking text of its own.
      const err = await structured.compiled('json_schema', '{"type":"integer","minimum":5,"maximum":3}', 'response_format', 'a').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SluiceError);
      expect((err as SluiceError).code).toBe('invalid_request');
      expect((err as SluiceError).param).toBe('response_format');
      expect((err as SluiceError).message).toBe('the schema cannot be compiled into a grammar');
      expect(logged.join('\n')).toMatch(/no value in it/);
    } finally {
      await structured.dispose();
    }
  });

  it('a looping compile is ended at its limit; a compile queued behind it is timed from its own start', { timeout: 120_000 }, async () => {
    const structured = new StructuredOutputs(tokenizer, vocabSize, {
      engine, workers: 1, compileTimeoutMs: 3000, compileQueue: new CompileQueue({ perTenant: 1, total: 1 }), testFault: (source) => faults[source],
    });
    try {
      // Warm the compile worker and open B's sequence first.
      const bOpen = await structured.constraint({ type: 'structural_tag', tag: { type: 'structural_tag', format: { type: 'json_schema', json_schema: { type: 'object' } } } },
        { tenant: 'b' });
      const t0 = performance.now();
      const hang = structured.compiled('json_schema', '{"type":"string","title":"hang"}', 'response_format', 'a').catch((e: unknown) => e);
      // Queued behind the hang (one compile at a time in all): waits about 3 s, then compiles on a fresh worker.
      const queued = structured.constraint({ type: 'json_schema', schema: { type: 'string', maxLength: 5 } }, { tenant: 'b' });
      const err = await hang;
      expect((err as SluiceError).message).toMatch(/took longer than 3 s to compile/);
      const c = await queued;
      expect(performance.now() - t0).toBeGreaterThan(3000);
      await walk(c, structured.maskWords, 2);
      c.dispose();
      await walk(bOpen, structured.maskWords, 2);
      bOpen.dispose();
    } finally {
      await structured.dispose();
    }
  });
});

it('a matcher worker that ends has its sequences rebuilt from their grammars and tokens, not failed', { timeout: 120_000 }, async () => {
  const structured = new StructuredOutputs(tokenizer, vocabSize, { engine: 'xgrammar', workers: 1 });
  try {
    const open = tokenizer.encode('{', { addBos: false })[0]!;
    const c = await structured.constraint({ type: 'json_object' }, { tenant: 'b' });
    const mask = new Uint32Array(structured.maskWords);
    await c.fillMask(mask, 0);
    expect(c.accept(open)).toBe(true);
    const reference = new Uint32Array(structured.maskWords);
    await c.fillMask(reference, 0);
    const workers = (structured as unknown as { workers: ({ stop(e: Error): Promise<void> } | undefined)[] }).workers;
    await workers[0]!.stop(new Error('killed by the test'));
    // The same state on a fresh worker: the mask after '{' again.
    await c.fillMask(mask, 0);
    expect(c.failure).toBeUndefined();
    expect(mask).toEqual(reference);
    const close = tokenizer.encode('}', { addBos: false })[0]!;
    if ((mask[close >>> 5]! >>> (close & 31)) & 1) expect(c.accept(close)).toBe(true);
    c.dispose();
  } finally {
    await structured.dispose();
  }
});

it('the engine: one organization\'s burst of schemas compiles a few at a time and another\'s is served beside it', { timeout: 180_000 }, async () => {
  const engine = await Engine.load({ model: join(root, 'tiny'), backend: 'cpu', kvCacheBytes: 64 << 20, maxNumSeqs: 32 });
  try {
    const queue = sharedCompileQueue();
    const run = queue.run.bind(queue);
    const starts: string[] = [];
    queue.run = (tenant, work) => run(tenant, () => { starts.push(tenant); return work(); });
    let maxRunning = 0;
    const sample = setInterval(() => { maxRunning = Math.max(maxRunning, queue.counts().running); }, 1);
    const burst = Array.from({ length: 12 }, (_, i) => engine.generate({
      prompt: `a ${i}`, maxTokens: 8, tenant: 'org-a', seed: i,
      responseFormat: { type: 'json_schema', schema: { type: 'object', properties: { [`k${i}`]: { type: 'string', pattern: `^y${i}[a-z]{0,20}$` } } } },
    }));
    await new Promise((r) => setImmediate(r));
    expect(queue.counts('org-a').running).toBeLessThanOrEqual(queue.limits.perTenant);
    const other = engine.generate({
      prompt: 'b', maxTokens: 8, tenant: 'org-b', seed: 1, responseFormat: { type: 'json_schema', schema: { type: 'array', items: { type: 'integer', minimum: 7 } } },
    });
    const results = await Promise.all([...burst, other]);
    clearInterval(sample);
    expect(results.every((r) => r.text.length > 0)).toBe(true);
    expect(maxRunning).toBeLessThanOrEqual(queue.limits.total);
    // Round robin: b's compile did not wait behind a's eleven others.
    expect(starts.indexOf('org-b')).toBeLessThanOrEqual(2);
    expect(starts.filter((t) => t === 'org-a').length).toBe(12);
    queue.run = run;
  } finally {
    await engine.dispose();
  }
});
