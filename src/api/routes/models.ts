// GET /v1/models: the models the caller's organization may use, with its rates.

import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';
import { errorResponses, ModelListSchema } from '../schemas/common.js';

export function registerModelRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.get('/models', {
    schema: {
      summary: 'List the models the caller may use',
      response: { 200: ModelListSchema, 401: errorResponses[401] },
    },
  }, async (request) => ({ object: 'list' as const, data: ctx.registry.listFor(request.caller.orgName) }));
}
