// The service's Prometheus metrics (prom-client), in one registry per service instance: prom-client's
// global default registry would make two services in one process (tests, an embedding app with its
// own metrics) collide on names. `GET /metrics` renders it (api/metrics-route.ts).
//
// Where the numbers come from:
//   - HTTP requests: the app's onResponse hook (api/request-log.ts) calls observeHttp.
//   - Requests, tokens, latencies, preemptions, steps: each engine's reports (Engine.observe).
//   - Running / waiting per window and the KV pool: read from each engine when scraped.
//   - Batch lines and webhook deliveries: the batch runner's and the dispatcher's callbacks.
//
// Cardinality: model and window are bounded by the catalog; route by the route table (unmatched
// paths share one value); status by HTTP. Organizations are the operator's (a caller cannot make
// one), but a large deployment may have thousands: the first `maxOrganizations` seen get their
// name as the label, later ones share `_other`. Tenancy: scrapes need an admin key, which reads
// every organization's usage anyway; when the operator makes /metrics public (--metrics-public),
// no organization is named at all (organization="").

import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Engine } from '../engine/engine.js';
import type { RequestReport, StepReport } from '../engine/engine-events.js';
import { SCHEDULING_WINDOWS } from '../scheduler/window-policy.js';
import type { ModelRegistry } from '../serving/model-registry.js';
import { SluiceError } from '../errors.js';
import type { WebhookAttemptOutcome } from '../jobs/webhook-deliveries.js';

export interface ServiceMetricsOptions {
  /**
   * GET /metrics answers without a key (`sluice serve --metrics-public`); then no organization is
   * named in any label. Default false: an admin API key is needed.
   */
  public?: boolean;
  /** Organizations named in the organization label; those seen later count as `_other`. 0..10,000, default 100. */
  maxOrganizations?: number;
  /** Also Node's process metrics (CPU, memory, event loop lag, GC) in this registry. Default false (sluice serve: true). */
  processMetrics?: boolean;
}

export const DEFAULT_MAX_ORGANIZATIONS = 100;
export const MAX_MAX_ORGANIZATIONS = 10_000;
/** The organization label of organizations past maxOrganizations. */
export const OTHER_ORGANIZATIONS = '_other';

export type BatchLineOutcome = 'completed' | 'failed';

// Seconds. Queue and end-to-end times reach hours for background work (flex waits up to its 24 h
// deadline); first tokens, tokens and steps are milliseconds to seconds.
const LONG_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400];
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10];
const STEP_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const STEP_TOKEN_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
const FINISH_REASONS = ['stop', 'length', 'cancelled', 'failed'] as const;

type ModelWindow = 'model' | 'window';

export class ServiceMetrics {
  readonly registry = new Registry();
  /** Scrapes need no key; organizations are not named. */
  readonly isPublic: boolean;
  private readonly maxOrganizations: number;
  private readonly namedOrganizations = new Set<string>();
  /** Engine -> its model label (the first catalog id served by it). */
  private readonly engines = new Map<Engine, string>();

  private readonly httpRequests: Counter<'route' | 'method' | 'status' | 'organization'>;
  private readonly httpDuration: Histogram<'route' | 'method'>;
  private readonly finished: Counter<ModelWindow | 'reason'>;
  private readonly ttft: Histogram<ModelWindow>;
  private readonly tpot: Histogram<ModelWindow>;
  private readonly e2e: Histogram<ModelWindow>;
  private readonly queueTime: Histogram<ModelWindow>;
  private readonly promptTokens: Counter<ModelWindow>;
  private readonly generationTokens: Counter<ModelWindow>;
  private readonly cachedTokens: Counter<ModelWindow>;
  private readonly preemptions: Counter<ModelWindow>;
  private readonly stepDuration: Histogram<'model'>;
  private readonly stepTokens: Histogram<'model'>;
  private readonly specDraftTokens: Counter<'model'>;
  private readonly specAcceptedTokens: Counter<'model'>;
  private readonly batchLines: Counter<'outcome'>;
  private readonly webhookDeliveries: Counter<'outcome'>;
  private readonly webhookRetries: Counter;

