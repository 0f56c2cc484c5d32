// The dashboard's script, run by the browser (served as GET /dashboard/app.js, api/dashboard-route.ts).
// It is written here, as a function, so that the compiler checks it against the DOM's types and the
// data's; the route serves its source text: `(${dashboardClient})()`. So it must not refer to
// anything outside itself (no imports at run time, no module-level helpers): types only.
//
// The key: a browser sends no Authorization header when it navigates, so the page asks for the
// admin key (a password field) and keeps it in sessionStorage (this tab only, gone when it closes).
// It also takes it from the URL's fragment, `/dashboard#key=...`, which browsers never send to the
// server: that lets a script or a headless browser open the page in one step. The fragment is
// read, stored and removed from the address bar at once.
//
// Everything from the server reaches the page through textContent (or an SVG attribute holding
// numbers), never as HTML.
//
// The plots of the last minutes are inline SVG drawn here from the server's history of samples
// (data.history: one every few seconds, kept by the server, so a page opened now shows the last
// 15 minutes at once): x is time, from the span's start to the data's `time`; y runs from 0 to a
// round bound (1, 2 or 5 × a power of ten) at or above the highest value shown.

import type { UsageTotals } from '../billing/usage-report.js';
import type { DashboardData } from './dashboard-data.js';

export function dashboardClient(): void {
  const STORAGE_KEY = 'sluice.dashboard.key';
  const REFRESH_MS = 3000;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  // A plot's viewBox, in its own units: the plotting area is [left, width - right] × [top, height - bottom].
  const PLOT = { width: 400, height: 140, left: 40, right: 8, top: 10, bottom: 20 };

  const byId = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
  const form = byId<HTMLFormElement>('key-form');
  const keyInput = byId<HTMLInputElement>('key-input');
  const board = byId<HTMLElement>('board');
  const status = byId<HTMLElement>('status');

  const fragmentKey = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (fragmentKey) {
    sessionStorage.setItem(STORAGE_KEY, decodeURIComponent(fragmentKey[1]!));
    history.replaceState(null, '', location.pathname + location.search);
  }

  const integer = (n: number) => Math.round(n).toLocaleString('en-US');
  const rate = (n: number | undefined) => (n === undefined ? '–' : n.toLocaleString('en-US', { maximumFractionDigits: 1 }));
  const setText = (id: string, text: string) => { byId(id).textContent = text; };
  const cell = (row: HTMLTableRowElement, text: string, className?: string) => {
    const td = row.insertCell();
    td.textContent = text;
    if (className) td.className = className;
  };

  function askForKey(message: string): void {
    form.hidden = false;
    board.hidden = true;
    status.textContent = message;
    keyInput.focus();
  }

  const svgNode = (name: string, attrs: Record<string, string | number>, text?: string): SVGElement => {
    const node = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  /** The y axis' top: 1, 2 or 5 times a power of ten, at or above `max` (1 when nothing was above 0). */
  const axisTop = (max: number) => {
    if (!(max > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(max));
    return [1, 2, 5, 10].map((m) => m * power).find((v) => v >= max)!;
  };
  const ago = (seconds: number) => (seconds === 0 ? 'now'
    : seconds >= 60 ? `-${Math.round(seconds / 6) / 10} min` : `-${Math.round(seconds)} s`);

  type Sample = DashboardData['history']['samples'][number];
  type Series = { key: 'output_tokens_per_s' | 'requests_per_s' | 'running' | 'waiting'; name: string };

  /**
   * Draws one plot into <svg id=`id`>: a polyline per series (id `${id}-${name}`, class
   * `series-${name}`), grid lines at 0, half and the top with their values, time marks below.
   * Returns the highest value shown.
   */
  function drawPlot(id: string, samples: Sample[], startMs: number, endMs: number, series: Series[]): number {
    const svg = byId(id) as unknown as SVGSVGElement;
    const { width, height, left, right, top, bottom } = PLOT;
    const spanMs = Math.max(endMs - startMs, 1);
    const shown = samples.filter((s) => Date.parse(s.time) >= startMs);
    const peak = Math.max(0, ...shown.flatMap((s) => series.map((k) => s[k.key])));
    const yTop = axisTop(peak);
    const x = (ms: number) => left + ((ms - startMs) / spanMs) * (width - left - right);
    const y = (v: number) => height - bottom - (v / yTop) * (height - bottom - top);
    const round = (n: number) => Math.round(n * 10) / 10;
    const nodes: SVGElement[] = [];
    for (const v of [0, yTop / 2, yTop]) {
      nodes.push(svgNode('line', { class: 'grid', x1: left, x2: width - right, y1: round(y(v)), y2: round(y(v)) }));
      nodes.push(svgNode('text', { class: 'axis', x: left - 6, y: round(y(v)) + 4, 'text-anchor': 'end' },
        v.toLocaleString('en-US', { notation: 'compact', maximumFractionDigits: 1 })));
    }
    for (let i = 0; i <= 3; i++) {
      const ms = startMs + (spanMs * i) / 3;
      nodes.push(svgNode('text', {
        class: 'axis', x: round(x(ms)), y: height - 6, 'text-anchor': i === 0 ? 'start' : i === 3 ? 'end' : 'middle',
      }, ago((endMs - ms) / 1000)));
    }
    for (const k of series) {
      const points = shown.map((s) => `${round(x(Date.parse(s.time)))},${round(y(s[k.key]))}`).join(' ');
      nodes.push(svgNode('polyline', { id: `${id}-${k.name}`, class: `series-${k.name}`, points }));
    }
    svg.replaceChildren(...nodes);
    return peak;
  }

  function drawHistory(data: DashboardData): void {
    const h = data.history;
    const endMs = Date.parse(data.time);
    const spanSeconds = h.interval_seconds * h.capacity;
    const startMs = endMs - spanSeconds * 1000;
    setText('history-title', spanSeconds >= 120 ? `Last ${Math.round(spanSeconds / 60)} minutes` : `Last ${Math.round(spanSeconds)} seconds`);
    setText('history-note', `a sample every ${h.interval_seconds.toLocaleString('en-US', { maximumFractionDigits: 3 })} s, `
      + `${integer(h.samples.length)} of ${integer(h.capacity)} kept`);
    const last = h.samples[h.samples.length - 1];
    const caption = (latest: string, peak: number) => `latest ${latest} · peak ${rate(peak)}`;
    const outputPeak = drawPlot('plot-output', h.samples, startMs, endMs, [{ key: 'output_tokens_per_s', name: 'output' }]);
    setText('plot-output-caption', caption(rate(last?.output_tokens_per_s), outputPeak));
    const requestsPeak = drawPlot('plot-requests', h.samples, startMs, endMs, [{ key: 'requests_per_s', name: 'requests' }]);
    setText('plot-requests-caption', caption(rate(last?.requests_per_s), requestsPeak));
    const queuePeak = drawPlot('plot-queue', h.samples, startMs, endMs, [{ key: 'running', name: 'running' }, { key: 'waiting', name: 'waiting' }]);
    setText('plot-queue-caption', caption(last ? `${integer(last.running)} running, ${integer(last.waiting)} waiting` : '–', queuePeak));
  }

  function render(data: DashboardData): void {
    form.hidden = true;
    board.hidden = false;
    status.textContent = `updated ${new Date(data.time).toLocaleTimeString('en-GB')}`;
    const t = data.throughput;
    setText('generation-rate', rate(t?.generation_tokens_per_s));
    setText('prompt-rate', rate(t?.prompt_tokens_per_s));
    setText('computed-rate', rate(t?.computed_tokens_per_s));
    setText('rate-interval', t ? `over the last ${t.interval_seconds.toFixed(0)} s` : 'rates after the next refresh');
    setText('total-generations', integer(data.totals.generations));
    setText('total-prompt-tokens', integer(data.totals.prompt_tokens));
    setText('total-generation-tokens', integer(data.totals.generation_tokens));
    setText('total-http-requests', integer(data.totals.http_requests));
    drawHistory(data);

    const models = byId('models');
    models.replaceChildren(...data.models.map((m) => {
      const box = document.createElement('div');
      box.className = 'model';
      const title = document.createElement('h3');
      title.textContent = m.model;
      const table = document.createElement('table');
      const head = table.createTHead().insertRow();
      for (const h of ['window', 'running', 'waiting']) {
        const th = head.appendChild(document.createElement('th'));
        th.textContent = h;
        if (h !== 'window') th.className = 'num';
      }
      const body = table.createTBody();
      for (const w of m.windows) {
        const row = body.insertRow();
        cell(row, w.window);
        cell(row, integer(w.running), 'num');
        cell(row, integer(w.waiting), 'num');
      }
      const kv = m.kv_blocks;
      const all = kv.used + kv.cached + kv.free;
      const bar = document.createElement('div');
      bar.className = 'kv-bar';
      for (const state of ['used', 'cached', 'free'] as const) {
        const part = bar.appendChild(document.createElement('div'));
        part.className = `kv-${state}`;
        part.style.flexGrow = String(kv[state]); // CSSOM, which the page's CSP allows (a style attribute it would not)
      }
      const legend = document.createElement('p');
      legend.className = 'kv-legend';
      legend.textContent = `KV cache: ${(m.kv_usage_ratio * 100).toFixed(1)}% used · ${integer(kv.used)} used, `
        + `${integer(kv.cached)} cached, ${integer(kv.free)} free of ${integer(all)} blocks`;
      box.append(title, table, bar, legend);
      if (m.lora) {
        const lora = document.createElement('p');
        lora.className = 'kv-legend';
        lora.textContent = `LoRA adapters: ${integer(m.lora.resident)} resident (${integer(Math.round(m.lora.resident_bytes / 2 ** 20))} MiB), `
          + `${integer(m.lora.retired)} retired · ${integer(m.lora.loads)} loads, ${integer(m.lora.evictions)} evictions`;
        box.append(lora);
      }
      return box;
    }));

    const orgs = byId<HTMLTableSectionElement>('org-rows');
    orgs.replaceChildren();
    const usageRow = (name: string, u: UsageTotals) => {
      const row = orgs.insertRow();
      cell(row, name);
      cell(row, integer(u.requests), 'num');
      cell(row, integer(u.input_tokens), 'num');
      cell(row, integer(u.cached_tokens), 'num');
      cell(row, integer(u.output_tokens), 'num');
      cell(row, `$${u.cost}`, 'num');
      return row;
    };
    for (const o of data.usage.organizations) usageRow(o.organization, o);
    usageRow('all organizations', data.usage.total).className = 'total';

    const recent = byId<HTMLTableSectionElement>('recent-rows');
    recent.replaceChildren();
    for (const r of data.recent_requests) {
      const row = recent.insertRow();
      if (r.status >= 400) row.className = 'error';
      cell(row, new Date(r.time).toLocaleTimeString('en-GB'));
      cell(row, `${r.method} ${r.route}`);
      cell(row, String(r.status), 'num');
      cell(row, r.organization ?? '–');
      cell(row, r.tokens ? `${integer(r.tokens.prompt)} / ${integer(r.tokens.completion)}` : '–', 'num');
      cell(row, `${r.duration_ms.toFixed(1)} ms`, 'num');
    }
    if (data.recent_requests.length === 0) cell(recent.insertRow(), 'no requests yet');
  }

  let timer: number | undefined;
  async function refresh(): Promise<void> {
    clearTimeout(timer);
    const key = sessionStorage.getItem(STORAGE_KEY);
    if (!key) return askForKey('enter an admin API key');
    try {
      const res = await fetch('dashboard/data', { headers: { authorization: `Bearer ${key}` }, cache: 'no-store' });
      if (res.status === 401 || res.status === 403) {
        sessionStorage.removeItem(STORAGE_KEY);
        const body = await res.json().catch(() => null) as { error?: { message?: string } } | null;
        return askForKey(`key refused (${res.status}): ${body?.error?.message ?? res.statusText}`);
      }
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      render(await res.json() as DashboardData);
    } catch (err) {
      status.textContent = `refresh failed: ${(err as Error).message}; retrying`;
    }
    timer = window.setTimeout(() => void refresh(), REFRESH_MS);
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(STORAGE_KEY, keyInput.value.trim());
    keyInput.value = '';
    void refresh();
  });
  byId('forget').addEventListener('click', () => {
    sessionStorage.removeItem(STORAGE_KEY);
    clearTimeout(timer);
    askForKey('key forgotten');
  });
  void refresh();
}
