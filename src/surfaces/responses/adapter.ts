// The Responses surface adapter: a create-response body -> GenerationRequest, and a generation's
// outcome -> the Response object (OpenAI shape: output is a list of message items). The object's
// metadata is the request's without webhook_token: the token is a credential, never echoed (the
// GenerationRequest keeps it, for the completion webhook).

import type { ChatMessage, ChatRole } from '../../text/chat-template.js';
import type { GenerateResult } from '../../engine/request.js';
import type { Caller, GenerationRequest, OutputFormat, PreparedGeneration, RequestImage } from '../../serving/generation-request.js';
import { checkResponseSchema } from '../../structured/schema-check.js';
import type { ResponseBody } from '../../store/store.js';
import { publicMetadata } from '../../webhooks/events.js';
import { invalidRequest } from '../errors.js';
import type { CreateResponseBody, InputItem, InputMessage } from './schema.js';
import {
  checkImageUrl, MessageParts, newId, nowSeconds, openAiLogprobs, refuseListedTypes, refuseStreaming, requestedWindow, STREAMING_UNAVAILABLE,
} from '../content.js';
import { argumentsObject, callId, responsesTools } from '../tools.js';
import { split, type AssistantTurn } from '../../serving/assistant-turn.js';
import type { ReasoningSeal } from '../../serving/reasoning-seal.js';

/** Input item types served. */
const KNOWN_ITEM_TYPES: ReadonlySet<string> = new Set(['message', 'function_call', 'function_call_output', 'reasoning']);

/** Input kinds clients may send that the service refuses, with why. */
const REFUSED_ITEM_TYPES: Record<string, string> = {
  item_reference: 'item references are not accepted as input; send the messages themselves',
  input_audio: 'audio input is not accepted',
  input_file: 'file input is not accepted',
  file: 'file input is not accepted',
};

/**
 * OpenAI request fields this surface knows and cannot serve, with why. Other unknown fields are
 * accepted, as the spec says; these ask for something, so dropping them would mislead.
 */
const REFUSED_FIELDS: Record<string, string> = {
  stream_options: `stream_options is only meaningful with stream=true; ${STREAMING_UNAVAILABLE}`,
  conversation: 'conversation is not supported: conversations are not stored here; continue one with previous_response_id, or send its turns in input',
  prompt: 'prompt (a reusable prompt stored with OpenAI) is not supported: send instructions and input instead',
};

/** include values served: token logprobs of the answer, and the sealed reasoning (store=false). */
const LOGPROBS_INCLUDE = 'message.output_text.logprobs';
const ENCRYPTED_REASONING_INCLUDE = 'reasoning.encrypted_content';

/**
 * Gives stream=true, item references, audio and file inputs a clear 400 before schema validation
 * would report them as a mismatched field. Runs on the raw body.
 */
export function refuseUnsupportedInput(body: unknown): void {
  refuseStreaming(body);
  const input = (body as { input?: unknown } | null)?.input;
  if (Array.isArray(input)) {
    refuseListedTypes(input, 'input', REFUSED_ITEM_TYPES, true);
    // An item type no schema branch knows: named here, rather than as a mismatch of some branch.
    input.forEach((item, i) => {
      const type = (item as { type?: unknown } | null)?.type;
      if (type !== undefined && !(typeof type === 'string' && KNOWN_ITEM_TYPES.has(type))) {
        throw invalidRequest(`input[${i}].type must be one of ${[...KNOWN_ITEM_TYPES].join(', ')}`, `input[${i}].type`);
      }
    });
  }
  else refuseListedTypes((input as { messages?: unknown } | null)?.messages, 'input.messages', REFUSED_ITEM_TYPES, true);
}

/**
 * Input items -> chat messages. function_call items join the assistant turn before them (or make
 * one); function_call_output items are tool messages; a reasoning item's text reaches the next
 * assistant turn only from its encrypted_content (`unseal`; without it, as with store=true, the
 * reasoning does not carry over).
 */
