// The catalog `sluice serve` serves, from its flags: a catalog file (--config), one model
// directory (--model), or the tiny demo model with example prices. `sluice models` lists the same.

import { basename } from 'node:path';
import { SluiceError } from '../errors.js';
import { loadCatalog, singleModelCatalog, type Catalog, type ModelPrice } from '../config/catalog.js';
import { PRESETS } from '../../models/make-model.js';
import { DEMO_PRESET, demoModelDir, ensureDemoModel } from './demo-model.js';

/**
 * Example rates of the demo catalog, USD per 1M tokens: not anyone's real prices. They put a rate
 * on every completion window so that a first run shows the tiers, their costs in usage, and
 * `sluice usage` at work.
 */
export const DEMO_PRICING: ModelPrice[] = [
  { tier: 'asap', input_per_1m_tokens: 0.2, cached_input_per_1m_tokens: 0.05, output_per_1m_tokens: 0.8 },
  { tier: 'standard', input_per_1m_tokens: 0.1, cached_input_per_1m_tokens: 0.025, output_per_1m_tokens: 0.4 },
  { tier: 'flex', input_per_1m_tokens: 0.05, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 0.2 },
];

/** The catalog of `sluice serve` without --model or --config: the demo model, priced with DEMO_PRICING. */
export function demoCatalog(checkpoint = demoModelDir()): Catalog {
  return {
    models: [{
      id: DEMO_PRESET,
      name: 'tiny demo model (random weights; example prices)',
      checkpoint,
      // The preset's own window, stated so that `sluice models` needs no model on disk.
      context_length: PRESETS[DEMO_PRESET]!.maxPositionEmbeddings,
      pricing: DEMO_PRICING.map((p) => ({ ...p })),
    }],
  };
}

export interface CatalogFlags {
  model?: string | undefined;
  config?: string | undefined;
}

/**
 * The catalog the flags name. `makeDemo`: make the demo model first if it is missing (serve);
 * without it the demo catalog points at where it will be (models).
 */
export async function servedCatalog(flags: CatalogFlags, command: string,
  opts: { makeDemo: boolean; log: (message: string) => void }): Promise<Catalog> {
  if (flags.model !== undefined && flags.config !== undefined) {
    throw new SluiceError('invalid_argument', `${command}: give --model or --config, not both`);
  }
  if (flags.config !== undefined) return loadCatalog(flags.config);
  if (flags.model !== undefined) return singleModelCatalog(flags.model, basename(flags.model));
  return demoCatalog(opts.makeDemo ? await ensureDemoModel(opts.log) : demoModelDir());
}
