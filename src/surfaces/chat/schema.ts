// Schemas of the Chat Completions surface (POST /v1/chat/completions): the spec's request fields,
// the usual OpenAI fields, and the chat.completion object.
//
// Unknown-field policy: the top level is closed. A field the service does not know is a 400
// naming it ("x is not a recognised field here") rather than being ignored, because a silently
// ignored parameter (say, a penalty) changes results without telling the caller. Every OpenAI
// field listed below is either honoured (service_tier picks the completion window; modalities
// ["text"] is what is served anyway), or checked by the adapter and refused with a 400 naming it
// when it asks for something the service cannot do (stream, store=true, service_tier flex or
// scale, penalties, logit_bias, the deprecated functions). OpenAI fields the service knows but
// cannot honour at all (audio, prediction, web_search_options) get their own message from the
// adapter.
//
// Messages and content parts are closed too (the spec: no extra fields in a message). Parts and
// response_format are unions told apart by `type` (discriminatedUnion), so a mistake is reported
// against the type the client meant.

import Type, { type Static } from 'typebox';
import { ClientJsonSchema, discriminatedUnion, INT32_MAX, MetadataSchema } from '../common-schema.js';

const Free = Type.Record(Type.String(), Type.Unknown());
const Nullable = <T extends Type.TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

export const ChatContentPartSchema = discriminatedUnion([
  Type.Object({ type: Type.Literal('text'), text: Type.String() }, { additionalProperties: false }),
  Type.Object({
    type: Type.Literal('image_url'),
    image_url: Type.Object({
      url: Type.String(),
      detail: Type.Optional(Type.Enum(['auto', 'low', 'high'])),
    }, { additionalProperties: false }),
  }, { additionalProperties: false }),
]);
export type ChatContentPart = Static<typeof ChatContentPartSchema>;

export const ChatMessageSchema = Type.Object({
  role: Type.Enum(['system', 'developer', 'user', 'assistant', 'tool', 'function']),
  /** null or absent only on assistant turns (those that carried tool calls). */
  content: Type.Optional(Nullable(Type.Union([Type.String(), Type.Array(ChatContentPartSchema, { minItems: 1 })]))),
  name: Type.Optional(Type.String()),
  tool_calls: Type.Optional(Type.Array(Free)),
  tool_call_id: Type.Optional(Type.String()),
  function_call: Type.Optional(Nullable(Free)),
  /** An assistant turn's reasoning (vLLM's field), given back to templates that render it. */
  reasoning_content: Type.Optional(Nullable(Type.String())),
  // An assistant message read back from our own response carries these; accepted and ignored.
  refusal: Type.Optional(Nullable(Type.String())),
  annotations: Type.Optional(Type.Array(Type.Unknown())),
}, { additionalProperties: false });
export type ChatMessageParam = Static<typeof ChatMessageSchema>;

export const ResponseFormatSchema = discriminatedUnion([
  Type.Object({ type: Type.Literal('text') }, { additionalProperties: false }),
  Type.Object({ type: Type.Literal('json_object') }, { additionalProperties: false }),
  Type.Object({
    type: Type.Literal('json_schema'),
    json_schema: Type.Object({
      name: Type.String({ minLength: 1, maxLength: 64 }),
      description: Type.Optional(Type.String()),
      schema: Type.Optional(ClientJsonSchema),
      strict: Type.Optional(Nullable(Type.Boolean())),
    }, { additionalProperties: false }),
  }, { additionalProperties: false }),
]);

/** Most choices per request (n); they run concurrently. */
export const MAX_CHOICES = 8;
/** Stop strings per request, as OpenAI. */
export const MAX_STOP_STRINGS = 4;
const INT64 = { minimum: -(2 ** 63), maximum: 2 ** 63 - 1 };

