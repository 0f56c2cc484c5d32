// AVX2 kernels for the two passes of Pillow's bicubic resize (resize_passes.h), giving exactly the
// bytes of the scalar passes. Compiled for baseline x86-64 with the AVX2 functions marked by a
// target attribute (so no inline function shared with baseline code is ever built for AVX2); the
// caller runs them only where cpu::simd_level() reports AVX2.
//
// Exactness: Pillow sums pixel * weight in int32 with 22-bit weights, which vpmaddwd (int16 x int16
// pairs) cannot take whole. Each weight is split as w = hi * 2^15 + lo with lo in [0, 2^15) and hi
// = w >> 15 (|hi| < 2^9), both int16; the kernels accumulate sum(p * hi) and sum(p * lo) with
// vpmaddwd and form (sum_hi << 15) + sum_lo + 2^21 at the end. Every step is int32 arithmetic
// modulo 2^32 and Pillow's true sum fits in int32, so the result is Pillow's sum, bit for bit;
// then the same floor shift by 22 and clip to 0..255 (packs + packus saturate exactly there).
#include "vision/resize_passes.h"

#if SLUICE_VISION_AVX2

#include <immintrin.h>

#define SLUICE_AVX2 __attribute__((target("avx2")))

namespace sluice::vision::detail {

namespace {

constexpr int32_t kHalf = int32_t(1) << (kPrecisionBits - 1);

inline int16_t weight_hi(int32_t w) { return int16_t(w >> 15); }
inline int16_t weight_lo(int32_t w) { return int16_t(w & 0x7fff); }

SLUICE_AVX2 inline __m256i combine(__m256i hi, __m256i lo) {
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 15), lo), _mm256_set1_epi32(kHalf));
  return _mm256_srai_epi32(sum, kPrecisionBits);
}

}  // namespace

// One output pixel at a time across its taps, four taps per vector: the 16 bytes from the first
// tap's pixel, broadcast to both 128-bit lanes, are shuffled to int16 pairs (R0 R1 G0 G1 B0 B1 0 0
// in the low lane, the same for taps 2 and 3 in the high one) and vpmaddwd'd with the matching
// weight pairs, giving int32 R G B 0 per lane. Taps past a pixel's count have weight 0, so the
// bytes they read only need to be readable. Four pixels are finished together (12 bytes, stored
// as 16).
std::vector<int16_t> horizontal_weights_avx2(const Coefficients& h) {
  const int groups = (h.taps + 3) / 4;
  const size_t out_width = h.first.size();
  // [out_width, groups, {hi, lo}, 16] int16: weight pairs as the shuffled pixels lie.
  std::vector<int16_t> kw(out_width * size_t(groups) * 32);
  for (size_t xx = 0; xx < out_width; xx++) {
    const int32_t* k = h.weights.data() + xx * size_t(h.taps);
    for (int g = 0; g < groups; g++) {
      int16_t* dst = kw.data() + (xx * size_t(groups) + size_t(g)) * 32;
      for (int lane = 0; lane < 2; lane++) {
        const int t = 4 * g + 2 * lane;
        const int32_t w0 = t < h.taps ? k[t] : 0, w1 = t + 1 < h.taps ? k[t + 1] : 0;
        for (int j = 0; j < 4; j++) {
          dst[lane * 8 + 2 * j] = weight_hi(w0);
          dst[lane * 8 + 2 * j + 1] = weight_hi(w1);
          dst[16 + lane * 8 + 2 * j] = weight_lo(w0);
          dst[16 + lane * 8 + 2 * j + 1] = weight_lo(w1);
        }
      }
    }
  }
  return kw;
}

namespace {

// G: the group count when fixed at compile time (2: windows of 5 to 8 taps, a Qwen2-VL resize's), else 0.
template <int G>
SLUICE_AVX2 inline __m256i horizontal_pixel(const uint8_t* in_row, const Coefficients& h, const int16_t* kw, int groups,
                                            int xx, __m256i to_pairs) {
  if (G) groups = G;
  const uint8_t* p = in_row + size_t(h.first[size_t(xx)]) * 3;
  const int16_t* k = kw + size_t(xx) * size_t(groups) * 32;
  __m256i acc_hi = _mm256_setzero_si256(), acc_lo = _mm256_setzero_si256();
  for (int g = 0; g < groups; g++, p += 12, k += 32) {
    const __m256i px = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), to_pairs);
    acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k))));
    acc_lo =
        _mm256_add_epi32(acc_lo, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16))));
  }
  return _mm256_add_epi32(_mm256_slli_epi32(acc_hi, 15), acc_lo);  // lanes: R G B 0 | R G B 0
}

