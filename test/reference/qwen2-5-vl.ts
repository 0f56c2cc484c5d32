// Float64 reference of Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration), following transformers'
// modeling_qwen2_5_vl.py: the vision tower (patch embedding, 2D rotary, window attention, patch
// merger), the 3-component M-RoPE positions of a prompt with images (get_rope_index), and the Qwen2
// text model roped with them, image embeddings standing in for the image placeholder tokens.
// Images only (no video). Independent of models/ and src/; the text math is math.ts's.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type GatedMlp, type Linear, matvec, rmsNorm, ropeInvFreq, silu, softmax } from './math.js';
import { type ReferenceConfig, type ReferenceLayer, type ReferenceModel, ReferenceSession } from './reference-model.js';
import { type RefTensor, readSafetensorsDir } from './safetensors-reader.js';

export const QWEN2_5_VL_ARCHITECTURE = 'Qwen2_5_VLForConditionalGeneration';

// ---------------------------------------------------------------- activations

/**
 * erf to float64 precision: erf(z) = 2/sqrt(pi) exp(-z^2) sum_n (2z^2)^n z / (1*3*...*(2n+1)), a
 * series of positive terms (no cancellation); |z| >= 6 rounds to +-1 (erfc(6) < 3e-17).
 */
export function erf(z: number): number {
  const a = Math.abs(z);
  if (a >= 6) return Math.sign(z);
  let term = a;
  let sum = a;
  for (let n = 1; n < 200 && term > sum * 1e-17; n++) {
    term *= (2 * a * a) / (2 * n + 1);
    sum += term;
  }
  return Math.sign(z) * (2 / Math.sqrt(Math.PI)) * Math.exp(-a * a) * sum;
}

/** Exact GELU (torch nn.GELU(), approximate='none'): x/2 (1 + erf(x / sqrt 2)). */
export const geluErf = (x: number) => 0.5 * x * (1 + erf(x / Math.SQRT2));

/** The vision MLP's activations by transformers' ACT2FN name (published checkpoints: silu). */
const VISION_ACTIVATIONS: Record<string, (x: number) => number> = { silu, gelu: geluErf };

// ---------------------------------------------------------------- vision config and weights

/** Qwen2_5_VLVisionConfig (its defaults fill what config.json leaves out). */
export interface Qwen25VisionConfig {
  depth: number;
  hiddenSize: number;
  hiddenAct: string;
  intermediateSize: number;
  numHeads: number;
  inChannels: number;
  /** Side of a patch in pixels (14). */
  patchSize: number;
  /** Side of the square of patches the merger folds into one LLM token (2). */
  spatialMergeSize: number;
  /** Frames per patch (2; an image is its frame repeated). */
  temporalPatchSize: number;
  tokensPerSecond: number;
  /** Side of an attention window in pixels (112): window_size / merge / patch merged tokens. */
  windowSize: number;
  outHiddenSize: number;
  /** Blocks that attend over the whole image (per frame); the others within their window. */
  fullattBlockIndexes: number[];
}

export function parseVisionConfig(raw: Record<string, any>): Qwen25VisionConfig {
  return {
    depth: raw.depth ?? 32,
    hiddenSize: raw.hidden_size ?? 3584,
    hiddenAct: raw.hidden_act ?? 'silu',
    intermediateSize: raw.intermediate_size ?? 3420,
    numHeads: raw.num_heads ?? 16,
    inChannels: raw.in_chans ?? raw.in_channels ?? 3,  // published configs write in_chans
    patchSize: raw.patch_size ?? 14,
    spatialMergeSize: raw.spatial_merge_size ?? 2,
    temporalPatchSize: raw.temporal_patch_size ?? 2,
    tokensPerSecond: raw.tokens_per_second ?? 4,
    windowSize: raw.window_size ?? 112,
    outHiddenSize: raw.out_hidden_size ?? 3584,
    fullattBlockIndexes: raw.fullatt_block_indexes ?? [7, 15, 23, 31],
  };
}

/** Values per pixel_values row: channels x temporal patch x patch x patch. */
export const visionPatchInput = (vc: Qwen25VisionConfig) => vc.inChannels * vc.temporalPatchSize * vc.patchSize * vc.patchSize;

