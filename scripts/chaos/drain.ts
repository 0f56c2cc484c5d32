// After the last kill: one more start, then wait (bounded) until everything accepted has ended:
// every background response terminal, every batch terminal, every webhook delivery settled.

import Database from 'better-sqlite3';
import { call, forEachLimit } from './client.js';
import type { Journal } from './journal.js';
import type { Receiver } from './receiver.js';

export const RESPONSE_TERMINAL = ['completed', 'incomplete', 'failed', 'cancelled'];
export const BATCH_TERMINAL = ['completed', 'failed', 'expired', 'cancelled'];

export interface DrainContext {
  baseUrl: string;
  keys: ReadonlyMap<string, string>;
  journal: Journal;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function getJson(ctx: DrainContext, org: string, path: string): Promise<{ status: number; body: any }> {
  const out = await call(ctx.baseUrl, ctx.keys.get(org)!, 'GET', path);
  if (out.kind !== 'reply') throw new Error(`GET ${path} as ${org}: ${out.kind === 'cut' ? out.error : 'timed out'} (the drain server should be up)`);
  return out.reply;
}

/**
 * Polls every accepted background response until it is terminal; returns id -> the object last
 * read (still in_progress for those that never ended within timeoutMs).
 */
export async function drainBackground(ctx: DrainContext, timeoutMs: number): Promise<Map<string, any>> {
  const finals = new Map<string, any>();
  let pending = ctx.journal.of('background');
  const deadline = Date.now() + timeoutMs;
  while (pending.length > 0) {
    const still: typeof pending = [];
    await forEachLimit(pending, 8, async (a) => {
      const { status, body } = await getJson(ctx, a.org, `/v1/responses/${a.id}`);
      finals.set(a.id, status === 200 ? body : { status: `HTTP ${status}`, error: body?.error });
      if (status === 200 && !RESPONSE_TERMINAL.includes(body.status)) still.push(a);
    });
    pending = still;
    if (pending.length === 0 || Date.now() > deadline) break;
    await sleep(250);
  }
  return finals;
}

/** Every batch of the organization, newest first, following has_more. */
export async function listBatches(ctx: DrainContext, org: string): Promise<any[]> {
  const all: any[] = [];
  let after: string | undefined;
  for (;;) {
    const { status, body } = await getJson(ctx, org, `/v1/batches?limit=100${after ? `&after=${after}` : ''}`);
    if (status !== 200) throw new Error(`GET /v1/batches as ${org}: HTTP ${status}`);
    all.push(...body.data);
    if (!body.has_more) return all;
    after = body.last_id;
  }
}

/** Polls every batch of every organization (not only those whose creation we saw) until terminal. */
export async function drainBatches(ctx: DrainContext, timeoutMs: number): Promise<Map<string, any[]>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const byOrg = new Map<string, any[]>();
    for (const org of ctx.keys.keys()) byOrg.set(org, await listBatches(ctx, org));
    const running = [...byOrg.values()].flat().filter((b) => !BATCH_TERMINAL.includes(b.status));
    if (running.length === 0 || Date.now() > deadline) return byOrg;
    await sleep(250);
  }
}

/**
 * Waits until the store holds no pending delivery and every expected object id reached the
 * receiver. Reads sluice.db read-only next to the running server (WAL lets a reader in); a
 * delivery whose attempt died with a killed server is leased for the attempt timeout plus 5 s
 * (35 s), so this can take that long after the last kill. Returns the pending count left.
 */
export async function drainDeliveries(dbPath: string, receiver: Receiver, expectedIds: readonly string[], timeoutMs: number): Promise<number> {
  const db = new Database(dbPath, { readonly: true, fileMustExist: true });
  try {
    const countPending = db.prepare("SELECT count(*) AS n FROM webhook_deliveries WHERE state = 'pending'");
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pending = (countPending.get() as { n: number }).n;
      const missing = expectedIds.filter((id) => !(receiver.byId.get(id) ?? []).some((c) => c.status === 200));
      if ((pending === 0 && missing.length === 0) || Date.now() > deadline) return pending;
      await sleep(250);
    }
  } finally {
    db.close();
  }
}
