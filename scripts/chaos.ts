// The chaos run (issue 11): two organizations send mixed traffic (foreground Responses, Chat
// Completions and Messages, background responses with completion webhooks to a local receiver,
// small batches) to the real `sluice serve`, which is killed with SIGKILL at a random moment of
// each cycle and restarted on the same data directory. After the last cycle it is started once
// more, drained and stopped gracefully, and the audit checks that every accepted request reached
// exactly one terminal state, every batch line was answered once, every callback was delivered,
// the usage ledger has one row per billed request, and neither organization saw the other's data.
//
//   npm run chaos                      # 20 cycles (what CI runs)
//   npm run chaos -- --cycles 100 --seed 42 --keep --verbose
//
// Exit status 1, with every violation listed, when any check fails.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { auditStore } from './chaos/audit-db.js';
import { checkBackground, checkBatches, checkDeliveries, checkForeground, checkIsolation, type Check } from './chaos/audit-http.js';
import { drainBackground, drainBatches, drainDeliveries, type DrainContext } from './chaos/drain.js';
import { KINDS, Journal } from './chaos/journal.js';
import { startReceiver } from './chaos/receiver.js';
import { createRng } from './chaos/rng.js';
import { runCli, ServerProcess, type ServerOptions } from './chaos/server.js';
import { finishIdempotentRetries, startBurst } from './chaos/traffic.js';

const HELP = `usage: npm run chaos -- [--cycles N] [--seed S] [--keep] [--verbose]

  --cycles N   kill -9 / restart cycles (default 20: about 2 minutes on 2 cores)
  --seed S     seed of every random choice (default: random, printed; rerun with it)
  --keep       keep the run's directory (model, data dir, server.log) for inspection
  --verbose    echo the server's output
`;

const ORGS = ['chaos-a', 'chaos-b'];
const WORKERS_PER_ORG = 3;

/**
 * serve flags: one engine thread and a small KV pool (the chaos process shares the machine), and
 * short asap deadlines so that work cut off by a kill sometimes times out at the restart (failed,
 * with a callback and no ledger row) and asap batches sometimes expire with part of their lines.
 */
const SERVE_FLAGS = [
  '--backend', 'cpu', '--threads', '1', '--kv-cache-bytes', String(32 << 20), '--max-num-seqs', '16',
  '--allow-private-webhooks', '--log-level', 'warn', '--deadline-asap', '4', '--batch-deadline-asap', '5',
];

