// The server process of the throughput bench (bench/throughput.ts, forked with --serve-child): the
// service on one engine, the prompts built with the model's own tokenizer and chat template, and the
// engine-only phase run on the service's engine object (nothing of it is on the HTTP surface).

import type { WorkloadRequest } from './sharegpt-workload.js';
import { mulberry32 } from './sharegpt-workload.js';

/** One request's outcome, in any phase. Times in ms; undefined where the phase cannot see them. */
export interface RequestRecord {
  ok: boolean;
  inputTokens: number;
  outputTokens: number;
  ttftMs?: number;
  decodeMs?: number;
  e2eMs?: number;
  error?: string;
}

export type ChatBody = {
  model: string;
  messages: { role: 'user'; content: string }[];
  max_tokens: number;
  temperature: number;
  seed: number;
};

export type ChildRequest =
  | { cmd: 'prepare'; workload: WorkloadRequest[]; salt: number }
  | { cmd: 'engine-run' }
  | { cmd: 'quit' };
export type ChildReply =
  | { type: 'ready'; address: string; key: string; backend: string; device: string; contextLength: number;
    maxNumSeqs: number; maxBatchedTokens: number; kvCacheBytes: number; threads: number;
    weightDtype: string; kvCacheDtype: string; numBlocks: number; blockSize: number }
  | { type: 'prepared'; bodies: ChatBody[]; checked: { exact: number; off: number } }
  | { type: 'engine-run'; records: RequestRecord[]; wallMs: number }
  | { type: 'error'; message: string };

type Args = Record<string, string | boolean | undefined>;

