// The residency rules of LoRA adapters under a memory budget (src/engine/adapter-set.ts), over a
// recording stand-in for the native engine's load/retire (the real engine under a budget:
// test/lora-budget.test.ts). The adapter directories carry real safetensors headers (declaredAdapterBytes).
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

/** Records what the engine holds; loads and retirements resolve when `gate` lets them (immediately by default). Checks are logged too. */
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
  async check(dir: string) {
    const rank = Number(/r(\d+)$/.exec(dir)![1]);
    this.log.push(`check ${dir.slice(root.length + 1)}`);
    return { rank, bytes: 80 * rank };
  }
  async retire(id: number) {
    await this.gate;
    this.log.push(`retire ${this.resident.get(id)!.slice(root.length + 1)}`);
    this.resident.delete(id);
  }
}

describe('AdapterSet under a memory budget', () => {
  /** The log without the checks. */
  const moves = (native: RecordingNative) => native.log.filter((l) => !l.startsWith('check'));

  it('reads the size an adapter will take from its header', async () => {
    expect(await declaredAdapterBytes(adapterDir('a-r4', 4))).toBe(320);
    await expect(declaredAdapterBytes(join(root, 'absent'))).rejects.toMatchObject({ code: 'model_file_missing', param: 'dir' });
    const bad = join(root, 'bad');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'adapter_model.safetensors'), Buffer.from([1, 2, 3]));
    await expect(declaredAdapterBytes(bad)).rejects.toMatchObject({ code: 'model_file_invalid', param: 'dir' });
  });

  it('checks every adapter it adds, loads those that fit, and the rest on demand in place of the least recently used idle one', async () => {
    const native = new RecordingNative();
    // Room for two rank-4 adapters (320 bytes each).
    const set = new AdapterSet(native, 700);
    for (const n of ['a', 'b', 'c']) await set.add(n, adapterDir(`${n}-r4`, 4));
    expect(native.log).toEqual(['check a-r4', 'load a-r4', 'check b-r4', 'load b-r4', 'check c-r4']);
    expect(set.list().map((s) => [s.name, s.resident, s.bytes])).toEqual([['a', true, 320], ['b', true, 320], ['c', false, 320]]);
    expect(set.stats()).toMatchObject({ known: 3, resident: 2, residentBytes: 640, loads: 2, evictions: 0 });
    // c on demand: a, the least recently used, makes room.
    expect(set.tryAcquire('c')).toBeUndefined();
    (await set.acquire('c')).release();
    expect(moves(native).slice(2)).toEqual(['retire a-r4', 'load c-r4']);
    // b is used: a comes back in place of c, now the least recently used.
    set.tryAcquire('b')!.release();
    const lease = await set.acquire('a');
    expect(native.resident.get(lease.id)).toMatch(/a-r4$/);
    expect(moves(native).slice(4)).toEqual(['retire c-r4', 'load a-r4']);
    expect(set.list().map((s) => [s.name, s.resident, s.requests])).toEqual([['a', true, 1], ['b', true, 0], ['c', false, 0]]);
    lease.release();
    lease.release();  // releasing twice counts once
    expect(set.list()[0]!.requests).toBe(0);
    expect(set.stats()).toMatchObject({ residentBytes: 640, evictions: 2, loads: 4 });
  });

  it('never retires an adapter with requests: a load waits until one finishes, and its signal can end the wait', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));
    const holdA = set.tryAcquire('a')!;
    const holdB = set.tryAcquire('b')!;
    // Adding c while both are busy does not wait: it is checked, and loaded when asked for.
    expect(await set.add('c', adapterDir('c-r4', 4))).toMatchObject({ name: 'c', resident: false });

    const abort = new AbortController();
    const cancelled = set.acquire('c', abort.signal);
    await new Promise((r) => setTimeout(r, 10));
    abort.abort(new Error('client went away'));
    await expect(cancelled).rejects.toThrow('client went away');

    let got = false;
    const waiting = set.acquire('c').then((l) => { got = true; return l; });
    await new Promise((r) => setTimeout(r, 10));
    expect(got).toBe(false);
    holdB.release();
    const lease = await waiting;
    expect(native.resident.get(lease.id)).toMatch(/c-r4$/);
    expect(set.list().map((s) => [s.name, s.resident])).toEqual([['a', true], ['b', false], ['c', true]]);
    expect(set.stats()).toMatchObject({ residentBytes: 640, evictions: 1 });
    holdA.release();
    lease.release();
  });

  it('drains the least held busy adapter while a load waits: requests kept coming cannot keep another adapter out', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    for (const n of ['a', 'b', 'c']) await set.add(n, adapterDir(`${n}-r4`, 4));  // a, b resident
    // a has one request, b two: a load of c waits, and a (the fewest) takes no new request meanwhile.
    const a1 = set.tryAcquire('a')!;
    const b1 = set.tryAcquire('b')!, b2 = set.tryAcquire('b')!;
    const loadC = set.acquire('c');
    await new Promise((r) => setTimeout(r, 10));
    expect(set.tryAcquire('a')).toBeUndefined();
    const b3 = set.tryAcquire('b')!;  // b is not draining
    expect(b3).toBeDefined();
    // A request for a queues behind c's load; a's own request ending lets c in.
    const laterA = set.acquire('a');
    a1.release();
    const c = await loadC;
    expect(native.resident.get(c.id)).toMatch(/c-r4$/);
    expect(moves(native).slice(-2)).toEqual(['retire a-r4', 'load c-r4']);
    // a's queued request now waits for room in turn (b and c busy) and drains the least held: c.
    await new Promise((r) => setTimeout(r, 10));
    expect(set.tryAcquire('c')).toBeUndefined();
    c.release();
    const a = await laterA;
    expect(native.resident.get(a.id)).toMatch(/a-r4$/);
    for (const l of [a, b1, b2, b3]) l.release();
    // Nothing is left draining.
    set.tryAcquire('a')!.release();
    set.tryAcquire('b')!.release();
  });

  it('keeps at most 256 adapters resident (the engine\'s slots), budget or not, and knows at most 4096', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native);
    const dir = adapterDir('same-r1', 1);
    for (let i = 0; i < 257; i++) await set.add(`n${i}`, dir);
    expect(set.stats()).toMatchObject({ known: 257, resident: 256, evictions: 0 });
    expect(set.list()[256]).toMatchObject({ name: 'n256', resident: false });
    (await set.acquire('n256')).release();
    expect(set.stats()).toMatchObject({ resident: 256, evictions: 1 });
    expect(set.list()[0]).toMatchObject({ name: 'n0', resident: false });
    expect(native.resident.size).toBe(256);
    for (let i = 257; i < 4096; i++) await set.add(`n${i}`, dir);
    await expect(set.add('one-more', dir)).rejects.toThrow(/at most 4096/);
    expect(native.resident.size).toBe(256);
  }, 30_000);

  it('refuses an adapter larger than the whole budget, and a name taken', async () => {
    const set = new AdapterSet(new RecordingNative(), 700);
    await expect(set.add('big', adapterDir('big-r16', 16))).rejects.toMatchObject({ code: 'invalid_argument', param: 'dir' });
    expect(set.has('big')).toBe(false);
    await set.add('a', adapterDir('a-r4', 4));
    await expect(set.add('a', adapterDir('a-r4', 4))).rejects.toMatchObject({ code: 'invalid_argument', param: 'name' });
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

  it('a removal while a request loads the adapter refuses that request and retires the adapter', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 400);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));  // not resident: no room
    let open!: () => void;
    native.gate = new Promise((r) => (open = r));
    const loading = set.acquire('b');
    await new Promise((r) => setTimeout(r, 10));
    const removal = set.remove('b');
    open();
    await expect(loading).rejects.toMatchObject({ code: 'invalid_request', param: 'adapter' });
    await removal;
    expect([...native.resident.values()].some((d) => d.endsWith('b-r4'))).toBe(false);
    expect(set.stats()).toMatchObject({ known: 1, resident: 0, residentBytes: 0 });
  });

  it('a load waiting for room takes that of an adapter removed under its requests once they finish', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    for (const n of ['a', 'b', 'c']) await set.add(n, adapterDir(`${n}-r4`, 4));  // a, b resident
    const holdA = set.tryAcquire('a')!, holdB = set.tryAcquire('b')!;
    const loadC = set.acquire('c');  // waits for room, holding the lock
    await new Promise((r) => setTimeout(r, 10));
    const removal = set.remove('a');  // waits for a's request, then for the lock
    holdA.release();
    const c = await loadC;
    await removal;
    expect(moves(native).slice(-2)).toEqual(['retire a-r4', 'load c-r4']);
    expect(set.stats()).toMatchObject({ known: 2, resident: 2, residentBytes: 640, evictions: 0 });
    c.release();
    holdB.release();
  });

  it('fails the requests waiting for room when the engine is disposed', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 400);
    await set.add('a', adapterDir('a-r4', 4));
    await set.add('b', adapterDir('b-r4', 4));
    const hold = set.tryAcquire('a')!;
    const waiting = set.acquire('b');
    await new Promise((r) => setTimeout(r, 10));
    set.close();
    await expect(waiting).rejects.toMatchObject({ code: 'engine_disposed' });
    await expect(set.acquire('b')).rejects.toMatchObject({ code: 'engine_disposed' });
    hold.release();
  });

  it('loads an adapter asked for by many requests once', async () => {
    const native = new RecordingNative();
    const set = new AdapterSet(native, 700);
    for (const n of ['a', 'b', 'c']) await set.add(n, adapterDir(`${n}-r4`, 4));
    let open!: () => void;
    native.gate = new Promise((r) => (open = r));
    const leases = Promise.all([1, 2, 3, 4].map(() => set.acquire('c')));
    open();
    const got = await leases;
    expect(new Set(got.map((l) => l.id)).size).toBe(1);
    expect(native.log.filter((l) => l === 'load c-r4')).toHaveLength(1);
    expect(set.list().find((s) => s.name === 'c')!.requests).toBe(4);
    for (const l of got) l.release();
  });
});

