// Starts the real service (store, engine, HTTP) in this process on a free port, for black-box
// tests with HTTP clients. Each server gets its own temporary data directory and tiny model.

import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { makeModel } from '../../models/make-model.js';
import type { Catalog } from '../../src/config/catalog.js';
import { openService, type Service } from '../../src/service.js';
import { createApiKey } from '../../src/store/api-keys.js';
import type { WebhookSettings } from '../../src/jobs/webhook-deliveries.js';
import type { ImageInputSettings } from '../../src/serving/request-images.js';
import type { ServiceMetricsOptions } from '../../src/metrics/service-metrics.js';
import type { FastifyBaseLogger } from 'fastify';

export interface TestServer {
  /** http://127.0.0.1:PORT (no /v1). */
  origin: string;
  /** origin + /v1: the base URL OpenAI clients take. */
  baseUrl: string;
  /** A key of organization "default". */
  key: string;
  service: Service;
  /** The tiny model's directory (catalog checkpoints may point at it). */
  modelDir: string;
  dataDir: string;
  /** A new key for an organization (created if new). */
  keyFor(org: string): Promise<string>;
  close(): Promise<void>;
}

export interface TestServerOptions {
  /** Builds the catalog from the tiny model's directory. Default: one model "tiny", no rates. */
  catalog?: (modelDir: string) => Catalog;
  /** Reuse a data directory (restarts); default a new temporary one, removed on close. */
  dataDir?: string;
  /** Background deadlines per window, seconds. */
  deadlines?: Partial<Record<'asap' | 'standard' | 'flex', number>>;
  /**
   * Completion webhook settings (short timeouts and backoff for tests). Callbacks to the local test
   * receiver (127.0.0.1) need `allowPrivateAddresses: true`: loopback is refused by default.
   */
  webhooks?: WebhookSettings;
  /** Runs after the tiny model is made and before the service opens (e.g. to make more models beside it). */
  beforeOpen?: (modelDir: string) => Promise<void>;
  /** Image parts' settings (URLs to the local test server need allowPrivateAddresses: true). */
  images?: ImageInputSettings;
  /** Batch deadlines per window, seconds. */
  batchDeadlines?: Partial<Record<'asap' | 'standard' | 'flex', number>>;
  /** GET /metrics settings (default: behind an admin key). */
  metrics?: ServiceMetricsOptions;
  /** A pino logger to capture the service's log lines (default: no log). */
  loggerInstance?: FastifyBaseLogger;
  /** Milliseconds between engine lines while busy (default the service's). */
  engineLogIntervalMs?: number;
  /** The dashboard plots' sample interval and count (default the service's: 5 s, 180). */
  dashboardHistory?: { intervalMs?: number; capacity?: number };
}

export async function startTestServer(opts: TestServerOptions = {}): Promise<TestServer> {
  const root = mkdtempSync(join(os.tmpdir(), 'sluice-api-'));
  const modelDir = join(root, 'tiny');
  await makeModel({ preset: 'tiny', out: modelDir, seed: 3 });
  const dataDir = opts.dataDir ?? join(root, 'data');
  await opts.beforeOpen?.(modelDir);
  const catalog = opts.catalog?.(modelDir) ?? { models: [{ id: 'tiny', checkpoint: modelDir }] };
  const service = await openService({
    catalog,
    dataDir,
    engineDefaults: { backend: 'cpu', kvCacheBytes: 64 << 20, threads: 1 },
    onProgress: () => {},
    ...(opts.deadlines && { deadlines: opts.deadlines }),
    ...(opts.webhooks && { webhooks: opts.webhooks }),
    ...(opts.images && { images: opts.images }),
    ...(opts.batchDeadlines && { batchDeadlines: opts.batchDeadlines }),
    ...(opts.metrics && { metrics: opts.metrics }),
    ...(opts.loggerInstance && { loggerInstance: opts.loggerInstance }),
    ...(opts.engineLogIntervalMs !== undefined && { engineLogIntervalMs: opts.engineLogIntervalMs }),
    ...(opts.dashboardHistory && { dashboardHistory: opts.dashboardHistory }),
  });
  const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const key = service.firstKey?.key ?? (await createApiKey(service.store, 'default')).key;
  return {
    origin: address,
    baseUrl: `${address}/v1`,
    key,
    service,
    modelDir,
    dataDir,
    keyFor: async (org) => (await createApiKey(service.store, org)).key,
    close: async () => {
      await service.close();
      rmSync(root, { recursive: true, force: true });
    },
  };
}
