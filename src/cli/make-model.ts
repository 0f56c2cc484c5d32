// `sluice make-model`: write a model directory with random weights in a preset's shape.

import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { SluiceError } from '../errors.js';
import { INT_LAYOUTS, makeModel, PRESETS, QUANTIZE_LAYOUTS, weightBytes } from '../../models/make-model.js';
import type { Dtype, IntLayout, QuantizeOptions } from '../../models/make-model.js';
import { exportOnnx, ONNX_QUANTIZATIONS, type OnnxQuantization } from '../../models/onnx-export.js';
import { formatBytes, stderrProgress } from '../progress.js';
import { MAX_LORA_RANK, writeLoraAdapter } from '../../models/lora-checkpoint.js';
import { choiceFlag, commandFlags, intFlag, requiredFlag } from './args.js';

export const MAKE_MODEL_HELP = `usage: sluice make-model --preset NAME --out DIR [--dtype f32|f16|bf16] [--seed N]
                          [--quantize fp8-block|fp8-compressed-tensors|fp8-modelopt|awq|gptq|gptq-act-order|gptq-8bit]
                          [--group-size N] [--onnx fp32|int4] [--force]
       sluice make-model --lora RANK --model DIR --out DIR [--dtype f32|bf16] [--seed N] [--force]

Writes a Hugging Face model directory (config, tokenizer, chat template, safetensors) with
deterministic random weights in the shape of a preset.

  --preset NAME   one of: ${Object.keys(PRESETS).join(', ')}
  --out DIR       output directory (created if missing)
  --dtype D       weight dtype (default: the preset's)
  --seed N        weight seed, 0..2^32-1 (default 0)
  --quantize L    write a quantized checkpoint as published, other tensors in --dtype. FP8 (linear
                  projections F8_E4M3 with scales): fp8-block (Qwen3/DeepSeek FP8, 128x128 blocks),
                  fp8-compressed-tensors (llm-compressor FP8_DYNAMIC), fp8-modelopt (NVIDIA ModelOpt).
                  Integer (packed int32 codes, f16 scales, packed zeros): awq (AutoAWQ gemm, 4 bits),
                  gptq (AutoGPTQ, 4 bits, symmetric), gptq-act-order (desc_act), gptq-8bit
  --group-size N  awq / gptq: inputs per scale (default 128, or the largest of 64, 32, 16 that fits
                  the preset); gptq also -1, one group per matrix
  --onnx Q        also write an ONNX export of the same weights (onnx/model.onnx with past/present
                  KV tensors, as optimum lays it out): fp32, or int4 (MatMulNBits, 32 per scale)
  --force         write into --out even when it is not empty (its model files are replaced)
  --lora RANK     instead of a model, write a LoRA adapter for the model in --model into --out, in
                  PEFT's layout (adapter_config.json, adapter_model.safetensors): rank RANK (1..64),
                  lora_alpha 2 * RANK, every q/k/v/o and gate/up/down projection, random A and B
  --model DIR     with --lora: the model the adapter is for
`;

/** The flags make-model accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const MAKE_MODEL_OPTIONS = {
  preset: { type: 'string' },
  out: { type: 'string' },
  dtype: { type: 'string' },
  seed: { type: 'string' },
  quantize: { type: 'string' },
  'group-size': { type: 'string' },
  onnx: { type: 'string' },
  force: { type: 'boolean' },
  lora: { type: 'string' },
  model: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runMakeModel(args: string[]): Promise<void> {
  const values = commandFlags(args, MAKE_MODEL_OPTIONS, 'make-model', MAKE_MODEL_HELP);
  if (values === undefined) return;
  if (values.lora !== undefined) return makeLoraAdapter(values);
  if (values.model !== undefined) throw new SluiceError('invalid_argument', '--model goes with --lora', { param: 'model' });
  const preset = requiredFlag(values.preset, 'preset', 'make-model');
  if (!Object.hasOwn(PRESETS, preset)) {
    throw new SluiceError('invalid_argument',
      `--preset must be one of ${Object.keys(PRESETS).join(', ')}, got "${preset}"`, { param: 'preset' });
  }
  const out = requiredFlag(values.out, 'out', 'make-model');
  const dtype = choiceFlag<Dtype>(values.dtype, 'dtype', ['f32', 'f16', 'bf16']);
  const seed = intFlag(values.seed, 'seed', 0, 2 ** 32 - 1);
  const quantize = choiceFlag(values.quantize, 'quantize', QUANTIZE_LAYOUTS);
  const groupSize = intFlag(values['group-size'], 'group-size', -1);
  if (groupSize !== undefined && (groupSize === 0 || !quantize || !isIntLayout(quantize))) {
    throw new SluiceError('invalid_argument',
      groupSize === 0 ? '--group-size must be a positive integer or -1' : `--group-size goes with --quantize ${INT_LAYOUTS.join('|')}`, { param: 'group-size' });
  }
  const onnx = choiceFlag<OnnxQuantization>(values.onnx, 'onnx', ONNX_QUANTIZATIONS);
  if (quantize !== undefined && onnx !== undefined) {
    throw new SluiceError('invalid_argument', '--onnx exports bf16/f32 checkpoints; it cannot be combined with --quantize', { param: 'onnx' });
  }
  checkOut(out, values.force === true);

  const totalBytes = weightBytes(preset, dtype);
  process.stderr.write(`making ${preset} (${formatBytes(totalBytes)} of weights) in ${out}\n`);
  await makeModel({
    preset, out, dtype, seed, ...(quantize !== undefined && { quantize: { layout: quantize, ...(groupSize !== undefined && { groupSize }) } as QuantizeOptions }),
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

const isIntLayout = (layout: string): layout is IntLayout => (INT_LAYOUTS as readonly string[]).includes(layout);

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

/** make-model --lora RANK --model DIR --out DIR: a PEFT adapter for an existing model. */
async function makeLoraAdapter(values: { lora?: string; model?: string; out?: string; dtype?: string; seed?: string; force?: boolean;
  preset?: string; quantize?: string; onnx?: string; 'group-size'?: string }): Promise<void> {
  for (const flag of ['preset', 'quantize', 'onnx', 'group-size'] as const) {
    if (values[flag] !== undefined) throw new SluiceError('invalid_argument', `--${flag} does not go with --lora`, { param: flag });
  }
  const rank = intFlag(values.lora, 'lora', 1, MAX_LORA_RANK)!;
  const model = requiredFlag(values.model, 'model', 'make-model --lora');
  const out = requiredFlag(values.out, 'out', 'make-model --lora');
  const dtype = choiceFlag(values.dtype, 'dtype', ['f32', 'bf16'] as const) ?? 'f32';
  const seed = intFlag(values.seed, 'seed', 0, 2 ** 32 - 1) ?? 0;
  if (!existsSync(join(model, 'config.json'))) {
    throw new SluiceError('model_file_missing', `make-model --lora: ${model} holds no model (no config.json)`, { param: 'model' });
  }
  checkOut(out, values.force === true);
  await writeLoraAdapter(model, out, { rank, dtype: dtype === 'f32' ? 'F32' : 'BF16', seed });
  process.stderr.write(`wrote a rank-${rank} LoRA adapter for ${model} in ${out}\n`);
}
