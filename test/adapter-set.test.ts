// The residency rules of LoRA adapters under a memory budget (src/engine/adapter-set.ts), over a
// recording stand-in for the native engine's load/retire (the real engine under a budget:
// test/lora-budget.test.ts). Adapter files are real PEFT headers: their declared size is read.
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { AdapterSet, declaredAdapterBytes, type NativeAdapters } from '../src/engine/adapter-set.js';

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(os.tmpdir(), 'sluice-adapter-set-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** An adapter directory whose header declares lora_A [r, 10] and lora_B [10, r] for one projection (80 r f32 bytes). */
function adapterDir(name: string, rank: number): string {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  const header = Buffer.from(JSON.stringify({
    'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': { dtype: 'F32', shape: [rank, 10], data_offsets: [0, 40 * rank] },
    'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': { dtype: 'F32', shape: [10, rank], data_offsets: [40 * rank, 80 * rank] },
    __metadata__: { format: 'pt' },
  }));
  const size = Buffer.alloc(8);
  size.writeBigUInt64LE(BigInt(header.length));
  writeFileSync(join(dir, 'adapter_model.safetensors'), Buffer.concat([size, header, Buffer.alloc(80 * rank)]));
  return dir;
}

/** Records what the engine holds; loads and retirements resolve when `gate` lets them (immediately by default). */
class RecordingNative implements NativeAdapters {
  readonly resident = new Map<number, string>();
  readonly log: string[] = [];
  private nextId = 1;
  gate: Promise<void> = Promise.resolve();
  async load(dir: string) {
    await this.gate;
    const rank = Number(/r(\d+)$/.exec(dir)![1]);
    const id = this.nextId++;
    this.resident.set(id, dir);
    this.log.push(`load ${dir.slice(root.length + 1)}`);
    return { id, rank, bytes: 80 * rank };
  }
  async retire(id: number) {
    await this.gate;
    this.log.push(`retire ${this.resident.get(id)!.slice(root.length + 1)}`);
    this.resident.delete(id);
  }
}

describe('AdapterSet under a memory budget', () => {
  it('reads the size an adapter will take from its header', async () => {
    expect(await declaredAdapterBytes(adapterDir('a-r4', 4))).toBe(320);
    await expect(declaredAdapterBytes(join(root, 'absent'))).rejects.toMatchObject({ code: 'model_file_missing', param: 'dir' });
    const bad = join(root, 'bad');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'adapter_model.safetensors'), Buffer.from([1, 2, 3]));
    await expect(declaredAdapterBytes(bad)).rejects.toMatchObject({ code: 'model_file_invalid', param: 'dir' });
  });

  it('retires the least recently used idle adapter to make room, and loads a retired one again on demand', async () => {
    const native = new RecordingNative();
    // Room for two rank-4 adapters (320 bytes each).
    const set = new AdapterSet(native, 700);
    for (const n of ['a', 'b', 'c']) await set.add(n, adapterDir(`${n}-r4`, 4));
    // Adding c retired a, the least recently used.
    expect(native.log).toEqual(['load a-r4', 'load b-r4', 'retire a-r4', 'load c-r4']);
    expect(set.stats()).toMatchObject({ known: 3, resident: 2, residentBytes: 640, loads: 3, evictions: 1 });
    // b is used: a comes back in place of c, now the least recently used.
    set.tryAcquire('b')!.release();
    expect(set.tryAcquire('a')).toBeUndefined();
    const lease = await set.acquire('a');
    expect(native.resident.get(lease.id)).toMatch(/a-r4$/);
    expect(native.log.slice(4)).toEqual(['retire c-r4', 'load a-r4']);
    expect(set.list().map((s) => [s.name, s.resident, s.requests])).toEqual([['a', true, 1], ['b', true, 0], ['c', false, 0]]);
    lease.release();
    lease.release();  // releasing twice counts once
    expect(set.list()[0]!.requests).toBe(0);
    expect(set.stats().residentBytes).toBeLessThanOrEqual(700);
  });

  it('never retires an adapter with requests: a load waits until one finishes, and its signal can end the wait', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));
    const holdA = set.tryAcquire('a')!;
    const holdB = set.tryAcquire('b')!;
    // Both busy: adding c waits for one of them to go idle.
    let added = false;
    const adding = set.add('c', adapterDir('c-r4', 4)).then(() => { added = true; });
    await new Promise((r) => setTimeout(r, 10));
    expect(added).toBe(false);
    expect(native.log).toEqual(['load a-r4', 'load b-r4']);
    holdB.release();
    await adding;
    expect(native.log.slice(2)).toEqual(['retire b-r4', 'load c-r4']);

    // Now a and c are busy; a request for b waits, and its signal ends the wait.
    const holdC = set.tryAcquire('c')!;
    const abort = new AbortController();
    const cancelled = set.acquire('b', abort.signal);
    await new Promise((r) => setTimeout(r, 10));
    abort.abort(new Error('client went away'));
    await expect(cancelled).rejects.toThrow('client went away');

    let got = false;
    const waiting = set.acquire('b').then((l) => { got = true; return l; });
    await new Promise((r) => setTimeout(r, 10));
    expect(got).toBe(false);
    holdA.release();
    const lease = await waiting;
    expect(native.resident.get(lease.id)).toMatch(/b-r4$/);
    expect(set.list().map((s) => [s.name, s.resident])).toEqual([['a', false], ['b', true], ['c', true]]);
    expect(set.stats()).toMatchObject({ residentBytes: 640, evictions: 2 });
    holdC.release();
    lease.release();
  });

  it('drains the least held busy adapter while a load waits: requests kept coming cannot keep another adapter out', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));
    await set.add('c', adapterDir('c-r4', 4));  // a retired
    // b has one request, c two: a load of a waits, and b (the fewest) takes no new request meanwhile.
    const b1 = set.tryAcquire('b')!;
    const c1 = set.tryAcquire('c')!, c2 = set.tryAcquire('c')!;
    const loadA = set.acquire('a');
    await new Promise((r) => setTimeout(r, 10));
    expect(set.tryAcquire('b')).toBeUndefined();
    const c3 = set.tryAcquire('c')!;  // c is not draining
    expect(c3).toBeDefined();
    // A request for b queues behind a's load; b's own request ending lets a in.
    const laterB = set.acquire('b');
    b1.release();
    const a = await loadA;
    expect(native.resident.get(a.id)).toMatch(/a-r4$/);
    expect(native.log.slice(-2)).toEqual(['retire b-r4', 'load a-r4']);
    // b's queued request now waits for room in turn (a and c busy) and drains the least held of them.
    await new Promise((r) => setTimeout(r, 10));
    expect(set.tryAcquire('a')).toBeUndefined();
    a.release();
    const b = await laterB;
    expect(native.resident.get(b.id)).toMatch(/b-r4$/);
    for (const l of [b, c1, c2, c3]) l.release();
    // Nothing is left draining.
    set.tryAcquire('c')!.release();
    set.tryAcquire('b')!.release();
  });

  it('keeps at most 256 adapters resident (the engine\'s slots), budget or not, and knows at most 4096', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native);
    const dir = adapterDir('same-r1', 1);
    for (let i = 0; i < 257; i++) await set.add(`n${i}`, dir);
    expect(set.stats()).toMatchObject({ known: 257, resident: 256, evictions: 1 });
    expect(native.resident.size).toBe(256);
    expect(set.list()[0]).toMatchObject({ name: 'n0', resident: false });
    for (let i = 257; i < 4096; i++) await set.add(`n${i}`, dir);
    await expect(set.add('one-more', dir)).rejects.toThrow(/at most 4096/);
    expect(native.resident.size).toBe(256);
  }, 30_000);

  it('refuses an adapter larger than the whole budget', async () => {
    const set = new AdapterSet(new RecordingNative(), 700);
    await expect(set.add('big', adapterDir('big-r16', 16))).rejects.toMatchObject({ code: 'invalid_argument', param: 'dir' });
    expect(set.has('big')).toBe(false);
    expect(() => new AdapterSet(new RecordingNative(), 0)).toThrow(/positive/);
  });

  it('a removal waits for the requests holding the adapter, then retires it; requests after it are refused', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 10_000);
    await set.add('a', adapterDir('a-r4', 4));
    const lease = set.tryAcquire('a')!;
    let removed = false;
    const removal = set.remove('a').then(() => { removed = true; });
    expect(() => set.tryAcquire('a')).toThrow(/no LoRA adapter "a"/);
    await new Promise((r) => setTimeout(r, 10));
    expect(removed).toBe(false);
    expect(native.resident.size).toBe(1);
    lease.release();
    await removal;
    expect(native.resident.size).toBe(0);
    expect(set.stats()).toMatchObject({ known: 0, resident: 0, residentBytes: 0 });
  });

  it('loads an adapter asked for by many requests once', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));
    await set.add('c', adapterDir('c-r4', 4));
    let open!: () => void;
    native.gate = new Promise((r) => (open = r));
    const leases = Promise.all([1, 2, 3, 4].map(() => set.acquire('a')));
    open();
    const got = await leases;
    expect(new Set(got.map((l) => l.id)).size).toBe(1);
    expect(native.log.filter((l) => l === 'load a-r4')).toHaveLength(2);  // at add, and once again now
    expect(set.list().find((s) => s.name === 'a')!.requests).toBe(4);
    for (const l of got) l.release();
  });
});