export async function childMain(args: Args): Promise<void> {
  const send = (msg: ChildReply) => process.send!(msg);
  const { openService, DEFAULT_ORGANIZATION } = await import('../src/service.js');
  const { singleModelCatalog } = await import('../src/config/catalog.js');
  const { createApiKey } = await import('../src/store/api-keys.js');
  const { GenerationService } = await import('../src/serving/generation-service.js');
  const { toChatGenerationRequest } = await import('../src/surfaces/chat/adapter.js');
  type Body = Parameters<typeof toChatGenerationRequest>[0];
  const num = (k: string) => (typeof args[k] === 'string' ? Number(args[k]) : undefined);
  const requests = num('requests') ?? 1000;

  const backend = args.backend === 'cuda' ? 'cuda' : 'cpu';
  const service = await openService({
    catalog: singleModelCatalog(args.model as string, args['model-id'] as string),
    dataDir: args['data-dir'] as string,
    engineDefaults: {
      backend,
      ...(num('threads') !== undefined && { threads: num('threads')! }),
      ...(num('max-num-seqs') !== undefined && { maxNumSeqs: num('max-num-seqs')! }),
      ...(num('max-batched-tokens') !== undefined && { maxBatchedTokens: num('max-batched-tokens')! }),
      ...(num('kv-cache-mib') !== undefined && { kvCacheBytes: num('kv-cache-mib')! * 2 ** 20 }),
      ...(num('gpu-memory-utilization') !== undefined && { gpuMemoryUtilization: num('gpu-memory-utilization')! }),
      // Issue 33's FP8 options (validated by the parent); absent = the engine's defaults.
      ...(args.quantization === 'fp8' && { quantization: 'fp8' as const }),
      ...(args['kv-cache-dtype'] === 'fp8' && { kvCacheDtype: 'fp8' as const }),
    },
    logger: { level: 'warn' },
    onProgress: (m) => process.stderr.write(`${m}\n`),
    // Every request may be in flight at once: one connection and one in-flight slot each.
    transport: { maxConnections: requests + 64 },
    orgLimits: { maxInflightRequests: requests + 64 },
  });
  const address = await service.app.listen({ host: '127.0.0.1', port: 0 });
  const created = service.firstKey ?? (await createApiKey(service.store, DEFAULT_ORGANIZATION));
  const served = service.registry.models[0]!;
  const engine = served.engine;
  const generation = new GenerationService(service.registry);
  const caller = { orgId: created.info.orgId, orgName: created.info.orgName, keyId: created.info.id };

  // Words that are one token each, with their leading space: joined, they tokenize word by word
  // (the pre-tokenizer splits at spaces), so a prompt of k of them is k tokens plus the template's.
  const tokenizer = engine.tokenizer;
  const words: string[] = [];
  for (const [, id] of tokenizer.vocab()) {
    const text = tokenizer.tokenText(id);
    if (!tokenizer.isSpecial(id) && /^ [a-z]{3,12}$/.test(text)) words.push(text);
  }
  words.sort();
  if (words.length < 16) throw new Error(`the tokenizer has only ${words.length} single-token words; cannot build prompts`);

  const bodyOf = (content: string, w: WorkloadRequest): ChatBody => ({
    model: served.id, messages: [{ role: 'user', content }], max_tokens: w.outputTokens, temperature: 1, seed: w.index,
  });
  const promptLength = async (body: ChatBody) =>
    (await generation.prepare(toChatGenerationRequest(body as unknown as Body, caller, served.supportsChat).request)).promptTokenIds.length;
  const overhead = (await promptLength(bodyOf(words.slice(0, 8).join(''), { index: 0, inputTokens: 8, outputTokens: 1 }))) - 8;

  let lastBodies: ChatBody[] = [];
  async function prepare(workload: WorkloadRequest[], salt: number) {
    const random = mulberry32(0x9e3779b9 ^ salt);
    let exact = 0, off = 0;
    const bodies: ChatBody[] = [];
    for (const w of workload) {
      const picked = Array.from({ length: Math.max(1, w.inputTokens - overhead) }, () => words[Math.floor(random() * words.length)]!);
      let body = bodyOf(picked.join(''), w);
      // Words that merge with what surrounds them (rare): trim or pad until the prompt fits.
      let diff = (await promptLength(body)) - w.inputTokens;
      for (let attempt = 0; attempt < 3 && diff !== 0 && !(diff > 0 && picked.length === 1); attempt++) {
        if (diff > 0) picked.splice(picked.length - Math.min(diff, picked.length - 1));
        else for (let k = 0; k < -diff; k++) picked.push(words[Math.floor(random() * words.length)]!);
        body = bodyOf(picked.join(''), w);
        diff = (await promptLength(body)) - w.inputTokens;
      }
      if (diff === 0) exact++;
      else off++;
      bodies.push(body);
    }
    lastBodies = bodies;
    return { bodies, checked: { exact, off } };
  }

  /** Every prepared request at once through Engine.generate, as GenerationService.run calls it. */
  async function engineRun() {
    const prepared = await Promise.all(lastBodies.map((b) =>
      generation.prepare(toChatGenerationRequest(b as unknown as Body, caller, served.supportsChat).request)));
    const t0 = performance.now();
    const records = await Promise.all(prepared.map(async (p, i): Promise<RequestRecord> => {
      const t = performance.now();
      try {
        const r = await engine.generate({
          promptTokenIds: p.promptTokenIds, maxTokens: p.maxTokens, completionWindow: p.window, tenant: caller.orgId,
          temperature: lastBodies[i]!.temperature, seed: lastBodies[i]!.seed,
        });
        return { ok: true, inputTokens: r.usage.promptTokens, outputTokens: r.usage.completionTokens,
          ttftMs: r.timings.queuedMs + r.timings.prefillMs, decodeMs: r.timings.decodeMs, e2eMs: performance.now() - t };
      } catch (err) {
        return { ok: false, inputTokens: p.promptTokenIds.length, outputTokens: 0, error: (err as Error).message };
      }
    }));
    return { records, wallMs: performance.now() - t0 };
  }

  process.on('message', (msg: ChildRequest) => {
    if (msg.cmd === 'quit') {
      service.close().then(() => process.exit(0), () => process.exit(1));
      return;
    }
    (async () => {
      if (msg.cmd === 'prepare') send({ type: 'prepared', ...await prepare(msg.workload, msg.salt) });
      else send({ type: 'engine-run', ...await engineRun() });
    })().catch((err: unknown) => send({ type: 'error', message: (err as Error).stack ?? String(err) }));
  });

  const info = engine.info;
  send({
    type: 'ready', address, key: created.key, backend: info.backend, device: info.backend === 'cuda' ? info.simd : `${info.simd} CPU`,
    contextLength: info.contextLength, maxNumSeqs: info.maxNumSeqs, maxBatchedTokens: info.maxBatchedTokens,
    kvCacheBytes: info.kvCacheBytes, threads: info.numThreads,
    weightDtype: info.weightDtype, kvCacheDtype: info.kvCacheDtype, numBlocks: info.numBlocks, blockSize: info.blockSize,
  });
}
