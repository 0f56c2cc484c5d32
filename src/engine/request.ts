// The engine facade's request and result types, and the validation that turns a GenerateRequest
// into prompt tokens + native sampling parameters. Failures are SluiceError invalid_request (or
// context_length_exceeded) naming the field.

import type { PreparedImage } from '../vision/vision-model.js';
import { getRandomValues } from 'node:crypto';
import { SluiceError } from '../errors.js';
import type { ChatMessage, ChatTool } from '../text/chat-template.js';
import type { NativeSamplingParams } from '../native/native-types.js';
import { SCHEDULING_WINDOWS, type SchedulingWindow } from '../scheduler/window-policy.js';
import type { FinishReason } from '../text/stops.js';
import type { ResponseFormat } from '../structured/structured-outputs.js';

export interface GenerateRequest {
  /** Exactly one of prompt, messages, promptTokenIds. */
  prompt?: string;
  /** Rendered with the model's chat template (add_generation_prompt). */
  messages?: ChatMessage[];
  promptTokenIds?: number[];
  /**
   * Images of a vision-language model's prompt (Engine.vision.prepare), in prompt order: the k-th
   * image token the prompt holds (one per image as a chat template renders an image part, or a
   * run already expanded to the image's numTokens) stands for images[k].
   */
  images?: PreparedImage[];
  /** Generated-token limit, >= 1. Default: what is left of the context (and of the KV pool). */
  maxTokens?: number;
  /** 0..2; 0 = greedy. Default 1 (the OpenAI APIs' default; the CLI defaults to 0). */
  temperature?: number;
  /** (0, 1]; 1 = off (default). */
  topP?: number;
  /** Integer >= 0; 0 = off (default). */
  topK?: number;
  /**
   * vLLM's min_p, [0, 1]; 0 = off (default). After temperature, tokens whose probability is below
   * minP times the most likely token's are never drawn (before topK and topP). Library and CLI
   * only: the HTTP surfaces' fields are fixed by the spec.
   */
  minP?: number;
  /** Sampling seed, 0..2^64-1. Default: random. */
  seed?: number | bigint;
  /** Return the top N (0..20) alternatives per generated token; undefined = no logprobs. */
  logprobs?: number;
  /** Output is cut before the first of these (non-empty) strings. */
  stop?: string[];
  /**
   * Scheduling class: 'asap' runs before 'standard', which runs before 'flex' (flex only on
   * capacity the others leave; running lower windows are preempted to admit higher ones).
   * Default 'standard', as the HTTP API's default window, so that a library caller can still
   * put urgent work ahead of its ordinary work.
   */
  completionWindow?: SchedulingWindow;
  /**
   * Prompt cache key (1..MAX_PROMPT_CACHE_KEY_LENGTH characters). Requests that share a long
   * prefix should share a key: their cached prefix blocks are kept longer under KV pressure
   * (evicted only after every unkeyed cached block). The value itself is not interpreted here.
   */
  promptCacheKey?: string;
  /**
   * Who the request belongs to (an organization id, opaque, at most 256 characters). Its cached
   * prompt prefixes are reused only by requests of the same tenant, and each completion window is
   * shared fairly between tenants. Default: none (one shared scope, as a single-user library).
   */
  tenant?: string;
  /**
   * A LoRA adapter loaded with the engine (Engine.load loraAdapters, by name): the request runs on
   * the base model with that adapter. Default: the base model.
   */
  adapter?: string;
  /**
   * Structured outputs: every sampled token keeps the output a prefix of a JSON value the schema
   * accepts ('json_object': any JSON object), and the value's end ends the output (a cut by
   * maxTokens is finish reason 'length'). A schema the engine cannot enforce is refused
   * (invalid_request naming the keyword and its JSON pointer) before anything is generated.
   */
  responseFormat?: ResponseFormat;
  /**
   * Function tools the chat template shows the model (messages only), in OpenAI's Chat
   * Completions shape. How calls come back is the caller's to parse (see text/tool-calls.ts).
   */
  tools?: ChatTool[];
  /**
   * Thinking, for models whose template has it (messages only). false: off (the template's
   * enable_thinking=false). {budget}: on, and the think block is closed by force after `budget`
   * tokens of reasoning, so the answer always follows; a responseFormat then applies to the
   * answer after the block. Undefined: the template's default, no budget.
   */
  thinking?: false | { budget: number };
  signal?: AbortSignal;
}

/** The largest thinking budget (tokens). */
export const MAX_THINKING_BUDGET = 1 << 20;

export interface TopLogprob {
  id: number;
  token: string;
  logprob: number;
}

export interface TokenLogprob extends TopLogprob {
  /** The `logprobs` most likely tokens at this position, best first. */
  top: TopLogprob[];
}

