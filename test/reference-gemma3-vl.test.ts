// The float64 reference of Gemma 3 with images (test/reference/gemma3-vl.ts) on the maker's
// test-gemma3-vl: without images it is the text reference; the tower against a plain matrix
// transcription of transformers' SigLIP (Conv2d over the pixel array, attention as matrices, the
// projector's transpose-reshape and AvgPool2d); the projector and the mask against hand
// computations; with one token per image (no bidirectional span) against the text reference fed
// the image row; and the bidirectional span inside an image.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { resolvePreset } from '../models/presets.js';
import {
  type Gemma3VlReference, Gemma3VlSession, gemma3MayAttend, gemma3Project, imageGroups, layerNorm, loadGemma3VlReference, siglipEncode,
  siglipTower,
} from './reference/gemma3-vl.js';
import { ReferenceSession, applyRope, geluTanh, referenceLogits } from './reference/reference-model.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-reference-gemma3-vl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

/** Deterministic pixel values in [-1, 1], [3, S, S]. */
function pixels(S: number, seed: number): Float64Array {
  return Float64Array.from({ length: 3 * S * S }, (_, i) => Math.sin(i * 0.37 + seed * 1.3) * 0.9);
}

/**
 * transformers' SiglipVisionTransformer + Gemma3MultiModalProjector written as matrix code over
 * the raw tensors: [N, D] activations, Conv2d by its definition, softmax(Q K^T / sqrt(d)) V per head,
 * vision_outputs.transpose(1, 2).reshape(D, side, side), AvgPool2d, then norm and matmul.
 */
function plainSiglip(ref: Gemma3VlReference, px: Float64Array): Float64Array {
  const vc = ref.visionConfig, w = ref.vision;
  const { imageSize: S, patchSize: P, hiddenSize: D, numHeads: H } = vc;
  const side = S / P, N = side * side, dh = D / H;
  const mat = (rows: number, cols: number) => Array.from({ length: rows }, () => new Float64Array(cols));
  // Conv2d: out[o, r, c] = b[o] + sum_{ch,i,j} W[o, ch, i, j] * px[ch, r*P + i, c*P + j]; flatten(2).transpose(1, 2).
  let x = mat(N, D);
  for (let o = 0; o < D; o++) {
    for (let r = 0; r < side; r++) {
      for (let c = 0; c < side; c++) {
        let s = w.patchEmbed.b![o]!;
        for (let ch = 0; ch < 3; ch++) {
          for (let i = 0; i < P; i++) {
            for (let j = 0; j < P; j++) s += w.patchEmbed.w[((o * 3 + ch) * P + i) * P + j]! * px[(ch * S + r * P + i) * S + c * P + j]!;
          }
        }
        x[r * side + c]![o] = s + w.positionEmbed[(r * side + c) * D + o]!;
      }
    }
  }
  const linear = (a: Float64Array[], l: { w: Float64Array; b: Float64Array | null; out: number; in: number }) =>
    a.map((row) => Float64Array.from({ length: l.out }, (_, o) => {
      let s = l.b ? l.b[o]! : 0;
      for (let t = 0; t < l.in; t++) s += l.w[o * l.in + t]! * row[t]!;
      return s;
    }));
  const eps = vc.layerNormEps;
  const ln = (a: Float64Array[], n: { w: Float64Array; b: Float64Array }) => a.map((row) => {
    const mean = row.reduce((s, v) => s + v, 0) / row.length;
    const variance = row.reduce((s, v) => s + (v - mean) ** 2, 0) / row.length;
    return row.map((v, i) => ((v - mean) / Math.sqrt(variance + eps)) * n.w[i]! + n.b[i]!);
  });
  const add = (a: Float64Array[], b: Float64Array[]) => a.map((row, i) => row.map((v, t) => v + b[i]![t]!));
  for (const L of w.layers) {
    const h = ln(x, L.norm1);
    const q = linear(h, L.q), k = linear(h, L.k), v = linear(h, L.v);
    const ctx = mat(N, D);
    for (let hd = 0; hd < H; hd++) {
      for (let i = 0; i < N; i++) {
        const s = Array.from({ length: N }, (_, j) => {
          let z = 0;
          for (let t = 0; t < dh; t++) z += q[i]![hd * dh + t]! * k[j]![hd * dh + t]!;
          return z / Math.sqrt(dh);
        });
        const mx = Math.max(...s);
        const e = s.map((z) => Math.exp(z - mx));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let j = 0; j < N; j++) for (let t = 0; t < dh; t++) ctx[i]![hd * dh + t]! += (e[j]! / sum) * v[j]![hd * dh + t]!;
      }
    }
    x = add(x, linear(ctx, L.o));
    x = add(x, linear(linear(ln(x, L.norm2), L.fc1).map((r) => r.map(geluTanh)), L.fc2));
  }
  x = ln(x, w.postNorm);
  // [N, D] -> transpose -> [D, N] -> reshape [D, side, side] -> AvgPool2d(kernel) -> flatten -> transpose.
  const t = Math.round(Math.sqrt(ref.mmTokensPerImage)), kernel = side / t;
  const grid = (dch: number, r: number, c: number) => x[r * side + c]![dch]!;
  const TH = ref.text.config.hiddenSize;
  const out = new Float64Array(t * t * TH);
  for (let a = 0; a < t; a++) {
    for (let b = 0; b < t; b++) {
      const pooled = Float64Array.from({ length: D }, (_, dch) => {
        let s = 0;
        for (let i = 0; i < kernel; i++) for (let j = 0; j < kernel; j++) s += grid(dch, a * kernel + i, b * kernel + j);
        return s / (kernel * kernel);
      });
      const rms = Math.sqrt(pooled.reduce((s, v) => s + v * v, 0) / D + eps);
      for (let u = 0; u < TH; u++) {
        let s = 0;
        for (let dch = 0; dch < D; dch++) s += (pooled[dch]! / rms) * (1 + w.softEmbNorm[dch]!) * w.projection[dch * TH + u]!;
        out[(a * t + b) * TH + u] = s;
      }
    }
  }
  return out;
}

