// scripts/build-native.js, the package's install script, run in a scratch package whose cmake-js
// is a stand-in that records its arguments and writes the addon (or fails when told to): it
// builds when the addon is missing or an input changed, and otherwise does nothing.
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
let pkg: string;

/** cmake-js stand-in: appends its argv to calls.log; writes build/Release/sluice.node unless FAKE_CMAKE_FAIL is set. */
const FAKE_CMAKE_JS = `#!/usr/bin/env node
const fs = require('node:fs');
fs.appendFileSync('calls.log', JSON.stringify(process.argv.slice(2)) + '\\n');
if (process.env.FAKE_CMAKE_FAIL) process.exit(3);
fs.mkdirSync('build/Release', { recursive: true });
fs.writeFileSync('build/Release/sluice.node', 'addon');
`;

function run(env: Record<string, string> = {}, args: string[] = []): { status: number | null; calls: string[][]; stderr: string } {
  rmSync(join(pkg, 'calls.log'), { force: true });
  const env0 = { ...process.env };
  delete env0['SLUICE_CUDA'];
  delete env0['SLUICE_ADDON'];
  const r = spawnSync(process.execPath, [join(pkg, 'scripts', 'build-native.js'), ...args], { cwd: pkg, env: { ...env0, ...env }, encoding: 'utf8' });
  const log = join(pkg, 'calls.log');
  const calls = existsSync(log) ? readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as string[]) : [];
  return { status: r.status, calls, stderr: r.stderr };
}

beforeAll(() => {
  pkg = mkdtempSync(join(os.tmpdir(), 'sluice-build-native-'));
  mkdirSync(join(pkg, 'scripts'));
  copyFileSync(join(repo, 'scripts', 'build-native.js'), join(pkg, 'scripts', 'build-native.js'));
  writeFileSync(join(pkg, 'package.json'), JSON.stringify({ name: 'scratch', type: 'module' }));
  writeFileSync(join(pkg, 'CMakeLists.txt'), 'project(scratch)\n');
  mkdirSync(join(pkg, 'native', 'src'), { recursive: true });
  writeFileSync(join(pkg, 'native', 'src', 'a.cpp'), 'int a() { return 1; }\n');
  mkdirSync(join(pkg, 'node_modules', 'cmake-js', 'bin'), { recursive: true });
  writeFileSync(join(pkg, 'node_modules', 'cmake-js', 'package.json'), JSON.stringify({ name: 'cmake-js', version: '0.0.0' }));
  writeFileSync(join(pkg, 'node_modules', 'cmake-js', 'bin', 'cmake-js'), FAKE_CMAKE_JS);
  mkdirSync(join(pkg, 'node_modules', 'node-addon-api'), { recursive: true });
  writeFileSync(join(pkg, 'node_modules', 'node-addon-api', 'package.json'), JSON.stringify({ name: 'node-addon-api', version: '8.0.0' }));
});
afterAll(() => rmSync(pkg, { recursive: true, force: true }));

describe('scripts/build-native.js', () => {
  it('builds once, then only when an input changes or --force asks', () => {
    // No addon: a build, without the native tests and bench whose sources are absent (a packed install).
    let r = run();
    expect(r.status).toBe(0);
    expect(r.calls).toEqual([['compile', '--out', 'build', '--CDSLUICE_BUILD_TESTS=OFF', '--CDSLUICE_BUILD_BENCH=OFF']]);
    expect(JSON.parse(readFileSync(join(pkg, 'build', 'sluice-native.json'), 'utf8')).fingerprint).toMatch(/^[0-9a-f]{64}$/);

    r = run();
    expect(r.calls).toEqual([]);
    expect(r.stderr).toMatch(/up to date/);

    // New file times, same bytes (a checkout, a tarball's fixed 1985 times): nothing to build.
    utimesSync(join(pkg, 'native', 'src', 'a.cpp'), new Date(), new Date());
    utimesSync(join(pkg, 'CMakeLists.txt'), new Date(0), new Date(0));
    expect(run().calls).toEqual([]);

    writeFileSync(join(pkg, 'native', 'src', 'a.cpp'), 'int a() { return 2; }\n');
    expect(run().calls).toHaveLength(1);
    expect(run().calls).toEqual([]);

    // A new source file, or the native tests appearing (a clone), change what is built.
    mkdirSync(join(pkg, 'native', 'tests'));
    writeFileSync(join(pkg, 'native', 'tests', 'test_a.cpp'), 'int main() {}\n');
    expect(run().calls).toEqual([['compile', '--out', 'build', '--CDSLUICE_BUILD_TESTS=ON', '--CDSLUICE_BUILD_BENCH=OFF']]);

    expect(run({}, ['--force']).calls).toHaveLength(1);
  });

  it('takes SLUICE_CUDA, and keeps the last build\'s value when it is unset', () => {
    expect(run({ SLUICE_CUDA: 'OFF' }).calls[0]).toContain('--CDSLUICE_CUDA=OFF');
    expect(run().calls).toEqual([]);
    expect(run({ SLUICE_CUDA: 'OFF' }).calls).toEqual([]);
    expect(run({ SLUICE_CUDA: 'AUTO' }).calls[0]).toContain('--CDSLUICE_CUDA=AUTO');
  });

  it('leaves no fresh stamp after a failed build, so the next install builds again', () => {
    rmSync(join(pkg, 'build'), { recursive: true, force: true });
    const failed = run({ FAKE_CMAKE_FAIL: '1' });
    expect(failed.status).toBe(3);
    expect(failed.stderr).toMatch(/native build failed/);
    expect(existsSync(join(pkg, 'build', 'sluice-native.json'))).toBe(false);
    expect(run().calls).toHaveLength(1);
    // A failure after a good build does not leave the old stamp looking current either.
    writeFileSync(join(pkg, 'CMakeLists.txt'), 'project(scratch2)\n');
    expect(run({ FAKE_CMAKE_FAIL: '1' }).status).toBe(3);
    expect(run().calls).toHaveLength(1);
  });

  it('skips the build for a prebuilt addon named by SLUICE_ADDON, unless forced', () => {
    rmSync(join(pkg, 'build'), { recursive: true, force: true });
    writeFileSync(join(pkg, 'prebuilt.node'), 'addon');
    const r = run({ SLUICE_ADDON: join(pkg, 'prebuilt.node') });
    expect(r.calls).toEqual([]);
    expect(r.stderr).toMatch(/prebuilt/);
    expect(run({ SLUICE_ADDON: join(pkg, 'prebuilt.node') }, ['--force']).calls).toHaveLength(1);
  });
});
