// Sends completion callbacks (spec, "Events") at least once. A request's end builds its delivery
// with deliveryFor() and stores it in the same transaction as the terminal object (store
// commitRequestEnd), then calls wake(); the dispatcher claims due deliveries from the store, POSTs
// them (callback-sender.ts), and records each outcome, so a restart resumes whatever was pending.
//
// Retries: the spec's "retried up to 3 times" is read as 1 attempt + 3 retries = 4 attempts at
// most. A non-2xx reply, a network error or the per-attempt timeout is a failed attempt; the next
// one waits baseDelayMs * 2^(attempt - 1) (1 s, 2 s, 4 s by default). Redirects are not followed.
//
// Destinations: loopback, private, link-local and other non-global addresses are refused unless
// the operator sets allowPrivateAddresses (address-policy.ts). A literal address is refused by
// deliveryFor (no delivery is stored); a name is resolved at each attempt and a refusal is a
// permanent failure (state `failed` after that attempt, no retries, logged at warn).
//
// Fairness: attempts in flight are capped per organization and per receiver host (URL host:port),
// counted across every process sharing the store, and claimed round-robin over organizations; a
// per-process total bounds sockets. A slow or dead receiver so only holds its own host's share and
// its organization's share: another organization's callbacks go out at once.
//
// Credentials: the token lives only in the delivery row while the delivery is pending; the store
// forgets it when the delivery ends (delivered or failed). Callback bodies never carry it.
//
// Replicas sharing a store (store.shared): a delivery stored by another replica is woken there, but
// one left by a replica that died (pending, or mid-attempt with a lease that runs out) wakes no one:
// each dispatcher then also looks every pollIntervalMs (one cheap claim when nothing is due).
//
// Duplicates: delivery is at-least-once. A process that dies after the receiver's 2xx but before
// the outcome is stored sends the callback again after the restart (the body's id deduplicates).
//
// Failure of every attempt is logged and kept as state `failed`; it never touches the response.

import { randomUUID } from 'node:crypto';
import type { LookupFunction } from 'node:net';
import type { Store, WebhookClaimCaps, WebhookDelivery } from '../store/store.js';
import { guardedLookup, postCallback, RefusedDestinationError, refusedLiteralHost, type ResolveAll } from './callback-sender.js';
import { sendsCallback, webhookTargetOf, withoutWebhookToken } from './events.js';

