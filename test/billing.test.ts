// The billing rules (spec: ModelPrice, ModelLongContextPricing) at every boundary, in exact
// decimal arithmetic. Pure: no engine, no store.

import { describe, expect, it } from 'vitest';
import type { CatalogModel, LongContextPricing, ModelPrice } from '../src/config/catalog.js';
import type { Engine } from '../src/engine/engine.js';
import type { GenerateResult } from '../src/engine/request.js';
import { Billing } from '../src/billing/ledger.js';
import { add, decimalFromNumber, divPow10, formatDecimal, mul, mulInt, parseDecimal, sum, ZERO } from '../src/billing/money.js';
import { costOf, isLongContext } from '../src/billing/pricing.js';
import { summarizeUsage, parseSince } from '../src/billing/usage-report.js';
import { GenerationService } from '../src/serving/generation-service.js';
import { ServedModel, type ModelRegistry } from '../src/serving/model-registry.js';
import type { UsageRecord } from '../src/store/store.js';

const price = (tier: ModelPrice['tier'], input: number, cached: number, output: number): ModelPrice =>
  ({ tier, input_per_1m_tokens: input, cached_input_per_1m_tokens: cached, output_per_1m_tokens: output });
const LONG: LongContextPricing = { above_input_tokens: 1000, input_multiplier: 2, output_multiplier: 1.5, effective_from: '2026-09-01' };
const AFTER = new Date('2026-10-01T12:00:00Z');
const fmt = formatDecimal;

describe('money', () => {
  it('parses plain and exponent forms exactly', () => {
    expect(fmt(decimalFromNumber(0.15))).toBe('0.15');
    expect(fmt(decimalFromNumber(1e-7))).toBe('0.0000001');
    expect(fmt(decimalFromNumber(1.5e-7))).toBe('0.00000015');
    expect(fmt(decimalFromNumber(1e21))).toBe('1000000000000000000000');
    expect(fmt(decimalFromNumber(2.5e21))).toBe('2500000000000000000000');
    expect(fmt(decimalFromNumber(0))).toBe('0');
    expect(fmt(parseDecimal('-.5'))).toBe('-0.5');
    expect(fmt(parseDecimal('12.3400'))).toBe('12.34');
    expect(fmt(parseDecimal('1.25E+1'))).toBe('12.5');
    expect(() => parseDecimal('1,5')).toThrow();
    expect(() => decimalFromNumber(Number.NaN)).toThrow();
  });

  it('adds and multiplies without float drift', () => {
    expect(0.1 + 0.2).not.toBe(0.3); // what the float path would get wrong
    expect(fmt(add(decimalFromNumber(0.1), decimalFromNumber(0.2)))).toBe('0.3');
    expect(fmt(mul(decimalFromNumber(0.1), decimalFromNumber(3)))).toBe('0.3');
    expect(fmt(mulInt(decimalFromNumber(0.07), 100))).toBe('7');
    expect(fmt(divPow10(decimalFromNumber(0.15), 6))).toBe('0.00000015');
    expect(fmt(decimalFromNumber(1.1), 4)).toBe('1.1000');
    expect(fmt(sum([]))).toBe('0');
    expect(ZERO.units).toBe(0n);
  });

  it('1,000,000 one-token requests at 0.1 per 1M sum to exactly 0.1', () => {
    const rates = price('standard', 0.1, 0, 0);
    let total = ZERO;
    const completedAt = new Date('2026-01-01T00:00:00Z');
    const one = costOf({ rates, inputTokens: 1, cachedTokens: 0, outputTokens: 0, completedAt }).total;
    expect(fmt(one)).toBe('0.0000001');
    for (let i = 0; i < 1_000_000; i++) total = add(total, one);
    expect(fmt(total)).toBe('0.1');
    // Summed through the ledger's string form, as the report does.
    const rows = Array.from({ length: 1000 }, () => usage({ cost: fmt(one) }));
    expect(summarizeUsage(rows).total.cost).toBe('0.0001');
  });
});

