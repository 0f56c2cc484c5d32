// Runs GenerationRequests on the served models. prepare() does every check that must fail before
// the model is called (model access, completion window, image input, context window) and
// tokenizes; run() generates. Failures are SluiceErrors with codes the API maps to statuses.

import { isSluiceError, SluiceError } from '../errors.js';
import { MAX_PROMPT_CACHE_KEY_LENGTH, resolveMaxTokens, type GenerateResult } from '../engine/request.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { GenerationRequest, OutputFormat, PreparedGeneration } from './generation-request.js';
import type { ResponseFormat } from '../structured/structured-outputs.js';
import type { ModelRegistry, ServedModel } from './model-registry.js';
import { plan } from './assistant-turn.js';
import type { ReasoningSeal } from './reasoning-seal.js';
import { TenantLimiter, type Release } from './tenant-limits.js';
import { prepareRequestImages, type ImageInputSettings } from './request-images.js';

/**
 * How a run meets its organization's limits (tenant-limits.ts): a foreground request needs an
 * in-flight slot (admitForeground, 429 without one); background work and batch lines wait while its
 * tokens per minute are spent, and are charged their tokens like foreground work. Batch lines do not
 * take foreground in-flight slots: the batch line slots (batches/slots.ts) hold at most the
 * organization's in-flight limit of them at once.
 */
export type RunMode = 'foreground' | 'background' | 'batch';

export class GenerationService {
  constructor(readonly registry: ModelRegistry, readonly limits: TenantLimiter = new TenantLimiter(),
    /** Seals reasoning for store=false responses (encrypted_content) and opens replayed blobs. */
    readonly reasoningSeal?: ReasoningSeal,
    /** How image parts are fetched and bounded (request-images.ts). */
    readonly images: ImageInputSettings = {}) {}

  /** `model`: request.model already resolved for its caller (the surface needed it to adapt the body). */
  async prepare(request: GenerationRequest, model = this.registry.resolve(request.model, request.caller.orgName)): Promise<PreparedGeneration> {
    const window = resolveWindow(model, request);
    if (request.promptCacheKey !== undefined && request.promptCacheKey.length > MAX_PROMPT_CACHE_KEY_LENGTH) {
      throw new SluiceError('invalid_request',
        `prompt_cache_key must be at most ${MAX_PROMPT_CACHE_KEY_LENGTH} characters`, { param: 'prompt_cache_key' });
    }
    const topK = request.sampling.topK;
    if (topK !== undefined && topK > model.engine.info.vocabSize) {
      throw new SluiceError('invalid_request',
        `top_k must be at most the model's vocabulary size (${model.engine.info.vocabSize}), got ${topK}`, { param: 'top_k' });
    }
    const { assistant, promptTokenIds, images } = await this.renderPrompt(model, request);
    const maxTokens = resolveMaxTokens(promptTokenIds.length, request.maxOutputTokens, model.contextLength,
      model.engine.info.maxSequenceTokens, { input: 'input', maxTokens: request.maxOutputTokensParam });
    return { request, model, window, promptTokenIds, maxTokens, assistant, ...(images && { images }) };
  }

  /**
   * The number of prompt tokens `request` would run with (and be billed for): the same model
   * checks, chat template and tokenizer as prepare(), without a window or an output limit to
   * resolve. Nothing is generated, counted against a limit or billed.
   */
  async countPromptTokens(request: GenerationRequest, model = this.registry.resolve(request.model, request.caller.orgName)): Promise<number> {
    return (await this.renderPrompt(model, request)).promptTokenIds.length;
  }

