// POST /v1/responses and GET /v1/responses/{id}. Every response is stored (store=false too). A
// foreground response is stored once, when it ends (completed, incomplete, failed, or cancelled
// when its client disconnected), in one transaction with its ledger row (when it ended with a
// result) and its completion webhook delivery (request-end.ts). background=true stores the
// in_progress object, returns it at once, and updates it when the generation ends, so GET shows
// progress (background-responses.ts). No object here carries metadata.webhook_token.

import type { FastifyInstance, FastifyReply } from 'fastify';
import { isSluiceError } from '../../errors.js';
import type { PreparedGeneration } from '../../serving/generation-request.js';
import type { Release } from '../../serving/tenant-limits.js';
import type { ResponseBody, UsageRecord } from '../../store/store.js';
import {
  cancelledResponse, failedResponse, finishedResponse, inProgressResponse, refuseUnsupportedInput, toGenerationRequest,
} from '../../surfaces/responses/adapter.js';
import { newId } from '../../surfaces/content.js';
import type { ApiContext } from '../context.js';
import { disconnectSignal } from '../disconnect.js';
import { serverTiming } from '../server-timing.js';
import { commitRequestEnd } from '../request-end.js';
import { ApiError, invalidRequest, notFound } from '../../surfaces/errors.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import {
  CreateResponseSchema, InputItemsQuerySchema, ResponseIdParamsSchema, ResponseObjectSchema, type CreateResponseBody, type InputItem,
} from '../../surfaces/responses/schema.js';
import { chainItems, inputItems } from '../../surfaces/responses/input-items.js';
import type { Static } from 'typebox';
import { noteUsage } from '../request-log.js';


/**
 * Runs a foreground generation and stores how it ended; resolves with the stored final object.
 * The end is one write: the response, its ledger row when it has a result, its webhook delivery.
 * If that write fails, the client gets a 500, and the response is stored `failed` (unbilled) if
 * the store takes that, so that GET and the callback agree with what the client saw.
 */
async function runToStore(ctx: ApiContext, orgId: string, running: ResponseBody, prepared: PreparedGeneration,
  signal: AbortSignal, reply: FastifyReply, admitted: Release): Promise<ResponseBody> {
  const writeEnd = (body: ResponseBody, usage?: UsageRecord) => commitRequestEnd(ctx.store, ctx.webhooks,
    { response: { orgId, body, kind: 'foreground' }, ...(usage && { usage }) },
    // The stored final object is also the completion webhook's body (the webhooks skip cancelled).
    { orgId, metadata: prepared.request.metadata, body });
  let final: ResponseBody;
  let usage: UsageRecord;
  try {
    const result = await ctx.service.run(prepared, signal, 'foreground', admitted);
    noteUsage(reply.request, [result]);
    reply.header('server-timing', serverTiming([result.timings]));
    final = finishedResponse(running, result, prepared, ctx.service.reasoningSeal);
    usage = ctx.billing.usageRecord({ surface: 'responses', requestId: running.id, prepared, results: [result] });
  } catch (err) {
    if (isSluiceError(err) && err.code === 'cancelled') final = cancelledResponse(running);
    else if (isSluiceError(err) && err.code !== 'engine_error') final = failedResponse(running, err.code, err.message);
    else final = failedResponse(running, 'server_error', 'the engine failed while generating this response');
    await writeEnd(final);
    throw err;
  }
  try {
    await writeEnd(final, usage);
  } catch (err) {
    reply.log.error({ err, response_id: running.id }, 'could not store a finished response; storing it as failed');
    await writeEnd(failedResponse(running, 'server_error', 'the response could not be stored'))
      .catch((again: unknown) => reply.log.error({ err: again, response_id: running.id }, 'could not store a failed response'));
    throw err;
  }
  return final;
}

export function registerResponseRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.post<{ Body: CreateResponseBody }>('/responses', {
    schema: {
      summary: 'Create a response',
      body: CreateResponseSchema,
      response: { 200: ResponseObjectSchema, ...errorResponses },
    },
    preValidation: async (request) => refuseUnsupportedInput(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const model = ctx.registry.resolve(body.model, caller.orgName);
    const items = inputItems(body);
    // A continued conversation: the earlier responses' input and output come first.
    const conversation = body.previous_response_id
      ? { ...body, input: [...await chainItems(ctx.store, caller.orgId, body.previous_response_id), ...items] as InputItem[] }
      : body;
    const prepared = await ctx.service.prepare(toGenerationRequest(conversation, caller, model.supportsChat, ctx.service.reasoningSeal));
    const running = inProgressResponse(newId('resp'), body, prepared);

    if (prepared.request.background) {
      // The organization's limits (src/serving/tenant-limits.ts): 429 before anything is stored,
      // the input items included (stored before the response, so GET .../input_items of an
      // in_progress response finds them).
      ctx.service.limits.checkTokens(caller);
      ctx.service.limits.checkQueuedBackground(caller, ctx.background.numInProgress(caller.orgId));
      await ctx.store.putResponseInput(caller.orgId, running.id, items);
      await ctx.background.start(caller.orgId, running, prepared);
      return running;
    }
    // A foreground request over its organization's limits is a 429 before anything is stored.
    const admitted = ctx.service.admitForeground(caller);
    try {
      await ctx.store.putResponseInput(caller.orgId, running.id, items);
      return await runToStore(ctx, caller.orgId, running, prepared, disconnectSignal(reply), reply, admitted);
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
