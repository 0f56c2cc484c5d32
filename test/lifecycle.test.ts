// The request lifecycle (src/serving/lifecycle.ts) on its own: what each outcome writes in the one
// end transaction, when the webhook dispatcher is woken, and that admission refuses before anything
// is written. The service, store and ledger are stand-ins that record what they were asked; the
// same paths run end to end in the API tests (org-limits, request-end-atomic, webhooks, batches).

import { describe, expect, it } from 'vitest';
import { SluiceError } from '../src/errors.js';
import type { GenerateResult } from '../src/engine/request.js';
import type { PreparedGeneration } from '../src/serving/generation-request.js';
import type { GenerationService } from '../src/serving/generation-service.js';
import { RequestLifecycle, choicesOf, type EndObject, type RunSpec } from '../src/serving/lifecycle.js';
import { TenantLimiter, RateLimitError } from '../src/serving/tenant-limits.js';
import type { RequestEnd, RequestEndCommit, Store, UsageRecord, WebhookDelivery } from '../src/store/store.js';

const caller = { orgId: 'org_1', orgName: 'one', keyId: 'key_1' };

const prepared = (seed?: bigint): PreparedGeneration => ({
  request: {
    caller, model: 'm', input: { kind: 'prompt', text: 'hi' }, sampling: seed === undefined ? {} : { seed },
    maxOutputTokensParam: 'max_output_tokens', background: false, metadata: { webhook_url: 'https://example.com/hook' },
  },
  model: {} as PreparedGeneration['model'],
  window: 'standard', promptTokenIds: [1, 2, 3], maxTokens: 4, assistant: {} as PreparedGeneration['assistant'],
});

const result = (text: string): GenerateResult => ({
  text, tokenIds: [7], finishReason: 'stop',
  usage: { promptTokens: 3, completionTokens: 1, cachedTokens: 0 },
} as unknown as GenerateResult);

interface World {
  lifecycle: RequestLifecycle;
  ends: RequestEnd[];
  events: string[];
  limits: TenantLimiter;
}

/** `run`: what the service's runChoices does; `commit`: what the store's commitRequestEnd does. */
function world(opts: { run?: (signal: AbortSignal) => Promise<GenerateResult[]>; commit?: (end: RequestEnd) => RequestEndCommit } = {}): World {
  const ends: RequestEnd[] = [];
  const events: string[] = [];
  const limits = new TenantLimiter(undefined, { maxInflightRequests: 1, maxQueuedBackground: 1 });
  const service = {
    limits,
    registry: { resolve: () => ({ id: 'm' }) },
    admitForeground: (c: typeof caller, n = 1) => {
      limits.checkChoices(c, n);
      limits.checkTokens(c);
      return limits.tryAcquire(c, n);
    },
    runChoices: (_choices: PreparedGeneration[], signal: AbortSignal) => (opts.run ?? (async () => [result('ok')]))(signal),
  } as unknown as GenerationService;
  const store = {
    commitRequestEnd: async (end: RequestEnd) => {
      events.push('commit');
      const committed = opts.commit ? opts.commit(end) : { batchResultRecorded: false };
      ends.push(end);
      return committed;
    },
  } as unknown as Store;
  const billing = {
    usageRecord: (req: { requestId: string; results: readonly GenerateResult[] }) =>
      ({ id: `usage_${req.requestId}`, requestId: req.requestId, outputTokens: req.results.length } as unknown as UsageRecord),
  };
  const webhooks = {
    deliveryFor: (_org: string, _metadata: unknown, body: EndObject) => ({ id: `whd_${body.id}` } as unknown as WebhookDelivery),
    wake: () => events.push('wake'),
  };
  return { lifecycle: new RequestLifecycle({ service, store, billing, webhooks }), ends, events, limits };
}

function spec(overrides: Partial<RunSpec<EndObject>> = {}): RunSpec<EndObject> {
  return {
    prepared: prepared(), mode: 'foreground', signal: new AbortController().signal, callback: true,
    billed: { surface: 'responses', requestId: 'resp_1' },
    rendering: {
      render: (results) => ({ id: 'resp_1', status: 'completed', text: results.map((r) => r.text).join('|') }),
      failed: (err, stage) => ({ id: 'resp_1', status: 'failed', stage, message: (err as Error).message }),
    },
    end: (object) => ({ response: { orgId: caller.orgId, body: object as never, kind: 'foreground' } }),
    ...overrides,
  };
}