function itemsToMessages(items: InputItem[], base: string, images: RequestImage[], unseal?: (blob: string, param: string) => string): ChatMessage[] {
  const out: ChatMessage[] = [];
  let pendingReasoning: string | undefined;
  items.forEach((item, i) => {
    const at = `${base}[${i}]`;
    if (item.type === 'function_call') {
      const last = out[out.length - 1];
      const call = { id: item.call_id, type: 'function' as const, function: { name: item.name, arguments: argumentsObject(item.arguments, `${at}.arguments`) } };
      if (last !== undefined && last.role === 'assistant') (last.tool_calls ??= []).push(call);
      else out.push({ role: 'assistant', content: '', tool_calls: [call], ...(pendingReasoning !== undefined && { reasoning_content: pendingReasoning }) });
      pendingReasoning = undefined;
      return;
    }
    if (item.type === 'function_call_output') {
      out.push({ role: 'tool', content: item.output, tool_call_id: item.call_id });
      return;
    }
    if (item.type === 'reasoning') {
      if (typeof item.encrypted_content === 'string' && unseal !== undefined) pendingReasoning = unseal(item.encrypted_content, `${at}.encrypted_content`);
      return;
    }
    const message = toChatMessages([item], base, images, i)[0]!;
    if (message.role === 'assistant' && pendingReasoning !== undefined) message.reasoning_content = pendingReasoning;
    pendingReasoning = undefined;
    out.push(message);
  });
  return out;
}

function toChatMessages(messages: InputMessage[], base: string, images: RequestImage[], first = 0): ChatMessage[] {
  return messages.map((m, k): ChatMessage => {
    const i = first + k;
    const role: ChatRole = m.role === 'function' ? 'tool' : m.role;
    if (typeof m.content === 'string') return { role, content: m.content };
    const parts = new MessageParts(images);
    m.content.forEach((part, j) => {
      const param = `${base}[${i}].content[${j}]`;
      if (part.type === 'input_image') {
        checkImageUrl(part.image_url, `${param}.image_url`);
        parts.image(part.image_url, part.detail, param);
        return;
      }
      if (part.type === 'output_text' && role !== 'assistant') {
        throw invalidRequest(`${param}: output_text parts belong to assistant messages`, `${param}.type`);
      }
      parts.text(part.text);
    });
    return { role, content: parts.content() };
  });
}

/**
 * The OpenAI fields checked here: refused ones (400 naming them), include, top_logprobs and
 * text.verbosity. Returns how many top alternatives per output token to return, undefined for no
 * logprobs.
 */
function checkOpenAiFields(body: CreateResponseBody): number | undefined {
  for (const [field, why] of Object.entries(REFUSED_FIELDS)) {
    if ((body as Record<string, unknown>)[field] != null) throw invalidRequest(why, field, 'unsupported_parameter');
  }
  const verbosity = body.text?.verbosity;
  if (verbosity != null && verbosity !== 'medium') {
    throw invalidRequest(`text.verbosity "${verbosity}" is not supported: the models take no length hint; send "medium" or leave it out`,
      'text.verbosity', 'unsupported_parameter');
  }
  let logprobs = false;
  (body.include ?? []).forEach((value, i) => {
    if (value === LOGPROBS_INCLUDE) logprobs = true;
    else if (value === ENCRYPTED_REASONING_INCLUDE) {
      // With store=false reasoning items carry encrypted_content anyway; with store=true the spec
      // says reasoning does not carry over, so there is nothing to hand back.
      if (body.store !== false) {
        throw invalidRequest(`include[${i}] "${value}" needs store=false: with store=true reasoning does not carry over to a later request`,
          `include[${i}]`, 'unsupported_parameter');
      }
    } else {
      throw invalidRequest(`include[${i}] "${value}" is not available here: the values served are ${LOGPROBS_INCLUDE} and ` +
        `${ENCRYPTED_REASONING_INCLUDE} (with store=false)`, `include[${i}]`, 'unsupported_parameter');
    }
  });
  if (body.top_logprobs != null && !logprobs) {
    throw invalidRequest(`top_logprobs needs include ["${LOGPROBS_INCLUDE}"]: without it no logprobs are returned`, 'top_logprobs');
  }
  return logprobs ? body.top_logprobs ?? 0 : undefined;
}

/**
 * OpenAI's service_tier -> the completion window it asks for (undefined: no preference). priority
 * is OpenAI's faster tier at a higher price: the spec's asap window; flex is the flex window, which
 * runs background requests only (the spec: flex requires background=true). scale (Scale Tier
 * units) does not exist here.
 */