describe('costOf', () => {
  const rates = price('standard', 0.2, 0.05, 0.6);
  const base = { rates, longContext: LONG, completedAt: AFTER };

  it('bills uncached input, cached input and output at their rates', () => {
    const c = costOf({ ...base, inputTokens: 1000, cachedTokens: 400, outputTokens: 50 });
    expect(fmt(c.inputCost)).toBe('0.00012'); // 600 × 0.2 / 1M
    expect(fmt(c.cachedCost)).toBe('0.00002'); // 400 × 0.05 / 1M
    expect(fmt(c.outputCost)).toBe('0.00003'); // 50 × 0.6 / 1M
    expect(fmt(c.total)).toBe('0.00017');
    expect(c.long).toBe(false);
  });

  it('cached rate 0 bills cache hits at the input rate', () => {
    const c = costOf({ rates: price('standard', 0.2, 0, 0.6), inputTokens: 500, cachedTokens: 500, outputTokens: 0, completedAt: AFTER });
    expect(fmt(c.cachedCost)).toBe('0.0001');
    expect(fmt(c.inputCost)).toBe('0');
    expect(fmt(c.total)).toBe(fmt(costOf({ rates: price('standard', 0.2, 0, 0.6), inputTokens: 500, cachedTokens: 0, outputTokens: 0, completedAt: AFTER }).total));
  });

  it('threshold: exactly above_input_tokens is not long; one more is, on the entire request', () => {
    const equal = costOf({ ...base, inputTokens: 1000, cachedTokens: 0, outputTokens: 100 });
    expect(equal.long).toBe(false);
    expect(fmt(equal.total)).toBe('0.00026'); // 1000 × 0.2 + 100 × 0.6, per 1M
    const over = costOf({ ...base, inputTokens: 1001, cachedTokens: 0, outputTokens: 100 });
    expect(over.long).toBe(true);
    expect(fmt(over.inputCost)).toBe('0.0004004'); // 1001 × 0.2 × 2 / 1M: every token, not only the one past
    expect(fmt(over.outputCost)).toBe('0.00009'); // 100 × 0.6 × 1.5 / 1M
    expect(fmt(over.total)).toBe('0.0004904');
  });

  it('cached tokens count toward the threshold and take the input multiplier', () => {
    const c = costOf({ ...base, inputTokens: 1001, cachedTokens: 1001, outputTokens: 0 });
    expect(c.long).toBe(true);
    expect(fmt(c.cachedCost)).toBe('0.0001001'); // 1001 × 0.05 × 2 / 1M
    expect(fmt(c.inputCost)).toBe('0');
    // cached rate 0 → the input rate, multiplied.
    const zero = costOf({ ...base, rates: price('standard', 0.2, 0, 0.6), inputTokens: 2000, cachedTokens: 1500, outputTokens: 0 });
    expect(fmt(zero.cachedCost)).toBe('0.0006'); // 1500 × 0.2 × 2 / 1M
    expect(fmt(zero.inputCost)).toBe('0.0002'); // 500 × 0.2 × 2 / 1M
  });

  it('effective_from: the day before (UTC) is not long, the day itself from 00:00:00Z is', () => {
    const req = { rates, longContext: LONG, inputTokens: 5000, cachedTokens: 0, outputTokens: 10 };
    expect(costOf({ ...req, completedAt: new Date('2026-08-31T23:59:59.999Z') }).long).toBe(false);
    expect(costOf({ ...req, completedAt: new Date('2026-09-01T00:00:00Z') }).long).toBe(true);
    // 2026-09-01T01:00+02:00 is still Aug 31 in UTC.
    expect(isLongContext(LONG, 5000, new Date('2026-09-01T01:00:00+02:00'))).toBe(false);
    expect(fmt(costOf({ ...req, completedAt: new Date('2026-08-31T23:59:59Z') }).total)).toBe('0.001006');
    expect(fmt(costOf({ ...req, completedAt: new Date('2026-09-01T00:00:00Z') }).total)).toBe('0.002009');
  });

  it('no long-context pricing: any size bills at the base rates', () => {
    const c = costOf({ rates, inputTokens: 10_000_000, cachedTokens: 0, outputTokens: 0, completedAt: AFTER });
    expect(c.long).toBe(false);
    expect(fmt(c.total)).toBe('2');
  });

  it('exponent-form rates and decimal multipliers stay exact', () => {
    const tiny = price('flex', 1e-7, 0, 2.5e-8);
    const c = costOf({ rates: tiny, longContext: { ...LONG, input_multiplier: 1.1, output_multiplier: 0.3 },
      inputTokens: 3001, cachedTokens: 1, outputTokens: 7, completedAt: AFTER });
    expect(c.long).toBe(true);
    expect(fmt(c.inputCost)).toBe('0.00000000033'); // 3000 × 1e-7 × 1.1 / 1M
    expect(fmt(c.cachedCost)).toBe('0.00000000000011'); // 1 × 1e-7 × 1.1 / 1M
    expect(fmt(c.outputCost)).toBe('0.0000000000000525'); // 7 × 2.5e-8 × 0.3 / 1M
  });

  it('refuses impossible counts', () => {
    expect(() => costOf({ rates, inputTokens: 5, cachedTokens: 6, outputTokens: 0, completedAt: AFTER })).toThrow(/exceeds/);
    expect(() => costOf({ rates, inputTokens: 1.5, cachedTokens: 0, outputTokens: 0, completedAt: AFTER })).toThrow();
    expect(() => costOf({ rates, inputTokens: 1, cachedTokens: 0, outputTokens: -1, completedAt: AFTER })).toThrow();
  });
});

