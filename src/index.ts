// The package entry: `import { Engine } from 'sluice'`.

export { Engine, defaultKvCacheBytes } from './engine/engine.js';
export type { EngineInfo, EngineLoadOptions, SchedulerStats } from './engine/engine.js';
export type { EngineObserver, KvPoolCounts, RequestReport, StepReport } from './engine/engine-events.js';
export type {
  GenerateChunk, GenerateRequest, GenerateResult, TokenLogprob, TopLogprob, Timings, Usage,
} from './engine/request.js';
export type { ChatMessage, ChatRole, ChatTextPart } from './text/chat-template.js';
export type { FinishReason } from './text/stops.js';
export type { BackendName } from './native/native-types.js';
export { SluiceTokenizer } from './text/tokenizer.js';
export { SluiceError, isSluiceError } from './errors.js';
export type { SluiceErrorCode } from './errors.js';
export { makeModel } from '../models/make-model.js';
export type { MakeModelOptions } from '../models/make-model.js';

// The HTTP service: the whole of `sluice serve` in-process, or the API as a fastify plugin (createSluice
// opens what the plugin needs and mounts it in a host app; sluiceApi is the bare plugin).
export { openService, DEFAULT_ORGANIZATION } from './service.js';
export type { OpenServiceOptions, Service } from './service.js';
export { openRuntime, assembleRuntime, Runtime } from './runtime.js';
export type { AssembleRuntimeOptions, OpenRuntimeOptions, RuntimeLog, RuntimeSettings } from './runtime.js';
export { createSluice } from './embed.js';
export type { CreateSluiceOptions, Sluice } from './embed.js';
export { createServer } from './api/app.js';
export type { CreateServerOptions } from './api/app.js';
export { ServiceMetrics } from './metrics/service-metrics.js';
export type { ServiceMetricsOptions } from './metrics/service-metrics.js';
export { sluiceApi, API_VERSION } from './api/plugin.js';
export type { SluiceApiOptions } from './api/plugin.js';
export type { WebhookLog, WebhookSettings } from './jobs/webhook-deliveries.js';
export { DEFAULT_TRANSPORT_LIMITS } from './api/transport.js';
export type { TransportLimits } from './api/transport.js';
export { TenantLimiter, DEFAULT_ORG_LIMITS } from './serving/tenant-limits.js';
export type { OrgLimits } from './serving/tenant-limits.js';
export { loadCatalog, parseCatalog, singleModelCatalog } from './config/catalog.js';
export type { Catalog, CatalogModel, ModelPrice, LongContextPricing, CompletionWindow } from './config/catalog.js';
export { ModelRegistry } from './serving/model-registry.js';
export { SqliteStore } from './store/sqlite-store.js';
export type { Store } from './store/store.js';
export { createApiKey, revokeApiKey } from './store/api-keys.js';
