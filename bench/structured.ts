// Structured-outputs benchmark at Qwen2.5's vocabulary (151,936 logits):
//   npm run bench:structured -- [--quick] [--engine native|xgrammar] [--workers N] [--cache-size 8] [--out bench/results/structured-<machine>.json]
//
// 1. Vocabulary preparation: the first request of a model (worker start, vocabulary indexed, the
//    json_object grammar compiled), reported on its own.
// 2. Schema compile time: 30 distinct realistic schemas (structured-schemas.ts), each compiled
//    once and never seen before: the time of `constraint(format)`, p50 / p99.
// 3. Token-mask time while walking allowed tokens (structured-masks.ts): each step fills the mask,
//    picks an allowed token with a seeded PRNG (biased so that text runs ~12 tokens and a value
//    ends within ~200) and accepts it. (a) One sequence asking alone: the time until
//    TokenConstraint.fillMask resolves, as the batcher sees it (native engine: a cheap mask is
//    filled at once on this thread, the others on the libuv pool; xgrammar: a round trip to the
//    grammar worker), split into free text and the rest. (b) 32 sequences asking in the same tick
//    (how the batcher asks for a step's masks: Promise.all over the rows), a finished sequence
//    replaced by a fresh one so that every step has 32 rows: the step's time / 32 per row, and the
//    step's wall time. For comparison: the same walks computed by xgrammar's matcher in this
//    thread, and the round trip of a worker that computes nothing.
//    Targets (printed, not asserted): p50 <= 50 us, p99 <= 1 ms per token.
// 4. Throughput cost: decode tokens/s with a schema that cannot end within the run (an array of at
//    least MIN_ITEMS strings: free text, the costly masks) and without one, the same number of
//    tokens per sequence, same seeds, at batch 1 and 32, best of alternating pairs. On the tiny
//    shape given Qwen2.5's vocabulary (the same tokenizer; a forward pass so cheap that the masks
//    are most of a step: the worst case) and, without --quick, on qwen2.5-0.5b itself (random
//    weights; the forward pass of a real small model, which the masks overlap). Target: <= 5% at
//    batch 32.
// Prints a table and writes JSON naming the machine (CPU model and core count).
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';

import { makeModel } from '../models/make-model.js';
import { Engine } from '../src/engine/engine.js';
import { modelCacheDir } from '../src/engine/paths.js';
import { SluiceTokenizer } from '../src/text/tokenizer.js';
import { StructuredOutputs, type ResponseFormat } from '../src/structured/structured-outputs.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { machineInfo } from './machine.js';
import { echoRoundTrip, masksAlone, masksBatched, masksInThread, MAX_WALK, stats, tokenClasses, type Stats } from './structured-masks.js';
import { benchSchemas } from './structured-schemas.js';

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    workers: { type: 'string' },
    engine: { type: 'string', default: 'native' },
    'cache-size': { type: 'string', default: '8' },
    out: { type: 'string' },
  },
});
const quick = args.quick === true;
const grammarEngine = args.engine === 'xgrammar' ? 'xgrammar' : 'native';
const VOCAB = 151936;
const ROWS = 32;
/** The decode schema's minItems: more items than the run has tokens, so the value never ends early. */
const MIN_ITEMS = 4096;
/**
 * The schemas the batched walk cycles through (indices into benchSchemas()): no more than the
 * xgrammar engine's grammar cache holds. NOTE: at this vocabulary one compiled grammar takes 30-190 MB of xgrammar's
 * WebAssembly heap, which cannot pass 2 GB: about 17 grammars alive at once (cached, or held by
 * live matchers) abort the compiler, and that worker then fails every later request. Hence a
 * grammar cache of 8 here (the service's default is 256) and 8 distinct schemas among the 32 rows.
 */
const BATCHED_SCHEMAS = [0, 1, 3, 6, 9, 13, 16, 22];
const cacheSize = Number(args['cache-size']);
const TARGETS = { maskP50Us: 50, maskP99Us: 1000, decodeCostAtBatch32Percent: 5 };

