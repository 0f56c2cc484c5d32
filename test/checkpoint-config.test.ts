// checkpointContextLength on the mixture-of-experts and Gemma 3 families, from config.json alone
// (test/load-progress.test.ts checks the dense families against the native loader).

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkpointContextLength } from '../src/engine/checkpoint-config.js';
import { ARCHITECTURES, textConfigOf, usesSlidingWindow, windowCapsContext } from '../src/engine/architectures.js';

const dir = mkdtempSync(join(os.tmpdir(), 'sluice-ckpt-config-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const contextOf = async (config: Record<string, unknown>) => {
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  return checkpointContextLength(dir);
};

describe('checkpointContextLength, new families', () => {
  it('Qwen3-MoE slides only with use_sliding_window, Mixtral whenever sliding_window is set (both capped)', async () => {
    const qwen = { architectures: ['Qwen3MoeForCausalLM'], model_type: 'qwen3_moe', max_position_embeddings: 40960 };
    expect(await contextOf({ ...qwen, sliding_window: null, use_sliding_window: false })).toBe(40960);
    expect(await contextOf({ ...qwen, sliding_window: 4096 })).toBe(40960);
    expect(await contextOf({ ...qwen, sliding_window: 4096, use_sliding_window: true })).toBe(4096);
    const mixtral = { architectures: ['MixtralForCausalLM'], model_type: 'mixtral', max_position_embeddings: 32768 };
    expect(await contextOf({ ...mixtral, sliding_window: null })).toBe(32768);
    expect(await contextOf({ ...mixtral, sliding_window: 4096 })).toBe(4096);
    expect(await contextOf({ ...mixtral, sliding_window: 4096, max_position_embeddings: undefined })).toBe(2048);
  });

  it('Gemma 3: the window never caps the context; Gemma3TextConfig\'s 131072 when max_position_embeddings is absent', async () => {
    const text = { model_type: 'gemma3_text', sliding_window: 512, sliding_window_pattern: 6, max_position_embeddings: 32768 };
    expect(await contextOf({ architectures: ['Gemma3ForCausalLM'], ...text })).toBe(32768);
    expect(await contextOf({ architectures: ['Gemma3ForCausalLM'], ...text, max_position_embeddings: undefined })).toBe(131072);
    expect(await contextOf({ model_type: 'gemma3_text', sliding_window: 512 })).toBe(131072);
  });

  it('Gemma3ForConditionalGeneration reads text_config, as published (most fields left to the defaults)', async () => {
    // gemma-3-4b-it's text_config, less its rope_scaling.
    const published = { hidden_size: 2560, intermediate_size: 10240, model_type: 'gemma3_text', num_hidden_layers: 34, sliding_window: 1024 };
    const top = { architectures: ['Gemma3ForConditionalGeneration'], model_type: 'gemma3', max_position_embeddings: 99 };
    expect(await contextOf({ ...top, text_config: published })).toBe(131072);
    expect(await contextOf({ ...top, text_config: { ...published, max_position_embeddings: 8192 } })).toBe(8192);
    expect(await contextOf({ model_type: 'gemma3', text_config: { ...published, max_position_embeddings: 8192 } })).toBe(8192);
    await expect(contextOf(top)).rejects.toThrow(/config\.json: field "text_config" must be an object/);
    await expect(contextOf({ ...top, text_config: { max_position_embeddings: -1 } }))
      .rejects.toThrow(/config\.json text_config: field "max_position_embeddings" must be a non-negative integer/);
  });
});

describe('the table\'s window and text-config helpers', () => {
  it('Gemma 3 has windowed layers unless every layer is global, and serves them as such', () => {
    const gemma = ARCHITECTURES.Gemma3ForCausalLM;
    expect(usesSlidingWindow(gemma, { sliding_window: 512 })).toBe(true);
    expect(usesSlidingWindow(gemma, { sliding_window_pattern: 1 })).toBe(false);
    expect(usesSlidingWindow(gemma, { layer_types: ['full_attention', 'full_attention'] })).toBe(false);
    expect(usesSlidingWindow(gemma, { layer_types: ['sliding_attention', 'full_attention'] })).toBe(true);
    expect(windowCapsContext(gemma, { sliding_window: 512 })).toBe(false);
    expect(windowCapsContext(ARCHITECTURES.MixtralForCausalLM, { sliding_window: 512 })).toBe(true);
    expect(windowCapsContext(ARCHITECTURES.Qwen3MoeForCausalLM, { sliding_window: 512 })).toBe(false);
  });

  it('textConfigOf: the nested object for multimodal families, the file for the others', () => {
    const text = { hidden_size: 8 };
    expect(textConfigOf(ARCHITECTURES.Gemma3ForConditionalGeneration, { text_config: text })).toBe(text);
    expect(textConfigOf(ARCHITECTURES.Gemma3ForConditionalGeneration, { text_config: [text] })).toBeUndefined();
    const flat = { hidden_size: 8 };
    expect(textConfigOf(ARCHITECTURES.Gemma3ForCausalLM, flat)).toBe(flat);
    expect(textConfigOf(undefined, flat)).toBe(flat);
  });
});
