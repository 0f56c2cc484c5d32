// POST /v1/chat/completions: the Chat Completions surface (surfaces/chat/) bound to HTTP, over the
// one request lifecycle (serving/lifecycle.ts). Foreground only (no background, no streaming);
// nothing is stored but the ledger row and a completion webhook delivery when metadata asks for
// one, written in one transaction (the lifecycle's end): a completion whose end cannot be stored
// is a 500 and is not billed. n > 1 runs
// the choices concurrently (the batcher serves them together); a client disconnect cancels them all.

import type { FastifyInstance } from 'fastify';
import type { Runtime } from '../../runtime.js';
import { chatSurface } from '../../surfaces/chat/surface.js';
import { ChatCompletionSchema, type CreateChatCompletionBody } from '../../surfaces/chat/schema.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import { runInRoute } from '../run-in-route.js';

export function registerChatCompletionRoutes(app: FastifyInstance, ctx: Runtime): void {
  app.post<{ Body: CreateChatCompletionBody }>('/chat/completions', {
    schema: {
      summary: 'Create a chat completion',
      body: chatSurface.schema,
      response: { 200: ChatCompletionSchema, ...errorResponses, 403: ErrorEnvelopeSchema },
    },
    preValidation: async (request) => chatSurface.refuse(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const model = ctx.lifecycle.model(body.model, caller);
    const { request: generation, n } = chatSurface.adapt(body, caller, model);
    // prepare() refuses images, unpriced windows and over-long requests before the engine runs.
    const prepared = await ctx.lifecycle.prepare(generation, model);
    // Over its organization's limits: a 429 before an id exists (no callback, nothing stored).
    const admitted = ctx.lifecycle.admit(caller, { mode: 'foreground', n });
    try {
      const rendering = chatSurface.open(body, prepared);
      // Chat has no GET: the callback carries the chat.completion object this reply returns (a
      // failed generation's callback, the failed object: webhooks/events.ts).
      const { object } = await runInRoute(ctx, request, reply, {
        prepared, n, admitted, rendering, callback: true, billed: { surface: chatSurface.usage, requestId: rendering.id },
        end: () => ({}),
      });
      return object;
    } finally {
      admitted();
    }
  });
}
