// The dashboard in a real browser: Debian's headless Chromium (package chromium-headless-shell, or
// chromium) opens /dashboard#key=... on a real server after real requests, runs the page's script
// under its CSP, and the DOM it dumps must hold the numbers (generations, tokens, an organization's
// row with its cost, the recent requests), with an organization's name that is HTML shown as text.
// A screenshot (1280×900) is decoded and must be a picture: its size, many colours, the header
// drawn in the style sheet's colour. It is kept at test-results/dashboard.png for people to look at.
// The plots of the last minutes are inline SVG drawn from the server's history after a real
// request: a line per series, inside the plot, peaking where the data peaks. The README's
// screenshot command runs as the README writes it (as root here, and in CI).
//
// Without a Chromium binary the suite is skipped (developers' machines), except in CI (CI=true or
// SLUICE_REQUIRE_CHROMIUM=1), where .ci/run installs the package and a missing browser fails.

import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { PNG } from 'pngjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DashboardData } from '../../src/dashboard/dashboard-data.js';
import { createApiKey } from '../../src/store/api-keys.js';
import { testCatalog } from '../helpers/api-catalog.js';
import { startTestServer, type TestServer } from '../helpers/api-server.js';

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const SCREENSHOT = join(root, 'test-results', 'dashboard.png');

const CANDIDATES = ['/usr/bin/chromium-headless-shell', '/usr/bin/chromium', '/usr/bin/chromium-browser'];
const chromium = [process.env.SLUICE_CHROMIUM, ...CANDIDATES].find((p): p is string => p !== undefined && p !== '' && existsSync(p));
const required = process.env.CI === 'true' || process.env.CI === '1' || process.env.SLUICE_REQUIRE_CHROMIUM === '1';
const MISSING = 'no Chromium binary (looked for $SLUICE_CHROMIUM, ' + CANDIDATES.join(', ')
  + '); install Debian\'s package: apt-get install chromium-headless-shell';

if (!chromium && !required) console.warn(`dashboard browser test skipped: ${MISSING}`);

describe.runIf(!chromium && required)('dashboard in headless Chromium (CI)', () => {
  it('has a Chromium binary', () => {
    throw new Error(`CI needs the browser for the dashboard's screenshot check: ${MISSING}`);
  });
});

