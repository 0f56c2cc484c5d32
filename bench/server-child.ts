// The parent's side of a bench server child: a forked process running the service, talking over
// Node's IPC channel. Replies arrive in order; each `next(type)` takes the next one and checks its
// type; a child that exits fails every pending and later `next`.

import type { ChildProcess } from 'node:child_process';

/** Replies carry their type; `{type: 'error', message}` is the child's failure. */
export class ServerChild<Request, Reply extends { type: string }> {
  private readonly waiting: Array<(msg: Reply) => void> = [];
  readonly exited: Promise<never>;

  constructor(readonly proc: ChildProcess) {
    proc.on('message', (msg: Reply) => {
      const next = this.waiting.shift();
      if (next) next(msg);
    });
    this.exited = new Promise((_, reject) => {
      proc.on('exit', (code, signal) => reject(new Error(`the server process exited (code ${code}, signal ${signal})`)));
    });
    this.exited.catch(() => {});
  }

  async next<T extends Reply['type']>(type: T): Promise<Extract<Reply, { type: T }>> {
    const msg = await Promise.race([new Promise<Reply>((r) => this.waiting.push(r)), this.exited]);
    if (msg.type === 'error') throw new Error(`server process: ${(msg as unknown as { message: string }).message}`);
    if (msg.type !== type) throw new Error(`server process: expected ${type}, got ${msg.type}`);
    return msg as Extract<Reply, { type: T }>;
  }

  send(msg: Request): void {
    this.proc.send(msg as object);
  }
}
