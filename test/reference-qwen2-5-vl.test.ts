// The float64 Qwen2.5-VL reference (test/reference/qwen2-5-vl.ts) against hand-worked positions,
// windows and rotary angles, a vision tower written out plainly here (natural patch order, windows
// as a mask: no reordering), and the text-only reference on the same weights.

import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type WrittenTensor, writeSafetensorsFile } from './helpers/published-checkpoints.js';
import {
  type Grid,
  type Qwen25VisionConfig,
  type Qwen25VisionWeights,
  Qwen25VlSession,
  applyMrope,
  applyVisionRope,
  erf,
  loadQwen25VlReference,
  mropePositions,
  parseVisionConfig,
  visionEncode,
  visionInvFreq,
  visionPatchPositions,
  visionWindowIndex,
} from './reference/qwen2-5-vl.js';
import { applyRope, loadReferenceModel, referenceLogits } from './reference/reference-model.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-reference-qwen2-5-vl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Deterministic, f32-exact values. */
const vals = (n: number, seed: number, scale = 0.5) => Array.from({ length: n }, (_, i) => Math.fround(Math.sin(seed * 13.7 + i * 1.3 + 0.4) * scale));
const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};
const mv = (w: ArrayLike<number>, b: ArrayLike<number> | null, x: number[]) =>
  Array.from({ length: w.length / x.length }, (_, r) => x.reduce((a, v, c) => a + w[r * x.length + c]! * v, b ? b[r]! : 0));
const rms = (x: number[], w: ArrayLike<number>) => {
  const r = 1 / Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + 1e-6);
  return x.map((v, i) => v * r * w[i]!);
};
const gelu = (x: number) => 0.5 * x * (1 + erf(x / Math.SQRT2));
const silu = (x: number) => x / (1 + Math.exp(-x));

// ---------------------------------------------------------------- a tiny vision tower

/** patch 2, temporal 2, 3 channels (24 values a row), hidden 8, merge 2, windows of 2x2 merged tokens. */
const VISION_RAW = {
  depth: 2, hidden_size: 8, hidden_act: 'silu', intermediate_size: 6, num_heads: 2, in_channels: 3, patch_size: 2,
  spatial_merge_size: 2, temporal_patch_size: 2, tokens_per_second: 2, window_size: 8, out_hidden_size: 16, fullatt_block_indexes: [1],
};

function visionTensors(vc: Qwen25VisionConfig, prefix: string, seed: number): WrittenTensor[] {
  const h = vc.hiddenSize;
  const i = vc.intermediateSize;
  const merged = h * vc.spatialMergeSize ** 2;
  const out: WrittenTensor[] = [];
  let s = seed;
  const t = (name: string, shape: number[], scale = 0.5, offset = 0) => {
    const n = shape.reduce((a, b) => a * b, 1);
    out.push({ name: `${prefix}.${name}`, shape, data: vals(n, s++, scale).map((v) => Math.fround(v + offset)) });
  };
  t('patch_embed.proj.weight', [h, vc.inChannels, vc.temporalPatchSize, vc.patchSize, vc.patchSize], 0.3);
  for (let b = 0; b < vc.depth; b++) {
    const p = `blocks.${b}`;
    t(`${p}.norm1.weight`, [h], 0.2, 1);
    t(`${p}.norm2.weight`, [h], 0.2, 1);
    t(`${p}.attn.qkv.weight`, [3 * h, h], 0.8);
    t(`${p}.attn.qkv.bias`, [3 * h], 0.2);
    t(`${p}.attn.proj.weight`, [h, h]);
    t(`${p}.attn.proj.bias`, [h], 0.1);
    t(`${p}.mlp.gate_proj.weight`, [i, h]);
    t(`${p}.mlp.gate_proj.bias`, [i], 0.1);
    t(`${p}.mlp.up_proj.weight`, [i, h]);
    t(`${p}.mlp.up_proj.bias`, [i], 0.1);
    t(`${p}.mlp.down_proj.weight`, [h, i]);
    t(`${p}.mlp.down_proj.bias`, [h], 0.1);
  }
  t('merger.ln_q.weight', [h], 0.2, 1);
  t('merger.mlp.0.weight', [merged, merged], 0.4);
  t('merger.mlp.0.bias', [merged], 0.1);
  t('merger.mlp.2.weight', [vc.outHiddenSize, merged], 0.4);
  t('merger.mlp.2.bias', [vc.outHiddenSize], 0.1);
  return out;
}

