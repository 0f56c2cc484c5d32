// The model catalog: which models `sluice serve` serves, what they are called, what they can do,
// what they cost per completion window, and who may use them. A JSON file (models/catalog.example.json
// shows every field); checkpoint paths are relative to the file's directory.

import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { Ajv } from 'ajv';
import addFormatsModule from 'ajv-formats';
import Type, { type Static } from 'typebox';
import { SluiceError } from '../errors.js';

const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv;

export const COMPLETION_WINDOWS = ['asap', 'standard', 'flex'] as const;
export type CompletionWindow = (typeof COMPLETION_WINDOWS)[number];

/** The reasoning efforts a request may name (OpenAI's values). */
export const REASONING_EFFORTS = ['none', 'minimal', 'low', 'medium', 'high', 'xhigh'] as const;

/**
 * Model fields of earlier catalogs that are refused now, with why. They described fields of the
 * model object that the API contract does not have (a model object carries only the spec's fields):
 * refused rather than ignored, so that an operator learns at start that they no longer show.
 */
const REMOVED_MODEL_FIELDS: Record<string, string> = {
  owned_by: 'model objects no longer carry owned_by (the API contract lists every field a model object has); remove it',
  created: 'model objects no longer carry created (the API contract lists every field a model object has); remove it',
};

const Price = Type.Number({ minimum: 0 });

export const ModelPriceSchema = Type.Object({
  tier: Type.Enum(COMPLETION_WINDOWS),
  input_per_1m_tokens: Price,
  cached_input_per_1m_tokens: Price,
  output_per_1m_tokens: Price,
}, { additionalProperties: false });
export type ModelPrice = Static<typeof ModelPriceSchema>;

export const LongContextPricingSchema = Type.Object({
  above_input_tokens: Type.Integer({ minimum: 1 }),
  input_multiplier: Type.Number({ minimum: 0 }),
  output_multiplier: Type.Number({ minimum: 0 }),
  effective_from: Type.String({ format: 'date' }),
}, { additionalProperties: false });
export type LongContextPricing = Static<typeof LongContextPricingSchema>;

const EngineSettingsSchema = Type.Object({
  backend: Type.Optional(Type.Enum(['auto', 'cpu', 'cuda', 'onnx'])),
  kv_cache_bytes: Type.Optional(Type.Integer({ minimum: 1 })),
  gpu_memory_utilization: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
  threads: Type.Optional(Type.Integer({ minimum: 0 })),
  quantization: Type.Optional(Type.Enum(['none', 'int8', 'fp8'])),
  /** The KV cache's element type: auto (default) or fp8 (e4m3, twice the blocks; serve --kv-cache-dtype). */
  kv_cache_dtype: Type.Optional(Type.Enum(['auto', 'fp8', 'fp8_e4m3'])),
  /** How activations meet bf16 weights on the CPU: f32 (default) or bf16 (faster prefill; serve --precision). */
  matmul_precision: Type.Optional(Type.Enum(['f32', 'bf16'])),
  max_num_seqs: Type.Optional(Type.Integer({ minimum: 1 })),
  max_batched_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  /**
   * A memory budget for the LoRA adapters served on this checkpoint (f32 bytes of their weights;
   * serve --lora-memory-bytes): beyond it, idle adapters are retired least recently used first and
   * loaded again when a request names them. Default: no budget, all resident.
   */
  lora_memory_bytes: Type.Optional(Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER })),
  /**
   * Speculative decoding (serve --speculative, --num-speculative-tokens): the proposer ('ngram':
   * prompt lookup; 'draft': the checkpoint at draft_model, with the target's tokenizer; 'eagle3':
   * the EAGLE-3 head at draft_model, in its published layout) and the
   * drafts a decode row verifies at most (default 4). CPU, or CUDA with the block sampler
   * (eagle3: CPU only).
   */
  speculative: Type.Optional(Type.Object({
    method: Type.Enum(['ngram', 'draft', 'eagle3']),
    draft_model: Type.Optional(Type.String({ minLength: 1 })),
    num_speculative_tokens: Type.Optional(Type.Integer({ minimum: 1, maximum: 16 })),
  }, { additionalProperties: false })),
}, { additionalProperties: false });
export type EngineSettings = Static<typeof EngineSettingsSchema>;

