// The Chat Completions surface adapter: a create-chat-completion body -> GenerationRequest (plus
// the number of choices), and the generations' results -> the OpenAI chat.completion object.
// Every OpenAI field the schema lets through is either honoured here or refused with a 400
// naming it; nothing is dropped silently.

import { createHash } from 'node:crypto';
import type { ChatMessage, ChatRole } from '../../text/chat-template.js';
import type { GenerateResult } from '../../engine/request.js';
import type { Caller, GenerationRequest, OutputFormat, PreparedGeneration, RequestImage } from '../../serving/generation-request.js';
import type { ServedModel } from '../../serving/model-registry.js';
import { invalidRequest } from '../errors.js';
import { checkResponseSchema } from '../../structured/schema-check.js';
import {
  MAX_STOP_STRINGS, type ChatCompletion, type ChatMessageParam, type CreateChatCompletionBody,
} from './schema.js';
import {
  checkImageUrl, MessageParts, newId, openAiLogprobs, refuseListedTypes, refuseStreaming, requestedWindow, STREAMING_UNAVAILABLE,
} from '../content.js';
import { argumentsObject, callId, chatTools } from '../tools.js';
import { split } from '../../serving/assistant-turn.js';

/** A chat message with the tool-call fields templates read. */
type ToolAwareMessage = ChatMessage & {
  tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: Record<string, unknown> } }[];
  tool_call_id?: string;
  name?: string;
  reasoning_content?: string;
};

/** Content part types of OpenAI's API that the service refuses, with why. */
const REFUSED_PART_TYPES: Record<string, string> = {
  input_audio: 'audio input is not accepted',
  file: 'file input is not accepted',
};

/** Known OpenAI request fields that ask for something no served model can do. */
const REFUSED_FIELDS: Record<string, string> = {
  audio: 'audio output is not available: the models generate text only',
  prediction: 'predicted outputs are not supported',
  web_search_options: 'web search is not available',
};

const unsupported = (param: string, message: string) => invalidRequest(message, param, 'unsupported_parameter');

/**
 * OpenAI's service_tier -> the completion window it asks for (undefined: no preference, so
 * metadata.completion_window or the model's default decides). priority is OpenAI's faster tier at
 * a higher price: the spec's asap window. flex is refused rather than run: OpenAI's flex is a
 * cheaper, slower tier that it serves synchronously on Chat Completions too, but the API contract
 * lets the flex window run only background requests (background=true), and Chat Completions has
 * no background mode. Running flex requests in the standard window instead would bill and
 * schedule them as something they did not ask for. scale (Scale Tier units) does not exist here.
 */
function chatTierWindow(tier: CreateChatCompletionBody['service_tier']): 'asap' | undefined {
  if (tier === 'priority') return 'asap';
  if (tier === 'flex') {
    throw unsupported('service_tier', 'service_tier "flex" is not available on Chat Completions: the flex completion window ' +
      'runs only background requests (background=true), which this endpoint does not offer; use POST /v1/responses with ' +
      'background=true and service_tier "flex", or send "auto", "default" or "priority" here');
  }
  if (tier === 'scale') throw unsupported('service_tier', 'service_tier "scale" (Scale Tier) is not offered: send "auto", "default" or "priority"');
  return undefined;
}

/**
 * Runs on the raw body, before schema validation: gives stream=true and refused content parts
 * (audio, files) their own clear 400 instead of a schema mismatch.
 */
export function refuseUnsupportedChatInput(body: unknown): void {
  refuseStreaming(body);
  refuseListedTypes((body as { messages?: unknown } | null)?.messages, 'messages', REFUSED_PART_TYPES);
}

