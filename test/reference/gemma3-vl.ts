// Float64 reference of Gemma 3 with images (Gemma3ForConditionalGeneration), following
// transformers' modeling_gemma3.py and modeling_siglip.py: the SigLIP tower (Conv2d patches plus
// learned positions, pre-LayerNorm layers of full bidirectional attention and a gelu-tanh MLP,
// post_layernorm), the projector (average pooling of the patch grid to mm_tokens_per_image rows,
// Gemma's (1 + w) RMSNorm, x @ mm_input_projection_weight), and the Gemma 3 text model (the text
// reference's layers) with image rows standing in for the <image_soft_token> embeddings, unscaled,
// and an attention mask that is causal (and windowed on the sliding layers) OR "same image".
// Independent of models/ and src/.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type Linear, applyRope, gatedMlp, geluTanh, matvec, rmsNorm, softcap, softmax } from './math.js';
import { type ReferenceModel, ReferenceSession, loadReferenceModel } from './reference-model.js';
import { type RefTensor, readSafetensorsDir } from './safetensors-reader.js';

export const GEMMA3_VL_ARCHITECTURE = 'Gemma3ForConditionalGeneration';

// ---------------------------------------------------------------- config and weights

/** SiglipVisionConfig (its defaults fill what config.json leaves out). */
export interface SiglipConfig {
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numChannels: number;
  /** Side of the (square) input image in pixels. */
  imageSize: number;
  patchSize: number;
  layerNormEps: number;
}

export function parseSiglipConfig(raw: Record<string, any>): SiglipConfig {
  const act = raw.hidden_act ?? 'gelu_pytorch_tanh';
  if (act !== 'gelu_pytorch_tanh') throw new Error(`gemma3-vl: vision hidden_act ${act}`);
  if (raw.vision_use_head) throw new Error('gemma3-vl: vision_use_head is not used by Gemma 3');
  return {
    hiddenSize: raw.hidden_size ?? 768,
    intermediateSize: raw.intermediate_size ?? 3072,
    numLayers: raw.num_hidden_layers ?? 12,
    numHeads: raw.num_attention_heads ?? 12,
    numChannels: raw.num_channels ?? 3,
    imageSize: raw.image_size ?? 224,
    patchSize: raw.patch_size ?? 16,
    layerNormEps: raw.layer_norm_eps ?? 1e-6,
  };
}

export interface LayerNormWeights {
  w: Float64Array; // [hidden]
  b: Float64Array; // [hidden]
}

/** One encoder layer: x + out_proj(attn(layer_norm1 x)), then x + fc2(gelu(fc1(layer_norm2 x))). */
export interface SiglipLayer {
  norm1: LayerNormWeights;
  q: Linear;
  k: Linear;
  v: Linear;
  o: Linear;
  norm2: LayerNormWeights;
  fc1: Linear; // [intermediate, hidden]
  fc2: Linear; // [hidden, intermediate]
}

export interface Gemma3VisionWeights {
  /** The Conv2d kernel flattened per output channel: [hidden, channels * patch * patch] (channel, row, column), with its bias. */
  patchEmbed: Linear;
  /** [numPatches, hidden]: patch i (row-major over the grid) adds row i. */
  positionEmbed: Float64Array;
  layers: SiglipLayer[];
  postNorm: LayerNormWeights;
  /** mm_soft_emb_norm: Gemma's (1 + w) RMSNorm over the pooled rows [hidden]. */
  softEmbNorm: Float64Array;
  /** mm_input_projection_weight [hidden, textHidden]: row-vector x times it (not a Linear's [out, in]). */
  projection: Float64Array;
}

export interface Gemma3VlReference {
  /** The Gemma 3 text model (config.architecture Gemma3ForConditionalGeneration). */
  text: ReferenceModel;
  vision: Gemma3VisionWeights;
  visionConfig: SiglipConfig;
  /** Rows an image becomes (mm_tokens_per_image), a square number. */
  mmTokensPerImage: number;
  /** <image_soft_token> (image_token_index), <start_of_image> (boi_token_index), <end_of_image> (eoi_token_index). */
  imageTokenId: number;
  boiTokenId: number;
  eoiTokenId: number;
}