export const CreateChatCompletionSchema = Type.Object({
  model: Type.String({ minLength: 1 }),
  messages: Type.Array(ChatMessageSchema, { minItems: 1 }),
  temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 2 }))),
  top_p: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 1 }))),
  max_completion_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: INT32_MAX }))),
  /** Deprecated alias of max_completion_tokens; both given must agree. */
  max_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: INT32_MAX }))),
  response_format: Type.Optional(Nullable(ResponseFormatSchema)),
  /** At most MAX_STOP_STRINGS, checked by the adapter (a clearer message than the union's). */
  stop: Type.Optional(Nullable(Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }))]))),
  seed: Type.Optional(Nullable(Type.Integer(INT64))),
  n: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_CHOICES }))),
  logprobs: Type.Optional(Nullable(Type.Boolean())),
  top_logprobs: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: 20 }))),
  user: Type.Optional(Type.String({ maxLength: 256 })),
  safety_identifier: Type.Optional(Type.String({ maxLength: 256 })),
  prompt_cache_key: Type.Optional(Type.String()),
  metadata: Type.Optional(Nullable(MetadataSchema)),
  /** Only 0 (or null) is served: the engine's sampler has no penalties. */
  presence_penalty: Type.Optional(Nullable(Type.Number({ minimum: -2, maximum: 2 }))),
  frequency_penalty: Type.Optional(Nullable(Type.Number({ minimum: -2, maximum: 2 }))),
  /** Only an empty map is served. */
  logit_bias: Type.Optional(Nullable(Type.Record(Type.String(), Type.Number({ minimum: -100, maximum: 100 })))),
  /** Only false; stream_options only null (it is meaningful with stream=true alone). */
  stream: Type.Optional(Nullable(Type.Boolean())),
  stream_options: Type.Optional(Nullable(Free)),
  /** Function tools, on models whose template renders them (supports_tools); checked by the adapter. */
  tools: Type.Optional(Nullable(Type.Array(Free, { maxItems: 128 }))),
  tool_choice: Type.Optional(Nullable(Type.Union([Type.String(), Free]))),
  parallel_tool_calls: Type.Optional(Nullable(Type.Boolean())),
  /** The deprecated forms of tools: refused by the adapter with a pointer to tools. */
  functions: Type.Optional(Nullable(Type.Array(Free))),
  function_call: Type.Optional(Nullable(Type.Union([Type.String(), Free]))),
  /** auto and default: the window metadata or the model's default picks; priority: asap; flex and scale: refused. */
  service_tier: Type.Optional(Nullable(Type.Enum(['auto', 'default', 'flex', 'scale', 'priority']))),
  /** Only false (or null): chat completions are not stored for retrieval. */
  store: Type.Optional(Nullable(Type.Boolean())),
  reasoning_effort: Type.Optional(Nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high', 'xhigh']))),
  modalities: Type.Optional(Nullable(Type.Array(Type.Literal('text')))),
  // Known OpenAI fields that cannot be served; the adapter refuses them with their own message.
  audio: Type.Optional(Type.Unknown()),
  prediction: Type.Optional(Type.Unknown()),
  web_search_options: Type.Optional(Type.Unknown()),
}, { additionalProperties: false });
export type CreateChatCompletionBody = Static<typeof CreateChatCompletionSchema>;

const TopLogprobSchema = Type.Object({
  token: Type.String(),
  logprob: Type.Number(),
  bytes: Nullable(Type.Array(Type.Integer())),
}, { additionalProperties: false });

const TokenLogprobSchema = Type.Object({
  token: Type.String(),
  logprob: Type.Number(),
  bytes: Nullable(Type.Array(Type.Integer())),
  top_logprobs: Type.Array(TopLogprobSchema),
}, { additionalProperties: false });

export const ChatChoiceSchema = Type.Object({
  index: Type.Integer(),
  message: Type.Object({
    role: Type.Literal('assistant'),
    content: Nullable(Type.String()),
    refusal: Type.Null(),
    reasoning_content: Type.Optional(Type.String()),
    tool_calls: Type.Optional(Type.Array(Type.Object({
      id: Type.String(),
      type: Type.Literal('function'),
      function: Type.Object({ name: Type.String(), arguments: Type.String() }, { additionalProperties: false }),
    }, { additionalProperties: false }))),
  }, { additionalProperties: false }),
  logprobs: Nullable(Type.Object({
    content: Nullable(Type.Array(TokenLogprobSchema)),
    refusal: Type.Null(),
  }, { additionalProperties: false })),
  finish_reason: Type.Enum(['stop', 'length', 'tool_calls']),
}, { additionalProperties: false });
export type ChatChoice = Static<typeof ChatChoiceSchema>;

/** The chat.completion object. Extra top-level fields (completion_window) are ours. */
export const ChatCompletionSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('chat.completion'),
  created: Type.Integer(),
  model: Type.String(),
  system_fingerprint: Type.String(),
  choices: Type.Array(ChatChoiceSchema),
  usage: Type.Object({
    prompt_tokens: Type.Integer(),
    completion_tokens: Type.Integer(),
    total_tokens: Type.Integer(),
    prompt_tokens_details: Type.Object({ cached_tokens: Type.Integer() }, { additionalProperties: true }),
    completion_tokens_details: Type.Object({ reasoning_tokens: Type.Integer() }, { additionalProperties: true }),
  }, { additionalProperties: false }),
  /** The completion window the request ran in (asap | standard). */
  completion_window: Type.String(),
}, { additionalProperties: false });
export type ChatCompletion = Static<typeof ChatCompletionSchema>;
