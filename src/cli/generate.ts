// `sluice generate`: one request through the engine, printed as text (streamed) or JSON.

import { SluiceError } from '../errors.js';
import { Engine } from '../engine/engine.js';
import type { GenerateRequest, GenerateResult, TokenLogprob } from '../engine/request.js';
import { choiceFlag, commandFlags, intFlag, numberFlag, requiredFlag, speculativeFlags, u64Flag } from './args.js';
import { ensureDemoModel } from './demo-model.js';
import { stderrProgress } from '../progress.js';

export const GENERATE_HELP = `usage: sluice generate [--model DIR] --prompt TEXT [options]

Generates text with a model directory (Hugging Face layout). Without --model it uses the tiny
demo model in $SLUICE_HOME/models/tiny (default ~/.cache/sluice), making it on first use.

  --model DIR          model directory
  --prompt TEXT        the prompt (required)
  --chat               send the prompt as a user message through the model's chat template
  --max-tokens N       generated-token limit (default 256, or less to fit the context)
  --temperature T      0..2 (default 0: greedy)
  --top-p P            (0, 1] (default 1: off)
  --top-k K            integer >= 0 (default 0: off)
  --min-p P            [0, 1]: drop tokens less likely than P times the most likely (default 0: off)
  --seed S             sampling seed, 0..2^64-1 (default: random)
  --logprobs K         with --json: the top K (0..20) alternatives of every token
  --stop TEXT          stop before TEXT (repeatable)
  --json               print one JSON object instead of streaming the text
  --backend B          cpu | cuda | onnx | auto (default auto: cuda when a GPU is usable, else cpu;
                       the last line says which ran)
  --gpu-memory-utilization F
                       CUDA: fraction of GPU memory for weights, activations and KV (default 0.9)
  --cuda-gemm G        auto (default: cuBLASLt where the host has it) | native | cublaslt: who runs CUDA GEMMs of over 8 tokens
  --threads N          compute threads (default: all CPUs)
  --precision P        f32 | bf16: activations against bf16 weights (default f32)
  --quantization Q     none (default) | int8: quantize the matmul weights of a bf16/f16/f32
                       checkpoint at load into 8-bit blocks (Q8_0); CPU backend only |
                       fp8: into e4m3 with per-row scales, for FP8 GEMMs; CUDA backend only
  --kv-cache-dtype D   auto (default) | fp8: K/V stored as e4m3 with per-layer scales
  --speculative M      ngram (prompt lookup) | draft:DIR (a draft model with the target's
                       tokenizer) | eagle3:DIR (an EAGLE-3 head for this model): drafts
                       verified in each step (greedy output unchanged); CPU, or CUDA with
                       the block sampler (eagle3: CPU only)
  --num-speculative-tokens K
                       drafts a step verifies at most (1..16, default 4)
  --lora DIR           run the request with this LoRA adapter (PEFT layout: adapter_config.json,
                       adapter_model.safetensors) on the model; CPU or CUDA backend
`;

const DEFAULT_MAX_TOKENS = 256;

