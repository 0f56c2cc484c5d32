// Charts for the benches that measure the server around the engine: bench:http, bench:serve,
// bench:prefix, bench:prefix:replicas, bench:structured and bench:throughput.
import { basename } from 'node:path';

import { barChart, datum, lineChart, type Chart, type Datum } from './chart-kit.js';
import { arr, count, header, num, obj, optNum, optStr, str, type Json } from './chart-shape.js';

function cpuDevice(backend: unknown, simd: unknown): string | null {
  const b = optStr(backend);
  const s = optStr(simd);
  return b === null && s === null ? null : [b?.toUpperCase(), s].filter(Boolean).join(' ');
}

/** bench/results/http.json: rate and p50 / p99 latency per measured route, with and without queueing. */
export function httpCharts(r: Json, file: string): Chart[] {
  const model = obj(r.model, 'model');
  const settings = obj(r.settings, 'settings');
  const connections = num(settings.connections, 'settings.connections');
  const measured: Array<[string, Json]> = [
    [`GET /v1/models ×${connections}`, obj(r.models, 'models')],
    [`POST /v1/responses, 1 token ×${connections}`, obj(r.responses, 'responses')],
    [`Engine.generate, 1 token ×${connections}`, obj(r.engine, 'engine')],
  ];
  if (r.serial !== undefined) {
    const serial = obj(r.serial, 'serial');
    measured.push(['POST /v1/responses, 1 token ×1', obj(serial.responses, 'serial.responses')]);
    measured.push(['Engine.generate, 1 token ×1', obj(serial.engine, 'serial.engine')]);
  }
  const h = header('http', r, file, cpuDevice(model.backend, model.simd), [
    `${optStr(model.preset) ?? 'model'} model · ${count(model.numThreads, 'engine thread')} · ` +
      `${settings.durationS ?? '?'} s per phase, median of ${settings.rounds ?? '?'} rounds · ×N = concurrent connections`,
  ]);
  const latency: Datum[] = measured.flatMap(([name, m]) => [
    datum(name, 'p50', num(m.p50Ms, `${name}.p50Ms`)),
    datum(name, 'p99', num(m.p99Ms, `${name}.p99Ms`)),
  ]);
  return [
    barChart({
      name: 'rate', what: 'completed requests per second', header: h, horizontal: true,
      data: measured.map(([name, m]) => datum(name, 'completed per s', num(m.perS, `${name}.perS`))),
      categoryTitle: 'measurement', valueTitle: 'requests/s', seriesTitle: 'rate',
    }),
    barChart({
      name: 'latency', what: 'latency p50 / p99', header: h, horizontal: true, data: latency,
      categoryTitle: 'measurement', valueTitle: 'latency (ms)', seriesTitle: 'percentile',
    }),
  ];
}

interface WindowRow { label: string; ttft50: number | null; ttft99: number | null; e2e50: number; e2e99: number }

function windowRows(phase: string, windows: unknown, path: string): WindowRow[] {
  return arr(windows, path).map((w, i) => {
    const o = obj(w, `${path}[${i}]`);
    const at = `${path}[${i}]`;
    const ttft = obj(o.ttftMs, `${at}.ttftMs`);
    const e2e = obj(o.e2eMs, `${at}.e2eMs`);
    return {
      label: `${phase} · ${str(o.window, `${at}.window`)}`,
      ttft50: optNum(ttft.p50, `${at}.ttftMs.p50`), ttft99: optNum(ttft.p99, `${at}.ttftMs.p99`),
      e2e50: num(e2e.p50, `${at}.e2eMs.p50`), e2e99: num(e2e.p99, `${at}.e2eMs.p99`),
    };
  });
}

