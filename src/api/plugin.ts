// The HTTP API as a fastify plugin. `createServer` (app.ts) mounts it under /v1; a Node service can
// mount it in its own app the same way:
//
//   app.register(sluiceApi, { prefix: '/v1', store, registry, dataDir })
//
// Inside the plugin's scope: strict body validation (validation.ts), the one error handler, the
// bearer-key hook, the OpenAPI document and every surface's routes.

import { leaseConfig, type LeaseConfig } from '../store/leases.js';
import swagger from '@fastify/swagger';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { ReasoningSeal } from '../serving/reasoning-seal.js';
import { GenerationService } from '../serving/generation-service.js';
import type { TenantLimiter } from '../serving/tenant-limits.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import type { Store } from '../store/store.js';
import { makeAuthHook } from './auth.js';
import { BackgroundResponses, DEFAULT_WINDOW_DEADLINES, type WindowDeadlines } from './background-responses.js';
import type { ApiContext } from './context.js';
import { ApiError, renderError } from '../surfaces/errors.js';
import { isMessagesPath, toMessagesEnvelope } from '../surfaces/messages/envelope.js';
import { registerBatchRoutes } from './routes/batches.js';
import { registerChatCompletionRoutes } from './routes/chat-completions.js';
import { registerFileRoutes } from './routes/files.js';
import { registerMessageRoutes } from './routes/messages.js';
import { registerModelRoutes } from './routes/models.js';
import { registerResponseRoutes } from './routes/responses.js';
import { validatorCompiler } from '../surfaces/validation.js';
import { jsonBodyParser } from '../surfaces/json-body.js';
import { WebhookDispatcher, type WebhookSettings } from '../webhooks/dispatcher.js';
import { BatchRunner } from '../batches/runner.js';
import { Billing } from '../billing/ledger.js';
import { registerUsageRoutes } from './routes/usage.js';
import { echoRequestId } from './request-log.js';

export const API_VERSION = '2026-08-14';

export interface SluiceApiOptions {
  /** Per-organization limits (in flight, queued background, tokens per minute); default DEFAULT_ORG_LIMITS. */
  limits?: TenantLimiter;
  store: Store;
  registry: ModelRegistry;
  dataDir: string;
  /** Where file bytes live when not `<dataDir>/files` (a volume replicas share). */
  filesDir?: string;
  /** Seconds a background response may stay in_progress, per window (defaults: DEFAULT_WINDOW_DEADLINES). */
  deadlines?: Partial<WindowDeadlines>;
  /**
   * Completion webhook settings (defaults: the spec's 30 s timeout and 3 retries, private
   * destinations refused, fairness caps) and logger.
   */
  webhooks?: WebhookSettings;
  /**
   * The batch runner, started and stopped by its owner (openService). Without one the plugin makes
   * its own with default deadlines, resumed when the app is ready and stopped when it closes.
   */
  batches?: BatchRunner;
  /**
   * This process's replica id and lease length for background responses, batch chunks and
   * completion webhook deliveries (store/leases.ts); default a new id and DEFAULT_LEASE_TTL_MS.
   * The plugin's own batch runner uses it too.
   */
  lease?: LeaseConfig;
  /** Told when a line of the plugin's own batch runner is done (the service's metrics); not used with `batches`. */
  onBatchLineDone?: (outcome: 'completed' | 'failed') => void;
  /** True while the process drains before shutting down: background work is no longer claimed. */
  draining?: () => boolean;
}

const PUBLIC_ROUTES = new Set(['/openapi.json']);

export const sluiceApi: FastifyPluginAsync<SluiceApiOptions> = async (app: FastifyInstance, opts) => {
  const service = new GenerationService(opts.registry, opts.limits, ReasoningSeal.open(opts.dataDir));
  // Completion webhooks: the plugin owns the dispatcher; it resumes pending deliveries when the app
  // is ready and stops (leaving the unfinished ones pending) when the app closes.
  // Its deliveries are leased to this process's replica id, like its other work.
  const lease = opts.lease ?? leaseConfig();
  const webhooks = new WebhookDispatcher(opts.store, { ...opts.webhooks, log: opts.webhooks?.log ?? app.log, lease });
  app.addHook('onReady', async () => {
    await webhooks.start();
    await webhooks.logPending().catch((err: unknown) => app.log.error({ err }, 'completion webhooks: could not count pending deliveries'));
  });
  app.addHook('onClose', async () => webhooks.close());
  const billing = new Billing(opts.registry);
  const background = new BackgroundResponses({
    store: opts.store, service, billing, webhooks, deadlines: { ...DEFAULT_WINDOW_DEADLINES, ...opts.deadlines }, log: app.log, lease,
    ...(opts.draining && { draining: opts.draining }),
  });
  let batches = opts.batches;
  if (!batches) {
    const owned = new BatchRunner({
      store: opts.store, registry: opts.registry, dataDir: opts.dataDir, log: app.log, lease,
      ...(opts.filesDir !== undefined && { filesDir: opts.filesDir }),
      ...(opts.onBatchLineDone && { onLineDone: opts.onBatchLineDone }),
    });
    app.addHook('onReady', async () => owned.start());
    app.addHook('onClose', async () => owned.stop());
    batches = owned;
  }
  const ctx: ApiContext = {
    store: opts.store, registry: opts.registry, service, dataDir: opts.dataDir, background, webhooks, batches, billing, lease,
    ...(opts.filesDir !== undefined && { filesDir: opts.filesDir }),
  };
  // Once the app is ready, background work is claimed under leases (work left by a previous process
  // or a dead replica resumes, or times out); on close it stops without an outcome and its leases
  // are handed back, for another replica or the next start.
  app.addHook('onReady', async () => background.recover());
  app.addHook('onClose', async () => background.close());

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
  app.setErrorHandler((err, request, reply) => {
    const rendered = renderError(err);
    if (rendered.internal) request.log.error({ err }, 'request failed');
    if (reply.raw.destroyed) return; // the client is gone (a cancelled request); nothing to send
    if (rendered.headers) reply.headers(rendered.headers);
    // The spec's envelope on every surface. On Messages, whatever failed (auth, parsing, validation, the
    // route), its inner type is Anthropic's name for the status, which Anthropic's clients read.
    const body = isMessagesPath(request.url, app.prefix) ? toMessagesEnvelope(rendered.statusCode, rendered.body) : rendered.body;
    return reply.code(rendered.statusCode).type('application/json').send(body);
  });
  app.setNotFoundHandler((request) => {
    throw new ApiError(404, 'invalid_request_error', `no route ${request.method} ${request.url.split('?')[0]}`, null, 'unknown_route');
  });

  const authenticate = makeAuthHook(opts.store);
  app.addHook('onRequest', async (request, reply) => {
    const path = request.routeOptions.url?.slice(app.prefix.length);
    // Before the key check, so that a refusal carries them too. Anthropic's clients read request-id.
    echoRequestId(request, reply);
    if (path === '/messages') reply.header('request-id', request.id);
    if (path !== undefined && PUBLIC_ROUTES.has(path)) return;
    await authenticate(request);
  });

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());

  registerModelRoutes(app, ctx);
  registerResponseRoutes(app, ctx);
  registerChatCompletionRoutes(app, ctx);
  registerMessageRoutes(app, ctx);
  await registerFileRoutes(app, ctx);
  await registerBatchRoutes(app, ctx);
  registerUsageRoutes(app, ctx);
};
