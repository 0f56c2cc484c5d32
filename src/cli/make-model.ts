// `sluice make-model`: write a model directory with random weights in a preset's shape.

import { readdirSync, statSync } from 'node:fs';
import { SluiceError } from '../errors.js';
import { FP8_LAYOUTS, makeModel, PRESETS, weightBytes } from '../../models/make-model.js';
import type { Dtype, Fp8Layout } from '../../models/make-model.js';
import { exportOnnx, ONNX_QUANTIZATIONS, type OnnxQuantization } from '../../models/onnx-export.js';
import { formatBytes, stderrProgress } from '../progress.js';
import { choiceFlag, commandFlags, intFlag, requiredFlag } from './args.js';

export const MAKE_MODEL_HELP = `usage: sluice make-model --preset NAME --out DIR [--dtype f32|f16|bf16] [--seed N] [--quantize fp8-block|fp8-compressed-tensors|fp8-modelopt]
                          [--onnx fp32|int4] [--force]

Writes a Hugging Face model directory (config, tokenizer, chat template, safetensors) with
deterministic random weights in the shape of a preset.

  --preset NAME   one of: ${Object.keys(PRESETS).join(', ')}
  --out DIR       output directory (created if missing)
  --dtype D       weight dtype (default: the preset's)
  --seed N        weight seed, 0..2^32-1 (default 0)
  --quantize L    write an FP8 checkpoint as published (linear projections F8_E4M3 with scales,
                  other tensors in --dtype): fp8-block (Qwen3/DeepSeek FP8, 128x128 blocks),
                  fp8-compressed-tensors (llm-compressor FP8_DYNAMIC), fp8-modelopt (NVIDIA ModelOpt)
  --onnx Q        also write an ONNX export of the same weights (onnx/model.onnx with past/present
                  KV tensors, as optimum lays it out): fp32, or int4 (MatMulNBits, 32 per scale)
  --force         write into --out even when it is not empty (its model files are replaced)
`;

/** The flags make-model accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const MAKE_MODEL_OPTIONS = {
  preset: { type: 'string' },
  out: { type: 'string' },
  dtype: { type: 'string' },
  seed: { type: 'string' },
  quantize: { type: 'string' },
  onnx: { type: 'string' },
  force: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runMakeModel(args: string[]): Promise<void> {
  const values = commandFlags(args, MAKE_MODEL_OPTIONS, 'make-model', MAKE_MODEL_HELP);
  if (values === undefined) return;
  const preset = requiredFlag(values.preset, 'preset', 'make-model');
  if (!Object.hasOwn(PRESETS, preset)) {
    throw new SluiceError('invalid_argument',
      `--preset must be one of ${Object.keys(PRESETS).join(', ')}, got "${preset}"`, { param: 'preset' });
  }
  const out = requiredFlag(values.out, 'out', 'make-model');
  const dtype = choiceFlag<Dtype>(values.dtype, 'dtype', ['f32', 'f16', 'bf16']);
  const seed = intFlag(values.seed, 'seed', 0, 2 ** 32 - 1);
  const quantize = choiceFlag<Fp8Layout>(values.quantize, 'quantize', FP8_LAYOUTS);
  const onnx = choiceFlag<OnnxQuantization>(values.onnx, 'onnx', ONNX_QUANTIZATIONS);
  if (quantize !== undefined && onnx !== undefined) {
    throw new SluiceError('invalid_argument', '--onnx exports bf16/f32 checkpoints; it cannot be combined with --quantize', { param: 'onnx' });
  }
  checkOut(out, values.force === true);

  const totalBytes = weightBytes(preset, dtype);
  process.stderr.write(`making ${preset} (${formatBytes(totalBytes)} of weights) in ${out}\n`);
  await makeModel({
    preset, out, dtype, seed, ...(quantize !== undefined && { quantize: { layout: quantize } }),
    onProgress: stderrProgress('writing weights'),
  });
  if (onnx !== undefined) {
    const written = await exportOnnx({
      modelDir: out, quantization: onnx,
      onProgress: (done, total) => process.stderr.write(`\rwriting the ${onnx} ONNX export: layer ${done}/${total}${done === total ? '\n' : ''}`),
    });
    process.stderr.write(`onnx ${onnx}: ${written.path}\n`);
  }
  process.stderr.write(`done: ${out}\n`);
}

/**
 * A model directory is written in place (config, tokenizer and weight files replaced): without
 * --force an existing file or non-empty directory at --out is refused, so a typo cannot replace
 * a real checkpoint with random weights.
 */
function checkOut(out: string, force: boolean): void {
  const st = statSync(out, { throwIfNoEntry: false });
  if (st === undefined) return;
  if (!st.isDirectory()) {
    throw new SluiceError('invalid_argument', `make-model: --out ${out} is a file, not a directory`, { param: 'out' });
  }
  const entries = readdirSync(out);
  if (entries.length === 0 || force) return;
  const what = entries.includes('config.json') ? 'holds a model' : `is not empty (${entries.length} ${entries.length === 1 ? 'entry' : 'entries'})`;
  throw new SluiceError('invalid_argument',
    `make-model: --out ${out} ${what}; give --force to write this model over it, or choose another --out`, { param: 'out' });
}