const CatalogModelSchema = Type.Object({
  id: Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:/-]*$', maxLength: 256 }),
  name: Type.Optional(Type.String({ minLength: 1 })),
  checkpoint: Type.String({ minLength: 1 }),
  /**
   * A LoRA adapter (PEFT layout) served on `checkpoint`: this entry is the base model with the
   * adapter, a model of its own (id, prices, grants, usage rows). Entries of one checkpoint, with
   * adapters or without, share one engine and its batches.
   */
  lora: Type.Optional(Type.String({ minLength: 1 })),
  /** Lowers the checkpoint's context window; never raises it. */
  context_length: Type.Optional(Type.Integer({ minimum: 2 })),
  /** Default: true when the checkpoint has a chat template. */
  supports_chat: Type.Optional(Type.Boolean()),
  // Image input follows the checkpoint (a vision-language model the engine serves, e.g. Qwen2.5-VL)
  // and tool support its chat template (it renders tools in a syntax sluice parses); false turns
  // either off.
  supports_image_input: Type.Optional(Type.Literal(false)),
  supports_tools: Type.Optional(Type.Literal(false)),
  pricing: Type.Optional(Type.Array(ModelPriceSchema)),
  long_context_pricing: Type.Optional(LongContextPricingSchema),
  /**
   * The reasoning effort of a request that names none (reasoning.effort, reasoning_effort), on
   * models that think (default medium, as OpenAI's). "none" turns thinking off unless a request
   * asks for it; a request's own value always wins. Models that do not think ignore it.
   */
  default_reasoning_effort: Type.Optional(Type.Enum(REASONING_EFFORTS)),
  restricted: Type.Optional(Type.Boolean()),
  /** Organization names that may see and use a restricted model. */
  granted_organizations: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
  /** Organization name -> its rates, replacing the published rate of each tier it lists. */
  negotiated_pricing: Type.Optional(Type.Record(Type.String(), Type.Array(ModelPriceSchema))),
  engine: Type.Optional(EngineSettingsSchema),
}, { additionalProperties: false });
export type CatalogModel = Static<typeof CatalogModelSchema>;

const OrgLimitFields = {
  /** Foreground generation requests of one organization at once (0: no limit). */
  max_inflight_requests: Type.Optional(Type.Integer({ minimum: 0, maximum: 1_000_000 })),
  /** Background responses of one organization in progress at once (0: no limit). */
  max_queued_background: Type.Optional(Type.Integer({ minimum: 0, maximum: 100_000_000 })),
  /** Prompt + generated tokens per minute for one organization (0: no limit). */
  tokens_per_minute: Type.Optional(Type.Integer({ minimum: 0, maximum: 1e15 })),
};
export const OrgLimitsSchema = Type.Object(OrgLimitFields, { additionalProperties: false });
export type OrgLimitSettings = Static<typeof OrgLimitsSchema>;

const LimitsSchema = Type.Object({
  ...OrgLimitFields,
  /** Organization name -> limits replacing the defaults above field by field. */
  organizations: Type.Optional(Type.Record(Type.String({ minLength: 1 }), OrgLimitsSchema)),
}, { additionalProperties: false });
export type LimitSettings = Static<typeof LimitsSchema>;

const CatalogSchema = Type.Object({
  models: Type.Array(CatalogModelSchema, { minItems: 1 }),
  /** Engine settings for every model; a model's own `engine` overrides them field by field. */
  engine: Type.Optional(EngineSettingsSchema),
  /** Per-organization limits (defaults for every organization, and overrides by name). */
  limits: Type.Optional(LimitsSchema),
}, { additionalProperties: false });
export type Catalog = Static<typeof CatalogSchema>;

const ajv = new Ajv({ allErrors: false, strict: false });
addFormats(ajv);
const validateCatalog = ajv.compile<Catalog>(CatalogSchema);

