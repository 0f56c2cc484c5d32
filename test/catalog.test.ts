// The model catalog file: what it accepts, what it refuses (with messages naming the field), and
// how checkpoints and per-organization rates resolve.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeModel } from '../models/make-model.js';
import { loadCatalog, parseCatalog } from '../src/config/catalog.js';
import { ModelRegistry } from '../src/serving/model-registry.js';
import { price } from './helpers/api-catalog.js';

let root: string;
beforeAll(() => { root = mkdtempSync(join(os.tmpdir(), 'sluice-catalog-')); });
afterAll(() => rmSync(root, { recursive: true, force: true }));

const model = (extra: Record<string, unknown> = {}) => ({ id: 'm', checkpoint: 'ckpt', ...extra });

describe('parseCatalog', () => {
  it('resolves checkpoints against the catalog directory', () => {
    const catalog = parseCatalog({ models: [model(), { id: 'abs', checkpoint: '/models/x' }] }, 'c.json', '/etc/sluice');
    expect(catalog.models.map((m) => m.checkpoint)).toEqual(['/etc/sluice/ckpt', '/models/x']);
  });

  it('resolves a LoRA adapter against the catalog directory', () => {
    const catalog = parseCatalog({ models: [model(), model({ id: 'tuned', lora: 'adapters/a' })] }, 'c.json', '/etc/sluice');
    expect(catalog.models.map((m) => m.lora)).toEqual([undefined, '/etc/sluice/adapters/a']);
    expect(() => parseCatalog({ models: [model({ lora: '' })] }, 'c.json', '/etc')).toThrow(/models\.0\.lora/);
  });

  it('resolves a speculative draft model against the catalog directory too', () => {
    const catalog = parseCatalog({
      engine: { speculative: { method: 'ngram', num_speculative_tokens: 3 } },
      models: [model({ engine: { speculative: { method: 'draft', draft_model: 'drafts/small' } } })],
    }, 'c.json', '/etc/sluice');
    expect(catalog.models[0]!.engine!.speculative).toEqual({ method: 'draft', draft_model: '/etc/sluice/drafts/small' });
    expect(catalog.engine!.speculative).toEqual({ method: 'ngram', num_speculative_tokens: 3 });
  });

  it.each([
    ['no models', { models: [] }, /models must NOT have fewer than 1 items/],
    ['unknown field', { models: [model({ colour: 'red' })] }, /models\.0 has an unknown field "colour"/],
    ['bad id', { models: [model({ id: ' spaces ' })] }, /models\.0\.id must match/],
    ['duplicate id', { models: [model(), model()] }, /"m" is listed twice/],
    ['unknown tier', { models: [model({ pricing: [{ ...price('asap', 1, 0, 1), tier: 'slow' }] })] }, /pricing\.0\.tier/],
    ['negative price', { models: [model({ pricing: [price('asap', -1, 0, 1)] })] }, /input_per_1m_tokens must be >= 0/],
    ['duplicate tier', { models: [model({ pricing: [price('asap', 1, 0, 1), price('asap', 2, 0, 1)] })] }, /lists tier "asap" twice/],
    ['duplicate negotiated tier', { models: [model({ negotiated_pricing: { acme: [price('flex', 1, 0, 1), price('flex', 1, 0, 1)] } })] }, /negotiated_pricing\.acme lists tier "flex" twice/],
    ['grants without restricted', { models: [model({ granted_organizations: ['acme'] })] }, /not restricted/],
    ['image input claimed', { models: [model({ supports_image_input: true })] }, /may only be false \(to turn image input off\): image input follows the checkpoint/],
    ['tools claimed', { models: [model({ supports_tools: true })] }, /follows the checkpoint's chat template/],
    // Fields earlier catalogs had for the model object, which now carries only the spec's fields.
    ['owned_by (removed)', { models: [model({ owned_by: 'qwen' })] }, /catalog\.json: models\.0\.owned_by: model objects no longer carry owned_by .*remove it/],
    ['created (removed)', { models: [model({ created: 1726444800 })] }, /catalog\.json: models\.0\.created: model objects no longer carry created .*remove it/],
    ['unknown default effort', { models: [model({ default_reasoning_effort: 'max' })] }, /models\.0\.default_reasoning_effort must be equal to one of/],
    ['unknown matmul precision', { models: [model({ engine: { matmul_precision: 'f16' } })] }, /models\.0\.engine\.matmul_precision must be equal to one of/],
    ['speculative method', { models: [model({ engine: { speculative: { method: 'medusa' } } })] }, /engine\.speculative\.method must be equal to one of/],
    ['eagle3 without its head', { models: [model({ engine: { speculative: { method: 'eagle3' } } })] }, /draft_model goes with method "draft" or "eagle3"/],
    ['too many speculative tokens', { models: [model({ engine: { speculative: { method: 'ngram', num_speculative_tokens: 17 } } })] }, /num_speculative_tokens must be <= 16/],
    ['draft without its model', { models: [model({ engine: { speculative: { method: 'draft' } } })] }, /draft_model goes with method "draft"/],
    ['a draft model for prompt lookup', { engine: { speculative: { method: 'ngram', draft_model: 'd' } }, models: [model()] }, /engine\.speculative: draft_model goes with method "draft"/],
    ['bad effective_from', { models: [model({ long_context_pricing: { above_input_tokens: 10, input_multiplier: 2, output_multiplier: 2, effective_from: '2026-13-01' } })] }, /effective_from must match format "date"/],
  ])('refuses %s', (_name, value, message) => {
    expect(() => parseCatalog(value, 'catalog.json', '/')).toThrow(message);
  });

  it('accepts a default reasoning effort and a matmul precision (models/catalog.example.json has both)', async () => {
    const catalog = await loadCatalog(join(import.meta.dirname, '..', 'models', 'catalog.example.json'));
    const qwen3 = catalog.models.find((m) => m.id === 'qwen3-8b')!;
    expect(qwen3.default_reasoning_effort).toBe('none');
    expect(qwen3.engine?.matmul_precision).toBe('bf16');
  });

  it('reports unreadable and non-JSON files with their path', async () => {
    await expect(loadCatalog(join(root, 'missing.json'))).rejects.toThrow(/cannot read the model catalog .*missing\.json/);
    writeFileSync(join(root, 'bad.json'), '{ nope');
    await expect(loadCatalog(join(root, 'bad.json'))).rejects.toThrow(/bad\.json is not valid JSON/);
  });
});

describe('ModelRegistry', () => {
  it('loads each checkpoint once, resolves rates per organization and refuses a context above the checkpoint\'s', async () => {
    const dir = join(root, 'tiny');
    await makeModel({ preset: 'tiny', out: dir, seed: 3 });
    const catalog = parseCatalog({
      models: [
        { id: 'a', checkpoint: dir, pricing: [price('standard', 1, 0.5, 2), price('flex', 0.5, 0, 1)], negotiated_pricing: { acme: [price('flex', 0.25, 0, 0.5), price('asap', 9, 0, 9)] } },
        { id: 'b', checkpoint: dir, context_length: 100 },
      ],
    }, 'c.json', root);
    const registry = await ModelRegistry.load(catalog, { engineDefaults: { backend: 'cpu', kvCacheBytes: 16 << 20 } });
    try {
      const [a, b] = registry.models;
      expect(a!.engine).toBe(b!.engine);
      expect(a!.windowsFor('someone')).toEqual(['standard', 'flex']);
      // Negotiated rates replace a tier's published rate and may open a tier for that organization.
      expect(a!.pricingFor('acme').map((p) => [p.tier, p.input_per_1m_tokens])).toEqual([['asap', 9], ['standard', 1], ['flex', 0.25]]);
      expect(b!.contextLength).toBe(100);
      expect(b!.windowsFor('someone')).toEqual(['asap', 'standard', 'flex']);
    } finally {
      await registry.dispose();
    }
    // matmul_precision reaches the engine: per model, over the catalog-wide setting and serve's default.
    const other = join(root, 'tiny-2');
    await makeModel({ preset: 'tiny', out: other, seed: 3 });
    const precise = parseCatalog({
      engine: { matmul_precision: 'bf16' },
      models: [{ id: 'fast', checkpoint: dir }, { id: 'exact', checkpoint: other, engine: { matmul_precision: 'f32' } }],
    }, 'c.json', root);
    const loaded = await ModelRegistry.load(precise, { engineDefaults: { backend: 'cpu', kvCacheBytes: 16 << 20, matmulPrecision: 'f32' } });
    try {
      expect(loaded.models.map((m) => [m.id, m.engine.info.matmulPrecision])).toEqual([['fast', 'bf16'], ['exact', 'f32']]);
    } finally {
      await loaded.dispose();
    }
    const tooLong = parseCatalog({ models: [{ id: 'c', checkpoint: dir, context_length: 1_000_000 }] }, 'c.json', root);
    await expect(ModelRegistry.load(tooLong, { engineDefaults: { backend: 'cpu', kvCacheBytes: 16 << 20 } }))
      .rejects.toThrow(/context_length 1000000 is more than the checkpoint's 2048/);
  });
});
