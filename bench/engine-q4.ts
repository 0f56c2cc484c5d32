// 4-bit weights on the CPU (issue 33): batch-1 decode of sluice on the AWQ checkpoint of the bench
// model (its projections kept 4-bit, its lm_head quantized to Q8_0 at load), beside llama.cpp on a
// Q4_0 GGUF of the same shapes (its output tensor Q8_0 too: both read the same lm_head bytes) and
// beside sluice on the bf16 checkpoint the AWQ one was quantized from; then the accuracy cost of
// the 4-bit weights against bf16 under teacher forcing.
//   npm run bench:engine:q4 -- [--preset qwen2.5-0.5b] [--prompt 512] [--decode 32] [--threads N]
//   [--pairs 3] [--llama-cpp DIR] [--accuracy-prompts 8] [--accuracy-tokens 32] [--fp8] [--out FILE]
// Each side pass runs llama.cpp Q4_0 (when --llama-cpp DIR or SLUICE_NODE_LLAMA_CPP names an
// installed node-llama-cpp package), sluice AWQ and sluice bf16 one after the other, each in its own
// process (sluice through bench/engine.ts's batch-1 worker), so a shared machine's load falls on
// all three alike; the best and the median of each across the passes are compared.
// Accuracy: the bf16 engine decodes each prompt greedily; the AWQ engine then reads every prefix of
// that text (prefix cached) and predicts the next token. Top-1 agreement is the share of positions
// where its greedy token is bf16's; the logprob difference is its logprob of bf16's token minus
// bf16's own, where that token is in its top 20 (the positions where it is not are counted). The
// same is run for two controls: bf16 itself and the bf16 checkpoint quantized to int8 at load.
// --fp8 adds the block-wise FP8 checkpoint of the same weights (make-model --quantize fp8-block)
// to every pass, served both ways the CPU can: dequantized to bf16 at load, and that requantized
// to Q8_0 (--quantization int8); and the load time of each engine (the second of two loads).
// Writes JSON (default bench/results/engine-q4.json) and prints a table.
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { ensureBenchModel } from './bench-model.js';
import { chartsBesideResult } from './charts.js';
import { checkBenchStep, median } from './bench-step.js';
import { machineInfo } from './machine.js';
import { llamaCppPackage, runLlamaCppPeer, type PeerRow } from './peer-llama-cpp.js';
import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle, NativeStepResult } from '../src/native/native-types.js';

const { values: args } = parseArgs({
  options: {
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    prompt: { type: 'string', default: '512' },
    decode: { type: 'string', default: '32' },
    threads: { type: 'string', default: '0' },
    pairs: { type: 'string', default: '3' },
    'llama-cpp': { type: 'string' },
    'accuracy-prompts': { type: 'string', default: '8' },
    'accuracy-tokens': { type: 'string', default: '32' },
    fp8: { type: 'boolean', default: false },
    out: { type: 'string', default: 'bench/results/engine-q4.json' },
    worker: { type: 'string' },
    bf16: { type: 'string' },
    awq: { type: 'string' },
    models: { type: 'string' },
  },
});

const threads = Number(args.threads);
const TOP_N = 20;

/** bench/engine.ts's batch-1 worker result, the fields read here. */
interface EngineRow {
  decodeTokensPerS: number;
  decodeTokensPerSMedian: number;
  prefillTokensPerS: number;
  weightBytes: number;
  peakRssBytes: number;
}

interface Accuracy {
  prompts: number;
  positions: number;
  top1Agreement: number;
  /** Mean over positions where bf16's token is in the AWQ engine's top 20: AWQ logprob - bf16 logprob. */
  meanLogprobDiff: number;
  meanAbsLogprobDiff: number;
  /** Positions where bf16's token was outside the AWQ engine's top 20. */
  outsideTop20: number;
}

const check = (res: NativeStepResult) => checkBenchStep(res, 'the KV pool (bench/engine-q4.ts)');

