// What the ONNX export reads from a Hugging Face checkpoint: config.json as the native engine
// understands it (native/src/model/model_config.cpp: the same architectures, biases, norms and
// rope scalings), and safetensors tensors widened to f32 one at a time.

import { closeSync, existsSync, openSync, readdirSync, readFileSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { ARCHITECTURES, architectureSpec, specOfModelType, SUPPORTED_ARCHITECTURES, usesSlidingWindow, type Architecture, type ArchitectureSpec } from '../src/engine/architectures.js';

/** The families the export's graph (onnx-graph.ts) writes: dense MLPs, plain RMSNorm and rope, no nested text config. */
const exportable = (spec: ArchitectureSpec) => spec.mlp === 'dense' && !spec.gemmaNorms && !spec.sandwichNorms && spec.textConfig === null && !spec.mrope;

export type OnnxArchitecture = {
  [A in Architecture]: (typeof ARCHITECTURES)[A] extends { mlp: 'dense'; gemmaNorms: false; mrope: false } ? A : never;
}[Architecture];

export const ONNX_ARCHITECTURES = SUPPORTED_ARCHITECTURES.filter((a) => exportable(ARCHITECTURES[a])) as OnnxArchitecture[];

export interface DecoderShape {
  architecture: OnnxArchitecture;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  /** Positions the export's rope tables cover (max_position_embeddings, or the sliding window as the native engine serves it). */
  contextLength: number;
  tieWordEmbeddings: boolean;
  qkvBias: boolean;
  oBias: boolean;
  mlpBias: boolean;
  qkNorm: boolean;
  /** [headDim / 2] rope inverse frequencies, scaling applied, rounded to f32 as the native engine does. */
  invFreq: Float32Array;
}


/** The decoder shape of a config.json; throws on what the native engine would refuse too. */
export function decoderShape(config: Record<string, any>): DecoderShape {
  const arch = config.architectures?.[0] as OnnxArchitecture;
  const spec = architectureSpec(arch);
  if (!spec) throw new Error(`onnx export: unsupported architecture ${String(arch)} (supported: ${ONNX_ARCHITECTURES.join(', ')})`);
  if (!exportable(spec)) {
    throw new Error(`onnx export: ${arch} is served by the native engine only; the ONNX export covers the dense families (${ONNX_ARCHITECTURES.join(', ')})`);
  }
  if ((config.hidden_act ?? 'silu') !== 'silu') throw new Error(`onnx export: hidden_act ${config.hidden_act} is not supported (only silu)`);
  if ((config.partial_rotary_factor ?? 1) !== 1) throw new Error('onnx export: partial_rotary_factor is not supported');
  const numHeads = config.num_attention_heads as number;
  const headDim = (config.head_dim ?? config.hidden_size / numHeads) as number;
  let contextLength = (config.max_position_embeddings ?? 2048) as number;
  const sliding = usesSlidingWindow(specOfModelType(config.model_type), config);
  // As the native engine: a sliding window limits the context instead of changing attention.
  if (sliding && config.sliding_window > 0 && config.sliding_window < contextLength) contextLength = config.sliding_window;
  const attentionBias = config.attention_bias === true;
  return {
    architecture: arch,
    hiddenSize: config.hidden_size,
    intermediateSize: config.intermediate_size,
    numLayers: config.num_hidden_layers,
    numHeads,
    numKvHeads: config.num_key_value_heads ?? numHeads,
    headDim,
    vocabSize: config.vocab_size,
    rmsNormEps: config.rms_norm_eps ?? 1e-6,
    contextLength,
    tieWordEmbeddings: config.tie_word_embeddings ?? false,
    qkvBias: spec.qkvBias || attentionBias,
    oBias: attentionBias,
    mlpBias: config.mlp_bias === true,
    qkNorm: spec.qkNorm,
    invFreq: ropeInvFreq(headDim, config.rope_theta ?? 10000, config.rope_scaling ?? null),
  };
}

function ropeInvFreq(headDim: number, theta: number, scaling: Record<string, any> | null): Float32Array {
  const type = scaling ? (scaling.rope_type ?? scaling.type ?? 'default') : 'default';
  const out = new Float32Array(headDim / 2);
  for (let i = 0; i < out.length; i++) {
    let inv = 1 / Math.pow(theta, (2 * i) / headDim);
    if (type === 'linear') inv /= scaling!.factor ?? 1;
    else if (type === 'llama3') {
      const factor = scaling!.factor ?? 8;
      const low = scaling!.low_freq_factor ?? 1;
      const high = scaling!.high_freq_factor ?? 4;
      const orig = scaling!.original_max_position_embeddings ?? 8192;
      const wavelen = (2 * Math.PI) / inv;
      if (wavelen > orig / low) inv /= factor;
      else if (wavelen >= orig / high) {
        const smooth = (orig / wavelen - low) / (high - low);
        inv = ((1 - smooth) * inv) / factor + smooth * inv;
      }
    } else if (type !== 'default') throw new Error(`onnx export: rope_scaling type ${type} is not supported (linear, llama3)`);
    out[i] = inv;
  }
  return out;
}

interface TensorEntry { file: string; dtype: string; shape: number[]; begin: number; end: number }

/** The tensors of a model directory's safetensors files, read on demand. */
export class Checkpoint {
  private readonly entries = new Map<string, TensorEntry>();
  private readonly fds = new Map<string, number>();

  constructor(readonly dir: string) {
    const files = readdirSync(dir).filter((f) => f.endsWith('.safetensors')).sort();
    if (files.length === 0) throw new Error(`onnx export: no .safetensors files in ${dir}`);
    for (const file of files) {
      const fd = openSync(join(dir, file), 'r');
      this.fds.set(file, fd);
      const head = Buffer.alloc(8);
      readSync(fd, head, 0, 8, 0);
      const headerLength = Number(head.readBigUInt64LE(0));
      const header = Buffer.alloc(headerLength);
      readSync(fd, header, 0, headerLength, 8);
      const json = JSON.parse(header.toString('utf8')) as Record<string, any>;
      for (const [name, t] of Object.entries(json)) {
        if (name === '__metadata__') continue;
        const [begin, end] = t.data_offsets as [number, number];
        this.entries.set(name, { file, dtype: t.dtype, shape: t.shape, begin: 8 + headerLength + begin, end: 8 + headerLength + end });
      }
    }
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  /** A tensor as f32 (bf16 and f16 widen exactly); throws when missing or of another shape. */
  f32(name: string, shape: number[]): Float32Array {
    const e = this.entries.get(name);
    if (!e) throw new Error(`onnx export: tensor ${name} is missing from ${this.dir}`);
    if (e.shape.length !== shape.length || e.shape.some((d, i) => d !== shape[i])) {
      throw new Error(`onnx export: ${name} has shape [${e.shape}], expected [${shape}]`);
    }
    const bytes = Buffer.alloc(e.end - e.begin);
    readSync(this.fds.get(e.file)!, bytes, 0, bytes.length, e.begin);
    const n = shape.reduce((a, b) => a * b, 1);
    switch (e.dtype) {
      case 'F32':
        return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + 4 * n));
      case 'BF16': {
        const half = new Uint16Array(bytes.buffer, bytes.byteOffset, n);
        const bits = new Uint32Array(n);
        for (let i = 0; i < n; i++) bits[i] = half[i]! << 16;
        return new Float32Array(bits.buffer);
      }
      case 'F16': {
        const out = new Float32Array(n);
        for (let i = 0; i < n; i++) out[i] = f16ToF32(bytes.readUInt16LE(2 * i));
        return out;
      }
      default:
        throw new Error(`onnx export: ${name} has dtype ${e.dtype} (supported: F32, BF16, F16)`);
    }
  }

  close(): void {
    for (const fd of this.fds.values()) closeSync(fd);
    this.fds.clear();
  }
}

function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

export function readConfig(dir: string): Record<string, any> {
  const path = join(dir, 'config.json');
  if (!existsSync(path)) throw new Error(`onnx export: ${path} does not exist`);
  return JSON.parse(readFileSync(path, 'utf8')) as Record<string, any>;
}
