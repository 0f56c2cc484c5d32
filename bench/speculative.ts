// Speculative decoding on the CPU (issue 35), one run on one machine:
//   npm run bench:speculative -- [--preset qwen2.5-0.5b] [--dtype bf16] [--tokens 64] [--k 4]
//     [--batch 64] [--batch-tokens 24] [--threads 0] [--out bench/results/speculative.json]
// On the preset's published shapes (random weights, made once in the model cache), through the
// Batcher and the native engine as the service runs them (serial steps):
//   1. batch-1 decode, token by token: the baseline, and the continuation every other run must
//      reproduce (greedy; checked token for token);
//   2. batch-1 with verified drafts from an oracle that knows that continuation, right for r of
//      every K tokens proposed (r = K, K - 1, K / 2, 0): what verification costs and gains at the
//      acceptance it reaches, whatever proposes the drafts (no proposer's cost is included: a draft
//      model's must be added; prompt lookup's is a hash lookup);
//   3. a draft model (--speculative draft:DIR) at batch 1: the target with its weights perturbed
//      (models/draft-checkpoint.ts, --draft-scale of each tensor's spread), whole and cut to its
//      first --draft-layers layers: the acceptance a draft reaches and what its own steps cost;
//   4. prompt lookup (--speculative ngram) at batch 1 on an echo prompt (a text repeated); with
//      random weights the model does not echo it, so this measures lookup's cost when it rarely
//      matches, not the speed-up on a trained model;
//   5. --batch sequences at once, with and without prompt lookup: the load guard's effect;
//   6. an EAGLE-3 head (--speculative eagle3:DIR; models/eagle3-checkpoint.ts, random weights, a
//      32000-token draft vocabulary) in an engine of its own: at batch 1 what its drafting costs
//      (a random head agrees with nothing), and at --batch what keeping its context costs once
//      drafting is turned down.
// --only oracle,draft,ngram,batch,eagle3 runs those sections (the baseline always runs).
// Decode speed counts from each sequence's first token (prefill excluded); batch throughput is
// every generated token over the wall time.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { runBench, saveBenchResult } from './charts.js';
import { machineInfo } from './machine.js';
import { ensureBenchModel } from './bench-model.js';
import { loadNativeEngine } from '../src/native/native.js';
import type { NativeEngineHandle } from '../src/native/native-types.js';
import { Batcher, type SequenceOutcome } from '../src/scheduler/batcher.js';
import type { Sequence } from '../src/scheduler/sequence.js';
import { Speculator, type SpeculativeOptions } from '../src/scheduler/speculator.js';
import { DraftModelSpeculator } from '../src/scheduler/draft-speculator.js';
import { writePerturbedDraft } from '../models/draft-checkpoint.js';
import { writeEagle3Head } from '../models/eagle3-checkpoint.js';

const { values: args } = parseArgs({
  options: {
    preset: { type: 'string', default: 'qwen2.5-0.5b' },
    dtype: { type: 'string', default: 'bf16' },
    tokens: { type: 'string', default: '64' },
    k: { type: 'string', default: '4' },
    batch: { type: 'string', default: '64' },
    'batch-tokens': { type: 'string', default: '24' },
    threads: { type: 'string', default: '0' },
    'draft-layers': { type: 'string', default: '4' },
    'draft-scale': { type: 'string', default: '0.002' },
    out: { type: 'string', default: 'bench/results/speculative.json' },
    only: { type: 'string', default: 'oracle,draft,ngram,batch,eagle3' },
  },
});
const sections = new Set(args.only!.split(','));
const numTokens = Number(args.tokens), K = Number(args.k), batch = Number(args.batch), batchTokens = Number(args['batch-tokens']);
const dtype = args.dtype as 'f32' | 'bf16';

/** Proposes the baseline's continuation, `right` of every K tokens kept and the rest changed. */
class OracleSpeculator extends Speculator {
  constructor(private readonly reference: number[], private readonly right: number, private readonly vocab: number) {
    super({ method: 'ngram', numSpeculativeTokens: K });
  }
  protected override lookup(seq: Sequence, k: number): number[] {
    const at = seq.numGeneratedTokens;
    return this.reference.slice(at, at + k).map((t, j) => (j < this.right ? t : (t + 1) % this.vocab));
  }
}

interface Timed { tokens: number[]; firstMs: number; lastMs: number }