/** Decode tokens/s with and without a never-ending schema, same lengths and seeds, best of alternating pairs. */
async function throughput(modelDir: string, rows: number, tokens: number, pairs: number) {
  const engine = await Engine.load({ model: modelDir, backend: 'cpu', kvCacheBytes: 256 << 20, maxNumSeqs: ROWS });
  try {
    const run = async (format: ResponseFormat | undefined) => {
      const t0 = performance.now();
      const results = await Promise.all(Array.from({ length: rows }, (_, i) => engine.generate({
        prompt: `sequence ${i}`, maxTokens: tokens, temperature: 1, seed: 1000 + i,
        ...(format !== undefined && { responseFormat: format }),
      })));
      const seconds = (performance.now() - t0) / 1000;
      const generated = results.reduce((n, r) => n + r.usage.completionTokens, 0);
      return { tokensPerSecond: generated / seconds, generated, seconds };
    };
    const format: ResponseFormat = { type: 'json_schema', schema: { type: 'array', items: { type: 'string' }, minItems: MIN_ITEMS } };
    await run(format);  // warm-up: compile, first steps
    await run(undefined);
    // Alternating pairs, the best of each: a shared machine's noise inflates one run, not both.
    type Run = Awaited<ReturnType<typeof run>>;
    const best = (a: Run | undefined, b: Run) => (a === undefined || b.tokensPerSecond > a.tokensPerSecond ? b : a);
    let plain: Run | undefined;
    let constrained: Run | undefined;
    for (let pair = 0; pair < pairs; pair++) {
      constrained = best(constrained, await run(format));
      plain = best(plain, await run(undefined));
    }
    if (plain!.generated !== rows * tokens || constrained!.generated !== rows * tokens) {
      process.stderr.write(`warning: ${rows} x ${tokens} tokens asked, generated ${plain!.generated} plain and ${constrained!.generated} constrained\n`);
    }
    return { rows, tokensPerSequence: tokens, pairs, plain: plain!, constrained: constrained!,
      costPercent: 100 * (1 - constrained!.tokensPerSecond / plain!.tokensPerSecond) };
  } finally {
    await engine.dispose();
  }
}

/** The tiny shape with Qwen2.5's vocabulary (and so its tokenizer), made once in the model cache. */
async function tinyWithQwenVocab(): Promise<string> {
  const dir = join(modelCacheDir(), `tiny-vocab${VOCAB}-bf16`);
  if (!existsSync(join(dir, 'config.json'))) await makeModel({ preset: 'tiny', out: dir, dtype: 'bf16', seed: 0, overrides: { vocabSize: VOCAB } });
  return dir;
}

