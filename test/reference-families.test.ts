// The float64 reference's Qwen3-MoE, Mixtral, Gemma 3 and gpt-oss support, against forward passes
// written out plainly here, and the published-layout checkpoints of test/helpers/published-checkpoints.ts.

import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  PUBLISHED_FAMILIES,
  type PublishedCheckpointOptions,
  type PublishedFamily,
  type WrittenTensor,
  writePublishedCheckpoint,
  writeSafetensorsFile,
} from './helpers/published-checkpoints.js';
import { quantizeReferenceQ8 } from './reference/q8.js';
import {
  FP4_E2M1_VALUES,
  type ReferenceModel,
  clampedSwigluMlp,
  geluTanh,
  loadReferenceModel,
  logitsTopGap,
  referenceGreedy,
  referenceLogits,
  ropeAttentionFactor,
  ropeInvFreq,
  routeTopK,
  routeTopKThenSoftmax,
  softmax,
  unpackMxfp4,
} from './reference/reference-model.js';
import { readSafetensorsFile } from './reference/safetensors-reader.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-reference-families-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let counter = 0;

const EPS = 1e-6;

/** Deterministic, f32-exact values (hand models are written as f32). */
const vals = (n: number, seed: number, scale = 0.8) => Array.from({ length: n }, (_, i) => Math.fround(Math.sin(seed * 13.7 + i * 1.3 + 0.4) * scale));
const zeros = (n: number) => new Array<number>(n).fill(0);
const ones = (n: number) => new Array<number>(n).fill(1);
const eye = (n: number) => Array.from({ length: n * n }, (_, i) => (i % (n + 1) === 0 ? 1 : 0));

/** y = W x for W [rows, x.length] row-major. */
const mv = (w: number[], x: number[]) => Array.from({ length: w.length / x.length }, (_, r) => x.reduce((a, v, c) => a + w[r * x.length + c]! * v, 0));
const add = (a: number[], b: number[]) => a.map((v, i) => v + b[i]!);
const norm = (x: number[], w: number[], offset = 0) => {
  const r = Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + EPS);
  return x.map((v, i) => (v / r) * (offset + w[i]!));
};
const siluN = (v: number) => v / (1 + Math.exp(-v));
const geluN = (v: number) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));
const row = (m: number[], i: number, width: number) => m.slice(i * width, (i + 1) * width);

function handModel(config: Record<string, unknown>, tensors: WrittenTensor[]): ReferenceModel {
  const dir = join(root, `hand-${counter++}`);
  mkdirSync(dir);
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  writeSafetensorsFile(join(dir, 'model.safetensors'), tensors, 'f32');
  return loadReferenceModel(dir);
}

const expectRowsClose = (got: Float64Array[], want: number[][], digits = 11) => {
  expect(got.length).toBe(want.length);
  want.forEach((w, i) => w.forEach((v, j) => expect(got[i]![j], `position ${i}, logit ${j}`).toBeCloseTo(v, digits)));
};

const maxDiff = (a: Float64Array[], b: number[][]) => Math.max(...a.flatMap((r, i) => Array.from(r, (v, j) => Math.abs(v - b[i]![j]!))));

const expectClose = (got: ArrayLike<number>, want: number[], digits = 15) => {
  expect(got.length).toBe(want.length);
  want.forEach((v, i) => expect(got[i], `entry ${i}`).toBeCloseTo(v, digits));
};

describe('routing', () => {
  it('softmax over all experts, top k (ties to the lower index), optional renormalisation', () => {
    const logits = [1, 3, 2, 3, 0];
    const e = logits.map(Math.exp);
    const z = e.reduce((a, b) => a + b, 0);
    const norm2 = routeTopK(logits, 2, true);
    expect(norm2.experts).toEqual([1, 3]);
    expect(norm2.weights[0]).toBeCloseTo(0.5, 15);
    expect(norm2.weights[1]).toBeCloseTo(0.5, 15);
    const raw2 = routeTopK(logits, 2, false);
    expect(raw2.experts).toEqual([1, 3]);
    expect(raw2.weights[0]).toBeCloseTo(e[1]! / z, 15);
    const norm3 = routeTopK(logits, 3, true);
    expect(norm3.experts).toEqual([1, 3, 2]);
    expect(norm3.weights[2]).toBeCloseTo(e[2]! / (2 * e[3]! + e[2]!), 15);
    const raw3 = routeTopK(logits, 3, false);
    expect(raw3.weights.reduce((a, b) => a + b, 0)).toBeCloseTo((2 * e[3]! + e[2]!) / z, 15);
  });
});

// ---------------------------------------------------------------- Qwen3-MoE and Mixtral by hand

// hidden 2, one head, o_proj zero (attention adds nothing): each layer is x += mlp(norm(x)).
const H = 2;
const VOCAB = 4;
const embed = vals(VOCAB * H, 1, 1.5);
const lmHead = vals(VOCAB * H, 2);
const dense = { gate: vals(3 * H, 3), up: vals(3 * H, 4), down: vals(H * 3, 5) }; // intermediate 3
const experts = [0, 1, 2].map((e) => ({ gate: vals(2 * H, 10 + e, 2), up: vals(2 * H, 20 + e, 1.5), down: vals(H * 2, 30 + e, 2) })); // intermediate 2
const router = [1, 0, 0, 1, 0.6, -0.6].map(Math.fround);

function mlpByHand(m: Mlp, x: number[]) {
  const g = mv(m.gate, x);
  const u = mv(m.up, x);
  return mv(m.down, g.map((v, i) => siluN(v) * u[i]!));
}

type Mlp = { gate: number[]; up: number[]; down: number[] };

function moeByHand(x: number[], topK: number, renormalise: boolean, ex: Mlp[] = experts) {
  const r = mv(router, x);
  const e = r.map(Math.exp);
  const p = e.map((v) => v / e.reduce((a, b) => a + b, 0));
  const order = [0, 1, 2].sort((a, b) => p[b]! - p[a]! || a - b).slice(0, topK);
  const sum = order.reduce((a, i) => a + p[i]!, 0);
  return order.reduce((acc, i) => add(acc, mlpByHand(ex[i]!, x).map((v) => (v * p[i]!) / (renormalise ? sum : 1))), zeros(H));
}

function attentionTensors(p: string, qkNorm: boolean): WrittenTensor[] {
  const t: WrittenTensor[] = [
    { name: `${p}.input_layernorm.weight`, shape: [H], data: ones(H) },
    { name: `${p}.post_attention_layernorm.weight`, shape: [H], data: ones(H) },
    { name: `${p}.self_attn.q_proj.weight`, shape: [H, H], data: eye(H) },
    { name: `${p}.self_attn.k_proj.weight`, shape: [H, H], data: eye(H) },
    { name: `${p}.self_attn.v_proj.weight`, shape: [H, H], data: eye(H) },
    { name: `${p}.self_attn.o_proj.weight`, shape: [H, H], data: zeros(H * H) },
  ];
  if (qkNorm) t.push({ name: `${p}.self_attn.q_norm.weight`, shape: [H], data: ones(H) }, { name: `${p}.self_attn.k_norm.weight`, shape: [H], data: ones(H) });
  return t;
}

const gatedTensors = (p: string, names: string[], m: Mlp, inter: number): WrittenTensor[] => [
  { name: `${p}.${names[0]}.weight`, shape: [inter, H], data: m.gate },
  { name: `${p}.${names[1]}.weight`, shape: [inter, H], data: m.up },
  { name: `${p}.${names[2]}.weight`, shape: [H, inter], data: m.down },
];

const outerTensors = (): WrittenTensor[] => [
  { name: 'model.embed_tokens.weight', shape: [VOCAB, H], data: embed },
  { name: 'model.norm.weight', shape: [H], data: ones(H) },
  { name: 'lm_head.weight', shape: [VOCAB, H], data: lmHead },
];

const baseConfig = { hidden_size: H, num_attention_heads: 1, num_key_value_heads: 1, vocab_size: VOCAB, rms_norm_eps: EPS, rope_theta: 10000, tie_word_embeddings: false, hidden_act: 'silu' };

