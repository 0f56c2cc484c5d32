// The one place that imports onnxruntime-node. It is an optional peer dependency of sluice (package.json
// peerDependenciesMeta), not a dependency: npm does not install it with the package, so an install
// runs none of its install scripts (on linux/x64 its postinstall downloads CUDA provider binaries
// from NuGet, which the CPU-only backend here never uses, and which fails offline). The import is
// dynamic and happens only when an ONNX backend loads; where the package is missing, loading says
// how to add it instead of failing at startup for everyone.

import type * as Ort from 'onnxruntime-node';
import { SluiceError } from '../../errors.js';

export const ONNX_RUNTIME_PACKAGE = 'onnxruntime-node';

/** The range sluice is tested with (package.json peerDependencies; test/onnx-runtime.test.ts keeps them equal). */
export const ONNX_RUNTIME_RANGE = '^1.30.0';

/**
 * What a host runs to add the runtime. Its install script is denied first (npm 11's allowScripts,
 * which `npm deny-scripts` cannot write before the package is installed): the CPU provider ships in
 * the package, and the script would only download CUDA providers (and fail offline).
 */
export const ONNX_RUNTIME_INSTALL_COMMAND =
  `npm pkg set allowScripts.${ONNX_RUNTIME_PACKAGE}=false --json && npm install ${ONNX_RUNTIME_PACKAGE}@${ONNX_RUNTIME_RANGE}`;

export function onnxRuntimeMissingMessage(): string {
  return `the onnx backend needs the ${ONNX_RUNTIME_PACKAGE} package, an optional peer dependency of sluice ` +
    `that is not installed: add it to your app with \`${ONNX_RUNTIME_INSTALL_COMMAND}\` ` +
    '(or serve safetensors weights with backend cpu or cuda, which need no extra package)';
}

/** True when `err` is the ES module loader's "cannot find package <name>" (not a failure inside the package). */
export function isPackageMissing(err: unknown, name: string): boolean {
  const e = err as { code?: unknown; message?: unknown } | null;
  return e?.code === 'ERR_MODULE_NOT_FOUND' && typeof e.message === 'string' && e.message.includes(`'${name}'`);
}

let runtime: Promise<typeof Ort> | undefined;

/** onnxruntime-node, imported on first use; a SluiceError backend_unavailable naming the install command when it is missing. */
export function importOnnxRuntime(): Promise<typeof Ort> {
  runtime ??= import('onnxruntime-node').catch((err: unknown) => {
    runtime = undefined; // installed later (npm install while the process runs): the next load retries
    if (isPackageMissing(err, ONNX_RUNTIME_PACKAGE)) {
      throw new SluiceError('backend_unavailable', onnxRuntimeMissingMessage(), { param: 'backend', cause: err });
    }
    throw err;
  });
  return runtime;
}
