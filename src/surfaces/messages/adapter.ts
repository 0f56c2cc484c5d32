// The Messages surface adapter: a create-message body -> GenerationRequest, a generation's result
// -> Anthropic's message object, and the idempotency key and request hash of a call.
//
// Content blocks: text is served; image is accepted as far as the spec's image rule goes (the
// service refuses it with a 400 for models without image input, which is all of ours). Every
// other block kind is refused with a 400 naming it: tool_use / tool_result are tool turns, which
// this surface does not carry (the spec has Messages accept `tools` and never show them to the
// model, so a Messages conversation has no tool call; a model with supports_tools calls tools on
// Responses and Chat Completions), and documents, search results and thinking blocks have no
// meaning for these models. Rendering them as text would silently change what the caller asked.
//
// A final assistant turn (Anthropic's "prefill") is rendered as a finished turn followed by a new
// assistant turn: the chat template has no way to continue an open one.

import { createHash } from 'node:crypto';
import type { ChatMessage } from '../../text/chat-template.js';
import type { GenerateResult } from '../../engine/request.js';
import type { Caller, GenerationRequest, PreparedGeneration, RequestImage } from '../../serving/generation-request.js';
import { invalidRequest } from '../errors.js';
import type { CountTokensBody, CreateMessageBody, MessageObject, MessageParam } from './schema.js';
import { checkResponseSchema } from '../../structured/schema-check.js';
import type { OutputFormat } from '../../serving/generation-request.js';
import { checkImageUrl, MessageParts, refuseListedTypes, refuseStreaming, requestedWindow } from '../content.js';
import { split } from '../../serving/assistant-turn.js';

const NO_TOOL_TURNS = '/v1/messages does not carry tool turns (tools sent here are accepted and never shown to the model)';
const TOOLS_ELSEWHERE = 'for tool calling use POST /v1/responses or POST /v1/chat/completions with a model whose supports_tools is true';

const REFUSED_BLOCK_TYPES: Record<string, string> = {
  tool_use: `${NO_TOOL_TURNS}, so a conversation here has no tool call to replay; ${TOOLS_ELSEWHERE}`,
  tool_result: `${NO_TOOL_TURNS}, so a conversation here has no tool call to answer; ${TOOLS_ELSEWHERE}`,
  server_tool_use: 'server tools are not available',
  web_search_tool_result: 'server tools are not available',
  document: 'document input is not accepted',
  search_result: 'search result input is not accepted',
  thinking: 'thinking is not served on Messages, so there is no thinking to replay',
  redacted_thinking: 'thinking is not served on Messages, so there is no thinking to replay',
  container_upload: 'file input is not accepted',
};

/**
 * Runs on the raw body, before schema validation: gives stream=true and refused block kinds their
 * own clear 400 instead of a schema mismatch.
 */
export function refuseUnsupportedMessageInput(body: unknown): void {
  refuseStreaming(body);
  refuseUnsupportedBlocks(body);
}

/** The block kinds refused in `messages` (on /v1/messages and /v1/messages/count_tokens alike). */
export function refuseUnsupportedBlocks(body: unknown): void {
  refuseListedTypes((body as { messages?: unknown } | null)?.messages, 'messages', REFUSED_BLOCK_TYPES);
}

const BASE64 = /^[A-Za-z0-9+/=\s]+$/;

function toChatMessages(body: Pick<CreateMessageBody, 'system' | 'messages'>): { messages: ChatMessage[]; images: RequestImage[] } {
  const images: RequestImage[] = [];
  const out: ChatMessage[] = [];
  const system = typeof body.system === 'string' ? body.system : (body.system ?? []).map((b) => b.text).join('\n');
  if (system !== '') out.push({ role: 'system', content: system });
  body.messages.forEach((m: MessageParam, i) => {
    if (typeof m.content === 'string') {
      out.push({ role: m.role, content: m.content });
      return;
    }
    // Blocks render as parts do on the other surfaces (MessageParts), so all give the same prompt.
    const parts = new MessageParts(images);
    m.content.forEach((block, j) => {
      const param = `messages[${i}].content[${j}]`;
      if (block.type === 'text') {
        parts.text(block.text);
        return;
      }
      if (block.source.type === 'url') {
        checkImageUrl(block.source.url, `${param}.source.url`);
        parts.image(block.source.url, 'auto', param);
      } else {
        // Its ends here, so that markup or a URL is refused naming the field; the whole payload
        // (up to 20 MiB) where the image is loaded, off the event loop.
        const data = block.source.data;
        if (!BASE64.test(data.slice(0, 4096)) || !BASE64.test(data.slice(-4096))) {
          throw invalidRequest(`${param}.source.data must be base64-encoded image bytes`, `${param}.source.data`);
        }
        parts.image(`data:${block.source.media_type};base64,${data}`, 'auto', param);
      }
    });
    out.push({ role: m.role, content: parts.content() });
  });
  return { messages: out, images };
}