/** The weights as visionEncode takes them, straight from the written tensors. */
function visionWeights(vc: Qwen25VisionConfig, tensors: WrittenTensor[], prefix: string): Qwen25VisionWeights {
  const by = new Map(tensors.map((x) => [x.name.slice(prefix.length + 1), Float64Array.from(x.data)]));
  const g = (n: string) => by.get(n)!;
  const lin = (n: string, out: number, inp: number) => ({ w: g(`${n}.weight`), b: g(`${n}.bias`), out, in: inp });
  const h = vc.hiddenSize;
  const i = vc.intermediateSize;
  const merged = h * vc.spatialMergeSize ** 2;
  return {
    patchEmbed: g('patch_embed.proj.weight'),
    blocks: Array.from({ length: vc.depth }, (_, b) => ({
      norm1: g(`blocks.${b}.norm1.weight`),
      norm2: g(`blocks.${b}.norm2.weight`),
      qkv: lin(`blocks.${b}.attn.qkv`, 3 * h, h),
      proj: lin(`blocks.${b}.attn.proj`, h, h),
      mlp: { gate: lin(`blocks.${b}.mlp.gate_proj`, i, h), up: lin(`blocks.${b}.mlp.up_proj`, i, h), down: lin(`blocks.${b}.mlp.down_proj`, h, i) },
    })),
    merger: { lnQ: g('merger.ln_q.weight'), fc1: lin('merger.mlp.0', merged, merged), fc2: lin('merger.mlp.2', vc.outHiddenSize, merged) },
  };
}

/** A seeded image as patch vectors by (frame, row, col), and its pixel_values rows in the processor's order. */
function image(vc: Qwen25VisionConfig, grid: Grid, seed: number) {
  const [t, h, w] = grid;
  const m = vc.spatialMergeSize;
  const n = vc.inChannels * vc.temporalPatchSize * vc.patchSize * vc.patchSize;
  const patch = (f: number, r: number, c: number) => vals(n, seed + f * 1000 + r * 37 + c * 3, 1);
  const rows: number[] = [];
  for (let f = 0; f < t; f++) {
    for (let br = 0; br < h / m; br++) {
      for (let bc = 0; bc < w / m; bc++) {
        for (let r = 0; r < m; r++) for (let c = 0; c < m; c++) rows.push(...patch(f, br * m + r, bc * m + c));
      }
    }
  }
  return { patch, pixelValues: Float32Array.from(rows) };
}

/**
 * The vision tower written plainly: patches in (frame, row, col) order, window attention as a mask
 * (same frame and same window of ws x ws merged tokens, i.e. of merge*ws patches a side), the
 * merger over each merge x merge square; output by merged token in row-major order.
 */
