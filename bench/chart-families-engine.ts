// Charts for the engine's own benches: bench:engine (CPU), bench:engine --backend cuda, the CUDA
// per-kernel timings, and the TypeScript path against the native loop.
import { barChart, datum, lineChart, type Chart } from './chart-kit.js';
import { arr, count, header, num, obj, optStr, str, type Json } from './chart-shape.js';

function deviceOf(backend: string | null, simd: string | null): string | null {
  if (backend === 'cuda') return simd;
  if (simd === null) return backend === null ? null : backend.toUpperCase();
  return `${(backend ?? 'cpu').toUpperCase()} ${simd}`;
}

/** bench/results/engine-*.json: prefill and decode tokens/s by batch and matmul precision. */
export function engineCharts(r: Json, file: string): Chart[] {
  const model = obj(r.model, 'model');
  const settings = obj(r.settings, 'settings');
  const rows = arr(r.rows, 'rows').map((row, i) => {
    const o = obj(row, `rows[${i}]`);
    return {
      precision: str(o.precision, `rows[${i}].precision`),
      batch: num(o.batch, `rows[${i}].batch`),
      prefill: num(o.prefillTokensPerS, `rows[${i}].prefillTokensPerS`),
      decode: num(o.decodeTokensPerS, `rows[${i}].decodeTokensPerS`),
    };
  });
  const promptTokens = num(settings.promptTokens, 'settings.promptTokens');
  const h = header('engine', r, file, deviceOf(optStr(model.backend), optStr(model.simd)), [
    `${optStr(model.preset) ?? optStr(model.architecture) ?? 'model'} · ${optStr(model.weightDtype) ?? '?'} weights · ` +
      `${promptTokens}-token prompts · ${count(settings.threads, 'thread')}`,
  ]);
  const common = { header: h, categoryTitle: 'batch (sequences)', seriesTitle: 'matmul precision' } as const;
  return [
    barChart({
      ...common, name: 'decode', what: 'decode tokens/s by batch and precision',
      data: rows.map((x) => datum(x.batch, x.precision, x.decode)), valueTitle: 'decode tokens/s (all sequences)',
    }),
    barChart({
      ...common, name: 'prefill', what: `prefill tokens/s by batch and precision`,
      data: rows.map((x) => datum(x.batch, x.precision, x.prefill)), valueTitle: `prefill tokens/s (${promptTokens}-token prompts)`,
    }),
  ];
}

interface ThroughputRow { batch: number; prefill: number; decode: number }

/** bench/results/engine-cuda-*.json: sluice and its peer (transformers) per model, by batch. */
export function engineCudaCharts(r: Json, file: string): Chart[] {
  const models = arr(r.models, 'models').map((m, i) => {
    const o = obj(m, `models[${i}]`);
    const info = obj(o.info, `models[${i}].info`);
    const rows: ThroughputRow[] = arr(o.rows, `models[${i}].rows`).map((row, j) => {
      const x = obj(row, `models[${i}].rows[${j}]`);
      return { batch: num(x.batch, `models[${i}].rows[${j}].batch`), prefill: num(x.prefillTokensPerS, `models[${i}].rows[${j}].prefillTokensPerS`), decode: num(x.decodeTokensPerS, `models[${i}].rows[${j}].decodeTokensPerS`) };
    });
    let peer: { name: string; rows: ThroughputRow[] } | null = null;
    if (o.peer !== null && typeof o.peer === 'object') {
      const p = obj(o.peer, `models[${i}].peer`);
      peer = {
        name: optStr(p.peer) ?? 'peer',
        rows: arr(p.rows, `models[${i}].peer.rows`).map((row, j) => {
          const x = obj(row, `models[${i}].peer.rows[${j}]`);
          const at = `models[${i}].peer.rows[${j}]`;
          return { batch: num(x.batch, `${at}.batch`), prefill: num(x.prefill_tokens_per_s, `${at}.prefill_tokens_per_s`), decode: num(x.decode_tokens_per_s, `${at}.decode_tokens_per_s`) };
        }),
      };
    }
    return { name: optStr(o.preset) ?? optStr(info.architecture) ?? `model ${i}`, device: optStr(info.simd), rows, peer };
  });
  const settings = obj(r.settings, 'settings');
  const h = header('engine-cuda', r, file, models[0]?.device ?? null, [
    `${models.map((m) => m.name).join(', ')} · bf16 weights · ${settings.promptTokens ?? '?'}-token prompts, ${settings.decodeSteps ?? '?'} decode steps`,
  ]);
  const series = (pick: (x: ThroughputRow) => number) => models.flatMap((m) => [
    ...m.rows.map((x) => datum(x.batch, `${m.name} · sluice`, pick(x))),
    ...(m.peer?.rows ?? []).map((x) => datum(x.batch, `${m.name} · ${m.peer!.name}`, pick(x))),
  ]);
  // Bars, not lines: the peer's lines for two models nearly coincide, and their labels would too.
  const common = { header: h, categoryTitle: 'batch (sequences)', seriesTitle: 'model · engine', log: true } as const;
  return [
    barChart({ ...common, name: 'decode', what: 'decode tokens/s by batch', data: series((x) => x.decode), valueTitle: 'decode tokens/s (log scale)' }),
    barChart({ ...common, name: 'prefill', what: 'prefill tokens/s by batch', data: series((x) => x.prefill), valueTitle: 'prefill tokens/s (log scale)' }),
  ];
}