async function main(): Promise<void> {
  const loadBefore = os.loadavg();
  const tmp = mkdtempSync(join(os.tmpdir(), 'sluice-bench-structured-'));
  let tokenizer: SluiceTokenizer;
  try {
    await makeModel({ preset: 'qwen2.5-0.5b', out: tmp, seed: 0, weights: false });
    tokenizer = await SluiceTokenizer.load(tmp);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  const classes = tokenClasses(tokenizer, VOCAB);
  const structured = new StructuredOutputs(tokenizer, VOCAB, { cacheSize, engine: grammarEngine, ...(args.workers !== undefined && { workers: Number(args.workers) }) });

  let t0 = performance.now();
  (await structured.constraint({ type: 'json_object' })).dispose();
  const vocabularyMs = performance.now() - t0;

  const list = benchSchemas();
  const compileMs: number[] = [];
  for (const schema of list) {
    t0 = performance.now();
    (await structured.constraint({ type: 'json_schema', schema })).dispose();
    compileMs.push(performance.now() - t0);
  }

  process.stderr.write('token masks...\n');
  const walked = quick ? list.slice(0, 8) : list;
  const alone = await masksAlone(structured, classes, walked);
  const batched = await masksBatched(structured, classes, BATCHED_SCHEMAS.map((i) => list[i]!), ROWS, quick ? 40 : 200);
  await structured.dispose();
  // Where the time goes: the masks' compute alone, and a message round trip with no compute.
  const inThread = await masksInThread(tokenizer, classes, walked);
  const echo = { oneMaskUs: await echoRoundTrip(structured.maskWords, 1, 500), stepMasksUs: await echoRoundTrip(structured.maskWords, ROWS, 200) };

  process.stderr.write('decode...\n');
  const tiny = await tinyWithQwenVocab();
  const tokens = quick ? 24 : 64;
  const decode = [
    { shape: 'tiny', ...await throughput(tiny, 1, tokens, quick ? 1 : 3) },
    { shape: 'tiny', ...await throughput(tiny, ROWS, tokens, quick ? 1 : 3) },
  ];
  if (!quick) {
    const qwen = await ensureBenchModel('qwen2.5-0.5b', 'bf16');
    decode.push({ shape: 'qwen2.5-0.5b', ...await throughput(qwen, 1, 64, 2) }, { shape: 'qwen2.5-0.5b', ...await throughput(qwen, ROWS, 48, 2) });
  }

  const machine = machineInfo();
  const c = stats(compileMs);
  const ms = (x: number) => x.toFixed(1);
  const us = (x: number) => x.toFixed(0);
  console.log(`\nstructured outputs, vocabulary ${VOCAB} (qwen2.5-0.5b), ${machine.cpu} x ${machine.cores}, grammar engine: ${grammarEngine}, grammar workers: ${args.workers ?? 'default'}, grammar cache ${cacheSize}\n`);
  console.log(`vocabulary preparation (first request, json_object): ${ms(vocabularyMs)} ms`);
  console.log(`schema compile (${c.n} distinct schemas, each fresh): p50 ${ms(c.p50)} ms, p99 ${ms(c.p99)} ms, mean ${ms(c.mean)} ms, max ${ms(Math.max(...compileMs))} ms`);
  console.log(`\ntoken masks (us)                                       n      p50      p99     mean   target p50 <= ${TARGETS.maskP50Us}, p99 <= ${TARGETS.maskP99Us}`);
  const row = (label: string, s: Stats, target = true) => {
    const met = target ? `${s.p50 <= TARGETS.maskP50Us ? 'met' : 'NOT met'}, ${s.p99 <= TARGETS.maskP99Us ? 'met' : 'NOT met'}` : '';
    console.log(`${label.padEnd(50)} ${String(s.n).padStart(6)} ${us(s.p50).padStart(8)} ${us(s.p99).padStart(8)} ${us(s.mean).padStart(8)}   ${met}`);
  };
  row(`one sequence alone, per token (${grammarEngine})`, alone.perTokenUs);
  row('  in free text', alone.freeTextUs, false);
  row('  elsewhere', alone.otherUs, false);
  row('  xgrammar in this thread (no worker)', inThread.perTokenUs, false);
  row('    in free text', inThread.freeTextUs, false);
  row('    elsewhere', inThread.otherUs, false);
  row('  echo worker round trip, 1 mask (no grammar)', echo.oneMaskUs, false);
  row(`${ROWS} in a step, per row`, batched.perRowUs);
  row(`${ROWS} in a step, whole step`, batched.stepUs, false);
  row(`  echo worker round trip, ${ROWS} masks (no grammar)`, echo.stepMasksUs, false);
  console.log(`free text: a state allowing more than half the vocabulary (inside a string without pattern, format or enum)`);
  console.log(`walks alone: ${alone.walks.completed} of ${alone.walks.n} values completed, ${ms(alone.walks.tokens.mean)} tokens on average ` +
    `(cut at ${MAX_WALK}), ${ms((100 * alone.freeTextUs.n) / alone.perTokenUs.n)}% of tokens in free text; ` +
    `${ROWS} in a step: ${batched.sequencesCompleted} values completed, ${ms(batched.freeTextRowsPercent)}% of rows in free text`);
  console.log(`\ndecode (${VOCAB} logits)       tokens/seq   plain tok/s   constrained tok/s    cost   target <= ${TARGETS.decodeCostAtBatch32Percent}% at batch ${ROWS}`);
  for (const d of decode) {
    console.log(`${d.shape.padEnd(13)} batch ${String(d.rows).padEnd(3)} ${String(d.tokensPerSequence).padStart(10)} ${d.plain.tokensPerSecond.toFixed(1).padStart(13)} ` +
      `${d.constrained.tokensPerSecond.toFixed(1).padStart(19)} ${d.costPercent.toFixed(1).padStart(6)}%   ` +
      `${d.rows === ROWS ? (d.costPercent <= TARGETS.decodeCostAtBatch32Percent ? 'met' : 'NOT met') : ''}`);
  }
  const slug = `${(machine.cpu ?? 'cpu').toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '')}-${machine.cores}core`;
  const out = args.out ?? `bench/results/structured-${slug}.json`;
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify({
    bench: 'structured', quick, machine, loadAverage: { before: loadBefore, after: os.loadavg() },
    vocabSize: VOCAB, grammarEngine, grammarWorkers: args.workers === undefined ? 'default' : Number(args.workers), grammarCacheSize: cacheSize,
    batchedSchemas: BATCHED_SCHEMAS, targets: TARGETS,
    vocabularyMs, compileMs: { ...c, max: Math.max(...compileMs), each: compileMs },
    masks: { alone, batched: { rows: ROWS, ...batched }, inThread, echo },
    decode: { schema: { type: 'array', items: { type: 'string' }, minItems: MIN_ITEMS }, runs: decode },
  }, null, 2)}\n`);
  await chartsBesideResult(out);
  console.log(`\nwrote ${out}`);
}

await main();