/** Load a Gemma3ForConditionalGeneration directory in the published layout (language_model.*, vision_tower.*, multi_modal_projector.*). */
export function loadGemma3VlReference(dir: string): Gemma3VlReference {
  const raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, any>;
  if (raw.architectures?.[0] !== GEMMA3_VL_ARCHITECTURE) throw new Error(`gemma3-vl: architecture ${raw.architectures?.[0]}`);
  if (raw.vision_config === undefined) throw new Error('gemma3-vl: config.json has no vision_config');
  const text = loadReferenceModel(dir);
  const vc = parseSiglipConfig(raw.vision_config);
  const mm = (raw.mm_tokens_per_image ?? 256) as number;
  const side = vc.imageSize / vc.patchSize;
  const tokensSide = Math.round(Math.sqrt(mm));
  if (!Number.isInteger(side) || tokensSide * tokensSide !== mm || side % tokensSide !== 0) {
    throw new Error(`gemma3-vl: ${side} x ${side} patches do not pool into ${mm} tokens`);
  }
  const tensors = readSafetensorsDir(dir);
  const get = (name: string, shape: number[]): RefTensor => {
    const x = tensors.get(name);
    if (!x) throw new Error(`gemma3-vl: missing tensor ${name}`);
    if (x.shape.length !== shape.length || x.shape.some((n, i) => n !== shape[i])) {
      throw new Error(`gemma3-vl: ${name} has shape [${x.shape}], expected [${shape}]`);
    }
    return x;
  };
  const vh = vc.hiddenSize;
  const linear = (prefix: string, out: number, inp: number): Linear => ({
    w: get(`${prefix}.weight`, [out, inp]).data, b: get(`${prefix}.bias`, [out]).data, out, in: inp,
  });
  const layerNorm = (prefix: string): LayerNormWeights => ({ w: get(`${prefix}.weight`, [vh]).data, b: get(`${prefix}.bias`, [vh]).data });
  const m = 'vision_tower.vision_model';
  const patchIn = vc.numChannels * vc.patchSize * vc.patchSize;
  const layers: SiglipLayer[] = [];
  for (let i = 0; i < vc.numLayers; i++) {
    const p = `${m}.encoder.layers.${i}`;
    layers.push({
      norm1: layerNorm(`${p}.layer_norm1`),
      q: linear(`${p}.self_attn.q_proj`, vh, vh),
      k: linear(`${p}.self_attn.k_proj`, vh, vh),
      v: linear(`${p}.self_attn.v_proj`, vh, vh),
      o: linear(`${p}.self_attn.out_proj`, vh, vh),
      norm2: layerNorm(`${p}.layer_norm2`),
      fc1: linear(`${p}.mlp.fc1`, vc.intermediateSize, vh),
      fc2: linear(`${p}.mlp.fc2`, vh, vc.intermediateSize),
    });
  }
  const vision: Gemma3VisionWeights = {
    patchEmbed: {
      w: get(`${m}.embeddings.patch_embedding.weight`, [vh, vc.numChannels, vc.patchSize, vc.patchSize]).data,
      b: get(`${m}.embeddings.patch_embedding.bias`, [vh]).data,
      out: vh,
      in: patchIn,
    },
    positionEmbed: get(`${m}.embeddings.position_embedding.weight`, [side * side, vh]).data,
    layers,
    postNorm: layerNorm(`${m}.post_layernorm`),
    softEmbNorm: get('multi_modal_projector.mm_soft_emb_norm.weight', [vh]).data,
    projection: get('multi_modal_projector.mm_input_projection_weight', [vh, text.config.hiddenSize]).data,
  };
  return {
    text, vision, visionConfig: vc, mmTokensPerImage: mm,
    imageTokenId: raw.image_token_index ?? 262144,
    boiTokenId: raw.boi_token_index ?? 255999,
    eoiTokenId: raw.eoi_token_index ?? 256000,
  };
}

// ---------------------------------------------------------------- vision tower and projector

