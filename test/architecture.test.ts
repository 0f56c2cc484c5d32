// The layout of src/ (DESIGN.md's Layout) checked on the imports themselves: folders depend on
// each other one way only, no module reaches itself back through others, the service layers never
// reach HTTP (api/), and text/ and native/ stay below the engine and everything over it. Type-only
// imports count: a cycle of types still ties two folders together. A file at src/'s root
// (errors.ts, runtime.ts, ...) is a node of its own.

import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { cycles, importGraph, importSites, type ImportEdge } from './helpers/import-graph.js';

const SRC = join(dirname(fileURLToPath(import.meta.url)), '..', 'src');
const graph = importGraph(SRC);

const folderOf = (file: string): string => file.split('/')[0]!;
const show = (e: ImportEdge): string => `${e.from} -> ${e.to}${e.typeOnly ? ' (type)' : ''}`;

const importsOf = new Map<string, ImportEdge[]>();
for (const e of graph.edges) importsOf.set(e.from, [...(importsOf.get(e.from) ?? []), e]);

/**
 * How files under `from` come to import files under `to`: every direct import, or else the
 * shortest chain through other files.
 */
function dependencies(from: string, to: string): string[] {
  const direct = graph.edges.filter((e) => folderOf(e.from) === from && folderOf(e.to) === to).map(show);
  if (direct.length > 0) return direct;
  const via = new Map<string, ImportEdge | undefined>(graph.files.filter((f) => folderOf(f) === from).map((f) => [f, undefined]));
  const queue = [...via.keys()];
  for (let i = 0; i < queue.length; i++) {
    for (const e of importsOf.get(queue[i]!) ?? []) {
      if (via.has(e.to)) continue;
      via.set(e.to, e);
      if (folderOf(e.to) === to) {
        const chain: ImportEdge[] = [];
        for (let step: ImportEdge | undefined = e; step; step = via.get(step.from)) chain.unshift(step);
        return [`through ${chain.map(show).join(', ')}`];
      }
      queue.push(e.to);
    }
  }
  return [];
}

function forbidden(from: readonly string[], to: readonly string[]): string[] {
  return from.flatMap((a) => to.flatMap((b) => dependencies(a, b).map((how) => `${a}/ reaches ${b}/: ${how}`)));
}

describe('the import parser', () => {
  it('finds every form of import, marks the type-only ones, and ignores comments, strings and regular expressions', () => {
    const source = [
      "import { a } from './a.js';",
      "import type { B } from './b.js';",
      "import { type C, type D as E } from './c.js';",
      "import F, { type G } from './f.js';",
      "import { type as T } from './t.js';",
      "import * as H from './h.js';",
      "import './side-effect.js';",
      "export { I } from './i.js';",
      "export type { J } from './j.js';",
      "export * from './k.js';",
      "export * as L from './l.js';",
      "import {\n  m,\n  n,\n} from './m.js';",
      "type P = typeof import('./p.js');",
      "const q = await import('./q.js');",
      "// import { x } from './line-comment.js';",
      "/* export * from './block-comment.js'; */",
      "const s = \"import { y } from './string.js'\";",
      "const t = `export * from './template.js' ${'`'}`;",
      "const r = /import x from '.\\/regex.js'/;",
      "export const u = 1 / 2; export { u as v }; export type W = typeof u;",
      "const w = import.meta.url;",
    ].join('\n');
    expect(importSites(source)).toEqual([
      { specifier: './a.js', typeOnly: false },
      { specifier: './b.js', typeOnly: true },
      { specifier: './c.js', typeOnly: true },
      { specifier: './f.js', typeOnly: false },
      { specifier: './t.js', typeOnly: false },
      { specifier: './h.js', typeOnly: false },
      { specifier: './side-effect.js', typeOnly: false },
      { specifier: './i.js', typeOnly: false },
      { specifier: './j.js', typeOnly: true },
      { specifier: './k.js', typeOnly: false },
      { specifier: './l.js', typeOnly: false },
      { specifier: './m.js', typeOnly: false },
      { specifier: './p.js', typeOnly: true },
      { specifier: './q.js', typeOnly: false },
    ]);
  });

  it('reads all of src/: every relative import names a file of it', () => {
    expect(graph.unresolved).toEqual([]);
    expect(graph.files.length).toBeGreaterThan(100);
    expect(graph.edges.length).toBeGreaterThan(300);
    expect(graph.edges).toContainEqual({ from: 'engine/engine.ts', to: 'text/tokenizer.ts', typeOnly: false });
  });
});

describe('src/ layout', () => {
  it('has no two folders importing each other, directly or around a longer cycle', () => {
    const across = graph.edges.filter((e) => folderOf(e.from) !== folderOf(e.to));
    const next = new Map<string, Set<string>>();
    for (const e of across) next.set(folderOf(e.from), (next.get(folderOf(e.from)) ?? new Set()).add(folderOf(e.to)));
    // One line per folder pair of a cycle, so the import that goes the wrong way stands out.
    const tied = cycles(new Set(graph.files.map(folderOf)), (f) => next.get(f) ?? []).flatMap((component) => {
      const pairs = new Map<string, ImportEdge[]>();
      for (const e of across) {
        if (!component.includes(folderOf(e.from)) || !component.includes(folderOf(e.to))) continue;
        const pair = `${folderOf(e.from)} -> ${folderOf(e.to)}`;
        pairs.set(pair, [...(pairs.get(pair) ?? []), e]);
      }
      return [...pairs].map(([pair, edges]) => `cycle of ${component.join(', ')}: ${pair} by ${edges.slice(0, 3).map(show).join(', ')}`
        + (edges.length > 3 ? ` and ${edges.length - 3} more` : ''));
    });
    expect(tied).toEqual([]);
  });

  it('has no file importing itself back', () => {
    const selfImports = graph.edges.filter((e) => e.from === e.to).map((e) => `self import: ${show(e)}`);
    const tied = cycles(graph.files, (f) => (importsOf.get(f) ?? []).map((e) => e.to)).flatMap((component) =>
      graph.edges.filter((e) => component.includes(e.from) && component.includes(e.to))
        .map((e) => `cycle of ${component.join(', ')}: ${show(e)}`));
    expect([...selfImports, ...tied]).toEqual([]);
  });

  it('keeps HTTP in api/: batches/, jobs/, serving/ and surfaces/ never reach it', () => {
    expect(forbidden(['batches', 'jobs', 'serving', 'surfaces'], ['api'])).toEqual([]);
  });

  it('keeps text/ and native/ below the engine: they never reach engine/, serving/, surfaces/ or api/', () => {
    expect(forbidden(['text', 'native'], ['engine', 'serving', 'surfaces', 'api'])).toEqual([]);
  });
});
