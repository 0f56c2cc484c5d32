// A GGUF (v3) writer for the llama.cpp peer of bench:engine: the bench model's safetensors
// checkpoint rewritten as the GGUF llama.cpp loads, with the same weights bit for bit (2-D
// tensors bf16 as stored, or Q8_0, or Q4_0 projections beside a Q8_0 embedding and output; 1-D
// norms and biases f32 as llama.cpp wants them), the
// architecture's hyperparameters and the tokenizer's vocabulary and merges. Llama and Qwen2
// checkpoints only (what the bench presets are). The format, from ggml's docs/gguf.md: a header
// (magic, version, tensor count, metadata count), metadata key/values, tensor infos (name, dims
// innermost first, ggml type, offset into the data section), then the data, 32-byte aligned.
import { closeSync, existsSync, openSync, readFileSync, readSync, renameSync, writeSync } from 'node:fs';
import { join } from 'node:path';

/** ggml tensor types this writer emits (ggml.h's enum ggml_type). */
export const GGML_F32 = 0;
export const GGML_Q4_0 = 2;
export const GGML_Q8_0 = 8;
export const GGML_BF16 = 30;
export type GgufWeightType = 'bf16' | 'q8_0' | 'q4_0';

const ALIGNMENT = 32;
// GGUF metadata value types (gguf.h).
const T_UINT32 = 4, T_INT32 = 5, T_FLOAT32 = 6, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9;

type MetaValue =
  | { type: 'u32' | 'i32' | 'f32'; value: number }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'strings'; value: string[] }
  | { type: 'i32s'; value: Int32Array };

/** Little-endian byte builder for the header and metadata. */
class Bytes {
  private chunks: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  i32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.push(b);
  }
  u64(v: number | bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  f32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  done(): Buffer {
    return Buffer.concat(this.chunks, this.length);
  }
}

function writeMeta(out: Bytes, key: string, v: MetaValue): void {
  out.str(key);
  switch (v.type) {
    case 'u32': out.u32(T_UINT32); out.u32(v.value); break;
    case 'i32': out.u32(T_INT32); out.i32(v.value); break;
    case 'f32': out.u32(T_FLOAT32); out.f32(v.value); break;
    case 'bool': out.u32(T_BOOL); out.push(Buffer.from([v.value ? 1 : 0])); break;
    case 'string': out.u32(T_STRING); out.str(v.value); break;
    case 'strings':
      out.u32(T_ARRAY); out.u32(T_STRING); out.u64(v.value.length);
      for (const s of v.value) out.str(s);
      break;
    case 'i32s':
      out.u32(T_ARRAY); out.u32(T_INT32); out.u64(v.value.length);
      out.push(Buffer.from(v.value.buffer, v.value.byteOffset, v.value.byteLength));
      break;
  }
}

const bf16ToF32 = (h: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE((h << 16) >>> 0);
  return b.readFloatLE(0);
};

function toF32(raw: Buffer, dtype: string): Buffer {
  if (dtype === 'F32') return raw;
  const n = raw.length / 2;
  const out = Buffer.alloc(n * 4);
  for (let i = 0; i < n; i++) {
    const h = raw.readUInt16LE(2 * i);
    out.writeFloatLE(dtype === 'BF16' ? bf16ToF32(h) : halfToF32(h), 4 * i);
  }
  return out;
}