/** nn.LayerNorm: (x - mean) / sqrt(var + eps) * w + b, the variance biased. */
export function layerNorm(x: Float64Array, n: LayerNormWeights, eps: number): Float64Array {
  let mean = 0;
  for (const v of x) mean += v;
  mean /= x.length;
  let v2 = 0;
  for (const v of x) v2 += (v - mean) * (v - mean);
  const r = 1 / Math.sqrt(v2 / x.length + eps);
  return x.map((v, i) => (v - mean) * r * n.w[i]! + n.b[i]!);
}

/**
 * The tower's output for one image: pixelValues [channels, S, S] (S = image_size) ->
 * [(S / patch)^2, hidden], patches row-major over the grid, after post_layernorm.
 */
export function siglipTower(ref: Gemma3VlReference, pixelValues: ArrayLike<number>): Float64Array[] {
  const vc = ref.visionConfig;
  const w = ref.vision;
  const { imageSize: S, patchSize: p, numChannels: C, hiddenSize: vh, numHeads } = vc;
  if (pixelValues.length !== C * S * S) throw new Error(`gemma3-vl: ${pixelValues.length} pixel values, expected ${C} x ${S} x ${S}`);
  const side = S / p;
  const n = side * side;
  // Patch embedding (Conv2d, stride = kernel) plus the position row.
  const xs: Float64Array[] = [];
  const patch = new Float64Array(C * p * p);
  for (let r = 0; r < side; r++) {
    for (let c = 0; c < side; c++) {
      for (let ch = 0; ch < C; ch++) {
        for (let i = 0; i < p; i++) {
          for (let j = 0; j < p; j++) patch[(ch * p + i) * p + j] = pixelValues[(ch * S + r * p + i) * S + c * p + j]!;
        }
      }
      const x = matvec(w.patchEmbed, patch);
      const pos = r * side + c;
      for (let k = 0; k < vh; k++) x[k]! += w.positionEmbed[pos * vh + k]!;
      xs.push(x);
    }
  }
  const d = vh / numHeads;
  const scale = 1 / Math.sqrt(d);
  for (const L of w.layers) {
    const h = xs.map((x) => layerNorm(x, L.norm1, vc.layerNormEps));
    const q = h.map((x) => matvec(L.q, x));
    const k = h.map((x) => matvec(L.k, x));
    const v = h.map((x) => matvec(L.v, x));
    for (let i = 0; i < n; i++) {
      const attn = new Float64Array(vh);
      for (let hd = 0; hd < numHeads; hd++) {
        const scores = new Float64Array(n);
        for (let j = 0; j < n; j++) {
          let s = 0;
          for (let t = 0; t < d; t++) s += q[i]![hd * d + t]! * k[j]![hd * d + t]!;
          scores[j] = s * scale;
        }
        const pr = softmax(scores);
        for (let j = 0; j < n; j++) for (let t = 0; t < d; t++) attn[hd * d + t]! += pr[j]! * v[j]![hd * d + t]!;
      }
      const o = matvec(L.o, attn);
      for (let t = 0; t < vh; t++) xs[i]![t]! += o[t]!;
    }
    for (let i = 0; i < n; i++) {
      const hidden = matvec(L.fc1, layerNorm(xs[i]!, L.norm2, vc.layerNormEps)).map(geluTanh);
      const out = matvec(L.fc2, hidden);
      for (let t = 0; t < vh; t++) xs[i]![t]! += out[t]!;
    }
  }
  return xs.map((x) => layerNorm(x, w.postNorm, vc.layerNormEps));
}

/**
 * The projector: the tower's rows as a (side x side) grid, averaged over kernel x kernel squares
 * (AvgPool2d, stride = kernel = side / sqrt(mmTokens)) into mmTokens rows (row-major), each
 * RMS-normalised with (1 + w) (eps = the tower's layer_norm_eps) and multiplied by the projection:
 * [mmTokens * textHidden].
 */
