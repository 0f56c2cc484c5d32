// What the chaos clients saw: every request the server accepted (a whole 2xx reply), how many were
// cut off by a kill, and violations noticed while the traffic ran. The audit works from this.

export const MODEL = 'tiny';

/** What a request was; batches count once each (their lines are audited from the files). */
export type Kind = 'response' | 'chat' | 'message' | 'background' | 'batch';
export const KINDS: readonly Kind[] = ['response', 'chat', 'message', 'background', 'batch'];

export interface Accepted {
  kind: Kind;
  org: string;
  id: string;
  cycle: number;
  /** The reply's object (a background response: the in_progress object it was created with). */
  body: any;
  /** A completion webhook was asked for, with this token (null: a hook without a token). */
  hookToken?: string | null;
  /** Messages: the Idempotency-Key and the request body sent with it. */
  idem?: { key: string; body: unknown };
}

/** An idempotent message whose reply never came: sent again with the same key after the restart. */
export interface IdempotentRequest {
  org: string;
  key: string;
  body: unknown;
}

export class Journal {
  readonly accepted: Accepted[] = [];
  readonly byId = new Map<string, Accepted>();
  /** `${org}:${what}` -> requests whose connection died with the server: not accepted, not audited */
  readonly cutOff = new Map<string, number>();
  /** `${org}:${what}` -> requests refused with 429 by the organization's limits (documented; not accepted) */
  readonly refused = new Map<string, number>();
  /** The distinct 429 messages, for the report. */
  readonly refusalMessages = new Set<string>();
  /** org -> ids of the files it uploaded */
  readonly files = new Map<string, Set<string>>();
  /** Background responses whose cancel answered 200 `cancelled`: they must stay cancelled. */
  readonly cancelledResponses = new Set<string>();
  /** Batches whose cancel answered 200: they must end cancelled. */
  readonly cancelledBatches = new Set<string>();
  /** Idempotent messages cut off by a kill, waiting to be sent again. */
  readonly idempotentRetries: IdempotentRequest[] = [];
  /** `${org}\0${key}` -> the message id of its first 200 */
  readonly idempotentIds = new Map<string, string>();
  readonly counts = { retried: 0, retriedReplayed: 0, replays: 0, cancels: 0, batchCancels: 0, uploads: 0 };
  /** Problems seen while the traffic ran (wrong statuses, replays with another id, hangs). */
  readonly violations: string[] = [];

  accept(a: Accepted): void {
    if (this.byId.has(a.id)) return;
    this.accepted.push(a);
    this.byId.set(a.id, a);
  }

  of(kind: Kind, org?: string): Accepted[] {
    return this.accepted.filter((a) => a.kind === kind && (org === undefined || a.org === org));
  }

  /** `what`: a Kind, or `message+key` (idempotent), `upload`, `cancel`, ... */
  cut(org: string, what: string): void {
    const k = `${org}:${what}`;
    this.cutOff.set(k, (this.cutOff.get(k) ?? 0) + 1);
  }

  cutCount(org: string, what: string): number {
    return this.cutOff.get(`${org}:${what}`) ?? 0;
  }

  totalCut(): number {
    let n = 0;
    for (const v of this.cutOff.values()) n += v;
    return n;
  }

  refuse(org: string, what: string, message: string): void {
    const k = `${org}:${what}`;
    this.refused.set(k, (this.refused.get(k) ?? 0) + 1);
    this.refusalMessages.add(message.replace(/\d+/g, 'N'));
  }

  addFile(org: string, id: string): void {
    const set = this.files.get(org) ?? new Set<string>();
    set.add(id);
    this.files.set(org, set);
  }

  /** A 200 for an idempotency key: the same key of the same organization must always give one id. */
  idempotentResult(org: string, key: string, id: string, how: string): void {
    const k = `${org}\0${key}`;
    const first = this.idempotentIds.get(k);
    if (first === undefined) this.idempotentIds.set(k, id);
    else if (first !== id) this.violations.push(`idempotency: ${org} key ${key} answered ${first} first and ${id} on ${how}`);
  }
}