async function prefill(engine: NativeEngineHandle, seqId: number, tokens: Int32Array): Promise<NativeStepResult> {
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: TOP_N };
  return check(await engine.step({ seqIds: Uint32Array.of(seqId), numTokens: Uint32Array.of(tokens.length), adds: [{ seqId, promptTokens: tokens, sampling }] }));
}
const free = async (engine: NativeEngineHandle, seqId: number) =>
  void (await engine.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: Uint32Array.of(seqId) }));

/** bf16's greedy continuations of the accuracy prompts, each token with bf16's logprob. */
interface Reference { prompts: Int32Array[]; texts: number[][]; logprobs: number[][] }

async function bf16Reference(engine: NativeEngineHandle, prompts: number, tokens: number): Promise<Reference> {
  const vocab = engine.info().vocabSize;
  const ref: Reference = { prompts: [], texts: [], logprobs: [] };
  for (let p = 0; p < prompts; p++) {
    const prompt = Int32Array.from({ length: 64 }, (_, t) => (t * 7919 + p * 104729 + 13) % vocab);
    const text: number[] = [], logprobs: number[] = [];
    let res = await prefill(engine, 1, prompt);
    for (let i = 0; i < tokens; i++) {
      text.push(res.tokens[0]!);
      logprobs.push(res.logprobs[0]!);
      if (i + 1 < tokens) res = check(await engine.step({ seqIds: Uint32Array.of(1), numTokens: Uint32Array.of(1) }));
    }
    await free(engine, 1);
    ref.prompts.push(prompt);
    ref.texts.push(text);
    ref.logprobs.push(logprobs);
  }
  return ref;
}

/** `engine` reading every prefix of the reference texts (prefix cached) and predicting the next token. */
async function teacherForced(engine: NativeEngineHandle, ref: Reference): Promise<Accuracy> {
  let agree = 0, positions = 0, outside = 0;
  const diffs: number[] = [];
  for (let p = 0; p < ref.prompts.length; p++) {
    const text = ref.texts[p]!;
    for (let i = 0; i < text.length; i++) {
      const r = await prefill(engine, 2, Int32Array.from([...ref.prompts[p]!, ...text.slice(0, i)]));
      await free(engine, 2);
      positions++;
      if (r.tokens[0] === text[i]) agree++;
      const at = Array.from(r.topIds.subarray(0, r.topN)).indexOf(text[i]!);
      if (at < 0) outside++;
      else diffs.push(r.topLogprobs[at]! - ref.logprobs[p]![i]!);
    }
  }
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
  return { prompts: ref.prompts.length, positions, top1Agreement: agree / positions, meanLogprobDiff: mean(diffs),
    meanAbsLogprobDiff: mean(diffs.map(Math.abs)), outsideTop20: outside };
}

/**
 * The AWQ engine against bf16, with two controls under the same method: bf16 itself (prefill
 * against decode: the method's own noise) and the bf16 checkpoint with --quantization int8
 * (how far 8-bit weights move this model).
 */
async function runAccuracy(bf16Dir: string, awqDir: string, prompts: number, tokens: number): Promise<Record<'awq' | 'int8' | 'bf16', Accuracy>> {
  const load = (modelDir: string, quantization: 'none' | 'int8') =>
    loadNativeEngine({ modelDir, backend: 'cpu', kvCacheBytes: 2 ** 29, blockSize: 16, numThreads: threads, matmulPrecision: 'bf16', quantization, prefixCaching: true });
  const bf16 = await load(bf16Dir, 'none');
  const ref = await bf16Reference(bf16, prompts, tokens);
  const out = { bf16: await teacherForced(bf16, ref) } as Record<'awq' | 'int8' | 'bf16', Accuracy>;
  bf16.dispose();
  for (const [name, dir] of [['awq', awqDir], ['int8', bf16Dir]] as const) {
    const engine = await load(dir, 'int8');
    out[name] = await teacherForced(engine, ref);
    engine.dispose();
  }
  return out;
}