const DRAIN_TIMEOUT_MS = 120_000;
/** Longer than a killed attempt's lease (30 s timeout + 5 s) plus the retry backoff. */
const DELIVERY_TIMEOUT_MS = 90_000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (line: string) => process.stdout.write(`${line}\n`);
const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: { cycles: { type: 'string' }, seed: { type: 'string' }, keep: { type: 'boolean' }, verbose: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
  });
  if (values.help) {
    process.stdout.write(HELP);
    return 0;
  }
  const cycles = Number(values.cycles ?? 20);
  if (!Number.isInteger(cycles) || cycles < 1) throw new Error(`--cycles must be a positive integer, got ${values.cycles}`);
  const seed = values.seed ?? String(Math.floor(Math.random() * 1e9));
  const started = Date.now();
  const root = mkdtempSync(join(os.tmpdir(), 'sluice-chaos-'));
  // The model directory's name is the model id the traffic asks for (journal.ts MODEL).
  const modelDir = join(root, 'tiny');
  const dataDir = join(root, 'data');
  const server: ServerOptions = { modelDir, dataDir, logPath: join(root, 'server.log'), flags: SERVE_FLAGS, verbose: values.verbose === true };
  say(`sluice chaos: ${cycles} cycles, seed ${seed} (rerun with --seed ${seed}), run directory ${root}`);

  await runCli(['make-model', '--preset', 'tiny', '--out', modelDir]);
  const keys = new Map<string, string>();
  const keyIds = new Map<string, string>();
  for (const org of ORGS) {
    const created = JSON.parse(await runCli(['keys', 'create', '--org', org, '--data-dir', dataDir, '--json'])) as { key: string; id: string };
    keys.set(org, created.key);
    keyIds.set(org, created.id);
  }
  const receiver = await startReceiver(seed, ORGS);
  const journal = new Journal();
  const checks: Check[] = [];
  const crashes: string[] = [];
  const killRng = createRng(`${seed}:kills`);
  let kills = 0;
  const refusedSoFar = () => [...journal.refused.values()].reduce((a, b) => a + b, 0);

  for (let cycle = 1; cycle <= cycles; cycle++) {
    const proc = await ServerProcess.start(server, `cycle ${cycle}`);
    // Most kills land in the middle of the traffic; some right after the start, while the
    // restarted server is still resuming the work the previous kill interrupted.
    const killAfterMs = killRng.chance(0.15) ? killRng.int(0, 300) : killRng.int(800, 3500);
    const before = { accepted: journal.accepted.length, cut: journal.totalCut(), refused: refusedSoFar() };
    const burst = startBurst({ baseUrl: proc.baseUrl, keys, hookUrl: receiver.hookUrl, journal, seed, cycle, workersPerOrg: WORKERS_PER_ORG });
    await sleep(killAfterMs);
    burst.stop();
    if (proc.crashed) crashes.push(`cycle ${cycle}: the server exited on its own (${proc.crashed}); see ${server.logPath}`);
    await proc.kill();
    kills++;
    await burst.done;
    say(`cycle ${String(cycle).padStart(3)}: kill -9 after ${seconds(killAfterMs)}: ${journal.accepted.length - before.accepted} accepted, `
      + `${journal.totalCut() - before.cut} cut off${refusedSoFar() > before.refused ? `, ${refusedSoFar() - before.refused} refused (429)` : ''}`);
  }

  // The last start: finish what the kills left, then audit.
  const drainStart = Date.now();
  const proc = await ServerProcess.start(server, 'drain');
  const ctx: DrainContext = { baseUrl: proc.baseUrl, keys, journal };
  await finishIdempotentRetries({ ...ctx, hookUrl: receiver.hookUrl, seed, cycle: cycles + 1, workersPerOrg: 1 });
  const finals = await drainBackground(ctx, DRAIN_TIMEOUT_MS);
  const batchesByOrg = await drainBatches(ctx, DRAIN_TIMEOUT_MS);
  const pendingDeliveries = await drainDeliveries(join(dataDir, 'sluice.db'), receiver,
    checkDeliveries(journal, receiver, finals).expectedIds, DELIVERY_TIMEOUT_MS);
  const drainMs = Date.now() - drainStart;

  checks.push({
    name: 'traffic answered as expected',
    summary: `every request to a live server answered 200 (429 where a limit refused it, 409 for a cancel that came too late); ${kills} kills, no crash`,
    violations: [...journal.violations, ...crashes],
  });
  checks.push(await checkBackground(ctx, journal, finals));
  checks.push(await checkForeground(ctx, journal));
  const { check: batchCheck, batches } = await checkBatches(ctx, journal, batchesByOrg);
  checks.push(batchCheck);
  const deliveries = checkDeliveries(journal, receiver, finals).check;
  if (pendingDeliveries > 0) deliveries.violations.push(`${pendingDeliveries} deliveries still pending ${seconds(DELIVERY_TIMEOUT_MS)} after the last start`);
  checks.push(deliveries);
  checks.push(await checkIsolation(ctx, journal, batches));
  const code = await proc.stop();
  checks.push({
    name: 'graceful stop',
    summary: 'SIGTERM after the drain: exit code 0',
    violations: code === 0 ? [] : [`the drained server's SIGTERM ended with ${code === 'hung' ? 'no exit within 60 s' : `exit code ${code}`}`],
  });
  await receiver.close();
  checks.push(checkServerLog(server.logPath));

  const store = auditStore({ dbPath: join(dataDir, 'sluice.db'), journal, batches, receiver, keyIds });
  checks.push(...store.checks);
  checks.push(await checkUsageCli(dataDir, store.ledgerRows, store.ledgerByOrg));

  report({ cycles, kills, journal, checks, drainMs, totalMs: Date.now() - started });
  const failed = checks.reduce((n, c) => n + c.violations.length, 0);
  if (failed > 0 || values.keep) say(`run directory kept: ${root} (server.log, data/sluice.db)`);
  else rmSync(root, { recursive: true, force: true });
  if (failed > 0) {
    say(`chaos: FAILED with ${failed} violation(s) (seed ${seed})`);
    return 1;
  }
  say('chaos: all checks passed');
  return 0;
}

