// The vision-language presets of the model maker (issue 34): Qwen2.5-VL's and Gemma 3's published
// config.json, preprocessor_config.json and tensor layout, the vision tokens and their chat
// templates, and the engine's refusal of Qwen2.5-VL's architecture until it has a vision encoder.

import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { afterAll, describe, expect, it } from 'vitest';
import { PRESETS, makeModel, paramCount, resolvePreset, tensorSpecs, weightBytes } from '../models/make-model.js';
import { type Gemma3VisionShape, type Qwen25VisionShape, PRESETS as SERVED_PRESETS } from '../models/presets.js';
import { loadNativeEngine, nativeAvailable } from '../src/native/native.js';
import { qwen2VlPatches, qwen2VlPreprocessorConfig } from '../src/vision/qwen2-vl-preprocess.js';
import { gemma3Pixels, gemma3PreprocessorConfig } from '../src/vision/gemma3-preprocess.js';
import { Qwen25VlSession, loadQwen25VlReference } from './reference/qwen2-5-vl.js';
import { Gemma3VlSession, loadGemma3VlReference } from './reference/gemma3-vl.js';

const root = mkdtempSync(join(tmpdir(), 'sluice-make-model-vl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let counter = 0;
const freshDir = (name: string) => join(root, `${name}-${counter++}`);
const readJson = (p: string) => JSON.parse(readFileSync(p, 'utf8'));

function readHeader(path: string): Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }> {
  const buf = readFileSync(path);
  const len = Number(buf.readBigUInt64LE(0));
  const json = JSON.parse(buf.subarray(8, 8 + len).toString('utf8'));
  delete json.__metadata__;
  return json;
}

/** Qwen2.5-VL's tensors and shapes, written out from the published checkpoints' weight maps. */
function expectedTensors(preset: string): Map<string, number[]> {
  const s = resolvePreset(preset);
  const v = s.vision as Qwen25VisionShape;
  const m = new Map<string, number[]>();
  const h = s.hiddenSize;
  const kv = s.numKvHeads * s.headDim;
  m.set('model.embed_tokens.weight', [s.vocabSize, h]);
  for (let i = 0; i < s.numLayers; i++) {
    const p = `model.layers.${i}.`;
    m.set(p + 'input_layernorm.weight', [h]);
    m.set(p + 'post_attention_layernorm.weight', [h]);
    m.set(p + 'self_attn.q_proj.weight', [h, h]);
    m.set(p + 'self_attn.q_proj.bias', [h]);
    m.set(p + 'self_attn.k_proj.weight', [kv, h]);
    m.set(p + 'self_attn.k_proj.bias', [kv]);
    m.set(p + 'self_attn.v_proj.weight', [kv, h]);
    m.set(p + 'self_attn.v_proj.bias', [kv]);
    m.set(p + 'self_attn.o_proj.weight', [h, h]);
    m.set(p + 'mlp.gate_proj.weight', [s.intermediateSize, h]);
    m.set(p + 'mlp.up_proj.weight', [s.intermediateSize, h]);
    m.set(p + 'mlp.down_proj.weight', [h, s.intermediateSize]);
  }
  m.set('model.norm.weight', [h]);
  if (!s.tieWordEmbeddings) m.set('lm_head.weight', [s.vocabSize, h]);
  const vh = v.hiddenSize;
  const vi = v.intermediateSize;
  m.set('visual.patch_embed.proj.weight', [vh, 3, v.temporalPatchSize, v.patchSize, v.patchSize]);
  for (let i = 0; i < v.depth; i++) {
    const p = `visual.blocks.${i}.`;
    m.set(p + 'norm1.weight', [vh]);
    m.set(p + 'norm2.weight', [vh]);
    m.set(p + 'attn.qkv.weight', [3 * vh, vh]);
    m.set(p + 'attn.qkv.bias', [3 * vh]);
    m.set(p + 'attn.proj.weight', [vh, vh]);
    m.set(p + 'attn.proj.bias', [vh]);
    m.set(p + 'mlp.gate_proj.weight', [vi, vh]);
    m.set(p + 'mlp.gate_proj.bias', [vi]);
    m.set(p + 'mlp.up_proj.weight', [vi, vh]);
    m.set(p + 'mlp.up_proj.bias', [vi]);
    m.set(p + 'mlp.down_proj.weight', [vh, vi]);
    m.set(p + 'mlp.down_proj.bias', [vh]);
  }
  m.set('visual.merger.ln_q.weight', [vh]);
  m.set('visual.merger.mlp.0.weight', [4 * vh, 4 * vh]);
  m.set('visual.merger.mlp.0.bias', [4 * vh]);
  m.set('visual.merger.mlp.2.weight', [h, 4 * vh]);
  m.set('visual.merger.mlp.2.bias', [h]);
  return m;
}

/** Qwen/Qwen2.5-VL-3B-Instruct's and -7B-Instruct's config.json (transformers 4.41.2 layout), token ids aside. */
const published = (size: '3b' | '7b') => {
  const [hidden, inter, layers, heads, kvHeads, vocab, tied, windowLayers] =
    size === '3b' ? [2048, 11008, 36, 16, 2, 151936, true, 70] : [3584, 18944, 28, 28, 4, 152064, false, 28];
  return {
    architectures: ['Qwen2_5_VLForConditionalGeneration'], attention_dropout: 0.0, bos_token_id: 151643, eos_token_id: 151645,
    hidden_act: 'silu', hidden_size: hidden, image_token_id: 151655, initializer_range: 0.02, intermediate_size: inter,
    max_position_embeddings: 128000, max_window_layers: windowLayers, model_type: 'qwen2_5_vl', num_attention_heads: heads,
    num_hidden_layers: layers, num_key_value_heads: kvHeads, rms_norm_eps: 1e-6,
    rope_scaling: { type: 'mrope', mrope_section: [16, 24, 24] }, rope_theta: 1000000.0, sliding_window: 32768,
    tie_word_embeddings: tied, torch_dtype: 'bfloat16', transformers_version: '4.41.2', use_cache: true,
    use_sliding_window: false, video_token_id: 151656,
    vision_config: {
      depth: 32, hidden_act: 'silu', hidden_size: 1280, intermediate_size: 3420, num_heads: 16, in_chans: 3,
      out_hidden_size: hidden, patch_size: 14, spatial_merge_size: 2, spatial_patch_size: 14, window_size: 112,
      fullatt_block_indexes: [7, 15, 23, 31], tokens_per_second: 2, temporal_patch_size: 2,
    },
    vision_end_token_id: 151653, vision_start_token_id: 151652, vision_token_id: 151654, vocab_size: vocab,
  };
};

describe('Qwen2.5-VL presets', () => {
  it('are listed by the maker, not among the families the engine serves', () => {
    for (const p of ['qwen2.5-vl-3b', 'qwen2.5-vl-7b', 'test-qwen2.5-vl']) {
      expect(Object.hasOwn(PRESETS, p), p).toBe(true);
      expect(Object.hasOwn(SERVED_PRESETS, p), p).toBe(false);
    }
  });

  it.each([['qwen2.5-vl-3b', '3b', 3_754_622_976], ['qwen2.5-vl-7b', '7b', 8_292_166_656]] as const)(
    '%s: the published config.json (token ids aside), preprocessor_config.json and parameter count',
    async (preset, size, params) => {
      const dir = freshDir(preset);
      await makeModel({ preset, out: dir, weights: false });
      expect(readdirSync(dir).filter((f) => f.includes('safetensors'))).toEqual([]);
      const cfg = readJson(join(dir, 'config.json'));
      // The maker's specials follow its BPE entries (the last ids of vocab_size), in Qwen2's order:
      // <|endoftext|>, <|im_start|>, <|im_end|>, then the five vision tokens.
      const first = cfg.vocab_size - 8;
      expect(cfg).toEqual({
        ...published(size), bos_token_id: first, eos_token_id: first + 2, vision_start_token_id: first + 3,
        vision_end_token_id: first + 4, vision_token_id: first + 5, image_token_id: first + 6, video_token_id: first + 7,
      });
      expect(readJson(join(dir, 'preprocessor_config.json'))).toEqual({
        min_pixels: 3136, max_pixels: 12845056, patch_size: 14, temporal_patch_size: 2, merge_size: 2,
        image_mean: [0.48145466, 0.4578275, 0.40821073], image_std: [0.26862954, 0.26130258, 0.27577711],
        image_processor_type: 'Qwen2VLImageProcessor', processor_class: 'Qwen2_5_VLProcessor',
      });
      // Published: 3.75B and 8.29B (the 7B's bf16 index holds total_size 16_584_333_312 = 2 x 8_292_166_656).
      expect(paramCount(resolvePreset(preset))).toBe(params);
      const names = new Map(tensorSpecs(resolvePreset(preset)).map((t) => [t.name, t.shape]));
      expect(names).toEqual(expectedTensors(preset));
      expect(weightBytes(preset)).toBe(2 * params);

      const tj = readJson(join(dir, 'tokenizer.json'));
      const tc = readJson(join(dir, 'tokenizer_config.json'));
      expect(Object.keys(tj.model.vocab).length + tj.added_tokens.length).toBe(cfg.vocab_size);
      const tok = new Tokenizer(tj, tc);
      expect(tok.id_to_token(cfg.image_token_id)).toBe('<|image_pad|>');
      expect(tok.id_to_token(cfg.video_token_id)).toBe('<|video_pad|>');
    },
  );

  it('the vision parameters are the same tower in both (~0.67B, the merger projecting to the decoder width)', () => {
    const vision = (p: string) => tensorSpecs(resolvePreset(p))
      .filter((t) => t.name.startsWith('visual.')).reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
    // 32 blocks of 20_487_360, patch embed 1_505_280, merger 26_235_904 + 5120 * out + out.
    expect(vision('qwen2.5-vl-3b')).toBe(668_684_288);
    expect(vision('qwen2.5-vl-7b')).toBe(668_684_288 + (3584 - 2048) * 5121);
  });

  it('test-qwen2.5-vl: every tensor with its shape, config.json and preprocessor_config.json', async () => {
    const dir = freshDir('test-qwen2.5-vl');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir });
    const header = readHeader(join(dir, 'model.safetensors'));
    const exp = expectedTensors('test-qwen2.5-vl');
    expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
    for (const [name, e] of Object.entries(header)) {
      expect(e.shape, name).toEqual(exp.get(name));
      expect(e.dtype, name).toBe('F32');
    }
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({
      architectures: ['Qwen2_5_VLForConditionalGeneration'], model_type: 'qwen2_5_vl', hidden_size: 128, num_hidden_layers: 2,
      num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 2056, tie_word_embeddings: false, torch_dtype: 'float32',
      rope_scaling: { type: 'mrope', mrope_section: [4, 6, 6] },
      bos_token_id: 2048, eos_token_id: 2050,
      vision_start_token_id: 2051, vision_end_token_id: 2052, vision_token_id: 2053, image_token_id: 2054, video_token_id: 2055,
      vision_config: {
        depth: 4, hidden_size: 64, intermediate_size: 160, num_heads: 4, out_hidden_size: 128, patch_size: 14,
        spatial_merge_size: 2, temporal_patch_size: 2, window_size: 56, fullatt_block_indexes: [1],
      },
    });
    expect(cfg.head_dim).toBeUndefined();
    // Windows of 56 pixels hold 2 x 2 merged tokens: a 224 x 224 image (the largest) has 4 x 4 windows.
    const v = cfg.vision_config;
    expect(v.window_size / v.spatial_merge_size / v.patch_size).toBe(2);
    const pre = readJson(join(dir, 'preprocessor_config.json'));
    expect(pre).toMatchObject({ min_pixels: 3136, max_pixels: 50176, patch_size: 14, merge_size: 2, processor_class: 'Qwen2_5_VLProcessor' });
    expect(Math.sqrt(pre.max_pixels) / (v.window_size)).toBe(4);
    const gen = readJson(join(dir, 'generation_config.json'));
    expect(gen).toMatchObject({ bos_token_id: 2048, eos_token_id: [2050, 2048], pad_token_id: 2048 });
  });

  it('the chat template renders an image part as <|vision_start|><|image_pad|><|vision_end|>, each a single id', async () => {
    const dir = freshDir('vl-template');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir, weights: false });
    const tj = readJson(join(dir, 'tokenizer.json'));
    const tc = readJson(join(dir, 'tokenizer_config.json'));
    expect(tj.added_tokens.map((t: { id: number; content: string }) => [t.id, t.content])).toEqual([
      [2048, '<|endoftext|>'], [2049, '<|im_start|>'], [2050, '<|im_end|>'], [2051, '<|vision_start|>'], [2052, '<|vision_end|>'],
      [2053, '<|vision_pad|>'], [2054, '<|image_pad|>'], [2055, '<|video_pad|>'],
    ]);
    expect(tc.additional_special_tokens).toContain('<|image_pad|>');
    const template = new Template(tc.chat_template);
    const messages = [
      { role: 'user', content: [{ type: 'image', image: 'file:///cat.png' }, { type: 'text', text: 'What is this?' }] },
      { role: 'assistant', content: 'A cat.' },
      {
        role: 'user',
        content: [
          { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }, { type: 'text', text: 'And ' },
          { type: 'video', video: 'file:///clip.mp4' }, { type: 'text', text: 'this?' },
        ],
      },
    ];
    const text = template.render({ messages, add_generation_prompt: true });
    expect(text).toBe(
      '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' +
        '<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n' +
        '<|im_start|>assistant\nA cat.<|im_end|>\n' +
        '<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>And <|vision_start|><|video_pad|><|vision_end|>this?<|im_end|>\n' +
        '<|im_start|>assistant\n',
    );
    const numbered = template.render({
      messages: [{ role: 'system', content: 'Be brief.' }, messages[0]!, messages[2]!], add_generation_prompt: false, add_vision_id: true,
    });
    expect(numbered).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n' +
        '<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n' +
        '<|im_start|>user\nPicture 2: <|vision_start|><|image_pad|><|vision_end|>And ' +
        'Video 1: <|vision_start|><|video_pad|><|vision_end|>this?<|im_end|>\n',
    );
    const tok = new Tokenizer(tj, tc);
    const ids = tok.encode('<|vision_start|><|image_pad|><|vision_end|>').ids;
    expect(ids).toEqual([2051, 2054, 2052]);
    expect(tok.decode(tok.encode(text).ids)).toBe(text);
  });

  it('refuses shapes Qwen2.5-VL cannot have, and quantized layouts', async () => {
    const v = resolvePreset('test-qwen2.5-vl').vision!;
    expect(() => resolvePreset('test-qwen2.5-vl', { vision: { ...v, windowSize: 42 } })).toThrow(/windowSize \(42\) must be a multiple of patchSize \* spatialMergeSize \(28\)/);
    expect(() => resolvePreset('test-qwen2.5-vl', { vision: { ...v, fullattBlockIndexes: [4] } })).toThrow(/fullattBlockIndexes holds 4/);
    expect(() => resolvePreset('test-qwen2.5-vl', { vision: { ...v, mropeSection: [4, 6, 8] } })).toThrow(/mropeSection/);
    expect(() => resolvePreset('test-qwen2.5-vl', { headDim: 64 })).toThrow(/no head_dim/);
    expect(() => resolvePreset('test-qwen2.5-vl', { tokenizer: 'chatml' })).toThrow(/qwen2-vl tokenizer/);
    expect(() => resolvePreset('test-qwen2.5-vl', { architecture: 'LlamaForCausalLM' })).toThrow(/Qwen2ForCausalLM decoder/);
    await expect(makeModel({ preset: 'test-qwen2.5-vl', out: freshDir('vl-q'), quantize: { layout: 'awq' } }))
      .rejects.toThrow(/float dtypes only/);
  });

  it('runs in the float64 reference with an image its own preprocessor_config.json prepares', async () => {
    const dir = freshDir('vl-reference');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir });
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, number>;
    const pre = qwen2VlPreprocessorConfig(JSON.parse(readFileSync(join(dir, 'preprocessor_config.json'), 'utf8')) as Record<string, unknown>);
    const rgb = Uint8Array.from({ length: 90 * 60 * 3 }, (_, i) => (i * 37) % 256);
    const image = qwen2VlPatches(rgb, 90, 60, pre);
    const ref = loadQwen25VlReference(dir);
    const session = new Qwen25VlSession(ref);
    const prompt = [5, 17, config['vision_start_token_id']!, ...Array<number>(image.numTokens).fill(config['image_token_id']!),
      config['vision_end_token_id']!, 42];
    const logits = session.prefill(prompt, [{ pixelValues: image.pixelValues, grid: image.grid }]);
    expect(logits).toHaveLength(prompt.length);
    expect(logits.at(-1)!.length).toBe(config['vocab_size']);
    expect(logits.at(-1)!.every(Number.isFinite)).toBe(true);
    // A different image changes what follows it.
    const other = qwen2VlPatches(rgb.map((v) => 255 - v), 90, 60, pre);
    const logits2 = new Qwen25VlSession(ref).prefill(prompt, [{ pixelValues: other.pixelValues, grid: other.grid }]);
    expect(logits2[1]).toEqual(logits[1]);
    expect(Math.max(...logits2.at(-1)!.map((v, i) => Math.abs(v - logits.at(-1)![i]!)))).toBeGreaterThan(1e-3);
  });

  it.skipIf(!nativeAvailable())('the native engine loads the language model (M-RoPE; engine-qwen2-5-vl.test.ts runs it)', async () => {
    const dir = freshDir('vl-load');
    await makeModel({ preset: 'test-qwen2.5-vl', out: dir });
    const handle = await loadNativeEngine({ modelDir: dir, backend: 'cpu', kvCacheBytes: 8 << 20, blockSize: 16, numThreads: 1 });
    try {
      expect(handle.info()).toMatchObject({ architecture: 'Qwen2_5_VLForConditionalGeneration', numLayers: 2, vocabSize: 2056 });
    } finally {
      handle.dispose();
    }
  });
});