/** One vision block: x + proj(attn(norm1 x)), then x + mlp(norm2 x); every Linear has a bias. */
export interface Qwen25VisionBlock {
  norm1: Float64Array; // [hidden]
  norm2: Float64Array; // [hidden]
  qkv: Linear; // [3 * hidden, hidden]: q rows, then k, then v; each heads x head_dim
  proj: Linear; // [hidden, hidden]
  mlp: GatedMlp; // gate/up [intermediate, hidden], down [hidden, intermediate]
}

export interface Qwen25VisionWeights {
  /** The Conv3d kernel flattened: [hidden, channels * temporal * patch * patch], no bias. */
  patchEmbed: Float64Array;
  blocks: Qwen25VisionBlock[];
  merger: {
    lnQ: Float64Array; // [hidden], RMSNorm eps 1e-6
    fc1: Linear; // mlp.0: [hidden * merge^2, hidden * merge^2]
    fc2: Linear; // mlp.2: [outHidden, hidden * merge^2]
  };
}

// ---------------------------------------------------------------- vision positions and windows

export type Grid = readonly [t: number, h: number, w: number];

/**
 * The (row, col) patch position of each pixel_values row of one image, in the order the processor
 * writes rows (rot_pos_emb): per frame, merge-group row, merge-group column, row in the group,
 * column in the group. Frames repeat the same positions.
 */
export function visionPatchPositions(grid: Grid, merge: number): [row: number, col: number][] {
  const [t, h, w] = grid;
  if (h % merge !== 0 || w % merge !== 0) throw new Error(`qwen2.5-vl: grid ${h}x${w} not a multiple of merge ${merge}`);
  const out: [number, number][] = [];
  for (let f = 0; f < t; f++) {
    for (let br = 0; br < h / merge; br++) {
      for (let bc = 0; bc < w / merge; bc++) {
        for (let r = 0; r < merge; r++) for (let c = 0; c < merge; c++) out.push([br * merge + r, bc * merge + c]);
      }
    }
  }
  return out;
}

/**
 * get_window_index for one image: merged tokens (groups of merge^2 consecutive rows, indexed
 * frame-major, then row, then column of the merged grid) listed window by window (per frame,
 * window rows, window columns; row-major inside a window), windows being squares of
 * window_size / merge / patch merged tokens anchored at the top left. cuWindowSeqlens: the
 * boundaries of each window's patch rows in that order, empty windows dropped (transformers pads
 * the grid by a full window where it divides evenly, then unique_consecutive drops the repeats).
 */
export function visionWindowIndex(grid: Grid, vc: Qwen25VisionConfig): { windowIndex: number[]; cuWindowSeqlens: number[] } {
  const [t, h, w] = grid;
  const m = vc.spatialMergeSize;
  const ws = Math.floor(Math.floor(vc.windowSize / m) / vc.patchSize);
  if (ws < 1) throw new Error(`qwen2.5-vl: window_size ${vc.windowSize} below one merged token`);
  const gh = h / m;
  const gw = w / m;
  const windowIndex: number[] = [];
  const cu = [0];
  const windowsH = Math.ceil(gh / ws);
  const windowsW = Math.ceil(gw / ws);
  for (let f = 0; f < t; f++) {
    for (let wr = 0; wr < windowsH; wr++) {
      for (let wc = 0; wc < windowsW; wc++) {
        let n = 0;
        for (let r = wr * ws; r < Math.min(gh, (wr + 1) * ws); r++) {
          for (let c = wc * ws; c < Math.min(gw, (wc + 1) * ws); c++, n++) windowIndex.push((f * gh + r) * gw + c);
        }
        if (n > 0) cu.push(cu[cu.length - 1]! + n * m * m);
      }
    }
  }
  return { windowIndex, cuWindowSeqlens: cu };
}

/** Vision rotary frequencies: head_dim / 4 of them, 1 / 10000^(2k / (head_dim / 2)). */
export function visionInvFreq(headDim: number): Float64Array {
  if (headDim % 4 !== 0) throw new Error(`qwen2.5-vl: vision head_dim ${headDim} not a multiple of 4`);
  const dim = headDim / 2;
  const inv = new Float64Array(dim / 2);
  for (let k = 0; k < inv.length; k++) inv[k] = 1 / Math.pow(10000, (2 * k) / dim);
  return inv;
}