export function gemma3Project(ref: Gemma3VlReference, tower: Float64Array[]): Float64Array {
  const vh = ref.visionConfig.hiddenSize;
  const th = ref.text.config.hiddenSize;
  const side = Math.round(Math.sqrt(tower.length));
  const tokensSide = Math.round(Math.sqrt(ref.mmTokensPerImage));
  const kernel = side / tokensSide;
  const out = new Float64Array(ref.mmTokensPerImage * th);
  for (let a = 0; a < tokensSide; a++) {
    for (let b = 0; b < tokensSide; b++) {
      const pooled = new Float64Array(vh);
      for (let i = 0; i < kernel; i++) {
        for (let j = 0; j < kernel; j++) {
          const row = tower[(a * kernel + i) * side + b * kernel + j]!;
          for (let t = 0; t < vh; t++) pooled[t]! += row[t]!;
        }
      }
      for (let t = 0; t < vh; t++) pooled[t]! /= kernel * kernel;
      const normed = rmsNorm(pooled, ref.vision.softEmbNorm, ref.visionConfig.layerNormEps, 1);
      const o = (a * tokensSide + b) * th;
      for (let t = 0; t < vh; t++) {
        const x = normed[t]!;
        for (let u = 0; u < th; u++) out[o + u]! += x * ref.vision.projection[t * th + u]!;
      }
    }
  }
  return out;
}

/** One image's rows for the text model: pixelValues [3, S, S] -> [mmTokensPerImage * textHidden]. */
export function siglipEncode(ref: Gemma3VlReference, pixelValues: ArrayLike<number>): Float64Array {
  return gemma3Project(ref, siglipTower(ref, pixelValues));
}

// ---------------------------------------------------------------- text model

/**
 * Which image each token belongs to (transformers' image_group_ids): each maximal run of image
 * tokens is one image (numbered from 0); other tokens -1.
 */
export function imageGroups(tokenIds: readonly number[], imageTokenId: number): number[] {
  let next = -1;
  return tokenIds.map((t, i) => (t !== imageTokenId ? -1 : i > 0 && tokenIds[i - 1] === imageTokenId ? next : ++next));
}

/**
 * Whether query i may attend to key j on a layer with this window (null: full attention): causal
 * (and j > i - window on a sliding layer), or both in the same image.
 */
export function gemma3MayAttend(groups: readonly number[], window: number | null, i: number, j: number): boolean {
  if (j <= i && (window === null || j > i - window)) return true;
  return groups[i]! >= 0 && groups[i] === groups[j];
}

export interface Gemma3VlImage {
  /** [3, S, S] channels first, as the processor writes it. */
  pixelValues: ArrayLike<number>;
}

/**
 * A prompt with images, then greedy steps: prefill runs the whole prompt at once with the explicit
 * mask (gemma3MayAttend) and leaves its keys and values in the text reference's KV cache, which
 * step() extends one text token at a time (causal, windowed).
 */
export class Gemma3VlSession {
  private readonly text: ReferenceSession;

  constructor(readonly model: Gemma3VlReference) {
    this.text = new ReferenceSession(model.text);
  }

  /** Entries in the cache. */
  get length(): number {
    return this.text.position;
  }

  /** Logits at every position of the prompt; the images' rows at its <image_soft_token>s in order. */
  prefill(tokenIds: number[], images: Gemma3VlImage[] = []): Float64Array[] {
    return this.prefillRows(tokenIds, images.map((im) => siglipEncode(this.model, im.pixelValues)));
  }