function plainVision(vc: Qwen25VisionConfig, wt: Qwen25VisionWeights, grid: Grid, patch: (f: number, r: number, c: number) => number[]): number[][] {
  const [t, h, w] = grid;
  const m = vc.spatialMergeSize;
  const side = m * Math.floor(vc.windowSize / m / vc.patchSize); // a window's side in patches
  const nh = vc.numHeads;
  const d = vc.hiddenSize / nh;
  const cells: [number, number, number][] = [];
  for (let f = 0; f < t; f++) for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) cells.push([f, r, c]);
  const conv = Array.from(wt.patchEmbed);
  let xs = cells.map(([f, r, c]) => mv(conv, null, patch(f, r, c)));
  const rope = (v: number[], r: number, c: number) => {
    const out = [...v];
    for (let hd = 0; hd < nh; hd++) {
      for (let i = 0; i < d / 2; i++) {
        const k = i < d / 4 ? i : i - d / 4;
        const a = (i < d / 4 ? r : c) * Math.pow(10000, (-4 * k) / d);
        const x1 = v[hd * d + i]!;
        const x2 = v[hd * d + d / 2 + i]!;
        out[hd * d + i] = x1 * Math.cos(a) - x2 * Math.sin(a);
        out[hd * d + d / 2 + i] = x2 * Math.cos(a) + x1 * Math.sin(a);
      }
    }
    return out;
  };
  wt.blocks.forEach((b, l) => {
    const full = vc.fullattBlockIndexes.includes(l);
    const see = (p: number, q: number) => {
      const [f1, r1, c1] = cells[p]!;
      const [f2, r2, c2] = cells[q]!;
      if (f1 !== f2) return false;
      return full || (Math.floor(r1 / side) === Math.floor(r2 / side) && Math.floor(c1 / side) === Math.floor(c2 / side));
    };
    const hs = xs.map((x) => rms(x, b.norm1));
    const qkv = hs.map((x) => mv(b.qkv.w, b.qkv.b, x));
    const H = vc.hiddenSize;
    const q = qkv.map((v, p) => rope(v.slice(0, H), cells[p]![1], cells[p]![2]));
    const k = qkv.map((v, p) => rope(v.slice(H, 2 * H), cells[p]![1], cells[p]![2]));
    const v = qkv.map((x) => x.slice(2 * H));
    xs = xs.map((x, p) => {
      const attn = new Array<number>(H).fill(0);
      for (let hd = 0; hd < nh; hd++) {
        const js = cells.map((_, j) => j).filter((j) => see(p, j));
        const s = js.map((j) => q[p]!.slice(hd * d, hd * d + d).reduce((a, e, i) => a + e * k[j]![hd * d + i]!, 0) / Math.sqrt(d));
        const mx = Math.max(...s);
        const e = s.map((z) => Math.exp(z - mx));
        const z = e.reduce((a, b2) => a + b2, 0);
        js.forEach((j, n) => {
          for (let i = 0; i < d; i++) attn[hd * d + i]! += (e[n]! / z) * v[j]![hd * d + i]!;
        });
      }
      const y = x.map((e, i) => e + mv(b.proj.w, b.proj.b, attn)[i]!);
      const hn = rms(y, b.norm2);
      const g = mv(b.mlp.gate.w, b.mlp.gate.b, hn);
      const u = mv(b.mlp.up.w, b.mlp.up.b, hn);
      const mo = mv(b.mlp.down.w, b.mlp.down.b, g.map((e, i) => silu(e) * u[i]!));
      return y.map((e, i) => e + mo[i]!);
    });
  });
  const at = (f: number, r: number, c: number) => xs[(f * h + r) * w + c]!;
  const out: number[][] = [];
  for (let f = 0; f < t; f++) {
    for (let gr = 0; gr < h / m; gr++) {
      for (let gc = 0; gc < w / m; gc++) {
        const cat: number[] = [];
        for (let r = 0; r < m; r++) for (let c = 0; c < m; c++) cat.push(...rms(at(f, gr * m + r, gc * m + c), wt.merger.lnQ));
        out.push(mv(wt.merger.fc2.w, wt.merger.fc2.b, mv(wt.merger.fc1.w, wt.merger.fc1.b, cat).map(gelu)));
      }
    }
  }
  return out;
}