/** The flags generate accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const GENERATE_OPTIONS = {
  model: { type: 'string' },
  prompt: { type: 'string' },
  chat: { type: 'boolean' },
  'max-tokens': { type: 'string' },
  temperature: { type: 'string' },
  'top-p': { type: 'string' },
  'top-k': { type: 'string' },
  'min-p': { type: 'string' },
  seed: { type: 'string' },
  logprobs: { type: 'string' },
  stop: { type: 'string', multiple: true },
  json: { type: 'boolean' },
  backend: { type: 'string' },
  'gpu-memory-utilization': { type: 'string' },
  'cuda-gemm': { type: 'string' },
  threads: { type: 'string' },
  precision: { type: 'string' },
  quantization: { type: 'string' },
  'kv-cache-dtype': { type: 'string' },
  speculative: { type: 'string' },
  'num-speculative-tokens': { type: 'string' },
  lora: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runGenerate(args: string[]): Promise<void> {
  const values = commandFlags(args, GENERATE_OPTIONS, 'generate', GENERATE_HELP);
  if (values === undefined) return;
  const prompt = requiredFlag(values.prompt, 'prompt', 'generate');
  const maxTokens = intFlag(values['max-tokens'], 'max-tokens', 1);
  const request: GenerateRequest = {
    temperature: numberFlag(values.temperature, 'temperature', 0, 2) ?? 0,
    topP: numberFlag(values['top-p'], 'top-p', Number.MIN_VALUE, 1),
    topK: intFlag(values['top-k'], 'top-k', 0),
    minP: numberFlag(values['min-p'], 'min-p', 0, 1),
    seed: u64Flag(values.seed, 'seed'),
    logprobs: intFlag(values.logprobs, 'logprobs', 0, 20),
    stop: values.stop,
    ...(values.chat ? { messages: [{ role: 'user' as const, content: prompt }] } : { prompt }),
  };
  const backend = choiceFlag(values.backend, 'backend', ['cpu', 'cuda', 'onnx', 'auto'] as const);
  const threads = intFlag(values.threads, 'threads', 0);
  const matmulPrecision = choiceFlag(values.precision, 'precision', ['f32', 'bf16'] as const);
  const quantization = choiceFlag(values.quantization, 'quantization', ['none', 'int8', 'fp8'] as const);
  const kvCacheDtype = choiceFlag(values['kv-cache-dtype'], 'kv-cache-dtype', ['auto', 'fp8', 'fp8_e4m3'] as const);
  const cudaGemm = choiceFlag(values['cuda-gemm'], 'cuda-gemm', ['native', 'cublaslt', 'auto'] as const);
  const gpuMemoryUtilization = numberFlag(values['gpu-memory-utilization'], 'gpu-memory-utilization', Number.MIN_VALUE, 1);
  const speculative = speculativeFlags(values.speculative, values['num-speculative-tokens']);
  if (request.logprobs !== undefined && !values.json) {
    throw new SluiceError('invalid_argument', '--logprobs needs --json', { param: 'logprobs' });
  }

  const log = (message: string) => process.stderr.write(`${message}\n`);
  const model = values.model ?? await ensureDemoModel(log);
  const engine = await Engine.load({
    model, backend, threads, matmulPrecision, quantization, kvCacheDtype, gpuMemoryUtilization, cudaGemm, onMessage: (m) => log(`sluice: ${m}`),
    ...(speculative && { speculative }),
    ...(values.lora !== undefined && { loraAdapters: { lora: values.lora } }),
    onLoadProgress: stderrProgress('reading weights'),
  });
  if (values.lora !== undefined) request.adapter = 'lora';

  // Ctrl-C cancels the request (a second one kills the process as usual).
  const controller = new AbortController();
  request.signal = controller.signal;
  process.once('SIGINT', () => controller.abort());
  try {
    // Default: DEFAULT_MAX_TOKENS, or what is left of the context when that is less.
    const numPromptTokens = engine.promptTokenIds(request).length;
    request.maxTokens = maxTokens ?? Math.max(1, Math.min(DEFAULT_MAX_TOKENS, engine.info.contextLength - numPromptTokens));
    if (values.json) {
      process.stdout.write(JSON.stringify(toJson(await engine.generate(request)), null, 2) + '\n');
      return;
    }
    for await (const chunk of engine.stream(request)) {
      if (chunk.text) process.stdout.write(chunk.text);
      if (chunk.finishReason !== undefined) {
        process.stdout.write('\n');
        const t = chunk.timings!;
        log(`${chunk.usage!.completionTokens} tokens (${chunk.finishReason}), ` +
          `${t.tokensPerSecond.toFixed(1)} tokens/s, first token after ${(t.queuedMs + t.prefillMs).toFixed(0)} ms ` +
          `(${chunk.usage!.promptTokens} prompt tokens, ${engine.info.backend} ${engine.info.simd}` +
          `${engine.info.backend === 'cpu' ? `, ${engine.info.numThreads} thread${engine.info.numThreads === 1 ? '' : 's'}` : ''})`);
      }
    }
  } finally {
    await engine.dispose();
  }
}

/** The --json shape (snake_case, as the HTTP API spells it). */
function toJson(result: GenerateResult): Record<string, unknown> {
  const json: Record<string, unknown> = {
    text: result.text,
    token_ids: result.tokenIds,
    prompt_token_ids: result.promptTokenIds,
    finish_reason: result.finishReason,
    usage: { prompt_tokens: result.usage.promptTokens, completion_tokens: result.usage.completionTokens },
    timings: {
      queued_ms: result.timings.queuedMs, prefill_ms: result.timings.prefillMs,
      decode_ms: result.timings.decodeMs, tokens_per_second: result.timings.tokensPerSecond,
    },
  };
  if (result.logprobs) {
    json['logprobs'] = result.logprobs.map((lp: TokenLogprob) => ({
      token_id: lp.id,
      token: lp.token,
      logprob: lp.logprob,
      top_logprobs: lp.top.map((t) => ({ token_id: t.id, token: t.token, logprob: t.logprob })),
    }));
  }
  return json;
}
