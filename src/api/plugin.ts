// The HTTP API as a fastify plugin. `createServer` (app.ts) mounts it under /v1; a Node service can
// mount it in its own app the same way:
//
//   app.register(sluiceApi, { prefix: '/v1', store, registry, dataDir })
//
// Inside the plugin's scope: strict body validation (validation.ts), the one error handler, the
// bearer-key hook, the OpenAPI document and every surface's routes.

import swagger from '@fastify/swagger';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import type { Runtime } from '../runtime.js';
import type { Store } from '../store/store.js';
import { makeAuthHook } from './auth.js';
import { ApiError, renderError, type ErrorEnvelope } from '../surfaces/errors.js';
import { messagesSurface } from '../surfaces/messages/surface.js';
import { registerBatchRoutes } from './routes/batches.js';
import { registerChatCompletionRoutes } from './routes/chat-completions.js';
import { registerFileRoutes } from './routes/files.js';
import { registerMessageRoutes } from './routes/messages.js';
import { registerModelRoutes } from './routes/models.js';
import { registerResponseRoutes } from './routes/responses.js';
import { validatorCompiler } from '../surfaces/validation.js';
import { jsonBodyParser } from '../surfaces/json-body.js';
import { registerUsageRoutes } from './routes/usage.js';
import { registerAdapterRoutes } from './routes/adapters.js';
import { echoRequestId } from './request-log.js';

export const API_VERSION = '2026-08-14';

export interface SluiceApiOptions {
  /** The services the routes use (runtime.ts: openRuntime, or assembleRuntime over an open store and models). */
  runtime: Runtime;
}

const PUBLIC_ROUTES = new Set(['/openapi.json']);

type Envelope = (status: number, body: ErrorEnvelope) => ErrorEnvelope;

/** The scope's error and not-found handlers: the spec's envelope, in the surface's flavour (`envelope`). */
function setErrorHandlers(app: FastifyInstance, envelope: Envelope): void {
  app.setErrorHandler((err, request, reply) => {
    const rendered = renderError(err);
    if (rendered.internal) request.log.error({ err }, 'request failed');
    if (reply.raw.destroyed) return; // the client is gone (a cancelled request); nothing to send
    if (rendered.headers) reply.headers(rendered.headers);
    return reply.code(rendered.statusCode).type('application/json').send(envelope(rendered.statusCode, rendered.body));
  });
  app.setNotFoundHandler((request) => {
    throw new ApiError(404, 'invalid_request_error', `no route ${request.method} ${request.url.split('?')[0]}`, null, 'unknown_route');
  });
}

/** The bearer-key check of every route but the public ones; runs before anything else of a request. */
function addAuthHook(app: FastifyInstance, store: Store): void {
  const authenticate = makeAuthHook(store);
  app.addHook('onRequest', async (request, reply) => {
    const path = request.routeOptions.url?.slice(app.prefix.length);
    // Before the key check, so that a refusal carries it too.
    echoRequestId(request, reply);
    if (path !== undefined && PUBLIC_ROUTES.has(path)) return;
    await authenticate(request);
  });
}

/**
 * Registers the API's routes on a runtime's services. Starting and stopping the runtime's work is
 * its owner's (createServer, createSluice, openService): the plugin only registers routes.
 */
export const sluiceApi: FastifyPluginAsync<SluiceApiOptions> = async (app: FastifyInstance, { runtime }) => {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'sluice inference API',
        version: API_VERSION,
        description: 'Models, Responses, Chat Completions, Messages, Files and Batches, served by the sluice engine.',
      },
      servers: [{ url: app.prefix || '/' }],
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'API key' } } },
      security: [{ bearer: [] }],
    },
  });

  app.setValidatorCompiler(validatorCompiler);
  // JSON routes take JSON only: text/plain bodies get 415 rather than being parsed as a string.
  app.removeContentTypeParser('text/plain');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, jsonBodyParser);
  setErrorHandlers(app, (_status, body) => body);
  addAuthHook(app, runtime.store);

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());

  registerModelRoutes(app, runtime);
  registerResponseRoutes(app, runtime);
  registerChatCompletionRoutes(app, runtime);
  await registerFileRoutes(app, runtime);
  await registerBatchRoutes(app, runtime);
  registerUsageRoutes(app, runtime);
  registerAdapterRoutes(app, runtime);
  // Messages is a scope of its own: whatever fails there (auth, parsing, validation, the route, an
  // unknown sub-path), its errors carry Anthropic's name for the status inside the spec's envelope,
  // which Anthropic's clients read; they also read the request-id header.
  await app.register(async (messages) => {
    setErrorHandlers(messages, messagesSurface.envelope);
    messages.addHook('onRequest', async (request, reply) => {
      reply.header('request-id', request.id);
    });
    // A refusal of the parent's key check comes before that hook: its reply gets the header here.
    messages.addHook('onSend', async (request, reply) => {
      if (!reply.hasHeader('request-id')) reply.header('request-id', request.id);
    });
    registerMessageRoutes(messages, runtime);
  }, { prefix: '/messages' });
};