describe('Qwen3-MoE by hand', () => {
  // Two layers; which is sparse follows mlp_only_layers and decoder_sparse_step.
  it.each([
    { mlp_only_layers: [], decoder_sparse_step: 1, norm_topk_prob: true, sparse: [true, true] },
    { mlp_only_layers: [1], decoder_sparse_step: 1, norm_topk_prob: true, sparse: [true, false] },
    { mlp_only_layers: [], decoder_sparse_step: 2, norm_topk_prob: true, sparse: [false, true] },
    { mlp_only_layers: [1], decoder_sparse_step: 2, norm_topk_prob: false, sparse: [false, false] },
    { mlp_only_layers: [0], decoder_sparse_step: 1, norm_topk_prob: false, sparse: [false, true] },
  ])('mlp_only_layers $mlp_only_layers, decoder_sparse_step $decoder_sparse_step, norm_topk_prob $norm_topk_prob', (c) => {
    const tensors = outerTensors();
    for (let i = 0; i < 2; i++) {
      const p = `model.layers.${i}`;
      tensors.push(...attentionTensors(p, true));
      if (!c.sparse[i]) {
        tensors.push(...gatedTensors(`${p}.mlp`, ['gate_proj', 'up_proj', 'down_proj'], dense, 3));
        continue;
      }
      tensors.push({ name: `${p}.mlp.gate.weight`, shape: [3, H], data: router });
      experts.forEach((m, e) => tensors.push(...gatedTensors(`${p}.mlp.experts.${e}`, ['gate_proj', 'up_proj', 'down_proj'], m, 2)));
    }
    const m = handModel({
      ...baseConfig, architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', head_dim: H, num_hidden_layers: 2,
      intermediate_size: 3, moe_intermediate_size: 2, num_experts: 3, num_experts_per_tok: 2,
      mlp_only_layers: c.mlp_only_layers, decoder_sparse_step: c.decoder_sparse_step, norm_topk_prob: c.norm_topk_prob,
    }, tensors);
    expect(m.layers.map((L) => L.moe !== null)).toEqual(c.sparse);
    const seq = [0, 1, 2, 3, 1];
    const want = seq.map((t) => {
      let x = row(embed, t, H);
      for (let i = 0; i < 2; i++) {
        const h = norm(x, ones(H));
        x = add(x, c.sparse[i] ? moeByHand(h, 2, c.norm_topk_prob) : mlpByHand(dense, h));
      }
      return mv(lmHead, norm(x, ones(H)));
    });
    expectRowsClose(referenceLogits(m, seq), want);
  });

  it('norm_topk_prob matters, and defaults to false as in Qwen3MoeConfig', () => {
    // The cases above compare with both settings; here, that the two differ on these weights.
    const diffs = [0, 1, 2, 3].flatMap((t) => {
      const h = norm(row(embed, t, H), ones(H));
      const [a, b] = [moeByHand(h, 2, true), moeByHand(h, 2, false)];
      return a.map((v, i) => Math.abs(v - b[i]!));
    });
    expect(Math.max(...diffs)).toBeGreaterThan(0.05);
    // and that tokens go to different pairs of experts.
    const pairs = new Set([0, 1, 2, 3].map((t) => routeTopK(mv(router, norm(row(embed, t, H), ones(H))), 2, true).experts.join()));
    expect(pairs.size).toBeGreaterThan(1);
    const dir = join(root, 'qwen3-moe-default-norm');
    const ck = writePublishedCheckpoint(dir, 'qwen3-moe', { config: { norm_topk_prob: undefined } });
    expect(ck.config).not.toHaveProperty('norm_topk_prob');
    expect(loadReferenceModel(dir).config.moe!.normTopK).toBe(false);
  });
});

describe('Mixtral by hand', () => {
  // w1 is the gate (through silu), w3 the up projection, w2 the down one; always renormalised.
  it.each([1, 2])('top-%i of 3 experts, w1/w3/w2 roles', (topK) => {
    const tensors = outerTensors();
    const p = 'model.layers.0';
    tensors.push(...attentionTensors(p, false), { name: `${p}.block_sparse_moe.gate.weight`, shape: [3, H], data: router });
    experts.forEach((m, e) => tensors.push(...gatedTensors(`${p}.block_sparse_moe.experts.${e}`, ['w1', 'w3', 'w2'], m, 2)));
    const m = handModel({
      ...baseConfig, architectures: ['MixtralForCausalLM'], model_type: 'mixtral', num_hidden_layers: 1, intermediate_size: 2,
      num_local_experts: 3, num_experts_per_tok: topK, sliding_window: null,
    }, tensors);
    const seq = [0, 1, 2, 3];
    const byHand = (ex: Mlp[]) => seq.map((t) => {
      const x = row(embed, t, H);
      return mv(lmHead, norm(add(x, moeByHand(norm(x, ones(H)), topK, true, ex)), ones(H)));
    });
    const got = referenceLogits(m, seq);
    expectRowsClose(got, byHand(experts));
    // w1 and w3 swapped (silu on the up projection instead) gives other logits.
    expect(maxDiff(got, byHand(experts.map((e) => ({ gate: e.up, up: e.gate, down: e.down }))))).toBeGreaterThan(1e-3);
  });
});

// ---------------------------------------------------------------- Gemma 3 by hand

// hidden 4, one query head and one kv head of head_dim 4 (so rope has two frequencies, 1 and
// base^-1/2, and the local/global bases differ), intermediate 3, vocab 5.
const G = 4;
const GV = 5;
const GI = 3;
const gw = (layers: number) => ({
  embed: vals(GV * G, 50, 1),
  final: vals(G, 51, 0.3),
  layers: Array.from({ length: layers }, (_, l) => ({
    inNorm: vals(G, 60 + l, 0.3), postAttn: vals(G, 70 + l, 0.3), preFf: vals(G, 80 + l, 0.3), postFf: vals(G, 90 + l, 0.3),
    qNorm: vals(G, 100 + l, 0.3), kNorm: vals(G, 110 + l, 0.3),
    q: vals(G * G, 120 + l, 1.5), k: vals(G * G, 130 + l), v: vals(G * G, 140 + l), o: vals(G * G, 150 + l),
    gate: vals(GI * G, 160 + l, 1.2), up: vals(GI * G, 170 + l), down: vals(G * GI, 180 + l),
  })),
});

interface GemmaHand {
  types: ('sliding' | 'full')[];
  window: number;
  qpas: number;
  theta: number;
  localTheta: number;
  linearFactor: number;
  attnCap: number | null;
  finalCap: number | null;
  // Switches that undo one Gemma piece, to show each one changes the logits.
  normOffset?: number;
  embedScale?: number;
  act?: (v: number) => number;
  noSandwich?: boolean;
  scaleLocal?: boolean;
}

