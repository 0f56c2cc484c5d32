// The `hostile` scenario of bench:serve (issue 27): one organization's schemas must change nothing
// for another. (a) Organization A's stream runs alone: asap requests, every other one asking for a
// json_schema output with a schema of its own (so each compiles), the rest plain (idle baseline).
// (b) Organization B sends hostile schemas at --hostile-rate per second (the crashers,
// slow patterns, $ref chains and distinct long-string schemas that each compile), while the SAME A
// stream runs. Reported: A's TTFT and end-to-end p50 under B's schemas over idle (target <= 1.5,
// printed met / NOT met, not asserted), A's failures (target 0), and B's answers by status.

import type { Client, PlannedRequest, ServeChild, StepSummary, WindowStats } from './serve.js';
import { sleep, windowStats } from './serve.js';

export interface HostileDeps {
  server: ServeChild;
  clientA: Client;
  clientB: Client;
  /** A's stream (Poisson arrivals); every other request gets a json_schema format here. */
  stream: PlannedRequest[];
  /** B's hostile requests per second. */
  rate: number;
  drainTimeout: number;
  fmt: (x: number | null, digits?: number) => string;
}

export interface HostileOutcome {
  idleStats: WindowStats[];
  loadStats: WindowStats[];
  notes: string[];
  result: Record<string, unknown>;
}

const refChain = (n: number) => ({
  $defs: Object.fromEntries(Array.from({ length: n }, (_, i) => [`d${i + 1}`,
    i === 0 ? { type: 'string' } : { type: 'array', items: { $ref: `#/$defs/d${i}` } }])),
  $ref: `#/$defs/d${n}`,
});

/** B's schemas, cycled: the reproductions (refused up front now) and valid schemas that each cost a compile. */
export function hostileSchemas(i: number): object {
  const fixed: object[] = [
    { type: 'string', pattern: '[]' },
    { type: 'string', pattern: '\\p{L}+' },
    { type: 'integer', minimum: 1e20 },
    { type: 'integer', minimum: 5, maximum: 4 },
    { type: 'number', exclusiveMinimum: 5, maximum: 5 },
    { type: 'array', items: false, minItems: 2 },
    { $defs: { 'a/b': { type: 'string' } }, $ref: '#/$defs/a~1b' },
    { type: 'object', properties: { 'a"b': { type: 'string' } } },
    { type: 'string', pattern: '^((a{1,1000}){1,1000}){1,1000}$' },
    refChain(200),
  ];
  if (i % 2 === 0) return fixed[(i / 2) % fixed.length]!;
  // A distinct, valid, expensive schema each time: nothing is cached, every one compiles.
  return { type: 'object', properties: Object.fromEntries(Array.from({ length: 8 }, (_, k) => [`y${i}_${k}`, { type: 'string', minLength: 900, maxLength: 1000 }])),
    required: [`y${i}_0`] };
}

/** A's json_schema formats: ordinary and distinct per request (each one compiles). */
function ordinarySchema(i: number): object {
  return { type: 'object', properties: { [`id_${i}`]: { type: 'integer', minimum: 0, maximum: 10_000 }, name: { type: 'string', maxLength: 40 },
    tags: { type: 'array', items: { type: 'string', enum: ['a', 'b', 'c'] }, maxItems: 3 } }, required: [`id_${i}`, 'name'], additionalProperties: false };
}

export async function runHostileScenario(d: HostileDeps): Promise<HostileOutcome> {
  const { server, clientA, clientB, fmt } = d;
  const stream = d.stream.map((r, i) => (i % 2 === 0 ? r : { ...r, format: { type: 'json_schema', name: `a${i}`, schema: ordinarySchema(i), strict: false } }));
  const streamIdle = stream.map((r, i) => (i % 2 === 0 ? r : { ...r, format: { ...(r.format as object), schema: ordinarySchema(i + 100_000) } }));
  process.stderr.write(`hostile (a) idle: org A's ${stream.length} requests alone (half json_schema)...\n`);
  const idle = await server.traced(() => clientA.runOpenLoop(streamIdle, d.drainTimeout));

  process.stderr.write(`hostile (b): org B sends hostile schemas at ${d.rate}/s while org A's same stream runs...\n`);
  const answers = new Map<number, number>();
  let sent = 0;
  let stop = false;
  const inFlight: Array<Promise<void>> = [];
  const sender = (async () => {
    const t0 = performance.now();
    while (!stop) {
      const i = sent++;
      inFlight.push(clientB.postRaw({ input: `hostile ${i}`, max_output_tokens: 8, format: { type: 'json_schema', name: `b${i}`, schema: hostileSchemas(i), strict: false } })
        .then((status) => { answers.set(status, (answers.get(status) ?? 0) + 1); }));
      await sleep(t0 + (sent * 1000) / d.rate - performance.now());
    }
  })();
  const loaded = await server.traced(() => clientA.runOpenLoop(stream, d.drainTimeout));
  stop = true;
  await sender;
  await Promise.all(inFlight);

  const idleStats = windowStats(idle.value.records, idle.value.durationMs);
  const loadStats = windowStats(loaded.value.records, loaded.value.durationMs);
  const p50 = (s: WindowStats[], key: 'ttftMs' | 'e2eMs') => s.find((w) => w.window === 'asap')?.[key].p50 ?? null;
  const ratio = (a: number | null, b: number | null) => (a !== null && b !== null && b > 0 ? a / b : null);
  const ttftRatio = ratio(p50(loadStats, 'ttftMs'), p50(idleStats, 'ttftMs'));
  const e2eRatio = ratio(p50(loadStats, 'e2eMs'), p50(idleStats, 'e2eMs'));
  const failedA = loaded.value.records.filter((r) => r.status !== 'completed' && r.status !== 'incomplete').length;
  const met = ttftRatio !== null && ttftRatio <= 1.5 && e2eRatio !== null && e2eRatio <= 1.5 && failedA === 0;
  const steps = (s: StepSummary) => `${s.steps} steps (busy ${(100 * s.busyFraction).toFixed(0)}%, step p50 ${fmt(s.stepMs.p50, 2)} ms)`;
  const notes = [
    `hostile: org A's TTFT p50 idle ${fmt(p50(idleStats, 'ttftMs'), 2)} ms, under org B's schemas ${fmt(p50(loadStats, 'ttftMs'), 2)} ms (ratio ${fmt(ttftRatio, 2)}); ` +
      `end-to-end p50 ratio ${fmt(e2eRatio, 2)}; A's failures ${failedA} (target: both ratios <= 1.5 and no failure: ${met ? 'met' : 'NOT met'})`,
    `hostile: org B sent ${sent} schemas at ${d.rate}/s; answers by HTTP status ${JSON.stringify(Object.fromEntries(answers))}`,
    `hostile: engine idle ${steps(idle.steps)}; under B's schemas ${steps(loaded.steps)}`,
  ];
  return {
    idleStats, loadStats, notes,
    result: {
      settings: { streamRequests: stream.length, hostileRate: d.rate },
      idle: { durationS: idle.value.durationMs / 1000, windows: idleStats, engineSteps: idle.steps },
      load: { durationS: loaded.value.durationMs / 1000, windows: loadStats, engineSteps: loaded.steps, failedA },
      hostileSent: sent, hostileAnswers: Object.fromEntries(answers),
      ttftRatio, e2eRatio,
      target: { target: "org A's TTFT and end-to-end p50 under org B's hostile schemas <= 1.5 x idle, no failure", value: ttftRatio, met },
    },
  };
}
