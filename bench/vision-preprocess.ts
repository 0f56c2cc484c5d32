// Image preprocessing throughput (issue 34's target: 1,000 images of mixed sizes reach the engine at
// >= 200 images/s on the 2-core CPU, with /health under 50 ms meanwhile):
//   npm run bench:vision -- [--images 1000] [--concurrency 16] [--out bench/results/vision-preprocess.json]
// Each image is a JPEG (or PNG, one in five) in a data URI, of a size drawn from a fixed mix of
// photo and screenshot sizes; it goes through what a request's image goes through before the
// engine: loadImageBytes (data URI checks), then within the process's preparation slots
// (src/vision/preparation-slots.ts) decodeImage (sharp, off the event loop) and the processor's resize (Pillow's bicubic and the SHA-256 that keys the caches, in C++ on the libuv
// pool; the pixels stay native), with Qwen2.5-VL's published preprocessor_config.json. Meanwhile an HTTP server on this process answers
// GET /health, polled every 20 ms: its latency is what a health check sees while images are
// prepared. The images are made before the clock starts; each one's data URI string when its turn
// comes (timed: a request body brings one).
import http from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import sharp from 'sharp';

import { chartsBesideResult } from './charts.js';
import { machineInfo } from './machine.js';
import { decodeImage } from '../src/vision/image-decode.js';
import { loadImageBytes } from '../src/vision/image-source.js';
import { Qwen2VlProcessor } from '../src/vision/image-processor.js';
import { sharedPreparationSlots } from '../src/vision/preparation-slots.js';
import { QWEN2_VL_DEFAULTS } from '../src/vision/qwen2-vl-preprocess.js';

const { values: args } = parseArgs({
  options: {
    images: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '16' },
    runs: { type: 'string', default: '3' },
    out: { type: 'string', default: 'bench/results/vision-preprocess.json' },
  },
});
const numImages = Number(args.images), concurrency = Number(args.concurrency), runs = Number(args.runs);
if (!(Number.isInteger(runs) && runs > 0)) throw new Error('--runs must be a positive integer');
if (!(Number.isInteger(numImages) && numImages > 0)) throw new Error('--images must be a positive integer');
if (!(Number.isInteger(concurrency) && concurrency > 0)) throw new Error('--concurrency must be a positive integer');

/** Sizes people send: phone photos downscaled by apps, screenshots, thumbnails, a few large photos. */
const SIZES: Array<[number, number]> = [[320, 240], [640, 480], [800, 600], [1024, 768], [1280, 720], [512, 512], [480, 640], [256, 256], [1920, 1080], [750, 1334]];

interface BenchImage { bytes: Buffer; mediaType: string; width: number; height: number }

async function makeImage(i: number): Promise<BenchImage> {
  const [width, height] = SIZES[i % SIZES.length]!;
  // A gradient with per-image structure, so the encoder has real work (flat images compress to nothing).
  const raw = Buffer.alloc(width * height * 3);
  for (let y = 0, p = 0; y < height; y++) {
    for (let x = 0; x < width; x++, p += 3) {
      raw[p] = (x + i * 13) & 255;
      raw[p + 1] = (y * 2 + i * 7) & 255;
      raw[p + 2] = ((x ^ y) * (i % 5 + 1)) & 255;
    }
  }
  const png = i % 5 === 4;
  const img = sharp(raw, { raw: { width, height, channels: 3 } });
  const bytes = await (png ? img.png() : img.jpeg({ quality: 85 })).toBuffer();
  return { bytes, mediaType: png ? 'image/png' : 'image/jpeg', width, height };
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
}

interface RunResult {
  imagesPerS: number;
  seconds: number;
  imageTokens: number;
  perImageMs: { p50: number; p99: number };
  healthMs: { n: number; p50: number; p99: number; max: number };
}