/**
 * The vision rotary of one head vector at patch (row, col), in place (apply_rotary_pos_emb_vision):
 * rotate-half over the whole head, the angle of pair i (i < head_dim / 2) being row * inv[i] for
 * the first head_dim / 4 pairs and col * inv[i - head_dim / 4] for the rest.
 */
export function applyVisionRope(x: Float64Array, off: number, headDim: number, row: number, col: number, invFreq: Float64Array): void {
  const q = invFreq.length;
  rotateHalf(x, off, headDim, (i) => (i < q ? row * invFreq[i]! : col * invFreq[i - q]!));
}

/** Rotate-half in place: pair (i, i + headDim / 2) turned by angle(i). */
function rotateHalf(x: Float64Array, off: number, headDim: number, angle: (i: number) => number): void {
  const half = headDim / 2;
  for (let i = 0; i < half; i++) {
    const a = angle(i);
    const c = Math.cos(a);
    const s = Math.sin(a);
    const x1 = x[off + i]!;
    const x2 = x[off + half + i]!;
    x[off + i] = x1 * c - x2 * s;
    x[off + half + i] = x2 * c + x1 * s;
  }
}

// ---------------------------------------------------------------- vision forward

/** Bidirectional multi-head attention of rows xs within each segment [cu[i], cu[i+1]). */
function visionAttention(
  b: Qwen25VisionBlock, xs: Float64Array[], pos: [number, number][], cu: number[], numHeads: number, invFreq: Float64Array,
): Float64Array[] {
  const hidden = b.proj.out;
  const d = hidden / numHeads;
  const scale = 1 / Math.sqrt(d);
  const q: Float64Array[] = [];
  const k: Float64Array[] = [];
  const v: Float64Array[] = [];
  for (let i = 0; i < xs.length; i++) {
    const qkv = matvec(b.qkv, xs[i]!); // [3 * hidden]
    const qi = qkv.slice(0, hidden);
    const ki = qkv.slice(hidden, 2 * hidden);
    for (let hd = 0; hd < numHeads; hd++) {
      applyVisionRope(qi, hd * d, d, pos[i]![0], pos[i]![1], invFreq);
      applyVisionRope(ki, hd * d, d, pos[i]![0], pos[i]![1], invFreq);
    }
    q.push(qi);
    k.push(ki);
    v.push(qkv.slice(2 * hidden));
  }
  const out: Float64Array[] = [];
  for (let s = 0; s + 1 < cu.length; s++) {
    const lo = cu[s]!;
    const hi = cu[s + 1]!;
    for (let i = lo; i < hi; i++) {
      const attn = new Float64Array(hidden);
      for (let hd = 0; hd < numHeads; hd++) {
        const scores = new Float64Array(hi - lo);
        for (let j = lo; j < hi; j++) {
          let dot = 0;
          for (let e = 0; e < d; e++) dot += q[i]![hd * d + e]! * k[j]![hd * d + e]!;
          scores[j - lo] = dot * scale;
        }
        const p = softmax(scores);
        for (let j = lo; j < hi; j++) for (let e = 0; e < d; e++) attn[hd * d + e]! += p[j - lo]! * v[j]![hd * d + e]!;
      }
      out.push(matvec(b.proj, attn));
    }
  }
  if (out.length !== xs.length) throw new Error(`qwen2.5-vl: attention segments cover ${out.length} of ${xs.length} rows`);
  return out;
}

/**
 * The vision tower on one image (Qwen2_5_VisionTransformerPretrainedModel.forward): pixelValues
 * [t*h*w rows, channels * temporal * patch * patch] in the processor's row order, grid [t, h, w] in
 * patches. Rows are embedded, reordered window by window (whole merged tokens move), run through
 * the blocks (window attention, or per-frame full attention in fullatt_block_indexes), merged
 * (RMSNorm, merge^2 consecutive rows concatenated, Linear, exact GELU, Linear) and put back in the
 * processor's order. Returns [t*h*w / merge^2, outHidden] row-major.
 */
