// HAProxy in front of local `sluice serve` replicas, for the benches and tests that need a real load
// balancer: deploy/haproxy.cfg rendered with real addresses (or its round-robin variant, the same
// file with the key hashing taken out), run in the foreground, and its servers' states read from
// its CSV status page.

import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';

export const HAPROXY_CANDIDATES = ['/usr/sbin/haproxy', '/usr/bin/haproxy', '/usr/local/sbin/haproxy', '/usr/local/bin/haproxy'];
/** deploy/haproxy.cfg, from bench/ in the tree or dist/bench/ after the build. */
export const HAPROXY_TEMPLATE = [join(import.meta.dirname, '..', 'deploy', 'haproxy.cfg'), join(import.meta.dirname, '..', '..', 'deploy', 'haproxy.cfg')]
  .find((p) => existsSync(p)) ?? join(import.meta.dirname, '..', 'deploy', 'haproxy.cfg');

/** The haproxy binary: $SLUICE_HAPROXY, else the first of the usual paths that exists. */
export function findHaproxy(): string | undefined {
  return [process.env['SLUICE_HAPROXY'], ...HAPROXY_CANDIDATES].find((p): p is string => p !== undefined && p !== '' && existsSync(p));
}

export const HAPROXY_MISSING = `no haproxy binary (looked for $SLUICE_HAPROXY, ${HAPROXY_CANDIDATES.join(', ')}); install Debian's package: apt-get install haproxy`;

/** One `server NAME HOST:PORT` line per replica. */
export type ServerLine = [name: string, address: string];

/** Renders deploy/haproxy.cfg: its placeholders filled, comment lines left alone. */
export function renderHaproxyConfig(template: string, values: { bind: string; stats_bind: string; servers: ServerLine[] }): string {
  return template.split('\n').map((line) => {
    if (line.trimStart().startsWith('#')) return line;
    const indent = /^\s*/.exec(line)![0];
    return line
      .replace('{{bind}}', values.bind)
      .replace('{{stats_bind}}', values.stats_bind)
      .replace('{{servers}}', values.servers.map(([name, address], i) => `${i === 0 ? '' : indent}server ${name} ${address}`).join('\n'));
  }).join('\n');
}

/**
 * The same configuration without affinity: no request is sent to the key-hashing backend, and the
 * other one takes turns (`balance roundrobin`) instead of least connections. Throws when the
 * template no longer has the lines this changes (so a changed deploy/haproxy.cfg cannot silently
 * make "round robin" mean something else).
 */
export function withoutAffinity(config: string): string {
  const useByKey = /^(\s*)use_backend sluice_by_key .*$/m;
  const leastConn = /^(\s*)balance leastconn\s*$/m;
  if (!useByKey.test(config) || !leastConn.test(config)) throw new Error('deploy/haproxy.cfg: no "use_backend sluice_by_key" or "balance leastconn" line to change');
  return config.replace(useByKey, '$1# (round robin: no key hashing)').replace(leastConn, '$1balance roundrobin');
}

export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 15_000, everyMs = 100): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const got = await probe().catch(() => undefined);
    if (got !== undefined) return got;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface Haproxy {
  child: ChildProcess;
  /** http://127.0.0.1:PORT: where clients connect. */
  origin: string;
  /** http://127.0.0.1:PORT of /stats and /metrics. */
  statsOrigin: string;
  /** Its stdout and stderr (the request log: `log stdout`). */
  readonly output: string;
  /** backend/server -> status (UP, DOWN, ...), from /stats;csv. */
  serverStates(): Promise<Map<string, string>>;
  /** SIGTERM, and waits for the exit. */
  stop(): Promise<void>;
}

export interface HaproxyOptions {
  binary: string;
  /** Where the rendered configuration is written. */
  dir: string;
  servers: ServerLine[];
  /** Round robin instead of deploy/haproxy.cfg's affinity (withoutAffinity). */
  roundRobin?: boolean;
  /** The template's text (default: deploy/haproxy.cfg). */
  template?: string;
}

/** Starts HAProxy in the foreground (-db) and resolves once it sees every server UP in both backends. */
export async function startHaproxy(opts: HaproxyOptions): Promise<Haproxy> {
  const [port, statsPort] = [await freePort(), await freePort()];
  let config = renderHaproxyConfig(opts.template ?? readFileSync(HAPROXY_TEMPLATE, 'utf8'), {
    bind: `127.0.0.1:${port}`, stats_bind: `127.0.0.1:${statsPort}`, servers: opts.servers,
  });
  if (opts.roundRobin) config = withoutAffinity(config);
  const configPath = join(opts.dir, opts.roundRobin ? 'haproxy-roundrobin.cfg' : 'haproxy.cfg');
  writeFileSync(configPath, config);
  const child = spawn(opts.binary, ['-db', '-f', configPath], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (d) => { output += d; });
  child.stderr!.on('data', (d) => { output += d; });
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const statsOrigin = `http://127.0.0.1:${statsPort}`;
  const serverStates = async () => {
    const csv = await (await fetch(`${statsOrigin}/stats;csv`)).text();
    const [header, ...rows] = csv.trim().split('\n');
    const cols = header!.replace(/^# /, '').split(',');
    const [px, sv, status] = ['pxname', 'svname', 'status'].map((c) => cols.indexOf(c));
    return new Map(rows.map((r) => r.split(',')).map((f) => [`${f[px!]}/${f[sv!]}`, f[status!]!]));
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  try {
    await waitFor(`HAProxy to see every replica up (its output: ${output})`, async () => {
      if (child.exitCode !== null) throw new Error(`haproxy exited with ${child.exitCode}: ${output}`);
      const states = await serverStates();
      return opts.servers.every(([n]) => states.get(`sluice_by_key/${n}`) === 'UP' && states.get(`sluice_least_conn/${n}`) === 'UP') ? true : undefined;
    });
  } catch (err) {
    await stop();
    throw err;
  }
  return { child, origin: `http://127.0.0.1:${port}`, statsOrigin, get output() { return output; }, serverStates, stop };
}
