// The `tenants` scenario of bench:serve: fairness between organizations inside one completion
// window. (a) Organization A's asap stream runs alone (idle baseline); (b) organization B submits
// --flood background asap requests at once (the "noisy tenant"), the bench waits until B fills
// the engine, then the SAME A stream (same arrival times, prompts, lengths) runs. Reported: A's
// TTFT p50 under the flood / idle (target <= 1.5, printed met / NOT met, not asserted), how much
// of B's flood finished meanwhile (B must still progress), and the engine's steps. B's unfinished
// requests are cancelled at the end so the server ends idle.

import type { Client, PlannedRequest, ServeChild, StepSummary, WindowStats } from './serve.js';
import { pool, sleep, windowStats } from './serve.js';

export interface TenantsDeps {
  server: ServeChild;
  clientA: Client;
  clientB: Client;
  /** A's asap stream (Poisson arrivals). */
  stream: PlannedRequest[];
  /** B's flood: background asap requests, all at time 0. */
  flood: PlannedRequest[];
  drainTimeout: number;
  maxNumSeqs: number;
  settleMax: number;
  fmt: (x: number | null, digits?: number) => string;
}

export interface TenantsOutcome {
  idleStats: WindowStats[];
  loadStats: WindowStats[];
  notes: string[];
  result: Record<string, unknown>;
}

export async function runTenantsScenario(d: TenantsDeps): Promise<TenantsOutcome> {
  const { server, clientA, clientB, stream, flood, fmt } = d;
  process.stderr.write(`tenants (a) idle: org A's ${stream.length} asap requests alone...\n`);
  const idle = await server.traced(() => clientA.runOpenLoop(stream, d.drainTimeout));

  process.stderr.write(`tenants (b) flood: org B submits ${flood.length} background asap requests, then org A's same stream...\n`);
  const loaded = await server.traced(async () => {
    const submitStart = performance.now();
    const ids: string[] = [];
    const refused = new Map<number, number>();
    await pool(flood, 16, async (r) => {
      try {
        ids.push(await clientB.submitBackground(r));
      } catch (err) {
        const status = Number(/HTTP (\d+)/.exec(String((err as Error).message))?.[1] ?? 0);
        refused.set(status, (refused.get(status) ?? 0) + 1);
      }
    });
    const submitMs = performance.now() - submitStart;
    const settleStart = performance.now();
    while (performance.now() - settleStart < d.settleMax * 1000) {
      const st = await server.engineState();
      if (st.running === null || st.running >= d.maxNumSeqs || st.waiting === 0) break;
      await sleep(100);
    }
    const atStart = await server.engineState();
    const run = await clientA.runOpenLoop(stream, d.drainTimeout);
    let finishedB = 0;
    const unfinished: string[] = [];
    await pool(ids, 32, async (id) => {
      const obj = await clientB.get(id);
      if (obj.status === 'in_progress') unfinished.push(id);
      else finishedB++;
    });
    return { run, ids, refused, submitMs, atStart, finishedB, unfinished };
  });
  const l = loaded.value;
  await pool(l.unfinished, 32, async (id) => { await clientB.cancel(id); });
  await sleep(200);
  const afterCancel = await server.engineState();

  const idleStats = windowStats(idle.value.records, idle.value.durationMs);
  const loadStats = windowStats(l.run.records, l.run.durationMs);
  const idleP50 = idleStats.find((s) => s.window === 'asap')?.ttftMs.p50 ?? null;
  const loadP50 = loadStats.find((s) => s.window === 'asap')?.ttftMs.p50 ?? null;
  const ratio = idleP50 !== null && loadP50 !== null && idleP50 > 0 ? loadP50 / idleP50 : null;
  const met = ratio !== null && ratio <= 1.5;
  const steps = (s: StepSummary) => `${s.steps} steps (busy ${(100 * s.busyFraction).toFixed(0)}%, step p50 ${fmt(s.stepMs.p50, 2)} ms, ` +
    `rows/step p50 ${fmt(s.rowsPerStep.p50, 0)}; preemptions ${JSON.stringify(s.preemptions)})`;
  const notes = [
    `tenants: org A's asap TTFT p50 idle ${fmt(idleP50, 2)} ms, under org B's flood of ${flood.length} ${fmt(loadP50, 2)} ms; ` +
      `ratio ${fmt(ratio, 2)} (target <= 1.5: ${met ? 'met' : 'NOT met'})`,
    `tenants: B's flood: ${l.ids.length} accepted${l.refused.size ? `, refused ${JSON.stringify(Object.fromEntries(l.refused))}` : ''} in ` +
      `${(l.submitMs / 1000).toFixed(1)} s; engine at A's stream start ${l.atStart.running} running / ${l.atStart.waiting} waiting; ` +
      `${l.finishedB} of B's requests finished by the end of A's stream; ${l.unfinished.length} cancelled; engine after: ` +
      `${afterCancel.running} running / ${afterCancel.waiting} waiting`,
    `tenants: engine idle ${steps(idle.steps)}; under the flood ${steps(loaded.steps)}`,
  ];
  return {
    idleStats, loadStats, notes,
    result: {
      settings: { floodRequests: flood.length, floodMaxOutputTokens: flood[0]?.maxOutputTokens ?? null, streamRequests: stream.length },
      idle: { durationS: idle.value.durationMs / 1000, windows: idleStats, engineSteps: idle.steps },
      load: {
        durationS: l.run.durationMs / 1000, windows: loadStats, engineSteps: loaded.steps, floodAccepted: l.ids.length,
        floodRefused: Object.fromEntries(l.refused), floodSubmitS: l.submitMs / 1000, engineAtStreamStart: l.atStart,
        floodFinishedDuringStream: l.finishedB, floodCancelled: l.unfinished.length, engineAfterCancel: afterCancel,
      },
      ttftP50IdleMs: idleP50,
      ttftP50FloodMs: loadP50,
      ratio,
      target: { target: "org A's asap TTFT p50 under org B's flood <= 1.5 x idle", value: ratio, met },
    },
  };
}