/** bench/results/serve.json: TTFT and end-to-end latency per phase and completion window. */
export function serveCharts(r: Json, file: string): Chart[] {
  const model = obj(r.model, 'model');
  // mixed is null when only --scenarios tiers / tenants ran.
  const rows: WindowRow[] = (r.mixed === null ? [] : arr(r.mixed, 'mixed')).flatMap((m, i) => {
    const o = obj(m, `mixed[${i}]`);
    const rate = num(obj(o.settings, `mixed[${i}].settings`).rate, `mixed[${i}].settings.rate`);
    return windowRows(`mixed @ ${rate}/s`, o.windows, `mixed[${i}].windows`);
  });
  // Tiers, tenants and hostile are optional scenarios (--scenarios); a phase each when present.
  const phases: Array<[string, string, string]> = [
    ['tiers', 'idle', 'tiers: idle'], ['tiers', 'load', 'tiers: under flex backlog'],
    ['tenants', 'idle', 'tenants: A idle'], ['tenants', 'load', "tenants: A under B's flood"],
    ['hostile', 'idle', 'hostile: A idle'], ['hostile', 'load', "hostile: A under B's schemas"],
  ];
  for (const [scenario, phase, label] of phases) {
    if (r[scenario] === undefined || r[scenario] === null) continue;
    const p = obj(obj(r[scenario], scenario)[phase], `${scenario}.${phase}`);
    rows.push(...windowRows(label, p.windows, `${scenario}.${phase}.windows`));
  }
  const h = header('serve', r, file, cpuDevice(model.backend, model.simd), [
    `${optStr(model.preset) ?? 'model'} model · ${count(model.numThreads, 'engine thread')} · ${model.maxNumSeqs ?? '?'} sequences, ` +
      `${model.maxBatchedTokens ?? '?'} tokens per step · Poisson arrivals`,
  ]);
  const ttft = rows.flatMap((x) => [
    ...(x.ttft50 === null ? [] : [datum(x.label, 'p50', x.ttft50)]),
    ...(x.ttft99 === null ? [] : [datum(x.label, 'p99', x.ttft99)]),
  ]);
  const common = { header: h, horizontal: true, categoryTitle: 'phase · window', seriesTitle: 'percentile' } as const;
  return [
    barChart({ ...common, name: 'ttft', what: 'time to first token (flex: background, none)', data: ttft, valueTitle: 'TTFT: queue + prefill (ms)' }),
    barChart({
      ...common, name: 'e2e', what: 'end-to-end latency',
      data: rows.flatMap((x) => [datum(x.label, 'p50', x.e2e50), datum(x.label, 'p99', x.e2e99)]), valueTitle: 'end-to-end latency (ms)',
    }),
  ];
}

/** bench/results/prefix.json: TTFT with the prefix cache on and off, summary and per request. */
export function prefixCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const perRequest = obj(r.perRequest, 'perRequest');
  const sides: Array<[string, Json, unknown[]]> = [
    ['cache on', obj(r.cacheOn, 'cacheOn'), arr(perRequest.on, 'perRequest.on')],
    ['cache off', obj(r.cacheOff, 'cacheOff'), arr(perRequest.off, 'perRequest.off')],
  ];
  const h = header('prefix', r, file, optStr(settings.device) ?? optStr(settings.backend)?.toUpperCase() ?? null, [
    `${settings.requests ?? '?'} sequential requests · shared prefix ${settings.sharedPrefixTokens ?? '?'} tokens + ` +
      `~${settings.suffixTokens ?? '?'}-token suffixes · ${settings.maxOutputTokens ?? '?'} output tokens`,
  ]);
  const summary = sides.flatMap(([name, s]) => [
    datum('mean', name, num(s.meanTtftMs, `${name}.meanTtftMs`)),
    datum('p50', name, num(s.p50TtftMs, `${name}.p50TtftMs`)),
    datum('first request', name, num(s.firstTtftMs, `${name}.firstTtftMs`)),
  ]);
  const requests = sides.flatMap(([name, , list]) => list.map((q, i) =>
    datum(i + 1, name, num(obj(q, `${name}[${i}]`).ttftMs, `${name}[${i}].ttftMs`))));
  return [
    barChart({ name: 'ttft', what: 'time to first token, prefix cache on vs off', header: h, data: summary, categoryTitle: 'statistic', valueTitle: 'TTFT (ms)', seriesTitle: 'prefix cache' }),
    lineChart({
      name: 'requests', what: 'time to first token per request', header: h, data: requests, labels: false,
      xTitle: 'request (in order sent)', valueTitle: 'TTFT (ms, log scale)', seriesTitle: 'prefix cache', xType: 'quantitative', log: true,
    }),
  ];
}

