// The LoRA adapters of one engine (issue 36): those it knows (name -> directory) and those resident
// in the native engine, whose f32 weights stay within a memory budget. A request naming an adapter
// that is not resident loads it, first retiring the least recently used idle adapters (no request
// of theirs accepted and not ended) until it fits; while every resident adapter is busy it waits
// for one to go idle, and the busy one with the fewest requests drains meanwhile: new requests for it
// queue behind the load instead of joining it, so that no tenant keeping its adapters busy can keep
// another's out forever. Loads and retirements run one at a time, in the engine's turn among steps.

import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { SluiceError } from '../errors.js';

/** The native engine's side: read and install an adapter; take one from new sequences; check one. */
export interface NativeAdapters {
  load(dir: string): Promise<{ id: number; rank: number; bytes: number }>;
  retire(id: number): Promise<void>;
  /** What load checks, without reading the matrices. */
  check(dir: string): Promise<{ rank: number; bytes: number }>;
}

export interface AdapterStatus {
  name: string;
  rank: number;
  /** Its weights in the engine (f32), resident or not. */
  bytes: number;
  resident: boolean;
  /** Requests of it accepted and not ended. */
  requests: number;
}

export interface AdapterSetStats {
  known: number;
  resident: number;
  residentBytes: number;
  /** Infinity: no budget. */
  budgetBytes: number;
  /** Loads into the engine since start (at start, on demand, by loadAdapter), and retirements to make room. */
  loads: number;
  evictions: number;
}

/** A request's hold on a resident adapter: it stays resident until released. */
export interface AdapterLease {
  readonly id: number;
  release(): void;
}

interface Entry {
  readonly name: string;
  readonly dir: string;
  rank: number;
  bytes: number;
  /** The native id while resident. */
  id: number | undefined;
  holds: number;
  lastUsed: number;
  removed: boolean;
  /** A load waits for it to go idle: new requests wait for the lock instead of holding it. */
  draining: boolean;
}

/** The native engine holds at most this many adapters at once (engine.cpp kMaxAdapters). */
export const MAX_RESIDENT_ADAPTERS = 256;
/** Adapters one engine knows (resident or not). */
export const MAX_KNOWN_ADAPTERS = 4096;

export class AdapterSet {
  private readonly entries = new Map<string, Entry>();
  private residentBytes = 0;
  /** Adapters in the native engine, removed ones still draining included (as in residentBytes). */
  private residentCount = 0;
  private clock = 0;
  private loads = 0;
  private evictions = 0;
  /** Loads and retirements, one at a time. */
  private lock: Promise<void> = Promise.resolve();
  /** Woken when an adapter goes idle or is removed (room may be made). */
  private idleWaiters: Array<() => void> = [];
  private readonly drainWaiters = new Map<Entry, Array<() => void>>();
  /** Removed adapters still resident (their requests finishing): retired by remove(), or by a load needing room. */
  private readonly leaving = new Set<Entry>();
  private closed = false;

  constructor(private readonly native: NativeAdapters | undefined, readonly budgetBytes = Infinity) {
    if (!(budgetBytes > 0)) throw new SluiceError('invalid_argument', 'loraMemoryBytes must be positive', { param: 'loraMemoryBytes' });
  }

