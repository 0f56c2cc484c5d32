// The only module that loads the compiled addon (build/Release/sluice.node).
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { NativeEngineHandle, NativeLoadOptions } from './native-types.js';

/** The native grammar engine (native/src/grammar, native/addon/grammar_addon.cpp). */
export interface NativeGrammarVocabulary { readonly size: number }
export interface NativeCompiledGrammar { readonly bytes: number; readonly positions: number }
export interface NativeGrammarMatcher {
  accept(token: number): boolean;
  canEnd(): boolean;
  ended(): boolean;
  fillMask(out: Uint32Array, offset: number): void;
  /** Copies the last mask when the state has not moved since it was computed; false (nothing written) otherwise. */
  fillMaskIfUnchanged(out: Uint32Array, offset: number): boolean;
  /** Fills the mask here when its work is at most `budget` (see token_matcher.h): the work done, or -1 (nothing written). */
  fillMaskWithin(out: Uint32Array, offset: number, budget: number): number;
  /** Speculative decoding: how many of `tokens` (at most 64) the grammar accepts in a row; the state is unchanged. */
  countAhead(tokens: Int32Array): number;
}

interface NativeAddon {
  grammarVocabulary(bytes: Uint8Array, offsets: Uint32Array, stopIds: Int32Array): Promise<unknown>;
  GrammarVocabulary: new (handle: unknown) => NativeGrammarVocabulary;
  compileGrammar(vocabulary: NativeGrammarVocabulary, text: string, timeoutMs: number): Promise<unknown>;
  CompiledGrammar: new (handle: unknown) => NativeCompiledGrammar;
  GrammarMatcher: new (grammar: NativeCompiledGrammar) => NativeGrammarMatcher;
  /**
   * The matchers' masks at out[offsets[r]..]; with `tokens` (flat) and `counts`, matcher r fills
   * 1 + counts[r] masks, those after each prefix of its drafts (speculative decoding).
   */
  fillGrammarMasks(matchers: NativeGrammarMatcher[], out: Uint32Array, offsets: Uint32Array, tokens?: Int32Array,
    counts?: Uint32Array): Promise<Int32Array>;
  load(options: NativeLoadOptions): Promise<NativeEngineHandle>;
  measureMemoryBandwidth(numThreads: number, bytes: number, repeats: number, keepBuffer: boolean): Promise<number>;
  measureDeviceBandwidth(bytes: number, repeats: number): Promise<number>;
  cudaUnavailableReason(): string;
  simdLevel(): string;
  cudaCompiled: boolean;
  /** Pillow's bicubic resize and the Qwen2-VL patch rows on the libuv pool (native/addon/vision_addon.cpp). */
  qwen2VlPatches(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number, patch: number,
    merge: number, temporal: number, tables: Float32Array): Promise<Float32Array>;
  /** Pillow's bilinear resize and Gemma 3's channels-first pixel values on the libuv pool (native/addon/vision_addon.cpp). */
  gemma3Pixels(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number, tables: Float32Array): Promise<Float32Array>;
  /**
   * Pillow's resize (bicubic or bilinear) of an RGB image and the SHA-256 of the result, on the
   * libuv pool; the pixels stay native (native/src/vision/resized_image.h).
   */
  resizeImage(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number,
    filter: 'bicubic' | 'bilinear'): Promise<NativeImage>;
  /**
   * The vision tower config.json's architecture names, on the CPU (native/addon/vision_addon.cpp):
   * Qwen2.5-VL's, or Gemma 3's SigLIP tower and projector; numThreads 0: all CPUs.
   */
  /** cudaDevice >= 0 (a CUDA build): encodeImage(s) run the tower on that device; encode() stays on the CPU. */
  loadVisionEncoder(modelDir: string, numThreads: number, cudaDevice?: number): Promise<NativeVisionEncoder>;
}

/**
 * A loaded vision encoder, one encode at a time: one image -> [tokens * outHidden]. Qwen2.5-VL: its
 * patch rows, grid [t, h, w] in patches. Gemma 3: pixel values [3, S, S] (S = image_size), grid
 * [1, S / patch, S / patch]; mm_tokens_per_image tokens.
 */
