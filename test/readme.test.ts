// The README as a reader of a clone meets it: every relative link and image points at a file of
// the repository, every in-page anchor at a heading, and the HTTP API's route table lists exactly
// the routes the app registers (read from the app, so that a route added or removed anywhere
// fails here until the table says so).
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/api-server.js';

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
