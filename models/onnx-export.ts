// Writes an ONNX export of a Hugging Face decoder checkpoint in the layout optimum and
// onnx-community publish: onnx/model.onnx (+ onnx/model.onnx_data) with inputs input_ids,
// attention_mask, position_ids, past_key_values.{i}.key/value and outputs logits,
// present.{i}.key/value, beside config.json and the tokenizer files. Built from the same
// safetensors weights the native engine loads; fp32, or int4 weights through com.microsoft's
// MatMulNBits (block-wise, symmetric, 32 weights per f32 scale) with the embedding kept in f32.

import { copyFileSync, mkdirSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Checkpoint, decoderShape, readConfig, type DecoderShape } from './onnx-checkpoint.js';
import { GraphBuilder } from './onnx-graph.js';
import { DataType } from './onnx-proto.js';

export type OnnxQuantization = 'fp32' | 'int4';
export const ONNX_QUANTIZATIONS: readonly OnnxQuantization[] = ['fp32', 'int4'];

/** Where an export's graph lives inside a model directory (optimum's layout). */
export const ONNX_MODEL_PATH = join('onnx', 'model.onnx');
/** Weights per int4 scale. */
export const INT4_BLOCK = 32;

export interface ExportOnnxOptions {
  /** Model directory with config.json and safetensors. */
  modelDir: string;
  /** Directory to write (default: modelDir). config.json and the tokenizer files are copied there. */
  out?: string;
  quantization?: OnnxQuantization;
  /** Called after each layer with (layers done, layers). */
  onProgress?: (done: number, total: number) => void;
}

/** Files of a model directory that an export elsewhere carries along. */
const CARRIED = /^(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens|chat_template)\.(json|jinja)$|^(vocab\.json|merges\.txt|tokenizer\.model)$/;

export async function exportOnnx(opts: ExportOnnxOptions): Promise<{ path: string; quantization: OnnxQuantization }> {
  const modelDir = resolve(opts.modelDir);
  const out = resolve(opts.out ?? modelDir);
  const quantization = opts.quantization ?? 'fp32';
  if (!ONNX_QUANTIZATIONS.includes(quantization)) throw new Error(`onnx export: quantization must be fp32 or int4, got ${String(quantization)}`);
  const shape = decoderShape(readConfig(modelDir));
  const onnxDir = join(out, 'onnx');
  mkdirSync(onnxDir, { recursive: true });
  const tmp = join(onnxDir, `model.onnx.tmp-${process.pid}`);
  const g = new GraphBuilder(join(onnxDir, 'model.onnx_data'));
  const ckpt = new Checkpoint(modelDir);
  try {
    buildDecoder(g, ckpt, shape, quantization, opts.onProgress);
    writeFileSync(tmp, g.finish({
      name: 'sluice_decoder',
      opsets: { '': 17, ...(quantization === 'int4' && { 'com.microsoft': 1 }) },
      metadata: { 'sluice.quantization': quantization, 'sluice.architecture': shape.architecture },
    }));
    renameSync(tmp, join(out, ONNX_MODEL_PATH));
  } catch (err) {
    g.abandon();
    throw err;
  } finally {
    ckpt.close();
  }
  if (out !== modelDir) {
    for (const f of readdirSync(modelDir)) if (CARRIED.test(f)) copyFileSync(join(modelDir, f), join(out, f));
  }
  return { path: join(out, ONNX_MODEL_PATH), quantization };
}

