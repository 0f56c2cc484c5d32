// What every route module gets: the store, the served models and the generation service.

import type { Store } from '../store/store.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import type { GenerationService } from '../serving/generation-service.js';
import type { BackgroundResponses } from './background-responses.js';
import type { WebhookDispatcher } from '../webhooks/dispatcher.js';
import type { BatchRunner } from '../batches/runner.js';
import type { Billing } from '../billing/ledger.js';
import type { LeaseConfig } from '../store/leases.js';

export interface ApiContext {
  store: Store;
  registry: ModelRegistry;
  service: GenerationService;
  /** Root of file bytes and other on-disk state (the SQLite file lives here too). */
  dataDir: string;
  /** Where file bytes live when not `<dataDir>/files` (a volume replicas share). */
  filesDir?: string;
  /** Runs, cancels, times out and resumes background responses. */
  background: BackgroundResponses;
  /** Completion webhooks: routes enqueue each final object (absent: no callbacks are sent). */
  webhooks?: WebhookDispatcher;
  /** Creates, runs, cancels and resumes batches. */
  batches: BatchRunner;
  /** The usage ledger: every request that finishes with a result is recorded once. */
  billing: Billing;
  /** This process's replica id and lease length: in-progress idempotency keys are leased to it. */
  lease: LeaseConfig;
}