  /**
   * Refuses input the model cannot take, plans the assistant turn, prepares the images (fetched,
   * decoded, resized: what they add to the prompt is known before anything runs), renders and
   * tokenizes the prompt with each image's placeholders.
   */
  private async renderPrompt(model: ServedModel, request: GenerationRequest): Promise<Pick<PreparedGeneration, 'assistant' | 'promptTokenIds' | 'images'>> {
    if (request.imageParam !== undefined && !model.supportsImageInput) {
      throw new SluiceError('image_input_unsupported',
        `the model "${model.id}" does not accept image input (supports_image_input is false)`, { param: request.imageParam });
    }
    if (request.input.kind === 'messages' && !model.supportsChat) {
      throw new SluiceError('chat_unsupported',
        `the model "${model.id}" does not serve conversations (supports_chat is false); send a plain string input`,
        { param: 'input' });
    }
    const assistant = plan(model, {
      chat: request.input.kind === 'messages',
      ...(request.reasoningEffort !== undefined && { effort: request.reasoningEffort }),
      ...(request.tools !== undefined && { tools: request.tools }),
      ...(request.outputFormat !== undefined && { outputFormat: request.outputFormat }),
    });
    const images = request.images !== undefined && request.images.length > 0
      ? await prepareRequestImages(model.engine.vision!, request.images, this.images) : undefined;
    // Long inputs are rendered and tokenized off the event loop; over-long ones are refused first.
    const renderedTokenIds = await model.engine.preparePrompt(request.input.kind === 'messages'
      ? {
        messages: request.input.messages,
        ...(assistant.tools !== undefined && { tools: assistant.tools }),
        ...(assistant.enableThinking !== undefined && { enableThinking: assistant.enableThinking }),
        ...(assistant.reasoningEffort !== undefined && { reasoningEffort: assistant.reasoningEffort }),
      }
      : { prompt: request.input.text }, { contextLength: model.contextLength, tenant: request.caller.orgId });
    // An image's placeholder becomes its tokens (counted and billed as input).
    const promptTokenIds = images !== undefined || model.supportsImageInput
      ? model.engine.placeImages(renderedTokenIds, images ?? []).tokenIds : renderedTokenIds;
    return { assistant, promptTokenIds, ...(images && { images }) };
  }

  /**
   * Admits a foreground request of `numChoices` generations under its organization's limits:
   * throws RateLimitError (429) when its tokens per minute are spent or its in-flight slots are
   * taken. Call it before anything of the request is stored or sent; release when it ends.
   */
  admitForeground(caller: GenerationRequest['caller'], numChoices = 1): Release {
    this.limits.checkChoices(caller, numChoices);
    this.limits.checkTokens(caller);
    return this.limits.tryAcquire(caller, numChoices);
  }

  /**
   * Generates. A foreground run without `admitted` (a slot from admitForeground) admits itself;
   * background work first waits while its organization's tokens per minute are spent.
   */
  async run(prepared: PreparedGeneration, signal?: AbortSignal, mode: RunMode = 'foreground', admitted?: Release): Promise<GenerateResult> {
    const { caller } = prepared.request;
    const release = mode === 'foreground' && admitted === undefined ? this.admitForeground(caller) : undefined;
    if (mode !== 'foreground') await waitForTokens(this.limits, caller, signal);
    try {
      this.limits.chargeTokens(caller, prepared.promptTokenIds.length);
      const result = await this.generate(prepared, signal);
      this.limits.chargeTokens(caller, result.usage.completionTokens);
      return result;
    } finally {
      release?.();
    }
  }

  /** Resolves once the organization's tokens per minute are no longer spent; rejects if `signal` aborts first. */
  waitForTokens(caller: GenerationRequest['caller'], signal?: AbortSignal): Promise<void> {
    return waitForTokens(this.limits, caller, signal);
  }

  private generate(prepared: PreparedGeneration, signal: AbortSignal | undefined): Promise<GenerateResult> {
    const { request, model } = prepared;
    return this.generateOn(model, prepared, signal).catch((err: unknown) => {
      // An adapter unloaded after this request found its model and before it reached the engine:
      // answered as a request arriving after the unload is (nothing of it ran).
      if (model.adapter !== undefined && isSluiceError(err) && err.code === 'invalid_request' && err.param === 'adapter') {
        throw new SluiceError('model_not_found', `the model "${model.id}" does not exist; GET /v1/models lists the available ones`, { param: 'model' });
      }
      throw err;
    });
  }

