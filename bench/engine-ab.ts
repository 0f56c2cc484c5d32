// Two builds of the native engine, alternating on one machine: did a change regress (or help)
// a dispatch level? Runs sluice_bench of build A and of build B in turn, --pairs times, with the
// same model, lengths, threads and environment (e.g. SLUICE_SIMD=avx2 to take the AVX2 kernels on
// an AVX-512 machine), so a shared machine's drifting load falls on both alike; compares the
// median and best of each. Build A is usually a git worktree of the older commit:
//   git worktree add /tmp/base <rev> && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
//     -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=OFF && cmake --build /tmp/base/build --target sluice_bench
//   npm run bench:engine:ab -- --a /tmp/base/build/sluice_bench --a-label <rev> [--b build/sluice_bench]
//     [--simd avx2] [--model DIR | --preset qwen2.5-0.5b] [--batch 1,8] [--prompt 128] [--decode 64]
//     [--precision bf16] [--quantization int8] [--pairs 4] [--out bench/results/engine-ab.json]
// Prints a table and writes JSON.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { ensureBenchModel } from './bench-model.js';
import { chartsBesideResult } from './charts.js';
import { machineInfo } from './machine.js';
import { median } from './bench-step.js';

const { values: args } = parseArgs({
  options: {
    a: { type: 'string' },
    'a-label': { type: 'string', default: 'A' },
    b: { type: 'string', default: 'build/sluice_bench' },
    'b-label': { type: 'string', default: 'this checkout' },
    simd: { type: 'string' },
    model: { type: 'string' },
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    batch: { type: 'string', default: '1,8' },
    prompt: { type: 'string', default: '128' },
    decode: { type: 'string', default: '64' },
    threads: { type: 'string', default: '0' },
    pairs: { type: 'string', default: '4' },
    precision: { type: 'string' },     // sluice_bench --precision (f32 | bf16); its default when absent
    quantization: { type: 'string' },  // sluice_bench --quantization (none | int8)
    out: { type: 'string', default: 'bench/results/engine-ab.json' },
  },
});

interface NativeRow { batch: number; prefill_tokens_per_s: number; decode_tokens_per_s: number }
interface NativeResult { device: string; weight_dtype: string; memory_bandwidth_bytes_per_s: number; rows: NativeRow[] }

async function main(): Promise<void> {
  if (!args.a) throw new Error('--a PATH (the sluice_bench of the build to compare against) is required');
  const pairs = Number(args.pairs);
  if (!Number.isInteger(pairs) || pairs < 2 || pairs > 20) throw new Error('--pairs must be an integer in 2..20');
  const modelDir = args.model ? resolve(args.model) : await ensureBenchModel(args.preset!, 'bf16');
  const env = { ...process.env, ...(args.simd ? { SLUICE_SIMD: args.simd } : {}) };
  if (args.precision !== undefined && args.precision !== 'f32' && args.precision !== 'bf16') throw new Error('--precision must be f32 or bf16');
  if (args.quantization !== undefined && args.quantization !== 'none' && args.quantization !== 'int8') throw new Error('--quantization must be none or int8');
  const engineArgs = [...(args.precision ? ['--precision', args.precision] : []), ...(args.quantization ? ['--quantization', args.quantization] : [])];
  const scratch = mkdtempSync(join(os.tmpdir(), 'sluice-ab-'));
  const builds = [{ label: args['a-label']!, bin: resolve(args.a) }, { label: args['b-label']!, bin: resolve(args.b!) }];
  const runs: Array<{ build: string; pair: number; result: NativeResult }> = [];
  try {
    for (let pair = 0; pair < pairs; pair++) {
      for (const build of builds) {
        process.stderr.write(`pair ${pair + 1}/${pairs}: ${build.label}...\n`);
        const json = join(scratch, 'run.json');
        const child = spawnSync(build.bin, ['--model', modelDir, '--batch', args.batch!, '--prompt', args.prompt!, '--decode', args.decode!,
          '--threads', args.threads!, ...engineArgs, '--json', json], { env, encoding: 'utf8' });
        if (child.status !== 0) throw new Error(`${build.bin} failed (exit ${child.status}): ${child.stderr}`);
        runs.push({ build: build.label, pair, result: JSON.parse(readFileSync(json, 'utf8')) as NativeResult });
      }
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  const batches = args.batch!.split(',').map(Number);
  const summary = batches.flatMap((batch) => builds.map((b) => {
    const rows = runs.filter((r) => r.build === b.label).map((r) => r.result.rows.find((x) => x.batch === batch)!);
    const decode = rows.map((r) => r.decode_tokens_per_s), prefill = rows.map((r) => r.prefill_tokens_per_s);
    return { build: b.label, batch, kernels: runs.find((r) => r.build === b.label)!.result.device,
      decodeMedian: median(decode), decodeBest: Math.max(...decode), prefillMedian: median(prefill), prefillBest: Math.max(...prefill), decode, prefill };
  }));
  const machine = machineInfo();
  console.log(`${machine.cpuGeneration ?? machine.cpu} x${machine.cores}${args.simd ? `, SLUICE_SIMD=${args.simd}` : ''}${engineArgs.length ? `, ${engineArgs.join(' ')}` : ''}: ` +
    `${pairs} alternating pairs, prompt ${args.prompt}, ${args.decode} decode steps`);
  console.log('| build | kernels | batch | decode tok/s median / best | prefill tok/s median / best |');
  console.log('|-------|---------|------:|---------------------------:|----------------------------:|');
  for (const s of summary) {
    console.log(`| ${s.build} | ${s.kernels} | ${s.batch} | ${s.decodeMedian.toFixed(1)} / ${s.decodeBest.toFixed(1)} | ${s.prefillMedian.toFixed(1)} / ${s.prefillBest.toFixed(1)} |`);
  }
  const ratios = batches.map((batch) => {
    const [a, b] = builds.map((x) => summary.find((s) => s.batch === batch && s.build === x.label)!);
    return { batch, decodeMedianBOverA: b!.decodeMedian / a!.decodeMedian, prefillMedianBOverA: b!.prefillMedian / a!.prefillMedian };
  });
  for (const r of ratios) {
    console.log(`batch ${r.batch}: ${builds[1]!.label} / ${builds[0]!.label}: decode ${r.decodeMedianBOverA.toFixed(2)}x, prefill ${r.prefillMedianBOverA.toFixed(2)}x (medians)`);
  }
  const result = { bench: 'engine-ab', date: new Date().toISOString(), machine, loadAverage: os.loadavg()[0], simd: args.simd ?? null,
    settings: { model: modelDir, batches, promptTokens: Number(args.prompt), decodeSteps: Number(args.decode), pairs,
      precision: args.precision ?? null, quantization: args.quantization ?? null }, builds, summary, ratios, runs };
  mkdirSync(dirname(resolve(args.out!)), { recursive: true });
  writeFileSync(resolve(args.out!), JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(args.out!));
  console.log(`wrote ${args.out}`);
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
