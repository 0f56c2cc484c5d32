// Mixture-of-experts MLP of the float64 reference (Qwen3-MoE, Mixtral, gpt-oss), following
// transformers' Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock and GptOssMLP: a router scores every
// expert, the top k are chosen, and the layer's output is the weighted sum of those experts' gated
// MLPs. Qwen3-MoE and Mixtral: a bias-free router, softmax over all experts, then the top k.
// gpt-oss: a router with a bias, the top k logits, then the softmax over those k, and experts with
// biases and a clamped SwiGLU (its tensors and their MXFP4 packing are read in gpt-oss.ts).

import { type GatedMlp, type Linear, type RefActivation, clampedSwigluMlp, gatedMlp, matvec, softmax } from './math.js';

export interface RefMoeConfig {
  numExperts: number;
  /** Experts each token goes through (num_experts_per_tok). */
  topK: number;
  /** Divide the k chosen probabilities by their sum (Mixtral always; Qwen3-MoE: norm_topk_prob). */
  normTopK: boolean;
  /** Each expert's intermediate size (Qwen3-MoE: moe_intermediate_size; Mixtral: intermediate_size). */
  expertIntermediateSize: number;
  /** Per layer: true when it routes through experts, false for a dense MLP of intermediate_size. */
  sparseLayers: boolean[];
  /** softmax-topk: softmax over all experts, then the top k; topk-softmax: softmax over the top k logits. */
  routing: 'softmax-topk' | 'topk-softmax';
  /** gpt-oss: experts use clampedSwigluMlp with this limit; null: gatedMlp with the model's activation. */
  swigluLimit: number | null;
}

export interface ReferenceMoe {
  router: Linear; // [numExperts, hidden]; a bias only for gpt-oss
  experts: GatedMlp[];
}

/** Where a family keeps a sparse layer's tensors, under model.layers.{i}. */
const NAMES = {
  Qwen3MoeForCausalLM: { block: 'mlp', gate: 'gate_proj', up: 'up_proj', down: 'down_proj' },
  MixtralForCausalLM: { block: 'block_sparse_moe', gate: 'w1', up: 'w3', down: 'w2' },
} as const;

export type MoeArchitecture = keyof typeof NAMES;

export const isMoeArchitecture = (arch: string): arch is MoeArchitecture => Object.hasOwn(NAMES, arch);

/** The MoE part of a Qwen3-MoE or Mixtral config.json. */
export function parseMoeConfig(arch: MoeArchitecture, raw: Record<string, any>, numLayers: number): RefMoeConfig {
  if (arch === 'MixtralForCausalLM') {
    return {
      numExperts: raw.num_local_experts ?? 8,
      topK: raw.num_experts_per_tok ?? 2,
      normTopK: true,
      expertIntermediateSize: raw.intermediate_size,
      sparseLayers: new Array<boolean>(numLayers).fill(true),
      routing: 'softmax-topk',
      swigluLimit: null,
    };
  }
  // Qwen3MoeDecoderLayer: sparse iff not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
  const numExperts: number = raw.num_experts ?? 128;
  const step: number = raw.decoder_sparse_step ?? 1;
  const mlpOnly: number[] = raw.mlp_only_layers ?? [];
  const sparseLayers: boolean[] = [];
  for (let i = 0; i < numLayers; i++) sparseLayers.push(!mlpOnly.includes(i) && numExperts > 0 && (i + 1) % step === 0);
  return {
    numExperts,
    topK: raw.num_experts_per_tok ?? 8,
    normTopK: raw.norm_topk_prob ?? false,
    expertIntermediateSize: raw.moe_intermediate_size,
    sparseLayers,
    routing: 'softmax-topk',
    swigluLimit: null,
  };
}

/** A sparse layer's router and experts; `linear(prefix, out, in)` reads `${prefix}.weight`. */
export function loadMoe(
  arch: MoeArchitecture,
  layerPrefix: string,
  cfg: RefMoeConfig,
  hidden: number,
  linear: (prefix: string, out: number, inp: number) => Linear,
): ReferenceMoe {
  const n = NAMES[arch];
  const p = `${layerPrefix}.${n.block}`;
  const inter = cfg.expertIntermediateSize;
  const experts: GatedMlp[] = [];
  for (let e = 0; e < cfg.numExperts; e++) {
    experts.push({
      gate: linear(`${p}.experts.${e}.${n.gate}`, inter, hidden),
      up: linear(`${p}.experts.${e}.${n.up}`, inter, hidden),
      down: linear(`${p}.experts.${e}.${n.down}`, hidden, inter),
    });
  }
  return { router: linear(`${p}.gate`, cfg.numExperts, hidden), experts };
}

export interface Routing {
  /** The chosen experts, most probable first (ties: the lower index first). */
  experts: number[];
  /** Their weights: softmax probabilities, renormalised to sum 1 when normTopK. */
  weights: number[];
}

/** Softmax over every expert's router logit, then the top k. */
export function routeTopK(routerLogits: ArrayLike<number>, topK: number, normTopK: boolean): Routing {
  const p = softmax(routerLogits);
  const experts: number[] = [];
  for (let k = 0; k < Math.min(topK, p.length); k++) {
    let best = -1;
    for (let e = 0; e < p.length; e++) if (!experts.includes(e) && (best < 0 || p[e]! > p[best]!)) best = e;
    experts.push(best);
  }
  let weights = experts.map((e) => p[e]!);
  if (normTopK) {
    const sum = weights.reduce((a, b) => a + b, 0);
    weights = weights.map((w) => w / sum);
  }
  return { experts, weights };
}

/**
 * gpt-oss: the top k logits (ties: the lower index first), weighted by the softmax over those k.
 * NOTE: the same numbers as routeTopK(logits, k, true) up to rounding (softmax then renormalising
 * over the chosen k), written out as transformers' GptOssTopKRouter does it.
 */
export function routeTopKThenSoftmax(routerLogits: ArrayLike<number>, topK: number): Routing {
  const experts: number[] = [];
  for (let k = 0; k < Math.min(topK, routerLogits.length); k++) {
    let best = -1;
    for (let e = 0; e < routerLogits.length; e++) {
      if (!experts.includes(e) && (best < 0 || routerLogits[e]! > routerLogits[best]!)) best = e;
    }
    experts.push(best);
  }
  return { experts, weights: Array.from(softmax(experts.map((e) => routerLogits[e]!))) };
}

/** The sparse MLP of one token: sum over its top-k experts of weight * expert(x). */
export function moeForward(moe: ReferenceMoe, cfg: RefMoeConfig, x: Float64Array, act: RefActivation): Float64Array {
  const logits = matvec(moe.router, x);
  const route = cfg.routing === 'topk-softmax' ? routeTopKThenSoftmax(logits, cfg.topK) : routeTopK(logits, cfg.topK, cfg.normTopK);
  const out = new Float64Array(x.length);
  route.experts.forEach((e, k) => {
    const expert = moe.experts[e]!;
    const y = cfg.swigluLimit === null ? gatedMlp(expert, x, act) : clampedSwigluMlp(expert, x, cfg.swigluLimit);
    for (let i = 0; i < out.length; i++) out[i]! += route.weights[k]! * y[i]!;
  });
  return out;
}