/** bench/results/cuda-kernels-*.json: one CUDA kernel per row at T tokens (native bench). */
export function cudaKernelCharts(r: Json, file: string): Chart[] {
  const rows = arr(r.rows, 'rows').map((row, i) => {
    const o = obj(row, `rows[${i}]`);
    return { op: str(o.op, `rows[${i}].op`), tokens: num(o.T, `rows[${i}].T`), us: num(o.us, `rows[${i}].us`), bytes: num(o.bytes, `rows[${i}].bytes`), flops: num(o.flops, `rows[${i}].flops`) };
  });
  // NOTE: results before the H200 run record no device; the file name is the only trace of where they ran.
  const h = header('cuda-kernels', r, file, optStr(r.device), [`model shape ${str(r.shape, 'shape')} · one kernel per launch, timed on the device`]);
  // The production GEMMs; "(L2-hot)" and "gemv rows N unroll M" rows are tuning sweeps of the same ops.
  const gemm = rows.filter((x) => x.op.startsWith('gemm ') && !x.op.includes('(L2-hot)') && !x.op.includes(' gemv '));
  const attention = rows.filter((x) => x.op.startsWith('attention'));
  const sampling = rows.filter((x) => x.op.startsWith('sample'));
  const lines = { header: h, xTitle: 'tokens in the launch (T)', seriesTitle: 'kernel', xType: 'ordinal', labels: false } as const;
  const bars = { header: h, categoryTitle: 'tokens in the launch (T)', seriesTitle: 'kernel' } as const;
  return [
    lineChart({
      ...lines, name: 'gemm-bandwidth', what: 'GEMM memory bandwidth by tokens',
      data: gemm.map((x) => datum(x.tokens, x.op, x.bytes / x.us / 1e6)), valueTitle: 'bytes moved / time (TB/s)',
    }),
    lineChart({
      ...lines, name: 'gemm-compute', what: 'GEMM compute by tokens',
      data: gemm.map((x) => datum(x.tokens, x.op, x.flops / x.us / 1e6)), valueTitle: 'TFLOP/s',
    }),
    barChart({ ...bars, name: 'attention', what: 'decode attention time by tokens and splits', data: attention.map((x) => datum(x.tokens, x.op, x.us)), valueTitle: 'time per launch (µs)' }),
    barChart({ ...bars, name: 'sampling', what: 'sampling time by tokens', data: sampling.map((x) => datum(x.tokens, x.op, x.us)), valueTitle: 'time per launch (µs)' }),
  ].filter((c) => c.data.length > 0);
}