describe('qwen2.5-vl vision pieces', () => {
  it('erf and the exact GELU', () => {
    // erf values to 16 digits (Abramowitz & Stegun table 7.1 / any CAS).
    expect(erf(0)).toBe(0);
    expect(erf(0.5)).toBeCloseTo(0.5204998778130465, 15);
    expect(erf(1)).toBeCloseTo(0.8427007929497149, 15);
    expect(erf(-2)).toBeCloseTo(-0.9953222650189527, 15);
    expect(erf(3)).toBeCloseTo(0.9999779095030014, 15);
    expect(erf(10)).toBe(1);
    expect(gelu(1)).toBeCloseTo(0.8413447460685429, 15); // Phi(1)
  });

  it('patch positions follow the processor: merge-group row, group column, row, column', () => {
    expect(visionPatchPositions([1, 4, 4], 2)).toEqual([
      [0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3],
      [2, 0], [2, 1], [3, 0], [3, 1], [2, 2], [2, 3], [3, 2], [3, 3],
    ]);
    expect(visionPatchPositions([2, 2, 2], 2)).toEqual([[0, 0], [0, 1], [1, 0], [1, 1], [0, 0], [0, 1], [1, 0], [1, 1]]);
  });

  it('vision rotary angles: rows on the first quarter pairs, columns on the second', () => {
    const inv = visionInvFreq(8); // rotary dim 4: 1 / 10000^(0/4), 1 / 10000^(2/4)
    expect(Array.from(inv)).toEqual([1, 0.01]);
    const x = Float64Array.from([1, 2, 3, 4, 5, 6, 7, 8]);
    applyVisionRope(x, 0, 8, 3, 5, inv);
    const angles = [3, 0.03, 5, 0.05]; // (row 3, col 5)
    const want = [1, 2, 3, 4, 5, 6, 7, 8];
    for (let i = 0; i < 4; i++) {
      const [a, b] = [want[i]!, want[i + 4]!];
      want[i] = a * Math.cos(angles[i]!) - b * Math.sin(angles[i]!);
      want[i + 4] = b * Math.cos(angles[i]!) + a * Math.sin(angles[i]!);
    }
    expect(maxDiff(x, want)).toBeLessThan(1e-15);
  });

  it('window index: 2x2 windows over a 4x6 merged grid, padded ones, evenly divided ones', () => {
    const vc = parseVisionConfig(VISION_RAW); // window 8 px / merge 2 / patch 2 = 2 merged tokens a side
    expect(visionWindowIndex([1, 8, 12], vc)).toEqual({
      windowIndex: [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, 12, 13, 18, 19, 14, 15, 20, 21, 16, 17, 22, 23],
      cuWindowSeqlens: [0, 16, 32, 48, 64, 80, 96],
    });
    // 3x5 merged: transformers pads to 4x6 with -100, windows keep only real tokens.
    expect(visionWindowIndex([1, 6, 10], vc)).toEqual({
      windowIndex: [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14],
      cuWindowSeqlens: [0, 16, 32, 40, 48, 56, 60],
    });
    // 4x4 merged: padded by a whole empty window each way; unique_consecutive drops the repeats.
    expect(visionWindowIndex([1, 8, 8], vc)).toEqual({
      windowIndex: [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15],
      cuWindowSeqlens: [0, 16, 32, 48, 64],
    });
    // Two frames: the second frame's windows follow, its tokens offset by a frame.
    const two = visionWindowIndex([2, 4, 4], vc);
    expect(two.windowIndex).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(two.cuWindowSeqlens).toEqual([0, 16, 32]);
  });

  it('reordering into windows and back (argsort) is the identity', () => {
    const vc = parseVisionConfig(VISION_RAW);
    for (const grid of [[1, 8, 12], [1, 6, 10], [2, 6, 4], [1, 14, 2]] as Grid[]) {
      const { windowIndex } = visionWindowIndex(grid, vc);
      const n = (grid[0] * grid[1] * grid[2]) / 4;
      expect([...windowIndex].sort((a, b) => a - b)).toEqual(Array.from({ length: n }, (_, i) => i));
      const reverse = Array.from({ length: n }, (_, i) => i).sort((a, b) => windowIndex[a]! - windowIndex[b]!);
      expect(reverse.map((k) => windowIndex[k])).toEqual(Array.from({ length: n }, (_, i) => i));
    }
  });

  it('depth 0: the merger folds each 2x2 group of consecutive rows, after the Conv3d as a matvec', () => {
    const vc = parseVisionConfig({ ...VISION_RAW, depth: 0 });
    const tensors = visionTensors(vc, 'visual', 7);
    const wt = visionWeights(vc, tensors, 'visual');
    const grid: Grid = [1, 4, 6];
    const { pixelValues } = image(vc, grid, 3);
    const got = visionEncode(wt, vc, pixelValues, grid);
    const H = vc.hiddenSize;
    // Conv3d with kernel = stride = (2, 2, 2) on one [3, 2, 2, 2] patch: a sum over all four indices.
    const conv = (row: number) => Array.from({ length: H }, (_, o) => {
      let s = 0;
      for (let c = 0; c < 3; c++) for (let tp = 0; tp < 2; tp++) for (let y = 0; y < 2; y++) for (let x = 0; x < 2; x++) {
        const k = ((c * 2 + tp) * 2 + y) * 2 + x;
        s += wt.patchEmbed[o * 24 + k]! * pixelValues[row * 24 + k]!;
      }
      return s;
    });
    for (let k = 0; k < 6; k++) {
      const cat = [0, 1, 2, 3].flatMap((r) => rms(conv(4 * k + r), wt.merger.lnQ));
      const want = mv(wt.merger.fc2.w, wt.merger.fc2.b, mv(wt.merger.fc1.w, wt.merger.fc1.b, cat).map(gelu));
      expect(maxDiff(got.subarray(k * 16, (k + 1) * 16), want)).toBeLessThan(1e-12);
    }
  });

  it('the vision tower matches a plain masked forward in natural patch order', () => {
    const vc = parseVisionConfig(VISION_RAW);
    const wt = visionWeights(vc, visionTensors(vc, 'visual', 11), 'visual');
    for (const grid of [[1, 8, 12], [1, 6, 10], [2, 4, 6]] as Grid[]) {
      const { patch, pixelValues } = image(vc, grid, 5);
      const got = visionEncode(wt, vc, pixelValues, grid);
      const want = plainVision(vc, wt, grid, patch);
      expect(maxDiff(got, want.flat())).toBeLessThan(1e-11);
    }
  });

  it('window attention equals full attention when one window covers the image, and differs otherwise', () => {
    const grid: Grid = [1, 8, 12];
    const wide = parseVisionConfig({ ...VISION_RAW, window_size: 24 }); // 6 merged tokens a side >= 4x6
    const wt = visionWeights(wide, visionTensors(wide, 'visual', 13), 'visual');
    const { pixelValues } = image(wide, grid, 9);
    const windowed = visionEncode(wt, { ...wide, fullattBlockIndexes: [] }, pixelValues, grid);
    const full = visionEncode(wt, { ...wide, fullattBlockIndexes: [0, 1] }, pixelValues, grid);
    expect(maxDiff(windowed, full)).toBeLessThan(1e-13);
    const narrow = visionEncode(wt, { ...wide, windowSize: 8, fullattBlockIndexes: [] }, pixelValues, grid);
    expect(maxDiff(narrow, full)).toBeGreaterThan(1e-3);
  });
});