/** Gemma 3's image tensors and shapes besides the text model's, written out from google/gemma-3-4b-it's weight map. */
function expectedGemma3VisionTensors(preset: string): Map<string, number[]> {
  const s = resolvePreset(preset);
  const v = s.vision as Gemma3VisionShape;
  const vh = v.hiddenSize, vi = v.intermediateSize;
  const m = new Map<string, number[]>();
  m.set('multi_modal_projector.mm_input_projection_weight', [vh, s.hiddenSize]);
  m.set('multi_modal_projector.mm_soft_emb_norm.weight', [vh]);
  const e = 'vision_tower.vision_model.embeddings.';
  m.set(e + 'patch_embedding.weight', [vh, 3, v.patchSize, v.patchSize]);
  m.set(e + 'patch_embedding.bias', [vh]);
  m.set(e + 'position_embedding.weight', [(v.imageSize / v.patchSize) ** 2, vh]);
  for (let i = 0; i < v.numLayers; i++) {
    const p = `vision_tower.vision_model.encoder.layers.${i}.`;
    for (const n of ['layer_norm1', 'layer_norm2']) {
      m.set(p + n + '.weight', [vh]);
      m.set(p + n + '.bias', [vh]);
    }
    for (const n of ['q_proj', 'k_proj', 'v_proj', 'out_proj']) {
      m.set(p + `self_attn.${n}.weight`, [vh, vh]);
      m.set(p + `self_attn.${n}.bias`, [vh]);
    }
    m.set(p + 'mlp.fc1.weight', [vi, vh]);
    m.set(p + 'mlp.fc1.bias', [vi]);
    m.set(p + 'mlp.fc2.weight', [vh, vi]);
    m.set(p + 'mlp.fc2.bias', [vh]);
  }
  m.set('vision_tower.vision_model.post_layernorm.weight', [vh]);
  m.set('vision_tower.vision_model.post_layernorm.bias', [vh]);
  return m;
}

