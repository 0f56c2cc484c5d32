// Issue 33's FP8 targets from two results of the same bench, bf16 and FP8 (--quantization fp8
// --kv-cache-dtype fp8 on the bf16 bench model), as the device check runs them:
//   node dist/bench/fp8-ratio.js --mode engine --bf16 engine-cuda-llama-3.1-8b.json \
//     --fp8 engine-cuda-llama-3.1-8b-fp8.json [--out fp8-vs-bf16-llama-3.1-8b.json]
//   node dist/bench/fp8-ratio.js --mode throughput --bf16 throughput-llama-3.1-8b.json \
//     --fp8 throughput-llama-3.1-8b-fp8.json [--out fp8-vs-bf16-throughput-llama-3.1-8b.json]
// engine (bench:engine --backend cuda): decode and prefill tokens/s FP8 / bf16 per batch size;
// target: batch-1 decode (best round) >= 1.7x. throughput (bench:throughput): output tokens/s
// FP8 / bf16 per offline phase; target: the engine phase >= 1.3x.
// Both: the KV pool's blocks at start of each run. The FP8 run's pool is larger in bytes too (its
// weights leave more of the device to it), so the KV target (an e4m3 cache holds twice the blocks
// of a bf16 one) is checked as blocks per byte of pool: 2x, within 1%.
// A target not met is reported (and recorded as met: false), not an error: the exit status says
// only whether both results could be read and compared.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

type Json = Record<string, unknown>;

export const TARGETS = { batch1DecodeOverBf16: 1.7, throughputOverBf16: 1.3, kvBlocksPerByteOverBf16: 2 } as const;

/** The KV pool at start: as the engine's info reports it (null where a result predates the fields). */
export interface KvPool { kvCacheDtype: string | null; weightDtype: string | null; numBlocks: number | null; kvCacheBytes: number | null }

export interface KvComparison {
  bf16: KvPool;
  fp8: KvPool;
  /** numBlocks FP8 / bf16, as each run started (pools of different bytes). */
  numBlocksRatio: number | null;
  /** (numBlocks / kvCacheBytes) FP8 over bf16: the cache's element size alone. */
  blocksPerByteRatio: number | null;
  /** Target (c): a bf16 cache against an e4m3 one, blocksPerByteRatio 2 within 1%; null when the pair is not that. */
  met: boolean | null;
}

const num = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) ? x : null);
const str = (x: unknown): string | null => (typeof x === 'string' ? x : null);
const ratio = (a: number | null, b: number | null): number | null => (a !== null && b !== null && b > 0 ? a / b : null);

function kvPool(o: Json | undefined): KvPool {
  return { kvCacheDtype: str(o?.kvCacheDtype), weightDtype: str(o?.weightDtype), numBlocks: num(o?.numBlocks), kvCacheBytes: num(o?.kvCacheBytes) };
}

export function compareKv(bf16: KvPool, fp8: KvPool): KvComparison {
  const perByte = (p: KvPool) => ratio(p.numBlocks, p.kvCacheBytes);
  const blocksPerByteRatio = ratio(perByte(fp8), perByte(bf16));
  const pair = bf16.kvCacheDtype === 'bf16' && fp8.kvCacheDtype === 'f8_e4m3';
  return {
    bf16, fp8, numBlocksRatio: ratio(fp8.numBlocks, bf16.numBlocks), blocksPerByteRatio,
    met: pair && blocksPerByteRatio !== null ? Math.abs(blocksPerByteRatio / TARGETS.kvBlocksPerByteOverBf16 - 1) <= 0.01 : null,
  };
}

export interface EngineRow {
  batch: number;
  bf16DecodeTokensPerS: number;
  fp8DecodeTokensPerS: number;
  decodeRatio: number;
  decodeMedianRatio: number | null;
  prefillRatio: number | null;
}

export interface EngineComparison {
  mode: 'engine';
  preset: string | null;
  rows: EngineRow[];
  /** Target (a): batch-1 decode, best round, FP8 over bf16. */
  batch1DecodeRatio: number | null;
  batch1DecodeMet: boolean | null;
  kv: KvComparison;
}

