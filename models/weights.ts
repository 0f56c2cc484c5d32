// Deterministic pseudo-random weights, float conversions (f32 -> bf16 / f16) and MXFP4 packing.
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

/**
 * Nibble of the FP4 e2m1 value nearest to x (|x| <= 6): bit 3 the sign, magnitude codes 0..7 for
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code (round to nearest even).
 */
export function e2m1Code(x: number): number {
  const a = Math.abs(x);
  let m: number;
  if (a <= 0.25) m = 0;
  else if (a < 0.75) m = 1;
  else if (a <= 1.25) m = 2;
  else if (a < 1.75) m = 3;
  else if (a <= 2.5) m = 4;
  else if (a < 3.5) m = 5;
  else if (a <= 5) m = 6;
  else m = 7;
  return (x < 0 ? 8 : 0) | m;
}

/** MXFP4 scale byte (e8m0, 2^(s - 127)) of a block: the smallest s whose 6 * 2^(s - 127) holds maxAbs. */
export function mxfp4ScaleByte(maxAbs: number): number {
  if (!(maxAbs > 0)) return 0;
  let s = 127 + Math.ceil(Math.log2(maxAbs / 6));
  // log2 may land one off at powers of two: settle on the exact smallest.
  while (s < 254 && 6 * Math.pow(2, s - 127) < maxAbs) s++;
  while (s > 0 && 6 * Math.pow(2, s - 128) >= maxAbs) s--;
  return Math.min(254, Math.max(0, s));
}

/**
 * MXFP4 as gpt-oss stores its experts: src[0..n) (n a multiple of 32, rows a multiple of 32 long)
 * in blocks of 32 values sharing a scale byte s; each value is the nibble of value / 2^(s - 127).
 * 'blocks': 16 bytes a block, value 2j in byte j's low nibble, 2j + 1 in its high nibble;
 * 'scales': one byte a block.
 */
export function packMxfp4(src: Float32Array, n: number, part: 'blocks' | 'scales'): Uint8Array {
  if (n % 32 !== 0) throw new Error(`MXFP4 packs whole blocks of 32 values, got ${n}`);
  const blocks = n / 32;
  const out = new Uint8Array(part === 'blocks' ? n / 2 : blocks);
  for (let b = 0; b < blocks; b++) {
    const at = b * 32;
    let max = 0;
    for (let i = 0; i < 32; i++) max = Math.max(max, Math.abs(src[at + i]!));
    const s = mxfp4ScaleByte(max);
    if (part === 'scales') {
      out[b] = s;
      continue;
    }
    const inv = Math.pow(2, 127 - s);
    for (let j = 0; j < 16; j++) {
      out[b * 16 + j] = e2m1Code(src[at + 2 * j]! * inv) | (e2m1Code(src[at + 2 * j + 1]! * inv) << 4);
    }
  }
  return out;
}

/** Stored bytes of a drawn chunk: in `dtype`, or one half of its MXFP4 packing. */
export function chunkBytes(src: Float32Array, n: number, dtype: 'f32' | 'f16' | 'bf16', pack?: 'blocks' | 'scales'): Uint8Array {
  return pack ? packMxfp4(src, n, pack) : toStoredBytes(src, n, dtype);
}

/** Seed of chunk `chunk` of tensor `name`. */
export function chunkSeed(seed: number, name: string, chunk: number): number {
  return fmix32(hashString(name, seed) ^ Math.imul(chunk + 1, 0x9e3779b1));
}
