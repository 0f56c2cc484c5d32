// One burst of mixed traffic: a few concurrent clients per organization, each drawing its next
// request from its own seeded stream: foreground Responses, Chat Completions and Messages (some
// with Idempotency-Key, some with a completion webhook), background responses with a webhook and
// a token, small batches, cancels of its own running work, and replays of idempotent messages.
// The burst runs until stop(); the caller kills the server right after, so requests in flight
// then die with it.

import { batchUpload, call, type Outcome } from './client.js';
import { MODEL, type Accepted, type Journal } from './journal.js';
import { createRng, type Rng } from './rng.js';

export interface BurstContext {
  baseUrl: string;
  /** org name -> its API key */
  keys: ReadonlyMap<string, string>;
  hookUrl(org: string): string;
  journal: Journal;
  seed: string;
  cycle: number;
  workersPerOrg: number;
}

export interface Burst {
  stop(): void;
  /** Resolves when every client has seen its last reply (or cut connection). */
  done: Promise<void>;
}

type Action = 'response' | 'chat' | 'message' | 'background' | 'batch' | 'cancel' | 'cancel_batch' | 'replay';

/** Weights of the next request; small generations keep a 2-core machine ahead of the traffic. */
const ACTIONS: ReadonlyArray<readonly [Action, number]> = [
  ['response', 14], ['chat', 12], ['message', 14], ['background', 30], ['batch', 4],
  ['cancel', 4], ['cancel_batch', 1], ['replay', 4],
];

const WORDS = ['river', 'lamp', 'seven', 'quiet', 'orbit', 'maple', 'hello', 'story', 'copper', 'north', 'bread', 'window'];

export function startBurst(ctx: BurstContext): Burst {
  const live = { running: true };
  const workers: Promise<void>[] = [];
  for (const org of ctx.keys.keys()) {
    for (let w = 0; w < ctx.workersPerOrg; w++) {
      const client = new Client(ctx, org, `${ctx.cycle}-${w}`, createRng(`${ctx.seed}:${ctx.cycle}:${org}:${w}`));
      workers.push(client.run(live));
    }
  }
  return { stop: () => { live.running = false; }, done: Promise.all(workers).then(() => {}) };
}

/** Sends the idempotent messages still owed an answer until each gets one (the drain's first step). */
export async function finishIdempotentRetries(ctx: BurstContext): Promise<void> {
  for (let round = 0; ctx.journal.idempotentRetries.length > 0 && round < 5; round++) {
    const pending = ctx.journal.idempotentRetries.splice(0);
    for (const org of ctx.keys.keys()) {
      const client = new Client(ctx, org, `drain-${round}`, createRng(`${ctx.seed}:drain:${org}`));
      for (const r of pending.filter((p) => p.org === org)) await client.retryIdempotent(r);
    }
  }
  for (const r of ctx.journal.idempotentRetries) ctx.journal.violations.push(`idempotency: ${r.org} key ${r.key} never answered after the last restart`);
}

class Client {
  private readonly key: string;
  private n = 0;

  constructor(private readonly ctx: BurstContext, private readonly org: string, private readonly tag: string, private readonly rng: Rng) {
    this.key = ctx.keys.get(org)!;
  }

  async run(live: { running: boolean }): Promise<void> {
    while (live.running) {
      // Messages a kill left unanswered are sent again first: the key must give one result.
      const retry = this.ctx.journal.idempotentRetries.findIndex((r) => r.org === this.org);
      if (retry >= 0) await this.retryIdempotent(this.ctx.journal.idempotentRetries.splice(retry, 1)[0]!);
      else await this.act(this.rng.weighted(ACTIONS));
      await new Promise((r) => setTimeout(r, this.rng.int(0, 25)));
    }
  }

  private async act(action: Action): Promise<void> {
    switch (action) {
      case 'response': return this.response();
      case 'chat': return this.chat();
      case 'message': return this.message();
      case 'background': return this.background();
      case 'batch': return this.batch();
      case 'cancel': return this.cancel();
      case 'cancel_batch': return this.cancelBatch();
      case 'replay': return this.replay();
    }
  }

  private text(): string {
    return Array.from({ length: this.rng.int(2, 8) }, () => this.rng.pick(WORDS)).join(' ');
  }

  /** metadata with a completion webhook on this organization's hook (a token most of the time). */
  private hook(): { metadata: Record<string, string>; token: string | null } {
    const token = this.rng.chance(0.9) ? `tok-${this.org}-${this.tag}-${this.n++}` : null;
    const metadata: Record<string, string> = { completion_webhook: this.ctx.hookUrl(this.org) };
    if (token !== null) metadata['webhook_token'] = token;
    return { metadata, token };
  }

  private send(method: string, path: string, opts: Parameters<typeof call>[4] = {}): Promise<Outcome> {
    return call(this.ctx.baseUrl, this.key, method, path, opts);
  }