// A served model on a stand-in engine (4 prompt tokens per request): enough for prepare() and pricing.
function served(entry: Omit<CatalogModel, 'checkpoint'>): ServedModel {
  const engine = {
    info: { contextLength: 4096, hasChatTemplate: false, maxSequenceTokens: 4096 },
    promptTokenIds: () => [1, 2, 3, 4],
    preparePrompt: async () => [1, 2, 3, 4],
  } as unknown as Engine;
  return new ServedModel({ checkpoint: '/none', ...entry } as CatalogModel, engine);
}

function registryOf(models: ServedModel[]): ModelRegistry {
  return { models, resolve: (id: string) => models.find((m) => m.id === id)! } as unknown as ModelRegistry;
}

const result = (promptTokens: number, completionTokens: number, cachedTokens?: number): GenerateResult =>
  ({ usage: { promptTokens, completionTokens, ...(cachedTokens !== undefined && { cachedTokens }) } } as unknown as GenerateResult);

function usage(over: Partial<UsageRecord>): UsageRecord {
  return {
    id: 'u', orgId: 'o', orgName: 'acme', keyId: 'k', model: 'm', tier: 'standard', surface: 'responses', requestId: 'r',
    inputTokens: 0, cachedTokens: 0, outputTokens: 0, inputCost: '0', cachedCost: '0', outputCost: '0', cost: '0',
    longContext: false, completedAtMs: 0, ...over,
  };
}

