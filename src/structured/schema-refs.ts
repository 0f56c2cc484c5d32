// The size of a schema once its `$ref`s are followed, as the grammar compiler walks it: xgrammar's
// converter recurses through every `$ref` (a chain of 200 `$defs`, each an array of the one before,
// is 10 KB of JSON and overflows its WebAssembly stack), and a `$def` used in several places is
// converted in each. The inline checks (schema-check.ts) see neither; this walk does, with each
// `$def`'s height and expanded size memoized, so a schema whose expansion is exponential is
// measured (and refused) in time linear in its text. A `$ref` back to a schema being expanded is
// recursion, which the compiler makes a rule of: it counts one.

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = { [key: string]: Json };
type Fail = (pointer: string, message: string) => never;

const isSchema = (v: Json | undefined): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const escapePointer = (key: string) => key.replace(/~/g, '~0').replace(/\//g, '~1');

/** The subschemas under a schema, with their JSON pointers. */
function children(s: Schema, pointer: string): [Json, string][] {
  const out: [Json, string][] = [];
  for (const key of ['properties'] as const) {
    const props = s[key];
    if (isSchema(props)) for (const [k, v] of Object.entries(props)) out.push([v, `${pointer}/${key}/${escapePointer(k)}`]);
  }
  for (const key of ['additionalProperties', 'items'] as const) if (isSchema(s[key])) out.push([s[key], `${pointer}/${key}`]);
  for (const key of ['anyOf', 'oneOf', 'prefixItems'] as const) {
    const list = s[key];
    if (Array.isArray(list)) list.forEach((v, i) => out.push([v, `${pointer}/${key}/${i}`]));
  }
  return out;
}

/**
 * Throws through `fail` when `root` (a checked schema: every `$ref` is '#' or names a root `$defs`
 * or `definitions` entry) nests deeper than `maxDepth` or expands to more than `maxSubschemas`.
 */
export function checkRefExpansion(root: Schema, limits: { maxDepth: number; maxSubschemas: number }, fail: Fail): void {
  const memo = new Map<string, { height: number; size: number }>();
  const expanding = new Set<string>();
  let total = 0;
  const target = (ref: string): [Json, string] | undefined => {
    if (ref === '#') return [root, ''];
    const m = /^#\/(\$defs|definitions)\/(.*)$/.exec(ref);
    if (m === null) return undefined;
    const defs = root[m[1]!];
    const name = m[2]!.replace(/~1/g, '/').replace(/~0/g, '~');
    return isSchema(defs) && defs[name] !== undefined ? [defs[name], `/${m[1]}/${m[2]}`] : undefined;
  };
  const tooDeep = (pointer: string) => fail(pointer, `the schema nests deeper than ${limits.maxDepth} levels once its '$ref's are followed`);
  const measure = (node: Json, pointer: string, level: number): { height: number; size: number } => {
    if (level > limits.maxDepth) tooDeep(pointer);
    if (++total > limits.maxSubschemas) {
      fail(pointer, `the schema expands to more than ${limits.maxSubschemas} subschemas once its '$ref's are followed`);
    }
    if (!isSchema(node)) return { height: 1, size: 1 };
    let height = 0;
    let size = 1;
    for (const [child, at] of children(node, pointer)) {
      const r = measure(child, at, level + 1);
      height = Math.max(height, r.height);
      size += r.size;
    }
    const ref = node['$ref'];
    const found = typeof ref === 'string' ? target(ref) : undefined;
    if (typeof ref === 'string' && found !== undefined && !expanding.has(ref)) {
      let r = memo.get(ref);
      if (r === undefined) {
        expanding.add(ref);
        r = measure(found[0], found[1], level + 1);
        expanding.delete(ref);
        memo.set(ref, r);
      } else {
        if (level + r.height > limits.maxDepth) tooDeep(`${pointer}/$ref`);
        total += r.size;
        if (total > limits.maxSubschemas) {
          fail(`${pointer}/$ref`, `the schema expands to more than ${limits.maxSubschemas} subschemas once its '$ref's are followed`);
        }
      }
      height = Math.max(height, r.height);
      size += r.size;
    }
    return { height: height + 1, size };
  };
  measure(root, '', 0);
}
