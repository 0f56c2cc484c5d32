// The audit checks made over HTTP against the drained server (and against what the webhook
// receiver recorded): terminal states, foreground objects, batch lines, deliveries, isolation.

import { call, forEachLimit, sameJson } from './client.js';
import { BATCH_TERMINAL, RESPONSE_TERMINAL, type DrainContext } from './drain.js';
import type { Accepted, Journal } from './journal.js';
import type { Receiver } from './receiver.js';

export interface Check {
  name: string;
  summary: string;
  violations: string[];
}

/** A terminal batch as the audit read it; the ledger check needs its answered lines. */
export interface AuditedBatch {
  id: string;
  org: string;
  status: string;
  /** Input line numbers (1-based) whose result is in the output file: the billed ones. */
  okLines: Set<number>;
  /** Input, output and error files (those that exist). */
  fileIds: string[];
}

async function get(ctx: DrainContext, org: string, path: string, method = 'GET'): Promise<{ status: number; body: any }> {
  const out = await call(ctx.baseUrl, ctx.keys.get(org)!, method, path);
  if (out.kind !== 'reply') return { status: -1, body: out.kind === 'cut' ? out.error : 'timeout' };
  return out.reply;
}

const count = (values: Iterable<string>): string => {
  const m = new Map<string, number>();
  for (const v of values) m.set(v, (m.get(v) ?? 0) + 1);
  return [...m].sort().map(([k, n]) => `${k} ${n}`).join(', ');
};

/** Every accepted background response ended once: terminal, stable on a second read, cancels kept. */
export async function checkBackground(ctx: DrainContext, journal: Journal, finals: Map<string, any>): Promise<Check> {
  const violations: string[] = [];
  const accepted = journal.of('background');
  await forEachLimit(accepted, 8, async (a) => {
    const first = finals.get(a.id);
    if (!first || !RESPONSE_TERMINAL.includes(first.status)) {
      return void violations.push(`background ${a.id} (${a.org}, cycle ${a.cycle}) is stuck: ${first?.status ?? 'never read'}`);
    }
    const again = await get(ctx, a.org, `/v1/responses/${a.id}`);
    if (again.status !== 200 || !sameJson(first, again.body)) {
      violations.push(`background ${a.id}: read twice, two different objects (${first.status} then ${again.body?.status ?? again.status})`);
    }
    if (journal.cancelledResponses.has(a.id) && first.status !== 'cancelled') {
      violations.push(`background ${a.id}: its cancel answered cancelled, but it ended ${first.status}`);
    }
    if (first.id !== a.id || first.background !== true) violations.push(`background ${a.id}: GET returned id ${first.id}, background ${first.background}`);
    if (first.metadata?.webhook_token !== undefined) violations.push(`background ${a.id}: the stored object carries the webhook token`);
  });
  return {
    name: 'background responses end exactly once',
    summary: `${accepted.length} accepted, all terminal and stable on re-read (${count(accepted.map((a) => finals.get(a.id)?.status ?? '?'))})`,
    violations,
  };
}

/** Every foreground response that got a 200 is stored as it was returned. */
export async function checkForeground(ctx: DrainContext, journal: Journal): Promise<Check> {
  const violations: string[] = [];
  const responses = journal.of('response');
  await forEachLimit(responses, 8, async (a) => {
    if (!['completed', 'incomplete'].includes(a.body.status)) violations.push(`response ${a.id}: a 200 with status ${a.body.status}`);
    const stored = await get(ctx, a.org, `/v1/responses/${a.id}`);
    if (stored.status !== 200) violations.push(`response ${a.id} (${a.org}, cycle ${a.cycle}): answered 200, then GET ${stored.status}`);
    else if (!sameJson(stored.body, a.body)) violations.push(`response ${a.id}: GET differs from the object the POST returned`);
  });
  for (const a of [...responses, ...journal.of('chat'), ...journal.of('message')]) {
    if (a.body?.metadata?.webhook_token !== undefined) violations.push(`${a.kind} ${a.id}: the reply carries the webhook token`);
  }
  return {
    name: 'foreground responses stored as returned',
    summary: `${responses.length} responses read back equal (${count(responses.map((a) => a.body.status))}); `
      + `${journal.of('chat').length} chat completions and ${journal.of('message').length} messages go to the ledger check`,
    violations,
  };
}

