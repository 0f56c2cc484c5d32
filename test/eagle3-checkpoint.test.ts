// models/eagle3-checkpoint.ts: a random EAGLE-3 head in the published LlamaForCausalLMEagle3 layout
// for a target written by the model maker. The header and the index tensors are parsed here,
// independently of the writer.

import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { defaultAuxLayers, writeEagle3Head } from '../models/eagle3-checkpoint.js';
import { makeModel } from '../models/make-model.js';
import { SMALL_VOCAB } from '../models/presets.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-eagle3-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let counter = 0;
const freshDir = (name: string) => join(root, `${name}-${counter++}`);

// Targets: only config.json is read, so no weights are written.
const llama6 = join(root, 'llama6');     // test-llama with 6 layers: llama3 rope scaling
const llama8 = join(root, 'llama8');     // 8 layers: vLLM's default aux layers apply
const gemmaVl = join(root, 'gemma3-vl'); // text fields under text_config, 4 layers
const qwen2 = join(root, 'qwen2');       // 3 layers, rope_scaling null
const shallow = join(root, 'shallow');   // test-qwen2's 2 layers: its aux layers repeat one
beforeAll(async () => {
  await makeModel({ preset: 'test-llama', out: llama6, weights: false, overrides: { numLayers: 6 } });
  await makeModel({ preset: 'test-llama', out: llama8, weights: false, overrides: { numLayers: 8 } });
  await makeModel({ preset: 'test-gemma3', out: gemmaVl, weights: false, overrides: { architecture: 'Gemma3ForConditionalGeneration' } });
  await makeModel({ preset: 'test-qwen2', out: qwen2, weights: false, overrides: { numLayers: 3 } });
  await makeModel({ preset: 'test-qwen2', out: shallow, weights: false });
});

interface Entry { dtype: string; shape: number[]; data_offsets: [number, number] }

function readHead(dir: string) {
  const buf = readFileSync(join(dir, 'model.safetensors'));
  const len = Number(buf.readBigUInt64LE(0));
  expect(len % 8).toBe(0);
  const header = JSON.parse(buf.subarray(8, 8 + len).toString('utf8')) as Record<string, Entry>;
  expect(header['__metadata__']).toEqual({ format: 'pt' });
  delete header['__metadata__'];
  const bytes = (name: string) => {
    const [a, b] = header[name]!.data_offsets;
    return buf.subarray(8 + len + a, 8 + len + b);
  };
  // Offsets tile the data exactly, in order.
  let end = 0;
  for (const e of Object.values(header)) {
    expect(e.data_offsets[0]).toBe(end);
    end = e.data_offsets[1];
  }
  expect(8 + len + end).toBe(buf.length);
  const d2t = Array.from(new BigInt64Array(new Uint8Array(bytes('d2t')).buffer), Number);
  const t2d = Array.from(bytes('t2d'));
  const f32 = (name: string): Float32Array => {
    const b = bytes(name);
    if (header[name]!.dtype === 'F32') return new Float32Array(new Uint8Array(b).buffer);
    const half = new Uint16Array(new Uint8Array(b).buffer);
    return new Float32Array(Uint32Array.from(half, (h) => h << 16).buffer);
  };
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  return { header, bytes, d2t, t2d, f32, config };
}

/** The expected names and shapes, written out from the published layout. */
function expectedShapes(h: number, i: number, q: number, kv: number, dv: number, v: number): Record<string, number[]> {
  return {
    'fc.weight': [h, 3 * h],
    'midlayer.hidden_norm.weight': [h],
    'midlayer.input_layernorm.weight': [h],
    'midlayer.post_attention_layernorm.weight': [h],
    'midlayer.self_attn.q_proj.weight': [q, 2 * h],
    'midlayer.self_attn.k_proj.weight': [kv, 2 * h],
    'midlayer.self_attn.v_proj.weight': [kv, 2 * h],
    'midlayer.self_attn.o_proj.weight': [h, q],
    'midlayer.mlp.gate_proj.weight': [i, h],
    'midlayer.mlp.up_proj.weight': [i, h],
    'midlayer.mlp.down_proj.weight': [h, i],
    'norm.weight': [h],
    'lm_head.weight': [dv, h],
    d2t: [dv],
    t2d: [v],
  };
}

/** d2t maps draft ids to strictly ascending distinct target ids < V, exactly those t2d marks. */
function draftIds(d2t: number[], t2d: number[], v: number): number[] {
  const ids = d2t.map((d, i) => i + d);
  for (let k = 1; k < ids.length; k++) expect(ids[k]!).toBeGreaterThan(ids[k - 1]!);
  expect(ids[0]!).toBeGreaterThanOrEqual(0);
  expect(ids[ids.length - 1]!).toBeLessThan(v);
  expect(t2d.length).toBe(v);
  expect(t2d.every((b) => b === 0 || b === 1)).toBe(true);
  const marked = t2d.flatMap((b, id) => (b ? [id] : []));
  expect(marked).toEqual(ids);
  return ids;
}

