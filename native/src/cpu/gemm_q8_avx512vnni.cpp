// AVX512-VNNI Q8_0 matmul: one zmm holds two 32-blocks. vpdpbusd multiplies x + 128 (u8) by w
// (s8) into 16 exact int32 lanes, starting from -128 * sum(w) so the offset cancels exactly
// (lanes 0-7: block 2p, 8-15: block 2p + 1); the lanes are converted and scaled by dx * dw into one
// 16-lane f32 accumulator per output, reduced once at the end (see gemm_q8.h, gemm.h).
// Decode (small T) streams every weight row once, several far-apart rows per tile; prefill keeps
// a block of weight rows in L2 while 4-row activation tiles pass over it.
// NOTE: compiled for one ISA; it calls no inline function or template shared with baseline files
// (see gemm_avx2.cpp).
#include <immintrin.h>

#include "cpu/gemm_q8.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int kMR = 4, kNR = 4;
constexpr int kPrefillNR = 3;  // 12 accumulators + 3 x (w, -128 sum w, dw) + x, dx, temporaries
constexpr int kDecodeT = 4;
constexpr int64_t kBlockBytes = 256 << 10;

// y[t0 + i, n0 + j*ns] for i < MR, j < NR.
template <int MR, int NR>
void tile(const GemmArgs& a, int64_t t0, int64_t n0, int64_t ns) {
  const int64_t Kp = (a.K + 63) / 64 * 64, nb = Kp / 32;
  const int8_t* wq = static_cast<const int8_t*>(a.w) + n0 * Kp;
  const uint16_t* wd = reinterpret_cast<const uint16_t*>(static_cast<const int8_t*>(a.w) + a.N * Kp) + n0 * nb;
  const int8_t* xq = a.xq + t0 * Kp;
  const float* xd = a.xd + t0 * nb;
  const __m512i k80 = _mm512_set1_epi8(char(0x80)), zero = _mm512_setzero_si512();
  // Two f16 scales (one 32-bit word broadcast) -> 8 copies of the first, then 8 of the second.
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += 2) {
    __m512i w[NR], negc[NR];
    __m512 dw[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      w[j] = _mm512_loadu_si512(wq + j * ns * Kp + b * 32);
      negc[j] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, k80, w[j]));
      int32_t two;
      __builtin_memcpy(&two, wd + j * ns * nb + b, 4);
      dw[j] = _mm512_cvtph_ps(_mm256_shuffle_epi8(_mm256_set1_epi32(two), spread));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512i xu = _mm512_xor_si512(_mm512_loadu_si512(xq + i * Kp + b * 32), k80);
      const __m512 dx = _mm512_permutexvar_ps(
          halves, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(xd + i * nb + b)))));
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const __m512i d = _mm512_dpbusd_epi32(negc[j], xu, w[j]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dx, dw[j]), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n0 + j * ns);
      a.y[(t0 + i) * a.N + n0 + j * ns] = s;
    }
}

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t, int64_t);

struct Table {
  TileFn fns[kMR + 1][kNR + 1] = {};
  Table() { fill<1, 1>(); }
  template <int M, int N>
  void fill() {
    fns[M][N] = &tile<M, N>;
    if constexpr (N < kNR) fill<M, N + 1>();
    else if constexpr (M < kMR) fill<M + 1, 1>();
  }
};

// Rows [nb, ne) cut into `parts` runs; tile i takes row i of every run (see gemm_avx2.cpp).
inline void strided_rows(const Table& tab, const GemmArgs& a, int64_t t0, int mr, int parts, int64_t nb, int64_t ne) {
  const int64_t run = (ne - nb) / parts;
  for (int64_t i = 0; i < run; i++) tab.fns[mr][parts](a, t0, nb + i, run);
  for (int64_t n = nb + run * parts; n < ne; n++) tab.fns[mr][1](a, t0, n, 1);
}

}  // namespace

void gemm_q8_avx512vnni(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const Table tab;
  if (a.T <= kDecodeT) {
    strided_rows(tab, a, 0, int(a.T), kNR, n_begin, n_end);
    return;
  }
  const int64_t row_bytes = (a.K + 63) / 64 * 64;
  const int64_t block = kPrefillNR * (kBlockBytes / row_bytes / kPrefillNR > 1 ? kBlockBytes / row_bytes / kPrefillNR : 1);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t ne = min64(n_end, nb + block);
    for (int64_t t = 0; t < a.T; t += kMR) strided_rows(tab, a, t, int(min64(kMR, a.T - t)), kPrefillNR, nb, ne);
  }
}

}  // namespace sluice::cpu::detail
