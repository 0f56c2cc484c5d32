// Builds the sluice HTTP app: /health and /ready for orchestrators, /metrics and /dashboard for
// operators, and the API plugin under /v1.
// Tests import this and inject requests or listen on a port; `sluice serve` listens and handles signals.
//
// Every 4xx and 5xx leaves in the error envelope, including the ones fastify and Node answer
// before any route runs: malformed HTTP and oversized headers (clientErrorHandler, on the raw
// socket), malformed or over-long URLs (frameworkErrors), requests while shutting down (503), a
// missing Host header, an unsupported Expect header, and bodies that arrive too slowly (408,
// transport.ts).

import Fastify, {
  LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyServerOptions,
} from 'fastify';
import type { Runtime } from '../runtime.js';
import { ApiError, envelope, renderError } from '../surfaces/errors.js';
import { jsonBodyParser } from '../surfaces/json-body.js';
import { sluiceApi } from './plugin.js';
import {
  BodyGuard, ConnectionGate, DEFAULT_TRANSPORT_LIMITS, makeClientErrorHandler, PROBE_PATHS, SocketResponses, type TransportLimits,
} from './transport.js';
import { DEFAULT_ENGINE_LOG_INTERVAL_MS, EngineStatsLog } from '../metrics/engine-log.js';
import { registerMetricsRoute } from './metrics-route.js';
import { recordRequests, requestIdFor } from './request-log.js';
import { DASHBOARD_ROUTES, registerDashboardRoutes } from './dashboard-route.js';
import type { HistoryOptions } from '../dashboard/history.js';
import { RecentRequests } from '../metrics/recent-requests.js';

export interface CreateServerOptions {
  /**
   * The services the app serves (runtime.ts). The app owns its life: started when the app is
   * ready (pending work resumes), closed when the app closes (work handed back, then what
   * openRuntime opened).
   */
  runtime: Runtime;
  /** fastify's logger option (pino settings). Default: off. */
  logger?: FastifyServerOptions['logger'];
  /** A pino logger to write to instead (`sluice serve` passes its one JSON stream); wins over `logger`. */
  loggerInstance?: FastifyBaseLogger;
  /**
   * Milliseconds between the engine lines logged while an engine is busy (metrics/engine-log.ts);
   * 0: none. Default 10,000; 0 or 10..3,600,000.
   */
  engineLogIntervalMs?: number;
  /** The dashboard plots' history: sample interval and count (default one per 5 s, 180 kept). */
  dashboardHistory?: HistoryOptions;
  /** Body timeout, minimum body rate, connection cap; defaults DEFAULT_TRANSPORT_LIMITS (transport.ts). */
  transport?: Partial<TransportLimits>;
}

/** Largest JSON body: generous for base64 images, and the same order as a batch line (28 MiB). */
export const JSON_BODY_LIMIT = 32 * 1024 * 1024;

/** Longest path parameter the router takes: the longest id the route schemas accept. Longer is a 414. */
const MAX_PARAM_LENGTH = 128;

/** fastify's errors raised before routing -> status, envelope code and a message that does not echo the URL. */
const FRAMEWORK_ERRORS: Record<string, { status: number; code: string; message: string }> = {
  FST_ERR_BAD_URL: { status: 400, code: 'invalid_url', message: 'the URL path is not valid (a malformed %-escape)' },
  FST_ERR_MAX_PARAM_LENGTH: {
    status: 414, code: 'uri_too_long', message: `a path parameter of the URL is longer than ${MAX_PARAM_LENGTH} characters`,
  },
};

function replyFrameworkError(err: FastifyError, reply: FastifyReply): FastifyReply {
  const known = FRAMEWORK_ERRORS[err.code];
  if (!known) return reply.code(500).send(envelope('server_error', 'internal server error', null, 'internal_error'));
  return reply.code(known.status).send(envelope('invalid_request_error', known.message, null, known.code));
}

