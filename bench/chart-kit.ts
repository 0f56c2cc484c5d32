// Vega-Lite specs for bench charts: grouped bars and lines, each value printed on its mark, so a
// chart reads without hovering. Pure: data in, spec out; rendering is charts.ts's job.
import type { TopLevelSpec } from 'vega-lite';

/** One drawn value: a bar, or a point on a line. `label` is the number as printed beside it. */
export interface Datum {
  x: string | number;   // category (bars) or position on the x axis (lines)
  series: string;       // colour: precision, engine, percentile...
  value: number;
  label: string;
}

export interface Chart {
  name: string;         // file suffix when a result gets several charts: <basename>-<name>.svg
  title: string;
  data: Datum[];        // one mark per datum, in drawing order
  spec: TopLevelSpec;
}

/** What every chart of one result shares: the bench's name and where it ran. */
export interface ChartHeader {
  bench: string;        // "engine", "serve"...: the title says bench:<bench>
  subtitle: string[];   // machine / device first, then settings, then the source file and date
}

export interface BarChartOptions {
  name: string;
  what: string;         // the title after "bench:<bench> · "
  header: ChartHeader;
  data: Datum[];
  categoryTitle: string;
  valueTitle: string;   // with its unit: "decode tokens/s"
  seriesTitle: string;
  horizontal?: boolean; // categories down the y axis (for long category names)
  log?: boolean;        // values spanning decades
}

export interface LineChartOptions {
  name: string;
  what: string;
  header: ChartHeader;
  data: Datum[];
  xTitle: string;
  valueTitle: string;
  seriesTitle: string;
  xType: 'ordinal' | 'quantitative';
  log?: boolean;
  labels?: boolean;     // print each value beside its point (default true; off for dense series)
}

const CONFIG = {
  font: 'Helvetica, Arial, sans-serif',
  title: { anchor: 'start', fontSize: 15, subtitleFontSize: 11, subtitleColor: '#444', offset: 12 },
  axis: { labelFontSize: 11, titleFontSize: 12, titleFontWeight: 'normal', labelLimit: 420 },
  legend: { labelFontSize: 11, titleFontSize: 11, labelLimit: 420 },
  view: { stroke: null },
} as const;

/** Values as printed on charts: integers with separators from 1,000, else 3-4 significant digits. */
export function formatValue(value: number): string {
  const abs = Math.abs(value);
  const digits = abs >= 1000 ? 0 : abs >= 10 ? 1 : abs >= 1 ? 2 : 3;
  return value.toLocaleString('en-US', { maximumFractionDigits: digits });
}

export function datum(x: string | number, series: string, value: number): Datum {
  return { x, series, value, label: formatValue(value) };
}

function titleOf(header: ChartHeader, what: string): string {
  return `bench:${header.bench} · ${what}`;
}

function seriesOrder(data: Datum[]): string[] {
  return [...new Set(data.map((d) => d.series))];
}

/** Categories in first-seen order; numbers (batch sizes, token counts) ascending. */
function categoryOrder(data: Datum[]): Array<string | number> {
  const xs = [...new Set(data.map((d) => d.x))];
  return xs.every((x) => typeof x === 'number') ? (xs as number[]).sort((a, b) => a - b) : xs;
}

export function barChart(o: BarChartOptions): Chart {
  const series = seriesOrder(o.data);
  const title = titleOf(o.header, o.what);
  const band = o.horizontal ? 'y' : 'x';
  const along = o.horizontal ? 'x' : 'y';
  const scale = o.log ? { type: 'log' as const } : { zero: true };
  const category = {
    field: 'x', type: 'ordinal' as const, title: o.categoryTitle, sort: categoryOrder(o.data),
    axis: o.horizontal ? {} : { labelAngle: 0 },
  };
  // Grouped, never stacked: a stack would put zero in a log scale's domain.
  const value = { field: 'value', type: 'quantitative' as const, title: o.valueTitle, scale, stack: null };
  const offset = { field: 'series', type: 'nominal' as const, sort: series };
  // The step is per bar: wide enough for its printed value above it, or tall enough for the text beside it.
  const step = { step: o.horizontal ? 16 : 40, for: 'offset' as const };
  // NOTE: a negative bar's label goes below its end, a positive one's above (or right of) it.
  const labelMark = o.horizontal
    ? { type: 'text' as const, align: 'left' as const, baseline: 'middle' as const, dx: 3, fontSize: 10 }
    : { type: 'text' as const, baseline: 'bottom' as const, dy: { expr: 'datum.value < 0 ? 14 : -2' }, fontSize: 10 };
  const spec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: title, subtitle: o.header.subtitle },
    config: CONFIG,
    data: { values: o.data },
    ...(o.horizontal ? { height: step, width: 460 } : { width: step, height: 300 }),
    encoding: {
      [band]: category,
      [`${band}Offset`]: offset,
      [along]: value,
    },
    layer: [
      {
        mark: { type: 'bar' as const },
        encoding: { color: { field: 'series', type: 'nominal' as const, title: o.seriesTitle, sort: series } },
      },
      { mark: labelMark, encoding: { text: { field: 'label', type: 'nominal' as const } } },
    ],
  } as TopLevelSpec;
  return { name: o.name, title, data: o.data, spec };
}

export function lineChart(o: LineChartOptions): Chart {
  const series = seriesOrder(o.data);
  const title = titleOf(o.header, o.what);
  const x = o.xType === 'ordinal'
    ? { field: 'x', type: 'ordinal' as const, title: o.xTitle, sort: categoryOrder(o.data), axis: { labelAngle: 0 } }
    : { field: 'x', type: 'quantitative' as const, title: o.xTitle };
  const y = { field: 'value', type: 'quantitative' as const, title: o.valueTitle, scale: o.log ? { type: 'log' as const } : { zero: true } };
  const color = { field: 'series', type: 'nominal' as const, title: o.seriesTitle, sort: series };
  const layer: object[] = [
    { mark: { type: 'line' as const, strokeWidth: 2 } },
    { mark: { type: 'point' as const, filled: true, size: 40 } },
  ];
  if (o.labels !== false) {
    layer.push({ mark: { type: 'text' as const, dx: 5, dy: -7, align: 'left' as const, fontSize: 10 }, encoding: { text: { field: 'label', type: 'nominal' as const } } });
  }
  const spec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: title, subtitle: o.header.subtitle },
    config: CONFIG,
    data: { values: o.data },
    width: 520,
    height: 300,
    encoding: { x, y, color },
    layer,
  } as TopLevelSpec;
  return { name: o.name, title, data: o.data, spec };
}