export function visionEncode(weights: Qwen25VisionWeights, vc: Qwen25VisionConfig, pixelValues: ArrayLike<number>, grid: Grid): Float64Array {
  const [t, h, w] = grid;
  const m = vc.spatialMergeSize;
  const unit = m * m;
  const rows = t * h * w;
  const patchIn = visionPatchInput(vc);
  const hidden = vc.hiddenSize;
  if (pixelValues.length !== rows * patchIn) throw new Error(`qwen2.5-vl: ${pixelValues.length} pixel values for ${rows} rows of ${patchIn}`);
  const act = VISION_ACTIVATIONS[vc.hiddenAct];
  if (!act) throw new Error(`qwen2.5-vl: vision hidden_act ${vc.hiddenAct}`);
  const embed: Linear = { w: weights.patchEmbed, b: null, out: hidden, in: patchIn };
  const pos = visionPatchPositions(grid, m);
  const { windowIndex, cuWindowSeqlens } = visionWindowIndex(grid, vc);
  // Row order inside the blocks: each merged token's merge^2 rows, tokens in window order.
  const order = windowIndex.flatMap((u) => Array.from({ length: unit }, (_, r) => u * unit + r));
  let xs = order.map((r) => matvec(embed, Float64Array.from({ length: patchIn }, (_, i) => pixelValues[r * patchIn + i]!)));
  const ps = order.map((r) => pos[r]!);
  const cuFrames = Array.from({ length: t + 1 }, (_, f) => f * h * w);
  const invFreq = visionInvFreq(hidden / vc.numHeads);
  const norm = (x: Float64Array, wt: Float64Array) => rmsNorm(x, wt, 1e-6);
  weights.blocks.forEach((b, l) => {
    const cu = vc.fullattBlockIndexes.includes(l) ? cuFrames : cuWindowSeqlens;
    const a = visionAttention(b, xs.map((x) => norm(x, b.norm1)), ps, cu, vc.numHeads, invFreq);
    xs = xs.map((x, i) => {
      const y = x.map((v, e) => v + a[i]![e]!);
      const hn = norm(y, b.norm2);
      const g = matvec(b.mlp.gate, hn);
      const u = matvec(b.mlp.up, hn);
      for (let e = 0; e < g.length; e++) g[e] = act(g[e]!) * u[e]!;
      const mo = matvec(b.mlp.down, g);
      return y.map((v, e) => v + mo[e]!);
    });
  });
  const { lnQ, fc1, fc2 } = weights.merger;
  const out = new Float64Array((rows / unit) * vc.outHiddenSize);
  for (let k = 0; k < windowIndex.length; k++) {
    const cat = new Float64Array(unit * hidden);
    for (let r = 0; r < unit; r++) cat.set(norm(xs[k * unit + r]!, lnQ), r * hidden);
    const z = matvec(fc1, cat).map(geluErf);
    out.set(matvec(fc2, z), windowIndex[k]! * vc.outHiddenSize);
  }
  return out;
}

// ---------------------------------------------------------------- M-RoPE

export interface MropeTokens {
  imageTokenId: number;
  visionStartTokenId: number;
  spatialMergeSize: number;
}

/**
 * get_rope_index for text and images: text tokens take st, st+1, ... on all three components;
 * an image (the run of image_token_id after <|vision_start|>, t*h*w / merge^2 tokens) takes
 * (0, row, col) of its merged grid plus the position its first token would have had as text;
 * text after it resumes at the largest position so far + 1. deltas = max + 1 - length: decode
 * positions are (cache length + deltas) on all three.
 */
