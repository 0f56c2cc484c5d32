// Schemas shared by several surfaces: the error envelope, request metadata, the model object.

import Type, { type Static, type TSchema } from 'typebox';
import { LongContextPricingSchema, ModelPriceSchema } from '../../config/catalog.js';

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

/** Request metadata: string values only; completion_window, completion_webhook, webhook_token have meaning. */
export const MetadataSchema = Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 4096 }), {
  description: 'String values. completion_window (asap | standard | flex), completion_webhook (http(s) URL), webhook_token.',
});

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