function halfToF32(h: number): number {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** f32 -> f16 bits, round to nearest even (Q8_0 block scales). */
function f32ToHalf(f: number): number {
  const b = Buffer.alloc(4);
  b.writeFloatLE(f);
  const x = b.readUInt32LE(0);
  const sign = (x >>> 16) & 0x8000, ax = x & 0x7fffffff;
  if (ax >= 0x477ff000) return sign | 0x7c00;
  if (ax < 0x38800000) return sign | Math.round(Math.abs(f) * 2 ** 24);  // subnormal; ties are immaterial here
  const mant = ax & 0x7fffff;
  let h = (((ax >>> 23) - 112) << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;
  return sign | h;
}

/**
 * Q8_0 as ggml defines it (ggml-quants.c quantize_row_q8_0_ref): per 32 values one f16 scale
 * d = max|x| / 127 and 32 int8 q = round(x / d), 34 bytes a block. rows: [N, K], K % 32 == 0.
 */
export function quantizeQ8_0(values: Float32Array): Buffer {
  if (values.length % 32 !== 0) throw new Error('Q8_0 needs a multiple of 32 values per row');
  const blocks = values.length / 32;
  const out = Buffer.alloc(blocks * 34);
  for (let b = 0; b < blocks; b++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(values[32 * b + i]!));
    const d = amax / 127, id = d ? 1 / d : 0;
    out.writeUInt16LE(f32ToHalf(d), 34 * b);
    for (let i = 0; i < 32; i++) out.writeInt8(Math.round(values[32 * b + i]! * id), 34 * b + 2 + i);
  }
  return out;
}

/**
 * Q4_0 as ggml defines it (ggml-quants.c quantize_row_q4_0_ref): per 32 values one f16 scale
 * d = max / -8, max the value of largest magnitude with its sign (the first one on a tie), and
 * 32 codes q = min(15, trunc(x / d + 8.5)) (x * (1 / d) in f32), dequantized as d * (q - 8);
 * byte j of the 16 holds q[j] in its low nibble and q[j + 16] in its high one: 18 bytes a block.
 */
export function quantizeQ4_0(values: Float32Array): Buffer {
  if (values.length % 32 !== 0) throw new Error('Q4_0 needs a multiple of 32 values per row');
  const blocks = values.length / 32;
  const out = Buffer.alloc(blocks * 18);
  const f = Math.fround;
  for (let b = 0; b < blocks; b++) {
    let amax = 0, max = 0;
    for (let i = 0; i < 32; i++) {
      const v = values[32 * b + i]!;
      if (amax < Math.abs(v)) {
        amax = Math.abs(v);
        max = v;
      }
    }
    const d = f(max / -8), id = d ? f(1 / d) : 0;
    out.writeUInt16LE(f32ToHalf(d), 18 * b);
    const q = (i: number) => Math.min(15, Math.trunc(f(f(values[32 * b + i]! * id) + 8.5)));
    for (let j = 0; j < 16; j++) out[18 * b + 2 + j] = q(j) | (q(j + 16) << 4);
  }
  return out;
}

interface TensorOut {
  name: string;
  dims: number[];  // ggml order: innermost (columns) first
  type: number;
  bytes: () => Buffer;
  size: number;
}

function hfToGgufName(name: string): string | null {
  const fixed: Record<string, string> = {
    'model.embed_tokens.weight': 'token_embd.weight',
    'model.norm.weight': 'output_norm.weight',
    'lm_head.weight': 'output.weight',
  };
  if (fixed[name]) return fixed[name]!;
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(name);
  if (!m) return null;
  const parts: Record<string, string> = {
    'input_layernorm.weight': 'attn_norm.weight',
    'post_attention_layernorm.weight': 'ffn_norm.weight',
    'self_attn.q_proj.weight': 'attn_q.weight', 'self_attn.q_proj.bias': 'attn_q.bias',
    'self_attn.k_proj.weight': 'attn_k.weight', 'self_attn.k_proj.bias': 'attn_k.bias',
    'self_attn.v_proj.weight': 'attn_v.weight', 'self_attn.v_proj.bias': 'attn_v.bias',
    'self_attn.o_proj.weight': 'attn_output.weight',
    'mlp.gate_proj.weight': 'ffn_gate.weight',
    'mlp.up_proj.weight': 'ffn_up.weight',
    'mlp.down_proj.weight': 'ffn_down.weight',
  };
  const part = parts[m[2]!];
  return part ? `blk.${m[1]}.${part}` : null;
}

/**
 * Writes `out` (a .gguf) from the checkpoint in modelDir (config.json, model.safetensors,
 * tokenizer.json). Every 2-D weight becomes `weights` (bf16 needs a bf16 checkpoint), the token
 * embedding included, as llama.cpp's own conversion does (a tied lm_head is that tensor); q4_0
 * keeps the embedding and output Q8_0.
 * Returns the bytes of the data section.
 */
export function writeGguf(modelDir: string, out: string, weights: GgufWeightType): number {
  const config = JSON.parse(readFileSync(join(modelDir, 'config.json'), 'utf8')) as Record<string, unknown>;
  const arch = ({ Qwen2ForCausalLM: 'qwen2', LlamaForCausalLM: 'llama' } as Record<string, string>)[
    (config.architectures as string[] | undefined)?.[0] ?? ''];
  if (!arch) throw new Error(`GGUF writer: ${String((config.architectures as string[])?.[0])} is not supported (Llama, Qwen2)`);
  if (arch === 'llama') throw new Error('GGUF writer: Llama checkpoints need the q/k rope permutation, not written yet (use a qwen2 preset)');
  const st = readSafetensorsHeader(join(modelDir, 'model.safetensors'));
  const fd = openSync(join(modelDir, 'model.safetensors'), 'r');
  const read = (e: SafetensorsEntry): Buffer => {
    const b = Buffer.alloc(e.end - e.begin);
    readSyncFull(fd, b, st.dataOffset + e.begin);
    return b;
  };
  const tensors: TensorOut[] = [];
  for (const [name, e] of Object.entries(st.tensors)) {
    const gname = hfToGgufName(name);
    if (!gname) throw new Error(`GGUF writer: no GGUF name for tensor ${name}`);
    const dims = [...e.shape].reverse();
    if (e.shape.length === 1) {
      tensors.push({ name: gname, dims, type: GGML_F32, size: e.shape[0]! * 4, bytes: () => toF32(read(e), e.dtype) });
    } else if (weights === 'q8_0' || (weights === 'q4_0' && (gname === 'token_embd.weight' || gname === 'output.weight'))) {
      // Under q4_0 the token embedding (the output layer when tied) and an untied output.weight are
      // Q8_0: the blocks sluice's int8 lm_head holds, so both peers' output layers carry the same bytes.
      const count = e.shape[0]! * e.shape[1]!;
      tensors.push({ name: gname, dims, type: GGML_Q8_0, size: (count / 32) * 34,
        bytes: () => { const f = toF32(read(e), e.dtype); return quantizeQ8_0(new Float32Array(f.buffer, f.byteOffset, count)); } });
    } else if (weights === 'q4_0') {
      const count = e.shape[0]! * e.shape[1]!;
      tensors.push({ name: gname, dims, type: GGML_Q4_0, size: (count / 32) * 18,
        bytes: () => { const f = toF32(read(e), e.dtype); return quantizeQ4_0(new Float32Array(f.buffer, f.byteOffset, count)); } });
    } else {
      if (e.dtype !== 'BF16') throw new Error(`GGUF writer: bf16 weights need a bf16 checkpoint (${name} is ${e.dtype})`);
      tensors.push({ name: gname, dims, type: GGML_BF16, size: e.end - e.begin, bytes: () => read(e) });
    }
  }

  const tok = JSON.parse(readFileSync(join(modelDir, 'tokenizer.json'), 'utf8')) as {
    model: { vocab: Record<string, number>; merges: (string | [string, string])[] };
    added_tokens: { id: number; content: string; special: boolean }[];
  };
  const vocabSize = Number(config.vocab_size);
  const tokens = new Array<string>(vocabSize);
  const types = new Int32Array(vocabSize).fill(1);  // 1 normal, 3 control, 5 unused
  for (const [t, id] of Object.entries(tok.model.vocab)) if (id < vocabSize) tokens[id] = t;
  for (const a of tok.added_tokens) if (a.id < vocabSize) { tokens[a.id] = a.content; types[a.id] = a.special ? 3 : 4; }
  for (let i = 0; i < vocabSize; i++) if (tokens[i] === undefined) { tokens[i] = `[PAD${i}]`; types[i] = 5; }
  const merges = tok.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m));

  const num = (k: string) => Number(config[k]);
  const heads = num('num_attention_heads');
  const meta: [string, MetaValue][] = [
    ['general.architecture', { type: 'string', value: arch }],
    ['general.name', { type: 'string', value: `sluice bench ${arch}` }],
    ['general.alignment', { type: 'u32', value: ALIGNMENT }],
    [`${arch}.context_length`, { type: 'u32', value: num('max_position_embeddings') }],
    [`${arch}.embedding_length`, { type: 'u32', value: num('hidden_size') }],
    [`${arch}.block_count`, { type: 'u32', value: num('num_hidden_layers') }],
    [`${arch}.feed_forward_length`, { type: 'u32', value: num('intermediate_size') }],
    [`${arch}.attention.head_count`, { type: 'u32', value: heads }],
    [`${arch}.attention.head_count_kv`, { type: 'u32', value: Number(config.num_key_value_heads ?? heads) }],
    [`${arch}.rope.freq_base`, { type: 'f32', value: Number(config.rope_theta ?? 10000) }],
    [`${arch}.attention.layer_norm_rms_epsilon`, { type: 'f32', value: num('rms_norm_eps') }],
    // llama_ftype MOSTLY_Q8_0 / MOSTLY_Q4_0 / MOSTLY_BF16
    ['general.file_type', { type: 'u32', value: weights === 'q8_0' ? 7 : weights === 'q4_0' ? 2 : 32 }],
    ['tokenizer.ggml.model', { type: 'string', value: 'gpt2' }],
    ['tokenizer.ggml.pre', { type: 'string', value: arch === 'qwen2' ? 'qwen2' : 'default' }],
    ['tokenizer.ggml.tokens', { type: 'strings', value: tokens }],
    ['tokenizer.ggml.token_type', { type: 'i32s', value: types }],
    ['tokenizer.ggml.merges', { type: 'strings', value: merges }],
    ['tokenizer.ggml.add_bos_token', { type: 'bool', value: false }],
  ];
  if (config.bos_token_id !== undefined) meta.push(['tokenizer.ggml.bos_token_id', { type: 'u32', value: num('bos_token_id') }]);
  if (config.eos_token_id !== undefined) meta.push(['tokenizer.ggml.eos_token_id', { type: 'u32', value: Number([config.eos_token_id].flat()[0]) }]);

  const head = new Bytes();
  head.push(Buffer.from('GGUF', 'latin1'));
  head.u32(3);
  head.u64(tensors.length);
  head.u64(meta.length);
  for (const [k, v] of meta) writeMeta(head, k, v);
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    head.str(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(t.type);
    head.u64(offset);
    offsets.push(offset);
    offset += Math.ceil(t.size / ALIGNMENT) * ALIGNMENT;
  }
  const headBuf = head.done();
  const tmp = `${out}.partial`;
  const outFd = openSync(tmp, 'w');
  try {
    writeSync(outFd, headBuf);
    writeSync(outFd, Buffer.alloc((ALIGNMENT - (headBuf.length % ALIGNMENT)) % ALIGNMENT));
    for (const t of tensors) {
      const b = t.bytes();
      if (b.length !== t.size) throw new Error(`GGUF writer: ${t.name} has ${b.length} bytes, expected ${t.size}`);
      writeSync(outFd, b);
      writeSync(outFd, Buffer.alloc((ALIGNMENT - (b.length % ALIGNMENT)) % ALIGNMENT));
    }
  } finally {
    closeSync(outFd);
    closeSync(fd);
  }
  renameSync(tmp, out);
  return offset;
}

