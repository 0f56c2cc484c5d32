// Schemas of the Responses surface (POST /v1/responses, GET /v1/responses/{id}): the spec's
// create-response request and response object. Unknown top-level request fields are accepted (the
// spec); messages and content parts are closed. OpenAI's own request fields are declared here and
// either honoured or refused by the adapter with a 400 naming them (adapters/responses.ts), never
// accepted and dropped.

import Type, { type Static } from 'typebox';
import { ClientJsonSchema, INT32_MAX, MetadataSchema, discriminatedUnion } from '../common-schema.js';

const Free = Type.Record(Type.String(), Type.Unknown());
const Nullable = <T extends Type.TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

/** A content part; output_text is accepted on assistant turns that clients replay. */
export const InputPartSchema = discriminatedUnion([
  Type.Object({ type: Type.Literal('input_text'), text: Type.String() }, { additionalProperties: false }),
  Type.Object({
    type: Type.Literal('input_image'),
    image_url: Type.String(),
    detail: Type.Optional(Type.Enum(['auto', 'low', 'high'])),
  }, { additionalProperties: false }),
  Type.Object({
    type: Type.Literal('output_text'),
    text: Type.String(),
    annotations: Type.Optional(Type.Array(Type.Unknown())),
    logprobs: Type.Optional(Type.Array(Type.Unknown())),
  }, { additionalProperties: false }),
]);

export const InputMessageSchema = Type.Object({
  /** OpenAI's clients may tag message items; "message" is the only item type accepted. */
  type: Type.Optional(Type.Literal('message')),
  role: Type.Enum(['system', 'developer', 'user', 'assistant', 'tool', 'function']),
  content: Type.Union([Type.String(), Type.Array(InputPartSchema, { minItems: 1 })]),
  name: Type.Optional(Type.String()),
  tool_calls: Type.Optional(Type.Array(Free)),
  tool_call_id: Type.Optional(Type.String()),
  function_call: Type.Optional(Free),
  /** Assistant items read back from an earlier response carry these; they are ignored. */
  id: Type.Optional(Type.String()),
  status: Type.Optional(Type.String()),
}, { additionalProperties: false });
export type InputMessage = Static<typeof InputMessageSchema>;

/** A tool call the model made, replayed as input (OpenAI's function_call item). */
export const FunctionCallItemSchema = Type.Object({
  type: Type.Literal('function_call'),
  call_id: Type.String({ minLength: 1, maxLength: 128 }),
  name: Type.String({ minLength: 1, maxLength: 64 }),
  arguments: Type.String(),
  id: Type.Optional(Type.String()),
  status: Type.Optional(Type.String()),
}, { additionalProperties: false });

/** A tool's result for a call (OpenAI's function_call_output item). */
export const FunctionCallOutputItemSchema = Type.Object({
  type: Type.Literal('function_call_output'),
  call_id: Type.String({ minLength: 1, maxLength: 128 }),
  output: Type.String(),
  id: Type.Optional(Type.String()),
  status: Type.Optional(Type.String()),
}, { additionalProperties: false });

/** A reasoning item replayed from an earlier response. */
export const ReasoningItemSchema = Type.Object({
  type: Type.Literal('reasoning'),
  id: Type.Optional(Type.String()),
  summary: Type.Optional(Type.Array(Type.Unknown())),
  content: Type.Optional(Type.Array(Type.Unknown())),
  encrypted_content: Type.Optional(Nullable(Type.String({ maxLength: 1_000_000 }))),
  status: Type.Optional(Type.String()),
}, { additionalProperties: false });

export const InputItemSchema = Type.Union([InputMessageSchema, FunctionCallItemSchema, FunctionCallOutputItemSchema, ReasoningItemSchema]);
export type InputItem = Static<typeof InputItemSchema>;

export const TextFormatSchema = discriminatedUnion([
  Type.Object({ type: Type.Literal('text') }, { additionalProperties: false }),
  Type.Object({
    type: Type.Literal('json_schema'),
    name: Type.String({ minLength: 1, maxLength: 64 }),
    description: Type.Optional(Type.String()),
    schema: Type.Optional(ClientJsonSchema),
    strict: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  }, { additionalProperties: false }),
]);

