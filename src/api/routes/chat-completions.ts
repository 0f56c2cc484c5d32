// POST /v1/chat/completions: OpenAI's Chat Completions shape over the same GenerationService path
// as Responses. Foreground only (no background, no streaming); nothing is stored but the ledger row
// and a completion webhook delivery when metadata asks for one, written in one transaction
// (request-end.ts): a completion whose end cannot be stored is a 500 and is not billed. n > 1 runs
// the choices concurrently (the batcher serves them together); a client disconnect cancels them all.

import type { FastifyInstance } from 'fastify';
import type { GenerateResult } from '../../engine/request.js';
import {
  chatCompletion, choicesOf, completionId, refuseUnsupportedChatInput, systemFingerprint, toChatGenerationRequest,
} from '../../surfaces/chat/adapter.js';
import { nowSeconds } from '../../surfaces/content.js';
import type { ApiContext } from '../context.js';
import { disconnectSignal } from '../disconnect.js';
import { serverTiming } from '../server-timing.js';
import { commitRequestEnd } from '../request-end.js';
import {
  ChatCompletionSchema, CreateChatCompletionSchema, type CreateChatCompletionBody,
} from '../../surfaces/chat/schema.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import { failedChatCompletion } from '../../webhooks/events.js';
import { noteUsage } from '../request-log.js';

export function registerChatCompletionRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.post<{ Body: CreateChatCompletionBody }>('/chat/completions', {
    schema: {
      summary: 'Create a chat completion',
      body: CreateChatCompletionSchema,
      response: { 200: ChatCompletionSchema, ...errorResponses, 403: ErrorEnvelopeSchema },
    },
    preValidation: async (request) => refuseUnsupportedChatInput(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const model = ctx.registry.resolve(body.model, caller.orgName);
    const { request: generation, n } = toChatGenerationRequest(body, caller, model.supportsChat);
    // prepare() refuses images, unpriced windows and over-long requests before the engine runs.
    const prepared = await ctx.service.prepare(generation);
    // Over its organization's limits: a 429 before an id exists (no callback, nothing stored).
    const admitted = ctx.service.admitForeground(caller, n);
    const created = nowSeconds();
    const id = completionId();
    let results: GenerateResult[];
    try {
      results = await ctx.service.runChoices(choicesOf(prepared, n), disconnectSignal(reply), 'foreground', admitted);
    } catch (err) {
      // A failed generation still sends its completion webhook (events.ts says with what body).
      const failed = failedChatCompletion({ id, created, model: prepared.request.model }, err);
      if (failed) {
        await commitRequestEnd(ctx.store, ctx.webhooks, {}, { orgId: caller.orgId, metadata: body.metadata, body: failed })
          .catch((stored: unknown) => request.log.error({ err: stored, id }, 'could not store the webhook delivery of a failed chat completion'));
      }
      throw err;
    } finally {
      admitted();
    }
    noteUsage(request, results);
    reply.header('server-timing', serverTiming(results.map((r) => r.timings)));
    const completion = chatCompletion({
      id,
      created,
      fingerprint: systemFingerprint(ctx.service.modelOf(prepared)),
      prepared,
      results,
    });
    // Chat has no GET: the callback carries the chat.completion object this reply returns.
    await commitRequestEnd(ctx.store, ctx.webhooks,
      { usage: ctx.billing.usageRecord({ surface: 'chat.completions', requestId: id, prepared, results }) },
      { orgId: caller.orgId, metadata: body.metadata, body: completion });
    return completion;
  });
}