function buildDecoder(g: GraphBuilder, ckpt: Checkpoint, s: DecoderShape, quantization: OnnxQuantization,
  onProgress: ExportOnnxOptions['onProgress']): void {
  const { hiddenSize: h, headDim: d, numHeads: nH, numKvHeads: nKv, vocabSize: v } = s;
  const qDim = nH * d;
  const kvDim = nKv * d;
  const eps = g.float(s.rmsNormEps);

  const inputIds = g.input('input_ids', DataType.INT64, ['batch_size', 'sequence_length']);
  const attentionMask = g.input('attention_mask', DataType.INT64, ['batch_size', 'total_sequence_length']);
  const positionIds = g.input('position_ids', DataType.INT64, ['batch_size', 'sequence_length']);

  /** y = x W^T (+ b) for a checkpoint Linear W [out, in]. */
  const linear = (x: string, name: string, out: number, inp: number, bias: boolean): string => {
    const w = ckpt.f32(`${name}.weight`, [out, inp]);
    let y: string;
    if (quantization === 'int4' && inp % INT4_BLOCK === 0) {
      const q = quantizeInt4(w, out, inp);
      const b = g.initializer(`${name}.weight_q4`, DataType.UINT8, [out, inp / INT4_BLOCK, INT4_BLOCK / 2], q.packed);
      const sc = g.floatTensor(`${name}.weight_scales`, [out * (inp / INT4_BLOCK)], q.scales);
      y = g.op('MatMulNBits', [x, b, sc], { K: inp, N: out, bits: 4, block_size: INT4_BLOCK }, 'com.microsoft');
    } else {
      y = g.op('MatMul', [x, g.floatTensor(`${name}.weight_t`, [inp, out], transpose(w, out, inp))]);
    }
    return bias ? g.op('Add', [y, g.floatTensor(`${name}.bias`, [out], ckpt.f32(`${name}.bias`, [out]))]) : y;
  };
  /** RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * w. */
  const rmsNorm = (x: string, weightName: string, n: number): string => {
    const ms = g.op('ReduceMean', [g.op('Mul', [x, x])], { axes: [-1], keepdims: 1 });
    const normed = g.op('Div', [x, g.op('Sqrt', [g.op('Add', [ms, eps])])]);
    return g.op('Mul', [normed, g.floatTensor(weightName, [n], ckpt.f32(weightName, [n]))]);
  };

  // Rope tables [contextLength, d] (each half repeated), cos/sin of f64 angles as the native engine
  // computes them; gathered by position: [B, 1, S, d].
  const { cos, sin } = ropeTables(s.invFreq, s.contextLength, d);
  const ropeAt = (table: string) => g.op('Unsqueeze', [g.op('Gather', [table, positionIds], { axis: 0 }), g.int64s([1])]);
  const cosB = ropeAt(g.floatTensor('rope_cos', [s.contextLength, d], cos));
  const sinB = ropeAt(g.floatTensor('rope_sin', [s.contextLength, d], sin));
  const rope = (x: string): string => {
    const [x1, x2] = g.node('Split', [x, g.int64s([d / 2, d / 2])], { axis: -1 }, 2);
    const rotated = g.op('Concat', [g.op('Neg', [x2!]), x1!], { axis: -1 });
    return g.op('Add', [g.op('Mul', [x, cosB]), g.op('Mul', [rotated, sinB])]);
  };

  // Additive attention mask [B, 1, S, T]: query i (absolute index P + i, P = T - S) sees key j
  // when j <= P + i and attention_mask[b, j] is 1; else -1e9 (finite, so a row of padding stays
  // a uniform softmax instead of NaN).
  const total = g.op('Gather', [g.op('Shape', [attentionMask]), g.int64s([1], true)], { axis: 0 });
  const seqLen = g.op('Gather', [g.op('Shape', [inputIds]), g.int64s([1], true)], { axis: 0 });
  const past = g.op('Sub', [total, seqLen]);
  const keyIdx = g.op('Unsqueeze', [g.op('Range', [g.int64s([0], true), total, g.int64s([1], true)]), g.int64s([0])]);
  const queryIdx = g.op('Unsqueeze', [g.op('Range', [past, total, g.int64s([1], true)]), g.int64s([1])]);
  const causal = g.op('LessOrEqual', [keyIdx, queryIdx]);
  const padding = g.op('Cast', [g.op('Unsqueeze', [attentionMask, g.int64s([1, 2])])], { to: DataType.BOOL });
  const maskBias = g.op('Where', [g.op('And', [causal, padding]), g.float(0), g.float(-1e9)]);
  const scale = g.float(1 / Math.sqrt(d));

  let x = g.op('Gather', [g.floatTensor('model.embed_tokens.weight', [v, h], ckpt.f32('model.embed_tokens.weight', [v, h])), inputIds], { axis: 0 });
  for (let i = 0; i < s.numLayers; i++) {
    const p = `model.layers.${i}`;
    const xn = rmsNorm(x, `${p}.input_layernorm.weight`, h);
    // [B, S, heads * d] -> [B, S, heads, d] (-> per-head RMSNorm) -> [B, heads, S, d] -> rope
    const heads = (y: string, n: number, norm: string | undefined): string => {
      let t = g.op('Reshape', [y, g.int64s([0, 0, n, d])]);
      if (norm !== undefined) t = rmsNorm(t, norm, d);
      return g.op('Transpose', [t], { perm: [0, 2, 1, 3] });
    };
    const q = rope(heads(linear(xn, `${p}.self_attn.q_proj`, qDim, h, s.qkvBias), nH, s.qkNorm ? `${p}.self_attn.q_norm.weight` : undefined));
    const k = rope(heads(linear(xn, `${p}.self_attn.k_proj`, kvDim, h, s.qkvBias), nKv, s.qkNorm ? `${p}.self_attn.k_norm.weight` : undefined));
    const vv = heads(linear(xn, `${p}.self_attn.v_proj`, kvDim, h, s.qkvBias), nKv, undefined);
    const kvDims = ['batch_size', nKv, 'past_sequence_length', d];
    const presentDims = ['batch_size', nKv, 'total_sequence_length', d];
    const pastK = g.input(`past_key_values.${i}.key`, DataType.FLOAT, kvDims);
    const pastV = g.input(`past_key_values.${i}.value`, DataType.FLOAT, kvDims);
    const [presentK] = g.node('Concat', [pastK, k], { axis: 2 }, [`present.${i}.key`]);
    const [presentV] = g.node('Concat', [pastV, vv], { axis: 2 }, [`present.${i}.value`]);
    g.output(`present.${i}.key`, DataType.FLOAT, presentDims);
    g.output(`present.${i}.value`, DataType.FLOAT, presentDims);
    // GQA without repeating K/V: the nH / nKv query heads of a KV head become rows of one matrix,
    // q [B, nH, S, d] -> [B, nKv, group * S, d] (heads are kv-major, so this is a reshape).
    const qGrouped = g.op('Reshape', [q, g.int64s([0, nKv, -1, d])]);
    const scores = g.op('Mul', [g.op('MatMul', [qGrouped, g.op('Transpose', [presentK!], { perm: [0, 1, 3, 2] })]), scale]);
    const masked = g.op('Add', [g.op('Reshape', [scores, g.int64s([0, nH, -1, 0])]), maskBias]);  // [B, nH, S, T]
    const probs = g.op('Reshape', [g.op('Softmax', [masked], { axis: -1 }), g.int64s([0, nKv, -1, 0])]);
    const attn = g.op('Reshape', [g.op('MatMul', [probs, presentV!]), g.int64s([0, nH, -1, d])]);  // [B, nH, S, d]
    const merged = g.op('Reshape', [g.op('Transpose', [attn], { perm: [0, 2, 1, 3] }), g.int64s([0, 0, qDim])]);
    x = g.op('Add', [x, linear(merged, `${p}.self_attn.o_proj`, h, qDim, s.oBias)]);

    const xn2 = rmsNorm(x, `${p}.post_attention_layernorm.weight`, h);
    const gate = linear(xn2, `${p}.mlp.gate_proj`, s.intermediateSize, h, s.mlpBias);
    const up = linear(xn2, `${p}.mlp.up_proj`, s.intermediateSize, h, s.mlpBias);
    const act = g.op('Mul', [g.op('Mul', [gate, g.op('Sigmoid', [gate])]), up]);
    x = g.op('Add', [x, linear(act, `${p}.mlp.down_proj`, h, s.intermediateSize, s.mlpBias)]);
    onProgress?.(i + 1, s.numLayers);
  }
  const final = rmsNorm(x, 'model.norm.weight', h);
  const headName = s.tieWordEmbeddings || !ckpt.has('lm_head.weight') ? 'model.embed_tokens' : 'lm_head';
  const logits = linear(final, headName, v, h, false);
  g.node('Identity', [logits], {}, ['logits']);
  g.output('logits', DataType.FLOAT, ['batch_size', 'sequence_length', v]);
}

