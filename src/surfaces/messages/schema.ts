// Schemas of the Messages surface (POST /v1/messages): Anthropic's request and message shapes as
// far as the spec and the served models go.
//
// Unknown-field policy: the top level, messages, content blocks and image sources are closed: an
// unknown field is a 400 naming it. tools / tool_choice are accepted as free objects and never
// reach the model (the spec: accepted and ignored). output_config is accepted as a free object
// (the spec); its format is served as a structured output and its effort checked by the adapter.
// service_tier picks the completion window (standard_only: standard). Block types other than
// text and image are refused before validation with their own message (adapters/messages.ts).
// Blocks and image sources are unions told apart by `type` (discriminatedUnion), so a mistake is
// reported against the type the client meant.

import Type, { type Static } from 'typebox';
import { INT32_MAX, METADATA_LIMITS, discriminatedUnion } from '../common-schema.js';

const Free = Type.Record(Type.String(), Type.Unknown());
const Nullable = <T extends Type.TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

/** Prompt caching is automatic here; a client's cache_control marks are accepted and ignored. */
const CacheControl = Type.Optional(Nullable(Free));

export const ImageSourceSchema = discriminatedUnion([
  Type.Object({
    type: Type.Literal('base64'),
    media_type: Type.Enum(['image/jpeg', 'image/png', 'image/gif', 'image/webp']),
    /** Base64 bytes; the alphabet is checked by the adapter (a clearer message than a pattern's). */
    data: Type.String({ minLength: 1 }),
  }, { additionalProperties: false }),
  Type.Object({ type: Type.Literal('url'), url: Type.String() }, { additionalProperties: false }),
]);

const TextBlockSchema = Type.Object({
  type: Type.Literal('text'),
  text: Type.String(),
  citations: Type.Optional(Nullable(Type.Array(Free))),
  cache_control: CacheControl,
}, { additionalProperties: false });

export const ContentBlockSchema = discriminatedUnion([
  TextBlockSchema,
  Type.Object({ type: Type.Literal('image'), source: ImageSourceSchema, cache_control: CacheControl }, { additionalProperties: false }),
]);

export const MessageParamSchema = Type.Object({
  role: Type.Enum(['user', 'assistant']),
  content: Type.Union([Type.String(), Type.Array(ContentBlockSchema, { minItems: 1 })]),
}, { additionalProperties: false });
export type MessageParam = Static<typeof MessageParamSchema>;

/**
 * The spec's request metadata (string values: completion_window, completion_webhook,
 * webhook_token) plus Anthropic's user_id, which its clients may send as null; the limits of
 * every surface's metadata (METADATA_LIMITS), user_id counted among the keys.
 */
export const MessagesMetadataSchema = Type.Object({
  user_id: Type.Optional(Nullable(Type.String({ maxLength: 256 }))),
}, {
  additionalProperties: Type.String({ maxLength: METADATA_LIMITS.maxValueLength }),
  maxProperties: METADATA_LIMITS.maxKeys,
  propertyNames: { maxLength: METADATA_LIMITS.maxKeyLength },
});

/** Stop sequences per request. */
export const MAX_STOP_SEQUENCES = 16;

export const CreateMessageSchema = Type.Object({
  model: Type.String({ minLength: 1 }),
  max_tokens: Type.Integer({ minimum: 1, maximum: INT32_MAX }),
  messages: Type.Array(MessageParamSchema, { minItems: 1 }),
  system: Type.Optional(Type.Union([Type.String(), Type.Array(discriminatedUnion([TextBlockSchema]))])),
  stop_sequences: Type.Optional(Type.Array(Type.String({ minLength: 1 }), { maxItems: MAX_STOP_SEQUENCES })),
  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  /** At most the model's vocabulary, checked once the model is known (a 400 naming top_k). */
  top_k: Type.Optional(Type.Integer({ minimum: 0, maximum: INT32_MAX })),
  metadata: Type.Optional(MessagesMetadataSchema),
  /** Only false (stream=true gets its own 400 before validation). */
  stream: Type.Optional(Type.Literal(false)),
  /** disabled and adaptive are served (the models never think); enabled is refused by the adapter. */
  thinking: Type.Optional(Type.Object({
    type: Type.Enum(['disabled', 'enabled', 'adaptive']),
    budget_tokens: Type.Optional(Type.Integer({ minimum: 0, maximum: INT32_MAX })),
  }, { additionalProperties: false })),
  /** Accepted (the spec); format {type: json_schema, schema} constrains the answer (adapters/messages.ts). */
  output_config: Type.Optional(Free),
  // Accepted and ignored (the spec): never shown to the model.
  tools: Type.Optional(Type.Array(Free)),
  tool_choice: Type.Optional(Free),
  /** auto: metadata or the model's default picks the window; standard_only: the standard window. */
  service_tier: Type.Optional(Type.Enum(['auto', 'standard_only'])),
}, { additionalProperties: false });
export type CreateMessageBody = Static<typeof CreateMessageSchema>;

/**
 * POST /v1/messages/count_tokens (Anthropic's shape): what reaches the prompt (model, messages,
 * system, thinking) validated exactly as on POST /v1/messages, and the fields accepted there and
 * ignored (tools, tool_choice, output_config). Sampling and limits have no place here.
 */
const create = CreateMessageSchema.properties;
export const CountTokensSchema = Type.Object({
  model: create.model,
  messages: create.messages,
  system: create.system,
  thinking: create.thinking,
  output_config: create.output_config,
  tools: create.tools,
  tool_choice: create.tool_choice,
}, { additionalProperties: false });
export type CountTokensBody = Static<typeof CountTokensSchema>;

export const TokenCountSchema = Type.Object({
  /** Prompt tokens: every token of the rendered conversation, as POST /v1/messages bills them. */
  input_tokens: Type.Integer(),
}, { additionalProperties: false });

export const MessageObjectSchema = Type.Object({
  id: Type.String(),
  type: Type.Literal('message'),
  role: Type.Literal('assistant'),
  content: Type.Array(Type.Object({
    type: Type.Literal('text'),
    text: Type.String(),
    citations: Type.Null(),
  }, { additionalProperties: false }), { minItems: 1 }),
  model: Type.String(),
  stop_reason: Type.Enum(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use', 'refusal']),
  stop_sequence: Nullable(Type.String()),
  usage: Type.Object({
    input_tokens: Type.Integer(),
    output_tokens: Type.Integer(),
    cache_creation_input_tokens: Type.Integer(),
    cache_read_input_tokens: Type.Integer(),
  }, { additionalProperties: false }),
  /** The completion window the request ran in (asap | standard). */
  completion_window: Type.String(),
}, { additionalProperties: false });
export type MessageObject = Static<typeof MessageObjectSchema>;
