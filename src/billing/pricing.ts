// The billing rules of the spec (ModelPrice, ModelLongContextPricing), as one pure function over
// exact Decimals (money.ts): no floating point touches a cost, and nothing is rounded.
//
//   uncached input = inputTokens - cachedTokens, at input_per_1m_tokens
//   cached input   = cachedTokens, at cached_input_per_1m_tokens, or at the input rate when that is 0
//   output         = outputTokens (reasoning included), at output_per_1m_tokens
//   long context   iff inputTokens (cached included) > above_input_tokens (equal is not long)
//                  AND the UTC date of completedAt >= effective_from;
//                  then the input and cached rates × input_multiplier and the output rate ×
//                  output_multiplier, on the ENTIRE request (not only the tokens past the threshold).

import type { LongContextPricing, ModelPrice } from '../config/catalog.js';
import { add, decimalFromNumber, divPow10, isZero, mul, mulInt, type Decimal } from './money.js';

export interface CostInput {
  /** The organization's rates for the request's tier (negotiated ones resolved). */
  rates: ModelPrice;
  longContext?: LongContextPricing | undefined;
  /** Every prompt token, cached ones included. */
  inputTokens: number;
  /** Prompt tokens served from the prompt cache; 0 <= cachedTokens <= inputTokens. */
  cachedTokens: number;
  /** Generated tokens, reasoning included. */
  outputTokens: number;
  completedAt: Date;
}

export interface Cost {
  /** Uncached input tokens' cost (USD). */
  inputCost: Decimal;
  cachedCost: Decimal;
  outputCost: Decimal;
  total: Decimal;
  /** Whether the long-context multipliers applied. */
  long: boolean;
}

/** 'YYYY-MM-DD' of an instant, in UTC. */
export function utcDate(at: Date): string {
  return at.toISOString().slice(0, 10);
}

/** Whether a request of `inputTokens` completed at `completedAt` bills at the long-context rates. */
export function isLongContext(longContext: LongContextPricing | undefined, inputTokens: number, completedAt: Date): boolean {
  if (!longContext) return false;
  return inputTokens > longContext.above_input_tokens && utcDate(completedAt) >= longContext.effective_from;
}

function checkCount(name: string, n: number): void {
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer (got ${n})`);
}

export function costOf(input: CostInput): Cost {
  const { rates, inputTokens, cachedTokens, outputTokens } = input;
  checkCount('inputTokens', inputTokens);
  checkCount('cachedTokens', cachedTokens);
  checkCount('outputTokens', outputTokens);
  if (cachedTokens > inputTokens) throw new Error(`cachedTokens (${cachedTokens}) exceeds inputTokens (${inputTokens})`);

  // Per-token rates: USD per 1,000,000 tokens / 10^6.
  let inputRate = divPow10(decimalFromNumber(rates.input_per_1m_tokens), 6);
  const cachedPublished = divPow10(decimalFromNumber(rates.cached_input_per_1m_tokens), 6);
  let cachedRate = isZero(cachedPublished) ? inputRate : cachedPublished;
  let outputRate = divPow10(decimalFromNumber(rates.output_per_1m_tokens), 6);

  const long = isLongContext(input.longContext, inputTokens, input.completedAt);
  if (long) {
    const inputMultiplier = decimalFromNumber(input.longContext!.input_multiplier);
    inputRate = mul(inputRate, inputMultiplier);
    cachedRate = mul(cachedRate, inputMultiplier);
    outputRate = mul(outputRate, decimalFromNumber(input.longContext!.output_multiplier));
  }

  const inputCost = mulInt(inputRate, inputTokens - cachedTokens);
  const cachedCost = mulInt(cachedRate, cachedTokens);
  const outputCost = mulInt(outputRate, outputTokens);
  return { inputCost, cachedCost, outputCost, total: add(add(inputCost, cachedCost), outputCost), long };
}