/** Runs prompts to `maxTokens` tokens each through a fresh Batcher; returns each one's tokens and times. */
async function run(handle: NativeEngineHandle, prompts: number[][], maxTokens: number,
  spec?: { speculator?: Speculator; speculative?: SpeculativeOptions }): Promise<{ runs: Timed[]; wallMs: number; accepted: number; drafted: number }> {
  const batcher = new Batcher(handle, { overlap: false, maxNumSeqs: Math.max(64, prompts.length), ...spec });
  const t0 = performance.now();
  const runs = prompts.map(() => ({ tokens: [] as number[], firstMs: 0, lastMs: 0 }));
  await Promise.all(prompts.map((p, i) => new Promise<SequenceOutcome>((done) => batcher.submit({
    promptTokenIds: p, maxTokens, sampling: { temperature: 0, topP: 1, topK: 0, seed: 0n, logprobs: 0 },
    sink: {
      onToken: (t) => {
        const r = runs[i]!;
        if (r.tokens.length === 0) r.firstMs = performance.now();
        r.lastMs = performance.now();
        r.tokens.push(t.tokenId);
        return false;
      },
      onEnd: done,
    },
  }))));
  const wallMs = performance.now() - t0;
  const s = batcher.stats.speculation;
  await batcher.dispose();
  return { runs, wallMs, accepted: s?.numAcceptedTokens ?? 0, drafted: s?.numDraftTokens ?? 0 };
}

/** Decode tokens/s of one sequence: its tokens after the first over the time since it. */
const decodeRate = (r: Timed) => (r.tokens.length - 1) / ((r.lastMs - r.firstMs) / 1000);

