// GET /metrics: the service's Prometheus metrics in the text exposition format. Operators only: the
// caller needs an admin API key (as for GET /v1/admin/usage: a key made with `sluice keys create
// --admin`; no key is 401, another key 403), unless the operator made the endpoint public
// (`sluice serve --metrics-public`, for a scraper on a trusted network), in which case the metrics
// name no organization (see metrics/service-metrics.ts).

import type { FastifyInstance } from 'fastify';
import type { ServiceMetrics } from '../metrics/service-metrics.js';
import type { Store } from '../store/store.js';
import { makeAuthHook } from './auth.js';
import { ApiError } from './errors.js';

export function registerMetricsRoute(app: FastifyInstance, store: Store, metrics: ServiceMetrics): void {
  const authenticate = makeAuthHook(store);
  app.get('/metrics', {
    schema: { hide: true },
    onRequest: metrics.isPublic ? [] : [async (request) => {
      await authenticate(request);
      if (!(await store.isAdminKey(request.caller.keyId))) {
        throw new ApiError(403, 'permission_error',
          'metrics need an admin API key (sluice keys create --org NAME --admin), or a server started with --metrics-public',
          null, 'admin_key_required');
      }
    }],
  }, async (_request, reply) => {
    const { contentType, body } = await metrics.render();
    return reply.type(contentType).send(body);
  });
}
