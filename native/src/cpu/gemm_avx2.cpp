// AVX2 + FMA + F16C matmul (the baseline x86-64 level): f32 activations, weights widened to
// f32 in registers, one 8-lane accumulator per output over K (see gemm.h for the contract).
// NOTE: this file is compiled for one ISA; it calls no inline function or template shared with
// baseline files (no std::min, no dtype.h helpers), so the linker can never hand a baseline
// caller a copy built with these instructions.
#include <immintrin.h>

#include <algorithm>

#include "cpu/gemm.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int kMR = 4, kNR = 3;  // 12 accumulators + 3 weight + 1 activation registers
constexpr int64_t kTB = 64;

template <DType WT>
inline __m256 load_w8(const void* w, int64_t off) {
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + off);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + off));
    if constexpr (WT == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline float hsum8(__m256 v) {  // fixed reduction tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType WT, int MR, int NR>
void tile(const GemmArgs& a, int64_t t0, int64_t n0) {
  const int64_t K = a.K, K8 = K & ~int64_t(7);
  const float* x = a.x + t0 * K;
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; j++) wv[j] = load_w8<WT>(a.w, (n0 + j) * K + k);
    for (int i = 0; i < MR; i++) {
      __m256 xv = _mm256_loadu_ps(x + i * K + k);
      for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = hsum8(acc[i][j]);
      for (int64_t k = K8; k < K; k++) s += x[i * K + k] * load_scalar(a.w, WT, (n0 + j) * K + k);
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n0 + j);
      a.y[(t0 + i) * a.N + n0 + j] = s;
    }
}

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t);

template <DType WT>
struct Table {
  TileFn fns[kMR + 1][kNR + 1] = {};
  Table() { fill<1, 1>(); }
  template <int M, int N>
  void fill() {
    fns[M][N] = &tile<WT, M, N>;
    if constexpr (N < kNR) fill<M, N + 1>();
    else if constexpr (M < kMR) fill<M + 1, 1>();
  }
};

}  // namespace

void gemm_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const Table<DType::F32> f32;
  static const Table<DType::F16> f16;
  static const Table<DType::BF16> bf16;
  const auto& fns = a.w_dtype == DType::F32 ? f32.fns : a.w_dtype == DType::F16 ? f16.fns : bf16.fns;
  for (int64_t tb = 0; tb < a.T; tb += kTB) {
    const int64_t te = min64(a.T, tb + kTB);
    for (int64_t n = n_begin; n < n_end; n += kNR) {
      const int nr = int(min64(kNR, n_end - n));
      for (int64_t t = tb; t < te; t += kMR) fns[min64(kMR, te - t)][nr](a, t, n);
    }
  }
}

}  // namespace sluice::cpu::detail
