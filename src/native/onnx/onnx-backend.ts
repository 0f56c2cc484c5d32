// How the facade picks and loads the ONNX Runtime backend (onnx-handle.ts). onnxruntime-node, an
// optional peer dependency, is imported only when this backend loads (onnx-runtime.ts), so
// native-only deployments neither install nor pay for it.

import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { SluiceError } from '../../errors.js';
import type { NativeEngineHandle } from '../native-types.js';
import { OnnxEngineHandle } from './onnx-handle.js';

/** Where an export's graph may live in a model directory: optimum's onnx/model.onnx, or model.onnx. */
export function onnxModelPathIn(dir: string): string | undefined {
  for (const p of [join('onnx', 'model.onnx'), 'model.onnx']) if (existsSync(join(dir, p))) return join(dir, p);
  return undefined;
}

/** backend 'auto' serves ONNX when the directory holds an export and no safetensors weights. */
export function servesOnnxByDefault(dir: string): boolean {
  return onnxModelPathIn(dir) !== undefined && !readdirSync(dir).some((f) => f.endsWith('.safetensors'));
}

export interface OnnxBackendOptions {
  modelDir: string;
  kvCacheBytes: number;
  blockSize: number;
  numThreads: number;
  /** Decode rows per session run: the scheduler's maxNumSeqs. */
  maxNumSeqs: number;
}

export async function loadOnnxHandle(opts: OnnxBackendOptions): Promise<NativeEngineHandle> {
  const modelPath = onnxModelPathIn(opts.modelDir);
  if (modelPath === undefined) {
    throw new SluiceError('model_file_missing',
      `${opts.modelDir} holds no ONNX export (onnx/model.onnx or model.onnx); write one with sluice make-model --onnx fp32`, { param: 'model' });
  }
  try {
    return await OnnxEngineHandle.load({
      modelDir: opts.modelDir, modelPath, kvCacheBytes: opts.kvCacheBytes, blockSize: opts.blockSize,
      numThreads: opts.numThreads, maxDecodeBatch: opts.maxNumSeqs,
    });
  } catch (err) {
    // A missing onnxruntime-node arrives as a SluiceError naming the command that adds it.
    if (err instanceof SluiceError) throw err;
    throw new SluiceError('engine_error', `cannot load ${modelPath} with onnxruntime: ${(err as Error).message}`, { cause: err });
  }
}