function gemmaByHand(w: ReturnType<typeof gw>, o: GemmaHand, seq: number[]): number[][] {
  const off = o.normOffset ?? 1;
  const n = (x: number[], wt: number[]) => norm(x, wt, off);
  const mlp = (L: ReturnType<typeof gw>['layers'][number], h: number[]) => {
    const u = mv(L.up, h);
    return mv(L.down, mv(L.gate, h).map((g, i) => (o.act ?? geluN)(g) * u[i]!));
  };
  const rope = (x: number[], pos: number, sliding: boolean) => {
    const base = sliding ? o.localTheta : o.theta;
    const factor = sliding && !o.scaleLocal ? 1 : o.linearFactor;
    const inv = [1, base ** -0.5].map((f) => f / factor);
    const [a, b] = inv.map((f) => pos * f) as [number, number];
    // rotate-half pairs (0, 2) and (1, 3)
    return [
      x[0]! * Math.cos(a) - x[2]! * Math.sin(a), x[1]! * Math.cos(b) - x[3]! * Math.sin(b),
      x[2]! * Math.cos(a) + x[0]! * Math.sin(a), x[3]! * Math.cos(b) + x[1]! * Math.sin(b),
    ];
  };
  const keys: number[][][] = w.layers.map(() => []);
  const values: number[][][] = w.layers.map(() => []);
  return seq.map((t, pos) => {
    let x = row(w.embed, t, G).map((v) => v * (o.embedScale ?? Math.sqrt(G)));
    w.layers.forEach((L, l) => {
      const sliding = o.types[l] === 'sliding';
      const h = n(x, L.inNorm);
      const q = rope(n(mv(L.q, h), L.qNorm), pos, sliding);
      keys[l]!.push(rope(n(mv(L.k, h), L.kNorm), pos, sliding));
      values[l]!.push(mv(L.v, h));
      const first = sliding ? Math.max(0, pos - o.window + 1) : 0;
      const scores = keys[l]!.slice(first).map((k) => {
        const s = q.reduce((a, v, i) => a + v * k[i]!, 0) / Math.sqrt(o.qpas);
        return o.attnCap === null ? s : Math.tanh(s / o.attnCap) * o.attnCap;
      });
      const p = softmax(scores);
      const attn = values[l]!.slice(first).reduce((acc, v, j) => acc.map((a, i) => a + p[j]! * v[i]!), zeros(G));
      const out = mv(L.o, attn);
      if (o.noSandwich) {
        // Llama's arrangement: post_attention_layernorm as the MLP's input norm, no other norms.
        x = add(x, out);
        x = add(x, mlp(L, n(x, L.postAttn)));
        return;
      }
      x = add(x, n(out, L.postAttn));
      x = add(x, n(mlp(L, n(x, L.preFf)), L.postFf));
    });
    const logits = mv(w.embed, n(x, w.final));
    return o.finalCap === null ? logits : logits.map((z) => Math.tanh(z / o.finalCap!) * o.finalCap!);
  });
}

function gemmaTensors(w: ReturnType<typeof gw>, prefix: string): WrittenTensor[] {
  const t: WrittenTensor[] = [
    { name: `${prefix}.embed_tokens.weight`, shape: [GV, G], data: w.embed },
    { name: `${prefix}.norm.weight`, shape: [G], data: w.final },
  ];
  w.layers.forEach((L, l) => {
    const p = `${prefix}.layers.${l}`;
    t.push(
      { name: `${p}.input_layernorm.weight`, shape: [G], data: L.inNorm },
      { name: `${p}.post_attention_layernorm.weight`, shape: [G], data: L.postAttn },
      { name: `${p}.pre_feedforward_layernorm.weight`, shape: [G], data: L.preFf },
      { name: `${p}.post_feedforward_layernorm.weight`, shape: [G], data: L.postFf },
      { name: `${p}.self_attn.q_norm.weight`, shape: [G], data: L.qNorm },
      { name: `${p}.self_attn.k_norm.weight`, shape: [G], data: L.kNorm },
      { name: `${p}.self_attn.q_proj.weight`, shape: [G, G], data: L.q },
      { name: `${p}.self_attn.k_proj.weight`, shape: [G, G], data: L.k },
      { name: `${p}.self_attn.v_proj.weight`, shape: [G, G], data: L.v },
      { name: `${p}.self_attn.o_proj.weight`, shape: [G, G], data: L.o },
      { name: `${p}.mlp.gate_proj.weight`, shape: [GI, G], data: L.gate },
      { name: `${p}.mlp.up_proj.weight`, shape: [GI, G], data: L.up },
      { name: `${p}.mlp.down_proj.weight`, shape: [G, GI], data: L.down },
    );
  });
  return t;
}

const gemmaText = {
  hidden_size: G, intermediate_size: GI, num_attention_heads: 1, num_key_value_heads: 1, head_dim: G, vocab_size: GV,
  rms_norm_eps: EPS, hidden_activation: 'gelu_pytorch_tanh', query_pre_attn_scalar: 3, rope_theta: 10000,
  rope_local_base_freq: 100, rope_scaling: { rope_type: 'linear', factor: 2 }, sliding_window: 2,
  attn_logit_softcapping: 1.5, final_logit_softcapping: 2.5,
};

describe('Gemma 3 by hand', () => {
  const w = gw(3);
  const seq = [0, 3, 1, 4, 2, 2, 0];
  // Layers 0 and 2 slide (window 2, local base 100, no scaling), layer 1 is full (base 1e4, linear x2).
  const hand: GemmaHand = { types: ['sliding', 'full', 'sliding'], window: 2, qpas: 3, theta: 10000, localTheta: 100, linearFactor: 2, attnCap: 1.5, finalCap: 2.5 };
  const causal = () => handModel({ architectures: ['Gemma3ForCausalLM'], model_type: 'gemma3_text', num_hidden_layers: 3, sliding_window_pattern: 2, ...gemmaText }, gemmaTensors(w, 'model'));

  it('Gemma3ForCausalLM: every piece as written out plainly', () => {
    const m = causal();
    expect(m.config.slidingWindow).toEqual([2, null, 2]);
    expect(Array.from(m.layers[0]!.invFreq)).toEqual([1, 0.1]);
    expect(Array.from(m.layers[1]!.invFreq)).toEqual([0.5, 0.005]);
    expect(m.layers[2]!.invFreq).toBe(m.layers[0]!.invFreq);
    expectRowsClose(referenceLogits(m, seq), gemmaByHand(w, hand, seq));
  });

  // Each variant undoes one piece; the logits must move, so the test above checks that piece.
  it.each<[string, Partial<GemmaHand>]>([
    ['norms without the 1 +', { normOffset: 0 }],
    ['no sqrt(hidden) embedding scale', { embedScale: 1 }],
    ['silu instead of gelu_tanh', { act: siluN }],
    ['no sandwich norms', { noSandwich: true }],
    ['scale 1/sqrt(head_dim) instead of query_pre_attn_scalar', { qpas: G }],
    ['the global rope base on sliding layers', { localTheta: 10000 }],
    ['the local rope base on full layers', { theta: 100 }],
    ['linear scaling on the sliding layers too', { scaleLocal: true }],
    ['no linear scaling', { linearFactor: 1 }],
    ['no sliding window', { window: 99 }],
    ['no attention softcap', { attnCap: null }],
    ['no final softcap', { finalCap: null }],
  ])('%s changes the logits', (_label, change) => {
    const got = referenceLogits(causal(), seq);
    expect(maxDiff(got, gemmaByHand(w, { ...hand, ...change }, seq))).toBeGreaterThan(1e-4);
  });

  it('layer_types, when present, decides which layers slide; otherwise sliding_window_pattern (default 6)', () => {
    const load = (extra: Record<string, unknown>, layers: number) =>
      handModel({ architectures: ['Gemma3ForCausalLM'], model_type: 'gemma3_text', ...gemmaText, num_hidden_layers: layers, ...extra }, gemmaTensors(gw(layers), 'model'));
    const types: GemmaHand['types'] = ['full', 'sliding', 'sliding'];
    const m = load({ sliding_window_pattern: 2, layer_types: ['full_attention', 'sliding_attention', 'sliding_attention'] }, 3);
    expect(m.config.slidingWindow).toEqual([null, 2, 2]);
    expectRowsClose(referenceLogits(m, seq), gemmaByHand(gw(3), { ...hand, types }, seq));
    expect(load({}, 7).config.slidingWindow).toEqual([2, 2, 2, 2, 2, null, 2]);
    expect(load({ sliding_window_pattern: 3 }, 4).config.slidingWindow).toEqual([2, 2, null, 2]);
    expect(() => load({ layer_types: ['full_attention'] }, 2)).toThrow(/layer_types/);
  });

  it('Gemma3ForConditionalGeneration: text_config, language_model.model.* names, tied lm_head, vision tensors ignored', () => {
    const text = { model_type: 'gemma3_text', num_hidden_layers: 3, sliding_window_pattern: 2, ...gemmaText };
    const vision: WrittenTensor[] = [
      { name: 'vision_tower.vision_model.post_layernorm.weight', shape: [3], data: [1, 2, 3] },
      { name: 'multi_modal_projector.mm_input_projection_weight', shape: [3, G], data: vals(3 * G, 7) },
    ];
    const m = handModel(
      { architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3', text_config: text, vision_config: { hidden_size: 3 } },
      [...gemmaTensors(w, 'language_model.model'), ...vision],
    );
    expect(m.config.modelType).toBe('gemma3');
    expect(m.lmHead.w).toBe(m.embed);
    expectRowsClose(referenceLogits(m, seq), gemmaByHand(w, hand, seq));
  });

  it('gelu_tanh and the softcap by value', () => {
    expect(geluTanh(0)).toBe(0);
    expect(geluTanh(1)).toBeCloseTo(0.841192, 6); // torch gelu(approximate='tanh')
    expect(geluTanh(-1)).toBeCloseTo(-0.158808, 6);
    expect(geluTanh(3)).toBeCloseTo(2.996363, 6);
    const m = handModel({ architectures: ['Gemma3ForCausalLM'], model_type: 'gemma3_text', num_hidden_layers: 3, ...gemmaText, final_logit_softcapping: 0.25 }, gemmaTensors(w, 'model'));
    for (const r of referenceLogits(m, seq)) for (const z of r) expect(Math.abs(z)).toBeLessThan(0.25);
  });
});

// ---------------------------------------------------------------- gpt-oss by hand

const FP4 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];
const sigmoidN = (v: number) => 1 / (1 + Math.exp(-v));