describe.skipIf(!chromium)(`dashboard in headless Chromium${chromium ? ` (${chromium})` : ` (skipped: ${MISSING})`}`, () => {
  let server: TestServer;
  let adminKey: string;
  let profile: string;
  // An organization whose name is markup: the page must show it as text.
  const markupOrg = '<img src=x onerror="document.title=\'pwned\'">';

  beforeAll(async () => {
    // A sample every 50 ms, 3,600 kept: the plots span 3 minutes and see a short request run.
    server = await startTestServer({ catalog: testCatalog, dashboardHistory: { intervalMs: 50, capacity: 3_600 } });
    adminKey = (await createApiKey(server.service.store, 'ops', { admin: true })).key;
    profile = mkdtempSync(join(os.tmpdir(), 'sluice-chromium-'));
    const client = async (org: string) => new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor(org), maxRetries: 0 });
    const chat = async (org: string, content: string) => (await client(org)).chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 8, temperature: 0,
    });
    await Promise.all([chat('acme', 'hello from acme'), chat('acme', 'acme again'), chat('globex', 'globex here'), chat(markupOrg, 'hi')]);
  });
  afterAll(async () => {
    await server?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
  });

  /** Runs the browser on the page; virtual time lets the script fetch and refresh before it ends. */
  async function browse(fragment: string, output: string[]): Promise<string> {
    const { stdout } = await run(chromium!, [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--hide-scrollbars',
      `--user-data-dir=${profile}`, '--virtual-time-budget=8000', ...output, `${server.origin}/dashboard${fragment}`,
    ], { timeout: 60_000, maxBuffer: 16 << 20 });
    return stdout;
  }

  const text = (dom: string, id: string) => {
    const m = new RegExp(`id="${id}"[^>]*>([^<]*)<`).exec(dom);
    if (!m) throw new Error(`no element #${id} in the dumped DOM`);
    return m[1]!.replace(/,/g, '');
  };

  /** The data once the engine is idle (its next step frees the finished sequences' blocks), so the page shows the same. */
  async function idleData(): Promise<DashboardData> {
    for (let i = 0; ; i++) {
      const res = await fetch(`${server.origin}/dashboard/data`, { headers: { authorization: `Bearer ${adminKey}` } });
      const data = (await res.json()) as DashboardData;
      if (data.models.every((m) => m.kv_blocks.used === 0) || i === 200) return data;
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  it('renders the numbers of the data endpoint, with the key from the fragment', async () => {
    const data = await idleData();
    const dom = await browse(`#key=${encodeURIComponent(adminKey)}`, ['--dump-dom']);

    expect(text(dom, 'status')).toMatch(/^updated /);
    expect(dom).toMatch(/<form id="key-form" hidden/);
    expect(dom).not.toMatch(/<main id="board" hidden/);
    expect(text(dom, 'total-generations')).toBe('4');
    expect(text(dom, 'total-prompt-tokens')).toBe(String(data.totals.prompt_tokens));
    expect(text(dom, 'total-generation-tokens')).toBe(String(data.totals.generation_tokens));
    // A refresh after the first read: the rates are shown (nothing runs now, so they are 0).
    expect(text(dom, 'generation-rate')).toMatch(/^\d+(\.\d)?$/);
    expect(text(dom, 'rate-interval')).toMatch(/^over the last \d+ s$/);

    const acme = data.usage.organizations.find((o) => o.organization === 'acme')!;
    expect(acme.requests).toBe(2);
    expect(Number(acme.cost)).toBeGreaterThan(0);
    const orgRows = /<tbody id="org-rows">([\s\S]*?)<\/tbody>/.exec(dom)![1]!;
    const acmeRow = /<tr><td>acme<\/td>([\s\S]*?)<\/tr>/.exec(orgRows)![1]!.replace(/,/g, '');
    expect(acmeRow).toContain('<td class="num">2</td>');
    expect(acmeRow).toContain(`<td class="num">${acme.input_tokens}</td>`);
    expect(acmeRow).toContain(`<td class="num">$${acme.cost}</td>`);
    expect(orgRows).toContain('<td>globex</td>');
    expect(orgRows).toMatch(/<tr class="total"><td>all organizations<\/td><td class="num">4<\/td>/);

    // The markup organization is text: escaped in the dump, never parsed into an element.
    expect(orgRows).toContain('<td>&lt;img src=x onerror="document.title=\'pwned\'"&gt;</td>');
    expect(dom).not.toContain('<img src="x"');
    expect(dom).not.toContain('<title>pwned');

    const recentRows = /<tbody id="recent-rows">([\s\S]*?)<\/tbody>/.exec(dom)![1]!;
    expect(recentRows.match(/<td>POST \/v1\/chat\/completions<\/td>/g)).toHaveLength(4);
    expect(recentRows).toContain('<td>acme</td>');
    // The key is kept in sessionStorage, not in the page.
    expect(dom).not.toContain(adminKey);
    // One model's queues per window and its KV bar.
    expect(dom).toMatch(/<h3>tiny<\/h3>/);
    expect(dom).toMatch(/<td>asap<\/td><td class="num">0<\/td><td class="num">0<\/td>/);
    expect(dom).toMatch(/KV cache: 0\.0% used/);
  });

  it('asks for a key when the fragment\'s key is not an admin key', async () => {
    const dom = await browse(`#key=${encodeURIComponent(server.key)}`, ['--dump-dom']);
    expect(dom).not.toMatch(/<form id="key-form" hidden/);
    expect(dom).toMatch(/<main id="board" hidden/);
    expect(text(dom, 'status')).toMatch(/^key refused \(403\): the dashboard needs an admin API key/);
    expect(dom).not.toContain('acme');
  });

  it('plots the last minutes from the server\'s history: output tokens/s, requests/s, running and waiting', async () => {
    // A request of 8 choices that runs for many samples; then a sample after it ends.
    await new OpenAI({ baseURL: server.baseUrl, apiKey: await server.keyFor('acme'), maxRetries: 0 }).chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'a long one' }], max_tokens: 400, n: 8, temperature: 1, seed: 3,
    });
    const ended = Date.now();
    while (!(await idleData()).history.samples.some((s) => Date.parse(s.time) > ended + 60)) await new Promise((r) => setTimeout(r, 20));
    const dom = await browse(`#key=${encodeURIComponent(adminKey)}`, ['--dump-dom']);
    // Read after the page: the history only grew since (a few idle samples, well within its capacity).
    const data = await idleData();
    const samples = data.history.samples;
    const peak = (key: 'output_tokens_per_s' | 'requests_per_s' | 'running' | 'waiting') => Math.max(...samples.map((s) => s[key]));
    expect(peak('output_tokens_per_s')).toBeGreaterThan(0);
    expect(peak('running')).toBeGreaterThan(0);

    expect(text(dom, 'history-title')).toBe('Last 3 minutes');
    // Captions: the latest sample (idle now) and the peak, shown to a tenth.
    const caption = (id: string) => {
      const m = /^latest (.+) · peak ([\d.]+)$/.exec(text(dom, id));
      if (!m) throw new Error(`#${id} reads "${text(dom, id)}"`);
      return { latest: m[1]!, peak: Number(m[2]) };
    };
    expect(caption('plot-output-caption')).toEqual({ latest: '0', peak: expect.closeTo(peak('output_tokens_per_s'), 0) });
    expect(caption('plot-requests-caption')).toEqual({ latest: '0', peak: expect.closeTo(peak('requests_per_s'), 0) });
    expect(caption('plot-queue-caption')).toEqual({ latest: '0 running 0 waiting', peak: Math.max(peak('running'), peak('waiting')) });

    // viewBox 0 0 400 140; the plotting area is x 40..392, y 10..120 (client.ts, PLOT).
    const points = (id: string) => {
      const m = new RegExp(`<polyline id="${id}" class="[^"]*" points="([^"]*)"`).exec(dom);
      if (!m) throw new Error(`no polyline #${id} in the dumped DOM`);
      return m[1]!.split(' ').map((p) => p.split(',').map(Number) as [number, number]);
    };
    // The top of the y axis: 1, 2 or 5 times a power of ten, at or above the peak.
    const axisTop = (max: number) => [1, 2, 5, 10].map((m) => m * 10 ** Math.floor(Math.log10(max))).find((v) => v >= max)!;
    for (const [id, key] of [['plot-output-output', 'output_tokens_per_s'], ['plot-requests-requests', 'requests_per_s'],
      ['plot-queue-running', 'running']] as const) {
      const line = points(id);
      expect(line.length, id).toBeGreaterThan(10);
      for (const [x, y] of line) {
        expect(x, id).toBeGreaterThanOrEqual(40);
        expect(x, id).toBeLessThanOrEqual(392);
        expect(y, id).toBeGreaterThanOrEqual(10);
        expect(y, id).toBeLessThanOrEqual(120);
      }
      // Time runs left to right, and the highest point is the peak's height under the axis' top.
      expect(line.map(([x]) => x)).toEqual(line.map(([x]) => x).sort((a, b) => a - b));
      const top = Math.min(...line.map(([, y]) => y));
      expect(top, id).toBeCloseTo(120 - (peak(key) / axisTop(peak(key))) * 110, 0);
      // The newest point is at the right end (its sample is the page's latest) and idle.
      expect(line.at(-1)![0], id).toBeGreaterThan(385);
      expect(line.at(-1)![1], id).toBe(120);
    }
    expect(points('plot-queue-waiting').length).toBe(points('plot-queue-running').length);
  });

  it('runs the README\'s screenshot command as written', async () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('\n## Dashboard\n'), readme.indexOf('\n## Logs\n'));
    const command = /```sh\n([\s\S]*?)```/.exec(section)![1]!;
    expect(command).toContain('chromium-headless-shell');
    expect(command).toContain('http://127.0.0.1:8080/dashboard#key=$ADMIN_KEY');
    // This machine's browser and this server in place of the README's; Debian's chromium needs --headless.
    const binary = chromium!.endsWith('chromium-headless-shell') ? chromium! : `${chromium!} --headless`;
    const script = command.replace('chromium-headless-shell', binary).replace('http://127.0.0.1:8080', server.origin);
    const cwd = mkdtempSync(join(os.tmpdir(), 'sluice-readme-shot-'));
    try {
      // HOME in the temporary directory: the browser's profile goes there.
      await run('bash', ['-c', script], { cwd, env: { ...process.env, HOME: cwd, ADMIN_KEY: adminKey }, timeout: 60_000 });
      const png = PNG.sync.read(readFileSync(join(cwd, 'dashboard.png')));
      expect([png.width, png.height]).toEqual([1280, 900]);
      // The board with its data, not the key form: the plots' lines are drawn in the accent colour.
      let accent = 0;
      for (let i = 0; i < png.data.length; i += 4) {
        if (Math.abs(png.data[i]! - 0x25) <= 8 && Math.abs(png.data[i + 1]! - 0x63) <= 8 && Math.abs(png.data[i + 2]! - 0xeb) <= 8) accent++;
      }
      expect(accent).toBeGreaterThan(100);
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  });

  it('takes a screenshot that is a picture of the page', async () => {
    mkdirSync(dirname(SCREENSHOT), { recursive: true });
    rmSync(SCREENSHOT, { force: true });
    await browse(`#key=${encodeURIComponent(adminKey)}`, [`--screenshot=${SCREENSHOT}`, '--window-size=1280,900']);
    const png = PNG.sync.read(readFileSync(SCREENSHOT));
    expect([png.width, png.height]).toEqual([1280, 900]);
    const pixel = (x: number, y: number) => [...png.data.subarray((y * png.width + x) * 4, (y * png.width + x) * 4 + 3)];
    const colours = new Set<number>();
    for (let i = 0; i < png.data.length; i += 4) colours.add(png.data.readUInt32BE(i));
    expect(colours.size).toBeGreaterThan(50); // text, cards and bars, not a blank or single-colour page
    // The style sheet was applied (its CSP allowed it): the header band in --ink, the page in --bg.
    const near = (got: number[], want: number[]) => got.every((v, i) => Math.abs(v - want[i]!) <= 3);
    expect(near(pixel(1270, 4), [0x1d, 0x23, 0x30]), `header pixel ${pixel(1270, 4)}`).toBe(true);
    expect(near(pixel(4, 890), [0xf6, 0xf7, 0xf9]), `page pixel ${pixel(4, 890)}`).toBe(true);
  });
});