  /** prefill with each image given as its rows for the text model ([mmTokensPerImage * hidden] each). */
  prefillRows(tokenIds: number[], imageRows: Float64Array[]): Float64Array[] {
    if (this.length !== 0) throw new Error('gemma3-vl: prefill on a used session');
    const { text, imageTokenId, mmTokensPerImage } = this.model;
    const c = text.config;
    const hidden = c.hiddenSize;
    const placeholders = tokenIds.filter((t) => t === imageTokenId).length;
    if (placeholders !== imageRows.length * mmTokensPerImage) {
      throw new Error(`gemma3-vl: ${placeholders} image tokens for ${imageRows.length} images of ${mmTokensPerImage}`);
    }
    for (const r of imageRows) if (r.length !== mmTokensPerImage * hidden) throw new Error(`gemma3-vl: image rows of ${r.length} values`);
    const all = imageRows.flatMap((r) => Array.from({ length: mmTokensPerImage }, (_, k) => r.subarray(k * hidden, (k + 1) * hidden)));
    let next = 0;
    // Text rows scaled by sqrt(hidden); image rows as the projector wrote them.
    const xs = tokenIds.map((t) => {
      if (t === imageTokenId) return Float64Array.from(all[next++]!);
      if (!Number.isInteger(t) || t < 0 || t >= c.vocabSize) throw new Error(`token ${t} out of range`);
      return text.embed.slice(t * hidden, (t + 1) * hidden).map((v) => v * c.embedScale);
    });
    const groups = imageGroups(tokenIds, imageTokenId);
    const n = tokenIds.length;
    const d = c.headDim;
    const group = c.numHeads / c.numKvHeads;
    const norm = (v: Float64Array, w: Float64Array) => rmsNorm(v, w, c.rmsNormEps, c.normOffset);
    for (let l = 0; l < text.layers.length; l++) {
      const L = text.layers[l]!;
      const q: Float64Array[] = [], k: Float64Array[] = [], v: Float64Array[] = [];
      for (let i = 0; i < n; i++) {
        const hn = norm(xs[i]!, L.inputNorm);
        const qi = matvec(L.q, hn), ki = matvec(L.k, hn);
        for (let hd = 0; hd < c.numHeads; hd++) {
          if (L.qNorm) qi.set(norm(qi.subarray(hd * d, (hd + 1) * d), L.qNorm), hd * d);
          applyRope(qi, hd * d, d, i, L.invFreq, L.ropeScale);
        }
        for (let hd = 0; hd < c.numKvHeads; hd++) {
          if (L.kNorm) ki.set(norm(ki.subarray(hd * d, (hd + 1) * d), L.kNorm), hd * d);
          applyRope(ki, hd * d, d, i, L.invFreq, L.ropeScale);
        }
        q.push(qi);
        k.push(ki);
        v.push(matvec(L.v, hn));
      }
      const window = c.slidingWindow[l] ?? null;
      for (let i = 0; i < n; i++) {
        const keys: number[] = [];
        for (let j = 0; j < n; j++) if (gemma3MayAttend(groups, window, i, j)) keys.push(j);
        const attn = new Float64Array(c.numHeads * d);
        for (let hd = 0; hd < c.numHeads; hd++) {
          const kvh = Math.floor(hd / group);
          const scores = keys.map((j) => {
            let s = 0;
            for (let t = 0; t < d; t++) s += q[i]![hd * d + t]! * k[j]![kvh * d + t]!;
            s *= c.attnScale;
            return c.attnSoftcap === null ? s : softcap(s, c.attnSoftcap);
          });
          const p = softmax(scores);
          keys.forEach((j, idx) => {
            for (let t = 0; t < d; t++) attn[hd * d + t]! += p[idx]! * v[j]![kvh * d + t]!;
          });
        }
        const a = norm(matvec(L.o, attn), L.postNorm);
        for (let t = 0; t < hidden; t++) xs[i]![t]! += a[t]!;
      }
      for (let i = 0; i < n; i++) {
        const m = norm(gatedMlp(L, norm(xs[i]!, L.preFeedforwardNorm!), c.hiddenAct), L.postFeedforwardNorm!);
        for (let t = 0; t < hidden; t++) xs[i]![t]! += m[t]!;
      }
      // The cache step() continues from.
      this.text.keys[l]!.push(...k);
      this.text.values[l]!.push(...v);
    }
    this.text.position = n;
    const cap = c.finalSoftcap;
    return xs.map((x) => {
      const logits = matvec(text.lmHead, norm(x, text.norm));
      return cap === null ? logits : logits.map((z) => softcap(z, cap));
    });
  }

  /** One generated (text) token after prefill. */
  step(token: number): Float64Array {
    if (token === this.model.imageTokenId) throw new Error('gemma3-vl: an image token outside prefill');
    return this.text.step(token);
  }
}
