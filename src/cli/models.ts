// `sluice models`: the catalog `sluice serve` would serve with the same --model / --config (the
// demo catalog without either): each model's context length and its rates per completion window,
// read from the catalog and the checkpoints' config.json without loading any weights.

import { SluiceError } from '../errors.js';
import { pricingFor, visibleTo, type CatalogModel, type ModelPrice } from '../config/catalog.js';
import { checkpointContextLength } from '../engine/checkpoint-config.js';
import { commandFlags } from './args.js';
import { servedCatalog } from './served-catalog.js';

export const MODELS_HELP = `usage: sluice models [--model DIR | --config FILE] [--org NAME] [--json]

The models sluice serve serves with the same --model or --config (without either: the tiny demo
model, priced with example rates), with context length and rates in USD per 1M tokens per
completion window. Reads the catalog and each checkpoint's config.json; loads no weights.

  --model DIR       one model directory (no published rates)
  --config FILE     a model catalog (JSON; see models/catalog.example.json)
  --org NAME        what this organization sees: restricted models only if granted, its
                    negotiated rates in place (default: every model at its published rates)
  --json            one JSON object: {object: "list", data: [models]}
`;

/** One model as `sluice models` shows it: the API's model fields that need no loaded engine. */
export interface ListedModel {
  id: string;
  name: string;
  context_length: number;
  pricing: ModelPrice[];
  long_context_pricing?: CatalogModel['long_context_pricing'];
  restricted?: true;
  /** Without --org: who may use a restricted model. */
  granted_organizations?: string[];
}

/** The flags models accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const MODELS_OPTIONS = {
  model: { type: 'string' },
  config: { type: 'string' },
  org: { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runModels(args: string[]): Promise<void> {
  const values = commandFlags(args, MODELS_OPTIONS, 'models', MODELS_HELP);
  if (values === undefined) return;
  const catalog = await servedCatalog(values, 'models', { makeDemo: false, log: () => {} });
  const org = values.org;
  const contextLengths = new Map<string, Promise<number>>();
  const listed: ListedModel[] = [];
  for (const entry of catalog.models) {
    if (org !== undefined && !visibleTo(entry, org)) continue;
    if (!contextLengths.has(entry.checkpoint)) contextLengths.set(entry.checkpoint, checkpointContextLength(entry.checkpoint));
    listed.push(await listedModel(entry, contextLengths.get(entry.checkpoint)!, org));
  }
  if (values.json) {
    process.stdout.write(`${JSON.stringify({ object: 'list', data: listed })}\n`);
    return;
  }
  process.stdout.write(formatTable(listed, org === undefined));
}

async function listedModel(entry: CatalogModel, checkpointContext: Promise<number>, org: string | undefined): Promise<ListedModel> {
  // As ServedModel does: the catalog may lower the checkpoint's window, never raise it. A catalog
  // that states its window is listed even where its checkpoint is not on this machine.
  let native: number | undefined;
  try {
    native = await checkpointContext;
  } catch (err) {
    if (entry.context_length === undefined) throw err;
  }
  if (native !== undefined && entry.context_length !== undefined && entry.context_length > native) {
    throw new SluiceError('invalid_argument',
      `model ${entry.id}: context_length ${entry.context_length} is more than the checkpoint's ${native}`);
  }
  const model: ListedModel = {
    id: entry.id,
    name: entry.name ?? entry.id,
    context_length: entry.context_length ?? native!,
    pricing: pricingFor(entry, org),
  };
  if (entry.long_context_pricing) model.long_context_pricing = { ...entry.long_context_pricing };
  if (entry.restricted) {
    model.restricted = true;
    if (org === undefined) model.granted_organizations = [...(entry.granted_organizations ?? [])];
  }
  return model;
}

/** One row per model and priced window (one with "-" for a model without rates), tab-separated. */
function formatTable(models: ListedModel[], showGrants: boolean): string {
  const header = ['id', 'name', 'context_length', 'window', 'input_per_1m', 'cached_input_per_1m', 'output_per_1m', 'restricted'];
  const rows = [header.join('\t')];
  for (const m of models) {
    const restricted = !m.restricted ? '-' : showGrants ? `granted: ${m.granted_organizations!.join(', ') || 'none'}` : 'granted';
    const prices = m.pricing.length > 0 ? m.pricing : [undefined];
    for (const p of prices) {
      const rates = p ? [p.tier, p.input_per_1m_tokens, p.cached_input_per_1m_tokens, p.output_per_1m_tokens] : ['-', '-', '-', '-'];
      rows.push([m.id, m.name, m.context_length, ...rates, restricted].join('\t'));
    }
    const lc = m.long_context_pricing;
    if (lc) {
      rows.push(`  (${m.id}: above ${lc.above_input_tokens} input tokens, from ${lc.effective_from}: input x${lc.input_multiplier}, output x${lc.output_multiplier})`);
    }
  }
  return `${rows.join('\n')}\n`;
}