const GEMMA3_PREPROCESSOR = (size: number, tokens: number) => ({
  do_convert_rgb: null, do_normalize: true, do_pan_and_scan: null, do_rescale: true, do_resize: true, image_mean: [0.5, 0.5, 0.5],
  image_processor_type: 'Gemma3ImageProcessor', image_seq_length: tokens, image_std: [0.5, 0.5, 0.5], pan_and_scan_max_num_crops: null,
  pan_and_scan_min_crop_size: null, pan_and_scan_min_ratio_to_activate: null, processor_class: 'Gemma3Processor', resample: 2,
  rescale_factor: 0.00392156862745098, size: { height: size, width: size },
});

describe('Gemma 3 presets with images', () => {
  it('are listed by the maker beside the text presets, which stay as they were', () => {
    for (const p of ['gemma-3-4b-vl', 'test-gemma3-vl']) {
      expect(Object.hasOwn(PRESETS, p), p).toBe(true);
      expect(Object.hasOwn(SERVED_PRESETS, p), p).toBe(false);
    }
    expect(resolvePreset('gemma-3-4b').vision).toBeUndefined();
    expect(resolvePreset('gemma-3-4b').tokenizer).toBe('chatml');
    expect(resolvePreset('test-gemma3').architecture).toBe('Gemma3ForCausalLM');
    expect(paramCount(resolvePreset('gemma-3-4b'))).toBe(3_880_263_168);
  });

  it('gemma-3-4b-vl: the published config.json (token ids aside), tensors, preprocessor_config.json and parameter count', async () => {
    const dir = freshDir('gemma-3-4b-vl');
    await makeModel({ preset: 'gemma-3-4b-vl', out: dir, weights: false });
    const textDir = freshDir('gemma-3-4b');
    await makeModel({ preset: 'gemma-3-4b', out: textDir, weights: false });
    const cfg = readJson(join(dir, 'config.json'));
    const textCfg = readJson(join(textDir, 'config.json'));
    // The maker's specials follow its BPE entries: <|endoftext|>, <|im_start|>, <|im_end|>, then
    // <start_of_image>, <end_of_image>, <image_soft_token> (published: 255999, 256000, 262144).
    const first = 262208 - 6;
    const ids = { bos_token_id: first, eos_token_id: first + 2 };
    expect(cfg).toEqual({
      ...textCfg,
      ...ids,
      boi_token_index: first + 3,
      eoi_token_index: first + 4,
      image_token_index: first + 5,
      mm_tokens_per_image: 256,
      text_config: { ...textCfg.text_config, ...ids },
      vision_config: {
        hidden_size: 1152, image_size: 896, intermediate_size: 4304, model_type: 'siglip_vision_model', num_attention_heads: 16,
        num_hidden_layers: 27, patch_size: 14, vision_use_head: false,
      },
    });
    expect(cfg).toMatchObject({ architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3', torch_dtype: 'bfloat16', initializer_range: 0.02 });
    expect(Object.keys(cfg)).toEqual(Object.keys(cfg).sort());
    expect(readJson(join(dir, 'preprocessor_config.json'))).toEqual(GEMMA3_PREPROCESSOR(896, 256));
    // Published: total_size 8_600_158_944 bf16 bytes in google/gemma-3-4b-it's index = 4_300_079_472 parameters.
    const s = resolvePreset('gemma-3-4b-vl');
    expect(paramCount(s)).toBe(4_300_079_472);
    expect(weightBytes('gemma-3-4b-vl')).toBe(2 * 4_300_079_472);
    const names = new Map(tensorSpecs(s).map((t) => [t.name, t.shape]));
    const expected = new Map([...tensorSpecs(resolvePreset('gemma-3-4b')).map((t) => [t.name, t.shape] as const), ...expectedGemma3VisionTensors('gemma-3-4b-vl')]);
    expect(names).toEqual(expected);
    // The tower (SigLIP So400m/14 without its head) 416_866_032, the projector 1152 * 2560 + 1152.
    const vision = tensorSpecs(s).filter((t) => !t.name.startsWith('language_model.')).reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
    expect(vision).toBe(416_866_032 + 1152 * 2560 + 1152);

    const tj = readJson(join(dir, 'tokenizer.json'));
    const tok = new Tokenizer(tj, readJson(join(dir, 'tokenizer_config.json')));
    expect(Object.keys(tj.model.vocab).length + tj.added_tokens.length).toBe(262208);
    expect(tok.id_to_token(cfg.image_token_index)).toBe('<image_soft_token>');
  });

  it('test-gemma3-vl: every tensor with its shape, config.json and preprocessor_config.json', async () => {
    const dir = freshDir('test-gemma3-vl');
    await makeModel({ preset: 'test-gemma3-vl', out: dir });
    const header = readHeader(join(dir, 'model.safetensors'));
    const s = resolvePreset('test-gemma3-vl');
    const exp = new Map([
      ...tensorSpecs({ ...s, vision: undefined }).map((t) => [t.name, t.shape] as const), ...expectedGemma3VisionTensors('test-gemma3-vl'),
    ]);
    expect([...exp.keys()].every((n) => n.startsWith('language_model.model.') || !n.startsWith('language_model'))).toBe(true);
    expect(Object.keys(header).sort()).toEqual([...exp.keys()].sort());
    for (const [name, e] of Object.entries(header)) {
      expect(e.shape, name).toEqual(exp.get(name));
      expect(e.dtype, name).toBe('F32');
    }
    const cfg = readJson(join(dir, 'config.json'));
    expect(cfg).toMatchObject({
      architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3', torch_dtype: 'float32',
      boi_token_index: 2051, eoi_token_index: 2052, image_token_index: 2053, mm_tokens_per_image: 4,
      text_config: {
        hidden_size: 64, num_hidden_layers: 4, sliding_window: 8, sliding_window_pattern: 2, vocab_size: 2054, model_type: 'gemma3_text',
        query_pre_attn_scalar: 24, head_dim: 32,
      },
      vision_config: {
        hidden_size: 32, image_size: 56, intermediate_size: 64, model_type: 'siglip_vision_model', num_attention_heads: 2,
        num_hidden_layers: 2, patch_size: 14, vision_use_head: false,
      },
    });
    expect(readJson(join(dir, 'preprocessor_config.json'))).toEqual(GEMMA3_PREPROCESSOR(56, 4));
    expect(paramCount(s)).toBe(392_576);
    // 16 patches pooled 2 x 2 into 4 tokens.
    const v = cfg.vision_config;
    expect((v.image_size / v.patch_size) ** 2 / cfg.mm_tokens_per_image).toBe(4);
    expect(readJson(join(dir, 'generation_config.json'))).toMatchObject({ bos_token_id: 2048, eos_token_id: [2050, 2048], pad_token_id: 2048 });
  });

  it('the chat template writes an image part as <start_of_image>; the processor\'s image text is single ids', async () => {
    const dir = freshDir('gemma-template');
    await makeModel({ preset: 'test-gemma3-vl', out: dir, weights: false });
    const tj = readJson(join(dir, 'tokenizer.json'));
    const tc = readJson(join(dir, 'tokenizer_config.json'));
    expect(tj.added_tokens.map((t: { id: number; content: string }) => [t.id, t.content])).toEqual([
      [2048, '<|endoftext|>'], [2049, '<|im_start|>'], [2050, '<|im_end|>'], [2051, '<start_of_image>'], [2052, '<end_of_image>'],
      [2053, '<image_soft_token>'],
    ]);
    expect(tj.added_tokens.every((t: { special: boolean }) => t.special)).toBe(true);
    expect(tc.additional_special_tokens).toEqual(['<|im_start|>', '<|im_end|>', '<start_of_image>', '<end_of_image>', '<image_soft_token>']);
    const template = new Template(tc.chat_template);
    const text = template.render({
      messages: [
        { role: 'user', content: [{ type: 'image', image: 'file:///cat.png' }, { type: 'text', text: 'What is this?' }] },
        { role: 'assistant', content: 'A cat.' },
        { role: 'user', content: [{ type: 'text', text: 'And ' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] },
      ],
      add_generation_prompt: true,
    });
    expect(text).toBe(
      '<|im_start|>user\n<start_of_image>What is this?<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n' +
        '<|im_start|>user\nAnd <start_of_image><|im_end|>\n<|im_start|>assistant\n',
    );
    const tok = new Tokenizer(tj, tc);
    const expanded = `\n\n<start_of_image>${'<image_soft_token>'.repeat(4)}<end_of_image>\n\n`;
    const ids = tok.encode(expanded).ids;
    expect(ids.filter((i) => i >= 2051)).toEqual([2051, 2053, 2053, 2053, 2053, 2052]);
    expect(tok.decode(tok.encode(text).ids)).toBe(text);
  });

  it('refuses shapes Gemma 3 cannot have, and quantized layouts', async () => {
    const v = resolvePreset('test-gemma3-vl').vision as Gemma3VisionShape;
    const with_ = (o: Partial<Gemma3VisionShape>) => () => resolvePreset('test-gemma3-vl', { vision: { ...v, ...o } });
    expect(with_({ mmTokensPerImage: 3 })).toThrow(/mmTokensPerImage \(3\) must be a square/);
    expect(with_({ mmTokensPerImage: 9 })).toThrow(/4 x 4 patches/);
    expect(with_({ imageSize: 50 })).toThrow(/imageSize \(50\) must be a multiple of patchSize/);
    expect(with_({ numHeads: 3 })).toThrow(/multiple of numHeads/);
    expect(with_({ layerNormEps: 0 })).toThrow(/layerNormEps/);
    expect(with_({ mmTokensPerImage: 16 })()).toBeTruthy();
    expect(() => resolvePreset('test-gemma3-vl', { tokenizer: 'chatml' })).toThrow(/gemma3-vl tokenizer/);
    expect(() => resolvePreset('test-gemma3-vl', { architecture: 'Gemma3ForCausalLM' })).toThrow(/same layout/);
    await expect(makeModel({ preset: 'test-gemma3-vl', out: freshDir('gemma-q'), quantize: { layout: 'awq' } })).rejects.toThrow(/float dtypes only/);
  });

  it('runs in the float64 reference with an image its own preprocessor_config.json prepares', async () => {
    const dir = freshDir('gemma-reference');
    await makeModel({ preset: 'test-gemma3-vl', out: dir });
    const pre = gemma3PreprocessorConfig(readJson(join(dir, 'preprocessor_config.json')) as Record<string, unknown>);
    const rgb = Uint8Array.from({ length: 90 * 60 * 3 }, (_, i) => (i * 37) % 256);
    const ref = loadGemma3VlReference(dir);
    const { boiTokenId: boi, eoiTokenId: eoi, imageTokenId: img } = ref;
    const prompt = [2049, 5, 17, boi, img, img, img, img, eoi, 42];
    const logits = new Gemma3VlSession(ref).prefill(prompt, [{ pixelValues: gemma3Pixels(rgb, 90, 60, pre) }]);
    expect(logits).toHaveLength(prompt.length);
    expect(logits.at(-1)!.length).toBe(2054);
    expect(logits.at(-1)!.every(Number.isFinite)).toBe(true);
    const other = new Gemma3VlSession(ref).prefill(prompt, [{ pixelValues: gemma3Pixels(rgb.map((x) => 255 - x), 90, 60, pre) }]);
    expect(other[3]).toEqual(logits[3]);
    expect(Math.max(...other.at(-1)!.map((x, i) => Math.abs(x - logits.at(-1)![i]!)))).toBeGreaterThan(1e-3);
  });
});
