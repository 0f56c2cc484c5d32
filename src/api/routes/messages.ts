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
// The end is one write: the ledger row together with the key's stored result (request-end.ts), so
// a message whose result cannot be stored is a 500, is not billed, and releases its key.

import type { FastifyInstance, FastifyReply } from 'fastify';
import type { Caller } from '../../serving/generation-request.js';
import { newId, nowSeconds } from '../../surfaces/content.js';
import {
  idempotencyKeyOf, messageObject, refuseUnsupportedBlocks, refuseUnsupportedMessageInput, requestHash, toMessagesCountRequest,
  toMessagesGenerationRequest,
} from '../../surfaces/messages/adapter.js';
import type { ApiContext } from '../context.js';
import { disconnectSignal } from '../disconnect.js';
import { commitRequestEnd } from '../request-end.js';
import { leaseTerm } from '../../store/leases.js';
import { ApiError } from '../../surfaces/errors.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';
import {
  CountTokensSchema, CreateMessageSchema, MessageObjectSchema, TokenCountSchema,
  type CountTokensBody, type CreateMessageBody, type MessageObject,
} from '../../surfaces/messages/schema.js';
import { noteUsage } from '../request-log.js';

/** The idempotency scope (store key space) of this endpoint. */
const SCOPE = 'messages';

/** Runs the request and writes its end: the ledger row, and the result of `idempotencyKey` if given. */
async function createMessage(ctx: ApiContext, body: CreateMessageBody, caller: Caller, reply: FastifyReply,
  idempotencyKey?: string): Promise<MessageObject> {
  const model = ctx.registry.resolve(body.model, caller.orgName);
  // prepare() refuses images, unpriced windows and over-long requests before the engine runs.
  const prepared = await ctx.service.prepare(toMessagesGenerationRequest(body, caller, model.supportsChat));
  const result = await ctx.service.run(prepared, disconnectSignal(reply));
  noteUsage(reply.request, [result]);
  const id = newId('msg');
  const message = messageObject(id, prepared, result);
  const committed = await commitRequestEnd(ctx.store, ctx.webhooks, {
    usage: ctx.billing.usageRecord({ surface: 'messages', requestId: id, prepared, results: [result] }),
    ...(idempotencyKey !== undefined && {
      idempotency: { orgId: caller.orgId, scope: SCOPE, key: idempotencyKey, statusCode: 200, body: message, leaseOwner: ctx.lease.owner },
    }),
  });
  if (committed.idempotencyLeaseLost) {
    // This replica stalled past the key's lease and another took the key over: its result (one
    // message, one ledger row) is the key's; this one was not stored nor billed.
    throw new ApiError(409, 'conflict_error',
      'this request\'s idempotency key was taken over by another server after this one stalled; retry with the same key to get its result',
      null, 'idempotency_key_in_use');
  }
  return message;
}

export function registerMessageRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.post<{ Body: CreateMessageBody }>('/messages', {
    schema: {
      summary: 'Create a message',
      body: CreateMessageSchema,
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
    preValidation: async (request) => refuseUnsupportedMessageInput(request.body),
  }, async (request, reply) => {
    const body = request.body;
    const caller = request.caller;
    const idem = idempotencyKeyOf(request.headers);
    if (idem === undefined) return createMessage(ctx, body, caller, reply);

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
      return await createMessage(ctx, body, caller, reply, idem.key);
    } catch (err) {
      await ctx.store.abandonIdempotency(caller.orgId, SCOPE, idem.key, ctx.lease.owner);
      throw err;
    }
  });

  app.post<{ Body: CountTokensBody }>('/messages/count_tokens', {
    schema: {
      summary: 'Count the prompt tokens of a message request',
      body: CountTokensSchema,
      response: { 200: TokenCountSchema, ...errorResponses },
    },
    preValidation: async (request) => refuseUnsupportedBlocks(request.body),
  }, async (request) => {
    const model = ctx.registry.resolve(request.body.model, request.caller.orgName);
    const count = await ctx.service.countPromptTokens(toMessagesCountRequest(request.body, request.caller, model.supportsChat));
    return { input_tokens: count };
  });
}
