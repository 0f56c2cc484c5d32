// GET /metrics: the service's Prometheus metrics in the text exposition format. Operators only: the
// caller needs an admin API key (as for GET /v1/admin/usage: a key made with `sluice keys create
// --admin`; no key is 401, another key 403), unless the operator made the endpoint public
// (`sluice serve --metrics-public`, for a scraper on a trusted network), in which case the metrics
// name no organization (see metrics/service-metrics.ts).

import type { FastifyInstance } from 'fastify';
import type { ServiceMetrics } from '../metrics/service-metrics.js';
import type { Store } from '../store/store.js';
import { makeAdminHook } from './auth.js';

export function registerMetricsRoute(app: FastifyInstance, store: Store, metrics: ServiceMetrics): void {
  const requireAdmin = makeAdminHook(store,
    'metrics need an admin API key (sluice keys create --org NAME --admin), or a server started with --metrics-public');
  app.get('/metrics', {
    schema: { hide: true },
    onRequest: metrics.isPublic ? [] : [requireAdmin],
  }, async (_request, reply) => {
    const { contentType, body } = await metrics.render();
    return reply.type(contentType).send(body);
  });
}