/** Refusals of what the prompt cannot hold: thinking enabled, a model without chat. */
function checkPromptFields(body: Pick<CreateMessageBody, 'model' | 'thinking'>, supportsChat: boolean): void {
  if (body.thinking?.type === 'enabled') {
    throw invalidRequest('extended thinking is not served on Messages (send thinking.type "disabled" or leave it out); ' +
      'models that think do so on Responses (reasoning.effort) and Chat Completions (reasoning_effort)',
      'thinking.type', 'unsupported_parameter');
  }
  if (!supportsChat) {
    throw invalidRequest(`the model "${body.model}" does not serve conversations (supports_chat is false); use POST /v1/responses with a string input`,
      'model', 'chat_unsupported');
  }
}

/**
 * output_config (the spec: accepted, shape not shown; Anthropic's is {format, effort}): `format`
 * {type: "json_schema", schema} is served as a structured output (the text block holds JSON valid
 * against the schema, enforced while decoding, as on the other surfaces). Every other key is
 * accepted as the spec says; `effort` has nothing to act on, as the models do not think on Messages.
 */
function outputConfigFormat(config: CreateMessageBody['output_config']): OutputFormat | undefined {
  const format = config?.['format'];
  if (format == null) return undefined;
  const f = format as { type?: unknown; schema?: unknown };
  if (typeof format !== 'object' || Array.isArray(format) || f.type !== 'json_schema') {
    throw invalidRequest('output_config.format must be {"type": "json_schema", "schema": {...}}', 'output_config.format.type');
  }
  if (typeof f.schema !== 'object' || f.schema === null || Array.isArray(f.schema)) {
    throw invalidRequest('output_config.format.schema must be a JSON schema object', 'output_config.format.schema');
  }
  const schema = f.schema as Record<string, unknown>;
  const schemaParam = 'output_config.format.schema';
  // Refused now (400 naming the keyword), before the request is queued or anything billed.
  checkResponseSchema(schema, { strict: false, param: schemaParam });
  return { type: 'json_schema', name: 'output', schema, schemaParam };
}

/**
 * Anthropic's service_tier -> the completion window it asks for: standard_only keeps the request
 * out of the priority (asap) window, so it asks for standard; auto leaves the choice to metadata
 * or the model's default.
 */
const messagesTierWindow = (tier: CreateMessageBody['service_tier']): 'standard' | undefined =>
  (tier === 'standard_only' ? 'standard' : undefined);

export function toMessagesGenerationRequest(body: CreateMessageBody, caller: Caller, supportsChat: boolean): GenerationRequest {
  checkPromptFields(body, supportsChat);
  // Request metadata holds strings only; Anthropic's user_id may come as null (= not given).
  const metadata: Record<string, string> = {};
  for (const [key, value] of Object.entries(body.metadata ?? {})) if (typeof value === 'string') metadata[key] = value;
  const { window, param: windowParam } = requestedWindow(metadata, body.service_tier, messagesTierWindow(body.service_tier));
  const outputFormat = outputConfigFormat(body.output_config);
  if (window === 'flex') {
    throw invalidRequest('completion_window "flex" needs a background request, which Messages does not offer: use POST /v1/responses with background=true',
      'metadata.completion_window');
  }
  const converted = toChatMessages(body);
  const stop = body.stop_sequences ?? [];
  const request: GenerationRequest = {
    caller,
    model: body.model,
    input: { kind: 'messages', messages: converted.messages },
    sampling: {
      ...(body.temperature !== undefined && { temperature: body.temperature }),
      // top_p 0 means "only the most likely token": the engine's smallest nucleus.
      ...(body.top_p !== undefined && { topP: Math.max(body.top_p, Number.MIN_VALUE) }),
      ...(body.top_k !== undefined && { topK: body.top_k }),
      ...(stop.length > 0 && { stop }),
    },
    maxOutputTokens: body.max_tokens,
    maxOutputTokensParam: 'max_tokens',
    background: false,
    metadata,
    // Anthropic's default: no thinking unless asked (and asking is refused above).
    reasoningEffort: 'none',
  };
  if (window !== undefined) request.completionWindow = window;
  if (windowParam !== undefined) request.completionWindowParam = windowParam;
  if (outputFormat !== undefined) request.outputFormat = outputFormat;
  if (converted.images.length > 0) {
    request.images = converted.images;
    request.imageParam = converted.images[0]!.param;
  }
  if (metadata['user_id'] !== undefined) request.user = metadata['user_id'];
  return request;
}

