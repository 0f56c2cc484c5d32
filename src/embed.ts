// The HTTP API inside a host's own fastify app, in a few lines:
//
//   const sluice = await createSluice({ catalog, dataDir: './data' });
//   await app.register(sluice.plugin, { prefix: '/v1' });
//   await app.listen({ port: 3000 });
//   ...
//   await app.close();          // stops the API's work, then frees the models, store and data directory
//
// createSluice opens a runtime (runtime.ts: the locked data directory, the store with the last
// process's idempotency keys released, the catalog's models, a first key, and every service built
// once) without an HTTP app of its own. `plugin` mounts the API (sluiceApi, api/plugin.ts) under the
// prefix it is registered with, starts the runtime's work when the host app is ready, and closes the
// runtime when the host app closes. What openService's app adds around the API (/health, /ready,
// /metrics, the transport limits, the access log) stays the host's choice.

import type { FastifyPluginAsync } from 'fastify';
import { sluiceApi } from './api/plugin.js';
import type { BatchRunner } from './batches/runner.js';
import { openRuntime, type OpenRuntimeOptions, type Runtime } from './runtime.js';
import type { ModelRegistry } from './serving/model-registry.js';
import type { CreatedKey } from './store/api-keys.js';
import type { Store } from './store/store.js';

export type CreateSluiceOptions = Pick<OpenRuntimeOptions,
  'catalog' | 'dataDir' | 'databaseUrl' | 'databaseSchema' | 'filesDir' | 'engineDefaults' | 'onProgress' | 'deadlines' | 'webhooks' | 'images' | 'batchDeadlines' | 'orgLimits'>;

export interface Sluice {
  /**
   * The API as a fastify plugin: `app.register(sluice.plugin, { prefix: '/v1' })`, once. Inside its
   * prefix it has its own error envelope, JSON parser, key check and OpenAPI document; the host's
   * routes, parsers and error handler are untouched.
   */
  plugin: FastifyPluginAsync;
  /** Every service the API serves from. */
  runtime: Runtime;
  store: Store;
  registry: ModelRegistry;
  /** The absolute data directory. */
  dataDir: string;
  /** The key made because the store had none (show it once), else undefined. */
  firstKey: CreatedKey | undefined;
  /** Runs the Batches API's batches; started when the host app is ready. */
  batches: BatchRunner;
  /**
   * Stops the API's work, frees the models, closes the store and releases the data directory. The
   * host app's close does it (after its requests have ended); call it yourself when the plugin was
   * never registered or the app never started. Safe to call twice.
   */
  close(): Promise<void>;
}

export async function createSluice(opts: CreateSluiceOptions): Promise<Sluice> {
  const runtime = await openRuntime(opts);
  let registered = false;
  const plugin: FastifyPluginAsync = async (app) => {
    // One data directory has one batch runner and one set of background jobs.
    if (registered) throw new Error('createSluice: its plugin can be registered once');
    registered = true;
    runtime.useLog(app.log);
    app.addHook('onClose', async () => runtime.close());
    await app.register(sluiceApi, { runtime });
    app.addHook('onReady', async () => runtime.start());
  };
  return {
    plugin, runtime, store: runtime.store, registry: runtime.registry, dataDir: runtime.dataDir, firstKey: runtime.firstKey,
    batches: runtime.batches, close: () => runtime.close(),
  };
}