export interface Usage {
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens served from the prefix cache (whole KV blocks), not computed; 0 without a hit. */
  cachedTokens: number;
}

/** Milliseconds. Time to first token = queuedMs + prefillMs. */
export interface Timings {
  /** Submission -> first scheduled step. */
  queuedMs: number;
  /** First scheduled step -> first generated token. */
  prefillMs: number;
  /** First generated token -> last. */
  decodeMs: number;
  /** Decode throughput: (completionTokens - 1) / decode seconds; 0 with one token. */
  tokensPerSecond: number;
}

export interface GenerateResult {
  text: string;
  /** Every generated token, including a final eos or the token that completed a stop string. */
  tokenIds: number[];
  promptTokenIds: number[];
  finishReason: FinishReason;
  /** The stop string that ended the generation (finishReason 'stop' because of it); absent otherwise. */
  stopSequence?: string;
  /** One entry per generated token when the request asked for logprobs. */
  logprobs?: TokenLogprob[];
  usage: Usage;
  timings: Timings;
}

/** One piece of a streamed generation. */
export interface GenerateChunk {
  /** New text; '' while text is held back (incomplete character, possible stop-string start). */
  text: string;
  /** Tokens generated since the previous chunk. */
  tokenIds: number[];
  logprobs?: TokenLogprob[];
  /** The last chunk carries finishReason, usage and timings. */
  finishReason?: FinishReason;
  /** On the last chunk: the stop string that ended the generation, if one did. */
  stopSequence?: string;
  usage?: Usage;
  timings?: Timings;
}

/**
 * The sampling fields of a request, defined once: the library's GenerateRequest holds them, the
 * service's GenerationRequest carries them whole from the surface to the engine, validateOptions
 * checks them, and the native SamplingParams (native-types.ts, mirrored by sluice::SamplingParams
 * in C++) is what they become.
 */
export type SamplingFields = Pick<GenerateRequest, 'temperature' | 'topP' | 'topK' | 'minP' | 'seed' | 'stop' | 'logprobs'>;

export const MAX_LOGPROBS = 20;
export const MAX_PROMPT_CACHE_KEY_LENGTH = 256;

/** Validated sampling and limits, before the prompt-dependent maxTokens default. */
export interface ValidatedOptions {
  sampling: NativeSamplingParams;
  /** undefined = the caller did not ask for logprobs. */
  logprobs: number | undefined;
  maxTokens: number | undefined;
  stopStrings: string[];
  completionWindow: SchedulingWindow;
  promptCacheKey: string | undefined;
}

export const DEFAULT_COMPLETION_WINDOW: SchedulingWindow = 'standard';

function invalid(param: string, message: string): SluiceError {
  return new SluiceError('invalid_request', `${param} ${message}`, { param });
}

function checkNumber(value: unknown, param: string, ok: (v: number) => boolean, range: string): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !Number.isFinite(value) || !ok(value)) {
    throw invalid(param, `must be ${range}, got ${JSON.stringify(value) ?? String(value)}`);
  }
  return value;
}

export function randomSeed(): bigint {
  return getRandomValues(new BigUint64Array(1))[0]!;
}

