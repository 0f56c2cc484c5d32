// The Qwen2.5-VL vision tower on the CPU (native/src/vision/qwen2_vl_encoder.cpp), or with
// --model gemma-3-4b-vl Gemma 3's SigLIP tower and projector (native/src/vision/siglip_encoder.cpp):
//   npm run bench:vision:encoder -- [--model qwen2.5-vl-3b|gemma-3-4b-vl] [--sizes 224x224,448x448,672x504]
//     [--threads 0] [--runs 2] [--batch 1] [--device cpu|cuda] [--out bench/results/vision-encoder.json]
// --device cuda runs the CUDA tower (native/src/cuda/vision_tower.cpp) on device 0, timed through
// encodeImage (the serving path: the float layout on the vision thread, the tower on the device);
// its results go to vision-encoder[-gemma3]-cuda.json unless --out says otherwise.
// Gemma 3 resizes every image to 896x896 (4096 patches, 256 tokens; written to
// bench/results/vision-encoder-gemma3.json unless --out says otherwise), its text model cut to
// one layer likewise.
// The published Qwen2.5-VL-3B vision tower (32 blocks of width 1280, 0.67B parameters, bf16) with
// one decoder layer beside it (the encoder reads only visual.*), made once in the model cache.
// Per image size: the patch rows (Qwen2.5-VL's published preprocessing), then the best and median
// encode time over --runs runs after one warm-up, patches/s, image tokens/s and the arithmetic
// rate the tower's matmuls reach (2 flops a multiply-add, attention included). With --batch N > 1,
// also N images of each size as the engine's queue hands them over, in one pass (encodeImages)
// against one at a time (encodeImage), best of --runs each.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { chartsBesideResult } from './charts.js';
import { gpuName, machineInfo } from './machine.js';
import { ensureBenchModel } from './bench-model.js';
import { nativeAddon } from '../src/native/native.js';
import { QWEN2_VL_DEFAULTS, qwen2VlPatchesAsync } from '../src/vision/qwen2-vl-preprocess.js';
import { GEMMA3_DEFAULTS, gemma3Pixels, gemma3Tables } from '../src/vision/gemma3-preprocess.js';
import { qwen2VlTables } from '../src/vision/qwen2-vl-preprocess.js';
import type { NativeImage, NativeVisionEncoder } from '../src/native/native.js';

const { values: args } = parseArgs({
  options: {
    model: { type: 'string', default: 'qwen2.5-vl-3b' },
    sizes: { type: 'string', default: '224x224,448x448,672x504' },
    threads: { type: 'string', default: '0' },
    runs: { type: 'string', default: '2' },
    batch: { type: 'string', default: '1' },
    device: { type: 'string', default: 'cpu' },
    out: { type: 'string' },
  },
});
const sizes = args.sizes!.split(',').map((s) => {
  const m = /^(\d+)x(\d+)$/.exec(s);
  if (!m) throw new Error(`--sizes takes WxH,WxH..., got ${s}`);
  return [Number(m[1]), Number(m[2])] as const;
});
const runs = Number(args.runs), threads = Number(args.threads), batch = Number(args.batch);
if (!(Number.isInteger(batch) && batch >= 1 && batch <= 64)) throw new Error('--batch must be an integer in [1, 64]');
if (!(Number.isInteger(runs) && runs > 0)) throw new Error('--runs must be a positive integer');
const gemma = args.model === 'gemma-3-4b-vl';
if (!gemma && args.model !== 'qwen2.5-vl-3b') throw new Error(`--model is qwen2.5-vl-3b or gemma-3-4b-vl, got ${args.model}`);
const device = args.device!;
if (device !== 'cpu' && device !== 'cuda') throw new Error(`--device is cpu or cuda, got ${device}`);
const out = args.out ?? `bench/results/vision-encoder${gemma ? '-gemma3' : ''}${device === 'cuda' ? '-cuda' : ''}.json`;

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

// Gemma 3's vision_config (SigLIP So400m/14 at 896) and projector (256 tokens of width 2560).
const G = { layers: 27, hidden: 1152, inter: 4304, patchDim: 588, tokens: 256, textHidden: 2560 };

/** Multiply-adds of one Gemma 3 encode over `n` patches (full attention in every layer). */
function gemmaMultiplyAdds(n: number): number {
  const perPatchLayer = 4 * G.hidden * G.hidden + 2 * G.hidden * G.inter;
  return n * G.patchDim * G.hidden + G.layers * (n * perPatchLayer + 2 * n * n * G.hidden) + G.tokens * G.hidden * G.textHidden;
}

interface Input { pixelValues: Float32Array; grid: [number, number, number]; patches: number; tokens: number }

