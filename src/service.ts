// `sluice serve` in a process: the runtime (runtime.ts: the locked data directory, the store, the
// catalog's models, a first API key when there is none, and every service built once) and the HTTP
// app over it (api/app.ts). Library users call this to run the whole service in their process;
// createSluice (embed.ts) mounts the API of a runtime in their own fastify app instead.

import type { FastifyBaseLogger, FastifyInstance, FastifyServerOptions } from 'fastify';
import { createServer } from './api/app.js';
import { DEFAULT_TRANSPORT_LIMITS, type TransportLimits } from './api/transport.js';
import type { BatchRunner } from './batches/runner.js';
import type { HistoryOptions } from './dashboard/history.js';
import { ServiceMetrics, type ServiceMetricsOptions } from './metrics/service-metrics.js';
import { logServiceStart } from './metrics/startup-log.js';
import { openRuntime, type OpenRuntimeOptions, type Runtime } from './runtime.js';
import type { ModelRegistry } from './serving/model-registry.js';
import type { CreatedKey } from './store/api-keys.js';
import type { LeaseConfig } from './store/leases.js';
import type { Store } from './store/store.js';

export { DEFAULT_ORGANIZATION, defaultServeThreads, storePath } from './runtime.js';

export interface OpenServiceOptions extends Omit<OpenRuntimeOptions, 'metrics' | 'log'> {
  /** fastify's logger option (pino settings); default off. */
  logger?: FastifyServerOptions['logger'];
  /** A pino logger instead (`sluice serve`'s one JSON stream); wins over `logger`. */
  loggerInstance?: FastifyBaseLogger;
  /** GET /metrics: public or behind an admin key (default), organization label cap, process metrics. */
  metrics?: ServiceMetricsOptions;
  /** Milliseconds between the engine lines logged while an engine is busy; 0: none. Default 10,000. */
  engineLogIntervalMs?: number;
  /** The dashboard plots' history: sample interval and count (default one per 5 s, 180 kept: 15 minutes). */
  dashboardHistory?: HistoryOptions;
  /** Body timeout, minimum body rate, connection cap (defaults: DEFAULT_TRANSPORT_LIMITS in api/transport.ts). */
  transport?: Partial<TransportLimits>;
}

export interface Service {
  app: FastifyInstance;
  store: Store;
  registry: ModelRegistry;
  dataDir: string;
  /** The key made because the store had none (shown once), else undefined. */
  firstKey: CreatedKey | undefined;
  /** Runs the batches; started here, stopped by close() (unfinished batches resume at the next open). */
  batches: BatchRunner;
  /** Every service the app serves from (runtime.ts). */
  runtime: Runtime;
  /** The Prometheus registry GET /metrics serves. */
  metrics: ServiceMetrics;
  /** This process's replica id (the owner of its leases) and lease length. */
  lease: LeaseConfig;
  /**
   * Starts draining: from now on GET /ready answers 503 (code `draining`) while every other route
   * serves as before, so that load balancers move new work to other replicas; close() follows.
   */
  drain(): void;
  /** Stops the app, frees the models, closes the store, releases the data directory. Safe to call twice. */
  close(): Promise<void>;
}

export async function openService(opts: OpenServiceOptions): Promise<Service> {
  const runtime = await openRuntime({ ...opts, metrics: new ServiceMetrics(opts.metrics) });
  let app: FastifyInstance;
  try {
    app = await createServer({
      runtime, logger: opts.logger, ...(opts.loggerInstance && { loggerInstance: opts.loggerInstance }),
      ...(opts.engineLogIntervalMs !== undefined && { engineLogIntervalMs: opts.engineLogIntervalMs }),
      ...(opts.dashboardHistory && { dashboardHistory: opts.dashboardHistory }),
      ...(opts.transport && { transport: opts.transport }),
    });
  } catch (err) {
    await runtime.close();
    throw err;
  }
  try {
    const described = runtime.limits.describe();
    logServiceStart(app.log, runtime.registry, {
      org: described.defaults, numOrgOverrides: described.numOverrides, transport: { ...DEFAULT_TRANSPORT_LIMITS, ...opts.transport },
    });
    // Pending work (background responses, batches, webhook deliveries) resumes now, before the port opens.
    await app.ready();
  } catch (err) {
    await app.close();
    throw err;
  }
  let closed = false;
  return {
    app, runtime, store: runtime.store, registry: runtime.registry, dataDir: runtime.dataDir, firstKey: runtime.firstKey,
    batches: runtime.batches, metrics: runtime.metrics, lease: runtime.lease,
    drain: () => runtime.drain(),
    // The app's close closes the runtime (its onClose hook): work handed back, models, store, lock.
    async close() {
      if (closed) return;
      closed = true;
      await app.close();
    },
  };
}