describe('gpt-oss pieces by value', () => {
  it('MXFP4: e2m1 nibbles, the low nibble first, times 2^(scale - 127) per block of 32, from U8 tensors in a file', () => {
    // Row 0, scale 128 (x2): 0x21 -> 0.5, 1 -> 1, 2; 0xf8 -> -0, -6 -> -0, -12; 0x7e -> -4, 6 -> -8, 12.
    // Row 1, scale 125 (x1/4): 0x5a -> -1, 3 -> -0.25, 0.75; 0x93 -> 1.5, -0.5 -> 0.375, -0.125.
    // Row 2, two blocks, scales 127 and 126: 0x44 -> 2, 2; in block 2, 0x0b -> -1.5, 0 -> -0.75, 0.
    const blocks = zeros(4 * 16);
    blocks.splice(0, 3, 0x21, 0xf8, 0x7e);
    blocks.splice(16, 2, 0x5a, 0x93);
    blocks[32] = 0x44;
    blocks[48] = 0x0b;
    const path = join(root, 'mxfp4.safetensors');
    writeSafetensorsFile(path, [
      { name: 'b', shape: [2, 1, 16], data: blocks.slice(0, 32), dtype: 'u8' },
      { name: 's', shape: [2, 1], data: [128, 125], dtype: 'u8' },
      { name: 'b2', shape: [1, 2, 16], data: blocks.slice(32), dtype: 'u8' },
      { name: 's2', shape: [1, 2], data: [127, 126], dtype: 'u8' },
    ], 'bf16');
    const t = readSafetensorsFile(path);
    expect(t.get('b')!.dtype).toBe('U8');
    expect(Array.from(t.get('s')!.data)).toEqual([128, 125]);
    const rows = unpackMxfp4(t.get('b')!, t.get('s')!);
    expect(rows.length).toBe(64);
    expect(Array.from(rows.subarray(0, 8))).toEqual([1, 2, -0, -12, -8, 12, 0, 0]);
    expect(Array.from(rows.subarray(32, 36))).toEqual([-0.25, 0.75, 0.375, -0.125]);
    const two = unpackMxfp4(t.get('b2')!, t.get('s2')!);
    expect(Array.from(two.subarray(0, 3))).toEqual([2, 2, 0]);
    expect(Array.from(two.subarray(32, 35))).toEqual([-0.75, 0, 0]);
    expect(FP4_E2M1_VALUES).toEqual(FP4);
    expect(() => unpackMxfp4(t.get('b')!, t.get('s2')!)).toThrow(/scales/);
    expect(() => writeSafetensorsFile(join(root, 'bad.safetensors'), [{ name: 'x', shape: [1], data: [256], dtype: 'u8' }], 'f32')).toThrow(/byte/);
  });

  it('YaRN inverse frequencies and attention factor by hand (head_dim 8)', () => {
    // Base 16 makes the frequencies 2^-i and a correction dimension log2(orig / (2 pi r)).
    const yarn = (orig: number, truncate?: boolean) =>
      ropeInvFreq(8, 16, { rope_type: 'yarn', factor: 4, original_max_position_embeddings: orig, ...(truncate === undefined ? {} : { truncate }) });
    // orig 32, truncated: low = max(floor(log2(32 / 64pi)), 0) = 0, high = ceil(log2(32 / 2pi)) = 3;
    // ramp i/3 blends 2^-i into 2^-i / 4.
    expectClose(yarn(32), [1, 0.375, 0.125, 0.03125]);
    expectClose(yarn(32, true), [1, 0.375, 0.125, 0.03125]);
    // Not truncated: high = log2(16 / pi) = 2.3479.
    const high = Math.log2(16 / Math.PI);
    const blend = (i: number, r: number) => 2 ** -i * (1 - r) + (2 ** -i / 4) * r;
    yarn(32, false).forEach((f, i) => expect(f).toBeCloseTo(blend(i, Math.min(i / high, 1)), 15));
    // orig 1024: low = log2(16 / pi), high = min(log2(512 / pi), dim - 1 = 7); pairs 0-2 unchanged.
    yarn(1024, false).forEach((f, i) => expect(f).toBeCloseTo(blend(i, Math.max(0, (i - high) / (7 - high))), 15));
    expectClose(yarn(1024, false).subarray(0, 3), [1, 0.5, 0.25]);
    // beta_fast and beta_slow default to 32 and 1.
    expect(ropeInvFreq(8, 16, { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 32, beta_fast: 32, beta_slow: 1 })).toEqual(yarn(32));
    expect(ropeInvFreq(8, 16, { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 32, beta_fast: 2 })).not.toEqual(yarn(32));
    expect(() => ropeInvFreq(8, 16, { rope_type: 'yarn', factor: 4 })).toThrow(/original_max_position_embeddings/);

    expect(ropeAttentionFactor({ rope_type: 'yarn', factor: 4 })).toBeCloseTo(1 + 0.1 * Math.log(4), 15);
    expect(ropeAttentionFactor({ rope_type: 'yarn', factor: 32 })).toBeCloseTo(1.3465735902799727, 15);
    expect(ropeAttentionFactor({ rope_type: 'yarn', factor: 4, attention_factor: 0.9 })).toBe(0.9);
    const mscaled = ropeAttentionFactor({ rope_type: 'yarn', factor: 4, mscale: 1, mscale_all_dim: 0.5 });
    expect(mscaled).toBeCloseTo((1 + 0.1 * Math.log(4)) / (1 + 0.05 * Math.log(4)), 15);
    expect(ropeAttentionFactor({ rope_type: 'yarn', factor: 1 })).toBe(1);
    expect(ropeAttentionFactor({ rope_type: 'linear', factor: 4 })).toBe(1);
    expect(ropeAttentionFactor(null)).toBe(1);
  });

  it('clamped SwiGLU: gate clamped from above, up both ways, (up + 1) * gate * sigmoid(1.702 gate), biases', () => {
    const lin = (w: number, b: number) => ({ w: Float64Array.of(w), b: Float64Array.of(b), out: 1, in: 1 });
    const mlp = { gate: lin(1, 3), up: lin(-2, 1), down: lin(0.5, -0.25) };
    const at = (x: number) => clampedSwigluMlp(mlp, Float64Array.of(x), 7)[0]!;
    const byHand = (gate: number, up: number) => 0.5 * ((up + 1) * gate * sigmoidN(1.702 * gate)) - 0.25;
    expect(at(1)).toBeCloseTo(byHand(4, -1), 14); // nothing clamped
    expect(at(5)).toBeCloseTo(byHand(7, -7), 14); // gate 8 -> 7, up -9 -> -7
    expect(at(-6)).toBeCloseTo(byHand(-3, 7), 14); // up 13 -> 7
    expect(at(-12)).toBeCloseTo(byHand(-9, 7), 14); // gate -9 stays (no lower clamp)
    expect(at(-12)).not.toBeCloseTo(byHand(-7, 7), 6);
  });

  it('routing: the top k logits, then the softmax over those k (ties to the lower index)', () => {
    const logits = [1, 3, 2, 3, 0];
    expect(routeTopKThenSoftmax(logits, 2)).toEqual({ experts: [1, 3], weights: [0.5, 0.5] });
    const three = routeTopKThenSoftmax(logits, 3);
    expect(three.experts).toEqual([1, 3, 2]);
    const z = 2 * Math.exp(3) + Math.exp(2);
    expect(three.weights[2]).toBeCloseTo(Math.exp(2) / z, 15);
    // The same numbers as softmax over all, top k, renormalised.
    routeTopK(logits, 3, true).weights.forEach((w, i) => expect(three.weights[i]).toBeCloseTo(w, 15));
  });
});