/** Every image once through the serving path, `concurrency` at a time, while /health is polled. */
async function runOnce(images: BenchImage[]): Promise<RunResult> {
  const server = http.createServer((req, res) => res.end(req.url === '/health' ? 'ok' : ''));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  const health: number[] = [];
  let polling = true;
  const poll = (async () => {
    const agent = new http.Agent({ keepAlive: true });
    while (polling) {
      const t0 = performance.now();
      await new Promise<void>((resolve, reject) => {
        http.get({ host: '127.0.0.1', port, path: '/health', agent }, (res) => {
          res.resume();
          res.on('end', resolve);
        }).on('error', reject);
      });
      health.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, 20));
    }
    agent.destroy();
  })();

  const processor = new Qwen2VlProcessor(QWEN2_VL_DEFAULTS);
  let tokens = 0, next = 0;
  const perImage: number[] = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < images.length) {
      const im = images[next++]!;
      const s = performance.now();
      const uri = `data:${im.mediaType};base64,${im.bytes.toString('base64')}`;
      const bytes = await loadImageBytes(uri, { param: 'image', allowPrivateAddresses: false });
      // As a request's image: decoded and resized within the process's preparation slots.
      await sharedPreparationSlots().run(async () => {
        const decoded = await decodeImage(bytes);
        const resized = await processor.resize(decoded);
        tokens += processor.plan(decoded.width, decoded.height).numTokens;
        if (resized.hash.length !== 32) throw new Error('no hash');
      });
      perImage.push(performance.now() - s);
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  polling = false;
  await poll;
  server.close();
  return {
    imagesPerS: numImages / seconds, seconds, imageTokens: tokens,
    perImageMs: { p50: quantile(perImage, 0.5), p99: quantile(perImage, 0.99) },
    healthMs: { n: health.length, p50: quantile(health, 0.5), p99: quantile(health, 0.99), max: Math.max(...health) },
  };
}

async function main(): Promise<void> {
  process.stderr.write(`making ${numImages} images...\n`);
  // Kept as bytes: a data URI string is made when its image's turn comes (as a request body
  // brings one), so the heap holds only the images in flight, as a server's does.
  const images: BenchImage[] = [];
  for (let i = 0; i < numImages; i++) images.push(await makeImage(i));

  const results: RunResult[] = [];
  console.log(`run  images  concurrency  images/s  per image p50/p99 ms  image tokens  /health p50/p99/max ms`);
  for (let run = 1; run <= runs; run++) {
    const r = await runOnce(images);
    results.push(r);
    console.log(`${String(run).padStart(3)}  ${String(numImages).padStart(6)}  ${String(concurrency).padStart(11)}  ${r.imagesPerS.toFixed(1).padStart(8)}  ` +
      `${r.perImageMs.p50.toFixed(1)}/${r.perImageMs.p99.toFixed(1)}`.padStart(20) + `  ${String(r.imageTokens).padStart(12)}  ` +
      `${r.healthMs.p50.toFixed(2)}/${r.healthMs.p99.toFixed(2)}/${r.healthMs.max.toFixed(2)}`.padStart(22));
  }
  // The run with the median throughput stands for the bench (runs vary by 15% on a shared VM).
  const median = [...results].sort((a, b) => a.imagesPerS - b.imagesPerS)[Math.floor(results.length / 2)]!;
  const result = {
    bench: 'vision-preprocess', machine: machineInfo(), date: new Date().toISOString(),
    settings: { images: numImages, concurrency, runs, preparationSlots: sharedPreparationSlots().limit, sizes: SIZES, formats: '4 JPEG (quality 85) : 1 PNG', preprocessor: 'Qwen2.5-VL published' },
    ...median,
    runs: results,
  };
  console.log(`median run: ${median.imagesPerS.toFixed(1)} images/s, /health p99 ${median.healthMs.p99.toFixed(2)} ms`);
  mkdirSync(dirname(args.out!), { recursive: true });
  writeFileSync(args.out!, JSON.stringify(result, null, 2) + '\n');
  await chartsBesideResult(resolve(args.out!));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
