import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { afterAll, describe, expect, it } from 'vitest';
import { type Architecture, type PresetShape, PRESETS, activeParamCount, buildConfig, makeModel, paramCount, resolvePreset, weightBytes } from '../models/make-model.js';
import { decoderShape } from '../models/onnx-checkpoint.js';
import { chunkSeed, fillChunk, packMxfp4 } from '../models/weights.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-make-model-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let counter = 0;
const freshDir = (name: string) => join(root, `${name}-${counter++}`);

const readJson = (p: string) => JSON.parse(readFileSync(p, 'utf8'));

interface HeaderEntry {
  dtype: string;
  shape: number[];
  data_offsets: [number, number];
}

/** Parse a safetensors file's header independently of the writer. */
function readHeader(path: string): { header: Record<string, HeaderEntry>; meta: unknown; headerLen: number; size: number } {
  const buf = readFileSync(path);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const json = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const meta = json.__metadata__;
  delete json.__metadata__;
  return { header: json, meta, headerLen, size: buf.length };
}

function tensorBytes(dir: string, file: string, name: string): Buffer {
  const buf = readFileSync(join(dir, file));
  const { header, headerLen } = readHeader(join(dir, file));
  const e = header[name]!;
  return buf.subarray(8 + headerLen + e.data_offsets[0], 8 + headerLen + e.data_offsets[1]);
}

/** Expected HF tensor names and shapes of a preset, written out independently (families.md of issue 31). */
function expectedTensors(preset: string, overrides: Partial<PresetShape> = {}): Map<string, number[]> {
  const s = resolvePreset(preset, overrides);
  const m = new Map<string, number[]>();
  const h = s.hiddenSize;
  const q = s.numHeads * s.headDim;
  const kv = s.numKvHeads * s.headDim;
  const multimodal = s.architecture === 'Gemma3ForConditionalGeneration';
  const gemma = multimodal || s.architecture === 'Gemma3ForCausalLM';
  const root = multimodal ? 'language_model.model.' : 'model.';
  m.set(root + 'embed_tokens.weight', [s.vocabSize, h]);
  for (let i = 0; i < s.numLayers; i++) {
    const p = `${root}layers.${i}.`;
    m.set(p + 'input_layernorm.weight', [h]);
    m.set(p + 'post_attention_layernorm.weight', [h]);
    if (gemma) {
      m.set(p + 'pre_feedforward_layernorm.weight', [h]);
      m.set(p + 'post_feedforward_layernorm.weight', [h]);
    }
    m.set(p + 'self_attn.q_proj.weight', [q, h]);
    m.set(p + 'self_attn.k_proj.weight', [kv, h]);
    m.set(p + 'self_attn.v_proj.weight', [kv, h]);
    m.set(p + 'self_attn.o_proj.weight', [h, q]);
    if (s.architecture === 'GptOssForCausalLM') {
      // Biases on all four projections, a sink per head, a biased router, experts MXFP4-packed.
      const e = s.numExperts!;
      const inter = s.intermediateSize;
      m.set(p + 'self_attn.q_proj.bias', [q]);
      m.set(p + 'self_attn.k_proj.bias', [kv]);
      m.set(p + 'self_attn.v_proj.bias', [kv]);
      m.set(p + 'self_attn.o_proj.bias', [h]);
      m.set(p + 'self_attn.sinks', [s.numHeads]);
      m.set(p + 'mlp.router.weight', [e, h]);
      m.set(p + 'mlp.router.bias', [e]);
      m.set(p + 'mlp.experts.gate_up_proj_blocks', [e, 2 * inter, h / 32, 16]);
      m.set(p + 'mlp.experts.gate_up_proj_scales', [e, 2 * inter, h / 32]);
      m.set(p + 'mlp.experts.gate_up_proj_bias', [e, 2 * inter]);
      m.set(p + 'mlp.experts.down_proj_blocks', [e, h, inter / 32, 16]);
      m.set(p + 'mlp.experts.down_proj_scales', [e, h, inter / 32]);
      m.set(p + 'mlp.experts.down_proj_bias', [e, h]);
      continue;
    }
    if (s.architecture === 'Qwen2ForCausalLM') {
      m.set(p + 'self_attn.q_proj.bias', [q]);
      m.set(p + 'self_attn.k_proj.bias', [kv]);
      m.set(p + 'self_attn.v_proj.bias', [kv]);
    }
    if (s.architecture === 'Qwen3ForCausalLM' || s.architecture === 'Qwen3MoeForCausalLM' || gemma) {
      m.set(p + 'self_attn.q_norm.weight', [s.headDim]);
      m.set(p + 'self_attn.k_norm.weight', [s.headDim]);
    }
    const qwen3Sparse = s.architecture === 'Qwen3MoeForCausalLM' && !(s.mlpOnlyLayers ?? []).includes(i) &&
      (i + 1) % (s.decoderSparseStep ?? 1) === 0;
    if (s.architecture === 'MixtralForCausalLM') {
      m.set(p + 'block_sparse_moe.gate.weight', [s.numExperts!, h]);
      for (let e = 0; e < s.numExperts!; e++) {
        m.set(p + `block_sparse_moe.experts.${e}.w1.weight`, [s.intermediateSize, h]);
        m.set(p + `block_sparse_moe.experts.${e}.w3.weight`, [s.intermediateSize, h]);
        m.set(p + `block_sparse_moe.experts.${e}.w2.weight`, [h, s.intermediateSize]);
      }
    } else if (qwen3Sparse) {
      const moeI = s.moeIntermediateSize!;
      m.set(p + 'mlp.gate.weight', [s.numExperts!, h]);
      for (let e = 0; e < s.numExperts!; e++) {
        m.set(p + `mlp.experts.${e}.gate_proj.weight`, [moeI, h]);
        m.set(p + `mlp.experts.${e}.up_proj.weight`, [moeI, h]);
        m.set(p + `mlp.experts.${e}.down_proj.weight`, [h, moeI]);
      }
    } else {
      m.set(p + 'mlp.gate_proj.weight', [s.intermediateSize, h]);
      m.set(p + 'mlp.up_proj.weight', [s.intermediateSize, h]);
      m.set(p + 'mlp.down_proj.weight', [h, s.intermediateSize]);
    }
  }
  m.set(root + 'norm.weight', [h]);
  if (!s.tieWordEmbeddings) m.set(multimodal ? 'language_model.lm_head.weight' : 'lm_head.weight', [s.vocabSize, h]);
  return m;
}

const TEST_PRESETS = [
  'test-llama', 'test-llama-linear', 'test-qwen2', 'test-qwen3', 'test-mistral', 'test-qwen3-moe', 'test-mixtral', 'test-gemma3',
  'test-gpt-oss',
];

const MODEL_TYPES: Record<Architecture, string> = {
  LlamaForCausalLM: 'llama', MistralForCausalLM: 'mistral', Qwen2ForCausalLM: 'qwen2', Qwen3ForCausalLM: 'qwen3',
  Qwen3MoeForCausalLM: 'qwen3_moe', MixtralForCausalLM: 'mixtral', Gemma3ForCausalLM: 'gemma3_text',
  Gemma3ForConditionalGeneration: 'gemma3', GptOssForCausalLM: 'gpt_oss',
};

/** gpt-oss's MXFP4 halves are bytes whatever the float dtype. */
const isPacked = (name: string) => /\.(gate_up|down)_proj_(blocks|scales)$/.test(name);