function transpose(w: Float32Array, rows: number, cols: number): Float32Array {
  const t = new Float32Array(w.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) t[c * rows + r] = w[r * cols + c]!;
  return t;
}

function ropeTables(invFreq: Float32Array, positions: number, d: number): { cos: Float32Array; sin: Float32Array } {
  const half = d / 2;
  const cos = new Float32Array(positions * d);
  const sin = new Float32Array(positions * d);
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * invFreq[i]!;
      cos[p * d + i] = cos[p * d + half + i] = Math.cos(angle);
      sin[p * d + i] = sin[p * d + half + i] = Math.sin(angle);
    }
  }
  return { cos, sin };
}

/**
 * MatMulNBits' int4 layout for W [n, k]: per row, k / 32 blocks of 16 bytes (two weights a byte,
 * the lower index in the low nibble), unsigned with the default zero point 8, and one f32 scale
 * per block (max |w| / 7, so the block's largest weight is exact up to the scale's rounding).
 */
export function quantizeInt4(w: Float32Array, n: number, k: number): { packed: Uint8Array; scales: Float32Array } {
  const blocks = k / INT4_BLOCK;
  const packed = new Uint8Array(n * k / 2);
  const scales = new Float32Array(n * blocks);
  for (let r = 0; r < n; r++) {
    for (let b = 0; b < blocks; b++) {
      const base = r * k + b * INT4_BLOCK;
      let amax = 0;
      for (let j = 0; j < INT4_BLOCK; j++) amax = Math.max(amax, Math.abs(w[base + j]!));
      const scale = Math.fround(amax / 7);
      scales[r * blocks + b] = scale;
      const inv = scale === 0 ? 0 : 1 / scale;
      for (let j = 0; j < INT4_BLOCK; j += 2) {
        const lo = Math.min(15, Math.max(0, Math.round(w[base + j]! * inv) + 8));
        const hi = Math.min(15, Math.max(0, Math.round(w[base + j + 1]! * inv) + 8));
        packed[(base + j) / 2] = lo | (hi << 4);
      }
    }
  }
  return { packed, scales };
}