describe('the request lifecycle', () => {
  it('a finished run ends once: the surface\'s part, its ledger row and its delivery in one commit, then a wake', async () => {
    const w = world();
    const ended = await w.lifecycle.run(spec());
    expect(ended.object).toEqual({ id: 'resp_1', status: 'completed', text: 'ok' });
    expect(w.ends).toHaveLength(1);
    expect(w.ends[0]!.response?.body).toEqual(ended.object);
    expect(w.ends[0]!.usage).toMatchObject({ id: 'usage_resp_1', requestId: 'resp_1' });
    expect(w.ends[0]!.delivery).toMatchObject({ id: 'whd_resp_1' });
    expect(w.events).toEqual(['commit', 'wake']);
  });

  it('a failed run ends with the failed object, unbilled, and rejects with the run\'s error', async () => {
    const w = world({ run: async () => { throw new SluiceError('invalid_request', 'bad schema'); } });
    await expect(w.lifecycle.run(spec())).rejects.toThrow('bad schema');
    expect(w.ends).toHaveLength(1);
    expect(w.ends[0]!.response?.body).toMatchObject({ status: 'failed', stage: 'run', message: 'bad schema' });
    expect(w.ends[0]!.usage).toBeUndefined();
    expect(w.ends[0]!.delivery).toMatchObject({ id: 'whd_resp_1' });
  });

  it('a failure whose surface has no failed object writes nothing', async () => {
    const w = world({ run: async () => { throw new Error('gone'); } });
    await expect(w.lifecycle.run(spec({ rendering: { render: () => ({ id: 'x' }), failed: () => undefined } }))).rejects.toThrow('gone');
    expect(w.ends).toEqual([]);
    expect(w.events).toEqual([]);
  });

  it('a finished run whose end cannot be stored is tried again as failed (stage end, unbilled), and rejects with the store\'s error', async () => {
    let calls = 0;
    const w = world({
      commit: () => {
        calls += 1;
        if (calls === 1) throw new Error('disk full');
        return { batchResultRecorded: false };
      },
    });
    const told: string[] = [];
    await expect(w.lifecycle.run(spec({ onEndFailed: (_err, which) => told.push(which) }))).rejects.toThrow('disk full');
    expect(told).toEqual(['finished']);
    expect(w.ends).toHaveLength(1); // the first commit threw before it was recorded
    expect(w.ends[0]!.response?.body).toMatchObject({ status: 'failed', stage: 'end', message: 'disk full' });
    expect(w.ends[0]!.usage).toBeUndefined();
  });

  it('a fenced end refused for a lost lease wakes nobody', async () => {
    const w = world({ commit: () => ({ batchResultRecorded: false, backgroundLeaseLost: true }) });
    const ended = await w.lifecycle.run(spec());
    expect(ended.committed.backgroundLeaseLost).toBe(true);
    expect(w.events).toEqual(['commit']);
  });

  it('an end with nothing to write and no callback does not touch the store', async () => {
    const w = world();
    expect(await w.lifecycle.end({})).toEqual({ batchResultRecorded: false });
    expect(w.events).toEqual([]);
  });

  it('admission refuses (429) before anything is written: foreground over its in-flight limit, background over its queue', async () => {
    const w = world();
    const release = w.lifecycle.admit(caller, { mode: 'foreground' });
    expect(() => w.lifecycle.admit(caller, { mode: 'foreground' })).toThrow(RateLimitError);
    release();
    w.lifecycle.admit(caller, { mode: 'foreground' })();
    expect(() => w.lifecycle.admit(caller, { mode: 'background', queuedBackground: 1 })).toThrow(RateLimitError);
    expect(w.ends).toEqual([]);
  });

  it('generate renders every choice and bills them together, writing nothing', async () => {
    const w = world({ run: async () => [result('a'), result('b')] });
    const generated = await w.lifecycle.generate({ ...spec(), n: 2 }, (results) => results.map((r) => r.text).join(','));
    expect(generated.object).toBe('a,b');
    expect(generated.usage).toMatchObject({ outputTokens: 2 });
    expect(w.ends).toEqual([]);
  });

  it('choices of a seeded request sample with seed + i (mod 2^64); unseeded ones share nothing to offset', () => {
    const seeds = choicesOf(prepared(2n ** 64n - 1n), 3).map((p) => p.request.sampling.seed);
    expect(seeds).toEqual([2n ** 64n - 1n, 0n, 1n]);
    expect(choicesOf(prepared(), 2).map((p) => p.request.sampling.seed)).toEqual([undefined, undefined]);
  });
});
