// The served models: each catalog entry with its loaded engine, and what a given organization
// sees of it (visibility of restricted models, negotiated rates, the completion windows it may
// use). Entries naming the same checkpoint share one engine.

import { SluiceError } from '../errors.js';
import { percentSteps } from '../progress.js';
import { Engine, type EngineLoadOptions } from '../engine/engine.js';
import { DEFAULT_SPECULATIVE_TOKENS } from '../scheduler/speculator.js';
import { toolCallFormat } from '../text/tool-calls.js';
import {
  COMPLETION_WINDOWS, pricingFor, visibleTo, type Catalog, type CatalogModel, type CompletionWindow, type EngineSettings,
  type LongContextPricing, type ModelPrice,
} from '../config/catalog.js';

/** The Model object of GET /v1/models: the spec's fields and no other. */
export interface ModelObject {
  id: string;
  object: 'model';
  name: string;
  context_length: number;
  supports_chat: boolean;
  supports_image_input: boolean;
  supports_tools: boolean;
  restricted?: true;
  pricing: ModelPrice[];
  long_context_pricing?: LongContextPricing;
}

export class ServedModel {
  readonly contextLength: number;
  readonly supportsChat: boolean;

  /** The entry's LoRA adapter, by its name in the engine (the entry's id); undefined: the base model. */
  readonly adapter: string | undefined;

  constructor(readonly entry: CatalogModel, readonly engine: Engine) {
    this.adapter = entry.lora === undefined ? undefined : entry.id;
    const native = engine.info.contextLength;
    if (entry.context_length !== undefined && entry.context_length > native) {
      throw new SluiceError('invalid_argument',
        `model ${entry.id}: context_length ${entry.context_length} is more than the checkpoint's ${native}`);
    }
    this.contextLength = entry.context_length ?? native;
    this.supportsChat = entry.supports_chat ?? engine.info.hasChatTemplate;
    if (this.supportsChat && !engine.info.hasChatTemplate) {
      throw new SluiceError('invalid_argument',
        `model ${entry.id}: supports_chat is true but ${entry.checkpoint} has no chat template`);
    }
  }

  get id(): string { return this.entry.id; }
  /** A vision-language checkpoint takes images unless the catalog turns them off. */
  get supportsImageInput(): boolean { return this.entry.supports_image_input !== false && this.engine.info.imageInput; }

  visibleTo(orgName: string): boolean {
    return visibleTo(this.entry, orgName);
  }

  /** Published rates with the organization's negotiated rates in place, in window order. */
  pricingFor(orgName: string): ModelPrice[] {
    return pricingFor(this.entry, orgName);
  }

  /**
   * The windows this organization may request: those with a rate. A model that publishes no rate
   * at all (a bare `--model DIR`) takes every window.
   */
  windowsFor(orgName: string): CompletionWindow[] {
    const priced = this.pricingFor(orgName).map((p) => p.tier);
    return priced.length > 0 ? priced : [...COMPLETION_WINDOWS];
  }

  toObject(orgName: string): ModelObject {
    const obj: ModelObject = {
      id: this.entry.id,
      object: 'model',
      name: this.entry.name ?? this.entry.id,
      context_length: this.contextLength,
      supports_chat: this.supportsChat,
      supports_image_input: this.supportsImageInput,
      // True where the model's template renders tools (and the catalog does not say false).
      supports_tools: this.entry.supports_tools !== false && toolCallFormat(this.engine.tokenizer.chatTemplate) !== undefined,
      pricing: this.pricingFor(orgName),
    };
    if (this.entry.restricted) obj.restricted = true;
    if (this.entry.long_context_pricing) obj.long_context_pricing = { ...this.entry.long_context_pricing };
    return obj;
  }
}

export interface RegistryLoadOptions {
  /** Settings under the catalog's own (the serve flags). */
  engineDefaults?: Omit<EngineLoadOptions, 'model'>;
  onProgress?: (message: string) => void;
  onMessage?: (message: string) => void;
}

function engineOptions(settings: EngineSettings | undefined): Omit<EngineLoadOptions, 'model'> {
  const out: Omit<EngineLoadOptions, 'model'> = {};
  if (!settings) return out;
  if (settings.backend !== undefined) out.backend = settings.backend;
  if (settings.kv_cache_bytes !== undefined) out.kvCacheBytes = settings.kv_cache_bytes;
  if (settings.gpu_memory_utilization !== undefined) out.gpuMemoryUtilization = settings.gpu_memory_utilization;
  if (settings.threads !== undefined) out.threads = settings.threads;
  if (settings.quantization !== undefined) out.quantization = settings.quantization;
  if (settings.kv_cache_dtype !== undefined) out.kvCacheDtype = settings.kv_cache_dtype;
  if (settings.matmul_precision !== undefined) out.matmulPrecision = settings.matmul_precision;
  if (settings.max_num_seqs !== undefined) out.maxNumSeqs = settings.max_num_seqs;
  if (settings.max_batched_tokens !== undefined) out.maxBatchedTokens = settings.max_batched_tokens;
  if (settings.lora_memory_bytes !== undefined) out.loraMemoryBytes = settings.lora_memory_bytes;
  if (settings.speculative !== undefined) {
    const { method, draft_model: draftModel, num_speculative_tokens: k } = settings.speculative;
    out.speculative = { method, numSpeculativeTokens: k ?? DEFAULT_SPECULATIVE_TOKENS, ...(draftModel !== undefined && { draftModel }) };
  }
  return out;
}