// hidden 32 and intermediate 32 (one MXFP4 block per row), 2 query heads over 1 kv head of 8, 3
// experts top 2, vocab 5, layer_types absent (layer 0 slides with window 3, layer 1 is full).
// Rope base 16 with YaRN x4 over 32 positions, truncated: frequencies [1, 0.375, 0.125, 0.03125].
const OH = 32;
const OD = 8;
const OQ = 2;
const OI = 32;
const OE = 3;
const OV = 5;
const OSS_FREQ = [1, 0.375, 0.125, 0.03125];
const OSS_ATTN_FACTOR = 1 + 0.1 * Math.log(4);
/** Hash-like values in [0, 1): unlike vals' sinusoids, rows and inputs do not line up into huge dot products. */
const hash01 = (i: number, seed: number) => {
  const s = Math.sin(i * 12.9898 + seed * 78.233) * 43758.5453;
  return s - Math.floor(s);
};
const noise = (n: number, seed: number, a: number) => Array.from({ length: n }, (_, i) => Math.fround((2 * hash01(i, seed) - 1) * a));
const nearOne = (n: number, seed: number) => noise(n, seed, 0.2).map((v) => Math.fround(1 + v));
const bytesOf = (n: number, seed: number) => Array.from({ length: n }, (_, i) => Math.floor(hash01(i, seed) * 256));
const scalesOf = (n: number, seed: number, lo: number, hi: number) => Array.from({ length: n }, (_, i) => lo + Math.floor(hash01(i, seed) * (hi - lo + 1)));

const ow = (layers: number) => ({
  embed: noise(OV * OH, 200, 1.5),
  final: nearOne(OH, 201),
  lm: noise(OV * OH, 202, 0.5),
  layers: Array.from({ length: layers }, (_, l) => ({
    inNorm: nearOne(OH, 210 + l), postNorm: nearOne(OH, 220 + l),
    q: noise(OQ * OD * OH, 230 + l, 0.3), qb: noise(OQ * OD, 240 + l, 0.3),
    k: noise(OD * OH, 250 + l, 0.3), kb: noise(OD, 260 + l, 0.3),
    v: noise(OD * OH, 270 + l, 0.3), vb: noise(OD, 280 + l, 0.3),
    o: noise(OH * OQ * OD, 290 + l, 0.3), ob: noise(OH, 300 + l, 0.3),
    sinks: noise(OQ, 310 + l, 1),
    router: noise(OE * OH, 320 + l, 0.5), routerBias: noise(OE, 330 + l, 1),
    // gate_up [E, 2I, H]: 16 bytes and one scale (124..126) per row; down [E, H, I]: scales 119..121.
    gu: bytesOf((OE * 2 * OI * OH) / 2, 340 + l), guScales: scalesOf(OE * 2 * OI, 345 + l, 124, 126), guBias: noise(OE * 2 * OI, 350 + l, 0.5),
    down: bytesOf((OE * OH * OI) / 2, 360 + l), downScales: scalesOf(OE * OH, 365 + l, 119, 121), downBias: noise(OE * OH, 370 + l, 0.5),
  })),
});
type OssWeights = ReturnType<typeof ow>;

/** Switches that undo one gpt-oss piece each (defaults: the real thing). */
interface OssVariant {
  sinks?: boolean;
  attnBias?: boolean;
  freq?: number[];
  attnFactor?: number;
  windows?: (number | null)[];
  routerBias?: boolean;
  softmaxOverAll?: boolean;
  interleaved?: boolean;
  limit?: number;
  alpha?: number;
  upPlusOne?: boolean;
  highNibbleFirst?: boolean;
}

interface OssTrace {
  logits: number[][];
  /** Per (position, layer, head): the attention weights' sum (1 minus the sink's share). */
  weightSums: number[];
  /** Per (position, layer): the chosen experts. */
  pairs: string[];
  clampedGates: number;
  clampedUps: number;
}

/** An MXFP4 [rows, 32] matrix as values, one block per row, unpacked plainly. */
function fp4Rows(bytes: number[], scales: number[], highFirst: boolean): number[] {
  return bytes.flatMap((b, i) => {
    const s = 2 ** (scales[Math.floor(i / 16)]! - 127);
    const [first, second] = highFirst ? [b >> 4, b & 15] : [b & 15, b >> 4];
    return [FP4[first]! * s, FP4[second]! * s];
  });
}

function gptOssByHand(w: OssWeights, o: OssVariant, seq: number[]): OssTrace {
  const trace: OssTrace = { logits: [], weightSums: [], pairs: [], clampedGates: 0, clampedUps: 0 };
  const windows = o.windows ?? [3, null];
  const freq = o.freq ?? OSS_FREQ;
  const af = o.attnFactor ?? OSS_ATTN_FACTOR;
  const limit = o.limit ?? 7;
  const biased = (m: number[], b: number[], x: number[], on = true) => (on ? add(mv(m, x), b) : mv(m, x));
  const rope = (x: number[], pos: number) => {
    const out = x.slice();
    for (let i = 0; i < OD / 2; i++) {
      const [c, s] = [Math.cos(pos * freq[i]!) * af, Math.sin(pos * freq[i]!) * af];
      out[i] = x[i]! * c - x[i + OD / 2]! * s;
      out[i + OD / 2] = x[i + OD / 2]! * c + x[i]! * s;
    }
    return out;
  };
  const experts = w.layers.map((L) => {
    const gu = fp4Rows(L.gu, L.guScales, o.highNibbleFirst ?? false); // [E, 2I, H]
    const down = fp4Rows(L.down, L.downScales, o.highNibbleFirst ?? false); // [E, H, I]
    return Array.from({ length: OE }, (_, e) => {
      const rows = Array.from({ length: 2 * OI }, (_, r) => row(gu, e * 2 * OI + r, OH));
      const bias = row(L.guBias, e, 2 * OI);
      // Interleaved: gate rows 0, 2, 4..., up rows 1, 3, 5...; the undone variant takes halves.
      const gateIdx = Array.from({ length: OI }, (_, r) => (o.interleaved ?? true ? 2 * r : r));
      const upIdx = Array.from({ length: OI }, (_, r) => (o.interleaved ?? true ? 2 * r + 1 : OI + r));
      return {
        gate: gateIdx.flatMap((r) => rows[r]!), gateBias: gateIdx.map((r) => bias[r]!),
        up: upIdx.flatMap((r) => rows[r]!), upBias: upIdx.map((r) => bias[r]!),
        down: down.slice(e * OH * OI, (e + 1) * OH * OI), downBias: row(L.downBias, e, OH),
      };
    });
  });
  const keys: number[][][] = w.layers.map(() => []);
  const values: number[][][] = w.layers.map(() => []);
  seq.forEach((t, pos) => {
    let x = row(w.embed, t, OH);
    w.layers.forEach((L, l) => {
      const h = norm(x, L.inNorm);
      const q = biased(L.q, L.qb, h, o.attnBias ?? true);
      keys[l]!.push(rope(biased(L.k, L.kb, h, o.attnBias ?? true), pos));
      values[l]!.push(biased(L.v, L.vb, h, o.attnBias ?? true));
      const first = windows[l] === null ? 0 : Math.max(0, pos - windows[l]! + 1);
      const attn: number[] = [];
      for (let hd = 0; hd < OQ; hd++) {
        const qh = rope(q.slice(hd * OD, (hd + 1) * OD), pos);
        const scores = keys[l]!.slice(first).map((k) => qh.reduce((a, v, i) => a + v * k[i]!, 0) / Math.sqrt(OD));
        const p = Array.from(softmax(o.sinks ?? true ? [...scores, L.sinks[hd]!] : scores)).slice(0, scores.length);
        trace.weightSums.push(p.reduce((a, b) => a + b, 0));
        attn.push(...values[l]!.slice(first).reduce((acc, v, j) => acc.map((a, i) => a + p[j]! * v[i]!), zeros(OD)));
      }
      x = add(x, biased(L.o, L.ob, attn, o.attnBias ?? true));
      const h2 = norm(x, L.postNorm);
      const r = biased(L.router, L.routerBias, h2, o.routerBias ?? true);
      const chosen = [0, 1, 2].sort((a, b) => r[b]! - r[a]! || a - b).slice(0, 2);
      trace.pairs.push(chosen.join());
      const all = softmax(r);
      const top = softmax(chosen.map((e) => r[e]!));
      const weights = chosen.map((e, k) => (o.softmaxOverAll ? all[e]! : top[k]!));
      chosen.forEach((e, k) => {
        const E = experts[l]![e]!;
        const g = add(mv(E.gate, h2), E.gateBias);
        const u = add(mv(E.up, h2), E.upBias);
        const act = g.map((gv, i) => {
          if (gv > limit) trace.clampedGates++;
          if (Math.abs(u[i]!) > limit) trace.clampedUps++;
          const gc = Math.min(gv, limit);
          const uc = Math.max(-limit, Math.min(u[i]!, limit));
          return (uc + (o.upPlusOne ?? true ? 1 : 0)) * gc * sigmoidN((o.alpha ?? 1.702) * gc);
        });
        x = add(x, add(mv(E.down, act), E.downBias).map((v) => v * weights[k]!));
      });
    });
    trace.logits.push(mv(w.lm, norm(x, w.final)));
  });
  return trace;
}