function responsesTierWindow(body: CreateResponseBody): 'asap' | 'flex' | undefined {
  const tier = body.service_tier;
  if (tier === 'priority') return 'asap';
  // Without background=true prepare() refuses it, naming service_tier (a batch line runs in the
  // background whatever it says, so the check cannot be made here).
  if (tier === 'flex') return 'flex';
  if (tier === 'scale') {
    throw invalidRequest('service_tier "scale" (Scale Tier) is not offered: send "auto", "default", "priority" or "flex"',
      'service_tier', 'unsupported_parameter');
  }
  return undefined;
}

export function toGenerationRequest(body: CreateResponseBody, caller: Caller, supportsChat: boolean,
  seal?: ReasoningSeal): GenerationRequest {
  const logprobs = checkOpenAiFields(body);
  const unseal = seal === undefined ? undefined : (blob: string, param: string) => seal.unseal(caller.orgId, blob, param);
  let input: GenerationRequest['input'];
  const images: RequestImage[] = [];
  if (typeof body.input === 'string') {
    // A string is one user turn for chat models, and the raw prompt for completion-only models.
    input = supportsChat
      ? { kind: 'messages', messages: [{ role: 'user', content: body.input }] }
      : { kind: 'prompt', text: body.input };
  } else {
    const messages = Array.isArray(body.input) ? itemsToMessages(body.input, 'input', images, unseal) : toChatMessages(body.input.messages, 'input.messages', images);
    input = { kind: 'messages', messages };
  }
  if (typeof body.instructions === 'string' && body.instructions !== '') {
    if (input.kind === 'messages') input.messages.unshift({ role: 'developer', content: body.instructions });
    else input = { kind: 'prompt', text: `${body.instructions}\n\n${input.text}` };
  }
  const metadata = body.metadata ?? {};
  const format = body.text?.format;
  const request: GenerationRequest = {
    caller,
    model: body.model,
    input,
    sampling: {
      ...(body.temperature != null && { temperature: body.temperature }),
      // top_p 0 means "only the most likely token": the engine's smallest nucleus.
      ...(body.top_p != null && { topP: Math.max(body.top_p, Number.MIN_VALUE) }),
      ...(logprobs !== undefined && { logprobs }),
    },
    maxOutputTokensParam: 'max_output_tokens',
    background: body.background === true,
    metadata,
  };
  if (body.max_output_tokens != null) request.maxOutputTokens = body.max_output_tokens;
  const { window, param: windowParam } = requestedWindow(metadata, body.service_tier, responsesTierWindow(body));
  if (window !== undefined) request.completionWindow = window;
  if (windowParam !== undefined) request.completionWindowParam = windowParam;
  if (images.length > 0) {
    request.images = images;
    request.imageParam = images[0]!.param;
  }
  if (format?.type === 'json_schema') {
    const schemaParam = 'text.format.schema';
    // Refused now (400 naming the keyword), before the request is stored, queued or billed.
    checkResponseSchema(format.schema ?? {}, { strict: format.strict === true, param: schemaParam });
    request.outputFormat = { ...(format as OutputFormat), schema: format.schema ?? {}, schemaParam };
  } else if (format) {
    request.outputFormat = format as OutputFormat;
  }
  if (body.prompt_cache_key !== undefined) request.promptCacheKey = body.prompt_cache_key;
  const user = body.user ?? body.safety_identifier;
  if (user !== undefined) request.user = user;
  const tools = responsesTools(body.tools, body.tool_choice, body.parallel_tool_calls);
  if (tools !== undefined) request.tools = tools;
  if (body.reasoning?.effort != null) request.reasoningEffort = body.reasoning.effort;
  return request;
}

const zeroUsage = () => ({
  input_tokens: 0,
  input_tokens_details: { cached_tokens: 0, reasoning_tokens: 0 },
  output_tokens: 0,
  output_tokens_details: { cached_tokens: 0, reasoning_tokens: 0 },
  total_tokens: 0,
});

