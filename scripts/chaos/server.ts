// The real `sluice serve` as a child process: started on a free port of this machine, waited for
// on /health, killed with SIGKILL (no shutdown code runs at all) or stopped with SIGTERM. Its
// output goes to one log file across every restart, so a failed run can be read afterwards.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, readFileSync, type WriteStream } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';

/** dist/scripts/chaos/server.js -> dist/src/cli.js */
export const CLI = join(import.meta.dirname, '..', '..', 'src', 'cli.js');

const execFileAsync = promisify(execFile);

/** Runs a sluice CLI command to its end; resolves with its stdout. */
export async function runCli(args: string[]): Promise<string> {
  const { stdout } = await execFileAsync(process.execPath, [CLI, ...args], { maxBuffer: 64 << 20 });
  return stdout;
}

/**
 * A port nobody listens on now: bound on 127.0.0.1 by the kernel's choice, then let go. Another
 * process could take it before the server binds; serve then fails at once and start() says so.
 */
export async function freePort(): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', resolve);
  });
  const { port } = probe.address() as net.AddressInfo;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}

export interface ServerOptions {
  modelDir: string;
  dataDir: string;
  logPath: string;
  /** Flags added to `serve` (deadlines, engine sizes, --allow-private-webhooks). */
  flags: string[];
  verbose: boolean;
}

export class ServerProcess {
  private readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private exitedAlready = false;
  private stopping = false;
  /** Set when the process exited without being told to (a crash): how it exited. */
  crashed: string | undefined;

  private constructor(private readonly child: ChildProcess, readonly baseUrl: string, private readonly log: WriteStream) {
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => {
      this.exitedAlready = true;
      if (!this.stopping) this.crashed = `code ${code}, signal ${signal}`;
      resolve({ code, signal });
    }));
  }

  get pid(): number {
    return this.child.pid!;
  }

  static async start(opts: ServerOptions, label: string, timeoutMs = 60_000): Promise<ServerProcess> {
    const port = await freePort();
    const log = createWriteStream(opts.logPath, { flags: 'a' });
    log.write(`\n==== ${label}: port ${port}, ${new Date().toISOString()} ====\n`);
    const child = spawn(process.execPath, [CLI, 'serve', '--model', opts.modelDir, '--data-dir', opts.dataDir,
      '--host', '127.0.0.1', '--port', String(port), ...opts.flags], { stdio: ['ignore', 'pipe', 'pipe'], env: process.env });
    for (const stream of [child.stdout!, child.stderr!]) {
      stream.pipe(log, { end: false });
      if (opts.verbose) stream.pipe(process.stderr, { end: false });
    }
    const server = new ServerProcess(child, `http://127.0.0.1:${port}`, log);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (server.exitedAlready) throw new Error(`${label}: the server exited before it was healthy; see ${opts.logPath}:\n${tail(opts.logPath)}`);
      try {
        const res = await fetch(`${server.baseUrl}/health`, { signal: AbortSignal.timeout(2_000) });
        await res.arrayBuffer();
        if (res.ok) return server;
      } catch { /* not listening yet */ }
      if (Date.now() > deadline) {
        await server.kill();
        throw new Error(`${label}: the server was not healthy within ${timeoutMs} ms; see ${opts.logPath}:\n${tail(opts.logPath)}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** kill -9: the process gets no chance to finish anything. */
  async kill(): Promise<void> {
    this.stopping = true;
    if (!this.exitedAlready) this.child.kill('SIGKILL');
    await this.exited;
    this.log.end();
  }

  /** Graceful stop; resolves with the exit code, or 'hung' after timeoutMs (then it is killed). */
  async stop(timeoutMs = 60_000): Promise<number | null | 'hung'> {
    this.stopping = true;
    this.child.kill('SIGTERM');
    const timer = new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), timeoutMs).unref());
    const result = await Promise.race([this.exited, timer]);
    if (result === 'hung') {
      await this.kill();
      return 'hung';
    }
    this.log.end();
    return result.code;
  }
}

function tail(path: string, lines = 20): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}