const parseLines = (text: string): any[] => text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));

/** Every line of every batch (each organization's listing, so also batches whose creation reply was lost) answered once. */
export async function checkBatches(ctx: DrainContext, journal: Journal, byOrg: Map<string, any[]>): Promise<{ check: Check; batches: AuditedBatch[] }> {
  const violations: string[] = [];
  const batches: AuditedBatch[] = [];
  let lines = 0;
  let answered = 0;
  for (const [org, listed] of byOrg) {
    for (const a of journal.of('batch', org)) {
      if (!listed.some((b) => b.id === a.id)) violations.push(`batch ${a.id} (${org}): accepted but missing from its organization's listing`);
    }
    await forEachLimit(listed, 4, async (b) => {
      const where = `batch ${b.id} (${org}, ${b.status})`;
      const audited: AuditedBatch = { id: b.id, org, status: b.status, okLines: new Set(), fileIds: [b.input_file_id] };
      batches.push(audited);
      if (!BATCH_TERMINAL.includes(b.status)) return void violations.push(`${where}: never ended`);
      if (b.status === 'failed') violations.push(`${where}: failed on valid input: ${JSON.stringify(b.errors)}`);
      if (journal.cancelledBatches.has(b.id) && b.status !== 'cancelled') violations.push(`${where}: its cancel was accepted, but it ended ${b.status}`);
      const input = await get(ctx, org, `/v1/files/${b.input_file_id}/content`);
      if (input.status !== 200) return void violations.push(`${where}: input file ${b.input_file_id} reads ${input.status}`);
      const customIds = parseLines(typeof input.body === 'string' ? input.body : JSON.stringify(input.body)).map((l) => l.custom_id as string);
      lines += customIds.length;
      const seen = new Map<string, number>();
      const read = async (fileId: string | null, ok: boolean): Promise<number> => {
        if (fileId === null) return 0;
        audited.fileIds.push(fileId);
        const res = await get(ctx, org, `/v1/files/${fileId}/content`);
        if (res.status !== 200) {
          violations.push(`${where}: result file ${fileId} reads ${res.status}`);
          return 0;
        }
        const results = parseLines(typeof res.body === 'string' ? res.body : JSON.stringify(res.body));
        for (const r of results) {
          seen.set(r.custom_id, (seen.get(r.custom_id) ?? 0) + 1);
          const lineNo = customIds.indexOf(r.custom_id) + 1;
          if (lineNo === 0) violations.push(`${where}: result for custom_id ${r.custom_id}, which its input does not have`);
          if (ok && lineNo > 0) audited.okLines.add(lineNo);
          if ((r.response?.status_code === 200) !== ok) violations.push(`${where}: ${r.custom_id} with status ${r.response?.status_code} in the ${ok ? 'output' : 'error'} file`);
        }
        return results.length;
      };
      const outputs = await read(b.output_file_id, true);
      const errors = await read(b.error_file_id, false);
      answered += outputs + errors;
      for (const [id, n] of seen) if (n > 1) violations.push(`${where}: custom_id ${id} answered ${n} times`);
      if (b.status === 'completed') {
        for (const id of customIds) if (!seen.has(id)) violations.push(`${where}: custom_id ${id} never answered`);
        if (b.request_counts.total !== customIds.length) violations.push(`${where}: request_counts.total ${b.request_counts.total}, input has ${customIds.length} lines`);
      }
      if (b.request_counts.completed !== outputs || b.request_counts.failed !== errors) {
        violations.push(`${where}: request_counts ${JSON.stringify(b.request_counts)}, files hold ${outputs} output and ${errors} error lines`);
      }
    });
  }
  const all = [...byOrg.values()].flat();
  return {
    check: {
      name: 'batch lines answered exactly once',
      summary: `${all.length} batches (${count(all.map((b) => b.status))}; ${journal.of('batch').length} whose creation we saw), `
        + `${lines} lines, ${answered} answered, none twice; request_counts match the files`,
      violations,
    },
    batches,
  };
}

