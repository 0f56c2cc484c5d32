// The one architecture table of the TypeScript side (src/engine/architectures.ts) against its C++
// mirror (kArchitectures in native/src/model/architectures.cpp), and what the table drives: the
// model maker's tensors and config.json, and the checkpoint reader's sliding-window rule.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ARCHITECTURES, SUPPORTED_ARCHITECTURES, architectureSpec, specOfModelType, usesSlidingWindow } from '../src/engine/architectures.js';
import { checkpointContextLength } from '../src/engine/checkpoint-config.js';
import { buildConfig, tensorSpecs } from '../models/make-model.js';
import { PRESETS } from '../models/presets.js';

/** The C++ table's rows (native/src/model/architectures.cpp). */
function nativeTable(): { architecture: string; modelType: string; qkvBias: boolean; qkNorm: boolean; mlp: string; sandwichNorms: boolean }[] {
  const source = readFileSync(resolve(import.meta.dirname, '..', 'native', 'src', 'model', 'architectures.cpp'), 'utf8');
  const table = /kArchitectures\[\]\s*=\s*\{([\s\S]*?)\n\};/.exec(source);
  if (!table) throw new Error('kArchitectures not found in architectures.cpp');
  const bool = '(true|false)';
  const row = new RegExp(`\\{"(\\w+)",\\s*"(\\w+)",\\s*${bool},\\s*${bool},\\s*MlpLayout::(\\w+),\\s*${bool},\\s*${bool},`, 'g');
  return [...table[1]!.matchAll(row)].map((m) => ({
    architecture: m[1]!, modelType: m[2]!, qkvBias: m[3] === 'true', qkNorm: m[4] === 'true',
    mlp: m[5] === 'kDense' ? 'dense' : 'moe', sandwichNorms: m[7] === 'true',
  }));
}

describe('the architecture table', () => {
  it('lists the same families as the native reader, with the same model_type and optional pieces', () => {
    const native = nativeTable();
    expect(native.length).toBeGreaterThan(0);
    expect(native.map((r) => r.architecture)).toEqual(SUPPORTED_ARCHITECTURES);
    for (const row of native) {
      const spec = ARCHITECTURES[row.architecture as keyof typeof ARCHITECTURES];
      expect({ modelType: spec.modelType, qkvBias: spec.qkvBias, qkNorm: spec.qkNorm, mlp: spec.mlp, sandwichNorms: spec.sandwichNorms },
        row.architecture)
        .toEqual({ modelType: row.modelType, qkvBias: row.qkvBias, qkNorm: row.qkNorm, mlp: row.mlp, sandwichNorms: row.sandwichNorms });
    }
  });

  it('refuses names it does not list, prototype keys included', () => {
    expect(architectureSpec('GemmaForCausalLM')).toBeUndefined();
    expect(architectureSpec('constructor')).toBeUndefined();
    expect(architectureSpec(undefined)).toBeUndefined();
    expect(specOfModelType('qwen3')).toBe(ARCHITECTURES.Qwen3ForCausalLM);
  });

  it('drives the model maker: biases and q/k norms where the table says, and the family\'s config fields', () => {
    for (const preset of Object.values(PRESETS)) {
      const spec = ARCHITECTURES[preset.architecture];
      const names = tensorSpecs(preset).map((t) => t.name);
      const config = buildConfig(preset, 'bf16', 1, [2]);
      const text = (spec.textConfig ? config[spec.textConfig] : config) as Record<string, unknown>;
      // gpt-oss turns every attention bias on through attention_bias, as the dense families may.
      expect(names.includes(`${spec.prefix}layers.0.self_attn.q_proj.bias`), preset.architecture)
        .toBe(spec.qkvBias || text['attention_bias'] === true);
      expect(names.includes(`${spec.prefix}layers.0.self_attn.q_norm.weight`), preset.architecture).toBe(spec.qkNorm);
      expect(config['model_type']).toBe(spec.modelType);
      expect(config).toMatchObject(spec.configFields(preset));
    }
  });

  it('reads sliding windows the way each family spells them', async () => {
    const dir = mkdtempSync(join(os.tmpdir(), 'sluice-arch-'));
    try {
      const contextOf = async (config: Record<string, unknown>) => {
        writeFileSync(join(dir, 'config.json'), JSON.stringify({ max_position_embeddings: 8192, ...config }));
        return checkpointContextLength(dir);
      };
      // Mistral: a set sliding_window slides; Qwen: only with use_sliding_window; Llama never.
      expect(await contextOf({ architectures: ['MistralForCausalLM'], sliding_window: 4096 })).toBe(4096);
      expect(await contextOf({ architectures: ['Qwen2ForCausalLM'], sliding_window: 4096 })).toBe(8192);
      expect(await contextOf({ architectures: ['Qwen2ForCausalLM'], sliding_window: 4096, use_sliding_window: true })).toBe(4096);
      expect(await contextOf({ architectures: ['LlamaForCausalLM'], sliding_window: 4096 })).toBe(8192);
      expect(usesSlidingWindow(ARCHITECTURES.MistralForCausalLM, { sliding_window: null })).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
