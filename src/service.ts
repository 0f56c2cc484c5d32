// Opens everything `sluice serve` runs: the store under the data directory, the catalog's models,
// a first API key when there is none, and the HTTP app. Library users call this to run the whole
// service in their process; createServer (api/app.ts) is the lower level for mounting the API.

import os from 'node:os';
import { join, resolve } from 'node:path';
import type { FastifyInstance, FastifyServerOptions } from 'fastify';
import { createServer } from './api/app.js';
import type { WindowDeadlines } from './api/background-responses.js';
import type { Catalog } from './config/catalog.js';
import type { EngineLoadOptions } from './engine/engine.js';
import { ModelRegistry } from './serving/model-registry.js';
import { createApiKey, type CreatedKey } from './store/api-keys.js';
import { SqliteStore } from './store/sqlite-store.js';
import type { WebhookSettings } from './webhooks/dispatcher.js';
import { BatchRunner, type BatchDeadlines } from './batches/runner.js';
import type { Store } from './store/store.js';

export const DEFAULT_ORGANIZATION = 'default';

export interface OpenServiceOptions {
  catalog: Catalog;
  /** Directory for sluice.db and file bytes (created if missing). */
  dataDir: string;
  engineDefaults?: Omit<EngineLoadOptions, 'model'>;
  logger?: FastifyServerOptions['logger'];
  onProgress?: (message: string) => void;
  /** Seconds a background response may stay in_progress, per completion window. */
  deadlines?: Partial<WindowDeadlines>;
  /** Completion webhook retry settings; default the spec's (30 s per attempt, 3 retries). */
  webhooks?: WebhookSettings;
  /** Seconds from a batch's creation to its expiry, per window it runs at (24h runs as flex). */
  batchDeadlines?: Partial<BatchDeadlines>;
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
  /** Stops the app, frees the models, closes the store. Safe to call twice. */
  close(): Promise<void>;
}

/**
 * CPU compute threads when the caller sets none: every core but one, which is left to the HTTP
 * event loop (parsing, validation, tokenization, storage). Engine threads that take every core
 * preempt the event loop and cost served throughput on small hosts; CUDA ignores this.
 */
export function defaultServeThreads(cores = os.availableParallelism()): number {
  return Math.max(1, cores - 1);
}

export function storePath(dataDir: string): string {
  return join(resolve(dataDir), 'sluice.db');
}

export async function openService(opts: OpenServiceOptions): Promise<Service> {
  const dataDir = resolve(opts.dataDir);
  const store = new SqliteStore(storePath(dataDir));
  // This process owns the SQLite store: requests in flight when the last one stopped are gone.
  await store.releasePendingIdempotency();
  let registry: ModelRegistry | undefined;
  try {
    const registryOptions: Parameters<typeof ModelRegistry.load>[1] = {
      engineDefaults: { threads: defaultServeThreads(), ...opts.engineDefaults },
    };
    if (opts.onProgress) registryOptions.onProgress = opts.onProgress;
    registryOptions.onMessage = opts.onProgress ?? ((m) => process.stderr.write(`sluice: ${m}\n`));
    registry = await ModelRegistry.load(opts.catalog, registryOptions);
    const firstKey = (await store.countActiveApiKeys()) === 0 ? await createApiKey(store, DEFAULT_ORGANIZATION) : undefined;
    let app: FastifyInstance | undefined;
    const batches = new BatchRunner({
      store, registry, dataDir, ...(opts.batchDeadlines && { deadlines: opts.batchDeadlines }),
      log: { error: (obj, msg) => app?.log.error(obj, msg) },
    });
    app = await createServer({
      store, registry, dataDir, logger: opts.logger, ...(opts.deadlines && { deadlines: opts.deadlines }),
      ...(opts.webhooks && { webhooks: opts.webhooks }), batches,
    });
    await batches.start();
    let closed = false;
    const loaded = registry;
    const started = app;
    return {
      app, store, registry, dataDir, firstKey, batches,
      async close() {
        if (closed) return;
        closed = true;
        await started.close();
        // After the HTTP app (no new batches or cancels), before the engines go.
        await batches.stop();
        await loaded.dispose();
        await store.close();
      },
    };
  } catch (err) {
    await registry?.dispose();
    await store.close();
    throw err;
  }
}