/** Checks a parsed catalog; `source` names it in errors. Checkpoint paths are resolved against `baseDir`. */
export function parseCatalog(value: unknown, source: string, baseDir: string): Catalog {
  if (!validateCatalog(value)) {
    const e = validateCatalog.errors![0]!;
    const where = e.instancePath.replace(/^\//, '').replace(/\//g, '.') || '(top level)';
    const field = e.keyword === 'additionalProperties' ? (e.params as { additionalProperty: string }).additionalProperty : undefined;
    if (field !== undefined && /^\/models\/\d+$/.test(e.instancePath) && Object.hasOwn(REMOVED_MODEL_FIELDS, field)) {
      throw new SluiceError('invalid_argument', `${source}: ${where}.${field}: ${REMOVED_MODEL_FIELDS[field]}`);
    }
    const detail = field !== undefined ? `has an unknown field "${field}"`
      : e.keyword === 'const' && /supports_image_input$/.test(e.instancePath)
        ? 'may only be false (to turn image input off): image input follows the checkpoint (a vision-language model)'
        : e.keyword === 'const' && /supports_tools$/.test(e.instancePath)
          ? 'may only be false (to turn tools off): tool support follows the checkpoint\'s chat template'
        : e.message ?? 'is invalid';
    throw new SluiceError('invalid_argument', `${source}: ${where} ${detail}`);
  }
  const seen = new Set<string>();
  for (const [i, model] of value.models.entries()) {
    if (seen.has(model.id)) throw new SluiceError('invalid_argument', `${source}: models.${i}.id "${model.id}" is listed twice`);
    seen.add(model.id);
    checkUniqueTiers(model.pricing ?? [], `${source}: models.${i}.pricing`);
    for (const [org, prices] of Object.entries(model.negotiated_pricing ?? {})) {
      checkUniqueTiers(prices, `${source}: models.${i}.negotiated_pricing.${org}`);
    }
    if (model.granted_organizations?.length && !model.restricted) {
      throw new SluiceError('invalid_argument',
        `${source}: models.${i} grants organizations but is not restricted (set "restricted": true)`);
    }
    model.checkpoint = resolve(baseDir, model.checkpoint);
    if (model.lora !== undefined) model.lora = resolve(baseDir, model.lora);
    const spec = model.engine?.speculative;
    if (spec?.draft_model !== undefined) spec.draft_model = resolve(baseDir, spec.draft_model);
    if (spec && (spec.method !== 'ngram') !== (spec.draft_model !== undefined)) {
      throw new SluiceError('invalid_argument', `${source}: models.${i}.engine.speculative: draft_model goes with method "draft" or "eagle3", and only with them`);
    }
  }
  const spec = value.engine?.speculative;
  if (spec?.draft_model !== undefined) spec.draft_model = resolve(baseDir, spec.draft_model);
  if (spec && (spec.method !== 'ngram') !== (spec.draft_model !== undefined)) {
    throw new SluiceError('invalid_argument', `${source}: engine.speculative: draft_model goes with method "draft" or "eagle3", and only with them`);
  }
  return value;
}

function checkUniqueTiers(prices: readonly ModelPrice[], where: string): void {
  const tiers = prices.map((p) => p.tier);
  const dup = tiers.find((t, i) => tiers.indexOf(t) !== i);
  if (dup) throw new SluiceError('invalid_argument', `${where} lists tier "${dup}" twice`);
}

export async function loadCatalog(path: string): Promise<Catalog> {
  const file = resolve(path);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new SluiceError('invalid_argument', `cannot read the model catalog ${file}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new SluiceError('invalid_argument', `the model catalog ${file} is not valid JSON: ${(err as Error).message}`);
  }
  return parseCatalog(value, file, dirname(file));
}

/** Whether an organization may see and use a model: every organization, or those granted a restricted one. */
export function visibleTo(model: CatalogModel, orgName: string): boolean {
  return !model.restricted || (model.granted_organizations ?? []).includes(orgName);
}

/**
 * A model's rates in window order: the published ones, with those the organization negotiated in
 * place of the published rate of each tier they list (published only, without an organization).
 */
export function pricingFor(model: CatalogModel, orgName?: string): ModelPrice[] {
  const byTier = new Map<string, ModelPrice>();
  for (const p of model.pricing ?? []) byTier.set(p.tier, p);
  if (orgName !== undefined) for (const p of model.negotiated_pricing?.[orgName] ?? []) byTier.set(p.tier, p);
  return COMPLETION_WINDOWS.filter((w) => byTier.has(w)).map((w) => ({ ...byTier.get(w)! }));
}

/** The catalog `sluice serve --model DIR` uses: one model, named after its directory, no published rates. */
export function singleModelCatalog(checkpoint: string, id: string): Catalog {
  return { models: [{ id, checkpoint: resolve(checkpoint) }] };
}