describe('the Gemma 3 image reference', () => {
  let ref: Gemma3VlReference;
  let ref1: Gemma3VlReference;
  beforeAll(async () => {
    const dir = join(root, 'vl');
    await makeModel({ preset: 'test-gemma3-vl', out: dir });
    ref = loadGemma3VlReference(dir);
    // One token per image (the whole 4 x 4 patch grid pooled): no span for the bidirectional mask.
    const dir1 = join(root, 'vl-1');
    const v = resolvePreset('test-gemma3-vl').vision!;
    await makeModel({ preset: 'test-gemma3-vl', out: dir1, overrides: { vision: { ...v, mmTokensPerImage: 1 } } });
    ref1 = loadGemma3VlReference(dir1);
  }, 60_000);

  it('reads the maker\'s config: tower shape, token ids, tokens per image', () => {
    expect(ref.visionConfig).toEqual({
      hiddenSize: 32, intermediateSize: 64, numLayers: 2, numHeads: 2, numChannels: 3, imageSize: 56, patchSize: 14, layerNormEps: 1e-6,
    });
    expect(ref.mmTokensPerImage).toBe(4);
    expect([ref.boiTokenId, ref.eoiTokenId, ref.imageTokenId]).toEqual([2051, 2052, 2053]);
    expect(ref.text.config.slidingWindow).toEqual([8, null, 8, null]);
    expect(ref.vision.positionEmbed.length).toBe(16 * 32);
  });

  it('without images is the text reference, in prefill and in the steps after it', () => {
    const tokens = [2049, 17, 300, 5, 900, 44, 1200, 8, 9, 10, 11, 12, 13, 2050];
    const want = referenceLogits(ref.text, [...tokens, 77, 78]);
    const s = new Gemma3VlSession(ref);
    const got = [...s.prefill(tokens), s.step(77), s.step(78)];
    got.forEach((g, i) => expect(maxDiff(g, want[i]!), `position ${i}`).toBeLessThan(1e-9));
  });

  it('the tower and projector match a plain matrix transcription of transformers', () => {
    for (const seed of [1, 2]) {
      const px = pixels(56, seed);
      const got = siglipEncode(ref, px);
      expect(got.length).toBe(4 * 64);
      expect(maxDiff(got, plainSiglip(ref, px))).toBeLessThan(1e-9);
      expect(maxDiff(siglipEncode(ref1, px), plainSiglip(ref1, px))).toBeLessThan(1e-9);
    }
    expect(() => siglipEncode(ref, new Float64Array(3 * 28 * 28))).toThrow(/pixel values/);
  });

  it('the projector pools row-major squares, normalises with (1 + w) and multiplies x @ W (by hand)', () => {
    // A 4 x 4 grid whose patch (r, c) is [r, c, 1, 0, ...]: pooled 2 x 2 squares are
    // [2a + 0.5, 2b + 0.5, 1, 0, ...]; with w = 0 and W picking features 0 and 1 into outputs 0 and 1.
    const vh = 32, th = ref.text.config.hiddenSize;
    const tower = Array.from({ length: 16 }, (_, i) => {
      const x = new Float64Array(vh);
      x[0] = Math.floor(i / 4);
      x[1] = i % 4;
      x[2] = 1;
      return x;
    });
    const projection = new Float64Array(vh * th);
    projection[0 * th + 0] = 1;
    projection[1 * th + 1] = 1;
    const hand: Gemma3VlReference = { ...ref, vision: { ...ref.vision, softEmbNorm: new Float64Array(vh), projection } };
    const out = gemma3Project(hand, tower);
    for (let a = 0; a < 2; a++) {
      for (let b = 0; b < 2; b++) {
        const p0 = 2 * a + 0.5, p1 = 2 * b + 0.5;
        const rms = Math.sqrt((p0 * p0 + p1 * p1 + 1) / vh + 1e-6);
        const row = out.subarray((a * 2 + b) * th, (a * 2 + b + 1) * th);
        expect(row[0]).toBeCloseTo(p0 / rms, 12);
        expect(row[1]).toBeCloseTo(p1 / rms, 12);
        expect(row.slice(2).every((v) => v === 0)).toBe(true);
      }
    }
  });

  it('layerNorm by hand', () => {
    const y = layerNorm(Float64Array.from([1, 2, 3, 6]), { w: Float64Array.from([1, 2, 1, 1]), b: Float64Array.from([0, 0, 1, 0]) }, 0);
    const sd = Math.sqrt(3.5);
    expect(Array.from(y).map((v) => +v.toFixed(12))).toEqual([-2 / sd, -2 / sd, 1, 3 / sd].map((v) => +v.toFixed(12)));
  });

  it('the mask: causal and windowed, or within the same image (by hand)', () => {
    const I = 9;
    //            0  1  2  3  4  5  6  7  8  9
    const ids = [1, I, I, I, I, 2, I, I, 3, 4];
    const groups = imageGroups(ids, I);
    expect(groups).toEqual([-1, 0, 0, 0, 0, -1, 1, 1, -1, -1]);
    // Full attention: causal, plus the future tokens of the same image.
    expect(gemma3MayAttend(groups, null, 1, 4)).toBe(true);
    expect(gemma3MayAttend(groups, null, 4, 1)).toBe(true);
    expect(gemma3MayAttend(groups, null, 0, 1)).toBe(false);
    expect(gemma3MayAttend(groups, null, 4, 5)).toBe(false);
    expect(gemma3MayAttend(groups, null, 4, 6)).toBe(false);
    expect(gemma3MayAttend(groups, null, 6, 7)).toBe(true);
    expect(gemma3MayAttend(groups, null, 9, 0)).toBe(true);
    // Window 2: keys i-1 and i, but the whole image still sees itself.
    expect(gemma3MayAttend(groups, 2, 4, 1)).toBe(true);
    expect(gemma3MayAttend(groups, 2, 4, 2)).toBe(true);
    expect(gemma3MayAttend(groups, 2, 5, 3)).toBe(false);
    expect(gemma3MayAttend(groups, 2, 5, 4)).toBe(true);
    expect(gemma3MayAttend(groups, 2, 7, 5)).toBe(false);
    expect(gemma3MayAttend(groups, 2, 6, 4)).toBe(false);
  });

  it('with one token per image equals the text reference fed the image row (unscaled) across sliding windows', () => {
    const { boiTokenId: boi, eoiTokenId: eoi, imageTokenId: img } = ref1;
    const prompt = [2049, 40, 41, 42, boi, img, eoi, 43, 44, 45, 46, 47, boi, img, eoi, 48, 49, 50, 51];
    const images = [pixels(56, 3), pixels(56, 4)];
    const rows = images.map((px) => siglipEncode(ref1, px));
    const got = new Gemma3VlSession(ref1);
    const logits = [...got.prefill(prompt, images.map((pixelValues) => ({ pixelValues }))), got.step(60), got.step(61)];
    const plain = new ReferenceSession(ref1.text);
    const c = ref1.text.config;
    let next = 0;
    const want = [...prompt, 60, 61].map((t, pos) => {
      const x = t === img ? Float64Array.from(rows[next++]!) : ref1.text.embed.slice(t * c.hiddenSize, (t + 1) * c.hiddenSize).map((v) => v * c.embedScale);
      return plain.forward(x, (v, off, d, L) => applyRope(v, off, d, pos, L.invFreq, L.ropeScale));
    });
    logits.forEach((l, i) => expect(maxDiff(l, want[i]!), `position ${i}`).toBeLessThan(1e-9));
    // The image changes what follows it, not what precedes it.
    const other = new Gemma3VlSession(ref1).prefill(prompt, [{ pixelValues: pixels(56, 5) }, { pixelValues: images[1]! }]);
    expect(maxDiff(other[4]!, logits[4]!)).toBe(0);
    expect(maxDiff(other[5]!, logits[5]!)).toBeGreaterThan(1e-6);
  });

  it('an image attends within itself: a later image row changes an earlier image token\'s output', () => {
    const { boiTokenId: boi, eoiTokenId: eoi, imageTokenId: img } = ref;
    const h = ref.text.config.hiddenSize;
    const prompt = [2049, 40, boi, img, img, img, img, eoi, 41, boi, img, img, img, img, eoi, 42];
    const a = siglipEncode(ref, pixels(56, 6)), b = siglipEncode(ref, pixels(56, 7));
    const base = new Gemma3VlSession(ref).prefillRows(prompt, [a, b]);
    // The first image's last row changed: its first row's position (3) changes, the boi before it (2) does not.
    const a2 = Float64Array.from(a);
    for (let t = 3 * h; t < 4 * h; t++) a2[t] = -a2[t]!;
    const changed = new Gemma3VlSession(ref).prefillRows(prompt, [a2, b]);
    expect(maxDiff(changed[2]!, base[2]!)).toBe(0);
    expect(maxDiff(changed[3]!, base[3]!)).toBeGreaterThan(1e-6);
    // The second image's last row changed: the first image's positions (and all before 10) do not.
    const b2 = Float64Array.from(b);
    for (let t = 3 * h; t < 4 * h; t++) b2[t] = -b2[t]!;
    const later = new Gemma3VlSession(ref).prefillRows(prompt, [a, b2]);
    for (let i = 0; i < 10; i++) expect(maxDiff(later[i]!, base[i]!), `position ${i}`).toBe(0);
    expect(maxDiff(later[10]!, base[10]!)).toBeGreaterThan(1e-6);
    // Feeding the same rows token by token (a causal pass) differs at the image's first rows.
    const plain = new ReferenceSession(ref.text);
    const c = ref.text.config;
    let next = 0;
    const causal = prompt.map((t, pos) => {
      const x = t === img ? Float64Array.from(a.subarray(next * h, ++next * h)) : ref.text.embed.slice(t * h, (t + 1) * h).map((v) => v * c.embedScale);
      if (next === 4 && t === img) next = 0;  // the second image reuses a's rows below
      return plain.forward(x, (v, off, d, L) => applyRope(v, off, d, pos, L.invFreq, L.ropeScale));
    });
    const same = new Gemma3VlSession(ref).prefillRows(prompt, [a, a]);
    expect(maxDiff(causal[2]!, same[2]!)).toBeLessThan(1e-9);
    expect(maxDiff(causal[3]!, same[3]!)).toBeGreaterThan(1e-6);
    expect(maxDiff(causal[6]!, same[6]!)).toBeGreaterThan(1e-9);
  });

  it('refuses image tokens that do not match the images', () => {
    const { imageTokenId: img } = ref;
    expect(() => new Gemma3VlSession(ref).prefill([1, img, img, img, img, 2], [])).toThrow(/4 image tokens for 0 images/);
    const s = new Gemma3VlSession(ref);
    s.prefill([1, 2]);
    expect(() => s.prefill([1, 2])).toThrow(/used session/);
    expect(() => s.step(img)).toThrow(/image token/);
  });
});