export function mropePositions(tokenIds: number[], imageGrids: Grid[], cfg: MropeTokens): { positions: number[][]; deltas: number } {
  const m = cfg.spatialMergeSize;
  // transformers counts images as <|vision_start|> directly followed by an image token.
  let images = 0;
  for (let i = 0; i + 1 < tokenIds.length; i++) if (tokenIds[i] === cfg.visionStartTokenId && tokenIds[i + 1] === cfg.imageTokenId) images++;
  if (images !== imageGrids.length) throw new Error(`qwen2.5-vl: ${images} images in the prompt, ${imageGrids.length} grids`);
  const positions: number[][] = [[], [], []];
  let next = 0; // the next text position: max so far + 1
  let st = 0;
  const text = (n: number) => {
    for (let i = 0; i < n; i++) for (const p of positions) p.push(next + i);
    next += n;
  };
  for (const [t, h, w] of imageGrids) {
    const ed = tokenIds.indexOf(cfg.imageTokenId, st);
    const gh = h / m;
    const gw = w / m;
    const n = t * gh * gw;
    for (let i = ed; i < ed + n; i++) if (tokenIds[i] !== cfg.imageTokenId) throw new Error(`qwen2.5-vl: image at ${ed} has fewer than ${n} tokens`);
    text(ed - st);
    let max = next - 1;
    // Images have second_per_grid_t = 0: every frame's temporal component is the start.
    for (let f = 0; f < t; f++) {
      for (let r = 0; r < gh; r++) {
        for (let c = 0; c < gw; c++) {
          positions[0]!.push(next);
          positions[1]!.push(next + r);
          positions[2]!.push(next + c);
          max = Math.max(max, next + r, next + c);
        }
      }
    }
    next = max + 1;
    st = ed + n;
  }
  text(tokenIds.length - st);
  return { positions, deltas: next - tokenIds.length };
}

/**
 * Multimodal rotary of one head vector in place (apply_multimodal_rotary_pos_emb): rotate-half
 * like applyRope, but pair i takes its angle from component c of pos3, where the half dims are cut
 * into mropeSection (temporal, height, width; [16, 24, 24]) and i falls in section c.
 */
export function applyMrope(
  x: Float64Array, off: number, d: number, pos3: readonly number[], invFreq: Float64Array, mropeSection: readonly number[],
): void {
  const half = d / 2;
  if (mropeSection.reduce((a, b) => a + b, 0) !== half) throw new Error(`qwen2.5-vl: mrope_section [${mropeSection}] does not sum to ${half}`);
  // The component each frequency takes its position from: t for the first section, h, then w.
  const component: number[] = [];
  mropeSection.forEach((n, sec) => { for (let j = 0; j < n; j++) component.push(sec % 3); });
  rotateHalf(x, off, d, (i) => pos3[component[i]!]! * invFreq[i]!);
}

// ---------------------------------------------------------------- loading

export interface Qwen25VlReference {
  /** The Qwen2 text model (q/k/v biases); config.architecture is Qwen2_5_VLForConditionalGeneration. */
  text: ReferenceModel;
  vision: Qwen25VisionWeights;
  visionConfig: Qwen25VisionConfig;
  mrope: MropeTokens & { mropeSection: number[] };
}

/**
 * Load a Qwen2_5_VLForConditionalGeneration directory. Text fields at the top level (as published)
 * or under text_config (as newer transformers saves); tensors as published (model.*, visual.*,
 * lm_head) or as newer transformers saves them (model.language_model.*, model.visual.*).
 */