async function main(): Promise<void> {
  const dir = await ensureBenchModel(args.preset!, dtype);
  const handle = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 1 << 30, blockSize: 16, numThreads: Number(args.threads) });
  const vocab = handle.info().vocabSize;
  const prompt = Array.from({ length: 64 }, (_, i) => (i * 7919 + 13) % vocab);
  const rows: Record<string, unknown>[] = [];
  try {
    const base = await run(handle, [prompt], numTokens);
    const reference = base.runs[0]!.tokens;
    const baseRate = decodeRate(base.runs[0]!);
    rows.push({ run: 'token by token', batch: 1, decodeTokensPerS: baseRate, speedup: 1 });
    process.stderr.write(`token by token: ${baseRate.toFixed(2)} tokens/s\n`);

    for (const right of sections.has('oracle') ? [K, K - 1, Math.floor(K / 2), 0] : []) {
      const r = await run(handle, [prompt], numTokens, { speculator: new OracleSpeculator(reference, right, vocab) });
      const same = r.runs[0]!.tokens.every((t, i) => t === reference[i]);
      if (!same) throw new Error(`oracle ${right}/${K}: the output differs from the token-by-token run`);
      const rate = decodeRate(r.runs[0]!);
      rows.push({ run: `oracle drafts, ${right} of ${K} right`, batch: 1, k: K, drafted: r.drafted, acceptance: r.accepted / Math.max(1, r.drafted),
        decodeTokensPerS: rate, speedup: rate / baseRate });
      process.stderr.write(`oracle ${right}/${K}: ${rate.toFixed(2)} tokens/s, acceptance ${(r.accepted / Math.max(1, r.drafted)).toFixed(2)}\n`);
    }

    for (const layers of sections.has('draft') ? [undefined, Number(args['draft-layers'])] : []) {
      const scale = Number(args['draft-scale']);
      const draftDir = `${dir}-draft-perturbed-${scale}${layers === undefined ? '' : `-${layers}l`}`;
      if (!existsSync(join(draftDir, 'config.json'))) writePerturbedDraft(dir, draftDir, { scale, seed: 3, ...(layers !== undefined && { layers }) });
      const draft = await loadNativeEngine({ modelDir: draftDir, backend: 'cpu', kvCacheBytes: 256 << 20, blockSize: 16, numThreads: Number(args.threads) });
      const speculator = new DraftModelSpeculator(draft, { method: 'draft', draftModel: draftDir, numSpeculativeTokens: K });
      const r = await run(handle, [prompt], numTokens, { speculator });  // the batcher disposes the draft engine
      if (r.runs[0]!.tokens.some((t, i) => t !== reference[i])) throw new Error('the draft model changed the greedy output');
      const rate = decodeRate(r.runs[0]!);
      rows.push({ run: `draft model: the target perturbed by ${scale}${layers === undefined ? '' : `, first ${layers} layers`}`, batch: 1, k: K,
        drafted: r.drafted, acceptance: r.accepted / Math.max(1, r.drafted), decodeTokensPerS: rate, speedup: rate / baseRate });
      process.stderr.write(`draft ${layers ?? 'all'} layers: ${rate.toFixed(2)} tokens/s, acceptance ${(r.accepted / Math.max(1, r.drafted)).toFixed(2)}\n`);
    }

    if (sections.has('ngram')) {
      const text = Array.from({ length: 24 }, (_, i) => (i * 131 + 7) % vocab);
      const echo = [...text, ...text, ...text];
      const echoBase = await run(handle, [echo], numTokens);
      const echoSpec = await run(handle, [echo], numTokens, { speculative: { method: 'ngram', numSpeculativeTokens: K } });
      if (echoSpec.runs[0]!.tokens.some((t, i) => t !== echoBase.runs[0]!.tokens[i])) throw new Error('prompt lookup changed the greedy output');
      const echoRate = decodeRate(echoSpec.runs[0]!), echoBaseRate = decodeRate(echoBase.runs[0]!);
      rows.push({ run: 'prompt lookup, echo prompt (random weights: the model does not echo)', batch: 1, k: K,
        drafted: echoSpec.drafted, acceptance: echoSpec.accepted / Math.max(1, echoSpec.drafted),
        decodeTokensPerS: echoRate, speedup: echoRate / echoBaseRate });
    }

    const prompts = Array.from({ length: batch }, (_, s) => Array.from({ length: 32 }, (_, i) => (i * 7919 + s * 104729 + 5) % vocab));
    const throughput = (r: Awaited<ReturnType<typeof run>>) => r.runs.reduce((a, x) => a + x.tokens.length, 0) / (r.wallMs / 1000);
    const best = (a: Awaited<ReturnType<typeof run>>, b: Awaited<ReturnType<typeof run>>) => (throughput(a) >= throughput(b) ? a : b);
    if (sections.has('batch') || sections.has('eagle3')) {
      // A warm-up first (the KV pool's pages are touched for the first time), then each way twice,
      // alternating, the faster of each kept: this VM's runs vary by 10-15%.
      await run(handle, prompts, batchTokens);
      const ngram = { speculative: { method: 'ngram' as const, numSpeculativeTokens: K } };
      const many1 = await run(handle, prompts, batchTokens);
      const spec1 = await run(handle, prompts, batchTokens, ngram);
      const many = best(many1, await run(handle, prompts, batchTokens));
      const manySpec = best(spec1, await run(handle, prompts, batchTokens, ngram));
      rows.push({ run: `${batch} sequences, token by token`, batch, throughputTokensPerS: throughput(many), speedup: 1 });
      rows.push({ run: `${batch} sequences, prompt lookup`, batch, k: K, drafted: manySpec.drafted,
        acceptance: manySpec.accepted / Math.max(1, manySpec.drafted), throughputTokensPerS: throughput(manySpec),
        speedup: throughput(manySpec) / throughput(many) });

      if (sections.has('eagle3')) {
        // The head lives in the engine: an engine of its own, loaded beside the plain one.
        const headDir = `${dir}-eagle3-random`;
        if (!existsSync(join(headDir, 'config.json'))) writeEagle3Head(dir, headDir, { seed: 5 });
        const eagle = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 1 << 30, blockSize: 16,
          numThreads: Number(args.threads), eagle3Dir: headDir });
        try {
          const spec = { speculative: { method: 'eagle3' as const, draftModel: headDir, numSpeculativeTokens: K } };
          const one = await run(eagle, [prompt], numTokens, spec);
          if (one.runs[0]!.tokens.some((t, i) => t !== reference[i])) throw new Error('the EAGLE-3 head changed the greedy output');
          const rate = decodeRate(one.runs[0]!);
          rows.push({ run: 'EAGLE-3 head (random weights, 32000-token draft vocabulary)', batch: 1, k: K, drafted: one.drafted,
            acceptance: one.accepted / Math.max(1, one.drafted), decodeTokensPerS: rate, speedup: rate / baseRate });
          process.stderr.write(`eagle3: ${rate.toFixed(2)} tokens/s, acceptance ${(one.accepted / Math.max(1, one.drafted)).toFixed(2)}\n`);
          await run(eagle, prompts, batchTokens, spec);
          const manyEagle = best(await run(eagle, prompts, batchTokens, spec), await run(eagle, prompts, batchTokens, spec));
          rows.push({ run: `${batch} sequences, EAGLE-3 head (turned down: no drafts, no head)`, batch, k: K, drafted: manyEagle.drafted,
            acceptance: manyEagle.accepted / Math.max(1, manyEagle.drafted), throughputTokensPerS: throughput(manyEagle),
            speedup: throughput(manyEagle) / throughput(many) });
        } finally {
          eagle.dispose();
        }
      }
    }
  } finally {
    handle.dispose();
  }
  console.log(`${'run'.padEnd(72)} batch  drafts  acceptance  tokens/s  speed-up`);
  for (const r of rows) {
    const rate = (r['decodeTokensPerS'] ?? r['throughputTokensPerS']) as number;
    const acc = r['acceptance'] === undefined ? '' : (r['acceptance'] as number).toFixed(2);
    const drafts = r['drafted'] === undefined ? '' : String(r['drafted']);
    console.log(`${String(r['run']).padEnd(72)} ${String(r['batch']).padStart(5)}  ${drafts.padStart(6)}  ${acc.padStart(10)}  ` +
      `${rate.toFixed(2).padStart(8)}  ${(r['speedup'] as number).toFixed(2).padStart(8)}`);
  }
  const result = { bench: 'speculative', machine: machineInfo(), date: new Date().toISOString(), backend: 'cpu',
    model: `${args.preset} (${dtype}, published shapes, random weights)`, tokens: numTokens, k: K, rows };
  await saveBenchResult(args.out!, result);
}

runBench(main);