/** One model of each bench:engine --backend cuda result (the preset both have, else the first of each). */
export function compareEngine(bf16: Json, fp8: Json): EngineComparison {
  const models = (r: Json, side: string) => {
    const ms = r.models;
    if (!Array.isArray(ms) || ms.length === 0) throw new Error(`the ${side} result has no models (not a bench:engine --backend cuda result?)`);
    return ms as Json[];
  };
  const fp8Model = models(fp8, 'fp8')[0]!;
  const bf16Models = models(bf16, 'bf16');
  const bf16Model = bf16Models.find((m) => m.preset !== undefined && m.preset === fp8Model.preset) ?? bf16Models[0]!;
  const rowsOf = (m: Json) => (Array.isArray(m.rows) ? (m.rows as Json[]) : []);
  const rows: EngineRow[] = [];
  for (const f of rowsOf(fp8Model)) {
    const b = rowsOf(bf16Model).find((r) => r.batch === f.batch);
    const bd = num(b?.decodeTokensPerS), fd = num(f.decodeTokensPerS), batch = num(f.batch);
    if (bd === null || fd === null || batch === null) continue;
    rows.push({ batch, bf16DecodeTokensPerS: bd, fp8DecodeTokensPerS: fd, decodeRatio: fd / bd,
      decodeMedianRatio: ratio(num(f.decodeTokensPerSMedian), num(b?.decodeTokensPerSMedian)),
      prefillRatio: ratio(num(f.prefillTokensPerS), num(b?.prefillTokensPerS)) });
  }
  const b1 = rows.find((r) => r.batch === 1)?.decodeRatio ?? null;
  return {
    mode: 'engine', preset: str(fp8Model.preset), rows, batch1DecodeRatio: b1,
    batch1DecodeMet: b1 === null ? null : b1 >= TARGETS.batch1DecodeOverBf16,
    kv: compareKv(kvPool(bf16Model.info as Json | undefined), kvPool(fp8Model.info as Json | undefined)),
  };
}

export interface ThroughputRow { phase: string; bf16OutputTokensPerS: number; fp8OutputTokensPerS: number; ratio: number }

export interface ThroughputComparison {
  mode: 'throughput';
  rows: ThroughputRow[];
  /** Target (b): the engine phase's output tokens/s, FP8 over bf16. */
  engineRatio: number | null;
  engineMet: boolean | null;
  kv: KvComparison;
}

/** The offline phases (engine, chat, batch) of two bench:throughput results. */
export function compareThroughput(bf16: Json, fp8: Json): ThroughputComparison {
  const results = (r: Json, side: string) => {
    if (!Array.isArray(r.results)) throw new Error(`the ${side} result has no results (not a bench:throughput result?)`);
    return (r.results as Json[]).filter((x) => x.rate === undefined);  // Poisson rates differ between runs
  };
  const fr = results(fp8, 'fp8'), br = results(bf16, 'bf16');
  const rows: ThroughputRow[] = [];
  for (const f of fr) {
    const b = br.find((x) => x.phase === f.phase);
    const bt = num(b?.outputTokensPerS), ft = num(f.outputTokensPerS);
    if (bt === null || ft === null || bt <= 0) continue;
    rows.push({ phase: String(f.phase), bf16OutputTokensPerS: bt, fp8OutputTokensPerS: ft, ratio: ft / bt });
  }
  const engine = rows.find((r) => r.phase === 'engine')?.ratio ?? null;
  return {
    mode: 'throughput', rows, engineRatio: engine, engineMet: engine === null ? null : engine >= TARGETS.throughputOverBf16,
    kv: compareKv(kvPool(bf16.engine as Json | undefined), kvPool(fp8.engine as Json | undefined)),
  };
}

const f = (x: number | null, d = 2) => (x === null ? 'n/a' : x.toFixed(d));
const verdict = (met: boolean | null) => (met === null ? 'not measured' : met ? 'met' : 'NOT met');