  private generateOn(model: ServedModel, prepared: PreparedGeneration, signal: AbortSignal | undefined): Promise<GenerateResult> {
    const { request } = prepared;
    return model.engine.generate({
      promptTokenIds: prepared.promptTokenIds,
      ...(prepared.images !== undefined && { images: prepared.images }),
      maxTokens: prepared.maxTokens,
      completionWindow: prepared.window,
      // The organization owns its cached prefixes and gets its fair share of each window.
      tenant: request.caller.orgId,
      // A catalog entry of a LoRA adapter runs on its checkpoint's engine with the adapter.
      ...(model.adapter !== undefined && { adapter: model.adapter }),
      // An empty key is no key.
      ...(request.promptCacheKey && { promptCacheKey: request.promptCacheKey }),
      // The sampling fields are the engine's own (SamplingFields), carried whole.
      ...request.sampling,
      ...(prepared.assistant.responseFormat !== undefined ? { responseFormat: prepared.assistant.responseFormat }
        : responseFormatOf(request.outputFormat) ?? {}),
      ...(prepared.assistant.thinking && { thinking: prepared.assistant.thinking }),
      ...(signal && { signal }),
    });
  }

  /**
   * Runs several generations of one request (n choices); resolves with their results in order.
   * The first failure (or `signal`) cancels the ones still running, and the call rejects with it.
   */
  async runChoices(choices: PreparedGeneration[], signal: AbortSignal, mode: RunMode = 'foreground',
    admitted?: Release): Promise<GenerateResult[]> {
    if (choices.length === 1) return [await this.run(choices[0]!, signal, mode, admitted)];
    const controller = new AbortController();
    const cancelAll = () => controller.abort();
    signal.addEventListener('abort', cancelAll, { once: true });
    try {
      return await Promise.all(choices.map((choice) => this.run(choice, controller.signal, mode, admitted).catch((err: unknown) => {
        cancelAll();
        throw err;
      })));
    } finally {
      signal.removeEventListener('abort', cancelAll);
    }
  }

}

/** Sleeps while the organization's token budget is spent (accepted background work waits its turn). */
async function waitForTokens(limits: TenantLimiter, caller: GenerationRequest['caller'], signal?: AbortSignal): Promise<void> {
  for (let wait = limits.tokenDebtSeconds(caller); wait > 0; wait = limits.tokenDebtSeconds(caller)) {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(done, Math.min(wait, 60) * 1000);
      function done() {
        signal?.removeEventListener('abort', done);
        clearTimeout(timer);
        if (signal?.aborted) reject(signal.reason instanceof Error ? signal.reason : new SluiceError('cancelled', 'the request was cancelled'));
        else resolve();
      }
      signal?.addEventListener('abort', done, { once: true });
    });
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
  const param = request.completionWindowParam ?? 'metadata.completion_window';
  if (!allowed.includes(asked)) {
    throw new SluiceError('unsupported_completion_window',
      `the model "${model.id}" has no "${asked}" completion window; it offers ${allowed.join(', ')}` +
      (param === 'metadata.completion_window' ? '' : ` (${param} asked for ${asked})`), { param });
  }
  if (asked === 'flex' && !request.background) {
    // Named after metadata's background rule, or after the field (service_tier) that asked for flex.
    throw param === 'metadata.completion_window'
      ? new SluiceError('invalid_request', 'completion_window "flex" requires background=true', { param: 'background' })
      : new SluiceError('invalid_request', `${param} "flex" runs in the flex completion window, which requires background=true`, { param });
  }
  return asked;
}

function failNoDefault(model: ServedModel, allowed: CompletionWindow[]): never {
  // Only flex is priced: flex is never chosen automatically.
  throw new SluiceError('invalid_request',
    `the model "${model.id}" offers only the ${allowed.join(', ')} window, which is never chosen by default: ` +
    'set metadata.completion_window (flex also needs background=true)', { param: 'metadata.completion_window' });
}

/** The engine's response format for a request's output format (text: none). */
function responseFormatOf(format: OutputFormat | undefined): { responseFormat: ResponseFormat } | undefined {
  if (format?.type === 'json_schema') {
    return { responseFormat: { type: 'json_schema', schema: format.schema ?? {}, strict: format.strict === true,
      param: format.schemaParam ?? 'response_format' } };
  }
  if (format?.type === 'json_object') return { responseFormat: { type: 'json_object', param: format.schemaParam ?? 'response_format' } };
  return undefined;
}