export function loadQwen25VlReference(dir: string): Qwen25VlReference {
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
  const arch = raw.architectures?.[0];
  if (arch !== QWEN2_5_VL_ARCHITECTURE) throw new Error(`qwen2.5-vl: architecture ${arch}`);
  const t = { ...raw, ...(raw.text_config ?? {}) } as Record<string, any>;
  const vc = parseVisionConfig(raw.vision_config ?? {});
  if ((t.hidden_act ?? 'silu') !== 'silu') throw new Error(`qwen2.5-vl: hidden_act ${t.hidden_act}`);
  if (t.use_sliding_window) throw new Error('qwen2.5-vl: use_sliding_window not supported');
  const rope = (t.rope_scaling ?? t.rope_parameters ?? {}) as Record<string, any>;
  const ropeType = rope.rope_type ?? rope.type ?? 'default';
  if (ropeType !== 'mrope' && ropeType !== 'default') throw new Error(`qwen2.5-vl: rope type ${ropeType}`);
  const mropeSection = rope.mrope_section as number[] | undefined;
  if (!mropeSection) throw new Error('qwen2.5-vl: rope_scaling.mrope_section missing');
  const h = t.hidden_size as number;
  const numHeads = t.num_attention_heads as number;
  const numKvHeads = (t.num_key_value_heads ?? numHeads) as number;
  const headDim = h / numHeads; // Qwen2_5_VLAttention: hidden_size // num_heads, head_dim ignored
  if (vc.outHiddenSize !== h) throw new Error(`qwen2.5-vl: vision out_hidden_size ${vc.outHiddenSize} != hidden_size ${h}`);
  const ropeTheta = (t.rope_theta ?? rope.rope_theta ?? 1_000_000) as number;
  const config: ReferenceConfig = {
    architecture: arch, modelType: raw.model_type, hiddenSize: h, intermediateSize: t.intermediate_size,
    numLayers: t.num_hidden_layers, numHeads, numKvHeads, headDim, vocabSize: t.vocab_size, rmsNormEps: t.rms_norm_eps ?? 1e-5,
    ropeTheta, ropeScaling: null, ropeLocalTheta: null, tieWordEmbeddings: t.tie_word_embeddings ?? false,
    slidingWindow: new Array(t.num_hidden_layers).fill(null), attnScale: 1 / Math.sqrt(headDim), normOffset: 0, embedScale: 1,
    hiddenAct: 'silu', attnSoftcap: null, finalSoftcap: null, qkvBias: true, oBias: false, mlpBias: false, qkNorm: false,
    attnSinks: false, moe: null,
  };

  const tensors = readSafetensorsDir(dir);
  const get = (name: string, shape: number[]): RefTensor => {
    const x = tensors.get(name);
    if (!x) throw new Error(`qwen2.5-vl: missing tensor ${name}`);
    if (x.shape.length !== shape.length || x.shape.some((n, i) => n !== shape[i])) {
      throw new Error(`qwen2.5-vl: ${name} has shape [${x.shape}], expected [${shape}]`);
    }
    return x;
  };
  const linear = (prefix: string, out: number, inp: number, bias: boolean): Linear => ({
    w: get(`${prefix}.weight`, [out, inp]).data, b: bias ? get(`${prefix}.bias`, [out]).data : null, out, in: inp,
  });
  const textRoot = tensors.has('model.language_model.embed_tokens.weight') ? 'model.language_model' : 'model';
  const visualRoot = tensors.has('model.visual.patch_embed.proj.weight') ? 'model.visual' : 'visual';

  const invFreq = ropeInvFreq(headDim, ropeTheta, null);
  const layers: ReferenceLayer[] = [];
  for (let i = 0; i < config.numLayers; i++) {
    const p = `${textRoot}.layers.${i}`;
    const inter = config.intermediateSize;
    layers.push({
      inputNorm: get(`${p}.input_layernorm.weight`, [h]).data,
      q: linear(`${p}.self_attn.q_proj`, numHeads * headDim, h, true),
      k: linear(`${p}.self_attn.k_proj`, numKvHeads * headDim, h, true),
      v: linear(`${p}.self_attn.v_proj`, numKvHeads * headDim, h, true),
      o: linear(`${p}.self_attn.o_proj`, h, numHeads * headDim, false),
      qNorm: null, kNorm: null,
      postNorm: get(`${p}.post_attention_layernorm.weight`, [h]).data,
      preFeedforwardNorm: null, postFeedforwardNorm: null,
      gate: linear(`${p}.mlp.gate_proj`, inter, h, false),
      up: linear(`${p}.mlp.up_proj`, inter, h, false),
      down: linear(`${p}.mlp.down_proj`, h, inter, false),
      moe: null, invFreq, ropeScale: 1, sinks: null,
    });
  }
  const embed = get(`${textRoot}.embed_tokens.weight`, [config.vocabSize, h]).data;
  const text: ReferenceModel = {
    config, raw, embed, layers,
    norm: get(`${textRoot}.norm.weight`, [h]).data,
    lmHead: config.tieWordEmbeddings ? { w: embed, b: null, out: config.vocabSize, in: h } : linear('lm_head', config.vocabSize, h, false),
    invFreq,
  };

  const vh = vc.hiddenSize;
  const vi = vc.intermediateSize;
  const merged = vh * vc.spatialMergeSize ** 2;
  const patchEmbed = get(`${visualRoot}.patch_embed.proj.weight`, [vh, vc.inChannels, vc.temporalPatchSize, vc.patchSize, vc.patchSize]).data;
  const blocks: Qwen25VisionBlock[] = [];
  for (let i = 0; i < vc.depth; i++) {
    const p = `${visualRoot}.blocks.${i}`;
    blocks.push({
      norm1: get(`${p}.norm1.weight`, [vh]).data,
      norm2: get(`${p}.norm2.weight`, [vh]).data,
      qkv: linear(`${p}.attn.qkv`, 3 * vh, vh, true),
      proj: linear(`${p}.attn.proj`, vh, vh, true),
      mlp: { gate: linear(`${p}.mlp.gate_proj`, vi, vh, true), up: linear(`${p}.mlp.up_proj`, vi, vh, true), down: linear(`${p}.mlp.down_proj`, vh, vi, true) },
    });
  }
  const vision: Qwen25VisionWeights = {
    patchEmbed,
    blocks,
    merger: {
      lnQ: get(`${visualRoot}.merger.ln_q.weight`, [vh]).data,
      fc1: linear(`${visualRoot}.merger.mlp.0`, merged, merged, true),
      fc2: linear(`${visualRoot}.merger.mlp.2`, vc.outHiddenSize, merged, true),
    },
  };
  return {
    text, vision, visionConfig: vc,
    mrope: {
      imageTokenId: raw.image_token_id ?? 151655,
      visionStartTokenId: raw.vision_start_token_id ?? 151652,
      spatialMergeSize: vc.spatialMergeSize,
      mropeSection,
    },
  };
}