inline void finish_pixel(const int32_t* sum, uint8_t* o) {  // sum[3] (without the half) as Pillow rounds
  for (int c = 0; c < 3; c++) {
    const int32_t v = (sum[c] + kHalf) >> kPrecisionBits;
    o[c] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

template <int G>
SLUICE_AVX2 void horizontal_row_impl(const uint8_t* in_row, size_t in_readable, const Coefficients& h,
                                     const std::vector<int16_t>& weights, uint8_t* out_row, int out_width) {
  const int groups = G ? G : (h.taps + 3) / 4;
  const int16_t* kw = weights.data();
  // Bytes past a pixel's first tap that its vector loads touch.
  const size_t reach = size_t(12) * size_t(groups - 1) + 16;
  const char z = char(0x80);
  const __m256i to_pairs = _mm256_setr_epi8(0, z, 3, z, 1, z, 4, z, 2, z, 5, z, z, z, z, z,  //
                                            6, z, 9, z, 7, z, 10, z, 8, z, 11, z, z, z, z, z);
  const __m128i pack12 = _mm_setr_epi8(0, 1, 2, 8, 9, 10, 4, 5, 6, 12, 13, 14, z, z, z, z);
  // Pixels whose loads stay in the buffer: all but maybe a few at the end of the image's last row.
  int vec_end = out_width;
  while (vec_end > 0 && size_t(h.first[size_t(vec_end) - 1]) * 3 + reach > in_readable) vec_end--;
  int xx = 0;
  for (; xx + 4 <= vec_end; xx += 4) {
    const __m256i a = horizontal_pixel<G>(in_row, h, kw, groups, xx, to_pairs);
    const __m256i b = horizontal_pixel<G>(in_row, h, kw, groups, xx + 1, to_pairs);
    const __m256i c = horizontal_pixel<G>(in_row, h, kw, groups, xx + 2, to_pairs);
    const __m256i d = horizontal_pixel<G>(in_row, h, kw, groups, xx + 3, to_pairs);
    const __m256i zero = _mm256_setzero_si256();
    const __m256i ab = combine(
        zero, _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)));
    const __m256i cd = combine(
        zero, _mm256_add_epi32(_mm256_permute2x128_si256(c, d, 0x20), _mm256_permute2x128_si256(c, d, 0x31)));
    const __m256i w16 = _mm256_packs_epi32(ab, cd);  // a c | b d
    const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_row + size_t(xx) * 3), _mm_shuffle_epi8(bytes, pack12));
  }
  for (; xx < vec_end; xx++) {
    const __m256i s = horizontal_pixel<G>(in_row, h, kw, groups, xx, to_pairs);
    alignas(16) int32_t sum[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(sum),
                    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
    finish_pixel(sum, out_row + size_t(xx) * 3);
  }
  for (; xx < out_width; xx++) {
    const uint8_t* p = in_row + size_t(h.first[size_t(xx)]) * 3;
    const int32_t* k = h.weights.data() + size_t(xx) * size_t(h.taps);
    int32_t sum[3] = {0, 0, 0};
    for (int x = 0; x < h.count[size_t(xx)]; x++)
      for (int c = 0; c < 3; c++) sum[c] += int32_t(p[size_t(x) * 3 + size_t(c)]) * k[x];
    finish_pixel(sum, out_row + size_t(xx) * 3);
  }
}

}  // namespace

SLUICE_AVX2 void horizontal_row_avx2(const uint8_t* in_row, size_t in_readable, const Coefficients& h,
                                     const std::vector<int16_t>& weights, uint8_t* out_row, int out_width) {
  if ((h.taps + 3) / 4 == 2)
    horizontal_row_impl<2>(in_row, in_readable, h, weights, out_row, out_width);
  else
    horizontal_row_impl<0>(in_row, in_readable, h, weights, out_row, out_width);
}

