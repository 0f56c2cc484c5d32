// The import graph of a source tree, read from the TypeScript sources without a compiler: a small
// tokenizer (so that strings, comments, template literals and regular expressions never pass for
// imports) and a parser of the statements that import: `import ... from`, `export ... from`,
// side-effect `import '...'` and `import('...')`, each marked type-only or not.

import { readdirSync, readFileSync } from 'node:fs';
import { join, posix, relative, sep } from 'node:path';

export interface ImportSite {
  specifier: string;
  /** Erased when compiled: `import type`, `export type`, every name `type`, `typeof import()`. */
  typeOnly: boolean;
}

/** One file importing another, paths relative to the tree's root ('/'-separated). */
export interface ImportEdge {
  from: string;
  to: string;
  /** Every import of `to` in `from` is type-only. */
  typeOnly: boolean;
}

export interface ImportGraph {
  files: string[];
  edges: ImportEdge[];
  /** Relative specifiers naming no file of the tree (`file: specifier`). */
  unresolved: string[];
}

interface Token {
  kind: 'name' | 'string' | 'punct' | 'other';
  text: string;
}

// After these a '/' starts a regular expression; after any other name it divides.
const BEFORE_EXPRESSION = new Set([
  'return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete', 'void', 'throw', 'case', 'do', 'else', 'yield', 'await',
]);

/** The index just past the string literal opening at `start` (a quote). */
function skipQuoted(src: string, start: number): number {
  const quote = src[start];
  for (let i = start + 1; i < src.length; i++) {
    const ch = src[i];
    if (ch === '\\') i++;
    else if (ch === quote) return i + 1;
    else if (ch === '\n') return i;  // unterminated: not a string after all
  }
  return src.length;
}

/** The index just past the template literal opening at `start`, substitutions included. */
function skipTemplate(src: string, start: number): number {
  for (let i = start + 1; i < src.length; i++) {
    const ch = src[i];
    if (ch === '\\') i++;
    else if (ch === '`') return i + 1;
    else if (ch === '$' && src[i + 1] === '{') i = skipSubstitution(src, i + 2) - 1;
  }
  return src.length;
}

/** The index just past the `}` closing a template substitution whose code starts at `start`. */
function skipSubstitution(src: string, start: number): number {
  let depth = 0;
  for (let i = start; i < src.length; i++) {
    const ch = src[i];
    if (ch === '"' || ch === "'") i = skipQuoted(src, i) - 1;
    else if (ch === '`') i = skipTemplate(src, i) - 1;
    else if (ch === '{') depth++;
    else if (ch === '}' && depth-- === 0) return i + 1;
  }
  return src.length;
}

/** The index just past the regular expression literal opening at `start`, flags included. */
function skipRegex(src: string, start: number): number {
  let inClass = false;
  for (let i = start + 1; i < src.length; i++) {
    const ch = src[i];
    if (ch === '\\') i++;
    else if (ch === '\n') return i;
    else if (inClass) inClass = ch !== ']';
    else if (ch === '[') inClass = true;
    else if (ch === '/') {
      i++;
      while (i < src.length && /[a-z]/.test(src[i]!)) i++;
      return i;
    }
  }
  return src.length;
}

const NAME = /[A-Za-z_$\u0080-\uffff][\w$\u0080-\uffff]*/y;
const NUMBER = /\d[\w.]*/y;

function tokenize(src: string): Token[] {
  const tokens: Token[] = [];
  const regexMayStart = (): boolean => {
    const last = tokens[tokens.length - 1];
    if (last === undefined) return true;
    if (last.kind === 'name') return BEFORE_EXPRESSION.has(last.text);
    if (last.kind === 'punct') return !')]}'.includes(last.text);
    return false;
  };
  let i = 0;
  while (i < src.length) {
    const ch = src[i]!;
    if (/\s/.test(ch)) {
      i++;
    } else if (ch === '/' && src[i + 1] === '/') {
      const end = src.indexOf('\n', i);
      i = end < 0 ? src.length : end;
    } else if (ch === '/' && src[i + 1] === '*') {
      const end = src.indexOf('*/', i + 2);
      i = end < 0 ? src.length : end + 2;
    } else if (ch === '"' || ch === "'") {
      const end = skipQuoted(src, i);
      tokens.push({ kind: 'string', text: src.slice(i + 1, end - 1) });
      i = end;
    } else if (ch === '`') {
      i = skipTemplate(src, i);
      tokens.push({ kind: 'other', text: '`' });
    } else if (ch === '/' && regexMayStart()) {
      i = skipRegex(src, i);
      tokens.push({ kind: 'other', text: '/' });
    } else {
      NAME.lastIndex = i;
      NUMBER.lastIndex = i;
      const name = NAME.exec(src);
      const number = name ? null : NUMBER.exec(src);
      if (name) tokens.push({ kind: 'name', text: name[0] });
      else if (number) tokens.push({ kind: 'other', text: number[0] });
      else tokens.push({ kind: 'punct', text: ch });
      i += name?.[0].length ?? number?.[0].length ?? 1;
    }
  }
  return tokens;
}

