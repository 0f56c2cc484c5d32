// A real `sluice serve` process (dist/src/cli.js) for tests that need processes: signals, several
// replicas, a load balancer in front. Its stderr JSON log is kept: the access lines (msg "request")
// carry request_id, route and status, so a test can tell which replica answered a request.

import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

export const CLI = join(import.meta.dirname, '..', '..', 'dist', 'src', 'cli.js');

export interface ServeProcess {
  child: ChildProcess;
  /** http://127.0.0.1:PORT, from the "serving ... on" line. */
  origin: string;
  /** Every stderr line that parsed as JSON (the pino log), in order. */
  readonly logLines: Array<Record<string, unknown>>;
  /** stderr as text (for failure messages). */
  readonly stderr: string;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  /** request_id of every access line with the given route. */
  requestIds(route: string): Set<string>;
}

/** Starts `sluice serve <args>` and waits (up to timeoutMs) for its "serving ... on http://..." line. */
export async function startServe(args: string[], timeoutMs = 60_000): Promise<ServeProcess> {
  const child = spawn(process.execPath, [CLI, 'serve', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let partial = '';
  const logLines: Array<Record<string, unknown>> = [];
  child.stdout!.resume();
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const origin = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start within ${timeoutMs} ms: ${stderr}`)), timeoutMs);
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d;
      partial += d;
      const lines = partial.split('\n');
      partial = lines.pop()!;
      for (const line of lines) {
        try { logLines.push(JSON.parse(line) as Record<string, unknown>); } catch { /* not a log line */ }
      }
      const m = /serving \S+ on (http:\/\/[^/\s]+)\/v1/.exec(stderr);
      if (m) { clearTimeout(timer); resolve(m[1]!); }
    });
    exited.then((code) => { clearTimeout(timer); reject(new Error(`serve exited with ${code}: ${stderr}`)); });
  });
  return {
    child, origin, logLines, exited,
    get stderr() { return stderr; },
    requestIds(route: string) {
      return new Set(logLines.filter((l) => l['msg'] === 'request' && l['route'] === route).map((l) => String(l['request_id'])));
    },
  };
}

/**
 * SIGTERM, then SIGKILL after graceMs; resolves with the exit code. A process started with
 * --drain-seconds gets a second SIGTERM once it logs that it drains, which ends the drain.
 */
export async function stopServe(p: ServeProcess, graceMs = 30_000): Promise<number | null> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return p.exited;
  const draining = () => p.logLines.some((l) => /^SIG[A-Z]+: draining/.test(String(l['msg'])));
  const wasDraining = draining();
  p.child.kill('SIGTERM');
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  if (!wasDraining) {
    const poll = setInterval(() => {
      if (p.child.exitCode !== null || p.child.signalCode !== null) clearInterval(poll);
      else if (draining()) { clearInterval(poll); p.child.kill('SIGTERM'); }
    }, 20);
    p.exited.finally(() => clearInterval(poll));
  }
  try {
    return await p.exited;
  } finally {
    clearTimeout(timer);
  }
}
