// Mixture-of-experts decode on the CPU against a dense model with the same bytes per token
// (issue 31): the MoE preset and its dense twin, loaded side by side and timed in alternating
// pairs, at batch 1 (a token reads the attention, its router and its k experts) and at a larger
// batch (the experts the batch's tokens chose, each read once per step).
//   npm run bench:moe -- [--moe bench-moe] [--dense bench-moe-dense] [--dtype bf16]
//   [--batch 1,32] [--prompt 64] [--decode 32] [--pairs 5] [--threads N] [--out FILE]
//
// Bytes per step come from config.json: every matrix a step streams (attention, routers, dense
// MLPs, lm_head) plus the experts it reads. At batch B a layer's tokens choose k experts each;
// with routing spread evenly, the expected number of distinct experts is E (1 - (1 - k/E)^B):
// the table prints the bytes if each chosen expert is read once per step and if it were read
// once per token, beside the step time and the machine's measured read bandwidth.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { loadNativeEngine, measureMemoryBandwidth } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { ensureBenchModel } from './bench-model.js';
import { checkBenchStep, median } from './bench-step.js';
import { chartsBesideResult } from './charts.js';
import { machineInfo } from './machine.js';

const { values: args } = parseArgs({
  options: {
    moe: { type: 'string', default: 'bench-moe' },
    dense: { type: 'string', default: 'bench-moe-dense' },
    dtype: { type: 'string', default: 'bf16' },
    batch: { type: 'string', default: '1,32' },
    prompt: { type: 'string', default: '64' },
    decode: { type: 'string', default: '32' },
    pairs: { type: 'string', default: '5' },
    threads: { type: 'string', default: String(os.availableParallelism()) },
    out: { type: 'string', default: 'bench/results/moe-cpu.json' },
  },
});

const dtype = args.dtype as 'f32' | 'f16' | 'bf16';
const batches = args.batch!.split(',').map(Number);
const promptLen = Number(args.prompt);
const decodeSteps = Number(args.decode);
const pairs = Math.max(2, Number(args.pairs));
const threads = Number(args.threads);
const elementBytes = dtype === 'f32' ? 4 : 2;

interface Shape {
  layers: number; hidden: number; qRows: number; kvRows: number; vocab: number; tied: boolean;
  denseInter: number; experts: number; topK: number; expertInter: number; sparse: boolean[];
}

function shapeOf(dir: string): Shape {
  const c = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
  const layers = c.num_hidden_layers as number;
  const headDim = (c.head_dim ?? c.hidden_size / c.num_attention_heads) as number;
  const experts = (c.num_experts ?? c.num_local_experts ?? 0) as number;
  const only = new Set<number>(c.mlp_only_layers ?? []);
  const step = (c.decoder_sparse_step ?? 1) as number;
  return {
    layers, hidden: c.hidden_size, qRows: c.num_attention_heads * headDim, kvRows: (c.num_key_value_heads ?? c.num_attention_heads) * headDim,
    vocab: c.vocab_size, tied: c.tie_word_embeddings === true, denseInter: c.intermediate_size, experts,
    topK: c.num_experts_per_tok ?? 0, expertInter: c.moe_intermediate_size ?? c.intermediate_size,
    sparse: Array.from({ length: layers }, (_, l) => experts > 0 && !only.has(l) && (l + 1) % step === 0),
  };
}

/** Bytes a decode step of `batch` tokens streams: expert reads per layer as `expertsRead(layer)`. */
function stepBytes(s: Shape, expertsRead: number): number {
  const h = s.hidden;
  let elements = s.vocab * h;  // lm_head (the embedding rows a step gathers are negligible)
  for (let l = 0; l < s.layers; l++) {
    elements += h * (2 * s.qRows + 2 * s.kvRows);  // q, o; k, v
    elements += s.sparse[l] ? s.experts * h + expertsRead * 3 * h * s.expertInter : 3 * h * s.denseInter;
  }
  return elements * elementBytes;
}

const distinctExperts = (s: Shape, batch: number) => s.experts * (1 - Math.pow(1 - s.topK / s.experts, batch));

async function prepare(engine: NativeEngineHandle, batch: number, base: number): Promise<Uint32Array> {
  const vocab = engine.info().vocabSize;
  const seqIds = Uint32Array.from({ length: batch }, (_, i) => base + i);
  const sampling = { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 };
  const adds = Array.from(seqIds, (id) => ({
    seqId: id, sampling, promptTokens: Int32Array.from({ length: promptLen }, (_, t) => (t * 31 + id * 7 + 11) % vocab),
  }));
  checkBenchStep(await engine.step({ seqIds, numTokens: new Uint32Array(batch).fill(promptLen), adds }), '--prompt');
  checkBenchStep(await engine.step({ seqIds, numTokens: new Uint32Array(batch).fill(1) }), '--prompt');  // warm-up
  return seqIds;
}