/** What a completion webhook should have carried for an accepted object, or undefined when none is due. */
function expectedCallback(a: Accepted, finals: Map<string, any>): any {
  if (a.hookToken === undefined) return undefined;
  if (a.kind === 'background') {
    const final = finals.get(a.id);
    return final && ['completed', 'incomplete', 'failed'].includes(final.status) ? final : undefined;
  }
  return a.kind === 'response' || a.kind === 'chat' ? a.body : undefined;
}

/** Every due callback received (answered 200) at least once, at its own organization's hook, with its token. */
export function checkDeliveries(journal: Journal, receiver: Receiver, finals: Map<string, any>): { check: Check; expectedIds: string[] } {
  const violations: string[] = [];
  const expectedIds: string[] = [];
  let silent = 0;
  for (const a of journal.accepted) {
    const expected = expectedCallback(a, finals);
    const calls = receiver.byId.get(a.id) ?? [];
    if (expected === undefined) {
      if (a.hookToken !== undefined && calls.length > 0) violations.push(`${a.kind} ${a.id} ended ${finals.get(a.id)?.status}, yet its webhook was called ${calls.length} times`);
      if (a.hookToken !== undefined) silent++;
      continue;
    }
    expectedIds.push(a.id);
    if (!calls.some((c) => c.status === 200)) violations.push(`${a.kind} ${a.id} (${a.org}, cycle ${a.cycle}): webhook never delivered (${calls.length} calls)`);
    const auth = a.hookToken === null ? undefined : `Bearer ${a.hookToken}`;
    for (const c of calls) {
      if (c.authorization !== auth) violations.push(`${a.kind} ${a.id}: webhook came with Authorization ${c.authorization ?? '(none)'}, expected ${auth ?? '(none)'}`);
      if (!sameJson(c.body, expected)) violations.push(`${a.kind} ${a.id}: webhook body (${c.body?.status ?? c.body?.object}) is not the object the API returns`);
    }
  }
  const refusedCallbacks: string[] = [];
  let duplicates = 0;
  for (const calls of receiver.byId.values()) if (calls.filter((c) => c.status === 200).length > 1) duplicates++;
  for (const c of receiver.calls) {
    if (c.org === undefined) violations.push(`webhook call on a path no organization was given (body id ${c.id})`);
    const owner = c.id === undefined ? undefined : journal.byId.get(c.id);
    if (owner && c.org !== undefined && owner.org !== c.org) violations.push(`LEAK: ${owner.org}'s ${c.id} delivered to ${c.org}'s hook`);
    if (c.authorization !== undefined && c.org !== undefined && !c.authorization.startsWith(`Bearer tok-${c.org}-`)) {
      violations.push(`LEAK: ${c.org}'s hook called with another organization's token (${c.id})`);
    }
    const token = owner?.hookToken;
    if (c.body?.metadata?.webhook_token !== undefined || (token && JSON.stringify(c.body).includes(token))) {
      violations.push(`webhook body of ${c.id} carries a webhook token`);
    }
    if (['in_progress', 'queued', 'cancelled'].includes(c.body?.status)) violations.push(`webhook for ${c.id} sent with status ${c.body.status}`);
    if (c.body?.error?.code === 'rate_limit_exceeded' && c.id !== undefined && !refusedCallbacks.includes(c.id)) refusedCallbacks.push(c.id);
  }
  if (refusedCallbacks.length > 0) {
    violations.push(`${refusedCallbacks.length} callbacks (status failed, error.code rate_limit_exceeded) sent for requests the API answered 429, `
      + `ids the clients never got (e.g. ${refusedCallbacks[0]})`);
  }
  return {
    check: {
      name: 'every delivery made at least once',
      summary: `${expectedIds.length} due, all received with their token at their own hook (${receiver.calls.length} calls, `
        + `${receiver.refusedOnPurpose} refused on purpose and retried, ${duplicates} ids delivered more than once); ${silent} hooks rightly silent`,
      violations,
    },
    expectedIds,
  };
}