/** A named-imports clause `{ ... }` whose every name is marked `type` (`{ type A, type B as C }`). */
function everyNameIsType(clause: Token[]): boolean {
  if (clause[0]?.text !== '{' || clause[clause.length - 1]?.text !== '}') return false;
  const names: Token[][] = [[]];
  for (const t of clause.slice(1, -1)) {
    if (t.text === ',') names.push([]);
    else names[names.length - 1]!.push(t);
  }
  const given = names.filter((n) => n.length > 0);
  // `type as x` imports a value named type.
  return given.length > 0 && given.every((n) => n[0]!.text === 'type' && n.length >= 2 && !(n.length === 3 && n[1]!.text === 'as'));
}

/** The imports of one module's source, in order. */
export function importSites(source: string): ImportSite[] {
  const t = tokenize(source);
  const sites: ImportSite[] = [];
  const punct = (k: number, text: string) => t[k]?.kind === 'punct' && t[k]!.text === text;
  const name = (k: number, text?: string) => t[k]?.kind === 'name' && (text === undefined || t[k]!.text === text);
  for (let k = 0; k < t.length; k++) {
    const keyword = t[k]!.text;
    if (!name(k) || (keyword !== 'import' && keyword !== 'export') || punct(k - 1, '.')) continue;
    if (keyword === 'import' && punct(k + 1, '(')) {
      if (t[k + 2]?.kind === 'string' && punct(k + 3, ')')) sites.push({ specifier: t[k + 2]!.text, typeOnly: name(k - 1, 'typeof') });
      continue;
    }
    if (keyword === 'import' && t[k + 1]?.kind === 'string') {
      sites.push({ specifier: t[k + 1]!.text, typeOnly: false });
      continue;
    }
    // The clause: `type`?, then names, braces, commas, `*` and `as` up to `from '<specifier>'`.
    // Anything else (export const, export { a } without from, import.meta) is no import.
    let j = k + 1;
    const typeOnly = name(j, 'type') && !punct(j + 1, ',') && !name(j + 1, 'from');
    if (typeOnly) j++;
    if (keyword === 'export' ? !(punct(j, '{') || punct(j, '*')) : !(name(j) || punct(j, '{') || punct(j, '*'))) continue;
    const start = j;
    while (j < t.length && !(name(j, 'from') && t[j + 1]?.kind === 'string')) {
      const tok = t[j]!;
      const inClause = tok.kind === 'name' ? tok.text !== 'import' && tok.text !== 'export'
        : tok.kind === 'punct' && ['{', '}', ',', '*'].includes(tok.text);
      if (!inClause) break;
      j++;
    }
    if (!name(j, 'from') || t[j + 1]?.kind !== 'string') continue;
    sites.push({ specifier: t[j + 1]!.text, typeOnly: typeOnly || everyNameIsType(t.slice(start, j)) });
    k = j + 1;
  }
  return sites;
}

function sourceFiles(root: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(root, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.ts') || entry.name.endsWith('.d.ts')) continue;
    out.push(relative(root, join(entry.parentPath, entry.name)).split(sep).join('/'));
  }
  return out.sort();
}

/** Every relative import between the .ts files under `root` (imports leaving the tree are left out). */
export function importGraph(root: string): ImportGraph {
  const files = sourceFiles(root);
  const known = new Set(files);
  const byPair = new Map<string, ImportEdge>();
  const unresolved: string[] = [];
  for (const from of files) {
    for (const site of importSites(readFileSync(join(root, from), 'utf8'))) {
      if (!site.specifier.startsWith('./') && !site.specifier.startsWith('../')) continue;
      // NodeNext: a .ts module is imported by its compiled .js name.
      const to = posix.normalize(posix.join(posix.dirname(from), site.specifier)).replace(/\.js$/, '.ts');
      if (to.startsWith('../')) continue;
      if (!known.has(to)) {
        unresolved.push(`${from}: ${site.specifier}`);
        continue;
      }
      const key = `${from}\0${to}`;
      const edge = byPair.get(key);
      if (edge) edge.typeOnly &&= site.typeOnly;
      else byPair.set(key, { from, to, typeOnly: site.typeOnly });
    }
  }
  return { files, edges: [...byPair.values()], unresolved };
}

/** The strongly connected components of more than one node (Tarjan's algorithm). */
export function cycles(nodes: Iterable<string>, next: (node: string) => Iterable<string>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of next(v)) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) found.push(component.sort());
    }
  };
  for (const v of nodes) if (!index.has(v)) visit(v);
  return found;
}