/** The tool-call fields a message carries to the chat template (tool_calls, tool_call_id, reasoning_content). */
function toolFields(m: ChatMessageParam, i: number): Partial<ToolAwareMessage> {
  const out: Partial<ToolAwareMessage> = {};
  if (m.role === 'assistant' && m.tool_calls !== undefined && m.tool_calls.length > 0) {
    out.tool_calls = m.tool_calls.map((call, j) => {
      const at = `messages[${i}].tool_calls[${j}]`;
      const fn = call['function'] as { name?: unknown; arguments?: unknown } | undefined;
      if (call['type'] !== 'function' || typeof fn !== 'object' || fn === null || typeof fn.name !== 'string') {
        throw invalidRequest(`${at} must be {id, type: "function", function: {name, arguments}}`, at);
      }
      return {
        id: typeof call['id'] === 'string' ? call['id'] : '',
        type: 'function' as const,
        function: { name: fn.name, arguments: argumentsObject(fn.arguments ?? '{}', `${at}.function.arguments`) },
      };
    });
  }
  if (m.role === 'tool' && m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
  if (m.name !== undefined && (m.role === 'tool' || m.role === 'function')) out.name = m.name;
  if (m.role === 'assistant' && typeof m.reasoning_content === 'string') out.reasoning_content = m.reasoning_content;
  return out;
}

function toChatMessages(messages: ChatMessageParam[], images: RequestImage[]): ChatMessage[] {
  return messages.map((m, i): ChatMessage => {
    // Legacy function results are tool results to the chat template.
    const role: ChatRole = m.role === 'function' ? 'tool' : m.role;
    const extra = toolFields(m, i);
    if (m.content === undefined || m.content === null) {
      // Only an assistant turn that called tools may have no content (OpenAI's rule too).
      if (m.role !== 'assistant') throw invalidRequest(`messages[${i}].content is required for a ${m.role} message`, `messages[${i}].content`);
      return { role, content: '', ...extra } as ChatMessage;
    }
    if (typeof m.content === 'string') return { role, content: m.content, ...extra } as ChatMessage;
    // Parts render as on the Responses surface (MessageParts), so both give the same prompt.
    const parts = new MessageParts(images);
    m.content.forEach((part, j) => {
      const param = `messages[${i}].content[${j}]`;
      if (part.type === 'text') {
        parts.text(part.text);
        return;
      }
      checkImageUrl(part.image_url.url, `${param}.image_url.url`);
      parts.image(part.image_url.url, part.image_url.detail, param);
    });
    return { role, content: parts.content(), ...extra } as ChatMessage;
  });
}

/** Checks the fields the schema lets through but the service serves only in part. */
function refuseUnservable(body: CreateChatCompletionBody): void {
  for (const [field, why] of Object.entries(REFUSED_FIELDS)) {
    if (body[field as keyof CreateChatCompletionBody] != null) throw unsupported(field, `${field}: ${why}`);
  }
  for (const field of ['presence_penalty', 'frequency_penalty'] as const) {
    if (body[field] != null && body[field] !== 0) throw unsupported(field, `${field} is not supported: only 0 (or null) is accepted`);
  }
  if (body.logit_bias != null && Object.keys(body.logit_bias).length > 0) {
    throw unsupported('logit_bias', 'logit_bias is not supported: only an empty object (or null) is accepted');
  }
  if (body.stream_options != null) {
    throw unsupported('stream_options', `stream_options is only meaningful with stream=true; ${STREAMING_UNAVAILABLE}`);
  }
  if (body.store === true) {
    // OpenAI keeps stored chat completions for later retrieval, distillation and evals; nothing
    // here stores them (the ledger keeps usage only), so accepting store=true would be a promise
    // the service does not keep.
    throw unsupported('store', 'store=true is not supported: chat completions are not stored for later retrieval here; ' +
      'send store=false or leave it out (POST /v1/responses stores every response)');
  }
  if ((body.functions?.length ?? 0) > 0) throw unsupported('functions', 'functions is deprecated and not served: send tools instead');
  const call = body.function_call;
  if (call != null && call !== 'none' && call !== 'auto') throw unsupported('function_call', 'function_call is deprecated and not served: send tool_choice instead');
}

function outputFormatOf(body: CreateChatCompletionBody): OutputFormat | undefined {
  const format = body.response_format;
  if (format == null) return undefined;
  if (format.type === 'text') return { type: 'text' };
  if (format.type === 'json_object') return { type: 'json_object', schemaParam: 'response_format' };
  const js = format.json_schema;
  const out: OutputFormat = { type: 'json_schema', name: js.name, schemaParam: 'response_format.json_schema.schema' };
  if (js.description !== undefined) out.description = js.description;
  out.schema = js.schema ?? {};
  if (js.strict != null) out.strict = js.strict;
  // Refused now (400 naming the keyword), before the request is queued or anything billed.
  checkResponseSchema(out.schema, { strict: out.strict === true, param: out.schemaParam! });
  return out;
}

function maxTokensOf(body: CreateChatCompletionBody): { value?: number; param: string } {
  const current = body.max_completion_tokens ?? undefined;
  const legacy = body.max_tokens ?? undefined;
  if (current !== undefined && legacy !== undefined && current !== legacy) {
    throw invalidRequest(`max_tokens (${legacy}) and max_completion_tokens (${current}) disagree: send only max_completion_tokens`, 'max_tokens');
  }
  if (current !== undefined) return { value: current, param: 'max_completion_tokens' };
  if (legacy !== undefined) return { value: legacy, param: 'max_tokens' };
  return { param: 'max_completion_tokens' };
}

/** The request of one choice; `n` is how many choices to run (seeds seed, seed+1, ...). */
export function toChatGenerationRequest(body: CreateChatCompletionBody, caller: Caller, supportsChat: boolean): { request: GenerationRequest; n: number } {
  refuseUnservable(body);
  if (!supportsChat) {
    throw invalidRequest(`the model "${body.model}" does not serve conversations (supports_chat is false); use POST /v1/responses with a string input`,
      'model', 'chat_unsupported');
  }
  if (body.top_logprobs != null && body.logprobs !== true) {
    throw invalidRequest('top_logprobs requires logprobs=true', 'top_logprobs');
  }
  const metadata = body.metadata ?? {};
  const { window, param: windowParam } = requestedWindow(metadata, body.service_tier, chatTierWindow(body.service_tier));
  if (window === 'flex') {
    // flex needs background=true, which this endpoint does not offer.
    throw invalidRequest('completion_window "flex" needs a background request, which Chat Completions does not offer: use POST /v1/responses with background=true',
      'metadata.completion_window');
  }
  const images: RequestImage[] = [];
  const messages = toChatMessages(body.messages, images);
  const maxTokens = maxTokensOf(body);
  const stop = typeof body.stop === 'string' ? [body.stop] : (body.stop ?? []);
  if (stop.length > MAX_STOP_STRINGS) throw invalidRequest(`stop may hold at most ${MAX_STOP_STRINGS} strings (got ${stop.length})`, 'stop');
  const request: GenerationRequest = {
    caller,
    model: body.model,
    input: { kind: 'messages', messages },
    sampling: {
      ...(body.temperature != null && { temperature: body.temperature }),
      // top_p 0 means "only the most likely token": the engine's smallest nucleus.
      ...(body.top_p != null && { topP: Math.max(body.top_p, Number.MIN_VALUE) }),
      // OpenAI seeds are int64; the engine's are the same 64 bits read unsigned.
      ...(body.seed != null && { seed: BigInt.asUintN(64, BigInt(body.seed)) }),
      ...(stop.length > 0 && { stop }),
      ...(body.logprobs === true && { logprobs: body.top_logprobs ?? 0 }),
    },
    maxOutputTokensParam: maxTokens.param,
    background: false,
    metadata,
  };
  if (maxTokens.value !== undefined) request.maxOutputTokens = maxTokens.value;
  if (window !== undefined) request.completionWindow = window;
  if (windowParam !== undefined) request.completionWindowParam = windowParam;
  if (images.length > 0) {
    request.images = images;
    request.imageParam = images[0]!.param;
  }
  const format = outputFormatOf(body);
  if (format) request.outputFormat = format;
  if (body.prompt_cache_key !== undefined) request.promptCacheKey = body.prompt_cache_key;
  const tools = chatTools(body.tools, body.tool_choice, body.parallel_tool_calls);
  if (tools !== undefined) request.tools = tools;
  if (body.reasoning_effort != null) request.reasoningEffort = body.reasoning_effort;
  const user = body.user ?? body.safety_identifier;
  if (user !== undefined) request.user = user;
  return { request, n: body.n ?? 1 };
}

/** Stable per model and checkpoint: tells a client when the weights behind an id changed. */
/** `chatcmpl-` + 32 hex digits: OpenAI's ids of this object use a hyphen. */
export const completionId = (): string => newId('chatcmpl').replace('_', '-');

export function systemFingerprint(model: ServedModel): string {
  return `fp_${createHash('sha256').update(`${model.id}\0${model.entry.checkpoint}`).digest('hex').slice(0, 12)}`;
}

export interface ChatCompletionParts {
  id: string;
  created: number;
  fingerprint: string;
  prepared: PreparedGeneration;
  /** One result per choice, in choice order. */
  results: GenerateResult[];
}

/** The chat.completion object. The prompt is counted once, however many choices ran on it. */
export function chatCompletion(parts: ChatCompletionParts): ChatCompletion {
  const { prepared, results } = parts;
  const promptTokens = prepared.promptTokenIds.length;
  const completionTokens = results.reduce((sum, r) => sum + r.usage.completionTokens, 0);
  const turns = results.map((r) => split(prepared.assistant, prepared.promptTokenIds, r));
  return {
    id: parts.id,
    object: 'chat.completion',
    created: parts.created,
    model: prepared.request.model,
    system_fingerprint: parts.fingerprint,
    choices: results.map((r, index) => {
      const turn = turns[index]!;
      const calls = turn.toolCalls;
      return {
        index,
        message: {
          role: 'assistant' as const,
          // OpenAI: null content beside tool calls when there is no text.
          content: calls.length > 0 && turn.content === '' ? null : turn.content,
          refusal: null,
          ...(turn.reasoning !== undefined && { reasoning_content: turn.reasoning }),
          ...(calls.length > 0 && {
            tool_calls: calls.map((c) => ({ id: callId(), type: 'function' as const, function: { name: c.name, arguments: c.arguments } })),
          }),
        },
        logprobs: r.logprobs === undefined ? null : { content: openAiLogprobs(r.logprobs), refusal: null },
        finish_reason: calls.length > 0 && r.finishReason === 'stop' ? 'tool_calls' as const : r.finishReason,
      };
    }),
    usage: {
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
      total_tokens: promptTokens + completionTokens,
      // The prompt is counted once: what the first choice found in the prefix cache.
      prompt_tokens_details: { cached_tokens: results[0]?.usage.cachedTokens ?? 0 },
      completion_tokens_details: { reasoning_tokens: turns.reduce((sum, t) => sum + t.reasoningTokens, 0) },
    },
    completion_window: prepared.window,
  };
}
