// Deterministic pseudo-random weights and float conversions (f32 -> bf16 / f16).
//
// Every tensor is cut into chunks of CHUNK_ELEMS elements; each chunk has its own PRNG state
// derived from (seed, tensor name, chunk index), so bytes never depend on how the work is split.

export const CHUNK_ELEMS = 1 << 20;

/** How a tensor is initialised: mean + std * z, z ~ approximately N(0, 1). */
export interface InitSpec {
  mean: number;
  std: number;
}

/** FNV-1a over the UTF-16 code units of `s`, then a murmur3 finaliser. */
export function hashString(s: string, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return fmix32(h);
}

export function fmix32(x: number): number {
  let h = x >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

const IH_SCALE = 1 / (65536 * Math.sqrt(1 / 3));
const IH_CENTER = 2 * 65535;

/**
 * Fill out[0..n) with mean + std * z, z = Irwin-Hall(4) of 16-bit uniforms scaled to unit
 * variance (bell shaped, bounded by +-3.46). PRNG: xoshiro128** seeded with splitmix32.
 */
export function fillChunk(out: Float32Array, n: number, chunkSeed: number, init: InitSpec): void {
  // splitmix32 seeding
  let sm = chunkSeed >>> 0;
  const next = () => {
    sm = (sm + 0x9e3779b9) >>> 0;
    let z = sm;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let s0 = next() | 0;
  let s1 = next() | 0;
  let s2 = next() | 0;
  let s3 = next() | 0;
  if ((s0 | s1 | s2 | s3) === 0) s0 = 1;
  const scale = init.std * IH_SCALE;
  const mean = init.mean;
  for (let i = 0; i < n; i++) {
    // two xoshiro128** outputs -> four 16-bit uniforms
    let r = Math.imul(s1, 5);
    r = Math.imul((r << 7) | (r >>> 25), 9);
    let t = s1 << 9;
    s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t; s3 = (s3 << 11) | (s3 >>> 21);
    let r2 = Math.imul(s1, 5);
    r2 = Math.imul((r2 << 7) | (r2 >>> 25), 9);
    t = s1 << 9;
    s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t; s3 = (s3 << 11) | (s3 >>> 21);
    const sum = (r & 0xffff) + (r >>> 16) + (r2 & 0xffff) + (r2 >>> 16);
    out[i] = mean + (sum - IH_CENTER) * scale;
  }
}

/** f32 -> bf16 with round-to-nearest-even (inputs are finite). */
export function f32ToBf16(src: Float32Array, dst: Uint16Array, n: number): void {
  const bits = new Uint32Array(src.buffer, src.byteOffset, n);
  for (let i = 0; i < n; i++) {
    const u = bits[i]!;
    dst[i] = (u + 0x7fff + ((u >>> 16) & 1)) >>> 16;
  }
}

/** One f32 bit pattern -> IEEE binary16 bits, round-to-nearest-even, with subnormals and inf. */
export function f32BitsToF16(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    const s = 14 - e;
    if (s > 24) return sign;
    const full = mant | 0x800000;
    let m = full >>> s;
    const rem = full & ((1 << s) - 1);
    const half = 1 << (s - 1);
    if (rem > half || (rem === half && (m & 1) === 1)) m++;
    return sign | m;
  }
  let m = mant >>> 13;
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (m & 1) === 1)) m++;
  return sign | ((e << 10) + m);
}

export function f32ToF16(src: Float32Array, dst: Uint16Array, n: number): void {
  const bits = new Uint32Array(src.buffer, src.byteOffset, n);
  for (let i = 0; i < n; i++) dst[i] = f32BitsToF16(bits[i]!);
}

/** Stored little-endian bytes of src[0..n) in `dtype` (f32 shares src's memory). */
export function toStoredBytes(src: Float32Array, n: number, dtype: 'f32' | 'f16' | 'bf16'): Uint8Array {
  if (dtype === 'f32') return new Uint8Array(src.buffer, src.byteOffset, n * 4);
  const out = new Uint16Array(n);
  if (dtype === 'bf16') f32ToBf16(src, out, n);
  else f32ToF16(src, out, n);
  return new Uint8Array(out.buffer);
}

/** Seed of chunk `chunk` of tensor `name`. */
export function chunkSeed(seed: number, name: string, chunk: number): number {
  return fmix32(hashString(name, seed) ^ Math.imul(chunk + 1, 0x9e3779b1));
}
