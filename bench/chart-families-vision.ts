// Charts of the KV-cache-dtype and vision benches (bench/vision-preprocess.ts,
// bench/vision-encoder.ts, sluice_bench's --kv-cache-dtype runs).
import { barChart, datum, type Chart } from './chart-kit.js';
import { arr, count, header, num, obj, str, type Json } from './chart-shape.js';

/** sluice_bench with --kv-cache-dtype auto and fp8: decode tokens/s by batch, one series per KV dtype. */
export function kvCacheDtypeCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const runs = arr(r.runs, 'runs').map((x, i) => obj(x, `runs[${i}]`));
  const data = runs.flatMap((run, i) => {
    const label = `${str(run.kvCacheDtype, `runs[${i}].kvCacheDtype`)} KV (${num(run.kvBlocks, `runs[${i}].kvBlocks`)} blocks)`;
    return arr(run.rows, `runs[${i}].rows`).map((row, j) => {
      const o = obj(row, `runs[${i}].rows[${j}]`);
      return datum(num(o.batch, `runs[${i}].rows[${j}].batch`), label, num(o.decodeTokensPerS, `runs[${i}].rows[${j}].decodeTokensPerS`));
    });
  });
  const h = header('kv-cache-dtype', r, file, `CPU, ${count(settings.threads, 'thread')}`, [
    `${settings.model ?? '?'} · ${settings.promptTokens ?? '?'}-token prompts, ${settings.decodeSteps ?? '?'} decode steps · same KV bytes`,
  ]);
  return [barChart({ header: h, name: 'decode', what: 'decode tokens/s with a bf16 and an fp8 (e4m3) KV cache',
    categoryTitle: 'batch (sequences)', seriesTitle: 'KV cache', valueTitle: 'decode tokens/s', data })];
}

/** bench:vision: images/s through decode and preprocessing, and /health latency meanwhile. */
export function visionPreprocessCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const healthMs = obj(r.healthMs, 'healthMs');
  const h = header('vision-preprocess', r, file, 'CPU', [
    `${count(settings.images, 'image')} of mixed sizes · ${count(settings.concurrency, 'request')} in flight · ${num(r.imagesPerS, 'imagesPerS').toFixed(1)} images/s`,
  ]);
  return [barChart({ header: h, name: 'health', what: 'GET /health latency while images are decoded and preprocessed',
    categoryTitle: 'quantile', seriesTitle: 'latency', valueTitle: 'ms',
    data: ['p50', 'p99', 'max'].map((q) => datum(q, '/health', num(healthMs[q], `healthMs.${q}`))) })];
}

/** bench:vision:encoder: vision tower encode time per image size. */
export function visionEncoderCharts(r: Json, file: string): Chart[] {
  const rows = arr(r.rows, 'rows').map((x, i) => obj(x, `rows[${i}]`));
  const h = header('vision-encoder', r, file, `${str(r.backend, 'backend')}, ${count(r.threads, 'thread')}`, [
    `${str(r.model, 'model')} · best of ${count(r.runs, 'run')}`,
  ]);
  return [barChart({ header: h, name: 'encode', what: 'seconds to encode one image',
    categoryTitle: 'image (patches)', seriesTitle: 'encode', valueTitle: 'seconds',
    data: rows.map((o, i) => datum(`${num(o.width, `rows[${i}].width`)}x${num(o.height, `rows[${i}].height`)} (${num(o.patches, `rows[${i}].patches`)})`,
      'best', num(o.bestS, `rows[${i}].bestS`))) })];
}
