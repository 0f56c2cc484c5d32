// The one way a request goes through sluice, whichever surface it came from (Responses, Chat
// Completions, Messages) and wherever it runs (an HTTP route, a background job, a batch line):
//
//   prepare -> admit -> run -> usage -> the end transaction -> the completion callback
//
// prepare() resolves the model once and does every check that must fail before the model is called;
// admit() applies the organization's limits, a 429 before anything of the request is stored; run()
// generates (n choices together), renders the surface's object and builds its ledger row; end()
// writes the request's end in one transaction (store.commitRequestEnd: the terminal object and
// everything it implies) and wakes the webhook dispatcher when that transaction added a delivery.
// A failed run ends with the surface's failed object, when it has one, through the same end().
//
// Contract of end(): nothing of the end is visible before the commit, all of it is after, and the
// dispatcher is woken only after the commit (so it never looks before the delivery exists).

import type { GenerateResult } from '../engine/request.js';
import type { RequestEnd, RequestEndCommit, ResponseBody, Store, UsageRecord, WebhookDelivery } from '../store/store.js';
import type { Caller, GenerationRequest, PreparedGeneration } from './generation-request.js';
import type { GenerationService, RunMode } from './generation-service.js';
import type { ServedModel } from './model-registry.js';
import type { Release } from './tenant-limits.js';

/** An object a request ends with: a Response, a chat.completion, a message, a batch result line... */
export type EndObject = Record<string, unknown> & { id: string };

/** How a surface renders one request's outcome (surfaces/surface.ts makes one per request). */
export interface Rendering<Out> {
  /** The object a finished generation returns (one result per choice, in choice order). */
  render(results: GenerateResult[]): Out;
  /**
   * The object a failed request ends with (stored and called back), or undefined when the failure
   * leaves nothing to write (a chat completion whose client went away, a stopped batch line).
   * `stage`: the run failed, or the end of a finished run could not be stored.
   */
  failed(err: unknown, stage: 'run' | 'end'): Out | undefined;
}

/** The ledger's names of the surfaces (a batch line is billed as `batch`, whatever its url). */
export type UsageSurface = 'responses' | 'chat.completions' | 'messages' | 'batch';

/** What the ledger calls the request: the surface it came through and its id. */
export interface Billed {
  surface: UsageSurface;
  requestId: string;
}

export interface Generated<Out> {
  object: Out;
  results: GenerateResult[];
  /** Its ledger row (absent without a ledger). */
  usage?: UsageRecord;
}

/** One request's run, from its prepared generation to its end. */
export interface RunSpec<Out extends EndObject> {
  prepared: PreparedGeneration;
  /** Choices to run on the one prompt (default 1; Chat Completions' n). */
  n?: number;
  mode: RunMode;
  signal: AbortSignal;
  /** A foreground slot from admit(); without one, a foreground run admits itself. */
  admitted?: Release;
  rendering: Rendering<Out>;
  billed: Billed;
  /**
   * The surface's part of the end transaction for the object the request ended with: its stored
   * Response, its idempotency result... (the ledger row and the delivery are added here).
   */
  end(object: Out): RequestEnd;
  /** Whether the ended object is the completion callback's body (the request's metadata names the webhook). */
  callback: boolean;
  /**
   * Told when an end could not be written: `finished` (the run's own end; its failed object is
   * tried next and the store's error rejects the call) or `failed` (the failed object's end; the
   * run's error rejects the call).
   */
  onEndFailed?(err: unknown, which: 'finished' | 'failed'): void;
}

export interface Ended<Out> extends Generated<Out> {
  committed: RequestEndCommit;
}

/** A completion callback an end may owe: `metadata` is the request's (it holds the token). */
export interface CallbackOf {
  orgId: string;
  metadata: unknown;
  /** The object the receiver gets (the terminal Response, the chat.completion...). */
  body: EndObject;
}

/** The usage ledger (billing/ledger.ts): the row of a request that ended with a result. */
export interface UsageLedger {
  usageRecord(req: Billed & { prepared: PreparedGeneration; results: readonly GenerateResult[] }): UsageRecord;
}

/** Completion webhooks (webhooks/dispatcher.ts): the delivery an end owes, and a wake-up once it is stored. */
export interface CallbackDeliveries {
  deliveryFor(orgId: string, metadata: unknown, body: EndObject): WebhookDelivery | undefined;
  wake(): void;
}

export interface LifecycleDeps {
  service: GenerationService;
  store: Store;
  /** The usage ledger: a request that ends with a result is billed in the write that stores it. */
  billing?: UsageLedger;
  /** Completion webhooks: a terminal object's delivery is stored with it (absent: none are sent). */
  webhooks?: CallbackDeliveries;
}

export class RequestLifecycle {
  constructor(private readonly deps: LifecycleDeps) {}

  get service(): GenerationService {
    return this.deps.service;
  }

  /** The served model `name` is for this caller (model_not_found when it may not see it). */
  model(name: string, caller: Caller): ServedModel {
    return this.deps.service.registry.resolve(name, caller.orgName);
  }

