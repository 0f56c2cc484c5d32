// Per-organization limits, so one organization's load cannot take the service from the others:
//
// - in flight: foreground generation requests of the organization at once (an n-choice request
//   counts n). One more is refused (429) before anything of it is stored or sent; an n above the
//   limit itself is a 400 naming n (no retry could admit it). Background responses are bounded by
//   their own limit (the queued-background limit); batch lines hold at most this many batch line
//   slots at once (batches/slots.ts), a count of their own, so a backlog of either never blocks
//   the organization's foreground work, and the scheduler orders them by window.
// - queued background: background responses of the organization in progress at once; creating
//   one more is a 429.
// - tokens per minute: a token bucket of that size, refilled continuously. Prompt tokens are
//   charged when a request starts and generated tokens when it ends (so the bucket may go
//   negative); while it is negative, foreground and new background requests get 429 with the
//   seconds until it refills, and accepted background work and batch lines wait (they are charged
//   like foreground work).
//
// 429s are SluiceError rate_limit_exceeded with `retryAfterSeconds` (the API sends Retry-After).
// The limits live in this process (one engine per process); limits across replicas are a later
// issue.

import { SluiceError } from '../errors.js';
import type { LimitSettings, OrgLimitSettings } from '../config/catalog.js';
import type { Caller } from './generation-request.js';

export interface OrgLimits {
  /** Foreground generations in progress at once. 0: no limit. */
  maxInflightRequests: number;
  /** 0: no limit. */
  maxQueuedBackground: number;
  /** 0: no limit. */
  tokensPerMinute: number;
}

/** Defaults: generous enough never to bind a well-behaved organization on one GPU. */
export const DEFAULT_ORG_LIMITS: OrgLimits = { maxInflightRequests: 256, maxQueuedBackground: 10_000, tokensPerMinute: 0 };

export class RateLimitError extends SluiceError {
  constructor(message: string, readonly retryAfterSeconds: number, param?: string) {
    super('rate_limit_exceeded', message, param === undefined ? {} : { param });
  }
}

/** Releases an in-flight slot; safe to call twice. */
export type Release = () => void;

interface OrgState {
  inflight: number;
  tokens: number;
  refilledAtMs: number;
}

function fromSettings(s: OrgLimitSettings | undefined, base: OrgLimits): OrgLimits {
  return {
    maxInflightRequests: s?.max_inflight_requests ?? base.maxInflightRequests,
    maxQueuedBackground: s?.max_queued_background ?? base.maxQueuedBackground,
    tokensPerMinute: s?.tokens_per_minute ?? base.tokensPerMinute,
  };
}

export class TenantLimiter {
  private readonly defaults: OrgLimits;
  private readonly byName: Map<string, OrgLimits>;
  /** orgId -> its counters. */
  private readonly orgs = new Map<string, OrgState>();

  /**
   * `defaults` (e.g. from serve flags) under `settings` (the catalog's `limits`: defaults for
   * every organization, then overrides by organization name).
   */
  constructor(settings: LimitSettings | undefined = undefined, defaults: Partial<OrgLimits> = {},
    private readonly now: () => number = Date.now) {
    this.defaults = fromSettings(settings, { ...DEFAULT_ORG_LIMITS, ...defaults });
    this.byName = new Map(Object.entries(settings?.organizations ?? {}).map(([name, s]) => [name, fromSettings(s, this.defaults)]));
  }

  limitsFor(caller: Pick<Caller, 'orgName'>): OrgLimits {
    return this.byName.get(caller.orgName) ?? this.defaults;
  }

  /** The limits of organizations without their own, and how many have their own (the startup log). */
  describe(): { defaults: OrgLimits; numOverrides: number } {
    return { defaults: { ...this.defaults }, numOverrides: this.byName.size };
  }

  /**
   * A foreground request of `count` generations (its n choices): takes that many in-flight slots
   * now, or throws RateLimitError taking none. A request of more choices than the limit itself
   * could never be admitted: that is a 400 naming `n`, not a 429 to retry.
   */
  tryAcquire(caller: Caller, count = 1): Release {
    this.checkChoices(caller, count);
    const limit = this.limitsFor(caller).maxInflightRequests;
    const org = this.state(caller);
    if (limit > 0 && org.inflight + count > limit) {
      throw new RateLimitError(`your organization has ${org.inflight} requests in progress and a limit of ${limit}; ` +
        'retry when one finishes', 1);
    }
    org.inflight += count;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      org.inflight -= count;
    };
  }

  /** Throws a 400 naming `n` when `count` choices exceed the in-flight limit: no retry could admit them. */
  checkChoices(caller: Caller, count: number): void {
    const limit = this.limitsFor(caller).maxInflightRequests;
    if (limit > 0 && count > limit) {
      throw new SluiceError('invalid_request', `n is ${count}, more than your organization's limit of ${limit} ` +
        'generations in progress at once; ask for at most that many choices', { param: 'n' });
    }
  }

  /** Refuses a new background response when the organization has `inProgress` of its limit already. */
  checkQueuedBackground(caller: Caller, inProgress: number): void {
    const limit = this.limitsFor(caller).maxQueuedBackground;
    if (limit > 0 && inProgress >= limit) {
      throw new RateLimitError(`your organization has ${inProgress} background responses in progress, its limit; ` +
        'retry when some have finished', 5, 'background');
    }
  }

  /** Seconds until the organization's token bucket is non-negative again; 0 when it is now. */
  tokenDebtSeconds(caller: Caller): number {
    const tpm = this.limitsFor(caller).tokensPerMinute;
    if (tpm === 0) return 0;
    const org = this.refill(caller, tpm);
    return org.tokens >= 0 ? 0 : -org.tokens / (tpm / 60);
  }

  /** Throws RateLimitError while the organization's tokens-per-minute budget is spent. */
  checkTokens(caller: Caller): void {
    const wait = this.tokenDebtSeconds(caller);
    if (wait > 0) {
      throw new RateLimitError(`your organization used its ${this.limitsFor(caller).tokensPerMinute} tokens per minute; ` +
        `retry in ${Math.ceil(wait)} s`, wait);
    }
  }

  /** Charges tokens to the organization's budget (a no-op without a tokens-per-minute limit). */
  chargeTokens(caller: Caller, tokens: number): void {
    const tpm = this.limitsFor(caller).tokensPerMinute;
    if (tpm === 0 || tokens <= 0) return;
    this.refill(caller, tpm).tokens -= tokens;
  }

  private refill(caller: Caller, tpm: number): OrgState {
    const org = this.state(caller);
    const t = this.now();
    org.tokens = Math.min(tpm, org.tokens + ((t - org.refilledAtMs) / 60_000) * tpm);
    org.refilledAtMs = t;
    return org;
  }

  private state(caller: Caller): OrgState {
    let org = this.orgs.get(caller.orgId);
    if (!org) {
      org = { inflight: 0, tokens: this.limitsFor(caller).tokensPerMinute, refilledAtMs: this.now() };
      this.orgs.set(caller.orgId, org);
    }
    return org;
  }
}
