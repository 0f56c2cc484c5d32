// GET /v1/models: the models the caller's organization may use, with its rates. GET
// /v1/models/{model} (OpenAI's retrieve) returns one of them; a model the organization cannot
// see is 404 there, as if it did not exist.
//
// Anthropic's clients list models at the same path: a request with an `anthropic-version` header
// gets Anthropic's shapes instead ({type: "model", id, display_name, created_at}, in pages of
// `limit` after `after_id` or before `before_id`). Errors keep the spec's envelope here.

import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import Type, { type Static } from 'typebox';
import type { ModelObject } from '../../serving/model-registry.js';
import { isAnthropicClient } from '../anthropic.js';
import type { ApiContext } from '../context.js';
import { invalidRequest, notFound } from '../errors.js';
import {
  AnthropicModelListSchema, AnthropicModelSchema, errorResponses, ModelListSchema, ModelSchema,
} from '../schemas/common.js';

/** Anthropic's default and largest page. */
const DEFAULT_PAGE = 20;
const MAX_PAGE = 1000;

const ListQuerySchema = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_PAGE, description: `Anthropic shape only: models per page (default ${DEFAULT_PAGE}).` })),
  after_id: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'Anthropic shape only: the page after this model.' })),
  before_id: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'Anthropic shape only: the page before this model.' })),
});
type ListQuery = Static<typeof ListQuerySchema>;

const AnthropicHeaders = {
  type: 'object',
  properties: {
    'anthropic-version': { type: 'string', description: 'Present (as Anthropic clients send it): the answer has Anthropic\'s shape.' },
  },
} as const;

type AnthropicModel = Static<typeof AnthropicModelSchema>;

function anthropicModel(model: ModelObject): AnthropicModel {
  return {
    type: 'model',
    id: model.id,
    display_name: model.name,
    // Whole seconds: 2026-01-02T03:04:05Z.
    created_at: new Date(model.created * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z'),
  };
}

/** Sends an Anthropic-shaped body: built field by field above, so plain JSON serialization leaks nothing. */
function sendAnthropic(reply: FastifyReply, body: unknown): FastifyReply {
  return reply.type('application/json; charset=utf-8').serializer((payload: unknown) => JSON.stringify(payload)).send(body);
}

/** Anthropic's cursor paging over the organization's models, in catalog order. */
export function anthropicPage(models: ModelObject[], query: ListQuery): Static<typeof AnthropicModelListSchema> {
  const limit = query.limit ?? DEFAULT_PAGE;
  if (query.after_id !== undefined && query.before_id !== undefined) {
    throw invalidRequest('give after_id or before_id, not both', 'before_id');
  }
  const indexOf = (id: string, param: string) => {
    const i = models.findIndex((m) => m.id === id);
    if (i < 0) throw invalidRequest(`${param} "${id}" is not a model you can list`, param);
    return i;
  };
  let start: number;
  let end: number;
  let hasMore: boolean;
  if (query.before_id !== undefined) {
    end = indexOf(query.before_id, 'before_id');
    start = Math.max(0, end - limit);
    hasMore = start > 0;
  } else {
    start = query.after_id === undefined ? 0 : indexOf(query.after_id, 'after_id') + 1;
    end = Math.min(models.length, start + limit);
    hasMore = end < models.length;
  }
  const data = models.slice(start, end).map(anthropicModel);
  return { data, has_more: hasMore, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null };
}

export function registerModelRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.get<{ Querystring: ListQuery }>('/models', {
    schema: {
      summary: 'List the models the caller may use',
      description: 'With an anthropic-version header: Anthropic\'s page {data: [{type, id, display_name, created_at}], has_more, first_id, last_id}.',
      headers: AnthropicHeaders,
      querystring: ListQuerySchema,
      response: { 200: ModelListSchema, 400: errorResponses[400], 401: errorResponses[401] },
    },
  }, async (request: FastifyRequest<{ Querystring: ListQuery }>, reply) => {
    const models = ctx.registry.listFor(request.caller.orgName);
    if (isAnthropicClient(request.headers)) return sendAnthropic(reply, anthropicPage(models, request.query));
    return { object: 'list' as const, data: models };
  });

  app.get<{ Params: { model: string } }>('/models/:model', {
    schema: {
      summary: 'Retrieve one model',
      description: 'With an anthropic-version header: Anthropic\'s model object {type, id, display_name, created_at}.',
      headers: AnthropicHeaders,
      params: Type.Object({ model: Type.String({ minLength: 1 }) }),
      response: { 200: ModelSchema, ...errorResponses },
    },
  }, async (request, reply) => {
    const model = ctx.registry.listFor(request.caller.orgName).find((m) => m.id === request.params.model);
    if (!model) throw notFound(`the model "${request.params.model}" does not exist; GET /v1/models lists the available ones`, 'model', 'model_not_found');
    if (isAnthropicClient(request.headers)) return sendAnthropic(reply, anthropicModel(model));
    return model;
  });
}
