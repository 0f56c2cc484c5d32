// The audit checks made on the store itself, read-only, after the server stopped: the usage
// ledger against every stored response, every accepted chat completion and message and every
// answered batch line; the store at rest (nothing in progress, no job left); the webhook
// delivery rows against what the receiver got; idempotency records against the replies.

import Database from 'better-sqlite3';
import type { AuditedBatch, Check } from './audit-http.js';
import type { Journal } from './journal.js';
import type { Receiver } from './receiver.js';

export interface StoreAuditInput {
  dbPath: string;
  journal: Journal;
  batches: AuditedBatch[];
  receiver: Receiver;
  /** org name -> the id of the API key its traffic used */
  keyIds: ReadonlyMap<string, string>;
}

interface LedgerRow { surface: string; request_id: string; org_id: string; org_name: string; key_id: string; output_tokens: number }
interface ResponseRow { id: string; org_id: string; status: string; body: string }
interface DeliveryRow { id: string; org_id: string; object_id: string; url: string; state: string; attempts: number; last_error: string | null }

export interface StoreAudit {
  checks: Check[];
  ledgerRows: number;
  /** org name -> ledger rows */
  ledgerByOrg: Map<string, number>;
}

export function auditStore(input: StoreAuditInput): StoreAudit {
  const db = new Database(input.dbPath, { readonly: true, fileMustExist: true });
  try {
    const orgIdByName = new Map((db.prepare('SELECT id, name FROM organizations').all() as Array<{ id: string; name: string }>).map((o) => [o.name, o.id]));
    const orgNameById = new Map([...orgIdByName].map(([name, id]) => [id, name]));
    const ledger = db.prepare('SELECT surface, request_id, org_id, org_name, key_id, output_tokens FROM usage_ledger').all() as LedgerRow[];
    const responses = db.prepare('SELECT id, org_id, status, body FROM responses').all() as ResponseRow[];
    const deliveries = db.prepare('SELECT id, org_id, object_id, url, state, attempts, last_error FROM webhook_deliveries').all() as DeliveryRow[];
    const jobs = db.prepare('SELECT response_id FROM background_jobs').all() as Array<{ response_id: string }>;
    const batchRows = db.prepare('SELECT id, org_id, status FROM batches').all() as Array<{ id: string; org_id: string; status: string }>;
    const idempotency = db.prepare("SELECT org_id, key, status_code, body FROM idempotency WHERE scope = 'messages'").all() as
      Array<{ org_id: string; key: string; status_code: number | null; body: string | null }>;
    const ledgerByOrg = new Map<string, number>();
    for (const r of ledger) ledgerByOrg.set(r.org_name, (ledgerByOrg.get(r.org_name) ?? 0) + 1);
    return {
      checks: [
        checkAtRest(input, orgNameById, responses, jobs, batchRows),
        checkLedger(input, orgNameById, ledger, responses),
        checkDeliveryRows(input, orgNameById, deliveries),
        checkIdempotencyRecords(input, orgIdByName, idempotency),
      ],
      ledgerRows: ledger.length,
      ledgerByOrg,
    };
  } finally {
    db.close();
  }
}

