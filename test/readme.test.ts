// The README as a reader of a clone meets it: every relative link and image points at a file of
// the repository, every in-page anchor at a heading, the HTTP API's route table lists exactly
// the routes the app registers (read from the app, so that a route added or removed anywhere
// fails here until the table says so), and the CLI synopsis and each command's --help list exactly
// the flags the command parses.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/api-server.js';
import { GENERATE_HELP, GENERATE_OPTIONS } from '../src/cli/generate.js';
import { KEYS_HELP, KEYS_OPTIONS } from '../src/cli/keys.js';
import { MAKE_MODEL_HELP, MAKE_MODEL_OPTIONS } from '../src/cli/make-model.js';
import { MODELS_HELP, MODELS_OPTIONS } from '../src/cli/models.js';
import { SERVE_HELP, SERVE_OPTIONS } from '../src/cli/serve.js';
import { USAGE_HELP, USAGE_OPTIONS } from '../src/cli/usage.js';
import { ADAPTERS_HELP, ADAPTERS_OPTIONS } from '../src/cli/adapters.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const readme = readFileSync(join(root, 'README.md'), 'utf8');

/** The README without its fenced code blocks (their brackets are code, not links). */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
}

/** Targets of inline links and images, reference definitions and <img src>, in order. */
function linkTargets(markdown: string): string[] {
  const text = prose(markdown);
  const targets: string[] = [];
  for (const m of text.matchAll(/!?\[(?:[^\][]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) targets.push(m[1]!);
  for (const m of text.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/gm)) targets.push(m[1]!);
  for (const m of text.matchAll(/<img\s[^>]*src="([^"]+)"/g)) targets.push(m[1]!);
  return targets;
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of prose(markdown).matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = m[1]!.toLowerCase().replace(/[`*_]/g, '').replace(/[^\p{L}\p{N}\s-]/gu, '').replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** `METHOD /path` with every path parameter written `{}` (fastify's `:id` and the README's `{id}` alike). */
function routeKey(method: string, path: string): string {
  return `${method} ${path.replace(/:[^/]+/g, '{}').replace(/\{[^}]*\}/g, '{}')}`;
}

/** The routes in the first column of the HTTP API section's route table. */
function readmeRoutes(markdown: string): string[] {
  const section = markdown.slice(markdown.indexOf('\n## HTTP API\n'));
  const table = section.slice(section.indexOf('\n| route |'));
  const rows = table.split('\n').slice(1).filter((line, i, all) => all.slice(0, i + 1).every((l) => l.startsWith('|')));
  return rows.slice(1).flatMap((row) => [...row.split('|')[1]!.matchAll(/`(GET|POST|PUT|PATCH|DELETE) (\/[^`\s?]*)/g)]
    .map((m) => routeKey(m[1]!, m[2]!)));
}

/**
 * The routes of fastify's printRoutes({commonPrefix: false}) tree: a line per path segment,
 * four columns of indent per level, `segment (METHOD, ...)` where a route ends. HEAD routes
 * fastify adds beside each GET are left out.
 */
function parseRouteTree(tree: string): string[] {
  const out: string[] = [];
  const stack: string[] = [];
  for (const line of tree.split('\n')) {
    const m = /^([│ ]*)[├└]── (\S+?)(?: \(([^)]*)\))?$/.exec(line.replace(/\u00a0/g, ' '));
    if (!m) continue;
    const depth = m[1]!.length / 4;
    stack.length = depth;
    const path = (stack[depth - 1] ?? '') + m[2]!;
    stack.push(path);
    for (const method of (m[3] ?? '').split(',').map((s) => s.trim()).filter((s) => s !== '' && s !== 'HEAD')) {
      out.push(routeKey(method, path));
    }
  }
  return out;
}

describe('README links', () => {
  const targets = linkTargets(readme);

  it('finds the links (the parser reads inline links, images and reference definitions)', () => {
    expect(linkTargets('a [x](docs/a.md#b) ![i](c.svg "t") [r]: e/f.md\n\n[r]: g.md\n```\n[no](h.md)\n```\n<img alt="" src="i.png">'))
      .toEqual(['docs/a.md#b', 'c.svg', 'g.md', 'i.png']);
    expect(targets.length).toBeGreaterThan(0);
  });

  it('points every relative link at a file of the repository', () => {
    const missing = targets
      .filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t) && !t.startsWith('#'))
      .map((t) => decodeURI(t.split('#')[0]!))
      .filter((path) => {
        const abs = resolve(root, path);
        return !abs.startsWith(`${root}/`) || !existsSync(abs);
      });
    expect(missing).toEqual([]);
  });

  it('points every in-page anchor at a heading', () => {
    const known = anchors(readme);
    expect(known.has('http-api')).toBe(true);
    expect(targets.filter((t) => t.startsWith('#') && !known.has(t.slice(1)))).toEqual([]);
  });

  it('keeps the copy of the API spec identical to the shared one where that is present', () => {
    const shared = resolve(root, '..', 'shared', 'spec', 'inference-api.md');
    const copy = readFileSync(join(root, 'docs', 'inference-api.md'), 'utf8');
    expect(copy).toMatch(/^# /);
    if (existsSync(shared)) expect(copy).toBe(readFileSync(shared, 'utf8'));
  });
});

describe('README route table', () => {
  let server: TestServer;
  beforeAll(async () => { server = await startTestServer(); });
  afterAll(async () => { await server?.close(); });

  it('lists exactly the routes the app registers', async () => {
    const app = server.service.app;
    const registered = parseRouteTree(app.printRoutes({ commonPrefix: false }));
    // The parse is checked against the router itself, so that a change of printRoutes' format
    // cannot make this test pass on an empty or garbled list.
    expect(registered).toContain('POST /v1/responses');
    expect(registered).toContain('GET /health');
    for (const route of registered) {
      const [method, url] = route.split(' ') as [string, string];
      expect(app.hasRoute({ method: method as 'GET', url: url.replace(/\{\}/g, ':p') }), route).toBe(true);
    }
    const documented = readmeRoutes(readme);
    expect([...new Set(registered)].sort()).toEqual([...new Set(documented)].sort());
  });
});

/**
 * The `--flags` a text names, sorted and unique. `--deadline-asap|standard|flex` (the synopsis'
 * short form) stands for --deadline-asap, --deadline-standard and --deadline-flex.
 */
function flagsOf(text: string): string[] {
  const out = new Set<string>();
  for (const m of text.matchAll(/(?<![\w-])--([a-z][a-z0-9-]*)((?:\|[a-z0-9]+)*)/g)) {
    out.add(m[1]!);
    const stem = m[1]!.slice(0, m[1]!.lastIndexOf('-') + 1);
    for (const alt of m[2]!.split('|').slice(1)) out.add(stem + alt);
  }
  return [...out].sort();
}

/** The CLI section's synopsis block: command -> its lines (a command's line and the indented ones after it). */
function synopsis(markdown: string): Map<string, string> {
  const section = markdown.slice(markdown.indexOf('\n## CLI\n'));
  const block = /```\n([\s\S]*?)\n```/.exec(section)![1]!;
  const out = new Map<string, string>();
  let current: string | undefined;
  for (const line of block.split('\n')) {
    const m = /^sluice ([a-z][a-z-]*)/.exec(line);
    if (m) current = m[1]!;
    else if (!/^\s/.test(line)) current = undefined;
    if (current !== undefined) out.set(current, `${out.get(current) ?? ''}${line}\n`);
  }
  return out;
}

describe('README CLI synopsis', () => {
  const commands: Record<string, { options: Record<string, unknown>; help: string }> = {
    serve: { options: SERVE_OPTIONS, help: SERVE_HELP },
    models: { options: MODELS_OPTIONS, help: MODELS_HELP },
    keys: { options: KEYS_OPTIONS, help: KEYS_HELP },
    usage: { options: USAGE_OPTIONS, help: USAGE_HELP },
    adapters: { options: ADAPTERS_OPTIONS, help: ADAPTERS_HELP },
    generate: { options: GENERATE_OPTIONS, help: GENERATE_HELP },
    'make-model': { options: MAKE_MODEL_OPTIONS, help: MAKE_MODEL_HELP },
  };
  const documented = synopsis(readme);

  it('reads flags as the synopsis writes them', () => {
    expect(flagsOf('[--deadline-asap|standard|flex S] [--backend cpu|cuda] --x-y N, not-a--flag'))
      .toEqual(['backend', 'deadline-asap', 'deadline-flex', 'deadline-standard', 'x-y']);
    expect([...documented.keys()].sort()).toEqual(Object.keys(commands).sort());
  });

  it.each(Object.keys(commands))('sluice %s: the synopsis and --help list every flag it parses, and no other', (command) => {
    const { options, help } = commands[command]!;
    const parsed = Object.keys(options).filter((flag) => flag !== 'help').sort();
    expect(flagsOf(documented.get(command)!), 'README synopsis').toEqual(parsed);
    expect(flagsOf(help).filter((flag) => flag !== 'help'), '--help').toEqual(parsed);
  });
});

/** The paragraph of the README that opens with the bold title `title` (up to the next blank line). */
function paragraph(markdown: string, title: string): string {
  const start = markdown.indexOf(`\n${title}`);
  if (start < 0) throw new Error(`no paragraph "${title}" in the README`);
  const end = markdown.indexOf('\n\n', start + 1);
  return markdown.slice(start + 1, end < 0 ? undefined : end);
}

/** Field names written in code spans: `name`, `name: ...`, `name=...` (the name only). */
const fieldNames = (text: string): string[] => [...text.matchAll(/`([a-z][a-z0-9_]*)(?:[ :=][^`]*)?`/g)].map((m) => m[1]!);

// The HTTP API section's Chat Completions paragraph says tools and reasoning_effort are honoured
// (not ignored, not refused); a server with a model that thinks and calls tools (tiny-qwen3)
// must honour them.
describe('README Chat Completions: tools and reasoning_effort', () => {
  const chat = paragraph(readme, '**Chat Completions.**');
  // "Honoured: ..." runs to the first sentence about what is accepted or refused.
  const honouredAt = chat.indexOf('Honoured:');
  const restAt = Math.min(...['Accepted', 'Refused'].map((w) => chat.indexOf(w, honouredAt)).filter((i) => i >= 0));
  const honoured = fieldNames(chat.slice(honouredAt, restAt));
  const rest = fieldNames(chat.slice(restAt));
  let server: TestServer;
  let root: string;

  beforeAll(async () => {
    const { mkdtempSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { makeModel } = await import('../models/make-model.js');
    root = mkdtempSync(join(tmpdir(), 'sluice-readme-'));
    await makeModel({ preset: 'tiny-qwen3', out: join(root, 'tiny-qwen3'), seed: 4 });
    server = await startTestServer({
      catalog: (tiny) => ({ models: [{ id: 'tiny', checkpoint: tiny }, { id: 'tiny-qwen3', checkpoint: join(root, 'tiny-qwen3') }] }),
    });
  }, 120_000);
  afterAll(async () => {
    await server?.close();
    if (root) (await import('node:fs')).rmSync(root, { recursive: true, force: true });
  });

  type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
  const post = async (body: Json) => {
    const res = await fetch(`${server.baseUrl}/chat/completions`, {
      method: 'POST', headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() as Json };
  };
  const ask = (extra: Json) => ({ model: 'tiny-qwen3', messages: [{ role: 'user', content: 'weather in Oslo?' }], ...extra });

  it('lists them as honoured, and nowhere as accepted and ignored or refused', () => {
    expect(honouredAt).toBeGreaterThan(0);
    expect(honoured).toContain('max_completion_tokens'); // the parse found the list
    for (const field of ['tools', 'tool_choice', 'parallel_tool_calls', 'reasoning_effort']) {
      expect(honoured, field).toContain(field);
      expect(rest, field).not.toContain(field);
    }
  });

  it('honours reasoning_effort: none thinks not at all, low thinks', { timeout: 120_000 }, async () => {
    const off = await post(ask({ reasoning_effort: 'none', max_tokens: 8 }));
    expect(off.status).toBe(200);
    expect(off.body.usage.completion_tokens_details.reasoning_tokens).toBe(0);
    expect(off.body.choices[0].message.reasoning_content).toBeUndefined();
    const low = await post(ask({ reasoning_effort: 'low', max_tokens: 8 }));
    expect(low.status).toBe(200);
    expect(low.body.usage.completion_tokens_details.reasoning_tokens).toBeGreaterThan(0);
    expect(typeof low.body.choices[0].message.reasoning_content).toBe('string');
  });

  it('honours tools, tool_choice and parallel_tool_calls; a model without tools answers 400 tools_unsupported', { timeout: 120_000 }, async () => {
    const weather = {
      type: 'function',
      function: {
        name: 'get_weather', strict: true,
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false },
      },
    };
    // A named tool_choice with parallel_tool_calls false: exactly one call of that function (random
    // weights may run past the limit: the first choice that ends counts).
    let called: Json | undefined;
    for (let seed = 1; seed <= 6 && called === undefined; seed++) {
      const r = await post(ask({
        tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false,
        reasoning_effort: 'none', max_tokens: 80, seed,
      }));
      expect(r.status).toBe(200);
      if (r.body.choices[0].finish_reason === 'tool_calls') called = r.body.choices[0];
    }
    expect(called, 'no forced call ended within the token limit').toBeDefined();
    expect(called!.message.tool_calls).toHaveLength(1);
    expect(called!.message.tool_calls[0].function.name).toBe('get_weather');
    expect(typeof JSON.parse(called!.message.tool_calls[0].function.arguments).city).toBe('string');
    expect(chat).toContain('`tools_unsupported`');
    const plain = await post({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], tools: [weather] });
    expect(plain.status).toBe(400);
    expect(plain.body.error.code).toBe('tools_unsupported');
  });
});