// ---------------------------------------------------------------- M-RoPE

const TOKENS = { imageTokenId: 35, visionStartTokenId: 33, spatialMergeSize: 2 };
const VS = 33;
const VE = 34;
const IMG = 35;

describe('qwen2.5-vl M-RoPE', () => {
  it('positions of a prompt with one 4x6 merged image (grid [1, 8, 12]), worked by hand', () => {
    const ids = [1, 2, VS, ...new Array(24).fill(IMG), VE, 3, 4];
    const { positions, deltas } = mropePositions(ids, [[1, 8, 12]], TOKENS);
    const row = [3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6];
    const col = [3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8];
    expect(positions[0]).toEqual([0, 1, 2, ...new Array(24).fill(3), 9, 10, 11]);
    expect(positions[1]).toEqual([0, 1, 2, ...row, 9, 10, 11]);
    expect(positions[2]).toEqual([0, 1, 2, ...col, 9, 10, 11]);
    expect(deltas).toBe(12 - 30);
  });

  it('two images, text only, and a grid that does not match the placeholders', () => {
    const ids = [VS, IMG, VE, VS, IMG, IMG, VE];
    const { positions, deltas } = mropePositions(ids, [[1, 2, 2], [1, 2, 4]], TOKENS);
    expect(positions).toEqual([[0, 1, 2, 3, 4, 4, 6], [0, 1, 2, 3, 4, 4, 6], [0, 1, 2, 3, 4, 5, 6]]);
    expect(deltas).toBe(7 - 7);
    expect(mropePositions([5, 6, 7], [], TOKENS)).toEqual({ positions: [[0, 1, 2], [0, 1, 2], [0, 1, 2]], deltas: 0 });
    expect(() => mropePositions([VS, IMG, VE], [[1, 4, 4]], TOKENS)).toThrow(/fewer than 4/);
    expect(() => mropePositions([VS, IMG, VE], [], TOKENS)).toThrow(/1 images/);
  });

  it('applyMrope takes pair i\'s angle from its section\'s component', () => {
    const inv = Float64Array.from([1, 0.3, 0.1, 0.02]);
    const x = Float64Array.from([1, -2, 3, 0.5, 2, 1, -1, 4]);
    const want = Array.from(x);
    applyMrope(x, 0, 8, [5, 7, 11], inv, [2, 1, 1]);
    const angles = [5 * 1, 5 * 0.3, 7 * 0.1, 11 * 0.02];
    for (let i = 0; i < 4; i++) {
      const [a, b] = [want[i]!, want[i + 4]!];
      want[i] = a * Math.cos(angles[i]!) - b * Math.sin(angles[i]!);
      want[i + 4] = b * Math.cos(angles[i]!) + a * Math.sin(angles[i]!);
    }
    expect(maxDiff(x, want)).toBeLessThan(1e-15);
    // The published [16, 24, 24] on head_dim 128 with equal components is plain RoPE.
    const inv64 = Float64Array.from({ length: 64 }, (_, i) => 1 / Math.pow(1e6, (2 * i) / 128));
    const y = Float64Array.from(vals(128, 3));
    const z = Float64Array.from(y);
    applyMrope(y, 0, 128, [9, 9, 9], inv64, [16, 24, 24]);
    applyRope(z, 0, 128, 9, inv64);
    expect(maxDiff(y, z)).toBe(0);
  });
});

