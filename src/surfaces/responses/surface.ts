// The Responses surface as a value (surface.ts): POST /v1/responses bodies, in a route or a batch line.

import { isSluiceError } from '../../errors.js';
import type { GenerateResult } from '../../engine/request.js';
import type { PreparedGeneration } from '../../serving/generation-request.js';
import type { ReasoningSeal } from '../../serving/reasoning-seal.js';
import type { ResponseBody } from '../../store/store.js';
import { newId } from '../content.js';
import type { Surface, SurfaceRendering } from '../surface.js';
import {
  cancelledResponse, failedResponse, finishedResponse, inProgressResponse, refuseUnsupportedInput, toGenerationRequest,
} from './adapter.js';
import { CreateResponseSchema, type CreateResponseBody } from './schema.js';

export interface ResponseRendering extends SurfaceRendering<ResponseBody> {
  /** The in_progress object: stored at once by a background request, the base of every end. */
  readonly running: ResponseBody;
}

/** The failed Response for an error: cancelled, the error's own code, or a server error. */
export function failedResponseFor(running: ResponseBody, err: unknown): ResponseBody {
  if (isSluiceError(err) && err.code === 'cancelled') return cancelledResponse(running);
  if (isSluiceError(err) && err.code !== 'engine_error') return failedResponse(running, err.code, err.message);
  return failedResponse(running, 'server_error', 'the engine failed while generating this response');
}

/** Renders the outcome of the response `running` (as created, or as stored by a background request). */
export function responseRendering(running: ResponseBody, prepared: PreparedGeneration, seal?: ReasoningSeal): ResponseRendering {
  return {
    id: running.id,
    running,
    render: (results: GenerateResult[]) => finishedResponse(running, results[0]!, prepared, seal),
    failed: (err, stage) => stage === 'end'
      ? failedResponse(running, 'server_error', 'the response could not be stored')
      : failedResponseFor(running, err),
  };
}

export interface ResponsesSurface extends Surface<CreateResponseBody, ResponseBody> {
  open(body: CreateResponseBody, prepared: PreparedGeneration, seal?: ReasoningSeal): ResponseRendering;
}

export const responsesSurface: ResponsesSurface = {
  path: '/v1/responses',
  usage: 'responses',
  schema: CreateResponseSchema,
  refuse: refuseUnsupportedInput,
  adapt: (body, caller, model, seal) => ({ request: toGenerationRequest(body, caller, model.supportsChat, seal), n: 1 }),
  open: (body, prepared, seal) => responseRendering(inProgressResponse(newId('resp'), body, prepared), prepared, seal),
  envelope: (_status, body) => body,
};
