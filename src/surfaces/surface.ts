// A surface is one of the spec's request shapes (Responses, Chat Completions, Messages) as a value:
// its schema, the refusals it makes before the schema would, body -> GenerationRequest, and the
// objects a request's outcome renders to (finished, failed). HTTP routes bind a surface to fastify;
// batch lines run the same value (surfaces.ts); neither knows another surface's shapes.

import type { TSchema } from 'typebox';
import type { UsageSurface } from '../serving/lifecycle.js';
import type { Caller, GenerationRequest, PreparedGeneration } from '../serving/generation-request.js';
import type { EndObject, Rendering } from '../serving/lifecycle.js';
import type { ServedModel } from '../serving/model-registry.js';
import type { ReasoningSeal } from '../serving/reasoning-seal.js';
import type { ErrorEnvelope } from './errors.js';

export type SurfacePath = '/v1/responses' | '/v1/chat/completions' | '/v1/messages';

/** What a surface adapts a body into: one request, and how many choices to run on it. */
export interface Adapted {
  request: GenerationRequest;
  n: number;
}

/** One request's outcome renderer, with the id its objects (and its ledger row) carry. */
export interface SurfaceRendering<Out extends EndObject> extends Rendering<Out> {
  readonly id: string;
}

export interface Surface<Body = unknown, Out extends EndObject = EndObject> {
  readonly path: SurfacePath;
  /** The ledger's name for requests of this surface. */
  readonly usage: UsageSurface;
  /** The create body's TypeBox schema (validation, types, OpenAPI). */
  readonly schema: TSchema;
  /** Clear 400s before schema validation would report a mismatch (stream=true, refused part kinds...). */
  refuse(body: unknown): void;
  /** Validated body -> the internal request; `model` is body.model resolved for the caller. */
  adapt(body: Body, caller: Caller, model: ServedModel, seal?: ReasoningSeal): Adapted;
  /** The renderer of this request's outcome (a new id). */
  open(body: Body, prepared: PreparedGeneration, seal?: ReasoningSeal): SurfaceRendering<Out>;
  /** The error envelope this surface answers with (Messages: Anthropic's type names inside the spec's envelope). */
  envelope(status: number, body: ErrorEnvelope): ErrorEnvelope;
}