function gptOssTensors(w: OssWeights): WrittenTensor[] {
  const t: WrittenTensor[] = [
    { name: 'model.embed_tokens.weight', shape: [OV, OH], data: w.embed },
    { name: 'model.norm.weight', shape: [OH], data: w.final },
    { name: 'lm_head.weight', shape: [OV, OH], data: w.lm },
  ];
  w.layers.forEach((L, l) => {
    const p = `model.layers.${l}`;
    const a = `${p}.self_attn`;
    const x = `${p}.mlp.experts`;
    t.push(
      { name: `${p}.input_layernorm.weight`, shape: [OH], data: L.inNorm },
      { name: `${p}.post_attention_layernorm.weight`, shape: [OH], data: L.postNorm },
      { name: `${a}.q_proj.weight`, shape: [OQ * OD, OH], data: L.q }, { name: `${a}.q_proj.bias`, shape: [OQ * OD], data: L.qb },
      { name: `${a}.k_proj.weight`, shape: [OD, OH], data: L.k }, { name: `${a}.k_proj.bias`, shape: [OD], data: L.kb },
      { name: `${a}.v_proj.weight`, shape: [OD, OH], data: L.v }, { name: `${a}.v_proj.bias`, shape: [OD], data: L.vb },
      { name: `${a}.o_proj.weight`, shape: [OH, OQ * OD], data: L.o }, { name: `${a}.o_proj.bias`, shape: [OH], data: L.ob },
      { name: `${a}.sinks`, shape: [OQ], data: L.sinks },
      { name: `${p}.mlp.router.weight`, shape: [OE, OH], data: L.router }, { name: `${p}.mlp.router.bias`, shape: [OE], data: L.routerBias },
      { name: `${x}.gate_up_proj_blocks`, shape: [OE, 2 * OI, OH / 32, 16], data: L.gu, dtype: 'u8' },
      { name: `${x}.gate_up_proj_scales`, shape: [OE, 2 * OI, OH / 32], data: L.guScales, dtype: 'u8' },
      { name: `${x}.gate_up_proj_bias`, shape: [OE, 2 * OI], data: L.guBias },
      { name: `${x}.down_proj_blocks`, shape: [OE, OH, OI / 32, 16], data: L.down, dtype: 'u8' },
      { name: `${x}.down_proj_scales`, shape: [OE, OH, OI / 32], data: L.downScales, dtype: 'u8' },
      { name: `${x}.down_proj_bias`, shape: [OE, OH], data: L.downBias },
    );
  });
  return t;
}

const gptOssHandConfig = {
  architectures: ['GptOssForCausalLM'], model_type: 'gpt_oss', hidden_size: OH, intermediate_size: OI, head_dim: OD,
  num_attention_heads: OQ, num_key_value_heads: 1, num_local_experts: OE, num_experts_per_tok: 2, num_hidden_layers: 2,
  vocab_size: OV, rms_norm_eps: EPS, rope_theta: 16, sliding_window: 3, swiglu_limit: 7, tie_word_embeddings: false,
  rope_scaling: { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 32, truncate: true },
};

describe('gpt-oss by hand', () => {
  const w = ow(2);
  const seq = [0, 3, 1, 4, 2, 2, 0, 1];
  const model = () => handModel(gptOssHandConfig, gptOssTensors(w));

  it('every piece as written out plainly; sinks take a share, the clamp and both routings are in play', () => {
    const m = model();
    expect(m.config.slidingWindow).toEqual([3, null]);
    expectClose(m.layers[0]!.invFreq, OSS_FREQ);
    expect(m.layers[1]!.ropeScale).toBeCloseTo(OSS_ATTN_FACTOR, 15);
    const hand = gptOssByHand(w, {}, seq);
    expectRowsClose(referenceLogits(m, seq), hand.logits, 10);
    // Every head's weights sum below 1, by a real share on average.
    expect(Math.max(...hand.weightSums)).toBeLessThan(1);
    expect(hand.weightSums.reduce((a, b) => a + b, 0) / hand.weightSums.length).toBeLessThan(0.95);
    expect(hand.clampedGates).toBeGreaterThan(0);
    expect(hand.clampedUps).toBeGreaterThan(0);
    expect(new Set(hand.pairs).size).toBeGreaterThan(1);
    // The router bias changes which experts some tokens go to.
    expect(gptOssByHand(w, { routerBias: false }, seq).pairs).not.toEqual(hand.pairs);
  });

  // Each variant undoes one piece; the logits must move, so the test above checks that piece.
  it.each<[string, OssVariant]>([
    ['no attention sinks', { sinks: false }],
    ['no attention biases', { attnBias: false }],
    ['plain rope frequencies', { freq: [1, 0.5, 0.25, 0.125] }],
    ['no YaRN attention factor', { attnFactor: 1 }],
    ['the attention factor on q.k once instead of squared', { attnFactor: Math.sqrt(OSS_ATTN_FACTOR) }],
    ['no sliding window', { windows: [null, null] }],
    ['the window on the odd layer', { windows: [null, 3] }],
    ['no router bias', { routerBias: false }],
    ['softmax over all experts, not renormalised', { softmaxOverAll: true }],
    ['gate and up as halves, not interleaved', { interleaved: false }],
    ['no clamp', { limit: Infinity }],
    ['silu (alpha 1) instead of alpha 1.702', { alpha: 1 }],
    ['up without the + 1', { upPlusOne: false }],
    ['the high nibble first', { highNibbleFirst: true }],
  ])('%s changes the logits', (_label, change) => {
    const got = referenceLogits(model(), seq);
    expect(maxDiff(got, gptOssByHand(w, change, seq).logits)).toBeGreaterThan(1e-4);
  });

  it('a sink by itself: with q = 0 each of the n visible keys weighs 1 / (n + e^sink), so the weights sum to n / (n + e^sink)', () => {
    // q weights and bias zero: every score is 0. Experts' down blocks and biases zero: the MLP adds 0.
    const quiet: OssWeights = {
      ...w,
      layers: w.layers.map((L) => ({ ...L, q: zeros(L.q.length), qb: zeros(L.qb.length), down: zeros(L.down.length), downBias: zeros(L.downBias.length) })),
    };
    const m = handModel(gptOssHandConfig, gptOssTensors(quiet));
    const keysV = quiet.layers.map(() => [] as number[][]);
    const want = seq.map((t, pos) => {
      let x = row(w.embed, t, OH);
      quiet.layers.forEach((L, l) => {
        keysV[l]!.push(add(mv(L.v, norm(x, L.inNorm)), L.vb));
        const n = l === 0 ? Math.min(pos + 1, 3) : pos + 1;
        const visible = keysV[l]!.slice(pos + 1 - n);
        const mean = visible.reduce((acc, v) => add(acc, v), zeros(OD)).map((v) => v / n);
        const attn = L.sinks.flatMap((s) => mean.map((v) => v * (n / (n + Math.exp(s)))));
        x = add(x, add(mv(L.o, attn), L.ob));
      });
      return mv(w.lm, norm(x, w.final));
    });
    expectRowsClose(referenceLogits(m, seq), want, 10);
  });

  it('layer_types, when present, decides which layers slide', () => {
    const m = handModel({ ...gptOssHandConfig, layer_types: ['full_attention', 'sliding_attention'] }, gptOssTensors(w));
    expect(m.config.slidingWindow).toEqual([null, 3]);
    expectRowsClose(referenceLogits(m, seq), gptOssByHand(w, { windows: [null, 3] }, seq).logits, 10);
    expect(() => handModel({ ...gptOssHandConfig, layer_types: ['full_attention'] }, gptOssTensors(w))).toThrow(/layer_types/);
  });
});