export interface NativeVisionEncoder {
  readonly outHidden: number;
  /** Where encodeImage(s) run the tower. */
  readonly device: 'cpu' | 'cuda';
  encode(pixelValues: Float32Array, grid: readonly [t: number, h: number, w: number]): Promise<Float32Array>;
  /**
   * A resized image laid out as the tower reads it (Qwen2.5-VL's patch rows with the tower's own
   * patch, merge and temporal sizes; SigLIP's channels first), a value being tables[channel * 256 +
   * byte], and encoded; the layout is made on the vision thread, never as a JS array.
   */
  encodeImage(image: NativeImage, tables: Float32Array): Promise<Float32Array>;
  /** encodeImage of 1 to 256 images in one pass of the tower (the same values as one at a time). */
  encodeImages(images: readonly NativeImage[], tables: Float32Array): Promise<Float32Array[]>;
  dispose(): void;
}

/**
 * An image resized for a vision tower, held natively: 8-bit RGB, [height, width, 3]. Its memory is
 * reported to V8 and freed with the object.
 */
export interface NativeImage {
  readonly width: number;
  readonly height: number;
  /** SHA-256 of width and height (u32 little-endian each) and the pixels. */
  readonly hash: Uint8Array;
  readonly byteLength: number;
  /** A copy of the pixels (references and tests). */
  pixels(): Uint8Array;
}

let addon: NativeAddon | undefined;

/**
 * Finds the package root from this file (src/native under vitest, dist/src/native when built): in a
 * checkout, the checkout; where sluice is installed, node_modules/sluice, whose install script built
 * the addon under its own build/ (scripts/build-native.js). No environment variable is needed.
 */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    dir = dirname(dir);
  }
  throw new Error('cannot locate the sluice package root');
}

/** Where the addon is looked for, first match wins: SLUICE_ADDON (a prebuilt addon), then the package's own build. */
function addonCandidates(root: string): string[] {
  return [process.env['SLUICE_ADDON'], join(root, 'build', 'Release', 'sluice.node'), join(root, 'build', 'Debug', 'sluice.node')]
    .filter((p): p is string => !!p);
}

/**
 * What to run when no addon is found. An installed package (under node_modules) has no build:native
 * script a host could run, but npm rebuilds it with the same install script that built it.
 */
export function addonMissingMessage(root: string, candidates: readonly string[]): string {
  const installed = root.split(/[\\/]/).includes('node_modules');
  const howToBuild = installed
    ? 'run `npm rebuild sluice` in your app (it builds the addon from the shipped sources: CMake and a C++17 compiler; SLUICE_CUDA=OFF skips the CUDA backend)'
    : 'run `npm run build:native` in this checkout (or `npm ci`, which builds it)';
  return `the native addon is not built (looked for ${candidates.join(', ')}): ${howToBuild}, or set SLUICE_ADDON to a prebuilt sluice.node`;
}

export function nativeAddon(): NativeAddon {
  if (addon) return addon;
  const root = packageRoot();
  const candidates = addonCandidates(root);
  const path = candidates.find((p) => existsSync(p));
  if (!path) throw Object.assign(new Error(addonMissingMessage(root, candidates)), { code: 'ADDON_MISSING' });
  addon = createRequire(import.meta.url)(path) as NativeAddon;
  return addon;
}

/** Undefined when the addon loads, else why not (with what to run). */
export function nativeUnavailableReason(): string | undefined {
  try {
    nativeAddon();
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}

export function nativeAvailable(): boolean {
  return nativeUnavailableReason() === undefined;
}

export function loadNativeEngine(options: NativeLoadOptions): Promise<NativeEngineHandle> {
  return nativeAddon().load(options);
}

/** CUDA device-to-device copy bandwidth in bytes/s (bytes read + written). */
export function measureDeviceBandwidth(bytes = 2 ** 30, repeats = 10): Promise<number> {
  return nativeAddon().measureDeviceBandwidth(bytes, repeats);
}

/** Undefined when the CUDA backend is compiled in and a device is usable, else the reason. */
export function cudaUnavailableReason(): string | undefined {
  return nativeAddon().cudaUnavailableReason() || undefined;
}

/**
 * Streaming read bandwidth of main memory in bytes/s, best of `repeats`; each of `numThreads`
 * threads (0: one per CPU) streams its contiguous slice. bytes 0: max(1 GiB, 8 x last-level cache).
 * keepBuffer: the filled buffer stays for the next call of the same size (false frees it).
 */
export function measureMemoryBandwidth(numThreads = 0, bytes = 0, repeats = 5, keepBuffer = false): Promise<number> {
  return nativeAddon().measureMemoryBandwidth(numThreads, bytes, repeats, keepBuffer);
}
