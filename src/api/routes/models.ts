// GET /v1/models: the models the caller's organization may use, with its rates. GET
// /v1/models/{model} (OpenAI's retrieve) returns one of them; a model the organization cannot
// see is 404 there, as if it did not exist.
//
// One shape for every client, whatever its headers (an `anthropic-version` one included): the
// spec's Model object, its fields and no other. The response schemas serialize it, so a field the
// registry might add never leaks.

import type { FastifyInstance } from 'fastify';
import Type from 'typebox';
import type { Runtime } from '../../runtime.js';
import { notFound } from '../../surfaces/errors.js';
import { errorResponses, ModelListSchema, ModelSchema } from '../../surfaces/common-schema.js';

export function registerModelRoutes(app: FastifyInstance, ctx: Runtime): void {
  app.get('/models', {
    schema: {
      summary: 'List the models the caller may use',
      response: { 200: ModelListSchema, 401: errorResponses[401] },
    },
  }, async (request) => ({ object: 'list' as const, data: ctx.registry.listFor(request.caller.orgName) }));

  app.get<{ Params: { model: string } }>('/models/:model', {
    schema: {
      summary: 'Retrieve one model',
      params: Type.Object({ model: Type.String({ minLength: 1 }) }),
      response: { 200: ModelSchema, ...errorResponses },
    },
  }, async (request) => {
    const model = ctx.registry.listFor(request.caller.orgName).find((m) => m.id === request.params.model);
    if (!model) throw notFound(`the model "${request.params.model}" does not exist; GET /v1/models lists the available ones`, 'model', 'model_not_found');
    return model;
  });
}
