// The TypeScript facade end to end on the real native engine: tokenizer, chat template,
// batching of concurrent requests, stops, limits, errors, and the CLI.
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { makeModel } from '../models/make-model.js';
import { Engine, SluiceError } from '../src/index.js';
import { loadReferenceModel, referenceGreedy } from './reference/reference-model.js';

const run = promisify(execFile);
const CLI = join(import.meta.dirname, '..', 'dist', 'src', 'cli.js');

let root: string;
let tinyDir: string;
let engine: Engine;

beforeAll(async () => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-facade-'));
  tinyDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: tinyDir, seed: 3 });
  engine = await Engine.load({ model: tinyDir, backend: 'cpu', kvCacheBytes: 32 << 20, maxBatchedTokens: 256 });
});
afterAll(async () => {
  await engine?.dispose();
  rmSync(root, { recursive: true, force: true });
});

describe('Engine', () => {
  it('generates greedily what the float64 reference generates, from text through the tokenizer', async () => {
    const out = await engine.generate({ prompt: 'The river runs', maxTokens: 32, temperature: 0 });
    const ref = loadReferenceModel(tinyDir);
    const want = referenceGreedy(ref, out.promptTokenIds, out.tokenIds.length);
    expect(out.tokenIds).toEqual(want);
    expect(out.promptTokenIds).toEqual(engine.tokenizer.encode('The river runs'));
    expect(out.usage).toMatchObject({ promptTokens: out.promptTokenIds.length, completionTokens: out.tokenIds.length });
    expect(['stop', 'length']).toContain(out.finishReason);
  });

  it('batches 16 concurrent requests without changing any of their outputs', async () => {
    const prompts = Array.from({ length: 16 }, (_, i) => `request number ${i}: tell me about ${'rivers '.repeat(i % 5)}`);
    const solo = [];
    for (const prompt of prompts.slice(0, 4)) solo.push(await engine.generate({ prompt, maxTokens: 24, temperature: 0 }));
    const together = await Promise.all(prompts.map((prompt) => engine.generate({ prompt, maxTokens: 24, temperature: 0 })));
    for (let i = 0; i < solo.length; i++) {
      expect(together[i]!.tokenIds).toEqual(solo[i]!.tokenIds);
      expect(together[i]!.text).toEqual(solo[i]!.text);
    }
  });

  it('renders the chat template and stops on eos or max tokens', async () => {
    const out = await engine.generate({
      messages: [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'Hello there' },
      ],
      maxTokens: 5,
      temperature: 0,
    });
    const rendered = engine.tokenizer.decode(out.promptTokenIds, { skipSpecialTokens: false });
    expect(rendered).toContain('<|im_start|>user\nHello there<|im_end|>');
    expect(rendered.endsWith('<|im_start|>assistant\n')).toBe(true);
    expect(out.tokenIds.length).toBeLessThanOrEqual(5);
    if (out.tokenIds.length < 5) expect(out.finishReason).toBe('stop');
    else expect(out.finishReason).toBe('length');
  });

  it('cuts the text before a stop string', async () => {
    const full = await engine.generate({ prompt: 'Once upon a time', maxTokens: 40, temperature: 0 });
    const stop = full.text.slice(8, 11);
    expect(stop.length).toBe(3);
    const cut = await engine.generate({ prompt: 'Once upon a time', maxTokens: 40, temperature: 0, stop: [stop] });
    expect(cut.finishReason).toBe('stop');
    expect(cut.text).toBe(full.text.slice(0, full.text.indexOf(stop)));
    expect(cut.stopSequence).toBe(stop);
    expect(full.stopSequence).toBeUndefined();
  });

  it('repeats seeded samples and reports logprobs', async () => {
    const req = { prompt: 'Seeds', maxTokens: 16, temperature: 0.9, topP: 0.95, topK: 50, seed: 42, logprobs: 3 };
    const a = await engine.generate(req);
    const b = await engine.generate(req);
    expect(b.tokenIds).toEqual(a.tokenIds);
    expect(a.logprobs).toHaveLength(a.tokenIds.length);
    for (const lp of a.logprobs!) {
      expect(lp.logprob).toBeLessThanOrEqual(0);
      expect(lp.top).toHaveLength(3);
      expect(lp.top[0]!.logprob).toBeGreaterThanOrEqual(lp.top[2]!.logprob);
    }
  });

  it('refuses a prompt plus max tokens beyond the context length with a clear error', async () => {
    const err = await engine.generate({ prompt: 'hi', maxTokens: 100_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SluiceError);
    expect((err as SluiceError).code).toBe('context_length_exceeded');
    expect((err as SluiceError).message).toMatch(/2048/);
  });
});