export async function createServer(opts: CreateServerOptions): Promise<FastifyInstance> {
  const { runtime } = opts;
  const limits: TransportLimits = { ...DEFAULT_TRANSPORT_LIMITS, ...opts.transport };
  const responses = new SocketResponses();
  const app = Fastify({
    ...(opts.loggerInstance ? { loggerInstance: opts.loggerInstance } : { logger: opts.logger ?? false }),
    // A client's x-request-id when it is safe to keep (request-log.ts), else a new UUID.
    genReqId: requestIdFor,
    bodyLimit: JSON_BODY_LIMIT,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // Not fastify's two lines per request: one access line (request-log.ts) says it all.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    // Requests that arrive while closing get the envelope from the onRequest hook below instead.
    return503OnClosing: false,
    // Node's requestTimeout times only the receipt of a request (checked: a reply that takes
    // minutes is not cut), but it answers outside the envelope and looks only every 30 s;
    // BodyGuard (transport.ts) times bodies instead. Headers stay under Node's headersTimeout (60 s).
    requestTimeout: 0,
    // A missing Host header gets the envelope from the onRequest hook below, not Node's empty 400.
    http: { requireHostHeader: false },
    clientErrorHandler: makeClientErrorHandler(responses),
    frameworkErrors: (err, request, reply) => replyFrameworkError(err, reply.header('x-request-id', request.id) as unknown as FastifyReply),
  });
  // Instead of Node's maxConnections, which refuses probes too once idle sockets fill it.
  const connections = new ConnectionGate(limits);
  connections.install(app.server);
  // Expect other than 100-continue: Node would answer 417 with no body.
  app.server.on('checkExpectation', (req, res) => {
    const body = JSON.stringify(envelope('invalid_request_error', 'only "Expect: 100-continue" is supported', null, 'expectation_failed'));
    res.writeHead(417, {
      'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body), connection: 'close',
      'x-request-id': requestIdFor(req),
    });
    res.end(body);
  });
  const bodyGuard = new BodyGuard(limits);
  const { metrics } = runtime;
  // The runtime's work (background responses, batches, webhooks) logs with the app from now on.
  runtime.useLog(app.log);
  // First of the onClose hooks, which fastify runs last added first: the runtime's work stops, and
  // the models and the store close, after everything added below has stopped using them.
  app.addHook('onClose', async () => runtime.close());
  // The dashboard's recent requests: the API's, not probes, scrapes or the dashboard's own polling.
  const recent = new RecentRequests();
  const operatorRoutes = new Set<string>(['/health', '/ready', '/metrics', ...DASHBOARD_ROUTES]);
  // First of the root hooks: even a request refused by the next one gets its id back.
  recordRequests(app, metrics, { ring: recent, ignoredRoutes: operatorRoutes });
  const stopWatching = metrics.watchModels(runtime.registry);
  app.addHook('onClose', async () => stopWatching());
  const engineLog = new EngineStatsLog(app.log);
  engineLog.start(runtime.registry, opts.engineLogIntervalMs ?? DEFAULT_ENGINE_LOG_INTERVAL_MS);
  app.addHook('onClose', async () => engineLog.stop());

  let closing = false;
  // preClose runs before the listener stops: from then on every response ends its connection, so a
  // keep-alive socket still busy when close began does not hold shutdown for keepAliveTimeout.
  app.addHook('preClose', async () => { closing = true; });
  app.addHook('onClose', async () => bodyGuard.close());
  const draining = () => runtime.isDraining();
  app.addHook('onSend', async (_request, reply) => {
    // Draining too: a client on a keep-alive connection reconnects, through its load balancer, elsewhere.
    if (closing || draining() || connections.isReserved(reply.raw.socket)) reply.header('connection', 'close');
  });
  // Root hooks, added before the plugin so that they run first for every route (fastify encapsulation).
  app.addHook('onRequest', async (request, reply) => {
    responses.track(request.raw.socket, reply.raw);
    if (closing) throw new ApiError(503, 'server_error', 'the server is shutting down; retry the request', null, 'shutting_down');
    if (connections.isReserved(request.raw.socket) && !PROBE_PATHS.has(request.url.split('?')[0]!)) {
      throw new ApiError(503, 'server_error', 'the server has no free connection for this request; retry shortly', null, 'too_many_connections');
    }
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      throw new ApiError(400, 'invalid_request_error', 'an HTTP/1.1 request needs a Host header', null, 'missing_host_header');
    }
    bodyGuard.watch(request.raw, reply.raw, request.id);
  });
  // Outside /v1 too, JSON bodies are parsed with the same limits (and errors) as inside.
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, jsonBodyParser);

  app.get('/health', { schema: { hide: true } }, async () => ({ status: 'ok' }));
  // No model names: these two answer without a key. An engine out of service after a device fault
  // makes the process not ready (its log says why), so an orchestrator replaces it. A draining
  // process is not ready either, so that load balancers take it out before it stops listening.
  app.get('/ready', { schema: { hide: true } }, async () => {
    if (draining()) {
      throw new ApiError(503, 'server_error', 'the server is draining before it shuts down; send new requests elsewhere', null, 'draining');
    }
    if (runtime.registry.models.some((m) => m.engine.brokenReason !== undefined)) {
      throw new ApiError(503, 'server_error', 'a model engine is out of service after a fault; see the server log', null, 'engine_broken');
    }
    return { status: 'ready' };
  });
  registerMetricsRoute(app, runtime.store, metrics);
  registerDashboardRoutes(app, {
    store: runtime.store, metrics, recent, registry: runtime.registry, ...(opts.dashboardHistory && { history: opts.dashboardHistory }),
  });

  // Outside /v1 (unknown paths, errors of /health) the same envelope applies.
  app.setErrorHandler((err, request, reply) => {
    const rendered = renderError(err);
    if (rendered.internal) request.log.error({ err }, 'request failed');
    if (reply.raw.destroyed) return; // the connection is gone (a body cut by BodyGuard); nothing to send
    if (rendered.headers) reply.headers(rendered.headers);
    return reply.code(rendered.statusCode).send(rendered.body);
  });
  app.setNotFoundHandler((request) => {
    throw new ApiError(404, 'invalid_request_error', `no route ${request.method} ${request.url.split('?')[0]}`, null, 'unknown_route');
  });

  await app.register(sluiceApi, { prefix: '/v1', runtime });
  app.addHook('onReady', async () => runtime.start());
  return app;
}