/**
 * The request whose prompt POST /v1/messages/count_tokens counts: the conversation as
 * toMessagesGenerationRequest builds it (same checks, same messages, no thinking), without
 * sampling, limits or metadata, which do not change the prompt.
 */
export function toMessagesCountRequest(body: CountTokensBody, caller: Caller, supportsChat: boolean): GenerationRequest {
  checkPromptFields(body, supportsChat);
  const converted = toChatMessages(body);
  const request: GenerationRequest = {
    caller,
    model: body.model,
    input: { kind: 'messages', messages: converted.messages },
    sampling: {},
    maxOutputTokensParam: 'max_tokens',
    background: false,
    metadata: {},
    reasoningEffort: 'none',
  };
  if (converted.images.length > 0) {
    request.images = converted.images;
    request.imageParam = converted.images[0]!.param;
  }
  return request;
}

/**
 * Anthropic's message object. content always holds one text block, empty text included: the
 * answer, without reasoning a model wrote anyway (gpt-oss always reasons; thinking is not served here).
 */
export function messageObject(id: string, prepared: PreparedGeneration, result: GenerateResult): MessageObject {
  const stopReason = result.finishReason === 'length' ? 'max_tokens'
    : result.stopSequence !== undefined ? 'stop_sequence' : 'end_turn';
  return {
    id,
    type: 'message',
    role: 'assistant',
    content: [{ type: 'text', text: split(prepared.assistant, prepared.promptTokenIds, result).content, citations: null }],
    model: prepared.request.model,
    stop_reason: stopReason,
    stop_sequence: result.stopSequence ?? null,
    usage: {
      // Anthropic's convention: input_tokens excludes what was read from the cache.
      input_tokens: result.usage.promptTokens - result.usage.cachedTokens,
      output_tokens: result.usage.completionTokens,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: result.usage.cachedTokens,
    },
    completion_window: prepared.window,
  };
}

/** Both idempotency headers behave the same; the spec's limit applies to either. */
export const IDEMPOTENCY_HEADERS = ['alt-idempotency-key', 'idempotency-key'] as const;
export const MAX_IDEMPOTENCY_KEY_LENGTH = 255;

/** The call's idempotency key and the header that carried it; undefined without one. */
export interface IdempotencyKey {
  key: string;
  header: string;
}

/** Reads the idempotency headers. Throws 400 naming the header when one is malformed or they disagree. */
export function idempotencyKeyOf(headers: Record<string, string | string[] | undefined>): IdempotencyKey | undefined {
  let found: IdempotencyKey | undefined;
  for (const header of IDEMPOTENCY_HEADERS) {
    const raw = headers[header];
    if (raw === undefined) continue;
    const key = Array.isArray(raw) ? raw.join(', ') : raw;
    if (key.length === 0 || key.length > MAX_IDEMPOTENCY_KEY_LENGTH) {
      throw invalidRequest(`the ${header} header must be 1 to ${MAX_IDEMPOTENCY_KEY_LENGTH} characters (got ${key.length})`, header, 'invalid_idempotency_key');
    }
    if (found !== undefined && found.key !== key) {
      throw invalidRequest(`the ${found.header} and ${header} headers carry different keys; send one of them`, header, 'invalid_idempotency_key');
    }
    found ??= { key, header };
  }
  return found;
}

/** JSON with object keys sorted at every level: equal bodies give equal text whatever the key order. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/** What an idempotency key is bound to: the model and the whole validated body. */
export function requestHash(body: CreateMessageBody): string {
  return createHash('sha256').update(`messages\0${body.model}\0${canonicalJson(body)}`).digest('hex');
}