/** The 404 of an id that exists elsewhere must read as the 404 of an id that exists nowhere. */
function normalized404(body: any, id: string): string {
  return JSON.stringify(body?.error ?? body).split(id).join('<id>');
}

/** Nothing of one organization is visible to the other: by id, by listing, or by the shape of a 404. */
export async function checkIsolation(ctx: DrainContext, journal: Journal, batches: AuditedBatch[]): Promise<Check> {
  const violations: string[] = [];
  const orgs = [...ctx.keys.keys()];
  let probes = 0;
  for (const owner of orgs) {
    for (const other of orgs.filter((o) => o !== owner)) {
      const responses = [...journal.of('response', owner), ...journal.of('background', owner)].map((a) => a.id);
      const mineBatches = batches.filter((b) => b.org === owner);
      const files = new Set([...(journal.files.get(owner) ?? []), ...mineBatches.flatMap((b) => b.fileIds)]);
      const paths = [
        ...responses.map((id) => [id, `/v1/responses/${id}`, 'GET'] as const),
        ...journal.of('background', owner).map((a) => [a.id, `/v1/responses/${a.id}/cancel`, 'POST'] as const),
        ...mineBatches.flatMap((b) => [[b.id, `/v1/batches/${b.id}`, 'GET'], [b.id, `/v1/batches/${b.id}/cancel`, 'POST']] as const),
        ...[...files].flatMap((id) => [[id, `/v1/files/${id}`, 'GET'], [id, `/v1/files/${id}/content`, 'GET']] as const),
      ];
      // The same paths with ids that exist nowhere: what a foreign id's 404 must look like.
      const reference = new Map<string, string>();
      for (const [id, path, method] of paths) {
        const shape = `${method} ${path.replace(id, ':id')}`;
        if (reference.has(shape)) continue;
        const fake = `${id.slice(0, -6)}000000`;
        const res = await get(ctx, other, path.replace(id, fake), method);
        reference.set(shape, `${res.status} ${normalized404(res.body, fake)}`);
      }
      await forEachLimit(paths, 8, async ([id, path, method]) => {
        probes++;
        const res = await get(ctx, other, path, method);
        const seen = `${res.status} ${normalized404(res.body, id)}`;
        if (res.status !== 404) violations.push(`LEAK: ${other} ${method} ${path} (${owner}'s) -> HTTP ${res.status}`);
        else if (seen !== reference.get(`${method} ${path.replace(id, ':id')}`)) violations.push(`LEAK: ${other} ${method} ${path}: its 404 differs from an unknown id's`);
      });
      const listed = await get(ctx, other, '/v1/files?limit=10000');
      const listedIds = new Set<string>((listed.body?.data ?? []).map((f: any) => f.id));
      for (const id of files) if (listedIds.has(id)) violations.push(`LEAK: ${owner}'s file ${id} in ${other}'s GET /v1/files`);
      // And the listing works at all: every file of its own is there.
      const own = new Set([...(journal.files.get(other) ?? []), ...batches.filter((b) => b.org === other).flatMap((b) => b.fileIds)]);
      for (const id of own) if (!listedIds.has(id)) violations.push(`${other}'s own file ${id} missing from its GET /v1/files`);
      const otherBatchIds = new Set(batches.filter((b) => b.org === other).map((b) => b.id));
      for (const b of mineBatches) if (otherBatchIds.has(b.id)) violations.push(`LEAK: ${owner}'s batch ${b.id} in ${other}'s GET /v1/batches`);
    }
  }
  return {
    name: 'nothing of one organization visible to the other',
    summary: `${probes} cross-organization reads and cancels all 404, shaped as an unknown id's; file and batch listings clean`,
    violations,
  };
}
