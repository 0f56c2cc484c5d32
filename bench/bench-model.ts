// The benchmark models: a preset's model with seeded random weights, made on first use in the
// model cache ($SLUICE_HOME/models/<preset>-<dtype>, or <preset>-<dtype>-<layout> for a quantized
// checkpoint of the same weights), with progress on stderr.
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { makeModel, type MakeModelOptions } from '../models/make-model.js';
import { modelCacheDir } from '../src/engine/paths.js';

type QuantizeOptions = NonNullable<MakeModelOptions['quantize']>;

/**
 * `overrides` (a preset cut down for one bench, e.g. a vision tower with one decoder layer) name
 * their own directory: <preset>-<dtype>-<field><value>...
 */
export async function ensureBenchModel(preset: string, dtype: 'f32' | 'f16' | 'bf16', quantize?: QuantizeOptions,
  overrides?: MakeModelOptions['overrides']): Promise<string> {
  const cut = Object.entries(overrides ?? {}).map(([k, v]) => `-${k}${String(v)}`).join('');
  const dir = join(modelCacheDir(), `${preset}-${dtype}${quantize ? `-${quantize.layout}` : ''}${cut}`);
  if (existsSync(join(dir, 'config.json'))) return dir;
  process.stderr.write(`making the ${preset} (${dtype}) model in ${dir}...\n`);
  let lastPct = -1;
  await makeModel({
    preset,
    out: dir,
    dtype,
    seed: 0,
    ...(quantize && { quantize }),
    ...(overrides && { overrides }),
    onProgress: (done, total) => {
      const pct = Math.floor((100 * done) / total);
      if (pct !== lastPct) process.stderr.write(`\r  ${(lastPct = pct)}%`);
    },
  });
  process.stderr.write('\n');
  return dir;
}
