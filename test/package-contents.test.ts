// What `npm pack` puts in the package (package.json "files"), read from npm itself: the compiled
// code with its type declarations, what the native build needs, and nothing else; every module
// the packed code imports is packed too or is a dependency (a devDependency is not installed with
// the package), and fastify is a peer dependency the host app provides.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, posix, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>; devDependencies: Record<string, string>; peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>; optionalDependencies?: Record<string, string>;
  allowScripts?: Record<string, boolean>;
  scripts: Record<string, string>; main: string; types: string; bin: Record<string, string>; exports: Record<string, string>;
};
let files: Set<string>;

beforeAll(() => {
  // --ignore-scripts: no prepare (tsc); the tests run against the dist/ already built.
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8' });
  files = new Set((JSON.parse(out) as [{ files: { path: string }[] }])[0].files.map((f) => f.path));
});

function filesUnder(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile())
    .map((e) => relative(root, join(e.parentPath, e.name)).split('\\').join('/'));
}

/** Module specifiers of a compiled ES module: static imports and re-exports, dynamic imports, require(). */
function specifiers(source: string): string[] {
  // Comment lines name modules in prose (`import { Engine } from 'sluice'`).
  const code = source.split('\n').filter((line) => !/^\s*(\/\/|\/\*|\*)/.test(line)).join('\n');
  const out: string[] = [];
  for (const re of [/\b(?:import|export)\s[^'";]*?\bfrom\s*['"]([^'"]+)['"]/g, /\bimport\s*['"]([^'"]+)['"]/g,
    /\bimport\(\s*['"]([^'"]+)['"]\s*\)/g, /\brequire(?:\.resolve)?\(\s*['"]([^'"]+)['"]\s*\)/g]) {
    for (const m of code.matchAll(re)) out.push(m[1]!);
  }
  return out;
}

describe('the packed package', () => {
  it('holds the entry points, their type declarations and what the native build needs', () => {
    for (const path of [
      'package.json', 'README.md', pkg.main, pkg.types, pkg.exports['.']!, pkg.bin['sluice']!,
      'dist/src/text/prompt-worker.js', 'dist/src/structured/grammar-worker.js', 'dist/models/make-model.js',
      'models/catalog.example.json', 'scripts/build-native.js', 'CMakeLists.txt', 'native/include/sluice/engine.h',
    ]) {
      expect(files, path).toContain(path.replace(/^\.\//, ''));
    }
    // Every source the CMake build globs (native/src, native/addon, native/include).
    for (const path of [...filesUnder('native/src'), ...filesUnder('native/addon'), ...filesUnder('native/include')]) {
      expect(files, path).toContain(path);
    }
  });

  it('leaves out tests, benchmarks, their results, sources and source maps', () => {
    const allowed = /^(package\.json|README\.md|CMakeLists\.txt|scripts\/build-native\.js|models\/catalog\.example\.json|dist\/(src|models)\/.+\.(js|d\.ts)|native\/(src|addon|include)\/.+)$/;
    expect([...files].filter((f) => !allowed.test(f))).toEqual([]);
    expect([...files].filter((f) => /^(test|bench|src|scripts\/chaos|native\/tests|native\/bench|dist\/(bench|scripts))\//.test(f))).toEqual([]);
  });

  it('imports only packed files, dependencies, the peers (fastify, onnxruntime-node) and Node built-ins at run time', () => {
    const runtime = new Set([...Object.keys(pkg.dependencies), ...Object.keys(pkg.peerDependencies ?? {})]);
    const builtins = new Set(builtinModules);
    const problems: string[] = [];
    const modules = [...files].filter((f) => f.endsWith('.js') && f.startsWith('dist/'));
    expect(modules.length).toBeGreaterThan(50);
    for (const file of modules) {
      for (const spec of specifiers(readFileSync(join(root, file), 'utf8'))) {
        if (spec.startsWith('.')) {
          const target = posix.join(posix.dirname(file), spec);
          if (!files.has(target)) problems.push(`${file} imports ${spec} (${target} is not packed)`);
        } else if (!spec.startsWith('node:') && !builtins.has(spec)) {
          const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
          if (!runtime.has(name)) problems.push(`${file} imports ${spec} (not a dependency)`);
        }
      }
    }
    expect(problems).toEqual([]);
  });

  it('takes onnxruntime-node as an optional peer, imported dynamically by one module only', () => {
    // Not a dependency, not an optional dependency: npm installs either with the package and runs its
    // install script, which downloads CUDA providers from NuGet (an offline install then fails).
    expect(pkg.dependencies['onnxruntime-node']).toBeUndefined();
    expect(pkg.optionalDependencies?.['onnxruntime-node']).toBeUndefined();
    expect(pkg.peerDependencies?.['onnxruntime-node']).toBeDefined();
    expect(pkg.peerDependenciesMeta?.['onnxruntime-node']?.optional).toBe(true);
    // This repository's tests use it (npm ci installs devDependencies) with its install script denied.
    expect(pkg.devDependencies['onnxruntime-node']).toBe(pkg.peerDependencies!['onnxruntime-node']);
    expect(pkg.allowScripts?.['onnxruntime-node']).toBe(false);
    const importers = [...files].filter((f) => f.endsWith('.js') && f.startsWith('dist/'))
      .filter((f) => specifiers(readFileSync(join(root, f), 'utf8')).includes('onnxruntime-node'));
    expect(importers).toEqual(['dist/src/native/onnx/onnx-runtime.js']);
    const code = readFileSync(join(root, importers[0]!), 'utf8');
    expect(code).toMatch(/\bimport\(\s*['"]onnxruntime-node['"]\s*\)/);
    expect(code).not.toMatch(/\bfrom\s*['"]onnxruntime-node['"]/);
  });

  it('takes fastify as a peer, installs without tsc and builds the addon with its own script', () => {
    expect(pkg.dependencies['fastify']).toBeUndefined();
    expect(pkg.peerDependencies?.['fastify']).toMatch(/^\^5\.\d+\.\d+$/);
    // The repository's own tests and CLI run against a fastify inside the peer range.
    const [, peerMinor] = /^\^5\.(\d+)/.exec(pkg.peerDependencies!['fastify']!)!;
    const [, devMajor, devMinor] = /^\^?(\d+)\.(\d+)/.exec(pkg.devDependencies['fastify']!)!;
    expect(Number(devMajor)).toBe(5);
    expect(Number(devMinor)).toBeGreaterThanOrEqual(Number(peerMinor));
    expect(pkg.scripts['install']).toBe('node scripts/build-native.js');
    expect(pkg.scripts['prepare']).toBe('npm run build:ts');
    expect(`${pkg.scripts['install']} ${pkg.scripts['postinstall'] ?? ''} ${pkg.scripts['preinstall'] ?? ''}`).not.toMatch(/tsc|build:ts/);
  });
});
