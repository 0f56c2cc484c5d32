// Bench results as SVG charts beside their JSON, so a person can look rather than read:
//   npm run bench:charts [-- bench/results/serve.json ...]   (default: every bench/results/*.json)
//
// A result gets one chart (<basename>.svg) or several (<basename>-<chart>.svg). Charts are
// Vega-Lite specs (chart-kit.ts) rendered to SVG by Vega in Node, with no browser and no canvas:
// text widths are Vega's estimates. A result whose shape no family recognises is reported and
// skipped. Each bench that writes a result calls chartsBesideResult() right after.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

import type { TopLevelSpec } from 'vega-lite';

import { cudaKernelCharts, engineAbCharts, engineCharts, engineCudaCharts, engineQ4Charts, engineTsPathCharts, loraCharts, moeCharts, speculativeCharts } from './chart-families-engine.js';
import { httpCharts, prefixCharts, prefixReplicasCharts, serveCharts, structuredCharts, throughputCharts } from './chart-families-serving.js';
import { deviceCheckCharts, gemmVsTorchCharts, torchMatmulCharts } from './chart-families-device.js';
import { kvCacheDtypeCharts, visionEncoderCharts, visionPreprocessCharts } from './chart-families-vision.js';
import type { Chart } from './chart-kit.js';
import { ShapeError, type Json } from './chart-shape.js';

export type { Chart } from './chart-kit.js';

type Family = (result: Json, file: string) => Chart[];

// bench field -> its charts. The CUDA kernel timings come from a native bench with no `bench` field.
const FAMILIES: Record<string, Family> = {
  'engine': engineCharts,
  'engine-ab': engineAbCharts,
  'engine-q4': engineQ4Charts,
  'engine-cuda': engineCudaCharts,
  'engine-ts-path': engineTsPathCharts,
  'moe': moeCharts,
  'torch-matmul': torchMatmulCharts,
  'gemm-vs-torch': gemmVsTorchCharts,
  'device-check': deviceCheckCharts,
  'http': httpCharts,
  'serve': serveCharts,
  'prefix': prefixCharts,
  'prefix-replicas': prefixReplicasCharts,
  'structured': structuredCharts,
  'throughput': throughputCharts,
  'kv-cache-dtype': kvCacheDtypeCharts,
  'vision-preprocess': visionPreprocessCharts,
  'vision-encoder': visionEncoderCharts,
  'speculative': speculativeCharts,
  'lora': loraCharts,
};

/** The charts of one result, or why it has none. */
export type ChartsFor =
  | { family: string; charts: Chart[] }
  | { family: null; skipped: string };

export function familyOf(result: unknown): string | null {
  if (result === null || typeof result !== 'object' || Array.isArray(result)) return null;
  const r = result as Json;
  if (typeof r.bench === 'string') return r.bench in FAMILIES ? r.bench : null;
  if (typeof r.shape === 'string' && Array.isArray(r.rows) && typeof (r.rows[0] as Json | undefined)?.op === 'string') return 'cuda-kernels';
  return null;
}

/** Pure: a parsed result and its file name (for the subtitle) -> chart specs. */
export function chartsFor(result: unknown, file: string): ChartsFor {
  const family = familyOf(result);
  if (family === null) {
    const keys = result !== null && typeof result === 'object' ? Object.keys(result).slice(0, 6).join(', ') : typeof result;
    const bench = (result as Json | null)?.bench;
    return { family: null, skipped: `unrecognised result shape (${typeof bench === 'string' ? `bench "${bench}"` : `keys: ${keys}`})` };
  }
  try {
    const charts = (family === 'cuda-kernels' ? cudaKernelCharts : FAMILIES[family]!)(result as Json, file);
    if (charts.length === 0) return { family: null, skipped: `${family} result with no data to chart` };
    return { family, charts };
  } catch (err) {
    if (err instanceof ShapeError) return { family: null, skipped: `${family} result of an unexpected shape: ${err.message}` };
    throw err;
  }
}

/** A Vega-Lite spec as an SVG document. Vega is loaded on first use so a bench pays nothing until then. */
export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const [vega, vegaLite] = await Promise.all([import('vega'), import('vega-lite')]);
  const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), { renderer: 'none', logLevel: vega.Warn });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/** <dir>/<basename>.svg for a result's only chart, <dir>/<basename>-<name>.svg for one of several. */
export function svgPathFor(jsonPath: string, chart: Chart, numCharts: number): string {
  const base = basename(jsonPath).replace(/\.json$/, '');
  return join(dirname(jsonPath), numCharts === 1 ? `${base}.svg` : `${base}-${chart.name}.svg`);
}

export type ChartsWritten =
  | { jsonPath: string; family: string; svgPaths: string[] }
  | { jsonPath: string; family: null; skipped: string };

/** Reads a result JSON and writes its charts beside it. A file that is not a known result is a skip, not an error. */
export async function writeCharts(jsonPath: string): Promise<ChartsWritten> {
  let result: unknown;
  try {
    result = JSON.parse(readFileSync(jsonPath, 'utf8'));
  } catch (err) {
    return { jsonPath, family: null, skipped: `not readable as JSON: ${(err as Error).message}` };
  }
  const found = chartsFor(result, jsonPath);
  if (found.family === null) return { jsonPath, family: null, skipped: found.skipped };
  const svgPaths: string[] = [];
  for (const chart of found.charts) {
    const svg = await renderSvg(chart.spec);
    const out = svgPathFor(jsonPath, chart, found.charts.length);
    writeFileSync(out, svg.endsWith('\n') ? svg : `${svg}\n`);
    svgPaths.push(out);
  }
  return { jsonPath, family: found.family, svgPaths };
}

/** For a bench that just wrote `jsonPath`: charts beside it, and a warning (never a failure) when that fails. */
export async function chartsBesideResult(jsonPath: string): Promise<void> {
  try {
    const written = await writeCharts(jsonPath);
    if (written.family === null) console.warn(`warning: no charts for ${jsonPath}: ${written.skipped}`);
    else console.log(`charts: ${written.svgPaths.join(', ')}`);
  } catch (err) {
    console.warn(`warning: charts for ${jsonPath} failed: ${err instanceof Error ? err.message : String(err)}`);
  }
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const dir = resolve('bench/results');
  const files = args.length > 0
    ? args.map((f) => resolve(f))
    : readdirSync(dir).filter((f) => f.endsWith('.json')).sort().map((f) => join(dir, f));
  let numSkipped = 0;
  for (const file of files) {
    const written = await writeCharts(file);
    if (written.family === null) {
      numSkipped++;
      console.warn(`skipped ${file}: ${written.skipped}`);
    } else {
      console.log(`${basename(file)} (${written.family}): ${written.svgPaths.map((p) => basename(p)).join(', ')}`);
    }
  }
  console.log(`${files.length - numSkipped} of ${files.length} results charted`);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((err) => {
    console.error(err instanceof Error ? err.stack ?? err.message : err);
    process.exit(1);
  });
}

/** Writes a bench's result as JSON at `path` (its folder made) and its charts beside it. */
export async function saveBenchResult(path: string, result: unknown): Promise<void> {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(path));
}

/** Runs a bench's main: an error is printed and the process exits 1. */
export function runBench(main: () => Promise<void>): void {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