function printKv(kv: KvComparison): void {
  const side = (name: string, p: KvPool) => console.log(`| ${name} | ${p.weightDtype ?? '-'} | ${p.kvCacheDtype ?? '-'} | ${p.numBlocks ?? '-'} | ` +
    `${p.kvCacheBytes === null ? '-' : (p.kvCacheBytes / 2 ** 30).toFixed(2)} |`);
  console.log('\n| run | weights | KV | blocks at start | KV pool GiB |');
  console.log('|-----|---------|----|----------------:|------------:|');
  side('bf16', kv.bf16);
  side('fp8', kv.fp8);
  console.log(`blocks FP8 / bf16: ${f(kv.numBlocksRatio)}x; per byte of pool: ${f(kv.blocksPerByteRatio, 3)}x ` +
    `(target ${TARGETS.kvBlocksPerByteOverBf16}x, bf16 KV against e4m3: ${verdict(kv.met)})`);
}

export function printComparison(c: EngineComparison | ThroughputComparison): void {
  if (c.mode === 'engine') {
    console.log(`\nFP8 / bf16 ${c.preset ?? ''} (bench:engine --backend cuda)`);
    console.log('| batch | bf16 decode tok/s | fp8 decode tok/s | decode x (best) | decode x (median) | prefill x |');
    console.log('|------:|------------------:|-----------------:|----------------:|------------------:|----------:|');
    for (const r of c.rows) {
      console.log(`| ${r.batch} | ${r.bf16DecodeTokensPerS.toFixed(1)} | ${r.fp8DecodeTokensPerS.toFixed(1)} | ${r.decodeRatio.toFixed(2)} | ` +
        `${f(r.decodeMedianRatio)} | ${f(r.prefillRatio)} |`);
    }
    console.log(`batch-1 decode FP8 / bf16: ${f(c.batch1DecodeRatio)}x (target >= ${TARGETS.batch1DecodeOverBf16}x: ${verdict(c.batch1DecodeMet)})`);
  } else {
    console.log('\nFP8 / bf16 (bench:throughput, offline phases, output tokens/s)');
    console.log('| phase | bf16 | fp8 | x |');
    console.log('|-------|-----:|----:|--:|');
    for (const r of c.rows) console.log(`| ${r.phase} | ${r.bf16OutputTokensPerS.toFixed(1)} | ${r.fp8OutputTokensPerS.toFixed(1)} | ${r.ratio.toFixed(2)} |`);
    console.log(`engine phase FP8 / bf16: ${f(c.engineRatio)}x (target >= ${TARGETS.throughputOverBf16}x: ${verdict(c.engineMet)})`);
  }
  printKv(c.kv);
}

function main(): void {
  const { values: args } = parseArgs({
    options: { mode: { type: 'string' }, bf16: { type: 'string' }, fp8: { type: 'string' }, out: { type: 'string' } },
  });
  if (args.mode !== 'engine' && args.mode !== 'throughput') throw new Error(`--mode must be engine or throughput, got ${args.mode}`);
  if (!args.bf16 || !args.fp8) throw new Error('--bf16 FILE and --fp8 FILE are required');
  const read = (p: string) => JSON.parse(readFileSync(p, 'utf8')) as Json;
  const bf16 = read(args.bf16), fp8 = read(args.fp8);
  const c = args.mode === 'engine' ? compareEngine(bf16, fp8) : compareThroughput(bf16, fp8);
  if (c.rows.length === 0) throw new Error(`no ${args.mode === 'engine' ? 'batch size' : 'phase'} is in both results`);
  printComparison(c);
  if (args.out) {
    mkdirSync(dirname(resolve(args.out)), { recursive: true });
    writeFileSync(args.out, `${JSON.stringify({ bench: 'fp8-ratio', date: new Date().toISOString(), bf16File: args.bf16, fp8File: args.fp8,
      targets: TARGETS, ...c }, null, 2)}\n`);
    console.log(`\nwrote ${args.out}`);
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  try {
    main();
  } catch (err) {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  }
}