export const CreateResponseSchema = Type.Object({
  model: Type.String({ minLength: 1 }),
  input: Type.Union([
    Type.String({ minLength: 1 }),
    Type.Array(InputItemSchema, { minItems: 1 }),
    Type.Object({ messages: Type.Array(InputMessageSchema, { minItems: 1 }) }, { additionalProperties: false }),
  ]),
  /** OpenAI's system-prompt field: rendered as a leading developer message. */
  instructions: Type.Optional(Nullable(Type.String())),
  max_output_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: INT32_MAX }))),
  temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 2 }))),
  top_p: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 1 }))),
  text: Type.Optional(Type.Object({
    format: Type.Optional(TextFormatSchema),
    /** Only medium (or null): the models take no length hint; the adapter refuses low and high. */
    verbosity: Type.Optional(Nullable(Type.Enum(['low', 'medium', 'high']))),
  }, { additionalProperties: true })),
  reasoning: Type.Optional(Nullable(Type.Object({
    effort: Type.Optional(Nullable(Type.Enum(['none', 'minimal', 'low', 'medium', 'high', 'xhigh']))),
    /** generate_summary (the spec) and summary (its newer OpenAI name): see the adapter. */
    generate_summary: Type.Optional(Nullable(Type.Enum(['auto', 'concise', 'detailed']))),
    summary: Type.Optional(Nullable(Type.Enum(['auto', 'concise', 'detailed']))),
  }, { additionalProperties: true }))),
  background: Type.Optional(Nullable(Type.Boolean())),
  prompt_cache_key: Type.Optional(Type.String()),
  store: Type.Optional(Nullable(Type.Boolean())),
  /** Continue a conversation: the named response's input and output (and those before it) come first. */
  previous_response_id: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 128 }))),
  /** Function tools (other tool types are refused by the adapter), how the model may use them. */
  tools: Type.Optional(Nullable(Type.Array(Free, { maxItems: 128 }))),
  tool_choice: Type.Optional(Nullable(Type.Union([Type.Enum(['none', 'auto', 'required']), Free]))),
  parallel_tool_calls: Type.Optional(Nullable(Type.Boolean())),
  truncation: Type.Optional(Nullable(Type.Literal('disabled'))),
  /** Only false (stream=true gets its own 400 before validation, worded as on every surface). */
  stream: Type.Optional(Nullable(Type.Literal(false))),
  user: Type.Optional(Type.String({ maxLength: 256 })),
  /** OpenAI's successor of user: the same use here (user wins when both are given). */
  safety_identifier: Type.Optional(Type.String({ maxLength: 256 })),
  /** Extra output: message.output_text.logprobs, and reasoning.encrypted_content (with store=false); others refused by the adapter. */
  include: Type.Optional(Nullable(Type.Array(Type.String(), { maxItems: 16 }))),
  /** Alternatives per output token, with include message.output_text.logprobs. */
  top_logprobs: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: 20 }))),
  /** auto and default: metadata or the model's default picks the window; priority: asap; flex: flex (background only); scale: refused. */
  service_tier: Type.Optional(Nullable(Type.Enum(['auto', 'default', 'flex', 'scale', 'priority']))),
  metadata: Type.Optional(Nullable(MetadataSchema)),
}, { additionalProperties: true });
export type CreateResponseBody = Static<typeof CreateResponseSchema>;

const TokenDetails = Type.Object({ cached_tokens: Type.Integer(), reasoning_tokens: Type.Integer() }, { additionalProperties: true });

export const ResponseUsageSchema = Type.Object({
  input_tokens: Type.Integer(),
  input_tokens_details: TokenDetails,
  output_tokens: Type.Integer(),
  output_tokens_details: TokenDetails,
  total_tokens: Type.Integer(),
}, { additionalProperties: true });

/** For the OpenAPI document and fast serialization; extra fields are allowed, as the spec says. */
export const ResponseObjectSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('response'),
  created_at: Type.Integer(),
  status: Type.Enum(['in_progress', 'completed', 'incomplete', 'failed', 'cancelled']),
  model: Type.String(),
  output: Type.Array(Type.Unknown()),
  error: Nullable(Type.Object({ code: Type.String(), message: Type.String() }, { additionalProperties: true })),
  incomplete_details: Nullable(Type.Object({ reason: Type.String() }, { additionalProperties: true })),
  usage: ResponseUsageSchema,
  metadata: Type.Record(Type.String(), Type.String()),
}, { additionalProperties: true });

export const ResponseIdParamsSchema = Type.Object({ response_id: Type.String({ minLength: 1, maxLength: 128 }) });

export const InputItemsQuerySchema = Type.Object({
  after: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'An item id: list the items after it (in the chosen order).' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 20 })),
  order: Type.Optional(Type.Enum(['asc', 'desc'])),
  include: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())])),
}, { additionalProperties: false });