async function decodeRate(engine: NativeEngineHandle, seqIds: Uint32Array): Promise<number> {
  const plan = { seqIds, numTokens: new Uint32Array(seqIds.length).fill(1) };
  const t0 = performance.now();
  for (let s = 0; s < decodeSteps; s++) checkBenchStep(await engine.step(plan), '--prompt');
  return (seqIds.length * decodeSteps) / ((performance.now() - t0) / 1000);
}

async function main(): Promise<void> {
  const models = [
    { role: 'moe', preset: args.moe!, dir: await ensureBenchModel(args.moe!, dtype) },
    { role: 'dense', preset: args.dense!, dir: await ensureBenchModel(args.dense!, dtype) },
  ];
  const shapes = models.map((m) => shapeOf(m.dir));
  const engines = await Promise.all(models.map((m) => loadNativeEngine({
    modelDir: m.dir, backend: 'cpu', kvCacheBytes: 2 ** 30, blockSize: 16, numThreads: threads, prefixCaching: false,
  })));
  const rows: Array<Record<string, unknown>> = [];
  const bandwidth: number[] = [await measureMemoryBandwidth(threads, 0, 3)];
  for (const batch of batches) {
    const seqs = await Promise.all(engines.map((e, i) => prepare(e, batch, 1000 * (i + 1) + batch)));
    const rates: number[][] = [[], []];
    for (let p = 0; p < pairs; p++) {
      // Alternate which model goes first, so drift on the machine falls on both.
      const order = p % 2 === 0 ? [0, 1] : [1, 0];
      for (const i of order) rates[i]!.push(await decodeRate(engines[i]!, seqs[i]!));
    }
    bandwidth.push(await measureMemoryBandwidth(threads, 0, 3));
    for (const [i, e] of engines.entries()) {
      await e.step({ seqIds: new Uint32Array(0), numTokens: new Uint32Array(0), frees: seqs[i] });
      const s = shapes[i]!;
      const moe = s.experts > 0;
      const tokensPerS = median(rates[i]!);
      const perStepOnce = stepBytes(s, moe ? (batch === 1 ? s.topK : distinctExperts(s, batch)) : 0);
      const perStepPerToken = stepBytes(s, moe ? s.topK * batch : 0);
      rows.push({
        model: models[i]!.role, preset: models[i]!.preset, batch, decodeTokensPerS: rates[i], decodeMedian: tokensPerS,
        stepMs: (1000 * batch) / tokensPerS, bytesPerStepReadOnce: perStepOnce, bytesPerStepReadPerToken: perStepPerToken,
        impliedBytesPerSReadOnce: (perStepOnce * tokensPerS) / batch,
      });
    }
  }
  for (const e of engines) e.dispose();
  const bestBandwidth = Math.max(...bandwidth);
  const ratios = batches.map((batch) => {
    const moe = rows.find((r) => r.model === 'moe' && r.batch === batch)!;
    const dense = rows.find((r) => r.model === 'dense' && r.batch === batch)!;
    return { batch, moeOverDense: (moe.decodeMedian as number) / (dense.decodeMedian as number) };
  });

  console.log(`MoE ${models[0]!.preset} vs dense ${models[1]!.preset} (${dtype}, ${threads} threads, ${pairs} alternating pairs, medians)`);
  console.log(`measured read bandwidth: best ${(bestBandwidth / 1e9).toFixed(1)} GB/s of ${bandwidth.length} samples`);
  console.log('model  batch  decode tok/s  step ms  GB/step read once  GB/step read per token  implied GB/s (read once)');
  for (const r of rows) {
    console.log(`${String(r.model).padEnd(6)} ${String(r.batch).padStart(5)}  ${(r.decodeMedian as number).toFixed(1).padStart(12)}  ` +
      `${(r.stepMs as number).toFixed(2).padStart(7)}  ${((r.bytesPerStepReadOnce as number) / 1e9).toFixed(3).padStart(17)}  ` +
      `${((r.bytesPerStepReadPerToken as number) / 1e9).toFixed(3).padStart(22)}  ${((r.impliedBytesPerSReadOnce as number) / 1e9).toFixed(1).padStart(24)}`);
  }
  for (const r of ratios) console.log(`batch ${r.batch}: MoE / dense decode tokens/s = ${r.moeOverDense.toFixed(3)}`);

  const result = {
    bench: 'moe',
    date: new Date().toISOString(),
    machine: machineInfo(),
    settings: { moe: models[0]!.preset, dense: models[1]!.preset, dtype, threads, pairs, promptTokens: promptLen, decodeSteps },
    bandwidthBytesPerS: bandwidth,
    rows,
    ratios,
  };
  const out = resolve(args.out!);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify(result, null, 2) + '\n');
  console.log(`wrote ${out}`);
  await chartsBesideResult(out);
}

await main();