  constructor(opts: ServiceMetricsOptions = {}) {
    this.isPublic = opts.public ?? false;
    const max = opts.maxOrganizations ?? DEFAULT_MAX_ORGANIZATIONS;
    if (!Number.isInteger(max) || max < 0 || max > MAX_MAX_ORGANIZATIONS) {
      throw new SluiceError('invalid_argument', `maxOrganizations must be an integer in 0..${MAX_MAX_ORGANIZATIONS}, got ${max}`,
        { param: 'maxOrganizations' });
    }
    this.maxOrganizations = max;
    const registers = [this.registry];
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
      new Counter<L>({ name, help, labelNames, registers });
    const histogram = <L extends string>(name: string, help: string, labelNames: readonly L[], buckets: number[]) =>
      new Histogram<L>({ name, help, labelNames, buckets, registers });
    const mw = ['model', 'window'] as const;

    this.httpRequests = counter('sluice_http_requests_total', 'HTTP requests answered, by route template, method, status and organization',
      ['route', 'method', 'status', 'organization']);
    this.httpDuration = histogram('sluice_http_request_duration_seconds', 'Time from a request\'s arrival to the end of its reply',
      ['route', 'method'], LONG_BUCKETS);
    this.finished = counter('sluice_requests_finished_total',
      'Generations that ended, by reason: stop, length (token limit), cancelled, failed', [...mw, 'reason']);
    this.ttft = histogram('sluice_time_to_first_token_seconds', 'Submission to the first generated token', mw, TTFT_BUCKETS);
    this.tpot = histogram('sluice_time_per_output_token_seconds',
      'Mean time between output tokens of a finished generation of two or more tokens', mw, TPOT_BUCKETS);
    this.e2e = histogram('sluice_e2e_request_latency_seconds', 'Submission to the end of a finished generation', mw, LONG_BUCKETS);
    this.queueTime = histogram('sluice_request_queue_time_seconds', 'Submission to the first engine step of a generation', mw, LONG_BUCKETS);
    this.promptTokens = counter('sluice_prompt_tokens_total', 'Prompt tokens of generations that ran, counted when they end', mw);
    this.generationTokens = counter('sluice_generation_tokens_total', 'Tokens generated, counted when the generation ends', mw);
    this.cachedTokens = counter('sluice_prompt_cached_tokens_total', 'Prompt tokens served from the prefix cache (not computed)', mw);
    this.preemptions = counter('sluice_preemptions_total', 'Running sequences preempted (KV freed, recomputed later), by their window', mw);
    this.stepDuration = histogram('sluice_engine_step_duration_seconds', 'Wall time of one engine step (forward pass and sampling)',
      ['model'], STEP_BUCKETS);
    this.stepTokens = histogram('sluice_engine_step_tokens', 'Tokens computed by one engine step (prefill chunks and decodes)',
      ['model'], STEP_TOKEN_BUCKETS);
    this.specDraftTokens = counter('sluice_spec_draft_tokens_total',
      'Speculative decoding: draft tokens the engine verified', ['model']);
    this.specAcceptedTokens = counter('sluice_spec_accepted_tokens_total',
      'Speculative decoding: verified draft tokens accepted (acceptance rate: this over the drafts)', ['model']);
    this.batchLines = counter('sluice_batch_lines_total', 'Batch lines done (their result row stored), by outcome', ['outcome']);
    this.webhookDeliveries = counter('sluice_webhook_deliveries_total',
      'Completion webhook deliveries that ended: delivered, failed (attempts used up), refused (destination not allowed)', ['outcome']);
    this.webhookRetries = new Counter({ name: 'sluice_webhook_retries_total', help: 'Failed webhook attempts that will be retried', registers });
    for (const outcome of ['completed', 'failed']) this.batchLines.inc({ outcome }, 0);
    for (const outcome of ['delivered', 'failed', 'refused']) this.webhookDeliveries.inc({ outcome }, 0);

    // Read from the engines at each scrape: what the scheduler holds now.
    const engines = this.engines;
    new Gauge({
      name: 'sluice_requests_running', help: 'Sequences holding KV blocks (prefilling or decoding), by completion window',
      labelNames: mw, registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) {
          for (const [window, n] of Object.entries(engine.schedulerStats().byWindow)) this.set({ model, window }, n.numRunning);
        }
      },
    });
    new Gauge({
      name: 'sluice_requests_waiting', help: 'Sequences queued for admission (preempted ones included), by completion window',
      labelNames: mw, registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) {
          for (const [window, n] of Object.entries(engine.schedulerStats().byWindow)) this.set({ model, window }, n.numWaiting);
        }
      },
    });
    new Gauge({
      name: 'sluice_kv_cache_blocks',
      help: 'KV blocks by state: used (held by sequences), cached (prefix blocks no sequence holds; evictable), free (empty)',
      labelNames: ['model', 'state'], registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) {
          const pool = engine.schedulerStats().kvPool;
          this.set({ model, state: 'used' }, pool.numTotalBlocks - pool.numFreeBlocks);
          this.set({ model, state: 'cached' }, pool.numEvictableBlocks);
          this.set({ model, state: 'free' }, pool.numFreeBlocks - pool.numEvictableBlocks);
        }
      },
    });
    new Gauge({
      name: 'sluice_kv_cache_usage_ratio', help: 'Fraction of the KV pool held by sequences (0..1)', labelNames: ['model'], registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) {
          const pool = engine.schedulerStats().kvPool;
          this.set({ model }, pool.numTotalBlocks === 0 ? 0 : (pool.numTotalBlocks - pool.numFreeBlocks) / pool.numTotalBlocks);
        }
      },
    });
    // LoRA adapters per engine: residency under its budget (src/engine/adapter-set.ts).
    new Gauge({
      name: 'sluice_lora_adapters', help: 'LoRA adapters known to the engine, by state: resident (weights loaded) or retired (loaded again on demand)',
      labelNames: ['model', 'state'], registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) {
          const a = engine.adapterStats();
          if (a.loads === 0) continue;
          this.set({ model, state: 'resident' }, a.resident);
          this.set({ model, state: 'retired' }, a.known - a.resident);
        }
      },
    });
    new Gauge({
      name: 'sluice_lora_resident_bytes', help: 'Bytes of the LoRA adapters resident in the engine (f32 weights)', labelNames: ['model'], registers,
      collect() {
        this.reset();
        for (const [engine, model] of engines) if (engine.adapterStats().loads > 0) this.set({ model }, engine.adapterStats().residentBytes);
      },
    });
    for (const [name, help, field] of [
      ['sluice_lora_loads_total', 'LoRA adapter loads into the engine (at start, by the admin endpoint, and again on demand)', 'loads'],
      ['sluice_lora_evictions_total', 'Idle LoRA adapters retired to make room under the memory budget', 'evictions'],
    ] as const) {
      new Counter({
        name, help, labelNames: ['model'], registers,
        collect() {
          this.reset();
          for (const [engine, model] of engines) {
            const a = engine.adapterStats();
            if (a.loads > 0) this.inc({ model }, a[field]);
          }
        },
      });
    }
    if (opts.processMetrics) collectDefaultMetrics({ register: this.registry });
  }

  /** The text exposition and its content type. */
  async render(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  /**
   * Reports the engines of `models` (each engine once, labelled with the first catalog id it
   * serves: ids sharing a checkpoint share its series). Returns the function that stops it.
   */
  watchModels(models: Pick<ModelRegistry, 'models'>): () => void {
    const stops: (() => void)[] = [];
    for (const served of models.models) {
      const engine = served.engine;
      if (this.engines.has(engine)) continue;
      const model = served.id;
      this.engines.set(engine, model);
      for (const window of SCHEDULING_WINDOWS) {
        for (const c of [this.promptTokens, this.generationTokens, this.cachedTokens, this.preemptions]) c.inc({ model, window }, 0);
        for (const reason of FINISH_REASONS) this.finished.inc({ model, window, reason }, 0);
      }
      stops.push(engine.observe({
        onStep: (report) => this.observeStep(model, report),
        onRequestEnd: (report) => this.observeRequest(model, report),
      }));
      stops.push(() => { this.engines.delete(engine); });
    }
    return () => { for (const stop of stops) stop(); };
  }

  /** One HTTP request answered. `organization`: the caller's name, when it authenticated. */
  observeHttp(route: string, method: string, status: number, organization: string | undefined, seconds: number): void {
    this.httpRequests.inc({ route, method, status: String(status), organization: this.organizationLabel(organization) });
    this.httpDuration.observe({ route, method }, seconds);
  }

  batchLineDone(outcome: BatchLineOutcome): void {
    this.batchLines.inc({ outcome });
  }

  /** A webhook attempt's stored outcome: a retry, or the end of its delivery. */
  webhookAttempt(outcome: WebhookAttemptOutcome): void {
    if (outcome === 'retry') this.webhookRetries.inc();
    else this.webhookDeliveries.inc({ outcome });
  }

  private organizationLabel(name: string | undefined): string {
    if (this.isPublic || name === undefined) return '';
    if (this.namedOrganizations.has(name)) return name;
    if (this.namedOrganizations.size >= this.maxOrganizations) return OTHER_ORGANIZATIONS;
    this.namedOrganizations.add(name);
    return name;
  }

  private observeStep(model: string, report: StepReport): void {
    this.stepDuration.observe({ model }, report.durationMs / 1000);
    if (report.ok) this.stepTokens.observe({ model }, report.numComputedTokens);
    if (report.numDraftTokens > 0) {
      this.specDraftTokens.inc({ model }, report.numDraftTokens);
      this.specAcceptedTokens.inc({ model }, report.numAcceptedTokens);
    }
    for (const priority of report.preempted) {
      const window = SCHEDULING_WINDOWS[priority];
      if (window !== undefined) this.preemptions.inc({ model, window });
    }
  }

  private observeRequest(model: string, r: RequestReport): void {
    const labels = { model, window: r.window };
    this.finished.inc({ ...labels, reason: r.outcome === 'finished' ? (r.finishReason ?? 'stop') : r.outcome });
    if (r.queuedMs !== undefined) {
      this.queueTime.observe(labels, r.queuedMs / 1000);
      this.promptTokens.inc(labels, r.numPromptTokens);
      this.cachedTokens.inc(labels, r.numCachedTokens);
    }
    this.generationTokens.inc(labels, r.numGeneratedTokens);
    if (r.firstTokenMs !== undefined) this.ttft.observe(labels, r.firstTokenMs / 1000);
    if (r.outcome !== 'finished') return;
    this.e2e.observe(labels, r.e2eMs / 1000);
    if (r.numGeneratedTokens > 1) this.tpot.observe(labels, r.decodeMs / 1000 / (r.numGeneratedTokens - 1));
  }
}