// ---------------------------------------------------------------- the whole model from disk

const TEXT = {
  vocab_size: 40, hidden_size: 16, intermediate_size: 12, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1,
  hidden_act: 'silu', rms_norm_eps: 1e-6, rope_theta: 10000, tie_word_embeddings: false, use_sliding_window: false,
  max_position_embeddings: 128,
};

function textTensors(prefix: string): WrittenTensor[] {
  const out: WrittenTensor[] = [];
  let s = 100;
  const t = (name: string, shape: number[], scale = 0.5, offset = 0) => {
    const n = shape.reduce((a, b) => a * b, 1);
    out.push({ name, shape, data: vals(n, s++, scale).map((v) => Math.fround(v + offset)) });
  };
  const h = TEXT.hidden_size;
  const kv = (h / TEXT.num_attention_heads) * TEXT.num_key_value_heads;
  t(`${prefix}.embed_tokens.weight`, [TEXT.vocab_size, h], 0.8);
  for (let l = 0; l < TEXT.num_hidden_layers; l++) {
    const p = `${prefix}.layers.${l}`;
    t(`${p}.input_layernorm.weight`, [h], 0.2, 1);
    t(`${p}.post_attention_layernorm.weight`, [h], 0.2, 1);
    t(`${p}.self_attn.q_proj.weight`, [h, h], 0.6);
    t(`${p}.self_attn.q_proj.bias`, [h], 0.2);
    t(`${p}.self_attn.k_proj.weight`, [kv, h], 0.6);
    t(`${p}.self_attn.k_proj.bias`, [kv], 0.2);
    t(`${p}.self_attn.v_proj.weight`, [kv, h]);
    t(`${p}.self_attn.v_proj.bias`, [kv], 0.2);
    t(`${p}.self_attn.o_proj.weight`, [h, h]);
    t(`${p}.mlp.gate_proj.weight`, [TEXT.intermediate_size, h]);
    t(`${p}.mlp.up_proj.weight`, [TEXT.intermediate_size, h]);
    t(`${p}.mlp.down_proj.weight`, [h, TEXT.intermediate_size]);
  }
  t(`${prefix}.norm.weight`, [h], 0.2, 1);
  t('lm_head.weight', [TEXT.vocab_size, h], 0.8);
  return out;
}

const MROPE = { type: 'mrope', mrope_section: [2, 1, 1] }; // head_dim 8: 4 frequency pairs

/** As published: text fields at the top level, model.* and visual.* tensors. */
function writePublished(dir: string) {
  mkdirSync(dir, { recursive: true });
  const config = {
    architectures: ['Qwen2_5_VLForConditionalGeneration'], model_type: 'qwen2_5_vl', ...TEXT, rope_scaling: MROPE,
    image_token_id: IMG, video_token_id: 36, vision_start_token_id: VS, vision_end_token_id: VE, vision_config: VISION_RAW,
  };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  const vc = parseVisionConfig(VISION_RAW);
  writeSafetensorsFile(join(dir, 'model.safetensors'), [...textTensors('model'), ...visionTensors(vc, 'visual', 21)], 'f32');
}