/** The pino-compatible subset the dispatcher logs with (fastify's app.log fits). */
export interface WebhookLog {
  info?(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export interface WebhookSettings {
  /** Per-attempt timeout; default 30 s (spec). */
  timeoutMs?: number;
  /** Delay before the first retry, doubled for each later one; default 1 s. */
  baseDelayMs?: number;
  /** Retries after the first attempt; default 3 (spec). */
  maxRetries?: number;
  /** Where failures are logged; default the app's logger. */
  log?: WebhookLog;
  /**
   * Lets callbacks reach loopback, private, link-local and other non-global addresses; default
   * false. For operators whose receivers live on their own network (`sluice serve
   * --allow-private-webhooks`).
   */
  allowPrivateAddresses?: boolean;
  /** Attempts in flight in this process; default 256. */
  maxInFlight?: number;
  /** Attempts in flight per organization, across processes sharing the store; default 32. */
  maxInFlightPerOrg?: number;
  /** Attempts in flight per receiver host (URL host:port), across processes; default 16. */
  maxInFlightPerHost?: number;
  /** Resolves receiver host names (tests substitute DNS answers); default dns.lookup. */
  resolveAll?: ResolveAll;
  /** Told the outcome of each attempt whose result is stored (the service's metrics); must not throw. */
  onAttempt?: (outcome: WebhookAttemptOutcome) => void;
  /** With a store replicas share: the longest wait between looks for due deliveries; default 5 s. */
  pollIntervalMs?: number;
}

/**
 * delivered: a 2xx; retry: it failed and another attempt is due; failed: it failed and the attempts
 * are used up; refused: the destination is not allowed (never retried).
 */
export type WebhookAttemptOutcome = 'delivered' | 'retry' | 'failed' | 'refused';

export const DEFAULT_WEBHOOK_SETTINGS = {
  timeoutMs: 30_000, baseDelayMs: 1_000, maxRetries: 3, allowPrivateAddresses: false,
  maxInFlight: 256, maxInFlightPerOrg: 32, maxInFlightPerHost: 16, pollIntervalMs: 5_000,
} as const;

/** Longest timer: long backoffs are re-checked rather than trusted to one huge timeout. */
const MAX_SLEEP_MS = 60_000;

/** `refused`: the destination is not allowed, a permanent failure. */
type Outcome = { ok: true } | { ok: false; error: string; refused?: true } | 'shutdown';

export class WebhookDispatcher {
  private readonly timeoutMs: number;
  private readonly baseDelayMs: number;
  private readonly maxAttempts: number;
  private readonly log: WebhookLog;
  private readonly allowPrivateAddresses: boolean;
  private readonly lookup: LookupFunction;
  private readonly onAttempt: (outcome: WebhookAttemptOutcome) => void;
  private readonly maxInFlight: number;
  private readonly caps: WebhookClaimCaps;
  /** The longest sleep: MAX_SLEEP_MS alone, or the poll interval when replicas share the store. */
  private readonly maxSleepMs: number;
  /** delivery id -> the attempt running now; its controller aborts it on close. */
  private readonly inFlight = new Map<string, { controller: AbortController; done: Promise<void> }>();
  private timer: NodeJS.Timeout | undefined;
  private started = false;
  private closed = false;
  /** A pump is running; `pumpAgain` asks it to look once more before it sleeps. */
  private pumping: Promise<void> | undefined;
  private pumpAgain = false;

  constructor(private readonly store: Store, settings: WebhookSettings & { log: WebhookLog }) {
    this.log = settings.log;
    this.timeoutMs = settings.timeoutMs ?? DEFAULT_WEBHOOK_SETTINGS.timeoutMs;
    this.baseDelayMs = settings.baseDelayMs ?? DEFAULT_WEBHOOK_SETTINGS.baseDelayMs;
    this.maxAttempts = 1 + (settings.maxRetries ?? DEFAULT_WEBHOOK_SETTINGS.maxRetries);
    this.allowPrivateAddresses = settings.allowPrivateAddresses ?? DEFAULT_WEBHOOK_SETTINGS.allowPrivateAddresses;
    this.lookup = guardedLookup(this.allowPrivateAddresses, settings.resolveAll);
    this.onAttempt = settings.onAttempt ?? (() => {});
    this.maxInFlight = settings.maxInFlight ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlight;
    this.caps = {
      perOrg: settings.maxInFlightPerOrg ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlightPerOrg,
      perHost: settings.maxInFlightPerHost ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlightPerHost,
    };
    this.maxSleepMs = store.shared ? Math.min(MAX_SLEEP_MS, settings.pollIntervalMs ?? DEFAULT_WEBHOOK_SETTINGS.pollIntervalMs) : MAX_SLEEP_MS;
  }

  /** Begins sending: deliveries left pending by an earlier process are due at once. */
  start(): void {
    if (this.started || this.closed) return;
    this.started = true;
    this.wake();
  }

  /**
   * Logs how many deliveries are pending as sending begins: after a restart, those the previous
   * process left (or, with replicas sharing the store, theirs too). Nothing when there are none.
   */
  async logPending(): Promise<void> {
    const pending = await this.store.countPendingWebhookDeliveries();
    if (pending > 0) this.log.info?.({ pending }, `completion webhooks: ${pending} pending deliveries resume`);
  }

  /**
   * The delivery of a callback of `body` to the target named by request `metadata` (which holds the
   * token), ready to be stored with the request's end; undefined when none is due: no target, a
   * status that sends nothing, a target that cannot be used or a literal address that is refused
   * (the last two logged at warn). Never throws: a callback must not change the request's outcome.
   * The body sent is `body` without metadata.webhook_token.
   */
  deliveryFor(orgId: string, metadata: unknown, body: Record<string, unknown> & { id: string }): WebhookDelivery | undefined {
    if (!sendsCallback(body)) return undefined;
    const target = webhookTargetOf(metadata);
    if (typeof target === 'string') {
      // Told to the operator only: the request itself is unaffected (spec).
      if (target !== 'no_url') this.log.warn({ object_id: body.id, reason: target }, 'completion webhook not sent');
      return undefined;
    }
    const url = new URL(target.url);
    const refused = refusedLiteralHost(url, this.allowPrivateAddresses);
    if (refused !== undefined) {
      this.log.warn({ object_id: body.id, reason: 'refused_destination', detail: refused }, 'completion webhook not sent');
      return undefined;
    }
    const now = Date.now();
    return {
      id: `whd_${randomUUID().replace(/-/g, '')}`,
      orgId,
      objectId: body.id,
      url: target.url,
      host: url.host,
      token: target.token,
      body: JSON.stringify(withoutWebhookToken(body)),
      state: 'pending',
      attempts: 0,
      nextAttemptAtMs: now,
      lastError: null,
      createdAt: Math.floor(now / 1000),
    };
  }

  /** Looks for due deliveries now: call after committing one. */
  wake(): void {
    if (!this.started || this.closed) return;
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = this.pump().finally(() => {
      this.pumping = undefined;
      // A wake that came after the pump's last claim (an attempt ended meanwhile) is not lost.
      if (this.pumpAgain) this.wake();
    });
  }

  /**
   * Stops sending: no attempt starts after this, and attempts in flight are aborted and left
   * pending (not counted) for the next start. Resolves once their state is stored. Safe to call twice.
   */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    for (const run of this.inFlight.values()) run.controller.abort();
    await this.pumping;
    await Promise.all([...this.inFlight.values()].map((run) => run.done));
  }

  /**
   * Starts every due delivery the caps leave room for, then sleeps until the next one is due. Due
   * deliveries held back by a cap are looked at again when an attempt of this process ends (it
   * wakes the pump) or when a lease ends (another process's attempt), whichever comes first.
   */
  private async pump(): Promise<void> {
    clearTimeout(this.timer);
    try {
      let now: number;
      do {
        this.pumpAgain = false;
        now = Date.now();
        const room = this.maxInFlight - this.inFlight.size;
        if (room <= 0) return; // a finishing attempt wakes the pump again
        // The lease outlasts the attempt (its timeout) so no later claim takes it meanwhile.
        const claimed = await this.store.claimDueWebhookDeliveries(now, now + this.timeoutMs + 5_000, room, this.caps);
        for (const delivery of claimed) {
          // close() came while claiming: hand the claim back rather than start an attempt.
          if (this.closed) await this.release(delivery);
          else this.launch(delivery);
        }
      } while (this.pumpAgain && !this.closed);
      if (this.closed) return;
      const next = await this.store.nextWebhookAttemptMs(now);
      // With a shared store, nothing pending here still gets a look later (another replica's leftovers).
      if (next !== undefined) this.sleepUntil(next);
      else if (this.store.shared) this.sleepUntil(now + this.maxSleepMs);
    } catch (err) {
      if (this.closed) return;
      this.log.error({ err }, 'completion webhooks: could not read pending deliveries; retrying');
      this.sleepUntil(Date.now() + Math.min(this.baseDelayMs * 4, MAX_SLEEP_MS));
    }
  }

  private sleepUntil(atMs: number): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.wake(), Math.min(Math.max(0, atMs - Date.now()), this.maxSleepMs));
    this.timer.unref(); // pending callbacks alone do not keep a process alive
  }

  private launch(delivery: WebhookDelivery): void {
    const controller = new AbortController();
    const done = this.attempt(delivery, controller.signal)
      .catch((err: unknown) => this.log.error({ err, delivery_id: delivery.id }, 'completion webhook: could not record an attempt'))
      .finally(() => {
        this.inFlight.delete(delivery.id);
        this.wake();
      });
    this.inFlight.set(delivery.id, { controller, done });
  }

  /** One attempt and its recorded outcome. */
  private async attempt(d: WebhookDelivery, shutdown: AbortSignal): Promise<void> {
    const outcome = await this.post(d, shutdown);
    if (outcome === 'shutdown') {
      await this.release(d);
      return;
    }
    const attempts = d.attempts + 1;
    if (outcome.ok) {
      await this.store.updateWebhookDelivery(d.id, { state: 'delivered', attempts, nextAttemptAtMs: Date.now(), lastError: null });
      this.onAttempt('delivered');
      return;
    }
    const fields = { delivery_id: d.id, object_id: d.objectId, url: d.url, attempt: attempts, error: outcome.error };
    if (outcome.refused) {
      await this.store.updateWebhookDelivery(d.id, { state: 'failed', attempts, nextAttemptAtMs: Date.now(), lastError: outcome.error });
      this.onAttempt('refused');
      this.log.warn({ ...fields, reason: 'refused_destination', detail: outcome.error }, 'completion webhook destination refused; not retried');
      return;
    }
    if (attempts >= this.maxAttempts) {
      await this.store.updateWebhookDelivery(d.id, { state: 'failed', attempts, nextAttemptAtMs: Date.now(), lastError: outcome.error });
      this.onAttempt('failed');
      this.log.error(fields, `completion webhook failed after ${attempts} attempts; giving up`);
      return;
    }
    const nextAttemptAtMs = Date.now() + this.baseDelayMs * 2 ** (attempts - 1);
    await this.store.updateWebhookDelivery(d.id, { state: 'pending', attempts, nextAttemptAtMs, lastError: outcome.error });
    this.onAttempt('retry');
    this.log.warn(fields, 'completion webhook attempt failed; will retry');
  }

  /** Ends a claim without an attempt (shutdown is not the receiver's fault): due again at once. */
  private async release(d: WebhookDelivery): Promise<void> {
    await this.store.updateWebhookDelivery(d.id, { state: 'pending', attempts: d.attempts, nextAttemptAtMs: Date.now(), lastError: d.lastError });
  }

  private async post(d: WebhookDelivery, shutdown: AbortSignal): Promise<Outcome> {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (d.token !== null) headers['authorization'] = `Bearer ${d.token}`;
    const timeout = AbortSignal.timeout(this.timeoutMs);
    try {
      const status = await postCallback(new URL(d.url), d.body, {
        headers, signal: AbortSignal.any([shutdown, timeout]), lookup: this.lookup, allowPrivateAddresses: this.allowPrivateAddresses,
      });
      return status >= 200 && status < 300 ? { ok: true } : { ok: false, error: `HTTP ${status}` };
    } catch (err) {
      if (err instanceof RefusedDestinationError) return { ok: false, error: err.message, refused: true };
      if (shutdown.aborted) return 'shutdown';
      if (timeout.aborted) return { ok: false, error: `timed out after ${this.timeoutMs} ms` };
      return { ok: false, error: (err as Error).message };
    }
  }
}
