// `sluice make-model`: write a model directory with random weights in a preset's shape.

import { SluiceError } from '../errors.js';
import { makeModel, PRESETS, weightBytes } from '../../models/make-model.js';
import type { Dtype } from '../../models/make-model.js';
import { choiceFlag, intFlag, parseFlags, requiredFlag } from './args.js';

export const MAKE_MODEL_HELP = `usage: sluice make-model --preset NAME --out DIR [--dtype f32|f16|bf16] [--seed N]

Writes a Hugging Face model directory (config, tokenizer, chat template, safetensors) with
deterministic random weights in the shape of a preset.

  --preset NAME   one of: ${Object.keys(PRESETS).join(', ')}
  --out DIR       output directory (created if missing)
  --dtype D       weight dtype (default: the preset's)
  --seed N        weight seed, 0..2^32-1 (default 0)
`;

export async function runMakeModel(args: string[]): Promise<void> {
  const { values } = parseFlags(args, {
    preset: { type: 'string' },
    out: { type: 'string' },
    dtype: { type: 'string' },
    seed: { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  }, 'make-model');
  if (values.help) {
    process.stdout.write(MAKE_MODEL_HELP);
    return;
  }
  const preset = requiredFlag(values.preset, 'preset', 'make-model');
  if (!Object.hasOwn(PRESETS, preset)) {
    throw new SluiceError('invalid_argument',
      `--preset must be one of ${Object.keys(PRESETS).join(', ')}, got "${preset}"`, { param: 'preset' });
  }
  const out = requiredFlag(values.out, 'out', 'make-model');
  const dtype = choiceFlag<Dtype>(values.dtype, 'dtype', ['f32', 'f16', 'bf16']);
  const seed = intFlag(values.seed, 'seed', 0, 2 ** 32 - 1);

  const totalBytes = weightBytes(preset, dtype);
  process.stderr.write(`making ${preset} (${formatBytes(totalBytes)} of weights) in ${out}\n`);
  const isTty = process.stderr.isTTY === true;
  let lastStep = -1;
  await makeModel({
    preset, out, dtype, seed,
    onProgress: (doneBytes, total) => {
      const percent = total === 0 ? 100 : Math.floor((doneBytes / total) * 100);
      // On a terminal redraw one line per percent; in logs print a line per 10%.
      const step = isTty ? percent : Math.floor(percent / 10);
      if (step === lastStep) return;
      lastStep = step;
      const line = `writing weights ${percent}% (${formatBytes(doneBytes)} / ${formatBytes(total)})`;
      process.stderr.write(isTty ? `\r${line}` : `${line}\n`);
    },
  });
  if (isTty && lastStep >= 0) process.stderr.write('\n');
  process.stderr.write(`done: ${out}\n`);
}

function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}
