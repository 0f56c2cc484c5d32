// Prefix caching benchmark:
//   npm run bench:prefix -- [--requests 64] [--prefix-tokens 2000] [--suffix-tokens 50]
//                           [--max-output-tokens 8] [--backend cpu|cuda] [--preset tiny] [--dtype bf16]
//                           [--model DIR] [--out bench/results/prefix.json]
//
// 64 requests share a ~2,000-token prefix (a system prompt) and differ in a ~50-token suffix.
// They are sent one after another to POST /v1/responses of a service with the prefix cache on,
// then of a service with it off (same model, same engine settings, same process, one after the
// other), and for each: mean / p50 time to first token (queue + prefill from the Server-Timing
// header), prompt tokens computed (input - cached), and cached_tokens as usage reports it.
// Targets (printed, not asserted): >= 5x lower mean TTFT with the cache, and cached_tokens >= 90%
// of the shared prefix from the second request on.
//
// The model is the tiny demo model with a 4,096-token context (its 2,048 would not hold the
// prompt), made once in the model cache; --preset takes another preset's shape with random weights
// (e.g. llama-3.1-8b with --backend cuda), --model a checkpoint. Prints a table and writes JSON
// naming the machine (and the GPU on CUDA).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { makeModel } from '../models/make-model.js';
import { modelCacheDir } from '../src/engine/paths.js';
import { openService } from '../src/service.js';
import { chartsBesideResult } from './charts.js';
import { ensureBenchModel } from './bench-model.js';
import { machineInfo } from './machine.js';

const { values: args } = parseArgs({
  options: {
    requests: { type: 'string', default: '64' },
    'prefix-tokens': { type: 'string', default: '2000' },
    'suffix-tokens': { type: 'string', default: '50' },
    'max-output-tokens': { type: 'string', default: '8' },
    backend: { type: 'string', default: 'cpu' },
    preset: { type: 'string', default: 'tiny' },
    dtype: { type: 'string', default: 'bf16' },
    model: { type: 'string' },
    out: { type: 'string', default: 'bench/results/prefix.json' },
  },
});

const WORDS = ('river stone cloud lamp forest bridge harbor window garden letter mountain candle ' +
  'silver meadow thunder orchard lantern compass feather valley').split(' ');

/** Text of about `numTokens` tokens for this tokenizer, deterministic in `seed`. */
function textOf(tokenize: (text: string) => number, numTokens: number, seed: number): string {
  const words: string[] = [];
  let i = seed;
  while (tokenize(words.join(' ')) < numTokens) {
    for (let k = 0; k < 16; k++) words.push(WORDS[(i = (i * 1103515245 + 12345) >>> 0) % WORDS.length]!);
  }
  while (words.length > 0 && tokenize(words.join(' ')) > numTokens) words.pop();
  return words.join(' ');
}

const backend = args.backend === 'cuda' ? 'cuda' : 'cpu';

async function benchModel(): Promise<string> {
  if (args.model) return resolve(args.model);
  if (args.preset !== 'tiny') return ensureBenchModel(args.preset!, args.dtype as 'bf16');
  const dir = join(modelCacheDir(), 'tiny-ctx4096-bf16');
  if (!existsSync(join(dir, 'config.json'))) {
    process.stderr.write(`making the tiny model with a 4096-token context in ${dir}...\n`);
    await makeModel({ preset: 'tiny', out: dir, dtype: 'bf16', seed: 0, overrides: { maxPositionEmbeddings: 4096 } });
  }
  return dir;
}

interface RequestResult { ttftMs: number; inputTokens: number; cachedTokens: number; outputTokens: number }