/** bench/results/engine-ts-path*.json: decode tokens/s of the native loop and the TypeScript path. */
export function engineTsPathCharts(r: Json, file: string): Chart[] {
  const model = obj(r.model, 'model');
  const settings = obj(r.settings, 'settings');
  const data = arr(r.rows, 'rows').flatMap((row, i) => {
    const o = obj(row, `rows[${i}]`);
    const batch = num(o.batch, `rows[${i}].batch`);
    return [
      datum(batch, 'native loop (sluice_bench)', num(obj(o.native, `rows[${i}].native`).decodeTokensPerS, `rows[${i}].native.decodeTokensPerS`)),
      datum(batch, 'TypeScript path (Engine.stream)', num(obj(o.ts, `rows[${i}].ts`).decodeTokensPerS, `rows[${i}].ts.decodeTokensPerS`)),
    ];
  });
  const threads = count(model.numThreads, 'compute thread');
  const h = header('engine-ts-path', r, file, deviceOf(optStr(settings.backend), optStr(model.simd)), [
    [optStr(model.preset) ?? 'model', optStr(settings.precision) ?? '', threads, `best of ${settings.rounds ?? '?'} rounds`,
      `${settings.promptTokens ?? '?'}-token prompts, ${settings.decodeSteps ?? '?'} decode steps`].filter((s) => s).join(' · '),
  ]);
  return [barChart({
    name: 'decode', what: 'decode tokens/s, native loop vs TypeScript path', header: h, data,
    categoryTitle: 'batch (concurrent sequences)', valueTitle: 'decode tokens/s (all sequences)', seriesTitle: 'path',
  })];
}

/** bench/results/engine-ab-*.json (bench/engine-ab.ts): two builds alternating, medians by batch. */
export function engineAbCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const summary = arr(r.summary, 'summary').map((row, i) => {
    const o = obj(row, `summary[${i}]`);
    return {
      build: str(o.build, `summary[${i}].build`),
      kernels: optStr(o.kernels),
      batch: num(o.batch, `summary[${i}].batch`),
      decode: num(o.decodeMedian, `summary[${i}].decodeMedian`),
      prefill: num(o.prefillMedian, `summary[${i}].prefillMedian`),
    };
  });
  const simd = optStr(r.simd);
  const h = header('engine-ab', r, file, `CPU ${summary[0]?.kernels ?? simd ?? '?'}`, [
    `${count(settings.pairs, 'alternating pair')} · ${settings.promptTokens ?? '?'}-token prompts, ${settings.decodeSteps ?? '?'} decode steps` +
      `${simd ? ` · SLUICE_SIMD=${simd}` : ''} · medians`,
  ]);
  const common = { header: h, categoryTitle: 'batch (sequences)', seriesTitle: 'build' } as const;
  return [
    barChart({ ...common, name: 'decode', what: 'decode tokens/s by batch and build', data: summary.map((x) => datum(x.batch, x.build, x.decode)), valueTitle: 'decode tokens/s (median)' }),
    barChart({ ...common, name: 'prefill', what: 'prefill tokens/s by batch and build', data: summary.map((x) => datum(x.batch, x.build, x.prefill)), valueTitle: 'prefill tokens/s (median)' }),
  ];
}

/** bench/moe.ts: MoE and dense-twin decode rates by batch. */
export function moeCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const rows = arr(r.rows, 'rows').map((row, i) => {
    const o = obj(row, `rows[${i}]`);
    return { model: `${str(o.model, `rows[${i}].model`)} (${str(o.preset, `rows[${i}].preset`)})`, batch: num(o.batch, `rows[${i}].batch`),
      decode: num(o.decodeMedian, `rows[${i}].decodeMedian`) };
  });
  const h = header('moe', r, file, `CPU, ${count(settings.threads, 'engine thread')}`, [
    `${settings.dtype ?? '?'} · ${count(settings.pairs, 'alternating pair')} · ${settings.promptTokens ?? '?'}-token prompts, ${settings.decodeSteps ?? '?'} decode steps · medians`,
  ]);
  return [barChart({ header: h, name: 'decode', what: 'decode tokens/s: mixture of experts vs dense, same bytes per token',
    categoryTitle: 'batch (sequences)', seriesTitle: 'model', valueTitle: 'decode tokens/s (median)',
    data: rows.map((x) => datum(x.batch, x.model, x.decode)) })];
}

