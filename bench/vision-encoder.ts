// The Qwen2.5-VL vision tower on the CPU (native/src/vision/qwen2_vl_encoder.cpp):
//   npm run bench:vision:encoder -- [--sizes 224x224,448x448,672x504] [--threads 0] [--runs 2]
//     [--out bench/results/vision-encoder.json]
// The published Qwen2.5-VL-3B vision tower (32 blocks of width 1280, 0.67B parameters, bf16) with
// one decoder layer beside it (the encoder reads only visual.*), made once in the model cache.
// Per image size: the patch rows (Qwen2.5-VL's published preprocessing), then the best and median
// encode time over --runs runs after one warm-up, patches/s, image tokens/s and the arithmetic
// rate the tower's matmuls reach (2 flops a multiply-add, attention included).
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { chartsBesideResult } from './charts.js';
import { machineInfo } from './machine.js';
import { ensureBenchModel } from './bench-model.js';
import { nativeAddon } from '../src/native/native.js';
import { QWEN2_VL_DEFAULTS, qwen2VlPatchesAsync } from '../src/vision/qwen2-vl-preprocess.js';

const { values: args } = parseArgs({
  options: {
    sizes: { type: 'string', default: '224x224,448x448,672x504' },
    threads: { type: 'string', default: '0' },
    runs: { type: 'string', default: '2' },
    out: { type: 'string', default: 'bench/results/vision-encoder.json' },
  },
});
const sizes = args.sizes!.split(',').map((s) => {
  const m = /^(\d+)x(\d+)$/.exec(s);
  if (!m) throw new Error(`--sizes takes WxH,WxH..., got ${s}`);
  return [Number(m[1]), Number(m[2])] as const;
});
const runs = Number(args.runs), threads = Number(args.threads);
if (!(Number.isInteger(runs) && runs > 0)) throw new Error('--runs must be a positive integer');

// Qwen2.5-VL-3B's vision_config.
const V = { depth: 32, hidden: 1280, inter: 3420, heads: 16, patchDim: 1176, windowPatches: 8, fullBlocks: 4 };

/** Multiply-adds of one encode over `n` patch rows (windows of up to 64 patches in 28 blocks). */
function multiplyAdds(n: number): number {
  const perPatchBlock = V.hidden * 3 * V.hidden + V.hidden * V.hidden + 3 * V.hidden * V.inter;
  const attention = (seg: number) => 2 * seg * V.hidden;  // per query: q.k and p.v over `seg` keys, all heads
  const window = V.windowPatches * V.windowPatches;
  const merger = (n / 4) * (4 * V.hidden * 4 * V.hidden + 4 * V.hidden * 2048);
  return n * V.patchDim * V.hidden + n * V.depth * perPatchBlock +
    n * (V.fullBlocks * attention(n) + (V.depth - V.fullBlocks) * attention(Math.min(n, window))) + merger;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const dir = await ensureBenchModel('qwen2.5-vl-3b', 'bf16', undefined, { numLayers: 1 });
  const encoder = await nativeAddon().loadVisionEncoder(dir, threads);
  const rows = [];
  try {
    for (const [w, h] of sizes) {
      const rgb = Uint8Array.from({ length: w * h * 3 }, (_, i) => (i * 31 + (i >> 9)) & 255);
      const p = await qwen2VlPatchesAsync(rgb, w, h, QWEN2_VL_DEFAULTS);
      const patches = p.grid[1] * p.grid[2];
      process.stderr.write(`${w}x${h}: ${patches} patches, ${p.numTokens} tokens...\n`);
      await encoder.encode(p.pixelValues, p.grid);  // warm-up
      const times: number[] = [];
      for (let r = 0; r < runs; r++) {
        const t0 = performance.now();
        await encoder.encode(p.pixelValues, p.grid);
        times.push((performance.now() - t0) / 1000);
      }
      const best = Math.min(...times);
      rows.push({ width: w, height: h, patches, tokens: p.numTokens, bestS: best, medianS: median(times),
        patchesPerS: patches / best, tokensPerS: p.numTokens / best, gflopsPerS: (2 * multiplyAdds(patches)) / best / 1e9 });
    }
  } finally {
    encoder.dispose();
  }
  console.log('image      patches  tokens  best s  median s  patches/s  tokens/s  GFLOP/s');
  for (const r of rows) {
    console.log(`${`${r.width}x${r.height}`.padEnd(9)}  ${String(r.patches).padStart(7)}  ${String(r.tokens).padStart(6)}  ` +
      `${r.bestS.toFixed(2).padStart(6)}  ${r.medianS.toFixed(2).padStart(8)}  ${r.patchesPerS.toFixed(0).padStart(9)}  ` +
      `${r.tokensPerS.toFixed(0).padStart(8)}  ${r.gflopsPerS.toFixed(0).padStart(7)}`);
  }
  const result = { bench: 'vision-encoder', machine: machineInfo(), date: new Date().toISOString(), backend: 'cpu',
    model: 'qwen2.5-vl-3b vision tower (bf16, published shapes)', threads, runs, rows };
  mkdirSync(dirname(args.out!), { recursive: true });
  writeFileSync(args.out!, JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(args.out!));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
