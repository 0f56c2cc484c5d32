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
// Leases: a claimed delivery is leased to this process (its replica id) for one lease length
// (store/leases.ts, `--lease-seconds`), renewed every third of it while the attempt runs (the
// leased queue, jobs/leased-queue.ts, keeps the leases; this file claims, sends and records), so a
// slow receiver (up to the attempt timeout) keeps its delivery here, while a process that dies
// mid-attempt frees it within one lease length instead of a whole attempt timeout. An outcome is
// written only while this process still holds the lease (a fence: a process that stalled past its
// lease cannot overwrite what the process that took the delivery over records); an attempt whose
// lease was taken over is stopped without writing. A store one process owns (SQLite) hands back
// the leases of the process before at start.
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
import { leaseConfig, type LeaseConfig } from '../store/leases.js';
import { LEASE_LOST, LeasedQueue, type ClaimPass } from './leased-queue.js';
import type { Store, WebhookClaimCaps, WebhookDelivery, WebhookDeliveryUpdate } from '../store/store.js';
import { guardedLookup, postCallback, RefusedDestinationError, refusedLiteralHost, type ResolveAll } from '../webhooks/callback-sender.js';
import { sendsCallback, webhookTargetOf, withoutWebhookToken } from '../webhooks/events.js';

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

/** `refused`: the destination is not allowed. `shutdown` / `lease_lost`: stopped by the queue (CLOSED / LEASE_LOST). */
type Outcome = { ok: true } | { ok: false; error: string; refused?: true } | 'shutdown' | 'lease_lost';

/** The dispatcher's own options besides the operator's settings. */
export interface WebhookDispatcherOptions extends WebhookSettings {
  log: WebhookLog;
  /** This process's replica id and lease length (default: a new id, DEFAULT_LEASE_TTL_MS). */
  lease?: LeaseConfig;
}

export class WebhookDispatcher {
  private readonly timeoutMs: number;
  private readonly baseDelayMs: number;
  private readonly maxAttempts: number;
  private readonly log: WebhookLog;
  private readonly allowPrivateAddresses: boolean;
  private readonly lookup: LookupFunction;
  private readonly onAttempt: (outcome: WebhookAttemptOutcome) => void;
  private readonly caps: WebhookClaimCaps;
  /** The longest sleep: MAX_SLEEP_MS alone, or the poll interval when replicas share the store. */
  private readonly maxSleepMs: number;
  private readonly lease: LeaseConfig;
  /** The attempts in flight, by delivery id, under their leases. */
  private readonly queue: LeasedQueue<WebhookDelivery>;
  /** Wakes the queue when the next delivery is due. */
  private timer: NodeJS.Timeout | undefined;
  private started = false;
  private closed = false;

  constructor(private readonly store: Store, settings: WebhookDispatcherOptions) {
    this.log = settings.log;
    this.lease = settings.lease ?? leaseConfig();
    this.timeoutMs = settings.timeoutMs ?? DEFAULT_WEBHOOK_SETTINGS.timeoutMs;
    this.baseDelayMs = settings.baseDelayMs ?? DEFAULT_WEBHOOK_SETTINGS.baseDelayMs;
    this.maxAttempts = 1 + (settings.maxRetries ?? DEFAULT_WEBHOOK_SETTINGS.maxRetries);
    this.allowPrivateAddresses = settings.allowPrivateAddresses ?? DEFAULT_WEBHOOK_SETTINGS.allowPrivateAddresses;
    this.lookup = guardedLookup(this.allowPrivateAddresses, settings.resolveAll);
    this.onAttempt = settings.onAttempt ?? (() => {});
    this.caps = {
      perOrg: settings.maxInFlightPerOrg ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlightPerOrg,
      perHost: settings.maxInFlightPerHost ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlightPerHost,
    };
    this.maxSleepMs = store.shared ? Math.min(MAX_SLEEP_MS, settings.pollIntervalMs ?? DEFAULT_WEBHOOK_SETTINGS.pollIntervalMs) : MAX_SLEEP_MS;
    this.queue = new LeasedQueue<WebhookDelivery>({
      name: 'completion webhooks', lease: this.lease, shared: store.shared, log: this.log,
      maxJobs: settings.maxInFlight ?? DEFAULT_WEBHOOK_SETTINGS.maxInFlight,
      store: {
        key: (d) => d.id,
        claim: (term, room) => store.claimDueWebhookDeliveries(term, room, this.caps),
        // Nothing in flight: nothing to renew, no query.
        renew: async (term, held) => (held.size === 0 ? [] : store.renewWebhookLeases(term)),
        // Shutdown is not the receiver's fault: an attempt stopped at close is due again at once, not counted.
        handBack: async (_owner, deliveries) => {
          await Promise.all(deliveries.map((d) => this.release(d)));
        },
        releaseAll: async () => {
          try {
            await store.releaseAllWebhookLeases(Date.now());
          } catch (err) {
            this.log.error({ err }, 'completion webhooks: could not hand back the leases of the process before; they expire on their own');
          }
        },
      },
      work: async (d, lease) => {
        await this.attempt(d, lease.signal)
          .catch((err: unknown) => this.log.error({ err, delivery_id: d.id }, 'completion webhook: could not record an attempt'));
        return 'claim-next';
      },
      afterClaims: (pass) => this.sleepAfter(pass),
    });
  }

