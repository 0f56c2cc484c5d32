// Resizing 8-bit RGB images exactly as Pillow's Image.resize does with BICUBIC or BILINEAR (the
// resamplings Hugging Face's slow image processors run through PIL: Qwen2-VL's bicubic, Gemma 3's
// bilinear): a separable
// convolution whose kernel support widens with the downscale factor (antialiasing), weights
// normalised per output pixel and turned into 22-bit fixed point, the horizontal pass first into
// an 8-bit image over the rows the vertical pass reads, then the vertical pass; each output is the
// rounded fixed-point sum clipped to 0..255. Written from the algorithm's description; checked
// pixel for pixel against Pillow (test/vision-preprocess.test.ts, fixtures from
// scripts/vision-golden.py).

/** Fixed-point fraction bits of Pillow's 8-bit path: 32 - 8 - 2 (headroom for the sums). */
const PRECISION_BITS = 22;
const ONE = 2 ** PRECISION_BITS;
const HALF = 2 ** (PRECISION_BITS - 1);

/** Pillow's bicubic kernel (a = -0.5), support 2. */
function bicubic(x: number): number {
  const a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

/** Pillow's bilinear (triangle) kernel, support 1. */
function bilinear(x: number): number {
  if (x < 0) x = -x;
  return x < 1 ? 1 - x : 0;
}

/** A Pillow resampling filter: its kernel and its support at scale 1 (widened by the downscale factor). */
interface Filter {
  kernel: (x: number) => number;
  support: number;
}

const BICUBIC: Filter = { kernel: bicubic, support: 2 };
const BILINEAR: Filter = { kernel: bilinear, support: 1 };

interface Coefficients {
  /** Per output position: the first input index and the number of taps. */
  first: Int32Array;
  count: Int32Array;
  /** [outSize, taps] fixed-point weights. */
  weights: Int32Array;
  taps: number;
}

/** The weights mapping inSize positions onto outSize (Pillow's precompute_coeffs, then its 8-bit normalisation). */
function coefficients(inSize: number, outSize: number, filter: Filter): Coefficients {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = filter.support * filterScale;
  const taps = Math.ceil(support) * 2 + 1;
  const first = new Int32Array(outSize), count = new Int32Array(outSize);
  const weights = new Int32Array(outSize * taps);
  const k = new Float64Array(taps);
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const ss = 1 / filterScale;
    // C's (int) casts: truncation towards zero.
    const xmin = Math.max(0, Math.trunc(center - support + 0.5));
    const xmax = Math.min(inSize, Math.trunc(center + support + 0.5)) - xmin;
    let ww = 0;
    for (let x = 0; x < xmax; x++) {
      const w = filter.kernel((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (let x = 0; x < xmax; x++) {
      const w = ww !== 0 ? k[x]! / ww : k[x]!;
      weights[xx * taps + x] = w < 0 ? Math.trunc(-0.5 + w * ONE) : Math.trunc(0.5 + w * ONE);
    }
    first[xx] = xmin;
    count[xx] = xmax;
  }
  return { first, count, weights, taps };
}

const clip8 = (sum: number): number => {
  const v = Math.floor(sum / ONE);
  return v < 0 ? 0 : v > 255 ? 255 : v;
};

/**
 * `rgb` ([height, width, 3] bytes, row-major) resized to outWidth x outHeight with Pillow's
 * BICUBIC: the same bytes `Image.fromarray(rgb).resize((outWidth, outHeight), Image.BICUBIC)`
 * gives (Pillow 9 and later). An unchanged size returns a copy.
 */
export function resizeBicubicRgb(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number): Uint8Array {
  return resizeRgb(rgb, width, height, outWidth, outHeight, BICUBIC, 'resizeBicubicRgb');
}

/**
 * `rgb` resized with Pillow's BILINEAR (resample 2): the same bytes
 * `Image.fromarray(rgb).resize((outWidth, outHeight), Image.BILINEAR)` gives (Pillow 9 and later),
 * the triangle kernel widened by the downscale factor as bicubic's is. An unchanged size returns a copy.
 */
export function resizeBilinearRgb(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number): Uint8Array {
  return resizeRgb(rgb, width, height, outWidth, outHeight, BILINEAR, 'resizeBilinearRgb');
}

/** Pillow's ImagingResample on 8-bit RGB with one filter (`name` for errors). */
function resizeRgb(rgb: Uint8Array, width: number, height: number, outWidth: number, outHeight: number, filter: Filter, name: string): Uint8Array {
  if (rgb.length !== width * height * 3) throw new Error(`${name}: ${rgb.length} bytes for a ${width}x${height} RGB image`);
  if (!(Number.isInteger(outWidth) && Number.isInteger(outHeight) && outWidth > 0 && outHeight > 0)) {
    throw new Error(`${name}: output size ${outWidth}x${outHeight}`);
  }
  const horizontal = outWidth !== width, vertical = outHeight !== height;
  if (!horizontal && !vertical) return rgb.slice();
  const h = coefficients(width, outWidth, filter);
  const v = coefficients(height, outHeight, filter);
  // The rows the vertical pass reads.
  const rowFirst = v.first[0]!;
  const rowEnd = v.first[outHeight - 1]! + v.count[outHeight - 1]!;

  let src = rgb, srcWidth = width, srcRow0 = 0;
  if (horizontal) {
    const rows = rowEnd - rowFirst;
    const tmp = new Uint8Array(rows * outWidth * 3);
    for (let y = 0; y < rows; y++) {
      const inRow = (y + rowFirst) * width * 3, outRow = y * outWidth * 3;
      for (let xx = 0; xx < outWidth; xx++) {
        const x0 = h.first[xx]!, n = h.count[xx]!, kb = xx * h.taps;
        let s0 = HALF, s1 = HALF, s2 = HALF;
        for (let x = 0; x < n; x++) {
          const w = h.weights[kb + x]!, p = inRow + (x0 + x) * 3;
          s0 += rgb[p]! * w;
          s1 += rgb[p + 1]! * w;
          s2 += rgb[p + 2]! * w;
        }
        const o = outRow + xx * 3;
        tmp[o] = clip8(s0);
        tmp[o + 1] = clip8(s1);
        tmp[o + 2] = clip8(s2);
      }
    }
    src = tmp;
    srcWidth = outWidth;
    srcRow0 = rowFirst;
  }
  if (!vertical) return src;
  const out = new Uint8Array(outHeight * srcWidth * 3);
  const rowBytes = srcWidth * 3;
  for (let yy = 0; yy < outHeight; yy++) {
    const y0 = v.first[yy]! - srcRow0, n = v.count[yy]!, kb = yy * v.taps;
    const outRow = yy * rowBytes;
    for (let i = 0; i < rowBytes; i++) {
      let s = HALF;
      for (let y = 0; y < n; y++) s += src[(y0 + y) * rowBytes + i]! * v.weights[kb + y]!;
      out[outRow + i] = clip8(s);
    }
  }
  return out;
}
