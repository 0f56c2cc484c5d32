// POST /v1/chat/completions: OpenAI's Chat Completions shape over the same GenerationService path
// as Responses. Foreground only (no background, no streaming); nothing is stored but a completion
// webhook delivery when metadata asks for one. n > 1 runs the choices concurrently (the batcher
// serves them together); a client disconnect cancels them all.

import type { FastifyInstance } from 'fastify';
import type { GenerateResult } from '../../engine/request.js';
import {
  chatCompletion, choicesOf, completionId, refuseUnsupportedChatInput, systemFingerprint, toChatGenerationRequest,
} from '../adapters/chat-completions.js';
import { nowSeconds } from '../adapters/content.js';
import type { ApiContext } from '../context.js';
import { disconnectSignal } from '../disconnect.js';
import {
  ChatCompletionSchema, CreateChatCompletionSchema, type CreateChatCompletionBody,
} from '../schemas/chat-completions.js';
import { ErrorEnvelopeSchema, errorResponses } from '../schemas/common.js';
import { failedChatCompletion } from '../../webhooks/events.js';

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
    const created = nowSeconds();
    const id = completionId();
    let results: GenerateResult[];
    try {
      results = await ctx.service.runChoices(choicesOf(prepared, n), disconnectSignal(reply));
    } catch (err) {
      // A failed generation still sends its completion webhook (events.ts says with what body).
      const failed = failedChatCompletion({ id, created, model: prepared.request.model }, err);
      if (failed) await ctx.webhooks?.enqueue(caller.orgId, body.metadata, failed);
      throw err;
    }
    await ctx.billing.record({ surface: 'chat.completions', requestId: id, prepared, results });
    const completion = chatCompletion({
      id,
      created,
      fingerprint: systemFingerprint(ctx.service.modelOf(prepared)),
      prepared,
      results,
    });
    // Chat has no GET: the callback carries the chat.completion object this reply returns.
    await ctx.webhooks?.enqueue(caller.orgId, body.metadata, completion);
    return completion;
  });
}