describe('loading errors', () => {
  it('names the missing file', async () => {
    const dir = join(root, 'empty');
    mkdirSync(dir, { recursive: true });
    const err = await Engine.load({ model: dir, backend: 'cpu' }).catch((e: unknown) => e);
    expect((err as SluiceError).code).toBe('model_file_missing');
    expect((err as Error).message).toMatch(/config\.json/);
  });

  it('refuses an unknown CUDA GEMM choice, and a CPU engine loads with any valid one', async () => {
    const err = await Engine.load({ model: tinyDir, backend: 'cpu', cudaGemm: 'fast' as never }).catch((e: unknown) => e);
    expect((err as SluiceError).code).toBe('invalid_argument');
    expect((err as SluiceError).message).toMatch(/cudaGemm.*'native', 'cublaslt' or 'auto'.*fast/);
    const cpu = await Engine.load({ model: tinyDir, backend: 'cpu', cudaGemm: 'cublaslt', kvCacheBytes: 8 << 20 });
    await cpu.dispose();
  });

  it('refuses unknown choices of the flagged CUDA kernels (attention, sampler), naming the field', async () => {
    const attn = await Engine.load({ model: tinyDir, backend: 'cpu', cudaAttention: 'fa3' as never }).catch((e: unknown) => e);
    expect((attn as SluiceError).code).toBe('invalid_argument');
    expect((attn as SluiceError).param).toBe('cudaAttention');
    expect((attn as SluiceError).message).toMatch(/cudaAttention must be 'paged' or 'flash', got fa3/);
    const sampler = await Engine.load({ model: tinyDir, backend: 'cpu', cudaSampler: 'fast' as never }).catch((e: unknown) => e);
    expect((sampler as SluiceError).param).toBe('cudaSampler');
    const cpu = await Engine.load({ model: tinyDir, backend: 'cpu', cudaAttention: 'flash', cudaSampler: 'wide', kvCacheBytes: 8 << 20 });
    await cpu.dispose();
  });

  it('refuses int8 quantization on CUDA (CPU only), and a CPU engine serves it with q8_0 weights', async () => {
    for (const backend of ['cuda', 'onnx'] as const) {
      const err = await Engine.load({ model: tinyDir, backend, quantization: 'int8' }).catch((e: unknown) => e);
      expect((err as SluiceError).code).toBe('invalid_argument');
      expect((err as SluiceError).message).toMatch(/quantization 'int8' is supported by the cpu backend only/);
    }
    const bad = await Engine.load({ model: tinyDir, backend: 'cpu', quantization: 'int4' as never }).catch((e: unknown) => e);
    expect((bad as SluiceError).code).toBe('invalid_argument');
    const cpu = await Engine.load({ model: tinyDir, backend: 'auto', quantization: 'int8', kvCacheBytes: 8 << 20 });
    expect(cpu.info.backend).toBe('cpu');
    expect(cpu.info.weightDtype).toBe('q8_0');
    await cpu.dispose();
  });

  it('names the supported architectures for an unsupported one', async () => {
    const dir = join(root, 'gpt2');
    await makeModel({ preset: 'test-llama', out: dir, weights: false });
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ architectures: ['GPT2LMHeadModel'], model_type: 'gpt2' }));
    const err = await Engine.load({ model: dir, backend: 'cpu' }).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/Qwen3ForCausalLM/);
  });
});

describe('sluice generate (CLI)', () => {
  it('prints one JSON object with tokens, finish reason and logprobs', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'generate', '--model', tinyDir, '--prompt', 'Hello', '--max-tokens', '6',
      '--json', '--logprobs', '2']);
    const out = JSON.parse(stdout);
    expect(Object.keys(out)).toEqual(expect.arrayContaining(['text', 'token_ids', 'prompt_token_ids', 'finish_reason', 'logprobs']));
    expect(out.logprobs).toHaveLength(out.token_ids.length);
    expect(out.logprobs[0].top_logprobs).toHaveLength(2);
    expect(out.logprobs[0]).toHaveProperty('token_id');
  });

  it('makes the tiny demo model on first use when no --model is given', async () => {
    const home = join(root, 'home');
    const { stdout, stderr } = await run(process.execPath, [CLI, 'generate', '--prompt', 'Hi', '--max-tokens', '4', '--json'],
      { env: { ...process.env, SLUICE_HOME: home } });
    expect(stderr).toMatch(/tiny/);
    expect(JSON.parse(stdout).prompt_token_ids.length).toBeGreaterThan(0);
  });

  it('exits 1 with a message and no stack trace on a bad flag value', async () => {
    const err = await run(process.execPath, [CLI, 'generate', '--model', tinyDir, '--prompt', 'x', '--temperature', 'hot'])
      .catch((e: { code: number; stderr: string }) => e);
    expect((err as { code: number }).code).toBe(1);
    expect((err as { stderr: string }).stderr).toMatch(/temperature/);
    expect((err as { stderr: string }).stderr).not.toMatch(/at .*\.js:\d+/);
    const gemm = await run(process.execPath, [CLI, 'generate', '--model', tinyDir, '--prompt', 'x', '--cuda-gemm', 'fast'])
      .catch((e: { code: number; stderr: string }) => e);
    expect((gemm as { code: number }).code).toBe(1);
    expect((gemm as { stderr: string }).stderr).toMatch(/--cuda-gemm.*native/);
  });
});

describe('batch limits per backend', () => {
  it('sizes steps for the backend: the CPU as before, hundreds of sequences and thousands of tokens on a GPU', async () => {
    const { batchLimits } = await import('../src/engine/engine.js');
    expect(batchLimits('cpu')).toEqual({ maxNumSeqs: 64, maxBatchedTokens: 512 });
    expect(batchLimits('cuda')).toEqual({ maxNumSeqs: 256, maxBatchedTokens: 8192 });
    // The caller's limits win; a token budget below the sequence limit would starve decodes.
    expect(batchLimits('cuda', { maxNumSeqs: 16, maxBatchedTokens: 64 })).toEqual({ maxNumSeqs: 16, maxBatchedTokens: 64 });
    expect(batchLimits('cpu', { maxNumSeqs: 1024 })).toEqual({ maxNumSeqs: 1024, maxBatchedTokens: 1024 });
  });
});
