// `sluice serve`: the HTTP service on a model directory, a catalog file, or the tiny demo model.

import { createServer as createNetServer } from 'node:net';
import { resolve } from 'node:path';
import { pino } from 'pino';
import { SluiceError } from '../errors.js';
import { DEFAULT_TRANSPORT_LIMITS } from '../api/transport.js';
import { openService } from '../service.js';
import { MAX_MAX_ORGANIZATIONS } from '../metrics/service-metrics.js';
import { choiceFlag, commandFlags, intFlag, numberFlag, speculativeFlags } from './args.js';
import { servedCatalog } from './served-catalog.js';
import { DATABASE_URL_HELP, databaseUrlFlag } from './database-flag.js';
import { redactDatabaseUrl } from '../store/database-url.js';
import { DEFAULT_LEASE_TTL_MS, leaseConfig } from '../store/leases.js';

/** The longest --drain-seconds: a drain is the few seconds a load balancer needs to notice. */
export const MAX_DRAIN_SECONDS = 300;

export const SERVE_HELP = `usage: sluice serve [--model DIR | --config FILE] [options]

Serves the HTTP API (see README). Without --model or --config it serves the tiny demo model,
priced with example rates on all three completion windows (sluice models lists them).
On first start with no API keys it makes one and prints it.

  --model DIR          one model directory (its id is the directory name)
  --config FILE        a model catalog (JSON; see models/catalog.example.json)
  --host HOST          listen address (default 127.0.0.1)
  --port N             listen port (default 8080)
  --data-dir DIR       keys, responses, files (default ./data)
${DATABASE_URL_HELP}
  --files-dir DIR      uploaded files and batch results (default DATA_DIR/files): a volume every
                       replica sees when several share one --database-url
  --backend B          cpu | cuda | onnx | auto (default auto; onnx: the model's ONNX export on
                       onnxruntime's CPU provider, auto picks it when there are no safetensors)
  --threads N          CPU compute threads (default: all CPUs but one, left to HTTP)
  --gpu-memory-utilization F
                       CUDA: fraction of GPU memory to use (default 0.9)
  --cuda-gemm G        CUDA GEMMs of more than 8 tokens: auto (default: cuBLASLt where the host
                       has it, else our kernel) | native (our kernel) | cublaslt (cuBLASLt, required)
  --quantization Q     none (default) | int8: quantize the matmul weights of a bf16/f16/f32
                       checkpoint at load into 8-bit blocks (Q8_0); CPU backend only |
                       fp8: into e4m3 with per-row scales, for FP8 GEMMs; CUDA backend only
  --kv-cache-dtype D   auto (default: the activations' type) | fp8: K/V stored as e4m3 with
                       per-layer scales, twice the blocks of bf16 in the same memory
  --precision P        f32 (default) | bf16: how activations meet bf16 weights on a CPU with
                       AVX512-BF16; bf16 runs prefill about 1.5x faster at bf16 accuracy (README,
                       Matmul precision). A catalog sets it per model (engine.matmul_precision)
  --kv-cache-bytes N   KV cache pool size
  --max-num-seqs N     sequences running at once (default: CPU 64, CUDA 256)
  --max-batched-tokens N
                       tokens per engine step (default: CPU 512, CUDA 8192)
  --lora-memory-bytes N
                       budget for the LoRA adapters' weights per model (f32 bytes): beyond it,
                       idle adapters are retired least recently used first and loaded again on
                       demand (default: no budget). A catalog sets it per model
  --speculative M      speculative decoding: ngram (prompt lookup: drafts from the prompt and
                       the output so far) | draft:DIR (a draft model with the target's
                       tokenizer) | eagle3:DIR (an EAGLE-3 head for this model, in its
                       published layout); drafts are verified in the row's step: greedy output
                       is unchanged, sampled output keeps its distribution. CPU, or CUDA
                       with the block sampler (eagle3: CPU only).
                       A catalog sets it per model
  --num-speculative-tokens K
                       drafts a decode row verifies at most (1..16, default 4)
  --flex-deferral R[,H] | off
                       while asap or standard work runs (or did in the last H ms), flex gets at
                       most R tokens per step and none in steps that prefill urgent work
                       (default 8,1000; see README, Scheduling)
  --tenant-deferral R[,H] | off
                       while another organization has work in a window (or had in the last H
                       ms), an organization running more than its fair share of it gets at most
                       R tokens per step there and none in steps that prefill the other's
                       requests (default 16,1000; see README, Security)
  --org-max-inflight N foreground generation requests of one organization at once (n choices
                       count n); more get 429, an n above it 400 (default 256; 0: no limit).
                       Its batch lines run at most this many at once too, counted apart
  --org-max-queued-background N
                       background responses of one organization in progress at once; more
                       get 429 (default 10000; 0: no limit)
  --org-tokens-per-minute N
                       prompt + generated tokens per minute per organization; beyond, 429 with
                       Retry-After (default 0: no limit). The catalog's "limits" set them per
                       organization
  --deadline-asap S, --deadline-standard S, --deadline-flex S
                       seconds a background response may stay in_progress before it fails
                       with error.code timeout (defaults 600, 3600, 86400)
  --batch-deadline-asap S, --batch-deadline-standard S, --batch-deadline-flex S
                       seconds a batch may run before it expires, keeping what finished
                       (defaults 3600, 86400, 86400; 24h batches run as flex)
  --body-timeout S     seconds a request body may take to arrive (default ${DEFAULT_TRANSPORT_LIMITS.bodyTimeoutSeconds}:
                       a 500 MB upload at about 140 KB/s); slower bodies get 408. 0: no limit
  --min-body-rate B    bytes/s a body must average after its first ${DEFAULT_TRANSPORT_LIMITS.bodyRateGraceSeconds} s (default ${DEFAULT_TRANSPORT_LIMITS.minBodyBytesPerSecond});
                       a slower, dripping client gets 408 and is disconnected. 0: no minimum
  --max-connections N  open connections at once (default ${DEFAULT_TRANSPORT_LIMITS.maxConnections}); past it a new connection
                       displaces the one idle the longest, and while all are busy only /health
                       and /ready are answered, on ${DEFAULT_TRANSPORT_LIMITS.reservedConnections} reserved connections. 0: no cap
  --max-idle-connections-per-address N
                       idle connections one client address may hold; past it its longest idle one
                       is closed (default ${DEFAULT_TRANSPORT_LIMITS.maxIdleConnectionsPerAddress}; behind a load balancer that pools
                       connections, raise it above the pool's size). 0: no cap
  --allow-private-webhooks
                       let completion webhooks go to private, loopback and link-local addresses
  --allow-private-image-urls
                       let image URLs in requests reach private, loopback and link-local addresses
                       (refused by default: a caller could reach services inside your network)
  --metrics-public     serve GET /metrics without a key (for a scraper on a trusted network; the
                       metrics then name no organization). Default: an admin API key is needed
  --metrics-max-organizations N
                       organizations named in the metrics' organization label; later ones
                       count as "_other" (default 100, at most 10000)
  --log-stats-interval S
                       seconds between the engine lines logged while it is busy (throughput,
                       queues, KV use; default 10, at most 3600; 0: none)
  --log-level L        fatal | error | warn | info | debug (default info). The log is one JSON
                       stream (pino) on stderr; every line about a request has its request_id
  --drain-seconds S    on SIGTERM or SIGINT, first drain for S seconds: GET /ready answers 503
                       (so a load balancer or Kubernetes takes this replica out) while requests
                       are still served; then shut down as usual. A second signal ends the drain
                       at once (default 0: shut down at once; at most ${MAX_DRAIN_SECONDS})
  --lease-seconds S    how long this replica's claim on a background response, batch chunk or
                       webhook delivery holds without renewal (renewed every S/3): a replica that
                       dies loses its work to the others after at most S seconds (default ${DEFAULT_LEASE_TTL_MS / 1000}; 1 to 600)

One server per data directory: a second one on the same --data-dir is refused. Replicas on one
--database-url each keep their own --data-dir, with identical prefix-hash.key and
reasoning-keys.json (README, Several replicas on PostgreSQL).
`;

