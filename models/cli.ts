#!/usr/bin/env node
// Command line front end of the generator:
//   node dist/models/cli.js --preset tiny --out data/tiny [--dtype bf16] [--seed 0]
//        [--shard-bytes N] [--no-weights] [--set numLayers=2 --set vocabSize=4096]
//        [--quantize LAYOUT [--group-size N]]
//   node dist/models/cli.js --list

import { INT_LAYOUTS, PRESETS, type PresetShape, QUANTIZE_LAYOUTS, type QuantizeOptions, makeModel, weightBytes } from './make-model.js';

function usage(): never {
  console.error(
    'usage: cli --preset NAME --out DIR [--dtype f32|f16|bf16] [--seed N] [--shard-bytes N] [--no-weights] [--set field=value]...\n' +
      '           [--quantize ' + QUANTIZE_LAYOUTS.join('|') + ' [--group-size N]]\n' +
      '       cli --list',
  );
  process.exit(2);
}

async function main(argv: string[]): Promise<void> {
  let preset = '';
  let out = '';
  let dtype: 'f32' | 'f16' | 'bf16' | undefined;
  let seed: number | undefined;
  let shardBytes: number | undefined;
  let weights = true;
  let quantize: (typeof QUANTIZE_LAYOUTS)[number] | undefined;
  let groupSize: number | undefined;
  const overrides: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const next = () => argv[++i] ?? usage();
    if (a === '--list') {
      for (const [name, s] of Object.entries(PRESETS)) {
        console.log(`${name.padEnd(18)} ${s.architecture.padEnd(30)} ${(weightBytes(name) / 1e9).toFixed(3)} GB (${s.defaultDtype})`);
      }
      return;
    } else if (a === '--preset') preset = next();
    else if (a === '--out') out = next();
    else if (a === '--dtype') {
      const d = next();
      if (d !== 'f32' && d !== 'f16' && d !== 'bf16') usage();
      dtype = d;
    } else if (a === '--seed') seed = Number(next());
    else if (a === '--shard-bytes') shardBytes = Number(next());
    else if (a === '--no-weights') weights = false;
    else if (a === '--quantize') {
      const q = next();
      if (!(QUANTIZE_LAYOUTS as readonly string[]).includes(q)) usage();
      quantize = q as (typeof QUANTIZE_LAYOUTS)[number];
    } else if (a === '--group-size') groupSize = Number(next());
    else if (a === '--set') {
      const [k, v] = next().split('=', 2) as [string, string | undefined];
      if (v === undefined) usage();
      overrides[k] = v === 'null' ? null : v === 'true' ? true : v === 'false' ? false : Number.isNaN(Number(v)) ? v : Number(v);
    } else usage();
  }
  if (!preset || !out) usage();
  if (groupSize !== undefined && !(quantize && (INT_LAYOUTS as readonly string[]).includes(quantize))) usage();
  const t0 = Date.now();
  let lastPct = -1;
  await makeModel({
    preset,
    out,
    dtype,
    seed,
    shardBytes,
    weights,
    ...(quantize && { quantize: { layout: quantize, ...(groupSize !== undefined && { groupSize }) } as QuantizeOptions }),
    overrides: overrides as Partial<PresetShape>,
    onProgress: (done, total) => {
      const pct = total ? Math.floor((done / total) * 100) : 100;
      if (pct !== lastPct && pct % 10 === 0) {
        lastPct = pct;
        process.stderr.write(`${pct}% `);
      }
    },
  });
  process.stderr.write(`\nwrote ${preset} to ${out} in ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
}

main(process.argv.slice(2)).catch((e: unknown) => {
  console.error(e instanceof Error ? e.message : e);
  process.exit(1);
});
