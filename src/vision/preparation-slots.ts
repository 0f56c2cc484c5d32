// How many images the process decodes and resizes at once. Each preparation keeps a thread of
// libuv's pool busy for milliseconds (sharp's decode, then the resize and hash); with more of them
// running than there are cores, the event loop's thread waits its turn for a core behind them, and
// every request's latency (a health check's too) grows with the queue. Preparations past the limit
// wait here, in arrival order, holding no thread. Measured on 2 cores (bench:vision, 16 requests at
// once, runs vary by 15%): unbounded, 220-280 images/s with /health p99 34-69 ms; 4 at a time,
// 180-230 images/s with p99 21-25 ms; 3 at a time, 190-207 images/s with p99 18-20 ms.

import { availableParallelism } from 'node:os';
import { SluiceError } from '../errors.js';

export class PreparationSlots {
  private running = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(readonly limit: number) {
    if (!(Number.isInteger(limit) && limit >= 1)) throw new RangeError(`the preparation limit must be a positive integer, got ${limit}`);
  }

  /** Runs `work` once a slot is free; rejects without running it if `signal` aborts first. */
  async run<T>(work: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (signal?.aborted) throw cancelled(signal);
    if (this.running >= this.limit) await this.wait(signal);
    else this.running++;
    try {
      return await work();
    } finally {
      const next = this.waiting.shift();
      // The slot passes straight to the next in line.
      if (next) next();
      else this.running--;
    }
  }

  private wait(signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        const at = this.waiting.indexOf(grant);
        if (at >= 0) this.waiting.splice(at, 1);
        reject(cancelled(signal!));
      };
      const grant = () => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(grant);
    });
  }
}

function cancelled(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new SluiceError('cancelled', 'the request was cancelled');
}

/** Two per core: the cores stay busy across each preparation's hops to the event loop, which keeps its turn. */
export const DEFAULT_PREPARATION_LIMIT = 2 * availableParallelism();

let shared: PreparationSlots | undefined;

/** The process's slots (every service and engine in it shares the same cores). */
export function sharedPreparationSlots(): PreparationSlots {
  shared ??= new PreparationSlots(DEFAULT_PREPARATION_LIMIT);
  return shared;
}