  /** The reply when it is a 200; otherwise notes a cut-off or a violation and returns undefined. */
  private expect200(out: Outcome, what: string, cutAs: string): { body: any; headers: Headers } | undefined {
    if (out.kind === 'cut') {
      this.ctx.journal.cut(this.org, cutAs);
      return undefined;
    }
    if (out.kind === 'timeout') {
      this.ctx.journal.violations.push(`${what} (${this.org}): no reply within 30 s from a live server`);
      return undefined;
    }
    const e = out.reply.body?.error;
    if (out.reply.status === 429) {
      // The organization's documented limits (src/serving/tenant-limits.ts): refused, not accepted.
      this.ctx.journal.refuse(this.org, cutAs, `${e?.code}: ${e?.message}`);
      return undefined;
    }
    if (out.reply.status !== 200) {
      this.ctx.journal.violations.push(`${what} (${this.org}): HTTP ${out.reply.status} ${e?.code ?? ''} ${e?.message ?? JSON.stringify(out.reply.body).slice(0, 200)}`);
      return undefined;
    }
    return out.reply;
  }

  private accept(a: Omit<Accepted, 'org' | 'cycle'>): void {
    this.ctx.journal.accept({ ...a, org: this.org, cycle: this.ctx.cycle });
  }

  private async response(): Promise<void> {
    const hook = this.rng.chance(0.3) ? this.hook() : undefined;
    const input = this.rng.chance(0.3) ? [{ role: 'user', content: this.text() }] : this.text();
    const body = {
      model: MODEL, input, max_output_tokens: this.rng.int(1, 12), temperature: this.rng.pick([0, 0.7, 1]),
      ...(this.rng.chance(0.2) && { instructions: this.text() }), ...(hook && { metadata: hook.metadata }),
    };
    const reply = this.expect200(await this.send('POST', '/v1/responses', { json: body }), 'POST /v1/responses', 'response');
    if (reply) this.accept({ kind: 'response', id: reply.body.id, body: reply.body, ...(hook && { hookToken: hook.token }) });
  }

  private async chat(): Promise<void> {
    const hook = this.rng.chance(0.3) ? this.hook() : undefined;
    const body = {
      model: MODEL, messages: [{ role: 'user', content: this.text() }], max_tokens: this.rng.int(1, 12),
      ...(this.rng.chance(0.1) && { n: 2, seed: this.rng.int(0, 1000) }), ...(hook && { metadata: hook.metadata }),
    };
    const reply = this.expect200(await this.send('POST', '/v1/chat/completions', { json: body }), 'POST /v1/chat/completions', 'chat');
    if (reply) this.accept({ kind: 'chat', id: reply.body.id, body: reply.body, ...(hook && { hookToken: hook.token }) });
  }

  private async message(): Promise<void> {
    const body = {
      model: MODEL, max_tokens: this.rng.int(1, 12), messages: [{ role: 'user', content: this.text() }],
      ...(this.rng.chance(0.2) && { system: this.text() }),
    };
    if (!this.rng.chance(0.4)) {
      const reply = this.expect200(await this.send('POST', '/v1/messages', { json: body }), 'POST /v1/messages', 'message');
      if (reply) this.accept({ kind: 'message', id: reply.body.id, body: reply.body });
      return;
    }
    // NOTE: both organizations' clients draw keys from the same names (idem-<cycle>-<worker>-<n>),
    // with different bodies: a key space shared across organizations would show as a 422 or as
    // one organization receiving the other's message.
    const key = `idem-${this.tag}-${this.n++}`;
    await this.sendIdempotent({ org: this.org, key, body }, 'first send');
  }

  /** An idempotent message cut off by a kill, sent again (same key, same body) after the restart. */
  async retryIdempotent(r: { org: string; key: string; body: unknown }): Promise<void> {
    this.ctx.journal.counts.retried++;
    await this.sendIdempotent(r, 'retry after a kill');
  }

  private async sendIdempotent(r: { org: string; key: string; body: unknown }, how: string): Promise<void> {
    const out = await this.send('POST', '/v1/messages', { json: r.body, headers: { 'idempotency-key': r.key } });
    if (out.kind === 'cut') {
      this.ctx.journal.cut(this.org, 'message+key');
      this.ctx.journal.idempotentRetries.push(r);
      return;
    }
    const reply = this.expect200(out, `POST /v1/messages with Idempotency-Key (${how})`, 'message+key');
    if (!reply) return;
    if (how !== 'first send' && reply.headers.get('idempotent-replayed') === 'true') this.ctx.journal.counts.retriedReplayed++;
    this.ctx.journal.idempotentResult(this.org, r.key, reply.body.id, how);
    this.accept({ kind: 'message', id: reply.body.id, body: reply.body, idem: { key: r.key, body: r.body } });
  }

  /** A message already answered, sent again with its key: the same message must come back, replayed. */
  private async replay(): Promise<void> {
    const done = this.ctx.journal.accepted.filter((a) => a.org === this.org && a.idem !== undefined);
    if (done.length === 0) return this.message();
    const first = this.rng.pick(done);
    const out = await this.send('POST', '/v1/messages', { json: first.idem!.body, headers: { 'idempotency-key': first.idem!.key } });
    const reply = this.expect200(out, 'POST /v1/messages replay', 'replay');
    if (!reply) return;
    this.ctx.journal.counts.replays++;
    this.ctx.journal.idempotentResult(this.org, first.idem!.key, reply.body.id, 'replay');
    if (reply.headers.get('idempotent-replayed') !== 'true') {
      this.ctx.journal.violations.push(`idempotency: ${this.org} key ${first.idem!.key} replay came without idempotent-replayed: true`);
    }
  }