const meanStd = (v: Float32Array) => {
  const mean = v.reduce((a, b) => a + b, 0) / v.length;
  return { mean, std: Math.sqrt(v.reduce((a, b) => a + (b - mean) ** 2, 0) / v.length) };
};

describe('writeEagle3Head', () => {
  it('writes the published layout in BF16 by default, with the target\'s shapes and a 32000-capped draft vocabulary', () => {
    const out = freshDir('llama6');
    writeEagle3Head(llama6, out, { draftVocabSize: 700 });
    expect(readdirSync(out).sort()).toEqual(['config.json', 'model.safetensors']);
    const { header, d2t, t2d, f32, config } = readHead(out);
    const shapes = expectedShapes(128, 352, 4 * 32, 2 * 32, 700, SMALL_VOCAB);
    expect(Object.keys(header).sort()).toEqual(Object.keys(shapes).sort());
    for (const [name, shape] of Object.entries(shapes)) {
      expect(header[name]!.shape, name).toEqual(shape);
      expect(header[name]!.dtype, name).toBe(name === 'd2t' ? 'I64' : name === 't2d' ? 'BOOL' : 'BF16');
    }
    const ids = draftIds(d2t, t2d, SMALL_VOCAB);
    expect(ids.length).toBe(700);
    expect(ids.slice(0, 256)).toEqual(Array.from({ length: 256 }, (_, i) => i));
    expect(ids[699]!).toBeGreaterThan(1000);  // a random subset, not 0..699

    expect(config).toEqual({
      architectures: ['LlamaForCausalLMEagle3'],
      draft_vocab_size: 700,
      eagle_config: { eagle_aux_hidden_state_layer_ids: [0, 3, 5] },
      head_dim: 32,
      hidden_act: 'silu',
      hidden_size: 128,
      intermediate_size: 352,
      max_position_embeddings: 2048,
      model_type: 'llama',
      num_attention_heads: 4,
      num_hidden_layers: 1,
      num_key_value_heads: 2,
      rms_norm_eps: 1e-5,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 },
      rope_theta: 10000,
      tie_word_embeddings: false,
      torch_dtype: 'bfloat16',
      vocab_size: SMALL_VOCAB,
    });

    // Norms 1 + 0.1 N(0, 1); matrices N(0, 1) / sqrt(fan_in).
    const norm = meanStd(f32('midlayer.hidden_norm.weight'));
    expect(norm.mean).toBeCloseTo(1, 1);
    expect(norm.std).toBeGreaterThan(0.07);
    expect(norm.std).toBeLessThan(0.13);
    for (const [name, fanIn] of [['fc.weight', 384], ['midlayer.self_attn.q_proj.weight', 256], ['midlayer.mlp.down_proj.weight', 352], ['lm_head.weight', 128]] as const) {
      const s = meanStd(f32(name));
      expect(Math.abs(s.mean), name).toBeLessThan(0.01);
      expect(s.std * Math.sqrt(fanIn), name).toBeGreaterThan(0.95);
      expect(s.std * Math.sqrt(fanIn), name).toBeLessThan(1.05);
    }
  });

  it('defaults the draft vocabulary to min(V, 32000) (all of a small target\'s) and vLLM\'s aux layers for deep targets', () => {
    const out = freshDir('llama8');
    writeEagle3Head(llama8, out, {});
    const { header, d2t, t2d, config } = readHead(out);
    expect(header['lm_head.weight']!.shape).toEqual([SMALL_VOCAB, 128]);
    expect(config['draft_vocab_size']).toBe(SMALL_VOCAB);
    expect(d2t.every((d) => d === 0)).toBe(true);
    expect(t2d.every((b) => b === 1)).toBe(true);
    expect(config['eagle_config']).toEqual({ eagle_aux_hidden_state_layer_ids: [2, 4, 5] });
    expect(defaultAuxLayers(2)).toEqual([0, 1, 1]);
    expect(defaultAuxLayers(3)).toEqual([0, 1, 2]);
    expect(defaultAuxLayers(5)).toEqual([0, 2, 4]);
    expect(defaultAuxLayers(7)).toEqual([2, 3, 4]);
    expect(defaultAuxLayers(32)).toEqual([2, 16, 29]);
  });

  it('reads a nested text_config, writes F32 on request and honours the shape options', () => {
    const out = freshDir('gemma-vl');
    writeEagle3Head(gemmaVl, out, { dtype: 'F32', intermediateSize: 96, numHeads: 2, numKvHeads: 1, headDim: 16, draftVocabSize: 300, auxLayers: [3, 1, 2] });
    const { header, d2t, t2d, config } = readHead(out);
    const shapes = expectedShapes(64, 96, 2 * 16, 16, 300, SMALL_VOCAB);
    expect(Object.keys(header).sort()).toEqual(Object.keys(shapes).sort());
    for (const [name, shape] of Object.entries(shapes)) {
      expect(header[name]!.shape, name).toEqual(shape);
      expect(header[name]!.dtype, name).toBe(name === 'd2t' ? 'I64' : name === 't2d' ? 'BOOL' : 'F32');
    }
    expect(draftIds(d2t, t2d, SMALL_VOCAB).length).toBe(300);
    expect(config).toMatchObject({
      architectures: ['LlamaForCausalLMEagle3'],
      model_type: 'llama',
      hidden_size: 64,
      intermediate_size: 96,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      head_dim: 16,
      vocab_size: SMALL_VOCAB,
      draft_vocab_size: 300,
      rms_norm_eps: 1e-6,
      rope_theta: 1000000,
      max_position_embeddings: 2048,
      rope_scaling: { rope_type: 'linear', factor: 4 },
      torch_dtype: 'float32',
      eagle_config: { eagle_aux_hidden_state_layer_ids: [3, 1, 2] },
    });
  });

  it('takes an explicit draft vocabulary, omits a null rope_scaling, and is deterministic in the seed', () => {
    const tokens = [2050, 7, 0, 1024, 3];
    const a = freshDir('explicit');
    writeEagle3Head(llama6, a, { draftTokens: tokens, seed: 9 });
    const { d2t, t2d, config } = readHead(a);
    expect(draftIds(d2t, t2d, SMALL_VOCAB)).toEqual([0, 3, 7, 1024, 2050]);
    expect(d2t).toEqual([0, 2, 5, 1021, 2046]);
    expect(config['draft_vocab_size']).toBe(5);

    const b = freshDir('explicit');
    writeEagle3Head(llama6, b, { draftTokens: tokens, seed: 9 });
    expect(readFileSync(join(b, 'model.safetensors')).equals(readFileSync(join(a, 'model.safetensors')))).toBe(true);
    const c = freshDir('explicit');
    writeEagle3Head(llama6, c, { draftTokens: tokens, seed: 10 });
    expect(readHead(c).bytes('fc.weight').equals(readHead(a).bytes('fc.weight'))).toBe(false);

    const seeded = (seed: number) => {
      const dir = freshDir('seeded');
      writeEagle3Head(llama6, dir, { draftVocabSize: 400, seed });
      const { d2t: d, t2d: t } = readHead(dir);
      return draftIds(d, t, SMALL_VOCAB);
    };
    expect(seeded(3)).toEqual(seeded(3));
    expect(seeded(3)).not.toEqual(seeded(4));

    // rope_scaling: null in the target -> no rope_scaling in the head.
    const q = freshDir('qwen2');
    writeEagle3Head(qwen2, q, { draftVocabSize: 10 });
    const qc = JSON.parse(readFileSync(join(q, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect('rope_scaling' in qc).toBe(false);
    expect(qc['eagle_config']).toEqual({ eagle_aux_hidden_state_layer_ids: [0, 1, 2] });
    expect(qc['head_dim']).toBe(16);
  });

  it('checks its options with RangeErrors before writing anything', () => {
    const bad: [string, Parameters<typeof writeEagle3Head>[2], RegExp][] = [
      [llama6, { draftVocabSize: 0 }, /draftVocabSize must be an integer in \[1, 2051\]/],
      [llama6, { draftVocabSize: SMALL_VOCAB + 1 }, /draftVocabSize/],
      [llama6, { draftVocabSize: 1.5 }, /draftVocabSize/],
      [llama6, { intermediateSize: 0 }, /intermediateSize must be an integer > 0/],
      [llama6, { intermediateSize: -4 }, /intermediateSize/],
      [llama6, { auxLayers: [1, 1, 2] }, /auxLayers must be 3 distinct integers in \[0, 6\)/],
      [llama6, { auxLayers: [0, 2, 6] }, /auxLayers/],
      [llama6, { auxLayers: [0, 2] }, /auxLayers/],
      [llama6, { auxLayers: [0, 2.5, 3] }, /auxLayers/],
      [llama6, { draftTokens: [1, 2, 2] }, /appears twice/],
      [llama6, { draftTokens: [1, SMALL_VOCAB] }, /not a target id/],
      [llama6, { draftTokens: [1, 2], draftVocabSize: 3 }, /draftTokens has 2 ids, draftVocabSize is 3/],
      [llama6, { draftTokens: [] }, /draftVocabSize/],
      [llama6, { numHeads: 3 }, /multiple of numKvHeads/],
      [llama6, { dtype: 'F16' as 'F32' }, /dtype must be 'F32' or 'BF16'/],
      [shallow, { auxLayers: [0, 0, 0] }, /auxLayers must be 3 distinct integers in \[0, 2\)/],
      [shallow, { auxLayers: [0, 1, 2] }, /auxLayers must be 3 distinct integers in \[0, 2\)/],
    ];
    for (const [target, opts, message] of bad) {
      const out = freshDir('bad');
      expect(() => writeEagle3Head(target, out, opts), JSON.stringify(opts)).toThrow(RangeError);
      expect(() => writeEagle3Head(target, out, opts), JSON.stringify(opts)).toThrow(message);
      expect(existsSync(out)).toBe(false);
    }
  });
});