/** bench:engine:q4: batch-1 decode of each engine and weight format, best and median across the passes. */
export function engineQ4Charts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const rows = obj(r.rows, 'rows');
  const labels: Record<string, string> = {
    llamaCppQ4_0: 'llama.cpp Q4_0', sluiceAwq: 'sluice AWQ 4-bit', sluiceBf16: 'sluice bf16',
    sluiceFp8AsBf16: 'sluice FP8 as bf16', sluiceFp8AsInt8: 'sluice FP8 as Q8_0',
  };
  const data = Object.entries(rows).flatMap(([key, row]) => {
    const o = obj(row, `rows.${key}`);
    if (num(o.runs, `rows.${key}.runs`) === 0) return [];
    const label = labels[key] ?? key;
    return [datum(label, 'best', num(o.decodeBest, `rows.${key}.decodeBest`)), datum(label, 'median', num(o.decodeMedian, `rows.${key}.decodeMedian`))];
  });
  const h = header('engine-q4', r, file, `CPU, ${count(settings.threads, 'thread')}`, [
    `${settings.preset ?? '?'} · ${count(settings.pairs, 'pass')} · ${settings.promptTokens ?? '?'}-token prompt, ${settings.decodeSteps ?? '?'} decode steps · batch 1`,
  ]);
  return [barChart({ header: h, name: 'decode', what: 'batch-1 decode tokens/s: 4-bit weights beside llama.cpp Q4_0 and bf16',
    categoryTitle: 'engine and weights', seriesTitle: 'across passes', valueTitle: 'decode tokens/s',
    data })];
}

/** bench:speculative: tokens/s of each run (batch-1 decode, or batch throughput), by batch. */
export function speculativeCharts(r: Json, file: string): Chart[] {
  const rows = arr(r.rows, 'rows').map((x, i) => obj(x, `rows[${i}]`));
  const h = header('speculative', r, file, str(r.backend, 'backend'), [
    `${str(r.model, 'model')} · ${count(r.tokens, 'token')} a run · up to ${count(r.k, 'draft')} a step`,
  ]);
  return [barChart({ header: h, name: 'speed', what: 'tokens/s with and without verified drafts (acceptance in the label)',
    categoryTitle: 'run', seriesTitle: 'batch', valueTitle: 'tokens/s',
    data: rows.map((o, i) => {
      const acceptance = o.acceptance === undefined ? '' : ` (${num(o.acceptance, `rows[${i}].acceptance`).toFixed(2)})`;
      const rate = o.decodeTokensPerS ?? o.throughputTokensPerS;
      return datum(`${str(o.run, `rows[${i}].run`).replace(/ \(random weights.*\)$/, '')}${acceptance}`,
        `batch ${num(o.batch, `rows[${i}].batch`)}`, num(rate, `rows[${i}].tokens/s`));
    }) })];
}

export function loraCharts(r: Json, file: string): Chart[] {
  const rows = arr(r.rows, 'rows').map((x, i) => obj(x, `rows[${i}]`));
  const h = header('lora', r, file, str(r.backend, 'backend'), [
    `${str(r.model, 'model')} · ${count(r.adapters, 'adapter')} of rank ${num(r.rank, 'rank')} · ${count(r.tokens, 'token')} a request`,
  ]);
  const charts = [barChart({ header: h, name: 'throughput', what: 'tokens/s of the same requests on the base model and spread over the adapters',
    categoryTitle: 'run', seriesTitle: 'requests', valueTitle: 'tokens/s',
    data: rows.map((o, i) => datum(str(o.run, `rows[${i}].run`), `${num(o.requests, `rows[${i}].requests`)} requests`,
      num(o.throughputTokensPerS, `rows[${i}].tokens/s`))) })];
  if (r.budget === undefined) return charts;
  const budget = arr(obj(r.budget, 'budget').rows, 'budget.rows').map((x, k) => obj(x, `budget.rows[${k}]`));
  charts.push(barChart({ header: h, name: 'budget', what: 'tokens/s over twice the adapters, all resident and with room for half',
    categoryTitle: 'run', seriesTitle: 'adapters resident at most', valueTitle: 'tokens/s',
    data: budget.map((o, k) => datum(str(o.run, `budget.rows[${k}].run`), `${num(o.residentAtMost, `budget.rows[${k}].residentAtMost`)} resident`,
      num(o.throughputTokensPerS, `budget.rows[${k}].tokens/s`))) }));
  return charts;
}