describe('Billing: tiers and negotiated rates', () => {
  const both = served({
    id: 'both', pricing: [price('asap', 0.4, 0.1, 1.2), price('standard', 0.2, 0.05, 0.6)],
    long_context_pricing: LONG, negotiated_pricing: { acme: [price('standard', 0.15, 0, 0.5)] },
  });
  const asapOnly = served({ id: 'asap-only', pricing: [price('asap', 1, 0, 2)] });
  const free = served({ id: 'free' });
  const registry = registryOf([both, asapOnly, free]);
  const service = new GenerationService(registry);
  const billing = new Billing();
  const prepare = (model: string, orgName: string, completionWindow?: string) => service.prepare({
    caller: { orgId: `org_${orgName}`, orgName, keyId: 'key_1' }, model, input: { kind: 'prompt', text: 'hi' },
    sampling: {}, maxOutputTokensParam: 'max_output_tokens', background: false, metadata: {},
    ...(completionWindow !== undefined && { completionWindow }),
  });
  const bill = async (prepared: ReturnType<typeof prepare>, results: GenerateResult[]) =>
    billing.usageRecord({ surface: 'responses', requestId: 'resp_1', prepared: await prepared, results, completedAt: AFTER });

  it('standard is the default tier when priced, at the published rates', async () => {
    const row = await bill(prepare('both', 'other'), [result(1000, 100)]);
    expect(row).toMatchObject({ tier: 'standard', orgName: 'other', inputTokens: 1000, outputTokens: 100, cost: '0.00026', longContext: false });
  });

  it('asap is the default when standard is not priced', async () => {
    const row = await bill(prepare('asap-only', 'other'), [result(10, 5)]);
    expect(row).toMatchObject({ tier: 'asap', cost: '0.00002' }); // 10 × 1 + 5 × 2, per 1M
  });

  it('an explicit tier bills at its rates', async () => {
    expect((await bill(prepare('both', 'other', 'asap'), [result(1000, 100)])).cost).toBe('0.00052'); // 1000 × 0.4 + 100 × 1.2
  });

  it('negotiated rates replace the published ones for that organization and tier only', async () => {
    expect(both.pricingFor('acme').find((p) => p.tier === 'standard')!.input_per_1m_tokens).toBe(0.15);
    expect((await bill(prepare('both', 'acme'), [result(1000, 100)])).cost).toBe('0.0002'); // 1000 × 0.15 + 100 × 0.5
    // The negotiated cached rate is 0: cache hits bill at the negotiated input rate.
    expect(await bill(prepare('both', 'acme'), [result(1000, 100, 600)])).toMatchObject({ cachedTokens: 600, cachedCost: '0.00009', cost: '0.0002' });
    // asap is not negotiated: the published asap rate.
    expect((await bill(prepare('both', 'acme', 'asap'), [result(1000, 100)])).cost).toBe('0.00052');
    // Long context applies to negotiated rates too.
    expect(await bill(prepare('both', 'acme'), [result(1001, 100)])).toMatchObject({ longContext: true, cost: '0.0003753' }); // 1001×0.15×2 + 100×0.5×1.5
  });

  it('a model with no published rate bills 0 and is still recorded', async () => {
    const row = await bill(prepare('free', 'other', 'asap'), [result(10, 5)]);
    expect(row).toMatchObject({ model: 'free', tier: 'asap', cost: '0', inputTokens: 10, outputTokens: 5 });
  });

  it('n choices: the prompt counts once and outputs add up', async () => {
    const row = await bill(prepare('both', 'other'), [result(1000, 100), result(1000, 40)]);
    expect(row).toMatchObject({ inputTokens: 1000, outputTokens: 140, cost: '0.000284' });
  });
});

describe('usage report', () => {
  it('groups per organization × model × tier and sums exactly', () => {
    const report = summarizeUsage([
      usage({ orgName: 'b', model: 'm', cost: '0.1', inputTokens: 3, cachedTokens: 1, outputTokens: 2 }),
      usage({ orgName: 'a', model: 'm', cost: '0.2', inputTokens: 1 }),
      usage({ orgName: 'b', model: 'm', cost: '0.2', inputTokens: 4, outputTokens: 1 }),
      usage({ orgName: 'b', model: 'm', tier: 'asap', cost: '0.0000000000000000001' }),
    ]);
    expect(report.data.map((r) => [r.organization, r.tier, r.requests, r.cost])).toEqual([
      ['a', 'standard', 1, '0.2'], ['b', 'asap', 1, '0.0000000000000000001'], ['b', 'standard', 2, '0.3'],
    ]);
    expect(report.data[2]).toMatchObject({ input_tokens: 7, cached_tokens: 1, output_tokens: 3, cost_usd: 0.3 });
    expect(report.total).toMatchObject({ requests: 4, cost: '0.5000000000000000001' });
  });

  it('parses since as a UTC date or an ISO date-time', () => {
    expect(parseSince('2026-09-01')).toBe(Date.UTC(2026, 8, 1));
    expect(parseSince('2026-09-01T02:00:00+02:00')).toBe(Date.UTC(2026, 8, 1));
    expect(() => parseSince('2026-02-30')).toThrow();
    expect(() => parseSince('yesterday')).toThrow();
    expect(() => parseSince('2026-09-01T00:00:00')).toThrow();
  });
});