/** The flags serve accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const SERVE_OPTIONS = {
  model: { type: 'string' },
  config: { type: 'string' },
  host: { type: 'string' },
  port: { type: 'string' },
  'data-dir': { type: 'string' },
  'database-url': { type: 'string' },
  'files-dir': { type: 'string' },
  backend: { type: 'string' },
  threads: { type: 'string' },
  'gpu-memory-utilization': { type: 'string' },
  'cuda-gemm': { type: 'string' },
  quantization: { type: 'string' },
  'kv-cache-dtype': { type: 'string' },
  precision: { type: 'string' },
  'kv-cache-bytes': { type: 'string' },
  'max-num-seqs': { type: 'string' },
  'lora-memory-bytes': { type: 'string' },
  'max-batched-tokens': { type: 'string' },
  speculative: { type: 'string' },
  'num-speculative-tokens': { type: 'string' },
  'log-level': { type: 'string' },
  'metrics-public': { type: 'boolean' },
  'metrics-max-organizations': { type: 'string' },
  'log-stats-interval': { type: 'string' },
  'flex-deferral': { type: 'string' },
  'tenant-deferral': { type: 'string' },
  'org-max-inflight': { type: 'string' },
  'org-max-queued-background': { type: 'string' },
  'org-tokens-per-minute': { type: 'string' },
  'deadline-asap': { type: 'string' },
  'deadline-standard': { type: 'string' },
  'deadline-flex': { type: 'string' },
  'batch-deadline-asap': { type: 'string' },
  'batch-deadline-standard': { type: 'string' },
  'batch-deadline-flex': { type: 'string' },
  'body-timeout': { type: 'string' },
  'min-body-rate': { type: 'string' },
  'max-connections': { type: 'string' },
  'max-idle-connections-per-address': { type: 'string' },
  'allow-private-webhooks': { type: 'boolean' },
  'allow-private-image-urls': { type: 'boolean' },
  'drain-seconds': { type: 'string' },
  'lease-seconds': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runServe(args: string[]): Promise<void> {
  const values = commandFlags(args, SERVE_OPTIONS, 'serve', SERVE_HELP);
  if (values === undefined) return;
  if (values.model !== undefined && values.config !== undefined) {
    throw new SluiceError('invalid_argument', 'serve: give --model or --config, not both');
  }
  const databaseUrl = databaseUrlFlag(values['database-url']);
  if (values['files-dir'] !== undefined && values['files-dir'].trim() === '') {
    throw new SluiceError('invalid_argument', 'serve: --files-dir needs a directory', { param: 'files-dir' });
  }
  const host = values.host ?? '127.0.0.1';
  const port = intFlag(values.port, 'port', 0, 65535) ?? 8080;
  const logLevel = choiceFlag(values['log-level'], 'log-level', ['fatal', 'error', 'warn', 'info', 'debug'] as const) ?? 'info';
  const engineDefaults = {
    backend: choiceFlag(values.backend, 'backend', ['cpu', 'cuda', 'onnx', 'auto'] as const),
    threads: intFlag(values.threads, 'threads', 0),
    gpuMemoryUtilization: numberFlag(values['gpu-memory-utilization'], 'gpu-memory-utilization', Number.MIN_VALUE, 1),
    cudaGemm: choiceFlag(values['cuda-gemm'], 'cuda-gemm', ['native', 'cublaslt', 'auto'] as const),
    quantization: choiceFlag(values.quantization, 'quantization', ['none', 'int8', 'fp8'] as const),
    matmulPrecision: choiceFlag(values.precision, 'precision', ['f32', 'bf16'] as const),
    kvCacheDtype: choiceFlag(values['kv-cache-dtype'], 'kv-cache-dtype', ['auto', 'fp8', 'fp8_e4m3'] as const),
    kvCacheBytes: intFlag(values['kv-cache-bytes'], 'kv-cache-bytes', 1),
    maxNumSeqs: intFlag(values['max-num-seqs'], 'max-num-seqs', 1),
    maxBatchedTokens: intFlag(values['max-batched-tokens'], 'max-batched-tokens', 1),
    loraMemoryBytes: intFlag(values['lora-memory-bytes'], 'lora-memory-bytes', 1),
    flexDeferral: deferralFlag(values['flex-deferral'], 'flex-deferral'),
    tenantDeferral: deferralFlag(values['tenant-deferral'], 'tenant-deferral'),
    speculative: speculativeFlags(values.speculative, values['num-speculative-tokens']),
  };
  const orgLimits = Object.fromEntries(Object.entries({
    maxInflightRequests: intFlag(values['org-max-inflight'], 'org-max-inflight', 0),
    maxQueuedBackground: intFlag(values['org-max-queued-background'], 'org-max-queued-background', 0),
    tokensPerMinute: intFlag(values['org-tokens-per-minute'], 'org-tokens-per-minute', 0),
  }).filter(([, v]) => v !== undefined));
  const transport = Object.fromEntries(Object.entries({
    bodyTimeoutSeconds: intFlag(values['body-timeout'], 'body-timeout', 0),
    minBodyBytesPerSecond: intFlag(values['min-body-rate'], 'min-body-rate', 0),
    maxConnections: intFlag(values['max-connections'], 'max-connections', 0),
    maxIdleConnectionsPerAddress: intFlag(values['max-idle-connections-per-address'], 'max-idle-connections-per-address', 0),
  }).filter(([, v]) => v !== undefined));
  const metrics = {
    public: values['metrics-public'] === true,
    maxOrganizations: intFlag(values['metrics-max-organizations'], 'metrics-max-organizations', 0, MAX_MAX_ORGANIZATIONS),
    processMetrics: true,
  };
  const logStatsSeconds = intFlag(values['log-stats-interval'], 'log-stats-interval', 0, 3600);
  const drainSeconds = intFlag(values['drain-seconds'], 'drain-seconds', 0, MAX_DRAIN_SECONDS) ?? 0;
  const leaseSeconds = intFlag(values['lease-seconds'], 'lease-seconds', 1, 600) ?? DEFAULT_LEASE_TTL_MS / 1000;
  // One JSON log stream: lifecycle, engine lines and one access line per request. The lifecycle
  // notices (loading, where it serves, shutting down) are written whatever --log-level says, as
  // they always were: an operator who asked for warnings only still learns where the server listens.
  const logger = pino({ level: logLevel }, pino.destination({ dest: 2, sync: true }));
  const notices = logger.child({}, { level: 'info' });
  const log = (message: string) => notices.info(message);
  // Before any model loads (which can take minutes): a port in use fails now, with its address.
  await checkPortFree(host, port);

  const catalog = await servedCatalog(values, 'serve', { makeDemo: true, log });

  const deadlines = Object.fromEntries((['asap', 'standard', 'flex'] as const)
    .map((w) => [w, intFlag(values[`deadline-${w}`], `deadline-${w}`, 1)] as const)
    .filter(([, v]) => v !== undefined));
  const batchDeadlines = Object.fromEntries((['asap', 'standard', 'flex'] as const)
    .map((w) => [w, intFlag(values[`batch-deadline-${w}`], `batch-deadline-${w}`, 1)] as const)
    .filter(([, v]) => v !== undefined));
  const defined = Object.fromEntries(Object.entries(engineDefaults).filter(([, v]) => v !== undefined));
  const service = await openService({
    catalog,
    dataDir: values['data-dir'] ?? 'data',
    ...(databaseUrl !== undefined && { databaseUrl }),
    lease: leaseConfig(leaseSeconds * 1000),
    ...(values['files-dir'] !== undefined && { filesDir: values['files-dir'] }),
    engineDefaults: defined,
    loggerInstance: logger,
    metrics: Object.fromEntries(Object.entries(metrics).filter(([, v]) => v !== undefined)),
    ...(logStatsSeconds !== undefined && { engineLogIntervalMs: logStatsSeconds * 1000 }),
    onProgress: log,
    deadlines,
    batchDeadlines,
    transport,
    orgLimits,
    ...(values['allow-private-webhooks'] && { webhooks: { allowPrivateAddresses: true } }),
    ...(values['allow-private-image-urls'] && { images: { allowPrivateAddresses: true } }),
  });

  // Installed before the port opens: a signal sent once the "serving" line is read must never meet
  // the default action (kill), as it could when the handlers came after that line.
  // SIGTERM / SIGINT: drain first when --drain-seconds asks (/ready 503, requests still served),
  // then shut down: new requests get 503, requests in flight finish, background work and webhooks
  // stop (resumed at the next start), the store closes. A signal during the drain ends it at once;
  // one during the shutdown exits at once.
  let phase: 'serving' | 'draining' | 'closing' = 'serving';
  let drainTimer: NodeJS.Timeout | undefined;
  const shutDown = (why: string) => {
    phase = 'closing';
    clearTimeout(drainTimer);
    log(`${why}: shutting down`);
    service.close().then(() => process.exit(0), (err: unknown) => {
      log(`shutdown failed: ${(err as Error).message}`);
      process.exit(1);
    });
  };
  const onSignal = (signal: string) => {
    if (phase === 'closing') {
      log(`${signal} during shutdown: exiting now`);
      process.exit(1);
    }
    if (phase === 'draining') return shutDown(`${signal} during the drain`);
    if (drainSeconds === 0) return shutDown(signal);
    phase = 'draining';
    service.drain();
    log(`${signal}: draining for ${drainSeconds} s (/ready answers 503, requests are still served), then shutting down`);
    drainTimer = setTimeout(() => shutDown('drain over'), drainSeconds * 1000);
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));

  const address = await service.app.listen({ host, port });
  // The backend each engine runs on (with --backend auto, cuda where a GPU is usable, else cpu).
  const backends = [...new Set(service.registry.models.map((m) => m.engine.info.backend))].join(' and ');
  log(`serving ${service.registry.models.map((m) => m.id).join(', ')} on ${address}/v1 (${backends} backend; data in ${service.dataDir}`
    + `${databaseUrl !== undefined ? `, store in PostgreSQL ${redactDatabaseUrl(databaseUrl)}` : ''}`
    + `${values['files-dir'] !== undefined ? `, files in ${resolve(values['files-dir'])}` : ''}; replica ${service.lease.owner})`);
  if (service.firstKey) {
    const model = service.registry.models[0]!.id;
    process.stdout.write(`
No API keys existed, so one was made for organization "${service.firstKey.info.orgName}" (shown only now):

  ${service.firstKey.key}

Try it:

  curl ${address}/v1/responses \\
    -H "Authorization: Bearer ${service.firstKey.key}" \\
    -H "Content-Type: application/json" \\
    -d '{"model": "${model}", "input": "Hello", "max_output_tokens": 16}'

`);
  }

}

/** --flex-deferral / --tenant-deferral: "off" or ROWS[,HOLD_MS]. */
function deferralFlag(raw: string | undefined, flag: string): { rowsPerStep: number; holdMs: number } | false | undefined {
  if (raw === undefined) return undefined;
  if (raw === 'off') return false;
  const m = /^(\d+)(?:,(\d+))?$/.exec(raw.trim());
  if (!m || Number(m[1]) < 1) {
    throw new SluiceError('invalid_argument', `--${flag} must be "off" or ROWS[,HOLD_MS] with ROWS >= 1, got "${raw}"`, { param: flag });
  }
  return { rowsPerStep: Number(m[1]), holdMs: m[2] === undefined ? 1000 : Number(m[2]) };
}

/**
 * Listens on host:port once and lets go, so that a port in use (or not ours to take) is reported
 * before the models load. Port 0 (any free port) always succeeds. Another process may still take
 * the port in between; then listen fails later with the same kind of message.
 */
async function checkPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  const probe = createNetServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', (err: NodeJS.ErrnoException) => {
      const why = err.code === 'EADDRINUSE' ? 'is already in use' : err.code === 'EACCES' ? 'may not be used by this user' : `cannot be listened on (${err.message})`;
      reject(new SluiceError('invalid_argument', `serve: ${host}:${port} ${why}; stop what listens there or give another --port / --host`, { param: 'port' }));
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}