/** bench/results/prefix-replicas.json: cached_tokens / prompt tokens per set-up (one replica, affinity, round robin). */
export function prefixReplicasCharts(r: Json, file: string): Chart[] {
  const settings = obj(r.settings, 'settings');
  const modes = arr(r.modes, 'modes').map((m, i) => obj(m, `modes[${i}]`));
  const h = header('prefix:replicas', r, file, optStr(settings.backend)?.toUpperCase() ?? null, [
    `${settings.keys ?? '?'} prompt_cache_key values × ${settings.requestsPerKey ?? '?'} requests through HAProxy · ` +
      `${settings.prefixWords ?? '?'}-word prefix per key · ${count(settings.threadsPerReplica, 'thread')} per replica`,
  ]);
  const data = modes.flatMap((m, i) => [
    datum(str(m.name, `modes[${i}].name`), 'all keyed requests', 100 * num(m.cachedFraction, `modes[${i}].cachedFraction`)),
    datum(str(m.name, `modes[${i}].name`), "from each key's 2nd request", 100 * num(m.cachedFractionAfterFirst, `modes[${i}].cachedFractionAfterFirst`)),
  ]);
  return [barChart({ name: 'cached', what: 'cached_tokens / prompt tokens, affinity vs round robin', header: h, data,
    categoryTitle: 'set-up', valueTitle: 'cached / prompt tokens (%)', seriesTitle: 'requests' })];
}

/** bench/results/structured-*.json: token-mask time percentiles, and decode cost of a schema by batch. */
export function structuredCharts(r: Json, file: string): Chart[] {
  const masks = obj(r.masks, 'masks');
  const alone = obj(masks.alone, 'masks.alone');
  const batched = obj(masks.batched, 'masks.batched');
  const rowsInStep = num(batched.rows, 'masks.batched.rows');
  const timings: Array<[string, unknown, string]> = [
    ['one sequence alone, per token', alone.perTokenUs, 'masks.alone.perTokenUs'],
    ['alone, in free text', alone.freeTextUs, 'masks.alone.freeTextUs'],
    [`${rowsInStep} in a step, per row`, batched.perRowUs, 'masks.batched.perRowUs'],
    [`${rowsInStep} in a step, whole step`, batched.stepUs, 'masks.batched.stepUs'],
  ];
  if (masks.inThread !== undefined) timings.push(['xgrammar in this thread, per token', obj(masks.inThread, 'masks.inThread').perTokenUs, 'masks.inThread.perTokenUs']);
  if (masks.echo !== undefined) timings.push(['echo worker round trip, 1 mask', obj(masks.echo, 'masks.echo').oneMaskUs, 'masks.echo.oneMaskUs']);
  const maskData = timings.flatMap(([label, s, path]) => {
    const o = obj(s, path);
    return [datum(label, 'p50', num(o.p50, `${path}.p50`)), datum(label, 'p99', num(o.p99, `${path}.p99`))];
  });
  const runs = arr(obj(r.decode, 'decode').runs, 'decode.runs').map((run, i) => {
    const o = obj(run, `decode.runs[${i}]`);
    return datum(num(o.rows, `decode.runs[${i}].rows`), str(o.shape, `decode.runs[${i}].shape`), num(o.costPercent, `decode.runs[${i}].costPercent`));
  });
  const targets = r.targets !== null && typeof r.targets === 'object' ? (r.targets as Json) : {};
  const h = header('structured', r, file, null, [
    `grammar engine: ${optStr(r.grammarEngine) ?? 'not recorded'} · vocabulary ${r.vocabSize ?? '?'} tokens${r.quick === true ? ' · --quick' : ''}`,
  ]);
  const target = (t: unknown, what: string) => (typeof t === 'number' ? `${what} ${t}` : '');
  return [
    barChart({
      name: 'masks', header: h, horizontal: true, log: true, data: maskData,
      what: `token-mask time (targets: ${[target(targets.maskP50Us, 'p50 ≤'), target(targets.maskP99Us, 'p99 ≤')].filter(Boolean).join(' µs, ') || 'none'} µs)`,
      categoryTitle: 'measurement', valueTitle: 'mask time (µs, log scale)', seriesTitle: 'percentile',
    }),
    barChart({
      name: 'decode', header: h, data: runs,
      what: `decode cost of a schema by batch${typeof targets.decodeCostAtBatch32Percent === 'number' ? ` (target ≤ ${targets.decodeCostAtBatch32Percent}% at 32)` : ''}`,
      categoryTitle: 'batch (sequences)', valueTitle: 'decode tokens/s lost to the schema (%)', seriesTitle: 'model shape',
    }),
  ];
}