function readSyncFull(fd: number, buf: Buffer, position: number): void {
  let done = 0;
  while (done < buf.length) {
    const n = readSync(fd, buf, done, buf.length - done, position + done);
    if (n <= 0) throw new Error('GGUF writer: short read of the checkpoint');
    done += n;
  }
}

interface SafetensorsEntry {
  dtype: string;
  shape: number[];
  begin: number;  // byte offsets into the data section
  end: number;
}

/** The header of one .safetensors file: its tensors (file order) and where their data starts. */
function readSafetensorsHeader(path: string): { tensors: Record<string, SafetensorsEntry>; dataOffset: number } {
  const fd = openSync(path, 'r');
  try {
    const len = Buffer.alloc(8);
    readSyncFull(fd, len, 0);
    const headerBytes = Number(len.readBigUInt64LE(0));
    const header = Buffer.alloc(headerBytes);
    readSyncFull(fd, header, 8);
    const json = JSON.parse(header.toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
    const tensors: Record<string, SafetensorsEntry> = {};
    for (const [name, t] of Object.entries(json)) {
      if (name === '__metadata__') continue;
      tensors[name] = { dtype: t.dtype, shape: t.shape, begin: t.data_offsets[0], end: t.data_offsets[1] };
    }
    return { tensors, dataOffset: 8 + headerBytes };
  } finally {
    closeSync(fd);
  }
}

/** The GGUF for (modelDir, weights), written next to the checkpoint on first use. */
export function ensureGguf(modelDir: string, weights: GgufWeightType): string {
  const path = join(modelDir, `model-${weights}.gguf`);
  if (!existsSync(path)) {
    process.stderr.write(`writing ${path} for the llama.cpp peer...\n`);
    writeGguf(modelDir, path, weights);
  }
  return path;
}