/** Valid traffic and kills must not make the server log an error (pino level 50+) or fail its shutdown. */
function checkServerLog(path: string): Check {
  const violations: string[] = [];
  let lines = 0;
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    lines++;
    if (/^sluice: .*failed/.test(line)) violations.push(`server log: ${line.slice(0, 300)}`);
    if (!line.startsWith('{')) continue;
    try {
      const entry = JSON.parse(line) as { level?: number; msg?: string; err?: { message?: string } };
      if ((entry.level ?? 0) >= 50) violations.push(`server log: ${entry.msg ?? ''} ${entry.err?.message ?? ''}`.slice(0, 300));
    } catch { /* a line the kill cut short */ }
  }
  return { name: 'server log clean', summary: `${lines} lines over every start, no error or fatal entry`, violations };
}

/** `sluice usage --json` sums the same ledger: its request counts must be the rows the store holds. */
async function checkUsageCli(dataDir: string, rows: number, byOrg: Map<string, number>): Promise<Check> {
  const report = JSON.parse(await runCli(['usage', '--json', '--data-dir', dataDir])) as {
    data: Array<{ organization: string; requests: number }>; total: { requests: number };
  };
  const violations: string[] = [];
  if (report.total.requests !== rows) violations.push(`sluice usage counts ${report.total.requests} requests, the ledger holds ${rows} rows`);
  for (const [org, n] of byOrg) {
    const counted = report.data.filter((r) => r.organization === org).reduce((sum, r) => sum + r.requests, 0);
    if (counted !== n) violations.push(`sluice usage counts ${counted} requests for ${org}, the ledger holds ${n}`);
  }
  return { name: 'sluice usage agrees', summary: `${report.total.requests} requests in the report = ledger rows`, violations };
}

function report(r: { cycles: number; kills: number; journal: Journal; checks: Check[]; drainMs: number; totalMs: number }): void {
  const { journal } = r;
  const perKind = KINDS.map((k) => `${k} ${journal.of(k).length}`).join(', ');
  const perOrg = ORGS.map((o) => `${o} ${journal.accepted.filter((a) => a.org === o).length}`).join(', ');
  const cut = [...journal.cutOff].sort().map(([k, n]) => `${k} ${n}`).join(', ');
  say('');
  say(`cycles ${r.cycles}, kills ${r.kills}, restarts ${r.kills} (+1 to drain, drained in ${seconds(r.drainMs)})`);
  say(`accepted ${journal.accepted.length}: ${perKind} (${perOrg}); uploads ${journal.counts.uploads}, `
    + `cancels ${journal.counts.cancels} (+${journal.counts.batchCancels} batch)`);
  say(`cut off by kills ${journal.totalCut()}: ${cut || 'none'}`);
  if (journal.refused.size > 0) {
    say(`refused by the organizations' limits (429): ${[...journal.refused].sort().map(([k, n]) => `${k} ${n}`).join(', ')}`);
    for (const m of journal.refusalMessages) say(`  429: ${m}`);
  }
  say('audit:');
  for (const c of r.checks) {
    say(`  ${c.violations.length === 0 ? 'ok  ' : 'FAIL'} ${c.name}: ${c.summary}`);
    for (const v of c.violations.slice(0, 15)) say(`         - ${v}`);
    if (c.violations.length > 15) say(`         ... and ${c.violations.length - 15} more`);
  }
  say(`duration ${seconds(r.totalMs)}`);
}

main().then((code) => process.exit(code), (err: unknown) => {
  process.stderr.write(`chaos: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(2);
});