describe('makeModel: files and weights', () => {
  it('writes a complete tiny model directory with valid safetensors', async () => {
    const dir = freshDir('tiny');
    let last: [number, number] = [0, -1];
    await makeModel({ preset: 'tiny', out: dir, onProgress: (d, t) => (last = [d, t]) });
    for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'model.safetensors']) {
      expect(existsSync(join(dir, f)), f).toBe(true);
    }
    expect(existsSync(join(dir, 'model.safetensors.index.json'))).toBe(false);
    expect(readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg.architectures).toEqual(['LlamaForCausalLM']);
    expect(cfg.model_type).toBe('llama');
    expect(cfg.torch_dtype).toBe('bfloat16');
    expect(cfg.hidden_act).toBe('silu');
    expect(cfg.tie_word_embeddings).toBe(true);
    expect(cfg.attention_bias).toBe(false);
    expect(cfg.mlp_bias).toBe(false);
    expect(cfg.vocab_size).toBe(2051);
    const { header, meta, headerLen, size } = readHeader(join(dir, 'model.safetensors'));
    expect(meta).toEqual({ format: 'pt' });
    expect((8 + headerLen) % 8).toBe(0);
    const exp = expectedTensors('tiny');
    expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
    // Offsets are contiguous, cover the data exactly, and match shapes.
    const entries = Object.values(header).sort((a, b) => a.data_offsets[0] - b.data_offsets[0]);
    let pos = 0;
    for (const e of entries) {
      expect(e.dtype).toBe('BF16');
      expect(e.data_offsets[0]).toBe(pos);
      pos = e.data_offsets[1];
    }
    for (const [name, e] of Object.entries(header)) {
      expect(e.shape).toEqual(exp.get(name));
      expect(e.data_offsets[1] - e.data_offsets[0]).toBe(e.shape.reduce((a, b) => a * b, 1) * 2);
    }
    expect(size).toBe(8 + headerLen + pos);
    expect(last).toEqual([pos, pos]);
    expect(weightBytes('tiny')).toBe(pos);
    const gen = readJson(join(dir, 'generation_config.json'));
    expect(gen.do_sample).toBe(false);
    expect(gen.eos_token_id).toEqual([2050, 2048]);
    expect(gen.bos_token_id).toBe(2048);
  });

  it.each(TEST_PRESETS)('%s: config fields and complete tensor set', async (preset) => {
    const dir = freshDir(preset);
    await makeModel({ preset, out: dir, dtype: 'f16' });
    const s = PRESETS[preset]!;
    const cfg = readJson(join(dir, 'config.json'));
    const gemma = s.architecture === 'Gemma3ForCausalLM';
    expect(cfg).toMatchObject({
      architectures: [s.architecture],
      model_type: MODEL_TYPES[s.architecture],
      hidden_size: s.hiddenSize,
      intermediate_size: s.intermediateSize,
      num_hidden_layers: s.numLayers,
      num_attention_heads: s.numHeads,
      num_key_value_heads: s.numKvHeads,
      head_dim: s.headDim,
      vocab_size: s.vocabSize,
      max_position_embeddings: s.maxPositionEmbeddings,
      rms_norm_eps: s.rmsNormEps,
      rope_theta: s.ropeTheta,
      rope_scaling: s.ropeScaling,
      tie_word_embeddings: s.tieWordEmbeddings,
      torch_dtype: 'float16',
    });
    // Gemma spells its activation hidden_activation (and has no hidden_act).
    expect(cfg.hidden_act).toBe(gemma ? undefined : 'silu');
    expect(cfg.hidden_activation).toBe(gemma ? 'gelu_pytorch_tanh' : undefined);
    if (s.architecture === 'Qwen2ForCausalLM') expect(cfg.use_sliding_window).toBe(false);
    if (s.architecture === 'Qwen3ForCausalLM' || s.architecture === 'Qwen3MoeForCausalLM') {
      expect(cfg.attention_bias).toBe(false);
      expect(cfg.head_dim).not.toBe(cfg.hidden_size / cfg.num_attention_heads);
    }
    if (s.architecture === 'MistralForCausalLM') expect(cfg.sliding_window).toBeNull();
    const { header } = readHeader(join(dir, 'model.safetensors'));
    const exp = expectedTensors(preset);
    expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
    for (const [name, e] of Object.entries(header)) {
      expect(e.shape, name).toEqual(exp.get(name));
      expect(e.dtype, name).toBe(isPacked(name) ? 'U8' : 'F16');
    }
  });

  it('shards with an index exactly like transformers, and stale shards are removed', async () => {
    const dir = freshDir('sharded');
    await makeModel({ preset: 'test-llama', out: dir, shardBytes: 300_000 });
    const files = readdirSync(dir).filter((f) => f.endsWith('.safetensors')).sort();
    expect(files.length).toBeGreaterThan(2);
    const n = String(files.length).padStart(5, '0');
    files.forEach((f, i) => expect(f).toBe(`model-${String(i + 1).padStart(5, '0')}-of-${n}.safetensors`));
    const index = readJson(join(dir, 'model.safetensors.index.json'));
    const exp = expectedTensors('test-llama');
    expect(Object.keys(index.weight_map).sort()).toEqual([...exp.keys()].sort());
    expect(Object.keys(index.weight_map)).toEqual(Object.keys(index.weight_map).sort());
    let total = 0;
    for (const f of files) {
      const { header } = readHeader(join(dir, f));
      for (const [name, e] of Object.entries(header)) {
        expect(index.weight_map[name]).toBe(f);
        total += e.data_offsets[1] - e.data_offsets[0];
      }
    }
    expect(index.metadata.total_size).toBe(total);
    expect(total).toBe(weightBytes('test-llama'));

    // Sharding does not change the bytes of any tensor.
    const single = freshDir('single');
    await makeModel({ preset: 'test-llama', out: single });
    for (const name of ['model.embed_tokens.weight', 'model.layers.1.mlp.down_proj.weight', 'lm_head.weight']) {
      expect(tensorBytes(dir, index.weight_map[name], name).equals(tensorBytes(single, 'model.safetensors', name))).toBe(true);
    }
    // Rewriting unsharded into the sharded directory leaves no stale shards behind.
    await makeModel({ preset: 'test-llama', out: dir });
    expect(readdirSync(dir).filter((f) => f.includes('safetensors'))).toEqual(['model.safetensors']);
  });

  it('is deterministic per seed', async () => {
    const hash = (p: string) => createHash('sha256').update(readFileSync(p)).digest('hex');
    const a = freshDir('seed');
    const b = freshDir('seed');
    const c = freshDir('seed');
    await makeModel({ preset: 'test-qwen2', out: a, seed: 7, dtype: 'bf16' });
    await makeModel({ preset: 'test-qwen2', out: b, seed: 7, dtype: 'bf16' });
    await makeModel({ preset: 'test-qwen2', out: c, seed: 8, dtype: 'bf16' });
    for (const f of readdirSync(a)) expect(hash(join(a, f)), f).toBe(hash(join(b, f)));
    expect(hash(join(a, 'model.safetensors'))).not.toBe(hash(join(c, 'model.safetensors')));
    expect(hash(join(a, 'tokenizer.json'))).toBe(hash(join(c, 'tokenizer.json')));
  });

  it('worker-thread generation writes the same bytes as single-threaded', async () => {
    const a = freshDir('threads');
    const b = freshDir('threads');
    await makeModel({ preset: 'test-llama', out: a, dtype: 'f16', threads: 2, overrides: { vocabSize: 40000 } });
    await makeModel({ preset: 'test-llama', out: b, dtype: 'f16', threads: 0, overrides: { vocabSize: 40000 } });
    expect(readFileSync(join(a, 'model.safetensors')).equals(readFileSync(join(b, 'model.safetensors')))).toBe(true);
  });

  it('bf16 is round-to-nearest-even of the f32 weights and f16 is IEEE half', async () => {
    const d32 = freshDir('f32');
    const d16 = freshDir('f16');
    const db16 = freshDir('bf16');
    await makeModel({ preset: 'test-qwen3', out: d32, dtype: 'f32' });
    await makeModel({ preset: 'test-qwen3', out: d16, dtype: 'f16' });
    await makeModel({ preset: 'test-qwen3', out: db16, dtype: 'bf16' });
    for (const name of ['model.layers.0.self_attn.q_proj.weight', 'model.layers.1.self_attn.k_norm.weight']) {
      const f = tensorBytes(d32, 'model.safetensors', name);
      const h = tensorBytes(d16, 'model.safetensors', name);
      const b = tensorBytes(db16, 'model.safetensors', name);
      const n = f.length / 4;
      let maxRel = 0;
      for (let i = 0; i < n; i++) {
        const bits = f.readUInt32LE(i * 4);
        const x = f.readFloatLE(i * 4);
        // bf16: RNE on the low 16 bits.
        const low = bits & 0xffff;
        let hi = bits >>> 16;
        if (low > 0x8000 || (low === 0x8000 && (hi & 1))) hi += 1;
        expect(b.readUInt16LE(i * 2)).toBe(hi);
        // f16: decode and compare (values are normal halves here).
        const hb = h.readUInt16LE(i * 2);
        const e = (hb >>> 10) & 0x1f;
        const v = (hb & 0x8000 ? -1 : 1) * (e === 0 ? (hb & 0x3ff) * 2 ** -24 : (1 + (hb & 0x3ff) / 1024) * 2 ** (e - 15));
        maxRel = Math.max(maxRel, Math.abs(v - x) / Math.max(Math.abs(x), 2 ** -14));
      }
      expect(maxRel).toBeLessThanOrEqual(2 ** -11);
    }
  });

  it('norm weights near 1, biases small, linear weights scaled by fan-in', async () => {
    const dir = freshDir('stats');
    await makeModel({ preset: 'test-qwen2', out: dir, dtype: 'f32' });
    const stats = (name: string) => {
      const b = tensorBytes(dir, 'model.safetensors', name);
      const xs = Array.from({ length: b.length / 4 }, (_, i) => b.readFloatLE(i * 4));
      const mean = xs.reduce((a, x) => a + x, 0) / xs.length;
      const std = Math.sqrt(xs.reduce((a, x) => a + (x - mean) ** 2, 0) / xs.length);
      return { mean, std };
    };
    const norm = stats('model.layers.0.input_layernorm.weight');
    expect(Math.abs(norm.mean - 1)).toBeLessThan(0.05);
    expect(norm.std).toBeLessThan(0.2);
    const bias = stats('model.layers.0.self_attn.q_proj.bias');
    expect(Math.abs(bias.mean)).toBeLessThan(0.1);
    expect(bias.std).toBeGreaterThan(0.05);
    expect(bias.std).toBeLessThan(0.5);
    const up = stats('model.layers.0.mlp.up_proj.weight');
    expect(up.std * Math.sqrt(128)).toBeGreaterThan(0.8);
    expect(up.std * Math.sqrt(128)).toBeLessThan(1.2);
  });

  it('applies overrides, padding the tokenizer to the vocabulary size', async () => {
    const dir = freshDir('override');
    await makeModel({ preset: 'test-mistral', out: dir, overrides: { numLayers: 1, vocabSize: 3000, hiddenSize: 64 } });
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg.num_hidden_layers).toBe(1);
    expect(cfg.vocab_size).toBe(3000);
    const { header } = readHeader(join(dir, 'model.safetensors'));
    expect(header['model.embed_tokens.weight']!.shape).toEqual([3000, 64]);
    expect(header['model.layers.1.input_layernorm.weight']).toBeUndefined();
    const tok = readJson(join(dir, 'tokenizer.json'));
    expect(Object.keys(tok.model.vocab).length + tok.added_tokens.length).toBe(3000);
    await expect(makeModel({ preset: 'nope', out: dir })).rejects.toThrow(/unknown preset/);
    await expect(makeModel({ preset: 'tiny', out: dir, overrides: { numKvHeads: 3 } })).rejects.toThrow();
  });
});

