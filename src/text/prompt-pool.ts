// Worker threads that render and tokenize long prompts, so a long input never blocks the event
// loop (health checks, other tenants' requests, the engine's step loop all run there).
//
// - Jobs queue per tenant and are served round-robin across tenants: one tenant's pile of long
//   inputs delays its own jobs, not another's.
// - A worker holds each model's tokenizer once loaded; workers idle for `idleMs` are stopped so
//   the memory a huge input took is given back to the system.
// - Each worker's heap is capped (`maxHeapMb`); a job that runs out of it, or runs longer than
//   `jobTimeoutMs`, fails alone (input_too_long) and its worker is replaced.
//
// The worker runs the compiled dist/src/text/prompt-worker.js (Node cannot start a worker from
// TypeScript source), so under the test runner the build must be current (npm run build:ts).

import { existsSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { SluiceError } from '../errors.js';
import { Turns } from '../turns.js';
import type { PromptText } from './prompt-encoder.js';
import type { PromptAnswer, PromptJob } from './prompt-worker.js';

export interface PromptPoolOptions {
  /** Workers at most (default: min(2, CPUs)). */
  size?: number;
  /** Stop a worker idle this long (default 30 s). */
  idleMs?: number;
  /** Old-generation heap cap per worker in MB (default 2048). */
  maxHeapMb?: number;
  /** A job running longer fails and its worker is replaced (default 60 s). */
  jobTimeoutMs?: number;
}

interface Pending {
  job: PromptJob;
  tenant: string;
  resolve(ids: number[]): void;
  reject(err: Error): void;
}

interface Slot {
  worker: Worker;
  running: Pending | undefined;
  timer: NodeJS.Timeout | undefined;
}

/** The compiled worker file, next to this module's compiled form. */
function workerPath(): string {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.js')) return here.replace(/prompt-pool\.js$/, 'prompt-worker.js');
  // Running from TypeScript sources (tests): use the compiled tree of this package.
  return here.replace(/src[/\\]text[/\\]prompt-pool\.ts$/, 'dist/src/text/prompt-worker.js');
}

let workerExists: boolean | undefined;

export class PromptPool {
  private readonly size: number;
  private readonly idleMs: number;
  private readonly maxHeapMb: number;
  private readonly jobTimeoutMs: number;
  private readonly slots: Slot[] = [];
  /** tenant -> its waiting jobs (FIFO). */
  private readonly queues = new Map<string, Pending[]>();
  private readonly turns = new Turns();
  private idleTimer: NodeJS.Timeout | undefined;
  private nextId = 1;
  private closed = false;

  constructor(opts: PromptPoolOptions = {}) {
    this.size = opts.size ?? Math.max(1, Math.min(2, os.availableParallelism()));
    this.idleMs = opts.idleMs ?? 30_000;
    this.maxHeapMb = opts.maxHeapMb ?? 2048;
    this.jobTimeoutMs = opts.jobTimeoutMs ?? 60_000;
  }

  /** Workers alive now (they stop after idleMs without work). */
  get numWorkers(): number {
    return this.slots.length;
  }

  /** Whether workers can be started (the compiled worker exists); looked up once per process. */
  static available(): boolean {
    return (workerExists ??= existsSync(workerPath()));
  }

  /** Renders and tokenizes `text` for the model in `modelDir` on a worker. Errors are SluiceErrors. */
  encode(modelDir: string, text: PromptText, tenant = ''): Promise<number[]> {
    if (this.closed) return Promise.reject(new SluiceError('engine_disposed', 'the prompt workers are stopped'));
    return new Promise((resolve, reject) => {
      const pending: Pending = { job: { id: this.nextId++, modelDir, text }, tenant, resolve, reject };
      let queue = this.queues.get(tenant);
      if (!queue) this.queues.set(tenant, (queue = []));
      queue.push(pending);
      this.dispatch();
    });
  }

  /** Stops every worker; queued and running jobs fail. Safe to call twice. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.idleTimer);
    const error = new SluiceError('engine_disposed', 'the prompt workers were stopped');
    for (const queue of this.queues.values()) for (const p of queue) p.reject(error);
    this.queues.clear();
    await Promise.all(this.slots.splice(0).map((slot) => {
      clearTimeout(slot.timer);
      slot.running?.reject(error);
      return slot.worker.terminate();
    }));
  }

  /** Starts queued jobs on free workers: next is the tenant whose last turn is the oldest. */
  private dispatch(): void {
    clearTimeout(this.idleTimer);
    while (this.queues.size > 0) {
      let slot = this.slots.find((s) => s.running === undefined);
      if (!slot) {
        if (this.slots.length >= this.size) break;
        slot = this.spawn();
      }
      this.start(slot, this.takeNext());
    }
    if (this.slots.every((s) => s.running === undefined) && this.slots.length > 0) {
      this.idleTimer = setTimeout(() => void this.stopIdle(), this.idleMs);
      this.idleTimer.unref();
    }
  }

  /** The next job (queues must not be empty): of the tenant served least recently. */
  private takeNext(): Pending {
    const tenant = this.turns.next(this.queues.keys())!;
    const queue = this.queues.get(tenant)!;
    const next = queue.shift()!;
    if (queue.length === 0) this.queues.delete(tenant);
    this.turns.take(tenant);
    return next;
  }

  private spawn(): Slot {
    const worker = new Worker(workerPath(), { resourceLimits: { maxOldGenerationSizeMb: this.maxHeapMb } });
    worker.unref();  // idle workers never keep the process alive
    const slot: Slot = { worker, running: undefined, timer: undefined };
    worker.on('message', (answer: PromptAnswer) => this.onAnswer(slot, answer));
    worker.on('error', (err: Error) => this.onWorkerLost(slot, err));
    worker.on('exit', () => this.onWorkerLost(slot, undefined));
    this.slots.push(slot);
    return slot;
  }

  private start(slot: Slot, p: Pending): void {
    slot.running = p;
    slot.timer = setTimeout(() => {
      // Out of the pool before it is stopped, so no job is handed to a dying worker.
      this.slots.splice(this.slots.indexOf(slot), 1);
      this.fail(slot, new SluiceError('input_too_long',
        `the input took longer than ${this.jobTimeoutMs / 1000} s to tokenize; send a shorter input`, { param: 'input' }));
      void slot.worker.terminate();
      this.dispatch();
    }, this.jobTimeoutMs);
    slot.timer.unref();
    slot.worker.postMessage(p.job);
  }

  private onAnswer(slot: Slot, answer: PromptAnswer): void {
    const p = slot.running;
    if (!p || p.job.id !== answer.id) return;
    clearTimeout(slot.timer);
    slot.running = undefined;
    if ('tokenIds' in answer) p.resolve(Array.from(answer.tokenIds));
    else p.reject(new SluiceError(answer.error.code, answer.error.message, answer.error.param === undefined ? {} : { param: answer.error.param }));
    this.dispatch();
  }

  /** The worker died (heap limit, crash, terminate): its job fails alone; the slot is dropped. */
  private onWorkerLost(slot: Slot, err: Error | undefined): void {
    const index = this.slots.indexOf(slot);
    if (index === -1) return;
    this.slots.splice(index, 1);
    if (slot.running) {
      const outOfMemory = (err as { code?: string } | undefined)?.code === 'ERR_WORKER_OUT_OF_MEMORY';
      this.fail(slot, outOfMemory
        ? new SluiceError('input_too_long', 'the input needs more memory to tokenize than one request may use; send a shorter input', { param: 'input' })
        : new SluiceError('engine_error', `the prompt worker stopped: ${err?.message ?? 'exited'}`));
    }
    if (!this.closed) this.dispatch();
  }

  private fail(slot: Slot, err: Error): void {
    clearTimeout(slot.timer);
    const p = slot.running;
    slot.running = undefined;
    p?.reject(err);
  }

  private async stopIdle(): Promise<void> {
    const idle = this.slots.filter((s) => s.running === undefined);
    for (const slot of idle) this.slots.splice(this.slots.indexOf(slot), 1);
    await Promise.all(idle.map((s) => s.worker.terminate()));
  }
}

/** The process-wide pool engines share (started lazily: no worker exists until a long input). */
let shared: PromptPool | undefined;
export function sharedPromptPool(): PromptPool {
  return (shared ??= new PromptPool());
}