// ---------------------------------------------------------------- published-layout checkpoints

function publishedModel(name: string, family: PublishedFamily, opts: PublishedCheckpointOptions = {}) {
  const dir = join(root, name);
  const ck = writePublishedCheckpoint(dir, family, opts);
  return { ck, m: loadReferenceModel(dir), dir };
}

const SEQ = Array.from({ length: 40 }, (_, i) => (i * 731 + 17) % 2051);

describe('published-layout checkpoints in the reference', () => {
  it.each(PUBLISHED_FAMILIES.flatMap((f) => [[f, 'bf16'], [f, 'f32']] as const))('%s (%s) loads and gives finite, spread, non-degenerate logits', (family, dtype) => {
    const { m } = publishedModel(`${family}-${dtype}`, family, { dtype });
    expect(m.config.vocabSize).toBe(2051);
    const logits = referenceLogits(m, SEQ);
    const gaps = logits.map((r) => logitsTopGap(r)).sort((a, b) => a - b);
    for (const r of logits) {
      expect(r.every(Number.isFinite)).toBe(true);
      expect(Math.max(...softmax(r))).toBeLessThan(0.99); // not one-hot
      const mean = r.reduce((a, b) => a + b, 0) / r.length;
      const std = Math.sqrt(r.reduce((a, b) => a + (b - mean) ** 2, 0) / r.length);
      expect(std).toBeGreaterThan(1);
      expect(std).toBeLessThan(10);
    }
    expect(gaps[gaps.length >> 1]).toBeGreaterThan(0.1); // median top-1/top-2 gap: not ties everywhere
    expect(new Set(logits.map((r) => r.indexOf(Math.max(...r)))).size).toBeGreaterThan(10);
    expect(new Set(referenceGreedy(m, SEQ.slice(0, 4), 24)).size).toBeGreaterThanOrEqual(6);
  });

  it('is deterministic, and bf16 is the f32 weights rounded to nearest even', () => {
    const a = readFileSync(join(publishedModel('det-a', 'mixtral', { seed: 3 }).dir, 'model.safetensors'));
    const b = readFileSync(join(publishedModel('det-b', 'mixtral', { seed: 3 }).dir, 'model.safetensors'));
    const c = readFileSync(join(publishedModel('det-c', 'mixtral', { seed: 4 }).dir, 'model.safetensors'));
    expect(a.equals(b)).toBe(true);
    expect(a.equals(c)).toBe(false);
    const path = join(root, 'rne.safetensors');
    // bf16 keeps 7 fraction bits: 1 + 2^-8 and 1 + 3 * 2^-8 are ties, going to the even neighbour.
    writeSafetensorsFile(path, [{ name: 'x', shape: [4], data: [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5] }], 'bf16');
    expect(Array.from(readSafetensorsFile(path).get('x')!.data)).toEqual([1, 1 + 2 ** -6, 1 + 2 ** -7, -2.5]);
    const f32 = loadReferenceModel(publishedModel('q-f32', 'qwen3-moe', { dtype: 'f32' }).dir);
    const bf16 = loadReferenceModel(publishedModel('q-bf16', 'qwen3-moe', { dtype: 'bf16' }).dir);
    const w32 = f32.layers[0]!.moe!.experts[3]!.up.w;
    bf16.layers[0]!.moe!.experts[3]!.up.w.forEach((v, i) => expect(Math.abs(v - w32[i]!)).toBeLessThanOrEqual(Math.abs(w32[i]!) * 2 ** -8));
  });

  it('qwen3-moe: layer 1 dense by mlp_only_layers; decoder_sparse_step 2 makes the odd layers sparse', () => {
    const { ck, m } = publishedModel('qwen3-moe-layers', 'qwen3-moe');
    expect(ck.config.mlp_only_layers).toEqual([1]);
    expect(m.layers.map((L) => L.moe !== null)).toEqual([true, false, true]);
    expect(ck.tensorNames).toContain('model.layers.1.mlp.gate_proj.weight');
    expect(ck.tensorNames).toContain('model.layers.2.mlp.experts.7.down_proj.weight');
    expect(ck.tensorNames).not.toContain('model.layers.1.mlp.gate.weight');
    const step = publishedModel('qwen3-moe-step', 'qwen3-moe', { config: { mlp_only_layers: [], decoder_sparse_step: 2, num_hidden_layers: 4 } });
    expect(step.m.layers.map((L) => L.moe !== null)).toEqual([false, true, false, true]);
    expect(step.m.config.moe).toMatchObject({ numExperts: 8, topK: 2, normTopK: true, expertIntermediateSize: 32 });
  });

  it('mixtral: block_sparse_moe experts w1/w3/w2, head_dim from hidden / heads', () => {
    const { ck, m } = publishedModel('mixtral-layout', 'mixtral');
    expect(ck.config).not.toHaveProperty('head_dim');
    expect(m.config.headDim).toBe(16);
    expect(ck.tensorNames).toContain('model.layers.1.block_sparse_moe.experts.3.w3.weight');
    expect(m.layers.every((L) => L.moe?.experts.length === 4)).toBe(true);
  });

  it('gemma3: the sliding pattern and the two rope bases; windows matter from position 8 on', () => {
    const { ck, m } = publishedModel('gemma3-layout', 'gemma3');
    expect(ck.config).not.toHaveProperty('layer_types');
    expect(m.config.slidingWindow).toEqual([8, null, 8, null]);
    expect(Array.from(m.layers[0]!.invFreq)).toEqual(Array.from(ropeInvFreq(16, 10000, null)));
    expect(Array.from(m.layers[1]!.invFreq)).toEqual(Array.from(ropeInvFreq(16, 1e6, null)));
    const wide = publishedModel('gemma3-wide', 'gemma3', { config: { sliding_window: 4096 } }).m;
    const a = referenceLogits(m, SEQ);
    const b = referenceLogits(wide, SEQ);
    for (let i = 0; i < SEQ.length; i++) {
      const d = Math.max(...a[i]!.map((v, j) => Math.abs(v - b[i]![j]!)));
      if (i < 8) expect(d).toBe(0);
      else expect(d).toBeGreaterThan(1e-3);
    }
    const typed = publishedModel('gemma3-types', 'gemma3', { config: { layer_types: ['full_attention', 'sliding_attention', 'full_attention', 'sliding_attention'] } }).m;
    expect(typed.config.slidingWindow).toEqual([null, 8, null, 8]);
  });

  it('gemma3-multimodal: Gemma3TextConfig defaults, local rope unscaled, global scaled, vision tensors present and unread', () => {
    const { ck, m } = publishedModel('gemma3-mm-layout', 'gemma3-multimodal');
    expect(ck.tensorNames.some((n) => n.startsWith('vision_tower.'))).toBe(true);
    expect(ck.tensorNames.some((n) => n.startsWith('multi_modal_projector.'))).toBe(true);
    expect(ck.tensorNames.every((n) => !n.startsWith('model.'))).toBe(true);
    expect(ck.config.text_config).not.toHaveProperty('rope_theta');
    expect(m.config).toMatchObject({ ropeTheta: 1e6, ropeLocalTheta: 10000, rmsNormEps: 1e-6, hiddenAct: 'gelu_tanh', tieWordEmbeddings: true });
    expect(m.config.attnScale).toBe(1 / Math.sqrt(24));
    expect(m.config.slidingWindow).toEqual([8, 8, 8, 8, 8, null]);
    expect(Array.from(m.layers[5]!.invFreq)).toEqual(Array.from(ropeInvFreq(16, 1e6, { rope_type: 'linear', factor: 8 })));
    expect(Array.from(m.layers[0]!.invFreq)).toEqual(Array.from(ropeInvFreq(16, 10000, null)));
  });

  it('the Q8_0 reference quantizes expert projections and keeps routers', () => {
    const { m } = publishedModel('mixtral-q8', 'mixtral', { dtype: 'f32' });
    const q = quantizeReferenceQ8(m);
    expect(q.layers[0]!.moe!.router).toBe(m.layers[0]!.moe!.router);
    expect(q.layers[0]!.moe!.experts[2]!.down.w).not.toEqual(m.layers[0]!.moe!.experts[2]!.down.w);
    const a = referenceLogits(m, SEQ.slice(0, 6));
    const b = referenceLogits(q, SEQ.slice(0, 6));
    expect(maxDiff(b, a.map((r) => Array.from(r)))).toBeLessThan(0.5);
  });

  it('gpt-oss: the published names and dtypes (U8 blocks and scales), alternating windows, YaRN over the first pairs', () => {
    const { ck, m, dir } = publishedModel('gpt-oss-layout', 'gpt-oss');
    const file = readFileSync(join(dir, 'model.safetensors'));
    const header = JSON.parse(file.subarray(8, 8 + Number(file.readBigUInt64LE(0))).toString('utf8')) as Record<string, { dtype: string; shape: number[] }>;
    const x = 'mlp.experts';
    expect(header[`model.layers.0.${x}.gate_up_proj_blocks`]).toMatchObject({ dtype: 'U8', shape: [4, 128, 2, 16] });
    expect(header[`model.layers.0.${x}.gate_up_proj_scales`]).toMatchObject({ dtype: 'U8', shape: [4, 128, 2] });
    expect(header[`model.layers.0.${x}.gate_up_proj_bias`]).toMatchObject({ dtype: 'BF16', shape: [4, 128] });
    expect(header[`model.layers.3.${x}.down_proj_blocks`]).toMatchObject({ dtype: 'U8', shape: [4, 64, 2, 16] });
    expect(header[`model.layers.3.${x}.down_proj_scales`]).toMatchObject({ dtype: 'U8', shape: [4, 64, 2] });
    expect(header[`model.layers.3.${x}.down_proj_bias`]).toMatchObject({ dtype: 'BF16', shape: [4, 64] });
    expect(header['model.layers.1.self_attn.sinks']).toMatchObject({ dtype: 'BF16', shape: [4] });
    for (const n of ['q_proj', 'k_proj', 'v_proj', 'o_proj']) expect(ck.tensorNames).toContain(`model.layers.2.self_attn.${n}.bias`);
    expect(ck.tensorNames).toContain('model.layers.2.mlp.router.bias');
    expect(ck.config.quantization_config.quant_method).toBe('mxfp4');
    expect(m.config.moe).toMatchObject({ numExperts: 4, topK: 2, expertIntermediateSize: 64, routing: 'topk-softmax', swigluLimit: 7 });
    expect(m.config.slidingWindow).toEqual([8, null, 8, null]);
    expect(publishedModel('gpt-oss-no-types', 'gpt-oss', { config: { layer_types: undefined } }).m.config.slidingWindow).toEqual([8, null, 8, null]);
    // head_dim 16, base 150000, 128 original positions: low < 0 and high in (2, 3), so the ramp i / high
    // leaves pair 0 as it is, blends pairs 1 and 2 and divides the rest by 32.
    const high = (16 * Math.log(128 / (2 * Math.PI))) / (2 * Math.log(150000));
    expect(high).toBeGreaterThan(2);
    expect(high).toBeLessThan(3);
    const want = Array.from({ length: 8 }, (_, i) => {
      const [f, r] = [150000 ** (-i / 8), Math.min(i / high, 1)];
      return f * (1 - r) + (f / 32) * r;
    });
    for (const L of m.layers) {
      expectClose(L.invFreq, want);
      expect(L.ropeScale).toBeCloseTo(1 + 0.1 * Math.log(32), 15);
    }
  });

  it('gpt-oss: the sinks, the clamp, YaRN and the windows each move its logits', () => {
    const seq = SEQ.slice(0, 12);
    const load = (config?: Record<string, unknown>) => publishedModel(`gpt-oss-${counter++}`, 'gpt-oss', { dtype: 'f32', config }).m;
    const base = referenceLogits(load(), seq).map((r) => Array.from(r));
    const noClamp = load();
    noClamp.config.moe!.swigluLimit = Infinity;
    expect(maxDiff(referenceLogits(noClamp, seq), base)).toBeGreaterThan(0.1);
    const noSinks = load();
    for (const L of noSinks.layers) L.sinks!.fill(-Infinity);
    expect(maxDiff(referenceLogits(noSinks, seq), base)).toBeGreaterThan(0.1);
    expect(maxDiff(referenceLogits(load({ rope_scaling: null }), seq), base)).toBeGreaterThan(0.1);
    const wide = referenceLogits(load({ sliding_window: 4096 }), seq);
    seq.forEach((_, i) => {
      const d = Math.max(...wide[i]!.map((v, j) => Math.abs(v - base[i]![j]!)));
      if (i < 8) expect(d).toBe(0);
      else expect(d).toBeGreaterThan(1e-3);
    });
  });

  it('yarn rope_scaling in other families: Qwen3-MoE on every layer, Gemma 3 on its full layers only', () => {
    const scaling = { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 1024 };
    const q = publishedModel('qwen3-moe-yarn', 'qwen3-moe', { config: { rope_scaling: scaling } }).m;
    for (const L of q.layers) {
      expect(L.invFreq).toEqual(ropeInvFreq(16, 1e6, scaling));
      expect(L.ropeScale).toBeCloseTo(1 + 0.1 * Math.log(4), 15);
    }
    expect(q.layers[0]!.invFreq).not.toEqual(ropeInvFreq(16, 1e6, null));
    const plain = referenceLogits(publishedModel('qwen3-moe-plain', 'qwen3-moe').m, SEQ.slice(0, 6)).map((r) => Array.from(r));
    expect(maxDiff(referenceLogits(q, SEQ.slice(0, 6)), plain)).toBeGreaterThan(1e-3);
    const g = publishedModel('gemma3-yarn', 'gemma3', { config: { rope_scaling: scaling } }).m;
    expect(g.layers.map((L) => L.ropeScale)).toEqual([1, ropeAttentionFactor(scaling), 1, ropeAttentionFactor(scaling)]);
  });
});
