// The vision tower's queue: images waiting to be encoded, across every request of an engine, go
// through the tower in batches (one pass of its matrix products over several images' rows), and
// the batches are filled fairly: one image from each organization with images waiting, in turn,
// so one organization's many or large images never hold another's behind them for more than a
// batch. An image already encoded for the same organization comes from the encoding cache; the
// same image asked for twice at once is encoded once. A batch that fails is encoded again one
// image at a time, so that one request's bad image fails only that request.

import { SluiceError } from '../errors.js';
import { EncodingCache } from './encoding-cache.js';
import type { PreparedImage } from './vision-model.js';

/** Encodes several images in one pass: one output per image, in order. */
export type EncodeBatch = (images: readonly PreparedImage[]) => Promise<Float32Array[]>;

export interface EncodeQueueLimits {
  /** Images in one batch (default 16). */
  maxImages: number;
  /**
   * Resized pixels in one batch (default 512 Ki, about ten 224x224 images); an image larger than
   * this goes alone. Every image of a batch waits for the whole batch, and on the CPU a batch is no
   * faster than its images one at a time (the matrix products are compute-bound already), so the
   * bound keeps a batch about as long as one large image.
   */
  maxPixels: number;
}

export const DEFAULT_ENCODE_QUEUE_LIMITS: EncodeQueueLimits = { maxImages: 16, maxPixels: 512 * 1024 };

interface Waiter {
  resolve(embeds: Float32Array): void;
  reject(err: unknown): void;
}

interface Job {
  key: string;
  owner: string;
  image: PreparedImage;
  waiters: Set<Waiter>;
}

export class EncodeQueue {
  /** Waiting jobs per owner, owners in the order they are served next. */
  private readonly waiting = new Map<string, Job[]>();
  /** Jobs waiting or encoding, by cache key (for coalescing). */
  private readonly jobs = new Map<string, Job>();
  private running = false;

  constructor(private readonly encodeBatch: EncodeBatch, private readonly cache: EncodingCache,
    private readonly limits: EncodeQueueLimits = DEFAULT_ENCODE_QUEUE_LIMITS) {}

  /** The image's rows for the language model; rejects with `signal`'s reason once it aborts. */
  encode(owner: string, image: PreparedImage, signal?: AbortSignal): Promise<Float32Array> {
    const key = EncodingCache.key(owner, image.hash, image.gridH, image.gridW);
    const cached = this.cache.get(key);
    if (cached !== undefined) return Promise.resolve(cached);
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    return new Promise<Float32Array>((resolve, reject) => {
      let job = this.jobs.get(key);
      if (job === undefined) {
        job = { key, owner, image, waiters: new Set() };
        this.jobs.set(key, job);
        const queue = this.waiting.get(owner);
        if (queue === undefined) this.waiting.set(owner, [job]);
        else queue.push(job);
      }
      const waiter: Waiter = {
        resolve: (embeds) => { signal?.removeEventListener('abort', onAbort); resolve(embeds); },
        reject: (err) => { signal?.removeEventListener('abort', onAbort); reject(err); },
      };
      const theJob = job;
      const onAbort = () => {
        theJob.waiters.delete(waiter);
        reject(abortReason(signal!));
        // Nobody waits for it any more: a job not yet started leaves the queue.
        if (theJob.waiters.size === 0) this.dropIfWaiting(theJob);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      job.waiters.add(waiter);
      this.kick();
    });
  }

  /** Images waiting (not counting a batch being encoded). */
  get waitingImages(): number {
    let n = 0;
    for (const q of this.waiting.values()) n += q.length;
    return n;
  }

  private dropIfWaiting(job: Job): void {
    const queue = this.waiting.get(job.owner);
    const at = queue?.indexOf(job) ?? -1;
    if (at < 0) return;
    queue!.splice(at, 1);
    if (queue!.length === 0) this.waiting.delete(job.owner);
    this.jobs.delete(job.key);
  }

  /** The next batch: one image per owner in turn, within the limits; at least one image. */
  private nextBatch(): Job[] {
    const batch: Job[] = [];
    let pixels = 0;
    let full = false;
    while (!full && this.waiting.size > 0) {
      let took = false;
      for (const [owner, queue] of [...this.waiting]) {
        const job = queue[0]!;
        const size = job.image.resized.width * job.image.resized.height;
        if (batch.length > 0 && (batch.length >= this.limits.maxImages || pixels + size > this.limits.maxPixels)) {
          full = true;
          break;
        }
        queue.shift();
        // The owner goes to the back of the line for the next image.
        this.waiting.delete(owner);
        if (queue.length > 0) this.waiting.set(owner, queue);
        batch.push(job);
        pixels += size;
        took = true;
      }
      if (!took) break;
    }
    return batch;
  }

  private kick(): void {
    if (this.running || this.waiting.size === 0) return;
    this.running = true;
    void this.runBatch(this.nextBatch()).finally(() => {
      this.running = false;
      this.kick();
    });
  }

  private async runBatch(batch: Job[]): Promise<void> {
    let outputs: (Float32Array | Error)[];
    try {
      outputs = await this.encodeBatch(batch.map((j) => j.image));
    } catch (err) {
      if (batch.length === 1) {
        outputs = [err instanceof Error ? err : new Error(String(err))];
      } else {
        // One image's failure must not fail the others' requests: each alone, to find which.
        outputs = [];
        for (const job of batch) {
          try {
            outputs.push((await this.encodeBatch([job.image]))[0]!);
          } catch (one) {
            outputs.push(one instanceof Error ? one : new Error(String(one)));
          }
        }
      }
    }
    batch.forEach((job, k) => {
      this.jobs.delete(job.key);
      const out = outputs[k]!;
      if (!(out instanceof Error)) this.cache.set(job.key, out);
      for (const w of job.waiters) {
        if (out instanceof Error) w.reject(out);
        else w.resolve(out);
      }
    });
  }
}

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new SluiceError('cancelled', 'the request was cancelled');
}