const testRgb = (w: number, h: number, seed = 0) => Uint8Array.from({ length: w * h * 3 }, (_, i) => (i * 31 + (i >> 9) + seed * 97) & 255);

async function input(w: number, h: number): Promise<Input> {
  const rgb = testRgb(w, h);
  if (gemma) {
    const pixelValues = gemma3Pixels(rgb, w, h, { ...GEMMA3_DEFAULTS, width: 896, height: 896 });
    return { pixelValues, grid: [1, 64, 64], patches: 4096, tokens: G.tokens };
  }
  const p = await qwen2VlPatchesAsync(rgb, w, h, QWEN2_VL_DEFAULTS);
  return { pixelValues: p.pixelValues, grid: p.grid, patches: p.grid[1] * p.grid[2], tokens: p.numTokens };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Best of `runs` times of `work`, in seconds. */
async function bestOf(work: () => Promise<unknown>): Promise<number> {
  let best = Infinity;
  for (let r = 0; r < runs; r++) {
    const t0 = performance.now();
    await work();
    best = Math.min(best, (performance.now() - t0) / 1000);
  }
  return best;
}

/** `count` different images of one size resized as the processor does, and the tower's tables. */
async function nativeImages(w: number, h: number, grid: [number, number, number], count: number): Promise<{ images: NativeImage[]; tables: Float32Array }> {
  const [outW, outH, filter, tables] = gemma ? [896, 896, 'bilinear' as const, gemma3Tables({ ...GEMMA3_DEFAULTS, width: 896, height: 896 })]
    : [grid[2] * 14, grid[1] * 14, 'bicubic' as const, qwen2VlTables(QWEN2_VL_DEFAULTS)];
  const images: NativeImage[] = [];
  for (let k = 0; k < count; k++) images.push(await nativeAddon().resizeImage(testRgb(w, h, k + 1), w, h, outW, outH, filter));
  return { images, tables };
}

/** `batch` different images of one size: one pass against one at a time. */
async function batchTimes(encoder: NativeVisionEncoder, w: number, h: number, grid: [number, number, number]): Promise<{ oneAtATimeS: number; oneBatchS: number }> {
  const { images, tables } = await nativeImages(w, h, grid, batch);
  const oneAtATimeS = await bestOf(async () => { for (const im of images) await encoder.encodeImage(im, tables); });
  const oneBatchS = await bestOf(() => encoder.encodeImages(images, tables));
  return { oneAtATimeS, oneBatchS };
}

async function main(): Promise<void> {
  const dir = await ensureBenchModel(args.model!, 'bf16', undefined, { numLayers: 1 });
  const encoder = await nativeAddon().loadVisionEncoder(dir, threads, device === 'cuda' ? 0 : -1);
  const rows = [];
  try {
    for (const [w, h] of sizes) {
      const p = await input(w, h);
      const patches = p.patches;
      process.stderr.write(`${w}x${h}: ${patches} patches, ${p.tokens} tokens...\n`);
      // encode() (the float input) always runs the CPU tower; the device's through encodeImage.
      const { images: [image], tables } = await nativeImages(w, h, p.grid, 1);
      const once = () => (device === 'cuda' ? encoder.encodeImage(image!, tables) : encoder.encode(p.pixelValues, p.grid));
      await once();  // warm-up
      const times: number[] = [];
      for (let r = 0; r < runs; r++) {
        const t0 = performance.now();
        await once();
        times.push((performance.now() - t0) / 1000);
      }
      const best = Math.min(...times);
      const madds = gemma ? gemmaMultiplyAdds(patches) : multiplyAdds(patches);
      rows.push({ width: w, height: h, patches, tokens: p.tokens, bestS: best, medianS: median(times),
        patchesPerS: patches / best, tokensPerS: p.tokens / best, gflopsPerS: (2 * madds) / best / 1e9,
        ...(batch > 1 && { batch, ...await batchTimes(encoder, w, h, p.grid) }) });
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
  if (batch > 1) {
    console.log(`\n${batch} images    one at a time s  one pass s  speed-up`);
    for (const r of rows) {
      console.log(`${`${r.width}x${r.height}`.padEnd(9)}  ${r.oneAtATimeS!.toFixed(2).padStart(15)}  ${r.oneBatchS!.toFixed(2).padStart(10)}  ${(r.oneAtATimeS! / r.oneBatchS!).toFixed(2).padStart(8)}`);
    }
  }
  const gpu = device === 'cuda' ? gpuName() : undefined;
  const result = { bench: 'vision-encoder', machine: machineInfo(), ...(gpu && { gpu }), date: new Date().toISOString(), backend: device,
    model: gemma ? 'gemma-3-4b-vl SigLIP tower and projector (bf16, published shapes)' : 'qwen2.5-vl-3b vision tower (bf16, published shapes)',
    threads, runs, batch, rows };
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(out));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
