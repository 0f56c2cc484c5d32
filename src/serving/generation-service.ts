// Runs GenerationRequests on the served models. prepare() does every check that must fail before
// the model is called (model access, completion window, image input, context window) and
// tokenizes; run() generates. Failures are SluiceErrors with codes the API maps to statuses.

import { SluiceError } from '../errors.js';
import { MAX_PROMPT_CACHE_KEY_LENGTH, type GenerateResult } from '../engine/request.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { GenerationRequest, PreparedGeneration } from './generation-request.js';
import type { ModelRegistry, ServedModel } from './model-registry.js';

export class GenerationService {
  constructor(readonly registry: ModelRegistry) {}

  async prepare(request: GenerationRequest): Promise<PreparedGeneration> {
    const model = this.registry.resolve(request.model, request.caller.orgName);
    const window = resolveWindow(model, request);
    if (request.promptCacheKey !== undefined && request.promptCacheKey.length > MAX_PROMPT_CACHE_KEY_LENGTH) {
      throw new SluiceError('invalid_request',
        `prompt_cache_key must be at most ${MAX_PROMPT_CACHE_KEY_LENGTH} characters`, { param: 'prompt_cache_key' });
    }
    if (request.imageParam !== undefined && !model.supportsImageInput) {
      throw new SluiceError('image_input_unsupported',
        `the model "${model.id}" does not accept image input (supports_image_input is false)`, { param: request.imageParam });
    }
    if (request.input.kind === 'messages' && !model.supportsChat) {
      throw new SluiceError('chat_unsupported',
        `the model "${model.id}" does not serve conversations (supports_chat is false); send a plain string input`,
        { param: 'input' });
    }
    // Long inputs are rendered and tokenized off the event loop; over-long ones are refused first.
    const promptTokenIds = await model.engine.preparePrompt(request.input.kind === 'messages'
      ? { messages: request.input.messages }
      : { prompt: request.input.text });
    const maxTokens = resolveMaxTokens(model, promptTokenIds.length, request);
    return { request, window, promptTokenIds, maxTokens };
  }

  async run(prepared: PreparedGeneration, signal?: AbortSignal): Promise<GenerateResult> {
    const { request } = prepared;
    const model = this.registry.resolve(request.model, request.caller.orgName);
    const s = request.sampling;
    return model.engine.generate({
      promptTokenIds: prepared.promptTokenIds,
      maxTokens: prepared.maxTokens,
      completionWindow: prepared.window,
      // An empty key is no key.
      ...(request.promptCacheKey && { promptCacheKey: request.promptCacheKey }),
      ...(s.temperature !== undefined && { temperature: s.temperature }),
      ...(s.topP !== undefined && { topP: s.topP }),
      ...(s.topK !== undefined && { topK: s.topK }),
      ...(s.seed !== undefined && { seed: s.seed }),
      ...(s.stop !== undefined && { stop: s.stop }),
      ...(s.logprobs !== undefined && { logprobs: s.logprobs }),
      ...(signal && { signal }),
    });
  }

  /**
   * Runs several generations of one request (n choices); resolves with their results in order.
   * The first failure (or `signal`) cancels the ones still running, and the call rejects with it.
   */
  async runChoices(choices: PreparedGeneration[], signal: AbortSignal): Promise<GenerateResult[]> {
    if (choices.length === 1) return [await this.run(choices[0]!, signal)];
    const controller = new AbortController();
    const cancelAll = () => controller.abort();
    signal.addEventListener('abort', cancelAll, { once: true });
    try {
      return await Promise.all(choices.map((choice) => this.run(choice, controller.signal).catch((err: unknown) => {
        cancelAll();
        throw err;
      })));
    } finally {
      signal.removeEventListener('abort', cancelAll);
    }
  }

  /** The model a prepared request runs on (its tokenizer decodes logprob tokens). */
  modelOf(prepared: PreparedGeneration): ServedModel {
    return this.registry.resolve(prepared.request.model, prepared.request.caller.orgName);
  }
}

function resolveWindow(model: ServedModel, request: GenerationRequest): CompletionWindow {
  const allowed = model.windowsFor(request.caller.orgName);
  const asked = request.completionWindow;
  if (asked === undefined) return allowed.includes('standard') ? 'standard' : allowed.includes('asap') ? 'asap' : failNoDefault(model, allowed);
  if (asked !== 'asap' && asked !== 'standard' && asked !== 'flex') {
    throw new SluiceError('invalid_request',
      `metadata.completion_window must be one of asap, standard, flex (got ${JSON.stringify(asked)})`,
      { param: 'metadata.completion_window' });
  }
  if (!allowed.includes(asked)) {
    throw new SluiceError('unsupported_completion_window',
      `the model "${model.id}" has no "${asked}" completion window; it offers ${allowed.join(', ')}`,
      { param: 'metadata.completion_window' });
  }
  if (asked === 'flex' && !request.background) {
    throw new SluiceError('invalid_request', 'completion_window "flex" requires background=true',
      { param: 'background' });
  }
  return asked;
}

function failNoDefault(model: ServedModel, allowed: CompletionWindow[]): never {
  // Only flex is priced: flex is never chosen automatically.
  throw new SluiceError('invalid_request',
    `the model "${model.id}" offers only the ${allowed.join(', ')} window, which is never chosen by default: ` +
    'set metadata.completion_window (flex also needs background=true)', { param: 'metadata.completion_window' });
}

function resolveMaxTokens(model: ServedModel, numPromptTokens: number, request: GenerationRequest): number {
  const contextLength = model.contextLength;
  const param = request.maxOutputTokensParam;
  if (numPromptTokens === 0) throw new SluiceError('invalid_request', 'the input is empty after tokenization', { param: 'input' });
  const asked = request.maxOutputTokens;
  if (asked === undefined) {
    if (numPromptTokens >= contextLength) {
      throw new SluiceError('context_length_exceeded',
        `the input has ${numPromptTokens} tokens, which leaves no room for output in the model's context length of ${contextLength} tokens`,
        { param: 'input' });
    }
    // +1: the last generated token never needs KV.
    return Math.max(1, Math.min(contextLength - numPromptTokens, model.engine.info.maxSequenceTokens - numPromptTokens + 1));
  }
  if (numPromptTokens + asked > contextLength) {
    throw new SluiceError('context_length_exceeded',
      `the input has ${numPromptTokens} tokens and ${param} is ${asked}: together ${numPromptTokens + asked}, ` +
      `more than the model's context length of ${contextLength} tokens`, { param });
  }
  return asked;
}