// ---------------------------------------------------------------- text forward

export interface Qwen25VlImage {
  /** [t*h*w rows, channels * temporal * patch * patch], rows in the processor's order. */
  pixelValues: ArrayLike<number>;
  grid: Grid;
}

/** Incremental decoding with M-RoPE positions and a float64 KV cache (ReferenceSession's layers). */
export class Qwen25VlSession {
  private readonly text: ReferenceSession;
  /** Set by prefill: a decoded token's position on all three components is length + ropeDelta. */
  ropeDelta = 0;

  constructor(readonly model: Qwen25VlReference) {
    this.text = new ReferenceSession(model.text);
  }

  /** Entries in the cache. */
  get length(): number {
    return this.text.position;
  }

  /** Feed one input embedding [hidden] at position (t, h, w); returns the next token's logits. */
  stepEmbedding(x0: Float64Array, pos3: readonly number[]): Float64Array {
    const section = this.model.mrope.mropeSection;
    return this.text.forward(Float64Array.from(x0), (v, off, d, L) => applyMrope(v, off, d, pos3, L.invFreq, section));
  }

  private embedToken(token: number): Float64Array {
    const { vocabSize, hiddenSize } = this.model.text.config;
    if (!Number.isInteger(token) || token < 0 || token >= vocabSize) throw new Error(`token ${token} out of range`);
    return this.model.text.embed.slice(token * hiddenSize, (token + 1) * hiddenSize);
  }

  /**
   * The prompt (image placeholders included) on an empty session: image embeddings replace the
   * placeholder tokens' embeddings in order, positions from mropePositions. Logits per position.
   */
  prefill(tokenIds: number[], images: Qwen25VlImage[] = []): Float64Array[] {
    if (this.length !== 0) throw new Error('qwen2.5-vl: prefill on a used session');
    const { imageTokenId } = this.model.mrope;
    const hidden = this.model.text.config.hiddenSize;
    const embeds = images.map((im) => visionEncode(this.model.vision, this.model.visionConfig, im.pixelValues, im.grid));
    const all = new Float64Array(embeds.reduce((a, e) => a + e.length, 0));
    embeds.reduce((off, e) => (all.set(e, off), off + e.length), 0);
    const placeholders = tokenIds.filter((tk) => tk === imageTokenId).length;
    if (placeholders * hidden !== all.length) throw new Error(`qwen2.5-vl: ${placeholders} image tokens, ${all.length / hidden} image features`);
    const { positions, deltas } = mropePositions(tokenIds, images.map((im) => im.grid), this.model.mrope);
    this.ropeDelta = deltas;
    let next = 0;
    return tokenIds.map((tk, i) => {
      const x = tk === imageTokenId ? all.slice(next * hidden, ++next * hidden) : this.embedToken(tk);
      return this.stepEmbedding(x, [positions[0]![i]!, positions[1]![i]!, positions[2]![i]!]);
    });
  }

  /** One generated token after prefill, at position length + ropeDelta on all three components. */
  step(token: number): Float64Array {
    const p = this.length + this.ropeDelta;
    return this.stepEmbedding(this.embedToken(token), [p, p, p]);
  }
}
