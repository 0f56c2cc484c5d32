// LoRA adapters for a target checkpoint, in PEFT's layout (issue 36): adapter_config.json and
// adapter_model.safetensors with `base_model.model.<module>.lora_A.weight` [r, in] and
// `.lora_B.weight` [out, r] per adapted projection (q/k/v/o and gate/up/down of every decoder
// layer, or the modules chosen). Values are random and seeded (B too: PEFT starts B at zero, a
// trained adapter's is not). mergeLoraAdapter writes base + scale * B A as a checkpoint of its own
// (PEFT's merge_and_unload), which the tests hold the served adapter to.

import { copyFileSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { bytesOf, checkpointShapes, readF32Tensors, rewriteF32Checkpoint, type StoredTensor } from './checkpoint-rewrite.js';
import { writeSafetensorsData, type TensorData } from './safetensors-writer.js';
import { fillChunk, hashString } from './weights.js';

export const LORA_MODULES = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
export type LoraModule = (typeof LORA_MODULES)[number];
export const MAX_LORA_RANK = 64;

export interface LoraAdapterOptions {
  /** 1..MAX_LORA_RANK. */
  rank: number;
  /** lora_alpha (default 2 * rank). */
  alpha?: number;
  /** The projections adapted (default all seven). */
  modules?: readonly LoraModule[];
  /** scale = alpha / sqrt(rank) instead of alpha / rank. */
  rslora?: boolean;
  dtype?: 'F32' | 'BF16';
  seed?: number;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The adapted projections' weight names and [out, in] shapes, from the target's tensors. */
function adaptedProjections(targetDir: string, modules: readonly LoraModule[]): Array<{ name: string; out: number; in: number }> {
  const pattern = new RegExp(`\\.layers\\.\\d+\\.(self_attn|mlp)\\.(${modules.join('|')})\\.weight$`);
  return checkpointShapes(targetDir)
    .filter((t) => pattern.test(t.name) && t.shape.length === 2)
    .map((t) => ({ name: t.name, out: t.shape[0]!, in: t.shape[1]! }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** The PEFT tensor name stem of a base weight (`model.layers.0.self_attn.q_proj.weight`). */
const peftStem = (weight: string) => `base_model.model.${weight.slice(0, -'.weight'.length)}`;

/** Writes a random adapter for the checkpoint in `targetDir` into `outDir` (created). */
export async function writeLoraAdapter(targetDir: string, outDir: string, opts: LoraAdapterOptions): Promise<void> {
  const { rank } = opts;
  if (!Number.isInteger(rank) || rank < 1 || rank > MAX_LORA_RANK) throw new RangeError(`rank must be an integer in [1, ${MAX_LORA_RANK}], got ${rank}`);
  const alpha = opts.alpha ?? 2 * rank;
  if (!(alpha > 0 && Number.isFinite(alpha))) throw new RangeError(`alpha must be a positive number, got ${alpha}`);
  const modules = opts.modules ?? LORA_MODULES;
  for (const m of modules) if (!(LORA_MODULES as readonly string[]).includes(m)) throw new RangeError(`unknown module ${String(m)}`);
  const dtype = opts.dtype ?? 'F32';
  if (dtype !== 'F32' && dtype !== 'BF16') throw new RangeError(`dtype must be 'F32' or 'BF16', got ${String(dtype)}`);
  const seed = (opts.seed ?? 1) >>> 0;
  const projections = adaptedProjections(targetDir, modules);
  if (projections.length === 0) throw new Error(`lora adapter: ${targetDir} has none of the projections ${modules.join(', ')}`);
  const random = (name: string, n: number, std: number) => {
    const v = new Float32Array(n);
    fillChunk(v, n, hashString(`lora.${name}`, seed), { mean: 0, std });
    return v;
  };
  const tensors: TensorData[] = [];
  for (const p of projections) {
    const stem = peftStem(p.name);
    tensors.push({ name: `${stem}.lora_A.weight`, shape: [rank, p.in], data: random(`${stem}.A`, rank * p.in, 1 / Math.sqrt(p.in)) });
    tensors.push({ name: `${stem}.lora_B.weight`, shape: [p.out, rank], data: random(`${stem}.B`, p.out * rank, 0.5 / Math.sqrt(rank)) });
  }
  mkdirSync(outDir, { recursive: true });
  await writeSafetensorsData(join(outDir, 'adapter_model.safetensors'), tensors, dtype === 'F32' ? 'f32' : 'bf16');
  writeFileSync(join(outDir, 'adapter_config.json'), JSON.stringify({
    peft_type: 'LORA', task_type: 'CAUSAL_LM', base_model_name_or_path: targetDir, r: rank, lora_alpha: alpha,
    lora_dropout: 0, bias: 'none', use_rslora: opts.rslora ?? false, use_dora: false, fan_in_fan_out: false,
    target_modules: [...modules], modules_to_save: null, rank_pattern: {}, alpha_pattern: {},
  }, null, 2) + '\n');
}

/**
 * Writes `targetDir` with the adapter in `adapterDir` merged into its f32 weights (W + scale * B A,
 * summed in float64, rounded to f32) into `outDir`: what serving the adapter must compute.
 */
export function mergeLoraAdapter(targetDir: string, adapterDir: string, outDir: string): void {
  const config = JSON.parse(readFileSync(join(adapterDir, 'adapter_config.json'), 'utf8')) as unknown;
  if (!isObject(config) || typeof config['r'] !== 'number' || typeof config['lora_alpha'] !== 'number') {
    throw new Error(`lora merge: ${adapterDir}/adapter_config.json has no r and lora_alpha`);
  }
  const r = config['r'], alpha = config['lora_alpha'];
  const scale = config['use_rslora'] === true ? alpha / Math.sqrt(r) : alpha / r;
  const adapter = new Map<string, { shape: number[]; values: Float32Array }>();
  for (const { tensor, values } of readF32Tensors(join(adapterDir, 'adapter_model.safetensors'), 'lora merge')) {
    adapter.set(tensor.name, { shape: tensor.shape, values });
  }
  mkdirSync(outDir, { recursive: true });
  for (const f of readdirSync(targetDir)) if (statSync(join(targetDir, f)).isFile()) copyFileSync(join(targetDir, f), join(outDir, f));
  rewriteF32Checkpoint(outDir, 'lora merge', (t, values) => {
    const a = adapter.get(`${peftStem(t.name)}.lora_A.weight`), b = adapter.get(`${peftStem(t.name)}.lora_B.weight`);
    if (a === undefined || b === undefined) return [t];
    const [out, inn] = t.shape as [number, number];
    const merged = new Float32Array(out * inn);
    for (let o = 0; o < out; o++) {
      for (let i = 0; i < inn; i++) {
        let d = 0;
        for (let j = 0; j < r; j++) d += b.values[o * r + j]! * a.values[j * inn + i]!;
        merged[o * inn + i] = values[o * inn + i]! + scale * d;
      }
    }
    return [{ ...t, bytes: bytesOf(merged) } satisfies StoredTensor];
  }, ['F32'], true);
}
