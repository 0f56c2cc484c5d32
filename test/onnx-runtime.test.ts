// What an app without the optional pieces is told: onnxruntime-node (an optional peer dependency)
// missing, and the native addon not built, each with the command that fixes it. The whole path, in an
// app where onnxruntime-node is really absent, runs in scripts/ci-pack-install.sh.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { addonMissingMessage } from '../src/native/native.js';
import {
  importOnnxRuntime, isPackageMissing, ONNX_RUNTIME_INSTALL_COMMAND, ONNX_RUNTIME_PACKAGE, ONNX_RUNTIME_RANGE,
  onnxRuntimeMissingMessage,
} from '../src/native/onnx/onnx-runtime.js';

const pkg = JSON.parse(readFileSync(join(import.meta.dirname, '..', 'package.json'), 'utf8')) as {
  peerDependencies: Record<string, string>;
};

async function importError(specifier: string): Promise<unknown> {
  try {
    await import(specifier);
  } catch (err) {
    return err;
  }
  throw new Error(`${specifier} imported`);
}

describe('onnxruntime-node, an optional peer dependency', () => {
  it('is asked for in the range package.json declares', () => {
    expect(pkg.peerDependencies[ONNX_RUNTIME_PACKAGE]).toBe(ONNX_RUNTIME_RANGE);
  });

  it('tells a missing package from a failure inside one', async () => {
    const missing = await importError('sluice-test-no-such-package');
    expect(isPackageMissing(missing, 'sluice-test-no-such-package')).toBe(true);
    expect(isPackageMissing(missing, ONNX_RUNTIME_PACKAGE)).toBe(false);
    // A dependency missing inside an installed onnxruntime-node fails in its CommonJS require.
    expect(isPackageMissing(Object.assign(new Error("Cannot find module 'onnxruntime-common'"), { code: 'MODULE_NOT_FOUND' }),
      ONNX_RUNTIME_PACKAGE)).toBe(false);
    expect(isPackageMissing(undefined, ONNX_RUNTIME_PACKAGE)).toBe(false);
  });

  it('names the package and the command that adds it with its download script denied', () => {
    const message = onnxRuntimeMissingMessage();
    expect(message).toContain(ONNX_RUNTIME_PACKAGE);
    expect(message).toContain(ONNX_RUNTIME_INSTALL_COMMAND);
    expect(ONNX_RUNTIME_INSTALL_COMMAND).toBe(
      `npm pkg set allowScripts.onnxruntime-node=false --json && npm install onnxruntime-node@${ONNX_RUNTIME_RANGE}`);
  });

  it('loads where it is installed (this repository: a devDependency)', async () => {
    const ort = await importOnnxRuntime();
    expect(typeof ort.InferenceSession.create).toBe('function');
    expect(await importOnnxRuntime()).toBe(ort);
  });
});

describe('a missing native addon', () => {
  const candidates = ['/x/build/Release/sluice.node', '/x/build/Debug/sluice.node'];

  it('tells an app that installed the package to rebuild it with npm', () => {
    const message = addonMissingMessage('/srv/app/node_modules/sluice', candidates);
    expect(message).toContain('npm rebuild sluice');
    expect(message).not.toContain('build:native');
    expect(message).toContain(candidates[0]);
  });

  it('tells a checkout to run its build script', () => {
    expect(addonMissingMessage('/home/dev/sluice', candidates)).toContain('npm run build:native');
  });
});