  /**
   * Begins sending: deliveries left pending by an earlier process are due at once. With a store
   * this process owns alone, the leases the process before left (it died mid-attempt) are handed
   * back first; a failure to do so is logged, and those leases then simply expire.
   */
  async start(): Promise<void> {
    if (this.started || this.closed) return;
    this.started = true;
    await this.queue.start();
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
    clearTimeout(this.timer);
    void this.queue.poke();
  }

  /**
   * Stops sending: no attempt starts after this, and attempts in flight are aborted and left
   * pending (not counted) for the next start. Resolves once their state is stored. Safe to call twice.
   */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    await this.queue.close();
  }

  /**
   * After each claim: sleeps until the next delivery is due. Due deliveries held back by a cap are
   * looked at again when an attempt of this process ends (its worker asks for a claim) or when a
   * lease ends (another process's attempt), whichever comes first; with every slot taken, the
   * attempt that ends next asks. A failed claim is tried again a little later.
   */
  private async sleepAfter(pass: ClaimPass): Promise<void> {
    if (pass.full) return;
    if (pass.error !== undefined) {
      this.sleepUntil(Date.now() + Math.min(this.baseDelayMs * 4, MAX_SLEEP_MS));
      return;
    }
    let next: number | undefined;
    try {
      next = await this.store.nextWebhookAttemptMs(pass.atMs);
    } catch (err) {
      if (this.closed) return;
      this.log.error({ err }, 'completion webhooks: could not read pending deliveries; retrying');
      this.sleepUntil(Date.now() + Math.min(this.baseDelayMs * 4, MAX_SLEEP_MS));
      return;
    }
    // With a shared store, nothing pending here still gets a look later (another replica's leftovers).
    if (next !== undefined) this.sleepUntil(next);
    else if (this.store.shared) this.sleepUntil(pass.atMs + this.maxSleepMs);
  }

  private sleepUntil(atMs: number): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.wake(), Math.min(Math.max(0, atMs - Date.now()), this.maxSleepMs));
    this.timer.unref(); // pending callbacks alone do not keep a process alive
  }

  /** One attempt and its recorded outcome (written only while this process holds the delivery). */
  private async attempt(d: WebhookDelivery, stop: AbortSignal): Promise<void> {
    const outcome = await this.post(d, stop);
    if (outcome === 'lease_lost') {
      this.log.info?.({ delivery_id: d.id, object_id: d.objectId }, 'completion webhook attempt stopped: another process took the delivery over');
      return;
    }
    if (outcome === 'shutdown') return; // the queue hands it back (release)
    const attempts = d.attempts + 1;
    if (outcome.ok) {
      if (await this.record(d, { state: 'delivered', attempts, nextAttemptAtMs: Date.now(), lastError: null })) this.onAttempt('delivered');
      return;
    }
    const fields = { delivery_id: d.id, object_id: d.objectId, url: d.url, attempt: attempts, error: outcome.error };
    if (outcome.refused) {
      if (!(await this.record(d, { state: 'failed', attempts, nextAttemptAtMs: Date.now(), lastError: outcome.error }))) return;
      this.onAttempt('refused');
      this.log.warn({ ...fields, reason: 'refused_destination', detail: outcome.error }, 'completion webhook destination refused; not retried');
      return;
    }
    if (attempts >= this.maxAttempts) {
      if (!(await this.record(d, { state: 'failed', attempts, nextAttemptAtMs: Date.now(), lastError: outcome.error }))) return;
      this.onAttempt('failed');
      this.log.error(fields, `completion webhook failed after ${attempts} attempts; giving up`);
      return;
    }
    const nextAttemptAtMs = Date.now() + this.baseDelayMs * 2 ** (attempts - 1);
    if (!(await this.record(d, { state: 'pending', attempts, nextAttemptAtMs, lastError: outcome.error }))) return;
    this.onAttempt('retry');
    this.log.warn(fields, 'completion webhook attempt failed; will retry');
  }

  /** Writes an attempt's outcome under the fence; false (logged) when another process holds the delivery now. */
  private async record(d: WebhookDelivery, update: WebhookDeliveryUpdate): Promise<boolean> {
    if (await this.store.updateWebhookDelivery(d.id, this.lease.owner, update)) return true;
    this.log.info?.({ delivery_id: d.id, object_id: d.objectId, state: update.state },
      'completion webhook outcome not recorded: another process took the delivery over after its lease ran out');
    return false;
  }

  /** Ends a claim without an attempt (shutdown is not the receiver's fault): due again at once. */
  private async release(d: WebhookDelivery): Promise<void> {
    await this.store.updateWebhookDelivery(d.id, this.lease.owner,
      { state: 'pending', attempts: d.attempts, nextAttemptAtMs: Date.now(), lastError: d.lastError });
  }

  private async post(d: WebhookDelivery, stop: AbortSignal): Promise<Outcome> {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (d.token !== null) headers['authorization'] = `Bearer ${d.token}`;
    const timeout = AbortSignal.timeout(this.timeoutMs);
    try {
      const status = await postCallback(new URL(d.url), d.body, {
        headers, signal: AbortSignal.any([stop, timeout]), lookup: this.lookup, allowPrivateAddresses: this.allowPrivateAddresses,
      });
      return status >= 200 && status < 300 ? { ok: true } : { ok: false, error: `HTTP ${status}` };
    } catch (err) {
      if (err instanceof RefusedDestinationError) return { ok: false, error: err.message, refused: true };
      if (stop.aborted) return stop.reason === LEASE_LOST ? 'lease_lost' : 'shutdown';
      if (timeout.aborted) return { ok: false, error: `timed out after ${this.timeoutMs} ms` };
      return { ok: false, error: (err as Error).message };
    }
  }
}
