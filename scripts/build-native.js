#!/usr/bin/env node
// Builds the native addon (build/Release/sluice.node) with cmake-js when it is missing or its
// inputs changed since the last build, and otherwise does nothing. The package's "install" script
// runs it (so `npm ci` on a fresh clone, and an install from the registry or a tarball, build it
// once; a repeated install does not); `npm run build:native` runs it with --force.
//
// Plain JavaScript with no dependency but cmake-js: it runs before anything is compiled, and an
// installed package has no TypeScript compiler.
//
// The inputs, hashed into one fingerprint: CMakeLists.txt and every file under native/ (by
// content: npm sets every packed file's mtime to 1985 and a git checkout resets them, so times
// say nothing), the CMake options passed here (SLUICE_CUDA from the environment, else the last
// build's; the native tests and bench only where their sources are present, which a packed
// install's are not), the node-addon-api version, platform and architecture. The fingerprint of the last successful build
// is kept in build/sluice-native.json, removed before a build starts so that a failed build never
// looks current.
//
// SLUICE_ADDON naming an existing file (a prebuilt addon, which the engine then loads;
// src/native/native.ts) skips the build unless --force is given.

import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const buildDir = join(root, 'build');
const addonPath = join(buildDir, 'Release', 'sluice.node');
const stampPath = join(buildDir, 'sluice-native.json');
const force = process.argv.includes('--force');

function say(message) {
  process.stderr.write(`sluice: ${message}\n`);
}

/** Every file under dir, as paths relative to root, sorted (the hash must not depend on readdir order). */
function listFiles(dir) {
  const out = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...listFiles(path));
    else if (entry.isFile()) out.push(relative(root, path).split('\\').join('/'));
  }
  return out.sort();
}

/** The CMake definitions this build passes (name -> value). */
function cmakeDefinitions(previous) {
  const defs = {
    SLUICE_BUILD_TESTS: existsSync(join(root, 'native', 'tests')) ? 'ON' : 'OFF',
    SLUICE_BUILD_BENCH: existsSync(join(root, 'native', 'bench', 'bench_main.cpp')) ? 'ON' : 'OFF',
  };
  // Unset, SLUICE_CUDA keeps the value of the last build, as CMake's cache does (AUTO on a fresh
  // build directory): `npm rebuild` after an install with SLUICE_CUDA=OFF changes nothing.
  const cuda = process.env.SLUICE_CUDA || previous?.defs?.SLUICE_CUDA;
  if (cuda) defs.SLUICE_CUDA = cuda;
  // e.g. 90-real for an H100/H200-only build (CMake's default list covers sm_80 to sm_90 + PTX).
  const architectures = process.env.SLUICE_CUDA_ARCHITECTURES || previous?.defs?.SLUICE_CUDA_ARCHITECTURES;
  if (architectures) defs.SLUICE_CUDA_ARCHITECTURES = architectures;
  return defs;
}

function fingerprint(defs) {
  const hash = createHash('sha256');
  const require = createRequire(import.meta.url);
  const addonApiVersion = JSON.parse(readFileSync(require.resolve('node-addon-api/package.json'), 'utf8')).version;
  hash.update(JSON.stringify({ defs, addonApiVersion, platform: process.platform, arch: process.arch }));
  for (const file of ['CMakeLists.txt', ...listFiles(join(root, 'native'))]) {
    hash.update(`\0${file}\0`);
    hash.update(readFileSync(join(root, file)));
  }
  return hash.digest('hex');
}

function readStamp() {
  try {
    return JSON.parse(readFileSync(stampPath, 'utf8'));
  } catch {
    return undefined;
  }
}

const prebuilt = process.env.SLUICE_ADDON;
if (!force && prebuilt && existsSync(prebuilt)) {
  say(`SLUICE_ADDON names a prebuilt addon (${prebuilt}); not building the native addon`);
  process.exit(0);
}

const previous = readStamp();
const defs = cmakeDefinitions(previous);
const current = fingerprint(defs);
if (!force && existsSync(addonPath) && previous?.fingerprint === current) {
  say('native addon up to date (build/Release/sluice.node); not rebuilding');
  process.exit(0);
}

say(existsSync(addonPath) ? 'native sources or options changed; building the native addon' : 'building the native addon (CMake, a C++17 compiler)');
rmSync(stampPath, { force: true });
const cmakeJs = createRequire(import.meta.url).resolve('cmake-js/bin/cmake-js');
const args = [cmakeJs, 'compile', '--out', 'build', ...Object.entries(defs).map(([name, value]) => `--CD${name}=${value}`)];
const run = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
if (run.status !== 0 || !existsSync(addonPath)) {
  say(`the native build failed (cmake-js exited ${run.status ?? run.signal}); see the output above`);
  process.exit(run.status || 1);
}
mkdirSync(buildDir, { recursive: true });
writeFileSync(stampPath, `${JSON.stringify({ fingerprint: current, defs, builtAt: new Date().toISOString() }, null, 2)}\n`);
say('native addon built (build/Release/sluice.node)');
