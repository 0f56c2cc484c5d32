// The float64 reference's Qwen3-MoE, Mixtral and Gemma 3 support, against forward passes written out
// plainly here, and the published-layout checkpoints of test/helpers/published-checkpoints.ts.

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
  type ReferenceModel,
  geluTanh,
  loadReferenceModel,
  logitsTopGap,
  referenceGreedy,
  referenceLogits,
  ropeInvFreq,
  routeTopK,
  softmax,
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
});
