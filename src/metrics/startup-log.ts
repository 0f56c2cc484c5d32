// What a starting service logs about itself, once: per engine its backend, device, threads, KV pool
// and batch limits (what an operator checks first when throughput or memory look wrong), then the
// limits every request meets. Structured fields for log search, a readable message for people.

import type { ModelRegistry } from '../serving/model-registry.js';
import type { OrgLimits } from '../serving/tenant-limits.js';

export interface StartupLogSink {
  info(obj: object, msg: string): void;
}

const MiB = 1024 * 1024;

/**
 * The transport limits as this log reads them: api/transport.ts's TransportLimits fits, and is
 * logged whole. Declared here so that metrics/ does not import api/, which imports metrics/.
 */
export interface TransportLimitsSummary {
  bodyTimeoutSeconds: number;
  minBodyBytesPerSecond: number;
  maxConnections: number;
}

export function logServiceStart(log: StartupLogSink, registry: Pick<ModelRegistry, 'models'>,
  limits: { org: OrgLimits; numOrgOverrides: number; transport: TransportLimitsSummary }): void {
  const engines = new Map<unknown, string[]>();
  for (const m of registry.models) engines.set(m.engine, [...(engines.get(m.engine) ?? []), m.id]);
  for (const served of registry.models) {
    const ids = engines.get(served.engine);
    if (ids === undefined) continue;
    engines.delete(served.engine);
    const info = served.engine.info;
    const fields = {
      models: ids, model_dir: info.modelDir, architecture: info.architecture, weight_dtype: info.weightDtype,
      backend: info.backend,
      // The CPU kernel level picked at run time, or the CUDA device.
      device: info.simd,
      threads: info.numThreads, matmul_precision: info.matmulPrecision,
      weight_bytes: info.weightBytes, device_bytes: info.deviceBytes,
      kv_cache_bytes: info.kvCacheBytes, kv_cache_dtype: info.kvCacheDtype, kv_blocks: info.numBlocks, block_size: info.blockSize,
      max_sequence_tokens: info.maxSequenceTokens, context_length: info.contextLength,
      max_num_seqs: info.maxNumSeqs, max_batched_tokens: info.maxBatchedTokens,
      prefix_caching: info.prefixCaching ?? true,
    };
    log.info(fields, `engine for ${ids.join(', ')}: ${info.backend} backend on ${info.simd}, threads ${info.numThreads}, `
      + `KV pool ${(info.kvCacheBytes / MiB).toFixed(0)} MiB (${info.numBlocks} blocks of ${info.blockSize} tokens, `
      + `${info.maxSequenceTokens} tokens a sequence at most), up to ${info.maxNumSeqs} sequences and `
      + `${info.maxBatchedTokens} tokens a step`);
  }
  const { org, numOrgOverrides, transport } = limits;
  const unlimited = (n: number) => (n === 0 ? 'no limit' : String(n));
  log.info({ org_limits: org, org_limit_overrides: numOrgOverrides, transport_limits: transport },
    `limits per organization: foreground requests at once ${unlimited(org.maxInflightRequests)}, `
    + `background responses in progress ${unlimited(org.maxQueuedBackground)}, tokens a minute ${unlimited(org.tokensPerMinute)}`
    + `${numOrgOverrides > 0 ? ` (${numOrgOverrides} organizations with their own)` : ''}; `
    + `request bodies ${transport.bodyTimeoutSeconds === 0 ? 'without a timeout' : `within ${transport.bodyTimeoutSeconds} s`} `
    + `${transport.minBodyBytesPerSecond === 0 ? 'at any rate' : `at ${transport.minBodyBytesPerSecond} bytes/s or more`}, `
    + `connections ${unlimited(transport.maxConnections)}`);
}