  private async background(): Promise<void> {
    const hook = this.rng.chance(0.9) ? this.hook() : undefined;
    const window = this.rng.weighted([['standard', 5], ['asap', 3], ['flex', 2]] as const);
    // Mostly short, a few long enough to be running (or waiting) when the kill comes.
    const maxTokens = this.rng.weighted([[4, 3], [16, 3], [64, 2], [256, 1]] as const);
    const body = {
      model: MODEL, input: this.text(), background: true, max_output_tokens: maxTokens, temperature: this.rng.pick([0, 1]),
      metadata: { completion_window: window, ...hook?.metadata },
    };
    const reply = this.expect200(await this.send('POST', '/v1/responses', { json: body }), 'POST /v1/responses background', 'background');
    if (!reply) return;
    if (reply.body.status !== 'in_progress') this.ctx.journal.violations.push(`background ${reply.body.id}: created ${reply.body.status}, not in_progress`);
    this.accept({ kind: 'background', id: reply.body.id, body: reply.body, ...(hook && { hookToken: hook.token }) });
  }

  private async batch(): Promise<void> {
    const endpoint = this.rng.pick(['/v1/responses', '/v1/chat/completions', '/v1/messages'] as const);
    const lines = Array.from({ length: this.rng.int(2, 6) }, (_, i) => {
      const maxTokens = this.rng.int(1, 10);
      const body = endpoint === '/v1/responses' ? { model: MODEL, input: this.text(), max_output_tokens: maxTokens }
        : endpoint === '/v1/chat/completions' ? { model: MODEL, messages: [{ role: 'user', content: this.text() }], max_tokens: maxTokens }
          : { model: MODEL, messages: [{ role: 'user', content: this.text() }], max_tokens: maxTokens };
      return JSON.stringify({ custom_id: `${this.org}-${this.tag}-${this.n}-${i}`, method: 'POST', url: endpoint, body });
    });
    this.n++;
    const upload = this.expect200(await this.send('POST', '/v1/files', { form: batchUpload(`${lines.join('\n')}\n`, 'chaos.jsonl') }),
      'POST /v1/files', 'upload');
    if (!upload) return;
    this.ctx.journal.counts.uploads++;
    this.ctx.journal.addFile(this.org, upload.body.id);
    const window = this.rng.pick(['asap', 'standard', 'flex', '24h']);
    const created = this.expect200(await this.send('POST', '/v1/batches', { json: { input_file_id: upload.body.id, endpoint, completion_window: window } }),
      'POST /v1/batches', 'batch');
    if (created) this.accept({ kind: 'batch', id: created.body.id, body: created.body });
  }

  /** Cancels one of this organization's background responses of this cycle (likely still running). */
  private async cancel(): Promise<void> {
    const mine = this.ctx.journal.of('background', this.org).filter((a) => a.cycle === this.ctx.cycle);
    if (mine.length === 0) return this.background();
    const target = this.rng.pick(mine);
    const out = await this.send('POST', `/v1/responses/${target.id}/cancel`);
    if (out.kind === 'cut') return this.ctx.journal.cut(this.org, 'cancel');
    if (out.kind === 'timeout') return void this.ctx.journal.violations.push(`cancel ${target.id}: no reply within 30 s`);
    this.ctx.journal.counts.cancels++;
    const { status, body } = out.reply;
    if (status === 200 && body.status === 'cancelled') this.ctx.journal.cancelledResponses.add(target.id);
    // 409: it already ended, or it is not running in this process yet (resumed after a restart).
    else if (status !== 409) this.ctx.journal.violations.push(`cancel ${target.id} (${this.org}): HTTP ${status} ${JSON.stringify(body).slice(0, 200)}`);
  }

  private async cancelBatch(): Promise<void> {
    const mine = this.ctx.journal.of('batch', this.org).filter((a) => a.cycle === this.ctx.cycle);
    if (mine.length === 0) return this.batch();
    const target = this.rng.pick(mine);
    const out = await this.send('POST', `/v1/batches/${target.id}/cancel`);
    if (out.kind === 'cut') return this.ctx.journal.cut(this.org, 'cancel_batch');
    if (out.kind === 'timeout') return void this.ctx.journal.violations.push(`batch cancel ${target.id}: no reply within 30 s`);
    this.ctx.journal.counts.batchCancels++;
    const { status, body } = out.reply;
    if (status === 200 && ['cancelling', 'cancelled'].includes(body.status)) this.ctx.journal.cancelledBatches.add(target.id);
    else if (status !== 409) this.ctx.journal.violations.push(`batch cancel ${target.id} (${this.org}): HTTP ${status} ${JSON.stringify(body).slice(0, 200)}`);
  }
}
