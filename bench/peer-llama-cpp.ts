// The llama.cpp peer of bench:engine, through node-llama-cpp when it is installed somewhere
// (it is not a dependency of sluice): `--llama-cpp DIR` or SLUICE_NODE_LLAMA_CPP=DIR names the
// package directory, e.g. after `npm install --prefix /tmp/peers node-llama-cpp@3`, DIR =
// /tmp/peers/node_modules/node-llama-cpp. The bench model is written as a GGUF (bench/gguf.ts)
// with the same weights, and llama.cpp runs the same prompt length, decode steps and thread
// count as sluice's batch-1 row: prefill of the prompt, then greedy decode one token at a time.
// Runs in its own child process (peak RSS per configuration, as sluice's rows).
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { ensureGguf, type GgufWeightType } from './gguf.js';

export interface PeerRow {
  peer: 'llama.cpp';
  version: string;
  weights: GgufWeightType;
  batch: 1;
  threads: number;
  prefillTokensPerS: number;
  /** Best of the rounds, each `decodeSteps` tokens; and their median. */
  decodeTokensPerS: number;
  decodeTokensPerSMedian: number;
  decodeStepMs: number;
  peakRssBytes: number;
  gguf: string;
}

/** The node-llama-cpp package directory to use, or undefined (the peer is skipped). */
export function llamaCppPackage(option: string | undefined): string | undefined {
  const dir = option ?? process.env.SLUICE_NODE_LLAMA_CPP;
  if (!dir) return undefined;
  const abs = resolve(dir);
  if (!existsSync(join(abs, 'package.json'))) throw new Error(`--llama-cpp ${dir}: no package.json there (want the node-llama-cpp package directory)`);
  return abs;
}

/** Runs the peer in a child process; throws with its stderr when it fails. */
export function runLlamaCppPeer(pkg: string, modelDir: string, weights: GgufWeightType, opts: { promptTokens: number; decodeSteps: number; rounds: number; threads: number }): PeerRow {
  const gguf = ensureGguf(modelDir, weights);
  const vocabSize = Number((JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size);
  const args: ChildArgs = { pkg, gguf, weights, vocabSize, ...opts };
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), JSON.stringify(args)],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  if (child.status !== 0) throw new Error(`llama.cpp peer (${weights}) failed (exit ${child.status})`);
  return JSON.parse(child.stdout.trim().split('\n').pop()!) as PeerRow;
}

interface ChildArgs { pkg: string; gguf: string; weights: GgufWeightType; vocabSize: number; promptTokens: number; decodeSteps: number; rounds: number; threads: number }

async function child(a: ChildArgs): Promise<PeerRow> {
  const version = (JSON.parse(readFileSync(join(a.pkg, 'package.json'), 'utf8')) as { version: string }).version;
  const mod = await import(pathToFileURL(join(a.pkg, 'dist', 'index.js')).href);
  // build: 'never' uses the prebuilt CPU binary (no download, no compile); gpu: false as sluice's CPU rows.
  const llama = await mod.getLlama({ gpu: false, build: 'never', logLevel: (process.env.SLUICE_PEER_LOG ?? 'error'), maxThreads: a.threads });
  const model = await llama.loadModel({ modelPath: a.gguf, useMmap: true });
  const contextSize = a.promptTokens + a.decodeSteps * (a.rounds + 1) + 16;
  const context = await model.createContext({ contextSize, batchSize: Math.min(2048, a.promptTokens), threads: a.threads, sequences: 1 });
  const sequence = context.getSequence();
  // The same prompt ids as sluice's batch-1 row (bench/engine.ts: (t * 31 + id * 7 + 11) % vocab, id 1).
  const prompt = Array.from({ length: a.promptTokens }, (_, t) => (t * 31 + 7 + 11) % a.vocabSize);
  let t0 = performance.now();
  await sequence.evaluateWithoutGeneratingNewTokens(prompt);
  const prefillMs = performance.now() - t0;
  // Greedy decode: each generator step evaluates the last token and samples the next.
  const roundTokensPerS: number[] = [];
  const gen = sequence.evaluate([prompt[prompt.length - 1]!], { temperature: 0 });
  await gen.next();  // warm-up step
  for (let r = 0; r < a.rounds; r++) {
    t0 = performance.now();
    for (let s = 0; s < a.decodeSteps; s++) await gen.next();
    roundTokensPerS.push(a.decodeSteps / ((performance.now() - t0) / 1000));
  }
  await gen.return();
  const sorted = [...roundTokensPerS].sort((x, y) => x - y);
  const best = sorted[sorted.length - 1]!;
  const row: PeerRow = {
    peer: 'llama.cpp', version, weights: a.weights, batch: 1, threads: context.currentThreads ?? a.threads,
    prefillTokensPerS: a.promptTokens / (prefillMs / 1000),
    decodeTokensPerS: best, decodeTokensPerSMedian: sorted[Math.floor(sorted.length / 2)]!, decodeStepMs: 1000 / best,
    peakRssBytes: process.resourceUsage().maxRSS * 1024, gguf: a.gguf,
  };
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  return row;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  child(JSON.parse(process.argv[2]!) as ChildArgs).then(
    (row) => process.stdout.write(JSON.stringify(row) + '\n'),
    (err) => {
      console.error(err instanceof Error ? err.stack ?? err.message : err);
      process.exit(1);
    });
}