  /** An adapter the engine loaded with itself (resident from the start). */
  adopt(name: string, dir: string, loaded: { id: number; rank: number; bytes: number }): void {
    this.entries.set(name, { name, dir, rank: loaded.rank, bytes: loaded.bytes, id: loaded.id, holds: 0, lastUsed: ++this.clock, removed: false, draining: false });
    this.residentBytes += loaded.bytes;
    this.residentCount++;
    this.loads++;
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  /**
   * Adds an adapter, checked (its config, tensor names, dtypes and shapes) and loaded when it fits
   * beside the resident ones without retiring any; otherwise loaded on demand. Errors name `dir`.
   */
  async add(name: string, dir: string): Promise<AdapterStatus> {
    const native = this.requireNative();
    this.checkAddable(name);
    const checked = await native.check(dir);
    if (checked.bytes > this.budgetBytes) throw this.tooLarge(checked.bytes);
    this.checkAddable(name);
    const entry: Entry = { name, dir, rank: checked.rank, bytes: checked.bytes, id: undefined, holds: 0, lastUsed: ++this.clock, removed: false, draining: false };
    this.entries.set(name, entry);
    await this.exclusive(async () => {
      if (entry.removed || this.residentBytes + entry.bytes > this.budgetBytes || this.residentCount >= MAX_RESIDENT_ADAPTERS) return;
      try {
        await this.install(entry, native);
      } catch (err) {
        if (this.entries.get(name) === entry) this.entries.delete(name);
        throw err;
      }
    });
    return this.status(entry);
  }

  private checkAddable(name: string): void {
    if (this.entries.has(name)) {
      throw new SluiceError('invalid_argument', `a LoRA adapter named ${JSON.stringify(name)} is loaded already`, { param: 'name' });
    }
    if (this.entries.size >= MAX_KNOWN_ADAPTERS) {
      throw new SluiceError('invalid_argument', `an engine serves at most ${MAX_KNOWN_ADAPTERS} LoRA adapters`, { param: 'name' });
    }
  }

  /**
   * Holds an adapter for a request without waiting, when it is resident; undefined when it must
   * be loaded first (acquire). invalid_request when no adapter has that name.
   */
  tryAcquire(name: string): AdapterLease | undefined {
    const entry = this.known(name);
    return entry.id === undefined || entry.draining ? undefined : this.hold(entry);
  }

  /** Holds an adapter for a request, loading it when it is not resident (see the module comment). */
  async acquire(name: string, signal?: AbortSignal): Promise<AdapterLease> {
    for (;;) {
      this.throwIfClosed();
      const entry = this.known(name);
      if (entry.id !== undefined && !entry.draining) return this.hold(entry);
      const native = this.requireNative();
      const lease = await this.exclusive(async () => {
        if (entry.removed) return undefined;
        if (entry.id === undefined) {
          await this.makeRoom(entry.bytes, signal);
          if (entry.removed) return undefined;
          await this.install(entry, native);
          // Removed while it loaded: the removal (queued behind this lock) retires it; never held.
          if (entry.removed) return undefined;
        }
        // Held before the lock is let go, so that the next load cannot take it back.
        return this.hold(entry);
      });
      if (lease) return lease;
    }
  }

  /**
   * Forgets an adapter: requests naming it are refused from now on; those holding it finish with it
   * first (this resolves after them and its retirement), so none is lost.
   */
  async remove(name: string): Promise<void> {
    const entry = this.known(name);
    entry.removed = true;
    this.entries.delete(name);
    if (entry.id !== undefined) this.leaving.add(entry);
    this.wakeIdle();
    if (entry.holds > 0) await new Promise<void>((resolve) => this.drainWaiters.set(entry, [...(this.drainWaiters.get(entry) ?? []), resolve]));
    // (A load waiting for room holds the lock meanwhile and may have retired it already.)
    await this.exclusive(async () => {
      if (entry.id !== undefined) await this.retire(entry);
    });
  }

  list(): AdapterStatus[] {
    return [...this.entries.values()].map((e) => this.status(e));
  }

  stats(): AdapterSetStats {
    return {
      known: this.entries.size, resident: this.residentCount, residentBytes: this.residentBytes, budgetBytes: this.budgetBytes,
      loads: this.loads, evictions: this.evictions,
    };
  }

  private status(e: Entry): AdapterStatus {
    return { name: e.name, rank: e.rank, bytes: e.bytes, resident: e.id !== undefined, requests: e.holds };
  }

  private known(name: string): Entry {
    const entry = this.entries.get(name);
    if (!entry) throw new SluiceError('invalid_request', `no LoRA adapter ${JSON.stringify(name)} is loaded with this engine`, { param: 'adapter' });
    return entry;
  }

  private requireNative(): NativeAdapters {
    if (!this.native) {
      throw new SluiceError('invalid_argument', 'adapters are loaded while serving only into engines with serial steps (overlapSteps: false)',
        { param: 'adapter' });
    }
    return this.native;
  }

  private tooLarge(bytes: number): SluiceError {
    return new SluiceError('invalid_argument',
      `the adapter needs ${bytes} bytes, more than the LoRA memory budget of ${this.budgetBytes} bytes (loraMemoryBytes)`, { param: 'dir' });
  }

  private hold(entry: Entry): AdapterLease {
    entry.holds++;
    entry.lastUsed = ++this.clock;
    const id = entry.id!;
    let released = false;
    return {
      id,
      release: () => {
        if (released) return;
        released = true;
        if (--entry.holds > 0) return;
        for (const wake of this.drainWaiters.get(entry) ?? []) wake();
        this.drainWaiters.delete(entry);
        this.wakeIdle();
      },
    };
  }

  private async install(entry: Entry, native: NativeAdapters): Promise<void> {
    const loaded = await native.load(entry.dir);
    entry.id = loaded.id;
    entry.rank = loaded.rank;
    entry.bytes = loaded.bytes;
    this.residentBytes += loaded.bytes;
    this.residentCount++;
    this.loads++;
  }

  private async retire(entry: Entry): Promise<void> {
    const id = entry.id!;
    this.leaving.delete(entry);
    // Not resident from here on: a request finds it missing and waits for the lock to load it again.
    entry.id = undefined;
    entry.draining = false;
    try {
      await this.native!.retire(id);
    } finally {
      this.residentBytes -= entry.bytes;
      this.residentCount--;
    }
  }

  /**
   * Retires idle adapters, least recently used first, until `bytes` more fit (called holding the
   * lock). While none is idle, the busy one with the fewest requests drains until it is.
   */
  private async makeRoom(bytes: number, signal: AbortSignal | undefined): Promise<void> {
    try {
      while (this.residentBytes + bytes > this.budgetBytes || this.residentCount >= MAX_RESIDENT_ADAPTERS) {
        signal?.throwIfAborted();
        this.throwIfClosed();
        // A removed adapter whose requests have finished goes first (its removal is waiting for the lock).
        const gone = [...this.leaving].find((e) => e.holds === 0);
        if (gone) {
          await this.retire(gone);
          continue;
        }
        let victim: Entry | undefined;
        for (const e of this.entries.values()) {
          if (e.id !== undefined && e.holds === 0 && (!victim || e.lastUsed < victim.lastUsed)) victim = e;
        }
        if (victim) {
          await this.retire(victim);
          this.evictions++;
          continue;
        }
        let drain: Entry | undefined;
        for (const e of this.entries.values()) {
          if (e.id !== undefined && (!drain || e.holds < drain.holds || (e.holds === drain.holds && e.lastUsed < drain.lastUsed))) drain = e;
        }
        if (drain) drain.draining = true;
        // Every resident adapter has requests running: wait for one to finish.
        await new Promise<void>((resolve, reject) => {
          const onAbort = () => reject(signal!.reason);
          signal?.addEventListener('abort', onAbort, { once: true });
          this.idleWaiters.push(() => {
            signal?.removeEventListener('abort', onAbort);
            resolve();
          });
        });
      }
    } finally {
      for (const e of this.entries.values()) e.draining = false;
    }
  }

  /** The engine is disposed: requests waiting for room (and later ones) fail with engine_disposed. */
  close(): void {
    this.closed = true;
    this.wakeIdle();
  }

  private throwIfClosed(): void {
    if (this.closed) throw new SluiceError('engine_disposed', 'the engine has been disposed');
  }

  private wakeIdle(): void {
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const wake of waiters) wake();
  }

