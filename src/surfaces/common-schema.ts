// Schemas shared by several surfaces: the error envelope, request metadata, the model object.

import Type, { type Static, type TSchema } from 'typebox';
import { LongContextPricingSchema, ModelPriceSchema } from '../config/catalog.js';

/**
 * Token counts and top_k cross into the engine as 32-bit integers: a larger value is refused by
 * the schema, never wrapped (the model's own limits, context length and vocabulary, come later).
 */
export const INT32_MAX = 2 ** 31 - 1;

export const ErrorEnvelopeSchema = Type.Object({
  error: Type.Object({
    message: Type.String(),
    type: Type.String(),
    param: Type.Union([Type.String(), Type.Null()]),
    code: Type.Union([Type.String(), Type.Integer(), Type.Null()]),
  }, { additionalProperties: true }),
}, { additionalProperties: false, $id: 'ErrorEnvelope' });

/** Error responses every authenticated route may give, for the OpenAPI document. */
export const errorResponses = {
  400: ErrorEnvelopeSchema,
  401: ErrorEnvelopeSchema,
  404: ErrorEnvelopeSchema,
} as const;

/** OpenAI's metadata limits, applied to every surface's request metadata and to batches. */
export const METADATA_LIMITS = { maxKeys: 16, maxKeyLength: 64, maxValueLength: 512 } as const;

/** Request metadata: string values only; completion_window, completion_webhook, webhook_token have meaning. */
export const MetadataSchema = Type.Record(Type.String(), Type.String({ maxLength: METADATA_LIMITS.maxValueLength }), {
  maxProperties: METADATA_LIMITS.maxKeys,
  propertyNames: { maxLength: METADATA_LIMITS.maxKeyLength },
  description: `At most ${METADATA_LIMITS.maxKeys} string values, keys up to ${METADATA_LIMITS.maxKeyLength} and values up to `
    + `${METADATA_LIMITS.maxValueLength} characters. completion_window (asap | standard | flex), completion_webhook (http(s) URL), webhook_token.`,
});

/** Bounds of a JSON schema a request sends (text.format.schema, response_format.json_schema.schema). */
export const JSON_SCHEMA_LIMITS = { maxDepth: 32, maxLength: 100_000 } as const;

/** A JSON schema sent by the client: any object, within JSON_SCHEMA_LIMITS (validation.ts, `x-json-limits`). */
export const ClientJsonSchema = Type.Record(Type.String(), Type.Unknown(), {
  'x-json-limits': JSON_SCHEMA_LIMITS,
  description: `A JSON schema: at most ${JSON_SCHEMA_LIMITS.maxDepth} levels deep and ${JSON_SCHEMA_LIMITS.maxLength} characters as JSON.`,
});

/** The spec's Model object: these fields and no other (restricted, long_context_pricing only where they apply). */
export const ModelSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('model'),
  name: Type.String(),
  context_length: Type.Integer(),
  supports_chat: Type.Boolean(),
  supports_image_input: Type.Boolean(),
  supports_tools: Type.Boolean(),
  restricted: Type.Optional(Type.Boolean()),
  pricing: Type.Array(ModelPriceSchema),
  long_context_pricing: Type.Optional(LongContextPricingSchema),
}, { additionalProperties: false });

export const ModelListSchema = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(ModelSchema),
}, { additionalProperties: false });

/**
 * A union of objects told apart by their `type` property, validated as an OpenAPI discriminated
 * oneOf: ajv checks only the branch the tag names, so a client error is reported against the
 * branch the client meant, and an unknown tag lists the known ones.
 */
export function discriminatedUnion<T extends TSchema[]>(branches: [...T]) {
  return Type.Unsafe<Static<T[number]>>({ oneOf: branches, discriminator: { propertyName: 'type' } });
}
