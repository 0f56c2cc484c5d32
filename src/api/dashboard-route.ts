// The dashboard: a small page for operators that shows throughput, queues per window, KV use,
// plots of the last minutes' throughput and queues, recent requests and per-organization usage
// and cost, refreshed every few seconds.
//
//   GET /dashboard            the page (fixed HTML: no data, no secret; no key needed)
//   GET /dashboard/app.js     its script (dashboard/client.ts)   } no key needed: the same bytes
//   GET /dashboard/app.css    its style sheet                    } for everyone
//   GET /dashboard/data       the numbers (dashboard/dashboard-data.ts): an admin key, as /metrics
//                             (no key 401, another key 403), whatever --metrics-public says, since
//                             it names organizations, their requests and their costs
//
// The page asks for the key and sends it as a bearer header (a browser sends none when it
// navigates): see client.ts. Its Content-Security-Policy allows scripts, styles and fetches from
// this origin only: no inline script, nothing loaded from elsewhere, no framing.

import type { FastifyInstance, FastifyReply } from 'fastify';
import { usageReport } from '../billing/usage-report.js';
import { dashboardClient } from '../dashboard/client.js';
import {
  RateMeter, readModels, readTotals, throughputOf, usageByOrganization, type DashboardData, type DashboardTotals,
} from '../dashboard/dashboard-data.js';
import { DashboardHistory, type HistoryOptions } from '../dashboard/history.js';
import { DASHBOARD_CSS, DASHBOARD_HTML } from '../dashboard/page.js';
import type { RecentRequests } from '../metrics/recent-requests.js';
import type { ServiceMetrics } from '../metrics/service-metrics.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import type { Store } from '../store/store.js';
import { makeAdminHook } from './auth.js';

export const DASHBOARD_CSP = [
  "default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "img-src 'self' data:",
  "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'",
].join('; ');

/** The dashboard's routes: kept out of the recent requests, which would otherwise show mostly its own polling. */
export const DASHBOARD_ROUTES = ['/dashboard', '/dashboard/app.js', '/dashboard/app.css', '/dashboard/data'] as const;

const CLIENT_SCRIPT = `(${dashboardClient.toString()})();\n`;

function secured(reply: FastifyReply, contentType: string): FastifyReply {
  return reply.type(contentType).headers({
    'content-security-policy': DASHBOARD_CSP,
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-cache',
  });
}

export interface DashboardDeps {
  store: Store;
  metrics: ServiceMetrics;
  recent: RecentRequests;
  /** The models whose engines the history samples. */
  registry: Pick<ModelRegistry, 'models'>;
  /** Sample interval and count of the plots' history (default one per 5 s, 180 kept: 15 minutes). */
  history?: HistoryOptions;
}

export function registerDashboardRoutes(app: FastifyInstance, deps: DashboardDeps): void {
  const { store, metrics, recent } = deps;
  // This app's own history: sampled from now on, stopped when the app closes.
  const history = new DashboardHistory(deps.history);
  history.watch(deps.registry);
  app.addHook('onClose', async () => history.stop());
  const [page, script, style, data] = DASHBOARD_ROUTES;
  app.get(page, { schema: { hide: true } }, async (_request, reply) => secured(reply, 'text/html; charset=utf-8').send(DASHBOARD_HTML));
  app.get(script, { schema: { hide: true } }, async (_request, reply) =>
    secured(reply, 'text/javascript; charset=utf-8').send(CLIENT_SCRIPT));
  app.get(style, { schema: { hide: true } }, async (_request, reply) => secured(reply, 'text/css; charset=utf-8').send(DASHBOARD_CSS));

  // One meter for every viewer: a rate compares this read with one about 10 s earlier, whoever made it.
  const meter = new RateMeter<keyof DashboardTotals>();
  app.get(data, {
    schema: { hide: true },
    onRequest: [makeAdminHook(store, 'the dashboard needs an admin API key (sluice keys create --org NAME --admin)')],
  }, async (_request, reply): Promise<DashboardData> => {
    const read = await metrics.registry.getMetricsAsJSON();
    const totals = readTotals(read);
    const body: DashboardData = {
      object: 'dashboard',
      time: new Date().toISOString(),
      totals,
      throughput: throughputOf(meter, totals),
      models: readModels(read),
      history: { interval_seconds: history.intervalMs / 1000, capacity: history.capacity, samples: history.samples() },
      recent_requests: recent.list(),
      usage: usageByOrganization(await usageReport(store, {})),
    };
    secured(reply, 'application/json; charset=utf-8').header('cache-control', 'no-store');
    return body;
  });
}