/** A LoRA adapter served as a model, as GET /v1/admin/adapters lists it. */
export interface AdapterObject {
  id: string;
  object: 'adapter';
  base: string;
  rank: number;
  bytes: number;
  /** Whether its weights are in the engine now (with a LoRA memory budget, idle adapters may not be). */
  resident: boolean;
  /** Requests of it accepted and not ended. */
  requests: number;
}

export class ModelRegistry {
  private readonly byId = new Map<string, ServedModel>();
  private served: ServedModel[];

  private constructor(models: readonly ServedModel[], private readonly engines: readonly Engine[]) {
    this.served = [...models];
    for (const m of models) this.byId.set(m.id, m);
  }

  /** The served models, in catalog order (adapters loaded while serving last). */
  get models(): readonly ServedModel[] {
    return this.served;
  }

  /** The adapters served as models, with their base model (the first entry of their checkpoint without one). */
  adapters(): AdapterObject[] {
    return this.served.filter((m) => m.adapter !== undefined).map((m) => {
      const status = m.engine.adapters().find((a) => a.name === m.adapter);
      return {
        id: m.id, object: 'adapter' as const, base: this.baseOf(m.engine)?.id ?? m.entry.checkpoint,
        rank: status?.rank ?? 0, bytes: status?.bytes ?? 0, resident: status?.resident ?? false, requests: status?.requests ?? 0,
      };
    });
  }

  private baseOf(engine: Engine): ServedModel | undefined {
    return this.served.find((m) => m.engine === engine && m.adapter === undefined);
  }

  /**
   * Serves a LoRA adapter on a base model while running: `entry` (its id, rates and grants; lora: its
   * directory) joins the catalog once the adapter is loaded into the base model's engine.
   */
  async addAdapter(entry: CatalogModel, baseId: string): Promise<ServedModel> {
    const base = this.byId.get(baseId);
    if (!base || base.adapter !== undefined) {
      throw new SluiceError('invalid_request', `"${baseId}" is not a base model of this server`, { param: 'base' });
    }
    if (this.byId.has(entry.id)) throw new SluiceError('invalid_request', `a model "${entry.id}" is served already`, { param: 'id' });
    if (entry.lora === undefined) throw new SluiceError('invalid_request', 'an adapter needs its directory', { param: 'dir' });
    await base.engine.loadAdapter(entry.id, entry.lora);
    const model = new ServedModel({ ...entry, checkpoint: base.entry.checkpoint }, base.engine);
    this.served = [...this.served, model];
    this.byId.set(model.id, model);
    return model;
  }

  /**
   * Stops serving an adapter: requests naming it are refused from now on (404, as an unknown model);
   * those already accepted finish first (this resolves after them).
   */
  async removeAdapter(id: string): Promise<void> {
    const model = this.byId.get(id);
    if (!model || model.adapter === undefined) throw new SluiceError('model_not_found', `no adapter "${id}" is served`, { param: 'id' });
    this.byId.delete(id);
    this.served = this.served.filter((m) => m !== model);
    await model.engine.unloadAdapter(model.adapter);
  }

  /** Loads every checkpoint of the catalog (each once). On failure, what was loaded is freed. */
  static async load(catalog: Catalog, opts: RegistryLoadOptions = {}): Promise<ModelRegistry> {
    const engines = new Map<string, Engine>();
    const models: ServedModel[] = [];
    try {
      // Every adapter of a checkpoint is loaded with its engine, named by its entry's id.
      const adapters = new Map<string, Record<string, string>>();
      for (const entry of catalog.models) {
        if (entry.lora === undefined) continue;
        const of = adapters.get(entry.checkpoint) ?? {};
        of[entry.id] = entry.lora;
        adapters.set(entry.checkpoint, of);
      }
      for (const entry of catalog.models) {
        let engine = engines.get(entry.checkpoint);
        if (!engine) {
          opts.onProgress?.(`loading ${entry.id} from ${entry.checkpoint}…`);
          const loadOptions: EngineLoadOptions = {
            ...opts.engineDefaults, ...engineOptions(catalog.engine), ...engineOptions(entry.engine), model: entry.checkpoint,
            ...(adapters.has(entry.checkpoint) && { loraAdapters: adapters.get(entry.checkpoint)! }),
          };
          if (opts.onMessage) loadOptions.onMessage = opts.onMessage;
          // Large checkpoints are read ahead of the load with a line per 10% (Engine.load's onLoadProgress).
          const onProgress = opts.onProgress;
          if (onProgress) loadOptions.onLoadProgress = percentSteps(`reading the weights of ${entry.id}:`, 10, (line) => onProgress(line));
          engine = await Engine.load(loadOptions);
          engines.set(entry.checkpoint, engine);
        }
        models.push(new ServedModel(entry, engine));
      }
    } catch (err) {
      await Promise.all([...engines.values()].map((e) => e.dispose()));
      throw err;
    }
    return new ModelRegistry(models, [...engines.values()]);
  }

  /** Models an organization may see, in catalog order. */
  listFor(orgName: string): ModelObject[] {
    return this.models.filter((m) => m.visibleTo(orgName)).map((m) => m.toObject(orgName));
  }

  /**
   * The model a request names. Unknown ids and restricted models the organization was not granted
   * fail alike, with model_not_found (404) and the same message: an answer that differed would
   * confirm to any key holder that a restricted model exists.
   */
  resolve(modelId: string, orgName: string, param = 'model'): ServedModel {
    const model = this.byId.get(modelId);
    if (!model || !model.visibleTo(orgName)) {
      throw new SluiceError('model_not_found', `the model "${modelId}" does not exist; GET /v1/models lists the available ones`, { param });
    }
    return model;
  }

  async dispose(): Promise<void> {
    await Promise.all(this.engines.map((e) => e.dispose()));
  }
}