describe('AdapterSet under random concurrent use', () => {
  it('never exceeds the budget, never retires a held adapter, and settles every request', async () => {
    let seed = 12345;
    const rand = (n: number) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
    const budget = 3 * 320 + 100;
    const held = new Map<number, number>();  // native id -> leases the test holds
    let residentBytes = 0;
    const violations: string[] = [];
    const sizes = new Map<number, number>();
    let nextId = 1;
    const native: NativeAdapters = {
      check: async (dir) => ({ rank: 4, bytes: dir.endsWith('big-r8') ? 640 : 320 }),
      load: async (dir) => {
        await new Promise((r) => setTimeout(r, rand(3)));
        const bytes = dir.endsWith('big-r8') ? 640 : 320;
        const id = nextId++;
        sizes.set(id, bytes);
        residentBytes += bytes;
        if (residentBytes > budget) violations.push(`over budget: ${residentBytes}`);
        return { id, rank: 4, bytes };
      },
      retire: async (id) => {
        if ((held.get(id) ?? 0) > 0) violations.push(`retired ${id} while held`);
        await new Promise((r) => setTimeout(r, rand(3)));
        residentBytes -= sizes.get(id)!;
      },
    };
    const set = new AdapterSet(native, budget);
    const dirs = ['p-r4', 'q-r4', 'big-r8'].map((d) => adapterDir(d, 4));
    const names: string[] = [];
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < 8; i++) {
      names.push(`x${i}`);
      await set.add(`x${i}`, dirs[i % 3]!);
    }
    for (let op = 0; op < 400; op++) {
      const name = names[rand(names.length)]!;
      const r = rand(20);
      if (r < 15) {
        // A request: hold for a few ms, then release.
        pending.push((async () => {
          const lease = set.tryAcquire(name) ?? await set.acquire(name);
          held.set(lease.id, (held.get(lease.id) ?? 0) + 1);
          await new Promise((res) => setTimeout(res, rand(5)));
          held.set(lease.id, held.get(lease.id)! - 1);
          lease.release();
        })().catch((err: { code?: string }) => {
          if (err.code !== 'invalid_request') violations.push(`request failed: ${String(err)}`);
        }));
      } else if (r < 17 && names.length > 2) {
        names.splice(names.indexOf(name), 1);
        pending.push(set.remove(name));
      } else if (r < 19) {
        const fresh = `y${op}`;
        pending.push(set.add(fresh, dirs[rand(3)]!).then(() => { names.push(fresh); }));
      }
      if (rand(4) === 0) await new Promise((res) => setTimeout(res, rand(2)));
    }
    await Promise.all(pending);
    expect(violations).toEqual([]);
    expect(set.stats().residentBytes).toBe(residentBytes);
    expect(residentBytes).toBeLessThanOrEqual(budget);
    expect(set.list().every((a) => a.requests === 0)).toBe(true);
    expect(set.stats().evictions).toBeGreaterThan(10);
  }, 30_000);
});
