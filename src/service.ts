// Opens everything `sluice serve` runs: the store under the data directory, the catalog's models,
// a first API key when there is none, and the HTTP app. Library users call this to run the whole
// service in their process; createSluice (embed.ts) opens the same parts (openServiceParts) for the
// API mounted in their own fastify app; createServer (api/app.ts) is the lower level.

import { leaseConfig, type LeaseConfig } from './store/leases.js';
import { mkdirSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import type { FastifyBaseLogger, FastifyInstance, FastifyServerOptions } from 'fastify';
import { createServer } from './api/app.js';
import type { WindowDeadlines } from './api/background-responses.js';
import type { Catalog } from './config/catalog.js';
import type { EngineLoadOptions } from './engine/engine.js';
import { ModelRegistry } from './serving/model-registry.js';
import { createApiKey, type CreatedKey } from './store/api-keys.js';
import { SqliteStore } from './store/sqlite-store.js';
import { openPostgresStore } from './store/database-url.js';
import type { WebhookSettings } from './webhooks/dispatcher.js';
import { BatchRunner, type BatchDeadlines } from './batches/runner.js';
import type { BatchLog } from './batches/batch-job.js';
import type { Store } from './store/store.js';
import { DataDirLock } from './store/data-dir-lock.js';
import { loadOrCreatePrefixHashKey } from './store/deployment-key.js';
import { TenantLimiter, type OrgLimits } from './serving/tenant-limits.js';
import { DEFAULT_TRANSPORT_LIMITS, type TransportLimits } from './api/transport.js';
import { ServiceMetrics, type ServiceMetricsOptions } from './metrics/service-metrics.js';
import { logServiceStart } from './metrics/startup-log.js';
import type { HistoryOptions } from './dashboard/history.js';

export const DEFAULT_ORGANIZATION = 'default';

export interface OpenServiceOptions {
  catalog: Catalog;
  /**
   * Directory for sluice.db and file bytes (created 0700 if missing). One server per directory:
   * a second openService on it fails (SluiceError data_dir_locked) while the first runs.
   */
  dataDir: string;
  /**
   * A PostgreSQL database (postgres:// or postgresql:// URL) for the store instead of the SQLite
   * file in the data directory: several processes (replicas) may share it. Each process still
   * keeps a data directory of its own (locked as always) for its per-deployment secrets, which
   * must be identical on every replica (README, Several replicas on PostgreSQL).
   */
  databaseUrl?: string;
  /** The schema of sluice's tables in that database (default: the connection's, normally public). */
  databaseSchema?: string;
  /**
   * This process's replica id and lease length for the work replicas share (store/leases.ts);
   * default a new id and DEFAULT_LEASE_TTL_MS.
   */
  lease?: LeaseConfig;
  /**
   * Where uploaded file bytes and batch results live (default `<dataDir>/files`): a directory every
   * replica sees (a shared volume) when several share one database.
   */
  filesDir?: string;
  engineDefaults?: Omit<EngineLoadOptions, 'model'>;
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
  onProgress?: (message: string) => void;
  /** Seconds a background response may stay in_progress, per completion window. */
  deadlines?: Partial<WindowDeadlines>;
  /** Completion webhook retry settings; default the spec's (30 s per attempt, 3 retries). */
  webhooks?: WebhookSettings;
  /** Seconds from a batch's creation to its expiry, per window it runs at (24h runs as flex). */
  batchDeadlines?: Partial<BatchDeadlines>;
  /** Body timeout, minimum body rate, connection cap (defaults: DEFAULT_TRANSPORT_LIMITS in api/transport.ts). */
  transport?: Partial<TransportLimits>;
  /**
   * Per-organization limits for every organization (the serve flags); the catalog's `limits`
   * override them, per organization too. Defaults: DEFAULT_ORG_LIMITS (serving/tenant-limits.ts).
   */
  orgLimits?: Partial<OrgLimits>;
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

export type ServicePartsOptions = Pick<OpenServiceOptions, 'catalog' | 'dataDir' | 'databaseUrl' | 'databaseSchema' | 'lease' | 'filesDir' | 'engineDefaults' | 'onProgress' | 'batchDeadlines' | 'orgLimits'> & {
  /** Where the batch runner logs (the app's logger, which exists only after the parts). */
  batchLog: BatchLog;
  /** Told when a batch line is done (metrics). */
  onBatchLineDone?: (outcome: 'completed' | 'failed') => void;
};

/** What the API needs besides HTTP, shared by openService and createSluice (embed.ts). */
export interface ServiceParts {
  dataDir: string;
  /** The absolute files directory when one was given (else the bytes are in `<dataDir>/files`). */
  filesDir: string | undefined;
  store: Store;
  registry: ModelRegistry;
  /** The key made because the store had none (shown once), else undefined. */
  firstKey: CreatedKey | undefined;
  /** One limiter for the API's requests and the batch lines: an organization's limits are its own. */
  limits: TenantLimiter;
  /** Not started: its owner starts it once the API is mounted. */
  batches: BatchRunner;
  /** This process's replica id and lease length. */
  lease: LeaseConfig;
  /** Stops the batches, frees the models, closes the store, releases the data directory. Safe to call twice. */
  close(): Promise<void>;
}

/**
 * Locks the data directory, opens the store (releasing the idempotency keys of requests the last
 * process was running), loads the catalog's models, makes a first API key when there is none, and
 * builds the limiter and the batch runner.
 */
export async function openServiceParts(opts: ServicePartsOptions): Promise<ServiceParts> {
  const dataDir = resolve(opts.dataDir);
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // Before anything touches the directory: a second server must not resume this one's work.
  // With PostgreSQL it still guards this process's own directory (its secrets, and the file bytes
  // unless --files-dir moves them); the database and a files directory are shared by design.
  const lock = DataDirLock.acquire(dataDir);
  const filesDir = opts.filesDir === undefined ? undefined : resolve(opts.filesDir);
  let store: Store;
  try {
    store = opts.databaseUrl === undefined
      ? new SqliteStore(storePath(dataDir))
      : await openPostgresStore(opts.databaseUrl, opts.databaseSchema === undefined ? {} : { schema: opts.databaseSchema });
  } catch (err) {
    lock.release();
    throw err;
  }
  let registry: ModelRegistry | undefined;
  try {
    // This process owns the SQLite store: requests in flight when the last one stopped are gone.
    // A PostgreSQL store is shared: the pending keys may be another running replica's, so they are
    // left alone (a dead replica's are released by the leases of a later slice; README).
    if (opts.databaseUrl === undefined) await store.releasePendingIdempotency();
    const registryOptions: Parameters<typeof ModelRegistry.load>[1] = {
      engineDefaults: { threads: defaultServeThreads(), prefixHashKey: loadOrCreatePrefixHashKey(dataDir), ...opts.engineDefaults },
    };
    if (opts.onProgress) registryOptions.onProgress = opts.onProgress;
    registryOptions.onMessage = opts.onProgress ?? ((m) => process.stderr.write(`sluice: ${m}\n`));
    registry = await ModelRegistry.load(opts.catalog, registryOptions);
    const firstKey = (await store.countActiveApiKeys()) === 0 ? await createApiKey(store, DEFAULT_ORGANIZATION) : undefined;
    const limits = new TenantLimiter(opts.catalog.limits, opts.orgLimits);
    const lease = opts.lease ?? leaseConfig();
    const batches = new BatchRunner({
      store, registry, dataDir, lease, ...(filesDir !== undefined && { filesDir }), limits, ...(opts.batchDeadlines && { deadlines: opts.batchDeadlines }), log: opts.batchLog,
      ...(opts.onBatchLineDone && { onLineDone: opts.onBatchLineDone }),
    });
    let closed = false;
    const loaded = registry;
    const opened = store;
    return {
      dataDir, filesDir, store, registry, firstKey, limits, batches, lease,
      async close() {
        if (closed) return;
        closed = true;
        try {
          // After the HTTP app (no new batches or cancels), before the engines go.
          await batches.stop();
          await loaded.dispose();
          await opened.close();
        } finally {
          lock.release();
        }
      },
    };
  } catch (err) {
    await registry?.dispose();
    await store.close();
    lock.release();
    throw err;
  }
}

export async function openService(opts: OpenServiceOptions): Promise<Service> {
  let app: FastifyInstance | undefined;
  const metrics = new ServiceMetrics(opts.metrics);
  const parts = await openServiceParts({
    ...opts,
    batchLog: { error: (obj, msg) => app?.log.error(obj, msg), info: (obj, msg) => app?.log.info(obj, msg) },
    onBatchLineDone: (outcome) => metrics.batchLineDone(outcome),
  });
  const { store, registry, dataDir, filesDir, firstKey, limits, batches, lease } = parts;
  let draining = false;
  try {
    app = await createServer({
      store, registry, dataDir, lease, ...(filesDir !== undefined && { filesDir }), logger: opts.logger, ...(opts.loggerInstance && { loggerInstance: opts.loggerInstance }),
      metrics, ...(opts.engineLogIntervalMs !== undefined && { engineLogIntervalMs: opts.engineLogIntervalMs }),
      ...(opts.dashboardHistory && { dashboardHistory: opts.dashboardHistory }),
      ...(opts.deadlines && { deadlines: opts.deadlines }),
      ...(opts.webhooks && { webhooks: opts.webhooks }), batches, ...(opts.transport && { transport: opts.transport }), limits,
      draining: () => draining,
    });
    const described = limits.describe();
    logServiceStart(app.log, registry, {
      org: described.defaults, numOrgOverrides: described.numOverrides, transport: { ...DEFAULT_TRANSPORT_LIMITS, ...opts.transport },
    });
    await batches.start();
  } catch (err) {
    await app?.close();
    await parts.close();
    throw err;
  }
  let closed = false;
  const started = app;
  return {
    app, store, registry, dataDir, firstKey, batches, metrics, lease,
    drain() { draining = true; batches.drain(); },
    async close() {
      if (closed) return;
      closed = true;
      try {
        await started.close();
      } finally {
        await parts.close();
      }
    },
  };
}