/** Milliseconds to load each "dir:quantization" engine: the second of two loads (pages cached). */
async function runLoads(specs: string[]): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const spec of specs) {
    const [dir, quantization] = spec.split(':') as [string, 'none' | 'int8'];
    let ms = 0;
    for (let i = 0; i < 2; i++) {
      const t0 = performance.now();
      const engine = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 2 ** 28, blockSize: 16, numThreads: threads, quantization });
      ms = performance.now() - t0;
      engine.dispose();
    }
    out[spec] = ms;
  }
  return out;
}

async function main(): Promise<void> {
  if (args.worker === 'loads') {
    process.stdout.write(JSON.stringify(await runLoads(args.models!.split(','))) + '\n');
    return;
  }
  if (args.worker === 'accuracy') {
    const result = await runAccuracy(args.bf16!, args.awq!, Number(args['accuracy-prompts']), Number(args['accuracy-tokens']));
    process.stdout.write(JSON.stringify(result) + '\n');
    return;
  }
  const here = dirname(fileURLToPath(import.meta.url));
  const engineBench = resolve(here, 'engine.js');
  const bf16Dir = await ensureBenchModel(args.preset!, 'bf16');
  const awqDir = await ensureBenchModel(args.preset!, 'bf16', { layout: 'awq' });
  const fp8Dir = args.fp8 ? await ensureBenchModel(args.preset!, 'bf16', { layout: 'fp8-block' }) : null;
  const llamaCpp = llamaCppPackage(args['llama-cpp']);
  const peerThreads = threads > 0 ? threads : os.cpus().length;
  const promptTokens = Number(args.prompt), decodeSteps = Number(args.decode);
  const sluiceRun = (modelDir: string, quantization: 'none' | 'int8'): EngineRow => {
    const child = spawnSync(process.execPath, [engineBench, '--worker', '1', '--model', modelDir, '--prompt', String(promptTokens), '--decode', String(decodeSteps),
      '--threads', String(threads), '--kv-gib', '2', '--precision', 'bf16', '--quantization', quantization], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (child.status !== 0) throw new Error(`bench worker for ${modelDir} failed (exit ${child.status})`);
    return JSON.parse(child.stdout.trim().split('\n').pop()!) as EngineRow;
  };
  const peers: PeerRow[] = [];
  const awqRows: EngineRow[] = [];
  const bf16Rows: EngineRow[] = [];
  const fp8Rows: EngineRow[] = [], fp8Int8Rows: EngineRow[] = [];
  const pairs = Math.max(1, Number(args.pairs));
  for (let pass = 0; pass < pairs; pass++) {
    if (llamaCpp) {
      process.stderr.write(`pass ${pass + 1}/${pairs}: llama.cpp Q4_0 (batch 1, ${peerThreads} threads)...\n`);
      peers.push(runLlamaCppPeer(llamaCpp, bf16Dir, 'q4_0', { promptTokens, decodeSteps, rounds: 3, threads: peerThreads }));
    }
    process.stderr.write(`pass ${pass + 1}/${pairs}: sluice AWQ 4-bit (lm_head Q8_0)...\n`);
    awqRows.push(sluiceRun(awqDir, 'int8'));
    process.stderr.write(`pass ${pass + 1}/${pairs}: sluice bf16...\n`);
    bf16Rows.push(sluiceRun(bf16Dir, 'none'));
    if (fp8Dir) {
      process.stderr.write(`pass ${pass + 1}/${pairs}: sluice FP8 dequantized to bf16, then requantized to int8...\n`);
      fp8Rows.push(sluiceRun(fp8Dir, 'none'));
      fp8Int8Rows.push(sluiceRun(fp8Dir, 'int8'));
    }
  }
  let loads: Record<string, number> | null = null;
  if (fp8Dir) {
    process.stderr.write('load times...\n');
    const specs = [`${bf16Dir}:none`, `${bf16Dir}:int8`, `${awqDir}:int8`, `${fp8Dir}:none`, `${fp8Dir}:int8`];
    const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--worker', 'loads', '--models', specs.join(','), '--threads', String(threads)],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (child.status !== 0) throw new Error(`load-time worker failed (exit ${child.status})`);
    loads = JSON.parse(child.stdout.trim().split('\n').pop()!) as Record<string, number>;
  }
  process.stderr.write('accuracy: AWQ against bf16 under teacher forcing...\n');
  const acc = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--worker', 'accuracy', '--bf16', bf16Dir, '--awq', awqDir, '--threads', String(threads),
    '--accuracy-prompts', args['accuracy-prompts']!, '--accuracy-tokens', args['accuracy-tokens']!], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (acc.status !== 0) throw new Error(`accuracy worker failed (exit ${acc.status})`);
  const accuracy = JSON.parse(acc.stdout.trim().split('\n').pop()!) as Record<'awq' | 'int8' | 'bf16', Accuracy>;

  const best = (xs: number[]) => (xs.length ? Math.max(...xs) : NaN);
  const med = (xs: number[]) => (xs.length ? median(xs) : NaN);
  const summary = (runs: Array<{ decodeTokensPerS: number; peakRssBytes: number }>) => ({
    runs: runs.length, decodeBest: best(runs.map((r) => r.decodeTokensPerS)), decodeMedian: med(runs.map((r) => r.decodeTokensPerS)),
    peakRssBytes: best(runs.map((r) => r.peakRssBytes)),
  });
  const rows = {
    llamaCppQ4_0: summary(peers),
    sluiceAwq: { ...summary(awqRows), weightBytes: awqRows[0]!.weightBytes },
    sluiceBf16: { ...summary(bf16Rows), weightBytes: bf16Rows[0]!.weightBytes },
    ...(fp8Dir && {
      sluiceFp8AsBf16: { ...summary(fp8Rows), weightBytes: fp8Rows[0]!.weightBytes },
      sluiceFp8AsInt8: { ...summary(fp8Int8Rows), weightBytes: fp8Int8Rows[0]!.weightBytes },
    }),
  };
  // Ratios pass by pass (neighbouring runs share the machine's moment), then their median.
  const perPass = (a: EngineRow[], b: Array<{ decodeTokensPerS: number }>) => a.map((r, i) => (b[i] ? r.decodeTokensPerS / b[i]!.decodeTokensPerS : NaN)).filter((x) => !Number.isNaN(x));
  const targets = {
    awqOverLlamaCppQ4_0: { best: rows.sluiceAwq.decodeBest / rows.llamaCppQ4_0.decodeBest, median: rows.sluiceAwq.decodeMedian / rows.llamaCppQ4_0.decodeMedian,
      perPass: perPass(awqRows, peers), target: 1.2 },
    awqOverBf16: { best: rows.sluiceAwq.decodeBest / rows.sluiceBf16.decodeBest, median: rows.sluiceAwq.decodeMedian / rows.sluiceBf16.decodeMedian,
      perPass: perPass(awqRows, bf16Rows), target: 1.6 },
  };
  const fmt = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : '-');
  console.log(`\nbatch-1 decode, ${args.preset}, prompt ${promptTokens}, ${decodeSteps} steps, ${peerThreads} threads, ${pairs} passes (tok/s best / median)\n`);
  console.log('| engine | weights | decode tok/s | weight MB | peak RSS MB |');
  console.log('|---|---|---|---|---|');
  const mb = (b: number) => (Number.isFinite(b) ? (b / 2 ** 20).toFixed(0) : '-');
  console.log(`| llama.cpp | Q4_0 (output Q8_0) | ${fmt(rows.llamaCppQ4_0.decodeBest)} / ${fmt(rows.llamaCppQ4_0.decodeMedian)} | - | ${mb(rows.llamaCppQ4_0.peakRssBytes)} |`);
  console.log(`| sluice | AWQ 4-bit (lm_head Q8_0) | ${fmt(rows.sluiceAwq.decodeBest)} / ${fmt(rows.sluiceAwq.decodeMedian)} | ${mb(rows.sluiceAwq.weightBytes)} | ${mb(rows.sluiceAwq.peakRssBytes)} |`);
  console.log(`| sluice | bf16 | ${fmt(rows.sluiceBf16.decodeBest)} / ${fmt(rows.sluiceBf16.decodeMedian)} | ${mb(rows.sluiceBf16.weightBytes)} | ${mb(rows.sluiceBf16.peakRssBytes)} |`);
  if (rows.sluiceFp8AsBf16 && rows.sluiceFp8AsInt8) {
    console.log(`| sluice | FP8 block-wise, dequantized to bf16 | ${fmt(rows.sluiceFp8AsBf16.decodeBest)} / ${fmt(rows.sluiceFp8AsBf16.decodeMedian)} | ${mb(rows.sluiceFp8AsBf16.weightBytes)} | ${mb(rows.sluiceFp8AsBf16.peakRssBytes)} |`);
    console.log(`| sluice | FP8 block-wise, requantized to Q8_0 | ${fmt(rows.sluiceFp8AsInt8.decodeBest)} / ${fmt(rows.sluiceFp8AsInt8.decodeMedian)} | ${mb(rows.sluiceFp8AsInt8.weightBytes)} | ${mb(rows.sluiceFp8AsInt8.peakRssBytes)} |`);
  }
  if (loads) {
    console.log('\nload time (ms, the second of two loads):');
    for (const [spec, ms] of Object.entries(loads)) console.log(`  ${spec.replace(/^.*\//, '')}: ${ms.toFixed(0)}`);
  }
  const ratio = (t: { best: number; median: number; perPass: number[]; target: number }) =>
    `${t.best.toFixed(2)}x best, ${t.median.toFixed(2)}x median, per pass ${t.perPass.map((x) => x.toFixed(2)).join(' ')} (target >= ${t.target}x)`;
  console.log(`\nAWQ / llama.cpp Q4_0: ${ratio(targets.awqOverLlamaCppQ4_0)}`);
  console.log(`AWQ / sluice bf16:    ${ratio(targets.awqOverBf16)}`);
  const accLine = (label: string, a: Accuracy) => console.log(`| ${label} | ${(100 * a.top1Agreement).toFixed(1)}% | ${a.meanLogprobDiff.toFixed(4)} | ${a.meanAbsLogprobDiff.toFixed(4)} | ${a.outsideTop20} |`);
  console.log(`\naccuracy against bf16's greedy text, teacher-forced, ${accuracy.awq.positions} positions (${accuracy.awq.prompts} prompts)\n`);
  console.log('| weights | top-1 agreement | mean logprob diff | mean abs diff | outside top 20 |');
  console.log('|---|---|---|---|---|');
  accLine('AWQ 4-bit (lm_head Q8_0)', accuracy.awq);
  accLine('bf16 --quantization int8 (control)', accuracy.int8);
  accLine('bf16 itself, prefill vs decode (control)', accuracy.bf16);
  const result = {
    bench: 'engine-q4', date: new Date().toISOString(), machine: machineInfo(), loadAverageAtEnd: os.loadavg(),
    settings: { preset: args.preset, promptTokens, decodeSteps, threads: peerThreads, pairs, models: { bf16: bf16Dir, awq: awqDir, fp8: fp8Dir } },
    rows, targets, accuracy, loads, runs: { llamaCpp: peers, sluiceAwq: awqRows, sluiceBf16: bf16Rows, sluiceFp8AsBf16: fp8Rows, sluiceFp8AsInt8: fp8Int8Rows },
  };
  mkdirSync(dirname(resolve(args.out!)), { recursive: true });
  writeFileSync(resolve(args.out!), JSON.stringify(result, null, 2) + '\n');
  console.log(`\nwrote ${args.out}`);
  await chartsBesideResult(resolve(args.out!));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
