// The one composition root. openRuntime() opens what a sluice process serves from (the locked data
// directory, the store, the catalog's models, a first API key when there is none) and builds every
// service on them once: the per-organization limits, the generation service, the usage ledger, the
// request lifecycle, completion webhooks, background responses and batches, all under one lease
// owner. The HTTP app (api/app.ts), the mountable plugin (api/plugin.ts, embed.ts), `sluice serve`
// and openService (service.ts) are thin layers over a Runtime; none builds a service of its own.
//
// assembleRuntime() builds the same services over a store and models the caller already opened
// (tests, a host that manages its own store); close() then leaves those to their owner.
//
// Life: start() once the HTTP routes are mounted (webhooks resume pending deliveries, background
// responses and batches claim what is free); drain() stops claiming new work while what runs
// finishes; close() stops the work (handing its leases back), then closes what openRuntime opened.

import type { ImageInputSettings } from './serving/request-images.js';
import { mkdirSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { Billing } from './billing/ledger.js';
import { BatchRunner, type BatchDeadlines } from './batches/runner.js';
import type { Catalog } from './config/catalog.js';
import type { EngineLoadOptions } from './engine/engine.js';
import { BackgroundResponses, DEFAULT_WINDOW_DEADLINES, type WindowDeadlines } from './jobs/background-responses.js';
import { ServiceMetrics } from './metrics/service-metrics.js';
import { GenerationService } from './serving/generation-service.js';
import { RequestLifecycle } from './serving/lifecycle.js';
import { ModelRegistry } from './serving/model-registry.js';
import { ReasoningSeal } from './serving/reasoning-seal.js';
import { TenantLimiter, type OrgLimits } from './serving/tenant-limits.js';
import { createApiKey, type CreatedKey } from './store/api-keys.js';
import { DataDirLock } from './store/data-dir-lock.js';
import { openPostgresStore } from './store/database-url.js';
import { loadOrCreatePrefixHashKey } from './store/deployment-key.js';
import { leaseConfig, type LeaseConfig } from './store/leases.js';
import { SqliteStore } from './store/sqlite-store.js';
import type { Store } from './store/store.js';
import { WebhookDispatcher, type WebhookSettings } from './jobs/webhook-deliveries.js';

export const DEFAULT_ORGANIZATION = 'default';

/** The pino-compatible subset the runtime's work logs with. */
export interface RuntimeLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** Settings of the services, whoever opened the store and the models. */
export interface RuntimeSettings {
  /** Where file bytes live when not `<dataDir>/files` (a volume replicas share). */
  filesDir?: string;
  /** Per-organization limits for every organization; the catalog's `limits` override them per organization. */
  orgLimits?: Partial<OrgLimits>;
  /** This process's replica id and lease length for all its leased work; default a new id, DEFAULT_LEASE_TTL_MS. */
  lease?: LeaseConfig;
  /** Seconds a background response may stay in_progress, per completion window. */
  deadlines?: Partial<WindowDeadlines>;
  /** Completion webhook settings (defaults: the spec's 30 s timeout and 3 retries, private destinations refused). */
  webhooks?: WebhookSettings;
  /** Image parts: URL address policy and per-request limits (defaults: private destinations refused, 16 images). */
  images?: ImageInputSettings;
  /** Seconds from a batch's creation to its expiry, per window it runs at (24h runs as flex). */
  batchDeadlines?: Partial<BatchDeadlines>;
  /** The Prometheus registry the work reports to (default: one of the runtime's own). */
  metrics?: ServiceMetrics;
  /** Where the work logs (default stderr lines until useLog gives the app's logger). */
  log?: RuntimeLog;
}

export interface AssembleRuntimeOptions extends RuntimeSettings {
  store: Store;
  registry: ModelRegistry;
  dataDir: string;
  /** Per-organization limits object (default: one built from the catalog-less orgLimits). */
  limits?: TenantLimiter;
}

export interface OpenRuntimeOptions extends RuntimeSettings {
  catalog: Catalog;
  /**
   * Directory for sluice.db, the deployment's secrets and file bytes (created 0700 if missing). One
   * process per directory: a second open fails (SluiceError data_dir_locked) while the first runs.
   */
  dataDir: string;
  /** A PostgreSQL database (postgres:// URL) instead of the SQLite file: several replicas may share it. */
  databaseUrl?: string;
  /** The schema of sluice's tables in that database (default: the connection's, normally public). */
  databaseSchema?: string;
  engineDefaults?: Omit<EngineLoadOptions, 'model'>;
  onProgress?: (message: string) => void;
}

const stderrLine = (obj: object, msg: string) =>
  process.stderr.write(`sluice: ${msg} ${JSON.stringify(obj, (_k, v) => (v instanceof Error ? v.stack : v))}\n`);
const STDERR_LOG: RuntimeLog = { info: stderrLine, warn: stderrLine, error: stderrLine };

export class Runtime {
  readonly store: Store;
  readonly registry: ModelRegistry;
  /** The absolute data directory. */
  readonly dataDir: string;
  /** The absolute files directory when one was given (else the bytes are in `<dataDir>/files`). */
  readonly filesDir: string | undefined;
  /** One limiter for every request and batch line: an organization's limits are its own. */
  readonly limits: TenantLimiter;
  /** This process's replica id (the owner of every lease it takes) and lease length. */
  readonly lease: LeaseConfig;
  readonly metrics: ServiceMetrics;
  readonly service: GenerationService;
  readonly billing: Billing;
  readonly lifecycle: RequestLifecycle;
  readonly webhooks: WebhookDispatcher;
  readonly background: BackgroundResponses;
  readonly batches: BatchRunner;
  /** The key openRuntime made because the store had none (show it once), else undefined. */
  firstKey: CreatedKey | undefined;
  private log: RuntimeLog;
  private draining = false;
  private started = false;
  private closed = false;

  /** `closeOwned`: closes what was opened for this runtime (openRuntime), after its work has stopped. */
  constructor(opts: AssembleRuntimeOptions, private readonly closeOwned: () => Promise<void> = async () => {}) {
    this.store = opts.store;
    this.registry = opts.registry;
    this.dataDir = resolve(opts.dataDir);
    this.filesDir = opts.filesDir === undefined ? undefined : resolve(opts.filesDir);
    this.limits = opts.limits ?? new TenantLimiter(undefined, opts.orgLimits);
    this.lease = opts.lease ?? leaseConfig();
    this.metrics = opts.metrics ?? new ServiceMetrics();
    this.log = opts.log ?? STDERR_LOG;
    // The work logs through this, so that useLog() reaches what was built before the app existed.
    const log: RuntimeLog = {
      info: (obj, msg) => this.log.info(obj, msg),
      warn: (obj, msg) => this.log.warn(obj, msg),
      error: (obj, msg) => this.log.error(obj, msg),
    };
    this.service = new GenerationService(this.registry, this.limits, ReasoningSeal.open(this.dataDir), opts.images);
    this.billing = new Billing();
    this.webhooks = new WebhookDispatcher(this.store, {
      ...opts.webhooks, log: opts.webhooks?.log ?? log, lease: this.lease,
      onAttempt: (outcome) => {
        this.metrics.webhookAttempt(outcome);
        opts.webhooks?.onAttempt?.(outcome);
      },
    });
    this.lifecycle = new RequestLifecycle({ service: this.service, store: this.store, billing: this.billing, webhooks: this.webhooks });
    this.background = new BackgroundResponses({
      store: this.store, lifecycle: this.lifecycle, log, lease: this.lease,
      deadlines: { ...DEFAULT_WINDOW_DEADLINES, ...opts.deadlines }, draining: () => this.draining,
    });
    this.batches = new BatchRunner({
      store: this.store, lifecycle: this.lifecycle, dataDir: this.dataDir, lease: this.lease, log,
      ...(this.filesDir !== undefined && { filesDir: this.filesDir }),
      ...(opts.batchDeadlines && { deadlines: opts.batchDeadlines }),
      onLineDone: (outcome) => this.metrics.batchLineDone(outcome),
    });
  }

  /** The logger the work writes to from now on (the HTTP app's, once it exists). */
  useLog(log: RuntimeLog): void {
    this.log = log;
  }

  /** True from drain() on: no new background or batch work is claimed. */
  isDraining(): boolean {
    return this.draining;
  }

  /**
   * Once the routes are mounted: pending webhook deliveries resume; background responses and
   * batches claim what is free (work a previous process or a dead replica left). Once only.
   */
  async start(): Promise<void> {
    if (this.started || this.closed) return;
    this.started = true;
    await this.webhooks.start();
    await this.webhooks.logPending().catch((err: unknown) => this.log.error({ err }, 'completion webhooks: could not count pending deliveries'));
    await this.background.recover();
    await this.batches.start();
  }

  /** Stops claiming new background and batch work; what runs goes on. */
  drain(): void {
    this.draining = true;
    this.batches.drain();
  }

  /**
   * Stops the work without storing an outcome for what was running (its leases are handed back, so
   * another replica or the next start takes it), then closes what openRuntime opened: the models,
   * the store, the data directory's lock. Safe to call twice.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.background.close();
      await this.batches.stop();
      await this.webhooks.close();
    } finally {
      await this.closeOwned();
    }
  }
}

/** The services over a store and models the caller opened (and closes). */
export function assembleRuntime(opts: AssembleRuntimeOptions): Runtime {
  return new Runtime(opts);
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

/**
 * Locks the data directory, opens the store (releasing the idempotency keys of requests the last
 * process was running, when it owns the store alone), loads the catalog's models, makes a first
 * API key when there is none, and builds every service once.
 */
export async function openRuntime(opts: OpenRuntimeOptions): Promise<Runtime> {
  const dataDir = resolve(opts.dataDir);
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // Before anything touches the directory: a second server must not resume this one's work.
  // With PostgreSQL it still guards this process's own directory (its secrets, and the file bytes
  // unless filesDir moves them); the database and a files directory are shared by design.
  const lock = DataDirLock.acquire(dataDir);
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
    // A PostgreSQL store is shared: the pending keys may be another running replica's (their
    // leases free them).
    if (opts.databaseUrl === undefined) await store.releasePendingIdempotency();
    registry = await ModelRegistry.load(opts.catalog, {
      engineDefaults: { threads: defaultServeThreads(), prefixHashKey: loadOrCreatePrefixHashKey(dataDir), ...opts.engineDefaults },
      ...(opts.onProgress && { onProgress: opts.onProgress }),
      onMessage: opts.onProgress ?? ((m) => process.stderr.write(`sluice: ${m}\n`)),
    });
    const firstKey = (await store.countActiveApiKeys()) === 0 ? await createApiKey(store, DEFAULT_ORGANIZATION) : undefined;
    const loaded = registry;
    const opened = store;
    const runtime = new Runtime({
      ...opts, store, registry, dataDir, limits: new TenantLimiter(opts.catalog.limits, opts.orgLimits),
    }, async () => {
      try {
        await loaded.dispose();
        await opened.close();
      } finally {
        lock.release();
      }
    });
    runtime.firstKey = firstKey;
    return runtime;
  } catch (err) {
    await registry?.dispose();
    await store.close();
    lock.release();
    throw err;
  }
}