  /** Every check before the model is called, then the prompt's tokens: see GenerationService.prepare. */
  prepare(request: GenerationRequest, model?: ServedModel): Promise<PreparedGeneration> {
    return this.deps.service.prepare(request, model);
  }

  /**
   * The organization's limits, before anything of the request is stored (a 429 otherwise). A
   * foreground request takes `n` in-flight slots until it is released; a background one is
   * refused while its tokens per minute are spent or `queuedBackground` of its responses wait.
   */
  admit(caller: Caller, admission: { mode: 'foreground'; n?: number } | { mode: 'background'; queuedBackground: number }): Release {
    const { limits } = this.deps.service;
    if (admission.mode === 'foreground') return this.deps.service.admitForeground(caller, admission.n ?? 1);
    limits.checkTokens(caller);
    limits.checkQueuedBackground(caller, admission.queuedBackground);
    return () => {};
  }

  /**
   * Runs the generation (its choices together) and renders it; a failure rejects with the error
   * (the caller decides what the failure ends with). No end is written here: batch lines write
   * theirs under the chunk's lease (end()), routes and background jobs through run().
   */
  async generate<Out>(spec: Pick<RunSpec<EndObject>, 'prepared' | 'n' | 'mode' | 'signal' | 'admitted' | 'billed'>,
    render: (results: GenerateResult[]) => Out): Promise<Generated<Out>> {
    const { service, billing } = this.deps;
    const n = spec.n ?? 1;
    const choices = n === 1 ? [spec.prepared] : choicesOf(spec.prepared, n);
    const results = await service.runChoices(choices, spec.signal, spec.mode, spec.admitted);
    const object = render(results);
    const usage = billing?.usageRecord({ ...spec.billed, prepared: spec.prepared, results });
    return { object, results, ...(usage && { usage }) };
  }

  /**
   * run -> usage -> end -> callback. A failed run ends with the surface's failed object (when it has
   * one; a store error there is only told to onEndFailed) and rejects with the run's error; a finished run whose end cannot be written is tried
   * again as failed (unbilled), so that what is stored and called back agrees with the client's
   * 500, and rejects with the store's error.
   */
  async run<Out extends EndObject>(spec: RunSpec<Out>): Promise<Ended<Out>> {
    const callbackOf = (body: Out): CallbackOf | undefined => spec.callback
      ? { orgId: spec.prepared.request.caller.orgId, metadata: spec.prepared.request.metadata, body }
      : undefined;
    let generated: Generated<Out>;
    try {
      generated = await this.generate(spec, (results) => spec.rendering.render(results));
    } catch (err) {
      const failed = spec.rendering.failed(err, 'run');
      if (failed !== undefined) {
        await this.end(spec.end(failed), callbackOf(failed)).catch((stored: unknown) => spec.onEndFailed?.(stored, 'failed'));
      }
      throw err;
    }
    try {
      const committed = await this.end({ ...spec.end(generated.object), ...(generated.usage && { usage: generated.usage }) },
        callbackOf(generated.object));
      return { ...generated, committed };
    } catch (err) {
      spec.onEndFailed?.(err, 'finished');
      const failed = spec.rendering.failed(err, 'end');
      if (failed !== undefined) {
        await this.end(spec.end(failed), callbackOf(failed)).catch((again: unknown) => spec.onEndFailed?.(again, 'failed'));
      }
      throw err;
    }
  }

  /** The request's end, in one transaction (see the top of this file), and its completion callback. */
  async end(end: RequestEnd, callback?: CallbackOf): Promise<RequestEndCommit> {
    const { webhooks, store } = this.deps;
    const delivery = callback && webhooks?.deliveryFor(callback.orgId, callback.metadata, callback.body);
    if (!delivery && Object.keys(end).length === 0) return { batchResultRecorded: false }; // nothing to write
    const committed = await store.commitRequestEnd(delivery ? { ...end, delivery } : end);
    if (delivery && !committed.backgroundLeaseLost) webhooks?.wake();
    return committed;
  }

  /**
   * The end of a background response cancelled away from the process running it (store
   * cancelBackgroundResponse: the cancelled object, the job's removal and its callback in one
   * transaction). False when nothing was written (the job is gone or the response ended).
   */
  async endCancelled(orgId: string, cancelled: ResponseBody, metadata: unknown): Promise<boolean> {
    const { webhooks, store } = this.deps;
    const delivery = webhooks?.deliveryFor(orgId, metadata, cancelled);
    if (!(await store.cancelBackgroundResponse(orgId, cancelled, delivery))) return false;
    if (delivery) webhooks?.wake();
    return true;
  }
}

/**
 * One prepared generation per choice. With a seed, choice i samples with seed + i (mod 2^64), so
 * the whole response repeats; without one, each choice draws its own random seed.
 */
export function choicesOf(prepared: PreparedGeneration, n: number): PreparedGeneration[] {
  const seed = prepared.request.sampling.seed;
  if (n === 1 || seed === undefined) return Array.from({ length: n }, () => prepared);
  return Array.from({ length: n }, (_, i) => ({
    ...prepared,
    request: { ...prepared.request, sampling: { ...prepared.request.sampling, seed: BigInt.asUintN(64, BigInt(seed) + BigInt(i)) } },
  }));
}