describe('qwen2.5-vl whole model', () => {
  const dir = join(root, 'published');
  writePublished(dir);
  const model = loadQwen25VlReference(dir);
  const vc = model.visionConfig;
  const grid: Grid = [1, 4, 6]; // 2x3 merged: 6 image tokens
  const { pixelValues } = image(vc, grid, 17);
  const prompt = [1, 2, VS, ...new Array(6).fill(IMG), VE, 3, 4];

  it('text only: M-RoPE with equal components is the Qwen2 text reference on the same weights', () => {
    const qdir = join(root, 'qwen2');
    mkdirSync(qdir, { recursive: true });
    writeFileSync(join(qdir, 'config.json'), JSON.stringify({ architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', ...TEXT }));
    writeSafetensorsFile(join(qdir, 'model.safetensors'), textTensors('model'), 'f32');
    const ids = [1, 5, 9, 2, 30, 7];
    const want = referenceLogits(loadReferenceModel(qdir), ids);
    const got = new Qwen25VlSession(model).prefill(ids);
    for (let i = 0; i < ids.length; i++) expect(maxDiff(got[i]!, want[i]!)).toBeLessThan(1e-12);
  });

  it('image embeddings stand in for the placeholders at their M-RoPE positions', () => {
    const s = new Qwen25VlSession(model);
    const got = s.prefill(prompt, [{ pixelValues, grid }]);
        // By hand: 1,2,VS at 0,1,2; image (0..1 rows, 0..2 cols) from 3: t 3, h 3..4, w 3..5; VE 6, 3 at 7, 4 at 8.
    const pos = [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8], [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8], [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]];
    expect(s.ropeDelta).toBe(9 - prompt.length);
    const emb = visionEncode(model.vision, vc, pixelValues, grid);
    const manual = new Qwen25VlSession(model);
    const h = model.text.config.hiddenSize;
    prompt.forEach((tk, i) => {
      const x = tk === IMG ? emb.slice((i - 3) * h, (i - 2) * h) : model.text.embed.slice(tk * h, (tk + 1) * h);
      const want = manual.stepEmbedding(x, [pos[0]![i]!, pos[1]![i]!, pos[2]![i]!]);
      expect(maxDiff(got[i]!, want)).toBeLessThan(1e-12);
    });
    // Before the image nothing differs from the text-only run; after it, the image shows.
    const plain = new Qwen25VlSession(model).prefill(prompt.map((tk) => (tk === IMG ? 7 : tk)).map((tk) => (tk === VS ? 8 : tk)));
    expect(maxDiff(got[1]!, plain[1]!)).toBe(0);
    expect(maxDiff(got[11]!, plain[11]!)).toBeGreaterThan(1e-3);
  });

  it('decoding after prefill continues at length + deltas, as a longer prefill would place it', () => {
    const s = new Qwen25VlSession(model);
    s.prefill(prompt, [{ pixelValues, grid }]);
    const a = s.step(11);
    const b = s.step(12);
    const longer = new Qwen25VlSession(model).prefill([...prompt, 11, 12], [{ pixelValues, grid }]);
    expect(maxDiff(a, longer[prompt.length]!)).toBeLessThan(1e-12);
    expect(maxDiff(b, longer[prompt.length + 1]!)).toBeLessThan(1e-12);
  });

  it('reads the newer layout too: text_config and model.language_model.* / model.visual.* tensors', () => {
    const ndir = join(root, 'newer');
    mkdirSync(ndir, { recursive: true });
    const config = {
      architectures: ['Qwen2_5_VLForConditionalGeneration'], model_type: 'qwen2_5_vl', text_config: { ...TEXT, rope_scaling: MROPE },
      image_token_id: IMG, vision_start_token_id: VS, vision_config: VISION_RAW,
    };
    writeFileSync(join(ndir, 'config.json'), JSON.stringify(config));
    writeSafetensorsFile(join(ndir, 'model.safetensors'), [...textTensors('model.language_model'), ...visionTensors(vc, 'model.visual', 21)], 'f32');
    const want = new Qwen25VlSession(model).prefill(prompt, [{ pixelValues, grid }]);
    const got = new Qwen25VlSession(loadQwen25VlReference(ndir)).prefill(prompt, [{ pixelValues, grid }]);
    for (let i = 0; i < prompt.length; i++) expect(maxDiff(got[i]!, want[i]!)).toBe(0);
  });
});
