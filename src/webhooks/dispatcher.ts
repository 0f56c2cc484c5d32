// Sends completion callbacks (spec, "Events") at least once. enqueue() persists a delivery before
// its first attempt; the dispatcher then claims due deliveries from the store, POSTs them, and
// records each outcome, so a restart resumes whatever was still pending.
//
// Retries: the spec's "retried up to 3 times" is read as 1 attempt + 3 retries = 4 attempts at
// most. A non-2xx reply, a network error or the per-attempt timeout is a failed attempt; the next
// one waits baseDelayMs * 2^(attempt - 1) (1 s, 2 s, 4 s by default). Redirects are not followed
// (a 3xx is a failed attempt): following one would hand the bearer token to another address.
//
// Duplicates: delivery is at-least-once. A process that dies after the receiver's 2xx but before
// the outcome is stored sends the callback again after the restart (the body's id deduplicates).
//
// Failure of every attempt is logged and kept as state `failed`; it never touches the response.

import { randomUUID } from 'node:crypto';
import type { Store, WebhookDelivery } from '../store/store.js';
import { sendsCallback, webhookTargetOf } from './events.js';

/** The pino-compatible subset the dispatcher logs with (fastify's app.log fits). */
export interface WebhookLog {
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
}

export const DEFAULT_WEBHOOK_SETTINGS = { timeoutMs: 30_000, baseDelayMs: 1_000, maxRetries: 3 } as const;

/** Deliveries sent at once; more due ones wait for a free slot. */
const MAX_CONCURRENT = 16;
/** Longest timer: long backoffs are re-checked rather than trusted to one huge timeout. */
const MAX_SLEEP_MS = 60_000;

type Outcome = { ok: true } | { ok: false; error: string } | 'shutdown';

export class WebhookDispatcher {
  private readonly timeoutMs: number;
  private readonly baseDelayMs: number;
  private readonly maxAttempts: number;
  private readonly log: WebhookLog;
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
  }

  /** Begins sending: deliveries left pending by an earlier process are due at once. */
  start(): void {
    if (this.started || this.closed) return;
    this.started = true;
    this.wake();
  }

  /**
   * Persists a callback of `body` to the target named by `metadata`, when there is one and the
   * body's status sends a callback, and wakes the sender. Never throws: a callback must not change
   * the request's outcome, so a store error is logged. Resolves once the delivery is stored.
   */
  async enqueue(orgId: string, metadata: unknown, body: Record<string, unknown> & { id: string }): Promise<void> {
    if (!sendsCallback(body)) return;
    const target = webhookTargetOf(metadata);
    if (typeof target === 'string') {
      // Told to the operator only: the request itself is unaffected (spec).
      if (target !== 'no_url') this.log.warn({ object_id: body.id, reason: target }, 'completion webhook not sent');
      return;
    }
    const now = Date.now();
    const delivery: WebhookDelivery = {
      id: `whd_${randomUUID().replace(/-/g, '')}`,
      orgId,
      objectId: body.id,
      url: target.url,
      token: target.token,
      body: JSON.stringify(body),
      state: 'pending',
      attempts: 0,
      nextAttemptAtMs: now,
      lastError: null,
      createdAt: Math.floor(now / 1000),
    };
    try {
      await this.store.insertWebhookDelivery(delivery);
    } catch (err) {
      this.log.error({ err, object_id: body.id }, 'could not store a completion webhook delivery');
      return;
    }
    this.wake();
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

  /** Runs a pump now, or makes the running one look again. */
  private wake(): void {
    if (!this.started || this.closed) return;
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = this.pump().finally(() => { this.pumping = undefined; });
  }

  /** Starts every due delivery there is room for, then sleeps until the next one is due. */
  private async pump(): Promise<void> {
    clearTimeout(this.timer);
    try {
      do {
        this.pumpAgain = false;
        const room = MAX_CONCURRENT - this.inFlight.size;
        if (room <= 0) return; // a finishing attempt wakes the pump again
        const now = Date.now();
        // The lease outlasts the attempt (its timeout) so no later claim takes it meanwhile.
        const claimed = await this.store.claimDueWebhookDeliveries(now, now + this.timeoutMs + 5_000, room);
        for (const delivery of claimed) {
          // close() came while claiming: hand the claim back rather than start an attempt.
          if (this.closed) await this.release(delivery);
          else this.launch(delivery);
        }
      } while (this.pumpAgain && !this.closed);
      if (this.closed) return;
      const next = await this.store.nextWebhookAttemptMs();
      if (next !== undefined) this.sleepUntil(next);
    } catch (err) {
      if (this.closed) return;
      this.log.error({ err }, 'completion webhooks: could not read pending deliveries; retrying');
      this.sleepUntil(Date.now() + Math.min(this.baseDelayMs * 4, MAX_SLEEP_MS));
    }
  }

  private sleepUntil(atMs: number): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.wake(), Math.min(Math.max(0, atMs - Date.now()), MAX_SLEEP_MS));
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
      return;
    }
    const fields = { delivery_id: d.id, object_id: d.objectId, url: d.url, attempt: attempts, error: outcome.error };
    if (attempts >= this.maxAttempts) {
      await this.store.updateWebhookDelivery(d.id, { state: 'failed', attempts, nextAttemptAtMs: Date.now(), lastError: outcome.error });
      this.log.error(fields, `completion webhook failed after ${attempts} attempts; giving up`);
      return;
    }
    const nextAttemptAtMs = Date.now() + this.baseDelayMs * 2 ** (attempts - 1);
    await this.store.updateWebhookDelivery(d.id, { state: 'pending', attempts, nextAttemptAtMs, lastError: outcome.error });
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
      const res = await fetch(d.url, {
        method: 'POST', headers, body: d.body, redirect: 'manual', signal: AbortSignal.any([shutdown, timeout]),
      });
      // The reply's body means nothing to us; dropping it frees the connection.
      await res.body?.cancel().catch(() => {});
      return res.ok ? { ok: true } : { ok: false, error: `HTTP ${res.status}` };
    } catch (err) {
      if (shutdown.aborted) return 'shutdown';
      if (timeout.aborted) return { ok: false, error: `timed out after ${this.timeoutMs} ms` };
      const cause = (err as { cause?: { message?: string } }).cause?.message;
      return { ok: false, error: cause ?? (err as Error).message };
    }
  }
}