describe('makeModel: the mixture-of-experts and Gemma 3 families', () => {
  /** Mean and std of an f32 tensor of a model directory. */
  const stats = (dir: string, name: string) => {
    const b = tensorBytes(dir, 'model.safetensors', name);
    const xs = Array.from({ length: b.length / 4 }, (_, i) => b.readFloatLE(i * 4));
    const mean = xs.reduce((a, x) => a + x, 0) / xs.length;
    return { mean, std: Math.sqrt(xs.reduce((a, x) => a + (x - mean) ** 2, 0) / xs.length) };
  };

  it('test-qwen3-moe: Qwen3-MoE config fields, a dense layer from mlp_only_layers, experts of moe_intermediate_size', async () => {
    const dir = freshDir('qwen3-moe');
    await makeModel({ preset: 'test-qwen3-moe', out: dir });
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({
      architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', num_experts: 8, num_experts_per_tok: 2,
      moe_intermediate_size: 48, intermediate_size: 128, norm_topk_prob: true, decoder_sparse_step: 1, mlp_only_layers: [1],
      attention_bias: false, use_sliding_window: false, sliding_window: null, max_window_layers: 3,
      output_router_logits: false, router_aux_loss_coef: 0.001, head_dim: 16, hidden_act: 'silu',
    });
    const { header } = readHeader(join(dir, 'model.safetensors'));
    expect(header['model.layers.0.mlp.gate.weight']!.shape).toEqual([8, 64]);
    expect(header['model.layers.2.mlp.experts.7.down_proj.weight']!.shape).toEqual([64, 48]);
    expect(header['model.layers.1.mlp.gate.weight']).toBeUndefined();
    expect(header['model.layers.1.mlp.up_proj.weight']!.shape).toEqual([128, 64]);
    // Routers: logits of std ~2 on RMS-normalised input.
    const router = stats(dir, 'model.layers.0.mlp.gate.weight');
    expect(router.std * Math.sqrt(64)).toBeGreaterThan(1.6);
    expect(router.std * Math.sqrt(64)).toBeLessThan(2.4);
  });

  it('test-mixtral: Mixtral config fields and block_sparse_moe experts w1/w3/w2 on every layer', async () => {
    const dir = freshDir('mixtral');
    await makeModel({ preset: 'test-mixtral', out: dir });
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({
      architectures: ['MixtralForCausalLM'], model_type: 'mixtral', num_local_experts: 4, num_experts_per_tok: 2,
      intermediate_size: 96, sliding_window: null, output_router_logits: false, router_aux_loss_coef: 0.02, hidden_act: 'silu',
    });
    expect(cfg.num_experts).toBeUndefined();
    const { header } = readHeader(join(dir, 'model.safetensors'));
    for (const layer of [0, 1]) {
      expect(header[`model.layers.${layer}.block_sparse_moe.gate.weight`]!.shape).toEqual([4, 64]);
      expect(header[`model.layers.${layer}.block_sparse_moe.experts.3.w1.weight`]!.shape).toEqual([96, 64]);
      expect(header[`model.layers.${layer}.block_sparse_moe.experts.3.w3.weight`]!.shape).toEqual([96, 64]);
      expect(header[`model.layers.${layer}.block_sparse_moe.experts.3.w2.weight`]!.shape).toEqual([64, 96]);
      expect(header[`model.layers.${layer}.mlp.gate_proj.weight`]).toBeUndefined();
    }
  });

  it('test-gemma3: Gemma 3 text config fields, four norms a layer stored as w of (1 + w)', async () => {
    const dir = freshDir('gemma3');
    await makeModel({ preset: 'test-gemma3', out: dir });
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({
      architectures: ['Gemma3ForCausalLM'], model_type: 'gemma3_text', hidden_activation: 'gelu_pytorch_tanh',
      head_dim: 32, query_pre_attn_scalar: 24, sliding_window: 8, sliding_window_pattern: 2, rope_theta: 1000000,
      rope_local_base_freq: 10000, rope_scaling: { rope_type: 'linear', factor: 4 }, tie_word_embeddings: true,
      final_logit_softcapping: null, attn_logit_softcapping: null, attention_bias: false,
    });
    expect(cfg.query_pre_attn_scalar).not.toBe(cfg.head_dim);
    expect(cfg.head_dim).not.toBe(cfg.hidden_size / cfg.num_attention_heads);
    // (1 + w): input, pre-feedforward and final norms near 0 (scale ~1); q/k norms carry the q/k
    // gain (scale ~2); the post norms the size of what a block writes (scale outGain * sqrt(hidden)).
    for (const name of ['model.layers.0.input_layernorm.weight', 'model.layers.0.pre_feedforward_layernorm.weight', 'model.norm.weight']) {
      expect(Math.abs(stats(dir, name).mean), name).toBeLessThan(0.05);
      expect(stats(dir, name).std, name).toBeLessThan(0.2);
    }
    expect(stats(dir, 'model.layers.1.self_attn.q_norm.weight').mean).toBeCloseTo(1, 0);
    expect(stats(dir, 'model.layers.1.post_attention_layernorm.weight').mean + 1).toBeCloseTo(8 * Math.sqrt(64), -1);
    expect(stats(dir, 'model.layers.1.post_feedforward_layernorm.weight').mean + 1).toBeCloseTo(8 * Math.sqrt(64), -1);
  });

  it('Gemma3ForConditionalGeneration: text fields under text_config, tensors under language_model.model', async () => {
    const dir = freshDir('gemma3-mm');
    const overrides = { architecture: 'Gemma3ForConditionalGeneration' as const };
    await makeModel({ preset: 'test-gemma3', out: dir, overrides });
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({ architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3', torch_dtype: 'float32' });
    expect(cfg.bos_token_id).toBe(2048);
    expect(cfg.eos_token_id).toBe(2050);
    expect(cfg.text_config).toMatchObject({
      model_type: 'gemma3_text', hidden_size: 64, num_hidden_layers: 4, head_dim: 32, query_pre_attn_scalar: 24,
      sliding_window: 8, sliding_window_pattern: 2, vocab_size: 2051, hidden_activation: 'gelu_pytorch_tanh',
      tie_word_embeddings: true,
    });
    expect(cfg.hidden_size).toBeUndefined();
    expect(Object.keys(cfg.text_config)).toEqual(Object.keys(cfg.text_config).sort());
    const { header } = readHeader(join(dir, 'model.safetensors'));
    const exp = expectedTensors('test-gemma3', overrides);
    expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
    expect([...exp.keys()].every((n) => n.startsWith('language_model.model.'))).toBe(true);
    for (const [name, e] of Object.entries(header)) expect(e.shape, name).toEqual(exp.get(name));
    // Untied: the lm_head sits beside the decoder.
    const untied = expectedTensors('test-gemma3', { ...overrides, tieWordEmbeddings: false });
    expect(untied.has('language_model.lm_head.weight')).toBe(true);
  });

  it('refuses shapes the families cannot have', () => {
    expect(() => resolvePreset('test-qwen3-moe', { numExpertsPerTok: 9 })).toThrow(/numExpertsPerTok/);
    expect(() => resolvePreset('test-qwen3-moe', { mlpOnlyLayers: [3] })).toThrow(/mlpOnlyLayers/);
    expect(() => resolvePreset('test-qwen3-moe', { moeIntermediateSize: undefined })).toThrow(/moeIntermediateSize/);
    expect(() => resolvePreset('test-mixtral', { numExperts: 0 })).toThrow(/numExperts/);
    expect(() => resolvePreset('test-gemma3', { slidingWindow: null })).toThrow(/slidingWindow/);
    expect(() => resolvePreset('test-gemma3', { queryPreAttnScalar: 0 })).toThrow(/queryPreAttnScalar/);
    expect(() => resolvePreset('tiny', { architecture: 'GemmaForCausalLM' as Architecture })).toThrow(/unknown architecture/);
    expect(() => resolvePreset('test-gpt-oss', { hiddenSize: 80 })).toThrow(/hiddenSize must be a multiple of 32/);
    expect(() => resolvePreset('test-gpt-oss', { intermediateSize: 48 })).toThrow(/intermediateSize must be a multiple of 32/);
    expect(() => resolvePreset('test-gpt-oss', { swigluLimit: 0 })).toThrow(/swigluLimit/);
    expect(() => resolvePreset('test-gpt-oss', { slidingWindow: null })).toThrow(/slidingWindow/);
    expect(() => resolvePreset('test-gpt-oss', {
      ropeScaling: { rope_type: 'yarn', factor: 32, beta_fast: 32, beta_slow: 1, original_max_position_embeddings: 0 },
    })).toThrow(/yarn rope_scaling/);
  });

  it('the ONNX export refuses them: it covers the dense families only', () => {
    for (const preset of ['test-qwen3-moe', 'test-mixtral', 'test-gemma3', 'test-gpt-oss']) {
      const config = buildConfig(resolvePreset(preset), 'f32', 1, [2]);
      expect(() => decoderShape(config), preset).toThrow(/served by the native engine only; the ONNX export covers the dense families \(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM\)/);
    }
    const mm = buildConfig(resolvePreset('test-gemma3', { architecture: 'Gemma3ForConditionalGeneration' }), 'f32', 1, [2]);
    expect(() => decoderShape(mm)).toThrow(/Gemma3ForConditionalGeneration is served by the native engine only/);
    expect(decoderShape(buildConfig(resolvePreset('test-qwen3'), 'f32', 1, [2])).architecture).toBe('Qwen3ForCausalLM');
  });

  it('bench-moe and bench-moe-dense read the same MLP weights per token', () => {
    const moe = resolvePreset('bench-moe');
    const dense = resolvePreset('bench-moe-dense');
    expect(dense.intermediateSize).toBe(moe.numExpertsPerTok! * moe.moeIntermediateSize!);
    // Active parameters differ only by the routers ([experts, hidden] a layer).
    expect(activeParamCount(moe) - paramCount(dense)).toBe(moe.numLayers * moe.numExperts! * moe.hiddenSize);
    expect(activeParamCount(dense)).toBe(paramCount(dense));
  });
});

describe('makeModel: gpt-oss', () => {
  /** FP4 e2m1 value of each nibble (bit 3 the sign). */
  const FP4 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

  /**
   * An MXFP4 matrix's values, row-major [..., rows, cols], from its blocks [..., rows, cols / 32, 16]
   * and scales [..., rows, cols / 32]: value 2j of a block is byte j's low nibble, 2j + 1 its high one.
   */
  const unpack = (blocks: Uint8Array, scales: Uint8Array): Float64Array => {
    expect(blocks.length).toBe(16 * scales.length);
    const out = new Float64Array(2 * blocks.length);
    for (let b = 0; b < scales.length; b++) {
      const unit = 2 ** (scales[b]! - 127);
      for (let j = 0; j < 16; j++) {
        const byte = blocks[16 * b + j]!;
        out[32 * b + 2 * j] = FP4[byte & 15]! * unit;
        out[32 * b + 2 * j + 1] = FP4[byte >> 4]! * unit;
      }
    }
    return out;
  };

  /** Every value is a nearest FP4 value of the block's scale, and each block's scale the smallest that holds its largest. */
  const expectPackedFrom = (drawn: Float32Array, blocks: Uint8Array, scales: Uint8Array) => {
    const got = unpack(blocks, scales);
    expect(got.length).toBe(drawn.length);
    let worst = 0;
    for (let b = 0; b < scales.length; b++) {
      const unit = 2 ** (scales[b]! - 127);
      let max = 0;
      for (let i = 32 * b; i < 32 * b + 32; i++) {
        const v = drawn[i]!;
        max = Math.max(max, Math.abs(v));
        const nearest = Math.min(...FP4.map((f) => Math.abs(f * unit - v)));
        expect(Math.abs(got[i]! - v) - nearest, `value ${i}`).toBeLessThanOrEqual(1e-12 * unit);
        if (v !== 0 && got[i] !== 0) expect(Math.sign(got[i]!), `value ${i}`).toBe(Math.sign(v));
        worst = Math.max(worst, Math.abs(got[i]! - v) / unit);
      }
      expect(max, `block ${b}`).toBeLessThanOrEqual(6 * unit);
      expect(max, `block ${b}`).toBeGreaterThan(3 * unit);
    }
    // The widest gap of e2m1 is between 4 and 6.
    expect(worst).toBeLessThanOrEqual(1);
    return got;
  };

  /** A tensor's bytes as U8 and as f32 values. */
  const u8 = (dir: string, name: string) => new Uint8Array(tensorBytes(dir, 'model.safetensors', name));
  const f32 = (dir: string, name: string) => {
    const b = tensorBytes(dir, 'model.safetensors', name);
    return Float32Array.from({ length: b.length / 4 }, (_, i) => b.readFloatLE(i * 4));
  };
  const std = (xs: ArrayLike<number>) => {
    const a = Array.from(xs);
    const mean = a.reduce((s, x) => s + x, 0) / a.length;
    return Math.sqrt(a.reduce((s, x) => s + (x - mean) ** 2, 0) / a.length);
  };

  it('packMxfp4: scales, nearest nibbles (ties to even), low nibble first', () => {
    const values = Float32Array.from({ length: 64 }, () => 0);
    // Block 0: largest |value| 6 -> scale 2^0; block 1: largest 0.7 -> 6 * 2^-3 = 0.75 holds it.
    values.set([6, -6, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.3, 2.9, 1e-9, -4.2], 0);
    values.set([0.7, -0.01, 0.0625 * 3, 0.0625 * 1.25], 32);
    const blocks = packMxfp4(values, 64, 'blocks');
    const scales = packMxfp4(values, 64, 'scales');
    expect(Array.from(scales)).toEqual([127, 124]);
    const got = Array.from(unpack(blocks, scales));
    expect(got.slice(0, 14)).toEqual([6, -6, 0.5, 0, 1, 1, 2, 2, 4, 4, -0.5, 3, 0, -4]);
    expect(got.slice(32, 36)).toEqual([0.75, -0, 0.1875, 0.0625]);
    // 6 is nibble 7 (low), -6 nibble 15 (high): byte 0 is 0xf7.
    expect(blocks[0]).toBe(0xf7);
    expectPackedFrom(values, blocks, scales);
  });

  it('test-gpt-oss: the published config.json field set with its shapes', async () => {
    const dir = freshDir('gpt-oss');
    await makeModel({ preset: 'test-gpt-oss', out: dir });
    const cfg = readJson(join(dir, 'config.json'));
    const tc = readJson(join(dir, 'tokenizer_config.json'));
    const id = (content: string) => Number(Object.entries(tc.added_tokens_decoder).find(([, t]) => (t as { content: string }).content === content)![0]);
    expect(cfg).toEqual({
      architectures: ['GptOssForCausalLM'], attention_bias: true, attention_dropout: 0, eos_token_id: id('<|return|>'),
      experts_per_token: 2, head_dim: 16, hidden_act: 'silu', hidden_size: 64, initial_context_length: 64,
      initializer_range: 0.02, intermediate_size: 64,
      layer_types: ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention'],
      max_position_embeddings: 2048, model_type: 'gpt_oss', num_attention_heads: 4, num_experts_per_tok: 2,
      num_hidden_layers: 4, num_key_value_heads: 2, num_local_experts: 4, output_router_logits: false,
      pad_token_id: id('<|endoftext|>'),
      quantization_config: {
        modules_to_not_convert: ['model.layers.*.self_attn', 'model.layers.*.mlp.router', 'model.embed_tokens', 'lm_head'],
        quant_method: 'mxfp4',
      },
      rms_norm_eps: 1e-5,
      rope_scaling: { beta_fast: 32, beta_slow: 1, factor: 32, original_max_position_embeddings: 64, rope_type: 'yarn', truncate: false },
      rope_theta: 150000, router_aux_loss_coef: 0.9, sliding_window: 8, swiglu_limit: 7, tie_word_embeddings: false,
      torch_dtype: 'float32', transformers_version: '4.55.0.dev0', use_cache: true, vocab_size: 2057,
    });
    expect(Object.keys(cfg)).toEqual(Object.keys(cfg).sort());
    expect(Object.keys(cfg.rope_scaling)).toEqual(Object.keys(cfg.rope_scaling).sort());
    // Harmony's specials after the trained BPE, in o200k_harmony's order, with its template.
    expect(Object.values(tc.added_tokens_decoder).map((t) => (t as { content: string }).content)).toEqual([
      '<|startoftext|>', '<|endoftext|>', '<|return|>', '<|constrain|>', '<|channel|>', '<|start|>', '<|end|>', '<|message|>', '<|call|>',
    ]);
    expect(id('<|startoftext|>')).toBe(2048);
    expect(tc.chat_template).toContain('<|start|>assistant');
    const gen = readJson(join(dir, 'generation_config.json'));
    expect(gen).toMatchObject({ bos_token_id: 2048, eos_token_id: [2050, 2049, 2056], pad_token_id: 2049 });
    // The family's other presets write none of these.
    const mixtral = buildConfig(resolvePreset('test-mixtral'), 'f32', 1, [2]);
    for (const k of ['quantization_config', 'pad_token_id', 'initial_context_length']) expect(mixtral[k], k).toBeUndefined();
  });

  it('gpt-oss-20b and -120b: exactly the published config.json (token ids aside)', async () => {
    const published = (layers: number, experts: number) => ({
      architectures: ['GptOssForCausalLM'], attention_bias: true, attention_dropout: 0.0, eos_token_id: 200002,
      experts_per_token: 4, head_dim: 64, hidden_act: 'silu', hidden_size: 2880, initial_context_length: 4096,
      initializer_range: 0.02, intermediate_size: 2880,
      layer_types: Array.from({ length: layers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention')),
      max_position_embeddings: 131072, model_type: 'gpt_oss', num_attention_heads: 64, num_experts_per_tok: 4,
      num_hidden_layers: layers, num_key_value_heads: 8, num_local_experts: experts, output_router_logits: false,
      pad_token_id: 199999,
      quantization_config: {
        modules_to_not_convert: ['model.layers.*.self_attn', 'model.layers.*.mlp.router', 'model.embed_tokens', 'lm_head'],
        quant_method: 'mxfp4',
      },
      rms_norm_eps: 1e-5,
      rope_scaling: { beta_fast: 32.0, beta_slow: 1.0, factor: 32.0, original_max_position_embeddings: 4096, rope_type: 'yarn', truncate: false },
      rope_theta: 150000, router_aux_loss_coef: 0.9, sliding_window: 128, swiglu_limit: 7.0, tie_word_embeddings: false,
      torch_dtype: 'bfloat16', transformers_version: '4.55.0.dev0', use_cache: true, vocab_size: 201088,
    });
    for (const [preset, layers, experts] of [['gpt-oss-20b', 24, 32], ['gpt-oss-120b', 36, 128]] as const) {
      // <|return|> and <|endoftext|> sit on the maker's consecutive ids, not o200k_harmony's 200002 and 199999.
      const cfg = buildConfig(resolvePreset(preset), 'bf16', 201079, [201081, 201080, 201087], 201080);
      expect(cfg, preset).toEqual({ ...published(layers, experts), eos_token_id: 201081, pad_token_id: 201080 });
    }
  });

  it('tensors: U8 blocks and scales beside float tensors of the chosen dtype; weightBytes is the file', async () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      const dir = freshDir(`gpt-oss-${dtype}`);
      await makeModel({ preset: 'test-gpt-oss', out: dir, dtype });
      const { header, headerLen, size } = readHeader(join(dir, 'model.safetensors'));
      const exp = expectedTensors('test-gpt-oss');
      expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
      for (const [name, e] of Object.entries(header)) {
        expect(e.shape, name).toEqual(exp.get(name));
        const packed = isPacked(name);
        expect(e.dtype, name).toBe(packed ? 'U8' : dtype === 'f32' ? 'F32' : 'BF16');
        expect(e.data_offsets[1] - e.data_offsets[0], name).toBe(e.shape.reduce((a, b) => a * b, 1) * (packed ? 1 : dtype === 'f32' ? 4 : 2));
      }
      expect(size - 8 - headerLen).toBe(weightBytes('test-gpt-oss', dtype));
    }
    // bf16 tensors and U8 halves: the published gpt-oss-20b's total_size (model.safetensors.index.json).
    expect(weightBytes('gpt-oss-20b')).toBe(13_761_264_768);
  });

  it('MXFP4 experts unpack to within e2m1 rounding of the values drawn, at the init scales of the other families', async () => {
    const dir = freshDir('gpt-oss-mxfp4');
    const seed = 5;
    await makeModel({ preset: 'test-gpt-oss', out: dir, seed });
    const s = resolvePreset('test-gpt-oss');
    const [h, inter, e] = [s.hiddenSize, s.intermediateSize, s.numExperts!];
    const drawn = (name: string, n: number, std: number) => {
      const out = new Float32Array(n);
      fillChunk(out, n, chunkSeed(seed, name, 0), { mean: 0, std });
      return out;
    };
    const x = 'model.layers.1.mlp.experts';
    // gate_up [E, 2I, H] drawn as a linear layer of gain 1, down [E, H, I] as one writing into the
    // residual stream (gain 8), both over their fan-in.
    const gateUp = expectPackedFrom(drawn(`${x}.gate_up_proj`, e * 2 * inter * h, 1 / Math.sqrt(h)), u8(dir, `${x}.gate_up_proj_blocks`), u8(dir, `${x}.gate_up_proj_scales`));
    const down = expectPackedFrom(drawn(`${x}.down_proj`, e * h * inter, 8 / Math.sqrt(inter)), u8(dir, `${x}.down_proj_blocks`), u8(dir, `${x}.down_proj_scales`));
    expect(std(gateUp) * Math.sqrt(h)).toBeGreaterThan(0.85);
    expect(std(gateUp) * Math.sqrt(h)).toBeLessThan(1.15);
    expect(std(down) * Math.sqrt(inter) / 8).toBeGreaterThan(0.85);
    expect(std(down) * Math.sqrt(inter) / 8).toBeLessThan(1.15);
    // Router logits of std ~2 on normalised input; biases and sinks small.
    expect(std(f32(dir, 'model.layers.1.mlp.router.weight')) * Math.sqrt(h)).toBeGreaterThan(1.6);
    expect(std(f32(dir, 'model.layers.1.mlp.router.weight')) * Math.sqrt(h)).toBeLessThan(2.4);
    expect(std(f32(dir, `${x}.gate_up_proj_bias`))).toBeLessThan(0.3);
    expect(std(f32(dir, 'model.layers.0.self_attn.o_proj.bias'))).toBeLessThan(0.3);
    expect(f32(dir, 'model.layers.0.self_attn.sinks').every((v) => Math.abs(v) < 4)).toBe(true);
  });

  it('the packed bytes do not depend on the float dtype or on worker threads', async () => {
    const a = freshDir('gpt-oss-threads');
    const b = freshDir('gpt-oss-threads');
    const c = freshDir('gpt-oss-threads');
    await makeModel({ preset: 'test-gpt-oss', out: a, dtype: 'f16', threads: 2 });
    await makeModel({ preset: 'test-gpt-oss', out: b, dtype: 'f16', threads: 0 });
    await makeModel({ preset: 'test-gpt-oss', out: c, dtype: 'bf16', threads: 0 });
    expect(readFileSync(join(a, 'model.safetensors')).equals(readFileSync(join(b, 'model.safetensors')))).toBe(true);
    for (const name of ['model.layers.2.mlp.experts.gate_up_proj_blocks', 'model.layers.3.mlp.experts.down_proj_scales']) {
      expect(tensorBytes(b, 'model.safetensors', name).equals(tensorBytes(c, 'model.safetensors', name)), name).toBe(true);
    }
  });
});

describe('real-model presets (config and tokenizer only)', () => {
  const real: Record<string, Record<string, unknown>> = {
    'qwen2.5-0.5b': {
      architectures: ['Qwen2ForCausalLM'], model_type: 'qwen2', hidden_size: 896, intermediate_size: 4864,
      num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, head_dim: 64, vocab_size: 151936,
      max_position_embeddings: 32768, rope_theta: 1000000, rms_norm_eps: 1e-6, tie_word_embeddings: true,
      use_sliding_window: false, rope_scaling: null,
    },
    'qwen3-0.6b': {
      architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', hidden_size: 1024, intermediate_size: 3072,
      num_hidden_layers: 28, num_attention_heads: 16, num_key_value_heads: 8, head_dim: 128, vocab_size: 151936,
      max_position_embeddings: 40960, rope_theta: 1000000, rms_norm_eps: 1e-6, tie_word_embeddings: true,
      attention_bias: false, rope_scaling: null,
    },
    'llama-3.2-1b': {
      architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 2048, intermediate_size: 8192,
      num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 64, vocab_size: 128256,
      max_position_embeddings: 131072, rope_theta: 500000, rms_norm_eps: 1e-5, tie_word_embeddings: true,
      rope_scaling: { rope_type: 'llama3', factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
    },
    'llama-3.1-8b': {
      architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 4096, intermediate_size: 14336,
      num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 128, vocab_size: 128256,
      max_position_embeddings: 131072, rope_theta: 500000, rms_norm_eps: 1e-5, tie_word_embeddings: false,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
    },
    'mistral-7b': {
      architectures: ['MistralForCausalLM'], model_type: 'mistral', hidden_size: 4096, intermediate_size: 14336,
      num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 32768,
      max_position_embeddings: 32768, rope_theta: 1000000, rms_norm_eps: 1e-5, tie_word_embeddings: false,
      sliding_window: null,
    },
    'qwen3-30b-a3b': {
      architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', hidden_size: 2048, intermediate_size: 6144,
      moe_intermediate_size: 768, num_experts: 128, num_experts_per_tok: 8, norm_topk_prob: true, decoder_sparse_step: 1,
      mlp_only_layers: [], num_hidden_layers: 48, num_attention_heads: 32, num_key_value_heads: 4, head_dim: 128,
      rms_norm_eps: 1e-6, rope_theta: 1000000, max_position_embeddings: 40960, vocab_size: 151936,
      tie_word_embeddings: false, attention_bias: false, use_sliding_window: false, sliding_window: null,
      max_window_layers: 48, hidden_act: 'silu', output_router_logits: false, router_aux_loss_coef: 0.001,
    },
    'mixtral-8x7b': {
      architectures: ['MixtralForCausalLM'], model_type: 'mixtral', hidden_size: 4096, intermediate_size: 14336,
      num_local_experts: 8, num_experts_per_tok: 2, num_hidden_layers: 32, num_attention_heads: 32,
      num_key_value_heads: 8, rms_norm_eps: 1e-5, rope_theta: 1000000, max_position_embeddings: 32768,
      vocab_size: 32000, sliding_window: null, tie_word_embeddings: false, hidden_act: 'silu',
      router_aux_loss_coef: 0.02, output_router_logits: false,
    },
    'gemma-3-4b': {
      architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3',
      text_config: {
        model_type: 'gemma3_text', hidden_size: 2560, intermediate_size: 10240, num_hidden_layers: 34,
        num_attention_heads: 8, num_key_value_heads: 4, head_dim: 256, query_pre_attn_scalar: 256, sliding_window: 1024,
        sliding_window_pattern: 6, rope_theta: 1000000, rope_local_base_freq: 10000,
        rope_scaling: { factor: 8, rope_type: 'linear' }, vocab_size: 262208, max_position_embeddings: 131072,
        hidden_activation: 'gelu_pytorch_tanh', rms_norm_eps: 1e-6, tie_word_embeddings: true,
      },
    },
    'gemma-3-27b': {
      architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3',
      text_config: {
        model_type: 'gemma3_text', hidden_size: 5376, intermediate_size: 21504, num_hidden_layers: 62,
        num_attention_heads: 32, num_key_value_heads: 16, head_dim: 128, query_pre_attn_scalar: 168, sliding_window: 1024,
        sliding_window_pattern: 6, rope_scaling: { factor: 8, rope_type: 'linear' }, vocab_size: 262208,
        max_position_embeddings: 131072, tie_word_embeddings: true,
      },
    },
    // The whole published config.json is checked in 'makeModel: gpt-oss'.
    'gpt-oss-20b': {
      architectures: ['GptOssForCausalLM'], model_type: 'gpt_oss', hidden_size: 2880, intermediate_size: 2880,
      num_hidden_layers: 24, num_local_experts: 32, experts_per_token: 4, num_experts_per_tok: 4, vocab_size: 201088,
      quantization_config: { quant_method: 'mxfp4' },
    },
    'gpt-oss-120b': {
      architectures: ['GptOssForCausalLM'], model_type: 'gpt_oss', hidden_size: 2880, intermediate_size: 2880,
      num_hidden_layers: 36, num_local_experts: 128, experts_per_token: 4, num_experts_per_tok: 4, vocab_size: 201088,
      quantization_config: { quant_method: 'mxfp4' },
    },
  };
  // Published parameter counts of these checkpoints.
  const params: Record<string, number> = {
    'qwen2.5-0.5b': 494_032_768,
    'qwen3-0.6b': 596_049_920,
    'llama-3.2-1b': 1_235_814_400,
    'llama-3.1-8b': 8_030_261_248,
    'mistral-7b': 7_248_023_552,
    // 48 layers of (attention 18_878_720 + router 262_144 + 128 experts of 3 * 2048 * 768) + embed and lm_head.
    'qwen3-30b-a3b': 30_532_122_624,
    // 32 layers of (attention and norms 41_951_232 + router 32_768 + 8 experts of 3 * 4096 * 14336) + embed and lm_head.
    'mixtral-8x7b': 46_702_792_704,
    // The text models (the vision towers, ~0.42B, are not written); tied lm_head.
    'gemma-3-4b': 3_880_263_168,
    'gemma-3-27b': 27_009_346_304,
    // The experts' unpacked values: 24 layers of (attention with biases and sinks 26_550_144 + norms
    // 5_760 + router 92_192 + 32 experts of 24_891_840, biases included) + embed and lm_head + norm.
    'gpt-oss-20b': 20_914_757_184,
    // 36 layers, 128 experts: OpenAI's 116.83B.
    'gpt-oss-120b': 116_829_156_672,
  };
  // Parameters a token reads (the experts it is routed to, all else): Qwen3-30B-A3B's "3.3B activated".
  const active: Record<string, number> = {
    'qwen3-30b-a3b': 3_353_032_704,
    'mixtral-8x7b': 12_879_925_248,
    // 4 experts a layer; with the embedding table (OpenAI's 3.61B and 5.13B leave its 0.58B out, see below).
    'gpt-oss-20b': 4_187_440_704,
    'gpt-oss-120b': 5_711_982_912,
  };

  it.each(Object.keys(real))('%s matches the published config and parameter count', async (preset) => {
    const dir = freshDir(preset);
    await makeModel({ preset, out: dir, weights: false });
    expect(readdirSync(dir).filter((f) => f.includes('safetensors'))).toEqual([]);
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject(real[preset]!);
    expect(cfg.torch_dtype).toBe('bfloat16');
    expect(paramCount(resolvePreset(preset))).toBe(params[preset]);
    expect(activeParamCount(resolvePreset(preset))).toBe(active[preset] ?? params[preset]);

    const tj = readJson(join(dir, 'tokenizer.json'));
    const tc = readJson(join(dir, 'tokenizer_config.json'));
    expect(Object.keys(tj.model.vocab).length + tj.added_tokens.length).toBe((cfg.text_config ?? cfg).vocab_size);
    const tok = new Tokenizer(tj, tc);
    const text = 'Random weights, real shapes: 0.5B params → ünïcödé 🚀';
    expect(tok.decode(tok.encode(text).ids)).toBe(text);
    const gen = readJson(join(dir, 'generation_config.json'));
    const eos = Array.isArray(cfg.eos_token_id) ? cfg.eos_token_id : [cfg.eos_token_id];
    for (const id of eos) expect(gen.eos_token_id).toContain(id);
    const bos = preset.startsWith('llama') ? '<|begin_of_text|>' : preset.startsWith('gpt-oss') ? '<|startoftext|>' : '<|endoftext|>';
    expect(tok.id_to_token(gen.bos_token_id)).toBe(bos);
  });

  it('gpt-oss: OpenAI\'s active parameter counts are these less the embedding table', () => {
    for (const [preset, openai] of [['gpt-oss-20b', 3_608_307_264], ['gpt-oss-120b', 5_132_849_472]] as const) {
      const s = resolvePreset(preset);
      expect(activeParamCount(s) - s.vocabSize * s.hiddenSize, preset).toBe(openai);
    }
  });
});

describe('tokenizer and chat template', () => {
  const dir = freshDir('tok');
  const load = async () => {
    if (!existsSync(join(dir, 'config.json'))) await makeModel({ preset: 'tiny', out: dir, weights: false });
    return {
      tj: readJson(join(dir, 'tokenizer.json')),
      tc: readJson(join(dir, 'tokenizer_config.json')),
    };
  };

  it('is a byte-level BPE with all 256 bytes, valid merges and specials after the vocab', async () => {
    const { tj } = await load();
    expect(tj.model.type).toBe('BPE');
    expect(tj.model.byte_fallback).toBe(false);
    expect(tj.normalizer).toBeNull();
    expect(tj.decoder.type).toBe('ByteLevel');
    expect(tj.pre_tokenizer.pretokenizers.map((p: { type: string }) => p.type)).toEqual(['Split', 'ByteLevel']);
    expect(tj.pre_tokenizer.pretokenizers[0].behavior).toBe('Isolated');
    const vocab: Record<string, number> = tj.model.vocab;
    const ids = Object.values(vocab).sort((a, b) => a - b);
    expect(ids.length).toBe(2048);
    ids.forEach((id, i) => expect(id).toBe(i));
    // GPT-2 byte alphabet: 188 printable bytes map to themselves, the other 68 to U+0100..U+0143.
    for (let c = 0x21; c <= 0x7e; c++) expect(vocab[String.fromCharCode(c)]).toBeDefined();
    for (let c = 0x100; c < 0x144; c++) expect(vocab[String.fromCharCode(c)]).toBeDefined();
    expect(vocab['Ġ']).toBeDefined();
    expect(tj.model.merges.length).toBe(2048 - 256);
    for (const m of tj.model.merges as string[]) {
      const [a, b] = m.split(' ');
      expect(vocab[a!] !== undefined && vocab[b!] !== undefined && vocab[a! + b!] !== undefined, m).toBe(true);
    }
    expect(tj.added_tokens.map((t: { id: number; content: string }) => [t.id, t.content])).toEqual([
      [2048, '<|endoftext|>'],
      [2049, '<|im_start|>'],
      [2050, '<|im_end|>'],
    ]);
  });

  it('round-trips arbitrary text through @huggingface/tokenizers', async () => {
    const { tj, tc } = await load();
    const tok = new Tokenizer(tj, tc);
    const texts = [
      'Hello, world! The quick brown fox jumps over the lazy dog.',
      "  leading spaces, trailing spaces   \n\n\ttabs\r\nwindows lines  ",
      'café naïve résumé crème brûlée Zürich Øresund İstanbul',
      '日本語のテキスト、中文字符，한국어 문장, Ελληνικά, русский, עברית, العربية',
      'emoji 🙂😀🚀🎉👍🏽 👨‍👩‍👧 🇯🇵 ❤️ and symbols ∑ √ ≈ ∞ € £ ¥',
      'const x = { a: [1, 2, 3], "b": null }; // comment\nif (x?.a) return x.a.map((v) => v ** 2);',
      "it's we've they'll I'd YOU'RE 12345678901234567890 3.14159e-10 0x1F",
      '\u0000\u0001\u001f control \u007f chars \u00a0 nbsp \u200b zwsp',
      'zzqxj vrk plmn wxyz — unseen words made of rare letters',
    ];
    for (const t of texts) {
      const { ids } = tok.encode(t);
      expect(ids.every((i: number) => i >= 0 && i < 2048)).toBe(true);
      expect(tok.decode(ids)).toBe(t);
    }
    // Common words are single tokens.
    expect(tok.encode(' the').ids.length).toBe(1);
    expect(tok.encode('The lighthouse keeper woke before the gulls.').ids.length).toBeLessThan(15);
  });

  it('renders the ChatML template with @huggingface/jinja and encodes specials as single ids', async () => {
    const { tj, tc } = await load();
    expect(tc.eos_token).toBe('<|im_end|>');
    expect(tc.pad_token).toBe('<|endoftext|>');
    expect(tc.add_bos_token).toBe(false);
    expect(tc.tokenizer_class).toBe('PreTrainedTokenizerFast');
    expect(tc.added_tokens_decoder['2050'].content).toBe('<|im_end|>');
    const messages = [
      { role: 'system', content: 'You are terse.' },
      { role: 'developer', content: 'Use metric units.' },
      { role: 'user', content: 'Hi there!' },
      { role: 'assistant', content: 'Hello.' },
      { role: 'user', content: [{ type: 'text', text: 'Part one, ' }, { type: 'text', text: 'part two.' }] },
    ];
    const text = new Template(tc.chat_template).render({ messages, add_generation_prompt: true, bos_token: tc.bos_token, eos_token: tc.eos_token });
    expect(text).toBe(
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>developer\nUse metric units.<|im_end|>\n' +
        '<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n' +
        '<|im_start|>user\nPart one, part two.<|im_end|>\n<|im_start|>assistant\n',
    );
    const noPrompt = new Template(tc.chat_template).render({ messages: messages.slice(2, 3), add_generation_prompt: false });
    expect(noPrompt).toBe('<|im_start|>user\nHi there!<|im_end|>\n');
    const tok = new Tokenizer(tj, tc);
    const ids = tok.encode(text).ids;
    expect(ids[0]).toBe(2049);
    expect(ids.filter((i: number) => i === 2049).length).toBe(6);
    expect(ids.filter((i: number) => i === 2050).length).toBe(5);
    expect(tok.decode(ids)).toBe(text);
  });

  it('renders the Llama 3 template of the llama presets', async () => {
    const d = freshDir('llama-tok');
    await makeModel({ preset: 'llama-3.2-1b', out: d, weights: false });
    const tc = readJson(join(d, 'tokenizer_config.json'));
    const tok = new Tokenizer(readJson(join(d, 'tokenizer.json')), tc);
    const text = new Template(tc.chat_template).render({
      messages: [{ role: 'system', content: ' Be kind. ' }, { role: 'user', content: 'Hi' }],
      add_generation_prompt: true,
      bos_token: tc.bos_token,
    });
    expect(text).toBe(
      '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>' +
        '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
    );
    const ids = tok.encode(text).ids;
    expect(ids[0]).toBe(128000);
    expect(ids).toContain(128009);
    expect(ids).toContain(128006);
    expect(ids).toContain(128007);
    const cfg = readJson(join(d, 'config.json'));
    expect(cfg.bos_token_id).toBe(128000);
    expect(cfg.eos_token_id).toEqual([128001, 128008, 128009]);
    expect(statSync(join(d, 'tokenizer.json')).size).toBeGreaterThan(1000);
  });
});
