// A draft model for speculative decoding made from a target checkpoint (issue 35): the target's
// files copied (config, tokenizer, chat template: the same tokenizer, as a draft must have), every
// weight moved by `scale` times its tensor's standard deviation times N(0, 1), and optionally only
// the first `layers` decoder layers kept (a cheaper draft). A small scale gives a draft that agrees
// with the target on most greedy tokens; the tests and the bench report how often. The target must
// be an f32 or bf16 checkpoint (the project's writer's output); the draft keeps each tensor's dtype.

import { copyFileSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { bytesOf, rewriteF32Checkpoint, type StoredTensor } from './checkpoint-rewrite.js';

export interface PerturbOptions {
  /** Noise as a fraction of each tensor's standard deviation (e.g. 0.05). */
  scale: number;
  seed?: number;
  /** Keep only decoder layers 0 .. layers - 1 (config.json's num_hidden_layers follows). */
  layers?: number;
}

/** The decoder layer a tensor belongs to (model.layers.N. or language_model.model.layers.N.), if any. */
const layerOf = (name: string): number | undefined => {
  const m = /(?:^|\.)layers\.(\d+)\./.exec(name);
  return m ? Number(m[1]) : undefined;
};

/** Writes the perturbed copy of `targetDir` into `outDir` (created; files there are replaced). */
export function writePerturbedDraft(targetDir: string, outDir: string, opts: PerturbOptions): void {
  if (!(opts.scale >= 0 && opts.scale <= 10)) throw new RangeError(`scale must be in [0, 10], got ${opts.scale}`);
  mkdirSync(outDir, { recursive: true });
  for (const name of readdirSync(targetDir)) {
    const from = join(targetDir, name);
    if (statSync(from).isFile()) copyFileSync(from, join(outDir, name));
  }
  const keep = opts.layers;
  if (keep !== undefined) {
    const path = join(outDir, 'config.json');
    const config = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
    const total = config['num_hidden_layers'];
    if (typeof total !== 'number' || !Number.isInteger(keep) || keep < 1 || keep > total) {
      throw new RangeError(`layers must be in [1, ${String(total)}], got ${keep}`);
    }
    config['num_hidden_layers'] = keep;
    if (Array.isArray(config['layer_types'])) config['layer_types'] = (config['layer_types'] as unknown[]).slice(0, keep);
    writeFileSync(path, JSON.stringify(config, null, 2) + '\n');
  }
  let state = (opts.seed ?? 1) >>> 0 || 1;
  // xorshift32 and Box-Muller: deterministic noise for a given seed.
  const uniform = () => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return (state + 0.5) / 4294967296;
  };
  const normal = () => Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
  rewriteF32Checkpoint(outDir, 'draft writer', (t: StoredTensor, values: Float32Array): StoredTensor[] => {
    const layer = layerOf(t.name);
    if (keep !== undefined && layer !== undefined && layer >= keep) return [];
    let mean = 0;
    for (const v of values) mean += v;
    mean /= Math.max(1, values.length);
    let variance = 0;
    for (const v of values) variance += (v - mean) * (v - mean);
    const sd = Math.sqrt(variance / Math.max(1, values.length));
    const out = new Float32Array(values.length);
    for (let i = 0; i < values.length; i++) out[i] = values[i]! + opts.scale * sd * normal();
    if (t.dtype === 'F32') return [{ ...t, bytes: bytesOf(out) }];
    // BF16: round to nearest even.
    const bits = new Uint32Array(out.buffer);
    const half = new Uint16Array(out.length);
    for (let i = 0; i < out.length; i++) {
      const b = bits[i]!;
      half[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
    }
    return [{ ...t, bytes: bytesOf(half) }];
  }, ['F32', 'BF16']);
}
