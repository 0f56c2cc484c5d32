// POST /v1/messages: Anthropic's Messages shape over the same GenerationService path as the other
// surfaces. Foreground only (no streaming); a client disconnect cancels the generation. Errors
// leave in the spec's envelope ({error: {message, type, param, code}}, nothing else at the top)
// with Anthropic's name for the status as `type` (the plugin's error handler, api/anthropic.ts),
// so its clients raise their typed errors with the message.
//
// POST /v1/messages/count_tokens: the prompt tokens of a Messages request, counted through the
// model's chat template and tokenizer as POST /v1/messages bills them; nothing runs or is billed.
//
// Idempotency: `alt-idempotency-key` and `Idempotency-Key` (same behaviour) bind a key, per
// organization, to a hash of the model and the validated body. The first call runs and its 200
// body is kept; a repeat with the same body gets that body back without generating (header
// `idempotent-replayed: true`); a repeat while the first still runs is 409 idempotency_key_in_use;
// a repeat with a different body is 422 idempotency_key_reused. A call that fails releases its
// key, so a retry runs afresh. A running key is leased to this replica (renewed while it runs);
// when the replica dies, its key is taken over by the first repeat after the lease runs out.
//
// The end is one write: the ledger row together with the key's stored result (the request
// lifecycle's end, serving/lifecycle.ts), so
// a message whose result cannot be stored is a 500, is not billed, and releases its key.

import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Runtime } from '../../runtime.js';
import type { Caller } from '../../serving/generation-request.js';
import { nowSeconds } from '../../surfaces/content.js';
import { idempotencyKeyOf, refuseUnsupportedBlocks, requestHash, toMessagesCountRequest } from '../../surfaces/messages/adapter.js';
import { messagesSurface } from '../../surfaces/messages/surface.js';
import { leaseTerm } from '../../store/leases.js';
import { ApiError } from '../../surfaces/errors.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import {
  CountTokensSchema, MessageObjectSchema, TokenCountSchema, type CountTokensBody, type CreateMessageBody, type MessageObject,
} from '../../surfaces/messages/schema.js';
import { runInRoute } from '../run-in-route.js';

/** The idempotency scope (store key space) of this endpoint. */
const SCOPE = 'messages';

/** Runs the request and writes its end: the ledger row, and the result of `idempotencyKey` if given. */
async function createMessage(ctx: Runtime, body: CreateMessageBody, caller: Caller, request: FastifyRequest, reply: FastifyReply,
  idempotencyKey?: string): Promise<MessageObject> {
  const model = ctx.lifecycle.model(body.model, caller);
  // prepare() refuses images, unpriced windows and over-long requests before the engine runs.
  const prepared = await ctx.lifecycle.prepare(messagesSurface.adapt(body, caller, model).request, model);
  const rendering = messagesSurface.open(body, prepared);
  // A foreground run without a slot admits itself: a 429 before anything is stored.
  const { object, committed } = await runInRoute(ctx, request, reply, {
    prepared, rendering, callback: false, billed: { surface: messagesSurface.usage, requestId: rendering.id },
    end: (message) => idempotencyKey === undefined ? {} : {
      idempotency: { orgId: caller.orgId, scope: SCOPE, key: idempotencyKey, statusCode: 200, body: message, leaseOwner: ctx.lease.owner },
    },
  });
  if (committed.idempotencyLeaseLost) {
    // This replica stalled past the key's lease and another took the key over: its result (one
    // message, one ledger row) is the key's; this one was not stored nor billed.
    throw new ApiError(409, 'conflict_error',
      'this request\'s idempotency key was taken over by another server after this one stalled; retry with the same key to get its result',
      null, 'idempotency_key_in_use');
  }
  return object;
}

/** Registers POST / and POST /count_tokens: the plugin mounts them under /messages, in a scope of their own. */
export function registerMessageRoutes(app: FastifyInstance, ctx: Runtime): void {
  app.post<{ Body: CreateMessageBody }>('/', {
    // POST /v1/messages only, as before the scope: not a second route at /v1/messages/.
    prefixTrailingSlash: 'no-slash',
    schema: {
      summary: 'Create a message',
      body: messagesSurface.schema,
      headers: {
        type: 'object',
        properties: {
          'alt-idempotency-key': { type: 'string', maxLength: 255, description: 'Same as Idempotency-Key.' },
          'idempotency-key': { type: 'string', maxLength: 255, description: 'A repeat with the same key and body replays the first result.' },
        },
      },
      response: {
        200: MessageObjectSchema, ...errorResponses,
        403: ErrorEnvelopeSchema, 409: ErrorEnvelopeSchema, 422: ErrorEnvelopeSchema,
      },
    },
    preValidation: async (request) => messagesSurface.refuse(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const idem = idempotencyKeyOf(request.headers);
    if (idem === undefined) return createMessage(ctx, body, caller, request, reply);

    const begun = await ctx.store.beginIdempotency(caller.orgId, SCOPE, idem.key, requestHash(body), nowSeconds(), leaseTerm(ctx.lease));
    switch (begun.state) {
      case 'done':
        reply.header('idempotent-replayed', 'true');
        return reply.code(begun.statusCode).send(begun.body);
      case 'in_progress':
        throw new ApiError(409, 'conflict_error',
          `a request with this ${idem.header} is still running; retry once it has finished to get its result`,
          idem.header, 'idempotency_key_in_use');
      case 'mismatch':
        throw new ApiError(422, 'invalid_request_error',
          `this ${idem.header} was already used with a different request body; use a new key for a new request`,
          idem.header, 'idempotency_key_reused');
      case 'new':
        break;
    }
    try {
      return await createMessage(ctx, body, caller, request, reply, idem.key);
    } catch (err) {
      await ctx.store.abandonIdempotency(caller.orgId, SCOPE, idem.key, ctx.lease.owner);
      throw err;
    }
  });

  app.post<{ Body: CountTokensBody }>('/count_tokens', {
    schema: {
      summary: 'Count the prompt tokens of a message request',
      body: CountTokensSchema,
      response: { 200: TokenCountSchema, ...errorResponses },
    },
    preValidation: async (request) => refuseUnsupportedBlocks(request.body),
  }, async (request) => {
    const model = ctx.lifecycle.model(request.body.model, request.caller);
    const count = await ctx.service.countPromptTokens(toMessagesCountRequest(request.body, request.caller, model.supportsChat), model);
    return { input_tokens: count };
  });
}
