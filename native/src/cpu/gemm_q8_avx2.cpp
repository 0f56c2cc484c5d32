// AVX2 Q8_0 matmul: per 32-block, |w| (u8) x sign-moved x (s8) with vpmaddubsw, pairs summed by
// vpmaddwd into 8 exact int32 lanes, converted and scaled by dx * dw into one 8-lane f32
// accumulator per output; one fixed horizontal sum at the end (see gemm_q8.h, gemm.h).
// Decode (small T) streams every weight row once, several far-apart rows per tile; prefill keeps
// a block of weight rows in L2 while 2-row activation tiles pass over it.
// NOTE: compiled for one ISA; it calls no inline function or template shared with baseline files
// (see gemm_avx2.cpp).
#include <immintrin.h>

#include "cpu/gemm_q8.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int kMR = 2, kNR = 4;
constexpr int kDecodeT = 2;
constexpr int64_t kBlockBytes = 128 << 10;

inline float hsum8(__m256 v) {  // fixed reduction tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[t0 + i, n0 + j*ns] for i < MR, j < NR.
template <int MR, int NR>
void tile(const GemmArgs& a, int64_t t0, int64_t n0, int64_t ns) {
  const int64_t Kp = (a.K + 63) / 64 * 64, nb = Kp / 32;
  const int8_t* wq = static_cast<const int8_t*>(a.w) + n0 * Kp;
  const uint16_t* wd = reinterpret_cast<const uint16_t*>(static_cast<const int8_t*>(a.w) + a.N * Kp) + n0 * nb;
  const int8_t* xq = a.xq + t0 * Kp;
  const float* xd = a.xd + t0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    __m256i w[NR], aw[NR];
    __m256 dw[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + j * ns * Kp + b * 32));
      aw[j] = _mm256_sign_epi8(w[j], w[j]);
      dw[j] = _mm256_set1_ps(_cvtsh_ss(wd[j * ns * nb + b]));
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * Kp + b * 32));
      const __m256 dx = _mm256_broadcast_ss(xd + i * nb + b);
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(x, w[j])), ones);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx, dw[j]), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = hsum8(acc[i][j]);
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

void gemm_q8_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const Table tab;
  if (a.T <= kDecodeT) {
    strided_rows(tab, a, 0, int(a.T), kNR, n_begin, n_end);
    return;
  }
  const int64_t row_bytes = (a.K + 63) / 64 * 64;
  const int64_t block = kNR * (kBlockBytes / row_bytes / kNR > 1 ? kBlockBytes / row_bytes / kNR : 1);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t ne = min64(n_end, nb + block);
    for (int64_t t = 0; t < a.T; t += kMR) strided_rows(tab, a, t, int(min64(kMR, a.T - t)), kNR, nb, ne);
  }
}

}  // namespace sluice::cpu::detail
