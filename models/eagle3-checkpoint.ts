// A randomly initialised EAGLE-3 speculative-decoding head for a target checkpoint, in the layout
// the published heads have and vLLM / SGLang load (LlamaForCausalLMEagle3): one Llama decoder layer
// ("midlayer") whose attention reads [embedding, hidden] (2H wide), fed by `fc`, which projects the
// target's three auxiliary hidden states (3H) to H; its own final norm and an lm_head over a smaller
// draft vocabulary, mapped to target ids by d2t (target = draft + d2t[draft]) and marked in the
// target vocabulary by t2d. No embed_tokens: the head uses the target's.
//
// Only config.json and model.safetensors are written (the tokenizer is the target's). Values are
// drawn as the model maker draws them (weights.ts: per (seed, tensor name, chunk)), chunk by chunk,
// so a head for real shapes is written with a few MB of memory.

import { closeSync, existsSync, openSync, readFileSync, readdirSync, renameSync, unlinkSync, writeSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

import type { Dtype } from './presets.js';
import { numel, safetensorsHeader, type TensorData, tensorDataBytes, type TensorSpec } from './safetensors-writer.js';
import { CHUNK_ELEMS, chunkBytes, chunkSeed, fillChunk, fmix32, hashString } from './weights.js';

export interface Eagle3HeadOptions {
  /** Dtype of the float tensors (d2t is I64, t2d BOOL whatever this is). Default BF16. */
  dtype?: 'F32' | 'BF16';
  /** Weight and draft-vocabulary seed (default 1). Same seed, same bytes. */
  seed?: number;
  /** The midlayer's MLP width; default the target's intermediate_size. */
  intermediateSize?: number;
  /** Attention shape of the midlayer; default the target's (head_dim: hidden_size / heads where it has none). */
  numHeads?: number;
  numKvHeads?: number;
  headDim?: number;
  /** Rows of lm_head: default draftTokens.length if given, else min(vocab_size, 32000). In [1, vocab_size]. */
  draftVocabSize?: number;
  /** The target ids of the draft vocabulary (distinct, in [0, vocab_size); sorted here). Default: a
   * seeded random subset holding ids 0 .. min(draftVocabSize, 256) - 1. */
  draftTokens?: number[];
  /** The target layers whose hidden states feed fc (3 ints in [0, layers), distinct where L >= 3). Default
   * [2, floor(L / 2), L - 3] for L >= 7 layers, else [0, floor(L / 2), L - 1] (see defaultAuxLayers). */
  auxLayers?: number[];
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const isPositiveInt = (v: unknown): v is number => Number.isInteger(v) && (v as number) > 0;

/** The target's text-model fields: its text_config's where it nests one, else the top level's. */
function textFields(config: Json): Json {
  const nested = config['text_config'];
  return isObject(nested) ? { ...config, ...nested } : config;
}

function requireInt(text: Json, key: string): number {
  const v = text[key];
  if (!isPositiveInt(v)) throw new Error(`eagle3 head: target config has no positive integer ${key} (got ${JSON.stringify(v)})`);
  return v;
}

function optionInt(name: string, v: number | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  if (!isPositiveInt(v)) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}

/**
 * The default aux layers of a target with `layers` decoder layers: vLLM's [2, floor(L / 2), L - 3]
 * where those are distinct (L >= 7; at L = 6 the last two coincide), else the first, middle and last
 * layer [0, floor(L / 2), L - 1] (not distinct below 3 layers).
 */
export function defaultAuxLayers(layers: number): number[] {
  return layers >= 7 ? [2, Math.floor(layers / 2), layers - 3] : [0, Math.floor(layers / 2), layers - 1];
}

/** The draft vocabulary: `count` distinct target ids, ascending, ids 0 .. min(count, 256) - 1 among them. */
function randomDraftTokens(vocab: number, count: number, seed: number): number[] {
  const base = Math.min(count, 256);
  const pool = new Int32Array(vocab - base);
  for (let i = 0; i < pool.length; i++) pool[i] = base + i;
  let state = hashString('eagle3.draft_vocabulary', seed);
  const below = (m: number) => {
    state = (state + 0x9e3779b9) >>> 0;
    return Math.floor((fmix32(state) / 4294967296) * m);
  };
  // Partial Fisher-Yates: the first count - base entries of the pool are a uniform random choice.
  const picks = count - base;
  for (let i = 0; i < picks; i++) {
    const j = i + below(pool.length - i);
    const t = pool[i]!;
    pool[i] = pool[j]!;
    pool[j] = t;
  }
  const out = Array.from({ length: base }, (_, i) => i);
  for (let i = 0; i < picks; i++) out.push(pool[i]!);
  return out.sort((a, b) => a - b);
}

function checkDraftTokens(tokens: unknown, vocab: number, count: number | undefined): number[] {
  if (!Array.isArray(tokens)) throw new RangeError('draftTokens must be an array of target ids');
  if (count !== undefined && tokens.length !== count) {
    throw new RangeError(`draftTokens has ${tokens.length} ids, draftVocabSize is ${count}`);
  }
  const seen = new Uint8Array(vocab);
  for (const t of tokens) {
    if (!Number.isInteger(t) || t < 0 || t >= vocab) throw new RangeError(`draftTokens: ${t} is not a target id in [0, ${vocab})`);
    if (seen[t]) throw new RangeError(`draftTokens: ${t} appears twice`);
    seen[t] = 1;
  }
  return [...(tokens as number[])].sort((a, b) => a - b);
}

/** Removes what would shadow or contradict the new model.safetensors (shards and their index). */
function removeStaleWeights(outDir: string): void {
  for (const f of readdirSync(outDir)) {
    if (/^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$/.test(f)) unlinkSync(join(outDir, f));
  }
}

/** Writes the head for the checkpoint in `targetDir` into `outDir` (created; config.json and model.safetensors replaced). */
export function writeEagle3Head(targetDir: string, outDir: string, opts: Eagle3HeadOptions = {}): void {
  const configPath = join(targetDir, 'config.json');
  if (!existsSync(configPath)) throw new Error(`eagle3 head: ${configPath} not found`);
  const target = JSON.parse(readFileSync(configPath, 'utf8')) as unknown;
  if (!isObject(target)) throw new Error(`eagle3 head: ${configPath} is not a JSON object`);
  const text = textFields(target);

  const hidden = requireInt(text, 'hidden_size');
  const layers = requireInt(text, 'num_hidden_layers');
  const vocab = requireInt(text, 'vocab_size');
  const targetHeads = requireInt(text, 'num_attention_heads');
  const targetKv = isPositiveInt(text['num_key_value_heads']) ? text['num_key_value_heads'] : targetHeads;
  const targetHeadDim = isPositiveInt(text['head_dim']) ? text['head_dim'] : Math.floor(hidden / targetHeads);

  const dtypeName = opts.dtype ?? 'BF16';
  if (dtypeName !== 'F32' && dtypeName !== 'BF16') throw new RangeError(`dtype must be 'F32' or 'BF16', got ${String(dtypeName)}`);
  const dtype: Dtype = dtypeName === 'F32' ? 'f32' : 'bf16';
  const seedOpt = opts.seed ?? 1;
  if (!Number.isInteger(seedOpt)) throw new RangeError(`seed must be an integer, got ${seedOpt}`);
  const seed = seedOpt >>> 0;

  if (opts.intermediateSize !== undefined && !(Number.isInteger(opts.intermediateSize) && opts.intermediateSize > 0)) {
    throw new RangeError(`intermediateSize must be an integer > 0, got ${opts.intermediateSize}`);
  }
  const inter = opts.intermediateSize ?? requireInt(text, 'intermediate_size');
  const heads = optionInt('numHeads', opts.numHeads, targetHeads);
  const kvHeads = optionInt('numKvHeads', opts.numKvHeads, targetKv);
  const headDim = optionInt('headDim', opts.headDim, targetHeadDim);
  if (heads % kvHeads !== 0) throw new RangeError(`numHeads (${heads}) must be a multiple of numKvHeads (${kvHeads})`);

  // Three distinct layers where the target has them; the project's 2-layer test models repeat one.
  const aux = opts.auxLayers ?? defaultAuxLayers(layers);
  if (!Array.isArray(aux) || aux.length !== 3 || !aux.every((l) => Number.isInteger(l) && l >= 0 && l < layers) ||
    new Set(aux).size !== Math.min(3, layers)) {
    throw new RangeError(`auxLayers must be 3 distinct integers in [0, ${layers}), got ${JSON.stringify(aux)}`);
  }

  const dvOpt = opts.draftVocabSize;
  if (dvOpt !== undefined && !(Number.isInteger(dvOpt) && dvOpt >= 1 && dvOpt <= vocab)) {
    throw new RangeError(`draftVocabSize must be an integer in [1, ${vocab}], got ${dvOpt}`);
  }
  const draft = opts.draftTokens !== undefined
    ? checkDraftTokens(opts.draftTokens, vocab, dvOpt)
    : randomDraftTokens(vocab, dvOpt ?? Math.min(vocab, 32000), seed);
  const dv = draft.length;
  if (dv < 1) throw new RangeError(`draftVocabSize must be an integer in [1, ${vocab}], got 0`);

  const d2t = draft.map((t, i) => t - i);
  const t2d = new Array<number>(vocab).fill(0);
  for (const t of draft) t2d[t] = 1;

  const lin = (name: string, out: number, inp: number): TensorSpec => ({ name, shape: [out, inp], init: { mean: 0, std: 1 / Math.sqrt(inp) } });
  const norm = (name: string): TensorSpec => ({ name, shape: [hidden], init: { mean: 1, std: 0.1 } });
  const q = heads * headDim;
  const kv = kvHeads * headDim;
  const random: TensorSpec[] = [
    lin('fc.weight', hidden, 3 * hidden),
    norm('midlayer.hidden_norm.weight'),
    norm('midlayer.input_layernorm.weight'),
    norm('midlayer.post_attention_layernorm.weight'),
    lin('midlayer.self_attn.q_proj.weight', q, 2 * hidden),
    lin('midlayer.self_attn.k_proj.weight', kv, 2 * hidden),
    lin('midlayer.self_attn.v_proj.weight', kv, 2 * hidden),
    lin('midlayer.self_attn.o_proj.weight', hidden, q),
    lin('midlayer.mlp.gate_proj.weight', inter, hidden),
    lin('midlayer.mlp.up_proj.weight', inter, hidden),
    lin('midlayer.mlp.down_proj.weight', hidden, inter),
    norm('norm.weight'),
    lin('lm_head.weight', dv, hidden),
  ];
  const data: TensorData[] = [
    { name: 'd2t', shape: [dv], data: d2t, stored: 'I64' },
    { name: 't2d', shape: [vocab], data: t2d, stored: 'BOOL' },
  ];

  const rope = text['rope_scaling'];
  const config: Json = {
    architectures: ['LlamaForCausalLMEagle3'],
    draft_vocab_size: dv,
    eagle_config: { eagle_aux_hidden_state_layer_ids: [...aux] },
    head_dim: headDim,
    hidden_act: 'silu',
    hidden_size: hidden,
    intermediate_size: inter,
    // LlamaConfig's defaults where the target has none.
    max_position_embeddings: typeof text['max_position_embeddings'] === 'number' ? text['max_position_embeddings'] : 2048,
    model_type: 'llama',
    num_attention_heads: heads,
    num_hidden_layers: 1,
    num_key_value_heads: kvHeads,
    rms_norm_eps: typeof text['rms_norm_eps'] === 'number' ? text['rms_norm_eps'] : 1e-6,
    ...(isObject(rope) && { rope_scaling: structuredClone(rope) }),
    rope_theta: typeof text['rope_theta'] === 'number' ? text['rope_theta'] : 10000,
    tie_word_embeddings: false,
    torch_dtype: dtype === 'f32' ? 'float32' : 'bfloat16',
    vocab_size: vocab,
  };

  mkdirSync(outDir, { recursive: true });
  removeStaleWeights(outDir);
  const configOut = join(outDir, 'config.json');
  if (existsSync(configOut)) unlinkSync(configOut);  // config.json last: a directory with one is complete
  writeTensors(join(outDir, 'model.safetensors'), random, data, dtype, seed);
  const tmp = `${configOut}.tmp-${process.pid}`;
  writeFileSync(tmp, JSON.stringify(config, null, 2) + '\n');
  renameSync(tmp, configOut);
}

/** One safetensors file: the random tensors (drawn chunk by chunk as the model maker draws them), then the explicit ones. */
function writeTensors(path: string, random: TensorSpec[], data: TensorData[], dtype: Dtype, seed: number): void {
  const encoded = data.map((t) => tensorDataBytes(t, dtype));  // checked before anything is written
  const tmp = `${path}.tmp-${process.pid}`;
  const fd = openSync(tmp, 'w');
  try {
    const write = (bytes: Uint8Array) => {
      for (let done = 0; done < bytes.length;) done += writeSync(fd, bytes, done, bytes.length - done);
    };
    write(safetensorsHeader([...random, ...data], dtype));
    const buf = new Float32Array(Math.min(CHUNK_ELEMS, Math.max(1, ...random.map((t) => numel(t.shape)))));
    for (const t of random) {
      const total = numel(t.shape);
      for (let c = 0, done = 0; done < total; c++, done += CHUNK_ELEMS) {
        const n = Math.min(CHUNK_ELEMS, total - done);
        fillChunk(buf, n, chunkSeed(seed, t.name, c), t.init);
        write(chunkBytes(buf, n, dtype));
      }
    }
    for (const bytes of encoded) write(bytes);
  } catch (e) {
    closeSync(fd);
    try { unlinkSync(tmp); } catch { /* already gone */ }
    throw e;
  }
  closeSync(fd);
  renameSync(tmp, path);
}
