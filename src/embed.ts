// The HTTP API inside a host's own fastify app, in a few lines:
//
//   const sluice = await createSluice({ catalog, dataDir: './data' });
//   await app.register(sluice.plugin, { prefix: '/v1' });
//   await app.listen({ port: 3000 });
//   ...
//   await app.close();          // stops the API's work, then frees the models, store and data directory
//
// createSluice opens what openService opens (openServiceParts: the locked data directory, the store
// with the last process's idempotency keys released, the catalog's models, a first key, the
// per-organization limiter, the batch runner) without an HTTP app of its own. `plugin` mounts the
// API (sluiceApi, api/plugin.ts) under the prefix it is registered with, starts the batch runner
// when the host app is ready, and closes everything when the host app closes. What openService's
// app adds around the API (/health, /ready, /metrics, the transport limits, the access log) stays
// the host's choice.

import type { FastifyBaseLogger, FastifyPluginAsync } from 'fastify';
import { sluiceApi } from './api/plugin.js';
import type { BatchRunner } from './batches/runner.js';
import type { ModelRegistry } from './serving/model-registry.js';
import { openServiceParts, type OpenServiceOptions } from './service.js';
import type { CreatedKey } from './store/api-keys.js';
import type { Store } from './store/store.js';

export type CreateSluiceOptions = Pick<OpenServiceOptions,
  'catalog' | 'dataDir' | 'databaseUrl' | 'databaseSchema' | 'filesDir' | 'engineDefaults' | 'onProgress' | 'deadlines' | 'webhooks' | 'batchDeadlines' | 'orgLimits'>;

export interface Sluice {
  /**
   * The API as a fastify plugin: `app.register(sluice.plugin, { prefix: '/v1' })`, once. Inside its
   * prefix it has its own error envelope, JSON parser, key check and OpenAPI document; the host's
   * routes, parsers and error handler are untouched.
   */
  plugin: FastifyPluginAsync;
  store: Store;
  registry: ModelRegistry;
  /** The absolute data directory. */
  dataDir: string;
  /** The key made because the store had none (show it once), else undefined. */
  firstKey: CreatedKey | undefined;
  /** Runs the Batches API's batches; started when the host app is ready. */
  batches: BatchRunner;
  /**
   * Stops the batches, frees the models, closes the store and releases the data directory. The
   * host app's close does it (after the API's own work has stopped); call it yourself when the
   * plugin was never registered or the app never started. Safe to call twice.
   */
  close(): Promise<void>;
}

export async function createSluice(opts: CreateSluiceOptions): Promise<Sluice> {
  // The host app's logger, once the plugin is registered (batch work runs only after that).
  let log: FastifyBaseLogger | undefined;
  const parts = await openServiceParts({
    ...opts,
    batchLog: { error: (obj, msg) => log?.error(obj, msg), info: (obj, msg) => log?.info(obj, msg) },
  });
  let registered = false;
  const plugin: FastifyPluginAsync = async (app) => {
    // One data directory has one batch runner and one set of background jobs.
    if (registered) throw new Error('createSluice: its plugin can be registered once');
    registered = true;
    log = app.log;
    // NOTE: fastify runs onClose hooks last added first, so this one, added before the API's, runs
    // after them: background work and webhooks have stopped before the engines and the store go.
    app.addHook('onClose', async () => parts.close());
    await app.register(sluiceApi, {
      store: parts.store, registry: parts.registry, dataDir: parts.dataDir, limits: parts.limits, batches: parts.batches, lease: parts.lease,
      ...(parts.filesDir !== undefined && { filesDir: parts.filesDir }),
      ...(opts.deadlines && { deadlines: opts.deadlines }),
      ...(opts.webhooks && { webhooks: opts.webhooks }),
    });
    app.addHook('onReady', async () => parts.batches.start());
  };
  return {
    plugin, store: parts.store, registry: parts.registry, dataDir: parts.dataDir, firstKey: parts.firstKey,
    batches: parts.batches, close: parts.close,
  };
}