/** The Response object while the request runs: no output yet, zero usage. */
export function inProgressResponse(id: string, body: CreateResponseBody, prepared: PreparedGeneration): ResponseBody {
  const req = prepared.request;
  return {
    id,
    object: 'response',
    created_at: nowSeconds(),
    status: 'in_progress',
    // What the request asked for: a batch line runs in the background whatever it says.
    background: body.background === true,
    completed_at: null,
    error: null,
    incomplete_details: null,
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    model: req.model,
    output: [],
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    previous_response_id: body.previous_response_id ?? null,
    prompt_cache_key: body.prompt_cache_key ?? null,
    // summary: what the request asked for; finishedResponse reads it back (a background response
    // is finished from the stored object).
    reasoning: { effort: body.reasoning?.effort ?? null, summary: body.reasoning?.summary ?? body.reasoning?.generate_summary ?? null },
    store: body.store ?? true,
    temperature: body.temperature ?? 1,
    top_p: body.top_p ?? 1,
    text: { format: body.text?.format ?? { type: 'text' } },
    tool_choice: body.tool_choice ?? 'auto',
    tools: body.tools ?? [],
    truncation: 'disabled',
    usage: zeroUsage(),
    user: body.user ?? null,
    metadata: publicMetadata(req.metadata),
    completion_window: prepared.window,
  };
}

/**
 * Whether the token limit ended the output inside its reasoning: the model never began its answer
 * (the think block, or gpt-oss's analysis message, never closed).
 */
export function cutWhileThinking(result: GenerateResult, turn: AssistantTurn): boolean {
  return result.finishReason === 'length' && turn.reasoningOpen === true;
}

/**
 * The finished Response: a reasoning item when the model thought, an assistant message item (when
 * it wrote text, or called nothing), and a function_call item per tool call; `incomplete` when
 * the token limit cut it. Cut inside the think block, the output is the reasoning item alone, as
 * OpenAI answers a reasoning model that ran out of tokens before its answer: no message item whose
 * empty text a client could take for the answer (or try to parse). `seal` makes a reasoning item's
 * encrypted_content (store=false).
 */
export function finishedResponse(running: ResponseBody, result: GenerateResult, prepared: PreparedGeneration,
  seal?: ReasoningSeal): ResponseBody {
  const cut = result.finishReason === 'length';
  const status = cut ? 'incomplete' : 'completed';
  const turn = split(prepared.assistant, prepared.promptTokenIds, result);
  const answered = !cutWhileThinking(result, turn);
  const output: Record<string, unknown>[] = [];
  if (turn.reasoning !== undefined) {
    // A summary asked for (reasoning.summary / generate_summary, any level) is the reasoning itself:
    // no summarizer model runs here, and the whole text is never less than a summary says.
    const summaryAsked = (running['reasoning'] as { summary?: unknown } | null | undefined)?.summary != null;
    output.push({
      id: newId('rs'),
      type: 'reasoning',
      summary: summaryAsked ? [{ type: 'summary_text', text: turn.reasoning }] : [],
      content: [{ type: 'reasoning_text', text: turn.reasoning }],
      // store=false: the reasoning comes back sealed, for the client to replay (spec: store).
      ...(seal !== undefined && running['store'] === false && { encrypted_content: seal.seal(prepared.request.caller.orgId, turn.reasoning) }),
      status,
    });
  }
  if (answered && (turn.content !== '' || turn.toolCalls.length === 0)) {
    output.push({
      id: newId('msg'),
      type: 'message',
      status,
      role: 'assistant',
      // With include message.output_text.logprobs: the tokens after the reasoning (a tool call
      // written after the text, if any, is among them).
      content: [{ type: 'output_text', text: turn.content, annotations: [],
        logprobs: result.logprobs === undefined ? [] : openAiLogprobs(result.logprobs.slice(turn.reasoningTokens)) }],
    });
  }
  for (const call of turn.toolCalls) {
    output.push({ id: newId('fc'), type: 'function_call', call_id: callId(), name: call.name, arguments: call.arguments, status: 'completed' });
  }
  return {
    ...running,
    status,
    completed_at: nowSeconds(),
    incomplete_details: cut ? { reason: 'max_output_tokens' } : null,
    output,
    usage: {
      input_tokens: result.usage.promptTokens,
      input_tokens_details: { cached_tokens: result.usage.cachedTokens, reasoning_tokens: 0 },
      output_tokens: result.usage.completionTokens,
      output_tokens_details: { cached_tokens: 0, reasoning_tokens: turn.reasoningTokens },
      total_tokens: result.usage.promptTokens + result.usage.completionTokens,
    },
  };
}

export function failedResponse(running: ResponseBody, code: string, message: string): ResponseBody {
  return { ...running, status: 'failed', completed_at: nowSeconds(), error: { code, message } };
}

export function cancelledResponse(running: ResponseBody): ResponseBody {
  return { ...running, status: 'cancelled', completed_at: nowSeconds() };
}
