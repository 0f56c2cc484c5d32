// The catalog the API tests serve: one tiny checkpoint under several catalog entries, covering
// rates per window, negotiated rates, long-context pricing, a restricted model, a flex-only model
// and a completion-only model with a short context.

import type { Catalog } from '../../src/config/catalog.js';

export const price = (tier: 'asap' | 'standard' | 'flex', input: number, cached: number, output: number) =>
  ({ tier, input_per_1m_tokens: input, cached_input_per_1m_tokens: cached, output_per_1m_tokens: output });

export function testCatalog(modelDir: string): Catalog {
  return {
    models: [
      {
        id: 'tiny',
        name: 'Tiny demo',
        checkpoint: modelDir,
        pricing: [price('asap', 0.4, 0.1, 1.2), price('standard', 0.2, 0.05, 0.6)],
        long_context_pricing: { above_input_tokens: 1000, input_multiplier: 2, output_multiplier: 1.5, effective_from: '2026-09-01' },
        negotiated_pricing: { acme: [price('standard', 0.15, 0, 0.5)] },
      },
      { id: 'tiny-asap', checkpoint: modelDir, pricing: [price('asap', 1, 0, 2)] },
      { id: 'tiny-flex', checkpoint: modelDir, pricing: [price('flex', 0.05, 0, 0.1)] },
      {
        id: 'tiny-restricted', name: 'Tiny (granted only)', checkpoint: modelDir,
        restricted: true, granted_organizations: ['acme'], pricing: [price('asap', 3, 0, 4)],
      },
      { id: 'tiny-base', checkpoint: modelDir, supports_chat: false, context_length: 64 },
    ],
  };
}