/** Checks the sampling fields of a request; throws invalid_request naming the first bad one. */
export function validateOptions(req: GenerateRequest): ValidatedOptions {
  if (req === null || typeof req !== 'object') throw new SluiceError('invalid_request', 'the request must be an object');
  const temperature = checkNumber(req.temperature, 'temperature', (v) => v >= 0 && v <= 2, 'a number in [0, 2]') ?? 1;
  const topP = checkNumber(req.topP, 'topP', (v) => v > 0 && v <= 1, 'a number in (0, 1]') ?? 1;
  const topK = checkNumber(req.topK, 'topK', (v) => Number.isInteger(v) && v >= 0, 'an integer >= 0') ?? 0;
  const minP = checkNumber(req.minP, 'minP', (v) => v >= 0 && v <= 1, 'a number in [0, 1]') ?? 0;
  const logprobs = checkNumber(req.logprobs, 'logprobs',
    (v) => Number.isInteger(v) && v >= 0 && v <= MAX_LOGPROBS, `an integer in [0, ${MAX_LOGPROBS}]`);
  const maxTokens = checkNumber(req.maxTokens, 'maxTokens', (v) => Number.isInteger(v) && v >= 1, 'an integer >= 1');

  let seed: bigint;
  if (req.seed === undefined) seed = randomSeed();
  else if (typeof req.seed === 'bigint' && req.seed >= 0n && req.seed < 2n ** 64n) seed = req.seed;
  else if (typeof req.seed === 'number' && Number.isSafeInteger(req.seed) && req.seed >= 0) seed = BigInt(req.seed);
  else throw invalid('seed', `must be an integer in [0, 2^64), got ${String(req.seed)}`);

  const stop = req.stop ?? [];
  if (!Array.isArray(stop) || stop.some((s) => typeof s !== 'string' || s.length === 0)) {
    throw invalid('stop', 'must be an array of non-empty strings');
  }
  const completionWindow = req.completionWindow ?? DEFAULT_COMPLETION_WINDOW;
  if (!SCHEDULING_WINDOWS.includes(completionWindow)) {
    throw invalid('completionWindow', `must be one of ${SCHEDULING_WINDOWS.join(', ')}, got ${JSON.stringify(completionWindow) ?? String(completionWindow)}`);
  }
  const thinking = req.thinking;
  if (thinking !== undefined && thinking !== false && (thinking === null || typeof thinking !== 'object' ||
      !Number.isInteger(thinking.budget) || thinking.budget < 0 || thinking.budget > MAX_THINKING_BUDGET)) {
    throw invalid('thinking', `must be false or {budget} with an integer budget in [0, ${MAX_THINKING_BUDGET}]`);
  }
  const promptCacheKey = req.promptCacheKey;
  if (promptCacheKey !== undefined && (typeof promptCacheKey !== 'string' || promptCacheKey.length === 0 ||
      promptCacheKey.length > MAX_PROMPT_CACHE_KEY_LENGTH)) {
    throw invalid('promptCacheKey', `must be a string of 1 to ${MAX_PROMPT_CACHE_KEY_LENGTH} characters`);
  }
  return {
    sampling: { temperature, topP, topK, minP, seed, logprobs: logprobs ?? 0 },
    logprobs,
    maxTokens,
    stopStrings: [...stop],
    completionWindow,
    promptCacheKey,
  };
}

/** Checks that exactly one prompt source is given; returns which. */
export function promptSource(req: GenerateRequest): 'prompt' | 'messages' | 'promptTokenIds' {
  const given = (['prompt', 'messages', 'promptTokenIds'] as const).filter((k) => req[k] !== undefined);
  if (given.length !== 1) {
    throw new SluiceError('invalid_request',
      given.length === 0 ? 'give one of prompt, messages or promptTokenIds'
        : `give only one of prompt, messages or promptTokenIds (got ${given.join(' and ')})`);
  }
  const source = given[0]!;
  if (source === 'prompt' && typeof req.prompt !== 'string') throw invalid('prompt', 'must be a string');
  return source;
}

/** Token ids given directly must be integers in [0, vocabSize). */
export function checkPromptTokenIds(ids: unknown, vocabSize: number): number[] {
  if (!Array.isArray(ids) || ids.some((id) => !Number.isInteger(id) || id < 0 || id >= vocabSize)) {
    throw invalid('promptTokenIds', `must be an array of integers in [0, ${vocabSize})`);
  }
  return [...(ids as number[])];
}

/** The request's names for the input and the output limit, in errors (the library's, or a surface's). */
export interface TokenLimitNames {
  input: string;
  maxTokens: string;
}

const LIBRARY_NAMES: TokenLimitNames = { input: 'prompt', maxTokens: 'maxTokens' };

/**
 * Resolves maxTokens against the context: prompt + maxTokens must be <= contextLength
 * (context_length_exceeded otherwise, stating both numbers). The default is what is left of the
 * context, capped by what one sequence can hold in the KV pool (`maxSequenceTokens`). The one
 * resolution of an output limit: the engine's (library requests) and the service's (each surface's
 * field names in `names`).
 */
export function resolveMaxTokens(
  numPromptTokens: number, maxTokens: number | undefined, contextLength: number, maxSequenceTokens: number,
  names: TokenLimitNames = LIBRARY_NAMES,
): number {
  if (numPromptTokens === 0) {
    throw new SluiceError('invalid_request', `the ${names.input} is empty (0 tokens after tokenization)`, { param: names.input });
  }
  if (maxTokens === undefined) {
    if (numPromptTokens >= contextLength) {
      throw new SluiceError('context_length_exceeded',
        `the ${names.input} has ${numPromptTokens} tokens, which leaves no room to generate in the model's ` +
        `context length of ${contextLength} tokens`, { param: names.input });
    }
    // +1: the last generated token never needs KV.
    return Math.max(1, Math.min(contextLength - numPromptTokens, maxSequenceTokens - numPromptTokens + 1));
  }
  if (numPromptTokens + maxTokens > contextLength) {
    throw new SluiceError('context_length_exceeded',
      `the ${names.input} has ${numPromptTokens} tokens and ${names.maxTokens} is ${maxTokens}: together ` +
      `${numPromptTokens + maxTokens} tokens, more than the model's context length of ${contextLength}`,
      { param: names.maxTokens });
  }
  return maxTokens;
}
