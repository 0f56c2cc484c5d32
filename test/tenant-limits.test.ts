// Per-organization limits (src/serving/tenant-limits.ts): foreground in-flight slots, background
// queue size, and the tokens-per-minute bucket, with the seconds a 429 asks the caller to wait.
// Pure: a fake clock, no engine.

import { describe, expect, it } from 'vitest';
import { SluiceError } from '../src/errors.js';
import { RateLimitError, TenantLimiter } from '../src/serving/tenant-limits.js';

const acme = { orgId: 'org_acme', orgName: 'acme', keyId: 'k1' };
const other = { orgId: 'org_other', orgName: 'other', keyId: 'k2' };

describe('TenantLimiter', () => {
  it('refuses a foreground request over the in-flight limit, per organization, until one is released', () => {
    const limits = new TenantLimiter(undefined, { maxInflightRequests: 2 });
    const r1 = limits.tryAcquire(acme);
    limits.tryAcquire(acme);
    expect(() => limits.tryAcquire(acme)).toThrow(RateLimitError);
    try {
      limits.tryAcquire(acme);
    } catch (err) {
      expect(err).toMatchObject({ code: 'rate_limit_exceeded', retryAfterSeconds: 1 });
    }
    expect(() => limits.tryAcquire(other)).not.toThrow();  // another organization is unaffected
    r1();
    r1();  // releasing twice frees one slot, not two
    expect(() => limits.tryAcquire(acme)).not.toThrow();
    expect(() => limits.tryAcquire(acme)).toThrow(RateLimitError);
  });

  it('takes the slots of all n choices at once, or none', () => {
    const limits = new TenantLimiter(undefined, { maxInflightRequests: 4 });
    const three = limits.tryAcquire(acme, 3);
    expect(() => limits.tryAcquire(acme, 2)).toThrow(RateLimitError);
    const one = limits.tryAcquire(acme, 1);  // the refused request took nothing
    three();
    one();
    expect(() => limits.tryAcquire(acme, 4)).not.toThrow();
  });

  it('refuses n choices above the in-flight limit itself with a 400 naming n, never a 429 to retry', () => {
    const limits = new TenantLimiter(undefined, { maxInflightRequests: 4 });
    for (const call of [() => limits.tryAcquire(acme, 5), () => limits.checkChoices(acme, 5)]) {
      expect(call).toThrow(SluiceError);
      expect(call).not.toThrow(RateLimitError);
      try {
        call();
      } catch (err) {
        expect(err).toMatchObject({ code: 'invalid_request', param: 'n' });
      }
    }
    expect(() => limits.checkChoices(acme, 4)).not.toThrow();
    expect(() => new TenantLimiter(undefined, { maxInflightRequests: 0 }).checkChoices(acme, 1000)).not.toThrow();  // no limit
  });

  it('limits background responses in progress', () => {
    const limits = new TenantLimiter({ max_queued_background: 3 });
    expect(() => limits.checkQueuedBackground(acme, 2)).not.toThrow();
    expect(() => limits.checkQueuedBackground(acme, 3)).toThrow(expect.objectContaining({ code: 'rate_limit_exceeded', param: 'background' }));
  });

  it('keeps a tokens-per-minute bucket: 429 while in debt, for as long as the refill takes', () => {
    let now = 0;
    const limits = new TenantLimiter({ tokens_per_minute: 600 }, {}, () => now);  // 10 tokens per second
    limits.checkTokens(acme);
    limits.chargeTokens(acme, 500);
    limits.checkTokens(acme);              // 100 left
    limits.chargeTokens(acme, 300);        // -200: 20 s of refill
    expect(limits.tokenDebtSeconds(acme)).toBeCloseTo(20);
    expect(() => limits.checkTokens(acme)).toThrow(expect.objectContaining({ retryAfterSeconds: 20 }));
    expect(() => limits.checkTokens(other)).not.toThrow();
    now += 15_000;
    expect(limits.tokenDebtSeconds(acme)).toBeCloseTo(5);
    now += 5_000;
    expect(() => limits.checkTokens(acme)).not.toThrow();
    now += 3_600_000;                      // never more than a minute's worth banked
    limits.chargeTokens(acme, 601);
    expect(limits.tokenDebtSeconds(acme)).toBeCloseTo(0.1);
  });

  it('takes per-organization overrides from the catalog over the defaults', () => {
    const limits = new TenantLimiter({ max_inflight_requests: 5, organizations: { acme: { max_inflight_requests: 1 } } },
      { maxInflightRequests: 100, tokensPerMinute: 7 });
    expect(limits.limitsFor(acme)).toEqual({ maxInflightRequests: 1, maxQueuedBackground: 10_000, tokensPerMinute: 7 });
    expect(limits.limitsFor(other)).toEqual({ maxInflightRequests: 5, maxQueuedBackground: 10_000, tokensPerMinute: 7 });
  });
});