/** Nothing left in progress; every row accounted to a request we made or one a kill cut off. */
function checkAtRest(input: StoreAuditInput, orgNameById: Map<string, string>, responses: ResponseRow[],
  jobs: Array<{ response_id: string }>, batchRows: Array<{ id: string; status: string }>): Check {
  const { journal } = input;
  const violations: string[] = [];
  for (const r of responses) if (['in_progress', 'queued'].includes(r.status)) violations.push(`store: response ${r.id} is still ${r.status}`);
  for (const j of jobs) violations.push(`store: background job of ${j.response_id} left behind`);
  for (const b of batchRows) if (!['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) violations.push(`store: batch ${b.id} is still ${b.status}`);
  // Responses whose reply a kill cut off may exist: never more than were cut off, per organization and kind.
  const unknown = new Map<string, number>();
  const storedRefusals: string[] = [];
  for (const r of responses) {
    const org = orgNameById.get(r.org_id) ?? r.org_id;
    const known = journal.byId.get(r.id);
    if (known && known.org !== org) violations.push(`store: response ${r.id} accepted for ${known.org} is stored under ${org}`);
    if (known) continue;
    const body = JSON.parse(r.body) as { background?: boolean; error?: { code?: string } };
    // A request answered 429 has no id the client knows of; it should leave no response behind.
    if (body.error?.code === 'rate_limit_exceeded') {
      storedRefusals.push(r.id);
      continue;
    }
    const kind = body.background === true ? 'background' : 'response';
    unknown.set(`${org}:${kind}`, (unknown.get(`${org}:${kind}`) ?? 0) + 1);
  }
  for (const [k, n] of unknown) {
    const [org, kind] = k.split(':') as [string, string];
    if (n > journal.cutCount(org, kind)) violations.push(`store: ${n} ${kind} responses of ${org} nobody accepted, but only ${journal.cutCount(org, kind)} were cut off`);
  }
  if (storedRefusals.length > 0) {
    violations.push(`store: ${storedRefusals.length} failed responses (error.code rate_limit_exceeded) stored for requests answered 429, `
      + `whose ids the clients never got (e.g. ${storedRefusals[0]})`);
  }
  const known = journal.of('background').length + journal.of('response').length;
  return {
    name: 'the store at rest',
    summary: `${responses.length} responses (${known} accepted, ${responses.length - known - storedRefusals.length} from replies a kill cut off), `
      + `none in progress, no job left, ${batchRows.length} batches all ended`,
    violations,
  };
}

/** One ledger row per request that ended with a result, none for the others, none twice. */
function checkLedger(input: StoreAuditInput, orgNameById: Map<string, string>, ledger: LedgerRow[], responses: ResponseRow[]): Check {
  const { journal, batches, keyIds } = input;
  const violations: string[] = [];
  const rows = new Map<string, LedgerRow[]>();
  for (const r of ledger) {
    const k = `${r.surface} ${r.request_id}`;
    rows.set(k, [...(rows.get(k) ?? []), r]);
    if (orgNameById.get(r.org_id) !== r.org_name) violations.push(`ledger: ${k} has org ${r.org_id} named ${r.org_name}`);
    if (keyIds.get(r.org_name) !== r.key_id) violations.push(`ledger: ${k} billed to key ${r.key_id}, not ${r.org_name}'s`);
  }
  for (const [k, list] of rows) if (list.length > 1) violations.push(`ledger: ${k} recorded ${list.length} times`);
  const one = (surface: string, id: string) => rows.get(`${surface} ${id}`) ?? [];

  // Responses (foreground and background, accepted or not): billed exactly when they have a result.
  const storedIds = new Set<string>();
  for (const r of responses) {
    storedIds.add(r.id);
    const billed = ['completed', 'incomplete'].includes(r.status);
    const found = one('responses', r.id);
    if (billed && found.length === 0) violations.push(`ledger: response ${r.id} ended ${r.status} but has no ledger row`);
    if (!billed && found.length > 0) violations.push(`ledger: response ${r.id} ended ${r.status} yet is billed`);
    const body = JSON.parse(r.body) as { usage?: { output_tokens?: number } };
    if (found[0] && body.usage?.output_tokens !== found[0].output_tokens) {
      violations.push(`ledger: response ${r.id} billed ${found[0].output_tokens} output tokens, its usage says ${body.usage?.output_tokens}`);
    }
    if (found[0] && found[0].org_id !== r.org_id) violations.push(`ledger: response ${r.id} billed to another organization`);
  }
  for (const r of ledger) if (r.surface === 'responses' && !storedIds.has(r.request_id)) violations.push(`ledger: row for response ${r.request_id}, which is not stored`);

  // Chat completions and messages: every accepted one once; rows nobody accepted only from cut-off replies.
  for (const [kind, surface, outputOf] of [
    ['chat', 'chat.completions', (b: any) => b.usage?.completion_tokens],
    ['message', 'messages', (b: any) => b.usage?.output_tokens],
  ] as const) {
    for (const a of journal.of(kind)) {
      const found = one(surface, a.id);
      if (found.length === 0) violations.push(`ledger: ${kind} ${a.id} (${a.org}, cycle ${a.cycle}) answered 200 but has no ledger row`);
      else if (found[0]!.org_name !== a.org) violations.push(`ledger: ${kind} ${a.id} of ${a.org} billed to ${found[0]!.org_name}`);
      else if (found[0]!.output_tokens !== outputOf(a.body)) violations.push(`ledger: ${kind} ${a.id} billed ${found[0]!.output_tokens} output tokens, its reply says ${outputOf(a.body)}`);
    }
    for (const org of keyIds.keys()) {
      const orphans = ledger.filter((r) => r.surface === surface && r.org_name === org && !journal.byId.has(r.request_id)).length;
      if (orphans > journal.cutCount(org, kind)) {
        violations.push(`ledger: ${orphans} ${surface} rows of ${org} nobody was answered for, but only ${journal.cutCount(org, kind)} replies were cut off`);
      }
    }
  }

  // Batch lines: exactly the lines in each batch's output file.
  const batchById = new Map(batches.map((b) => [b.id, b]));
  const billedLines = new Map<string, Set<number>>();
  for (const r of ledger.filter((x) => x.surface === 'batch')) {
    const [batchId, line] = [r.request_id.slice(0, r.request_id.lastIndexOf(':')), Number(r.request_id.slice(r.request_id.lastIndexOf(':') + 1))];
    const batch = batchById.get(batchId);
    if (!batch) violations.push(`ledger: row for ${r.request_id}, a batch no organization lists`);
    else if (batch.org !== r.org_name) violations.push(`ledger: line ${r.request_id} of ${batch.org}'s batch billed to ${r.org_name}`);
    billedLines.set(batchId, (billedLines.get(batchId) ?? new Set()).add(line));
  }
  let lines = 0;
  for (const b of batches) {
    const billed = billedLines.get(b.id) ?? new Set<number>();
    lines += b.okLines.size;
    for (const n of b.okLines) if (!billed.has(n)) violations.push(`ledger: batch ${b.id} line ${n} is in the output file but has no ledger row`);
    for (const n of billed) if (!b.okLines.has(n)) violations.push(`ledger: batch ${b.id} line ${n} is billed but not in the output file`);
  }
  for (const r of ledger) {
    if (!['responses', 'chat.completions', 'messages', 'batch'].includes(r.surface)) violations.push(`ledger: row of unknown surface ${r.surface}`);
  }
  const bySurface = (s: string) => ledger.filter((r) => r.surface === s).length;
  return {
    name: 'no ledger row missing or doubled',
    summary: `${ledger.length} rows: responses ${bySurface('responses')}, chat ${bySurface('chat.completions')}, messages ${bySurface('messages')}, `
      + `batch lines ${bySurface('batch')} (= ${lines} answered lines); none doubled, none for failed or cancelled work`,
    violations,
  };
}

/** Every delivery row delivered to its own organization's hook, and the receiver saw each. */
function checkDeliveryRows(input: StoreAuditInput, orgNameById: Map<string, string>, deliveries: DeliveryRow[]): Check {
  const { receiver, journal } = input;
  const violations: string[] = [];
  const rowsByObject = new Map<string, DeliveryRow[]>();
  for (const d of deliveries) {
    const org = orgNameById.get(d.org_id) ?? d.org_id;
    rowsByObject.set(d.object_id, [...(rowsByObject.get(d.object_id) ?? []), d]);
    if (d.state !== 'delivered') violations.push(`delivery ${d.id} of ${d.object_id} (${org}) ended ${d.state} after ${d.attempts} attempts: ${d.last_error}`);
    if (d.url !== receiver.hookUrl(org)) violations.push(`LEAK: delivery ${d.id} of ${org} goes to ${d.url}`);
    const owner = journal.byId.get(d.object_id);
    if (owner && owner.org !== org) violations.push(`LEAK: delivery of ${owner.org}'s ${d.object_id} stored under ${org}`);
    if (!(receiver.byId.get(d.object_id) ?? []).some((c) => c.status === 200 && c.org === org)) {
      violations.push(`delivery ${d.id} of ${d.object_id} (${org}) is ${d.state} but the receiver never answered it 200 at ${org}'s hook`);
    }
  }
  for (const [id, list] of rowsByObject) if (list.length > 1) violations.push(`delivery: ${list.length} delivery rows for ${id}`);
  for (const id of receiver.byId.keys()) if (!rowsByObject.has(id)) violations.push(`delivery: the receiver got ${id}, which has no delivery row`);
  return {
    name: 'delivery rows settled',
    summary: `${deliveries.length} rows, all delivered, one per object, each seen by the receiver at its own organization's hook`,
    violations,
  };
}

/** The stored result of each Idempotency-Key is the message its 200s carried. */
function checkIdempotencyRecords(input: StoreAuditInput, orgIdByName: Map<string, string>,
  rows: Array<{ org_id: string; key: string; status_code: number | null; body: string | null }>): Check {
  const violations: string[] = [];
  const byKey = new Map(rows.map((r) => [`${r.org_id}\0${r.key}`, r]));
  for (const r of rows) if (r.status_code === null) violations.push(`idempotency: key ${r.key} still pending after a graceful stop`);
  for (const [k, id] of input.journal.idempotentIds) {
    const [org, key] = k.split('\0') as [string, string];
    const row = byKey.get(`${orgIdByName.get(org)}\0${key}`);
    const stored = row?.body ? (JSON.parse(row.body) as { id?: string }).id : undefined;
    if (stored !== id) violations.push(`idempotency: ${org} key ${key} answered ${id}, the store keeps ${stored ?? 'nothing'}`);
  }
  const j = input.journal.counts;
  return {
    name: 'idempotency keys give one message',
    summary: `${input.journal.idempotentIds.size} keys (both organizations drawing the same key names), ${j.retried} re-sent after kills `
      + `(${j.retriedReplayed} replayed what the killed server had committed), ${j.replays} deliberate replays, each one id`,
    violations,
  };
}
