// The usage ledger row of each finished request, with its exact cost. Every place where a request
// finishes with a result (responses foreground and background, chat completions, messages, batch
// lines) builds its row with Billing.usageRecord and hands it to the store's commitRequestEnd,
// together with the terminal object: the row is written exactly when the result is, in one
// transaction, so a request is never billed without its stored result, nor is a request whose
// end could not be stored (the client got a 5xx) billed.
//
// What is billed: a request that ended with a result from the engine (status completed or
// incomplete: the tokens it read and generated). A request that ends without one (failed, timed
// out, cancelled, a client that disconnected) is NOT billed: the engine reports no usage for it.
// For chat completions with n choices the prompt counts once (as the response's usage object
// says) and the choices' output tokens add up.
//
// Exactly once: rows are keyed by (surface, request id), so a background response or batch line
// that runs again after a restart is recorded only by its first finished run.

import { randomBytes } from 'node:crypto';
import type { ModelPrice } from '../config/catalog.js';
import type { GenerateResult } from '../engine/request.js';
import type { PreparedGeneration } from '../serving/generation-request.js';
import type { UsageRecord } from '../store/store.js';
import { formatDecimal } from './money.js';
import { costOf } from './pricing.js';

import type { UsageSurface } from '../serving/lifecycle.js';

export type { UsageSurface };

export interface BillableRequest {
  surface: UsageSurface;
  /** The object id, or `<batch id>:<line number>` for a batch line: unique per surface. */
  requestId: string;
  /** Its caller, model and tier (prepared.window: for a batch line, the batch's). */
  prepared: PreparedGeneration;
  /** One per choice; all share the prompt. */
  results: readonly GenerateResult[];
  /** Default: now. Decides long-context pricing by its UTC date. */
  completedAt?: Date;
}

/** Rates with every field 0: what a model that publishes no rate bills (its requests are still recorded). */
const FREE = (tier: ModelPrice['tier']): ModelPrice =>
  ({ tier, input_per_1m_tokens: 0, cached_input_per_1m_tokens: 0, output_per_1m_tokens: 0 });

/** Prompt-cache hits of a result: `usage.cachedTokens` once the engine reports it, else 0. */
function cachedTokensOf(result: GenerateResult): number {
  const cached = (result.usage as { cachedTokens?: unknown }).cachedTokens;
  return typeof cached === 'number' ? cached : 0;
}

/** The usage ledger's rows: priced by the model the request was prepared for (its catalog entry's rates). */
export class Billing {
  /** The ledger row of a finished request (pure apart from the id); store it with commitRequestEnd. */
  usageRecord(req: BillableRequest): UsageRecord {
    const { caller, model: modelId } = req.prepared.request;
    const { model } = req.prepared;
    const tier = req.prepared.window;
    const first = req.results[0];
    if (!first) throw new Error('Billing.usageRecord needs at least one result');
    const rates = model.pricingFor(caller.orgName).find((p) => p.tier === tier) ?? FREE(tier);
    const completedAt = req.completedAt ?? new Date();
    const inputTokens = first.usage.promptTokens;
    const cachedTokens = cachedTokensOf(first);
    const outputTokens = req.results.reduce((n, r) => n + r.usage.completionTokens, 0);
    const cost = costOf({ rates, longContext: model.entry.long_context_pricing, inputTokens, cachedTokens, outputTokens, completedAt });
    return {
      id: `usage_${randomBytes(12).toString('hex')}`,
      orgId: caller.orgId,
      orgName: caller.orgName,
      keyId: caller.keyId,
      model: modelId,
      tier,
      surface: req.surface,
      requestId: req.requestId,
      inputTokens,
      cachedTokens,
      outputTokens,
      inputCost: formatDecimal(cost.inputCost),
      cachedCost: formatDecimal(cost.cachedCost),
      outputCost: formatDecimal(cost.outputCost),
      cost: formatDecimal(cost.total),
      longContext: cost.long,
      completedAtMs: completedAt.getTime(),
    };
  }
}
