// POST /v1/responses and GET /v1/responses/{id}. Every response is stored (store=false too). A
// foreground response is stored once, when it ends (completed, incomplete, failed, or cancelled
// when its client disconnected), in one transaction with its ledger row (when it ended with a
// result), its input items and its completion webhook delivery (the request lifecycle's end,
// serving/lifecycle.ts). background=true stores the in_progress object with its input items and
// its job, returns it at once, and updates it when the generation ends, so GET shows progress
// (jobs/background-responses.ts). No object here carries metadata.webhook_token.
//
// A finished response whose end cannot be stored is a 500, and is stored `failed` (unbilled) if the
// store takes that, so that GET and the callback agree with what the client saw.

import type { FastifyInstance } from 'fastify';
import type { Runtime } from '../../runtime.js';
import { responsesSurface } from '../../surfaces/responses/surface.js';
import { ApiError, invalidRequest, notFound } from '../../surfaces/errors.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import {
  InputItemsQuerySchema, ResponseIdParamsSchema, ResponseObjectSchema, type CreateResponseBody, type InputItem,
} from '../../surfaces/responses/schema.js';
import { chainItems, inputItems } from '../../surfaces/responses/input-items.js';
import type { Static } from 'typebox';
import { runInRoute } from '../run-in-route.js';

export function registerResponseRoutes(app: FastifyInstance, ctx: Runtime): void {
  app.post<{ Body: CreateResponseBody }>('/responses', {
    schema: {
      summary: 'Create a response',
      body: responsesSurface.schema,
      response: { 200: ResponseObjectSchema, ...errorResponses },
    },
    preValidation: async (request) => responsesSurface.refuse(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const model = ctx.lifecycle.model(body.model, caller);
    const items = inputItems(body);
    // A continued conversation: the earlier responses' input and output come first.
    const conversation = body.previous_response_id
      ? { ...body, input: [...await chainItems(ctx.store, caller.orgId, body.previous_response_id), ...items] as InputItem[] }
      : body;
    const seal = ctx.service.reasoningSeal;
    const prepared = await ctx.lifecycle.prepare(responsesSurface.adapt(conversation, caller, model, seal).request, model);

    if (prepared.request.background) {
      // The organization's limits (src/serving/tenant-limits.ts): 429 before anything is stored.
      ctx.lifecycle.admit(caller, { mode: 'background', queuedBackground: ctx.background.numInProgress(caller.orgId) });
      const { running } = responsesSurface.open(body, prepared, seal);
      await ctx.background.start(caller.orgId, running, prepared, items);
      return running;
    }
    // A foreground request over its organization's limits is a 429 before anything is stored.
    const admitted = ctx.lifecycle.admit(caller, { mode: 'foreground' });
    try {
      const rendering = responsesSurface.open(body, prepared, seal);
      // The stored final object is also the completion webhook's body (the webhooks skip cancelled).
      const { object } = await runInRoute(ctx, request, reply, {
        prepared, admitted, rendering, callback: true, billed: { surface: responsesSurface.usage, requestId: rendering.id },
        end: (final) => ({ response: { orgId: caller.orgId, body: final, kind: 'foreground', inputItems: items } }),
      });
      return object;
    } finally {
      admitted();
    }
  });

  app.get<{ Params: { response_id: string } }>('/responses/:response_id', {
    schema: {
      summary: 'Retrieve a response',
      params: ResponseIdParamsSchema,
      response: { 200: ResponseObjectSchema, ...errorResponses },
    },
  }, async (request) => {
    const stored = await ctx.store.getResponse(request.caller.orgId, request.params.response_id);
    if (!stored) throw notFound(`no response with id "${request.params.response_id}"`, 'response_id');
    return stored;
  });

  app.get<{ Params: { response_id: string }; Querystring: Static<typeof InputItemsQuerySchema> }>('/responses/:response_id/input_items', {
    schema: {
      summary: "List a response's input items",
      params: ResponseIdParamsSchema,
      querystring: InputItemsQuerySchema,
      response: errorResponses,
    },
  }, async (request) => {
    const { orgId } = request.caller;
    const id = request.params.response_id;
    if (!await ctx.store.getResponse(orgId, id)) throw notFound(`no response with id "${id}"`, 'response_id');
    const all = (await ctx.store.getResponseInput(orgId, id)) ?? [];
    const ordered = request.query.order === 'asc' ? all : [...all].reverse();
    let start = 0;
    if (request.query.after !== undefined) {
      start = ordered.findIndex((item) => item['id'] === request.query.after) + 1;
      if (start === 0) throw notFound(`no input item with id "${request.query.after}" in this response`, 'after');
    }
    const data = ordered.slice(start, start + (request.query.limit ?? 20));
    return {
      object: 'list',
      data,
      first_id: (data[0]?.['id'] as string | undefined) ?? null,
      last_id: (data[data.length - 1]?.['id'] as string | undefined) ?? null,
      has_more: start + data.length < ordered.length,
    };
  });

  app.delete<{ Params: { response_id: string } }>('/responses/:response_id', {
    schema: { summary: 'Delete a response', params: ResponseIdParamsSchema, response: { ...errorResponses, 409: ErrorEnvelopeSchema } },
  }, async (request) => {
    const { orgId } = request.caller;
    const id = request.params.response_id;
    const stored = await ctx.store.getResponse(orgId, id);
    if (!stored) throw notFound(`no response with id "${id}"`, 'response_id');
    if (stored.status === 'in_progress') {
      throw new ApiError(409, 'conflict_error', 'the response is still in progress: cancel it first', 'response_id', 'response_in_progress');
    }
    await ctx.store.deleteResponse(orgId, id);
    return { id, object: 'response', deleted: true };
  });

  // OpenAI's cancel: background responses only. Cancelling a cancelled response returns it again;
  // one that already ended otherwise is a 409.
  app.post<{ Params: { response_id: string } }>('/responses/:response_id/cancel', {
    schema: {
      summary: 'Cancel a background response',
      params: ResponseIdParamsSchema,
      response: { 200: ResponseObjectSchema, ...errorResponses, 409: ErrorEnvelopeSchema },
    },
  }, async (request) => {
    const { orgId } = request.caller;
    const id = request.params.response_id;
    const stored = await ctx.store.getResponse(orgId, id);
    if (!stored) throw notFound(`no response with id "${id}"`, 'response_id');
    if (stored['background'] !== true) {
      throw invalidRequest('only responses created with background=true can be cancelled', 'response_id', 'not_background');
    }
    if (stored.status === 'cancelled') return stored;
    if (stored.status !== 'in_progress') {
      throw new ApiError(409, 'conflict_error', `the response is already ${stored.status} and cannot be cancelled`, 'response_id', 'response_not_cancellable');
    }
    // Wherever it runs (this process, another replica, or a dead one whose lease has not run out).
    const after = await ctx.background.cancel(orgId, id);
    if (!after) throw notFound(`no response with id "${id}"`, 'response_id');
    if (after.status === 'cancelled') return after;
    if (after.status !== 'in_progress') {
      throw new ApiError(409, 'conflict_error', `the response is already ${after.status} and cannot be cancelled`, 'response_id', 'response_not_cancellable');
    }
    // In progress without a job (a store left inconsistent by hand): nothing runs it to stop.
    throw new ApiError(409, 'conflict_error', 'the response could not be cancelled right now; retry shortly', 'response_id', 'response_not_running');
  });
}
