// What every route module gets: the store, the served models and the generation service.

import type { Store } from '../store/store.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import type { GenerationService } from '../serving/generation-service.js';
import type { BatchRunner } from '../batches/runner.js';
import type { WebhookDispatcher } from '../webhooks/dispatcher.js';

export interface ApiContext {
  store: Store;
  registry: ModelRegistry;
  service: GenerationService;
  /** Root of file bytes and other on-disk state (the SQLite file lives here too). */
  dataDir: string;
  /** Creates, runs, cancels and resumes batches. */
  batches: BatchRunner;
  /** Completion webhooks: routes enqueue each final object (absent: no callbacks are sent). */
  webhooks?: WebhookDispatcher;
}