async function runMode(modelDir: string, prefixCaching: boolean, prompts: { system: string; user: string }[], maxOutputTokens: number) {
  const dataDir = mkdtempSync(join(os.tmpdir(), 'sluice-bench-prefix-'));
  const service = await openService({
    catalog: { models: [{ id: 'tiny', checkpoint: modelDir }] },
    dataDir,
    // CUDA sizes its KV pool from the device's free memory.
    engineDefaults: { backend, ...(backend === 'cpu' && { kvCacheBytes: 512 << 20 }), prefixCaching },
    onProgress: () => {},
  });
  try {
    const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
    const key = service.firstKey!.key;
    const results: RequestResult[] = [];
    const info = service.registry.models[0]!.engine.info;
    const device = info.backend === 'cuda' ? info.simd : `${info.simd} CPU`;
    for (const p of prompts) {
      const res = await fetch(`${address}/v1/responses`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', instructions: p.system, input: p.user, max_output_tokens: maxOutputTokens, temperature: 0 }),
      });
      const body = await res.json() as { usage?: { input_tokens: number; output_tokens: number; input_tokens_details: { cached_tokens: number } } };
      if (res.status !== 200 || !body.usage) throw new Error(`POST /v1/responses failed: HTTP ${res.status} ${JSON.stringify(body)}`);
      const timing = Object.fromEntries([...(res.headers.get('server-timing') ?? '').matchAll(/(\w+);dur=([\d.]+)/g)].map((m) => [m[1]!, Number(m[2])]));
      results.push({
        ttftMs: (timing['queue'] ?? NaN) + (timing['prefill'] ?? NaN),
        inputTokens: body.usage.input_tokens,
        cachedTokens: body.usage.input_tokens_details.cached_tokens,
        outputTokens: body.usage.output_tokens,
      });
    }
    return Object.assign(results, { device });
  } finally {
    await service.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

function summary(results: RequestResult[], sharedPrefixTokens: number) {
  const ttft = results.map((r) => r.ttftMs);
  const sorted = [...ttft].sort((a, b) => a - b);
  const later = results.slice(1);
  return {
    requests: results.length,
    meanTtftMs: ttft.reduce((a, b) => a + b, 0) / ttft.length,
    p50TtftMs: sorted[Math.floor((sorted.length - 1) / 2)]!,
    firstTtftMs: ttft[0]!,
    promptTokensComputed: results.reduce((a, r) => a + r.inputTokens - r.cachedTokens, 0),
    promptTokensTotal: results.reduce((a, r) => a + r.inputTokens, 0),
    cachedTokensReported: results.reduce((a, r) => a + r.cachedTokens, 0),
    /** From the second request on: the smallest cached_tokens as a fraction of the shared prefix. */
    minCachedFractionAfterFirst: later.length ? Math.min(...later.map((r) => r.cachedTokens / sharedPrefixTokens)) : null,
  };
}

async function main(): Promise<void> {
  const numRequests = Number(args.requests);
  const prefixTokens = Number(args['prefix-tokens']);
  const suffixTokens = Number(args['suffix-tokens']);
  const maxOutputTokens = Number(args['max-output-tokens']);
  const modelDir = await benchModel();

  // Build the prompts with the model's own tokenizer (a cache-off engine just for counting).
  const { Engine } = await import('../src/engine/engine.js');
  const counter = await Engine.load({ model: modelDir, backend: 'cpu', kvCacheBytes: 16 << 20, onMessage: () => {} });
  const modelInfo = { architecture: counter.info.architecture, hiddenSize: counter.info.hiddenSize, numLayers: counter.info.numLayers };
  const tokenize = (text: string) => counter.tokenizer.encode(text).length;
  const system = textOf(tokenize, prefixTokens, 7);
  const prompts = Array.from({ length: numRequests }, (_, i) => ({ system, user: textOf(tokenize, suffixTokens, 1000 + i) }));
  // The shared prefix as the engine sees it: the rendered prompt up to where the two first differ.
  const a = counter.promptTokenIds({ messages: [{ role: 'developer', content: system }, { role: 'user', content: prompts[0]!.user }] });
  const b = counter.promptTokenIds({ messages: [{ role: 'developer', content: system }, { role: 'user', content: prompts[1]!.user }] });
  let shared = 0;
  while (shared < a.length && a[shared] === b[shared]) shared++;
  await counter.dispose();

  process.stderr.write(`${numRequests} requests, shared prefix ${shared} tokens, prompts ~${a.length} tokens; cache on...\n`);
  const on = await runMode(modelDir, true, prompts, maxOutputTokens);
  const device = on.device;
  process.stderr.write('cache off...\n');
  const off = await runMode(modelDir, false, prompts, maxOutputTokens);
  const sOn = summary(on, shared);
  const sOff = summary(off, shared);
  const speedup = sOff.meanTtftMs / sOn.meanTtftMs;

  const cpus = os.cpus();
  const modelName = args.model ?? (args.preset === 'tiny' ? 'tiny model (4096 context)' : `${args.preset} (${args.dtype}, random weights)`);
  console.log(`${modelName}, ${backend} backend on ${device}; ${cpus[0]?.model} x${cpus.length}, node ${process.version}`);
  console.log(`${numRequests} sequential requests: shared prefix ${shared} tokens + distinct ~${suffixTokens}-token suffixes, ${maxOutputTokens} output tokens\n`);
  console.log('| prefix cache | mean TTFT ms | p50 TTFT ms | first TTFT ms | prompt tokens computed | of total | cached_tokens reported |');
  console.log('|---|--:|--:|--:|--:|--:|--:|');
  for (const [name, s] of [['on', sOn], ['off', sOff]] as const) {
    console.log(`| ${name} | ${s.meanTtftMs.toFixed(1)} | ${s.p50TtftMs.toFixed(1)} | ${s.firstTtftMs.toFixed(1)} | ${s.promptTokensComputed} | ${s.promptTokensTotal} | ${s.cachedTokensReported} |`);
  }
  const frac = sOn.minCachedFractionAfterFirst ?? 0;
  console.log(`\nmean TTFT ${speedup.toFixed(1)}x lower with the cache (target >= 5x: ${speedup >= 5 ? 'met' : 'NOT met'}); ` +
    `cached_tokens from the second request on >= ${(100 * frac).toFixed(1)}% of the shared prefix (target >= 90%: ${frac >= 0.9 ? 'met' : 'NOT met'})`);

  const out = resolve(args.out!);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify({
    bench: 'prefix',
    date: new Date().toISOString(),
    machine: machineInfo(),
    settings: { requests: numRequests, prefixTokens, suffixTokens, maxOutputTokens, sharedPrefixTokens: shared, model: modelDir, modelInfo, backend, device, sequential: true },
    cacheOn: sOn,
    cacheOff: sOff,
    perRequest: { on, off },
    targets: {
      meanTtftSpeedup: { target: '>= 5', value: speedup, met: speedup >= 5 },
      cachedFractionFromSecond: { target: '>= 0.9', value: frac, met: frac >= 0.9 },
    },
  }, null, 2) + '\n');
  await chartsBesideResult(out);
  console.log(`\nwrote ${args.out}`);
}

main().catch((err) => {
  console.error(err instanceof Error ? err.stack ?? err.message : err);
  process.exit(1);
});