/** bench/results/throughput-*.json: output tokens/s per offline phase; TTFT and e2e p50 against Poisson rate. */
export function throughputCharts(r: Json, file: string): Chart[] {
  const results = arr(r.results, 'results').map((x, i) => {
    const o = obj(x, `results[${i}]`);
    const p50 = (v: unknown, key: string) => (v === null || v === undefined ? null : num(obj(v, `results[${i}].${key}`).p50, `results[${i}].${key}.p50`));
    return {
      phase: str(o.phase, `results[${i}].phase`), rate: optNum(o.rate, `results[${i}].rate`),
      outputTokensPerS: num(o.outputTokensPerS, `results[${i}].outputTokensPerS`), ttft50: p50(o.ttftMs, 'ttftMs'), e2e50: p50(o.e2eMs, 'e2eMs'),
    };
  });
  // model is the --model directory when one was given, else the preset made for the run.
  const model = typeof r.model === 'string' ? { preset: basename(r.model) } : obj(r.model, 'model');
  const engine = r.engine !== null && typeof r.engine === 'object' ? (r.engine as Json) : {};
  const workload = r.workload !== null && typeof r.workload === 'object' ? (r.workload as Json) : {};
  const h = header('throughput', r, file, optStr(r.device), [
    `${optStr(model.preset) ?? 'model'} model · ${count(engine.threads, 'engine thread')}, ${engine.maxNumSeqs ?? '?'} sequences · ` +
      `${workload.requests ?? '?'} ShareGPT-shaped requests (seed ${workload.seed ?? '?'})`,
  ]);
  const poisson = results.filter((x) => x.phase === 'poisson' && x.rate !== null);
  const latency = poisson.flatMap((x) => [
    ...(x.ttft50 === null ? [] : [datum(x.rate!, 'TTFT p50', x.ttft50)]),
    ...(x.e2e50 === null ? [] : [datum(x.rate!, 'end-to-end p50', x.e2e50)]),
  ]);
  return [
    barChart({
      name: 'phases', what: 'output tokens/s per phase (all requests at once)', header: h,
      data: results.filter((x) => x.phase !== 'poisson').map((x) => datum(x.phase, 'output tokens/s', x.outputTokensPerS)),
      categoryTitle: 'phase', valueTitle: 'output tokens/s', seriesTitle: 'measure',
    }),
    lineChart({
      name: 'poisson', what: 'latency p50 against Poisson arrival rate', header: h, data: latency,
      xTitle: 'offered rate (requests/s)', valueTitle: 'latency p50 (ms, log scale)', seriesTitle: 'measure', xType: 'quantitative', log: true,
    }),
  ].filter((c) => c.data.length > 0);
}