  private async exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const previous = this.lock;
    let done!: () => void;
    this.lock = new Promise<void>((resolve) => (done = resolve));
    await previous;
    try {
      return await fn();
    } finally {
      done();
    }
  }
}

/** Headers over this are refused (a PEFT adapter's header is a few kilobytes per layer). */
const MAX_HEADER_BYTES = 64 * 1024 * 1024;

/**
 * The f32 bytes an adapter's lora_A / lora_B tensors take once loaded, from its safetensors header
 * (what the engine will hold: the file may store them in bf16). model_file_missing/_invalid name `dir`.
 */
export async function declaredAdapterBytes(dir: string): Promise<number> {
  const path = join(dir, 'adapter_model.safetensors');
  const file = await open(path, 'r').catch(() => {
    throw new SluiceError('model_file_missing', `${path} does not exist or cannot be read`, { param: 'dir' });
  });
  try {
    const invalid = (why: string) => new SluiceError('model_file_invalid', `${path}: ${why}`, { param: 'dir' });
    const size = Buffer.alloc(8);
    if ((await file.read(size, 0, 8, 0)).bytesRead !== 8) throw invalid('shorter than a safetensors header');
    const headerBytes = Number(size.readBigUInt64LE(0));
    if (headerBytes < 2 || headerBytes > MAX_HEADER_BYTES) throw invalid(`header of ${headerBytes} bytes`);
    const header = Buffer.alloc(headerBytes);
    if ((await file.read(header, 0, headerBytes, 8)).bytesRead !== headerBytes) throw invalid('truncated header');
    let tensors: Record<string, { shape?: unknown }>;
    try {
      tensors = JSON.parse(header.toString('utf8')) as typeof tensors;
    } catch {
      throw invalid('the header is not JSON');
    }
    let bytes = 0;
    for (const [name, t] of Object.entries(tensors)) {
      if (!/\.lora_[AB]\b/.test(name) || !Array.isArray(t?.shape)) continue;
      bytes += 4 * (t.shape as unknown[]).reduce<number>((n, d) => n * (typeof d === 'number' && d >= 0 ? d : NaN), 1);
    }
    if (!Number.isFinite(bytes)) throw invalid('a tensor shape is not a list of sizes');
    return bytes;
  } finally {
    await file.close();
  }
}