// 32 bytes of the output row at a time over its taps, two source rows per step: the rows' bytes
// interleaved and zero-extended give int16 pairs (row y, row y + 1) for vpmaddwd with that pair of
// weights. The unpacks work within 128-bit lanes, and packs/packus undo their order exactly.
SLUICE_AVX2 void vertical_row_avx2(const uint8_t* const* rows, const int32_t* k, int n, size_t row_bytes,
                                   uint8_t* out) {
  if (row_bytes < 32) {
    std::vector<int32_t> acc(row_bytes);
    vertical_row_scalar(rows, k, n, row_bytes, out, acc.data());
    return;
  }
  constexpr int kMaxPairs = 64;  // windows up to 128 rows (a 32x downscale); longer ones in chunks
  int32_t pair_hi[kMaxPairs], pair_lo[kMaxPairs];
  const uint8_t* row0[kMaxPairs];
  const uint8_t* row1[kMaxPairs];
  const int pairs = (n + 1) / 2;
  if (pairs > kMaxPairs) {
    std::vector<int32_t> acc(row_bytes);
    vertical_row_scalar(rows, k, n, row_bytes, out, acc.data());
    return;
  }
  for (int p = 0; p < pairs; p++) {
    const int32_t w0 = k[2 * p], w1 = 2 * p + 1 < n ? k[2 * p + 1] : 0;
    pair_hi[p] = int32_t(uint32_t(uint16_t(weight_hi(w0))) | (uint32_t(uint16_t(weight_hi(w1))) << 16));
    pair_lo[p] = int32_t(uint32_t(uint16_t(weight_lo(w0))) | (uint32_t(uint16_t(weight_lo(w1))) << 16));
    row0[p] = rows[2 * p];
    // An odd count's last pair repeats its row with weight 0 (and reads nothing new).
    row1[p] = rows[2 * p + 1 < n ? 2 * p + 1 : 2 * p];
  }
  const __m256i zero = _mm256_setzero_si256();
  for (size_t i = 0;; i += 32) {
    if (i + 32 > row_bytes) i = row_bytes - 32;  // the last block overlaps the one before
    __m256i h0 = zero, h1 = zero, h2 = zero, h3 = zero, l0 = zero, l1 = zero, l2 = zero, l3 = zero;
    for (int p = 0; p < pairs; p++) {
      const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0[p] + i));
      const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row1[p] + i));
      const __m256i kh = _mm256_set1_epi32(pair_hi[p]), kl = _mm256_set1_epi32(pair_lo[p]);
      const __m256i lo = _mm256_unpacklo_epi8(r0, r1), hi = _mm256_unpackhi_epi8(r0, r1);
      const __m256i q0 = _mm256_unpacklo_epi8(lo, zero), q1 = _mm256_unpackhi_epi8(lo, zero);
      const __m256i q2 = _mm256_unpacklo_epi8(hi, zero), q3 = _mm256_unpackhi_epi8(hi, zero);
      h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(q0, kh));
      h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(q1, kh));
      h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(q2, kh));
      h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(q3, kh));
      l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(q0, kl));
      l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(q1, kl));
      l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(q2, kl));
      l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(q3, kl));
    }
    // q0 holds bytes 0-3 | 16-19, q1 4-7 | 20-23, q2 8-11 | 24-27, q3 12-15 | 28-31.
    const __m256i w01 = _mm256_packs_epi32(combine(h0, l0), combine(h1, l1));  // 0-7 | 16-23
    const __m256i w23 = _mm256_packs_epi32(combine(h2, l2), combine(h3, l3));  // 8-15 | 24-31
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_packus_epi16(w01, w23));
    if (i + 32 >= row_bytes) break;
  }
}

}  // namespace sluice::vision::detail

#else  // no AVX2 kernels in this build: never called (SLUICE_VISION_AVX2 is 0 for the caller too)

namespace sluice::vision::detail {
std::vector<int16_t> horizontal_weights_avx2(const Coefficients&) { return {}; }
void horizontal_row_avx2(const uint8_t* in_row, size_t, const Coefficients& h, const std::vector<int16_t>&,
                         uint8_t* out_row, int out_width) {
  horizontal_row_scalar(in_row, h, out_row, out_width);
}
void vertical_row_avx2(const uint8_t* const* rows, const int32_t* k, int n, size_t row_bytes, uint8_t* out) {
  std::vector<int32_t> acc(row_bytes);
  vertical_row_scalar(rows, k, n, row_bytes, out, acc.data());
}
}  // namespace sluice::vision::detail

#endif
