// Builds the sluice HTTP app: /health and /ready for orchestrators, and the API plugin under /v1.
// Tests import this and inject requests or listen on a port; `sluice serve` listens and handles signals.

import Fastify, { LogController, type FastifyInstance, type FastifyServerOptions } from 'fastify';
import type { ModelRegistry } from '../serving/model-registry.js';
import type { Store } from '../store/store.js';
import type { WindowDeadlines } from './background-responses.js';
import { ApiError, renderError } from './errors.js';
import { sluiceApi } from './plugin.js';
import type { WebhookSettings } from '../webhooks/dispatcher.js';
import type { BatchRunner } from '../batches/runner.js';

export interface CreateServerOptions {
  store: Store;
  registry: ModelRegistry;
  dataDir: string;
  /** fastify's logger option (pino). Default: off. */
  logger?: FastifyServerOptions['logger'];
  /** Seconds a background response may stay in_progress, per completion window. */
  deadlines?: Partial<WindowDeadlines>;
  /** Completion webhook retry settings; default the spec's (30 s per attempt, 3 retries). */
  webhooks?: WebhookSettings;
  /** The batch runner (its owner starts and stops it); default: the API plugin makes its own. */
  batches?: BatchRunner;
}

/** Largest JSON body: generous for base64 images, and the same order as a batch line (28 MiB). */
export const JSON_BODY_LIMIT = 32 * 1024 * 1024;

export async function createServer(opts: CreateServerOptions): Promise<FastifyInstance> {
  const app = Fastify({
    logger: opts.logger ?? false,
    bodyLimit: JSON_BODY_LIMIT,
    // No line per request: errors and lifecycle only (request logs cost throughput on small hosts).
    logController: new LogController({ disableRequestLogging: true }),
    return503OnClosing: true,
    // Generation can take minutes; only idle keep-alive sockets are timed out.
    requestTimeout: 0,
  });

  let closing = false;
  // preClose runs before the listener stops: from then on every response ends its connection, so a
  // keep-alive socket still busy when close began does not hold shutdown for keepAliveTimeout.
  app.addHook('preClose', async () => { closing = true; });
  app.addHook('onSend', async (_request, reply) => {
    if (closing) reply.header('connection', 'close');
  });

  app.get('/health', { schema: { hide: true } }, async () => ({ status: 'ok' }));
  app.get('/ready', { schema: { hide: true } }, async (_request, reply) => {
    if (closing) return reply.code(503).send({ status: 'shutting_down' });
    return { status: 'ready', models: opts.registry.models.map((m) => m.id) };
  });

  // Outside /v1 (unknown paths, errors of /health) the same envelope applies.
  app.setErrorHandler((err, request, reply) => {
    const rendered = renderError(err);
    if (rendered.internal) request.log.error({ err }, 'request failed');
    return reply.code(rendered.statusCode).send(rendered.body);
  });
  app.setNotFoundHandler((request) => {
    throw new ApiError(404, 'invalid_request_error', `no route ${request.method} ${request.url.split('?')[0]}`, null, 'unknown_route');
  });

  await app.register(sluiceApi, {
    prefix: '/v1', store: opts.store, registry: opts.registry, dataDir: opts.dataDir,
    ...(opts.deadlines && { deadlines: opts.deadlines }),
    ...(opts.webhooks && { webhooks: opts.webhooks }),
    ...(opts.batches && { batches: opts.batches }),
  });
  return app;
}
