// Bench results as SVG charts (bench/charts.ts): every committed result family renders, each SVG
// parses, draws one mark per value and prints the values, titles and machine; files land beside
// their JSON; a result of unknown shape is skipped with a reason.
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';

import { DOMParser, type Element } from '@xmldom/xmldom';
import { afterAll, describe, expect, it, vi } from 'vitest';

import { formatValue } from '../bench/chart-kit.js';
import { chartsBesideResult, chartsFor, svgPathFor, writeCharts, type Chart } from '../bench/charts.js';

const RESULTS = resolve(import.meta.dirname, '..', 'bench', 'results');
const tmp = mkdtempSync(join(os.tmpdir(), 'sluice-charts-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function parseSvg(svg: string): Element {
  const errors: string[] = [];
  const doc = new DOMParser({ onError: (level, msg) => { if (level !== 'warning') errors.push(msg); } }).parseFromString(svg, 'image/svg+xml');
  expect(errors).toEqual([]);
  return doc.documentElement as unknown as Element;
}

function elements(root: Element, tag: string): Element[] {
  return Array.from(root.getElementsByTagName(tag)) as Element[];
}

/** The groups vega draws a mark's items into, e.g. class "mark-rect role-mark layer_0_marks". */
function markItems(root: Element, markType: string): Element[] {
  return elements(root, 'g')
    .filter((g) => (g.getAttribute('class') ?? '').split(' ').includes(`mark-${markType}`) && (g.getAttribute('class') ?? '').includes('role-mark'))
    .flatMap((g) => Array.from(g.childNodes).filter((n): n is Element => n.nodeType === 1));
}

/** Every line of text drawn: a multi-line <text> (the subtitle) holds one <tspan> per line. */
function texts(root: Element): string[] {
  return elements(root, 'text').flatMap((t) => {
    const lines = elements(t, 'tspan');
    return (lines.length > 0 ? lines : [t]).map((e) => e.textContent ?? '');
  });
}

function isBarChart(chart: Chart): boolean {
  return JSON.stringify(chart.spec).includes('"type":"bar"');
}

/** Axis titles: the `title` of each encoding channel with a field (x, y), from the spec itself. */
function axisTitles(chart: Chart): string[] {
  const encoding = (chart.spec as { encoding: Record<string, { title?: string; field?: string }> }).encoding;
  return ['x', 'y'].map((c) => encoding[c]?.title).filter((t): t is string => typeof t === 'string');
}

function checkSvg(svg: string, chart: Chart, machineLine: string): void {
  const root = parseSvg(svg);
  expect(root.tagName).toBe('svg');
  expect(Number(root.getAttribute('width'))).toBeGreaterThan(200);
  const shown = texts(root);
  expect(shown).toContain(chart.title);
  expect(shown).toContain(machineLine);
  for (const title of axisTitles(chart)) expect(shown).toContain(title);
  if (isBarChart(chart)) {
    expect(markItems(root, 'rect')).toHaveLength(chart.data.length);
    const labels = markItems(root, 'text').map((t) => t.textContent);
    expect(labels.sort()).toEqual(chart.data.map((d) => d.label).sort());
  } else {
    expect(markItems(root, 'symbol')).toHaveLength(chart.data.length);
    expect(markItems(root, 'line')).toHaveLength(new Set(chart.data.map((d) => d.series)).size);
  }
}

describe('bench charts', () => {
  const committed = readdirSync(RESULTS).filter((f) => f.endsWith('.json')).sort();

  it('formats values as printed on the charts', () => {
    expect(formatValue(13366.06)).toBe('13,366');
    expect(formatValue(136.87)).toBe('136.9');
    expect(formatValue(2.384)).toBe('2.38');
    expect(formatValue(0.43806)).toBe('0.438');
    expect(formatValue(-6.155)).toBe('-6.16');
  });

  it('charts every committed result, one family each, beside its JSON', async () => {
    const families = new Set<string>();
    for (const name of committed) {
      const jsonPath = join(tmp, name);
      copyFileSync(join(RESULTS, name), jsonPath);
      const result: unknown = JSON.parse(readFileSync(jsonPath, 'utf8'));
      const found = chartsFor(result, jsonPath);
      if (found.family === null) throw new Error(`${name}: ${found.skipped}`);
      families.add(found.family);
      const written = await writeCharts(jsonPath);
      expect(written.family).toBe(found.family);
      if (written.family === null) continue;
      const base = name.replace(/\.json$/, '');
      expect(written.svgPaths).toEqual(found.charts.map((c) => svgPathFor(jsonPath, c, found.charts.length)));
      for (const [i, path] of written.svgPaths.entries()) {
        expect(dirname(path)).toBe(tmp);
        expect(basename(path)).toBe(found.charts.length === 1 ? `${base}.svg` : `${base}-${found.charts[i]!.name}.svg`);
        const chart = found.charts[i]!;
        expect(chart.data.length).toBeGreaterThan(0);
        checkSvg(readFileSync(path, 'utf8'), chart, (chart.spec as { title: { subtitle: string[] } }).title.subtitle[0]!);
      }
    }
    expect([...families].sort()).toEqual(['cuda-kernels', 'device-check', 'engine', 'engine-ab', 'engine-cuda', 'engine-q4', 'engine-ts-path',
      'gemm-vs-torch', 'http', 'kv-cache-dtype', 'lora', 'moe', 'prefix', 'prefix-replicas', 'serve', 'speculative', 'structured', 'throughput', 'torch-matmul',
      'vision-encoder', 'vision-preprocess']);
  });

  it('names the machine and device from the result', () => {
    const subtitle = (file: string) => {
      const found = chartsFor(JSON.parse(readFileSync(join(RESULTS, file), 'utf8')), file);
      if (found.family === null) throw new Error(found.skipped);
      return (found.charts[0]!.spec as { title: { subtitle: string[] } }).title.subtitle;
    };
    expect(subtitle('engine-cpu.json')[0]).toBe('AMD EPYC, 2 cores · CPU avx512bf16');
    expect(subtitle('engine-cuda-h100.json')[0]).toContain('NVIDIA H100 80GB HBM3');
    expect(subtitle('throughput-amd-epyc-2core.json')[0]).toBe('AMD EPYC, 2 cores · avx512bf16 CPU');
    expect(subtitle('cuda-kernels-llama-3.1-8b-h100.json')[0]).toBe('machine and device not recorded in the result');
    expect(subtitle('cuda-kernels-llama-3.1-8b-h200.json')[0]).toBe('NVIDIA H200');
    expect(subtitle('gemm-vs-torch-llama-3.1-8b-h200.json')[0]).toBe('NVIDIA H200');
    expect(subtitle('device-check-h200.json')[0]).toContain('NVIDIA H200');
  });

  it('draws a small engine result: one bar and one printed value per row', async () => {
    const jsonPath = join(tmp, 'engine-fixture.json');
    writeFileSync(jsonPath, JSON.stringify({
      bench: 'engine', date: '2030-01-02T00:00:00Z',
      machine: { cpu: 'Test CPU', cores: 4 },
      model: { preset: 'tiny', weightDtype: 'bf16', backend: 'cpu', simd: 'avx2' },
      settings: { promptTokens: 64, threads: 4 },
      rows: [
        { precision: 'f32', batch: 1, prefillTokensPerS: 1234.4, decodeTokensPerS: 12.34 },
        { precision: 'f32', batch: 8, prefillTokensPerS: 2000, decodeTokensPerS: 80.25 },
        { precision: 'bf16', batch: 1, prefillTokensPerS: 1500, decodeTokensPerS: 20.5 },
      ],
    }));
    const written = await writeCharts(jsonPath);
    expect(written).toEqual({ jsonPath, family: 'engine', svgPaths: [join(tmp, 'engine-fixture-decode.svg'), join(tmp, 'engine-fixture-prefill.svg')] });
    const decode = parseSvg(readFileSync(join(tmp, 'engine-fixture-decode.svg'), 'utf8'));
    expect(markItems(decode, 'rect')).toHaveLength(3);
    expect(markItems(decode, 'text').map((t) => t.textContent).sort()).toEqual(['12.3', '20.5', '80.3']);
    const shown = texts(decode);
    expect(shown).toContain('bench:engine · decode tokens/s by batch and precision');
    expect(shown).toContain('Test CPU, 4 cores · CPU avx2');
    expect(shown).toContain('batch (sequences)');
    expect(shown).toContain('decode tokens/s (all sequences)');
    expect(shown).toEqual(expect.arrayContaining(['f32', 'bf16', '1', '8']));  // legend and axis labels
    const prefill = texts(parseSvg(readFileSync(join(tmp, 'engine-fixture-prefill.svg'), 'utf8')));
    expect(prefill).toEqual(expect.arrayContaining(['1,234', '2,000', '1,500', 'prefill tokens/s (64-token prompts)']));
  });

  it('skips a result it does not recognise, with the reason, and writes nothing', async () => {
    const cases: Array<[string, string, RegExp]> = [
      ['mystery.json', JSON.stringify({ bench: 'mystery', rows: [] }), /unrecognised result shape \(bench "mystery"\)/],
      ['no-bench.json', JSON.stringify({ foo: 1, bar: [1] }), /unrecognised result shape \(keys: foo, bar\)/],
      ['engine-broken.json', JSON.stringify({ bench: 'engine', model: {}, settings: { promptTokens: 1 }, rows: [{ precision: 'f32', batch: '1' }] }),
        /engine result of an unexpected shape: rows\[0\]\.batch is not a number/],
      ['not-json.json', '{ nope', /not readable as JSON/],
    ];
    for (const [name, text, reason] of cases) {
      const jsonPath = join(tmp, name);
      writeFileSync(jsonPath, text);
      const written = await writeCharts(jsonPath);
      expect(written.family).toBeNull();
      if (written.family === null) expect(written.skipped).toMatch(reason);
      expect(readdirSync(tmp).filter((f) => f.startsWith(name.replace(/\.json$/, '')) && f.endsWith('.svg'))).toEqual([]);
    }
  });

  it('a bench\'s chart step warns and never throws', async () => {
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => {});
    try {
      await expect(chartsBesideResult(join(tmp, 'mystery.json'))).resolves.toBeUndefined();
      await expect(chartsBesideResult(join(tmp, 'missing.json'))).resolves.toBeUndefined();
      expect(warn.mock.calls.map((c) => String(c[0]))).toEqual([
        expect.stringMatching(/^warning: no charts for .*mystery\.json: unrecognised result shape/),
        expect.stringMatching(/^warning: no charts for .*missing\.json: not readable as JSON/),
      ]);
      expect(existsSync(join(tmp, 'missing.svg'))).toBe(false);
    } finally {
      warn.mockRestore();
    }
  });
});
