// AVX2 + FMA + F16C matmul (the x86-64 level without AVX-512): f32 activations, weights widened
// to f32 in registers, one 8-lane accumulator per output over K (see gemm.h for the contract).
// Small T (decode) streams each weight row once, several far-apart rows per tile; large T
// (prefill) keeps a block of weight rows in L2 and runs 4 x 3 register tiles over it.
// NOTE: this file is compiled for one ISA; it calls no inline function or template shared with
// baseline files (no std::min, no dtype.h helpers), so the linker can never hand a baseline
// caller a copy built with these instructions.
#include <immintrin.h>

#include <algorithm>

#include "cpu/gemm.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Prefill tiles: kMR activation rows x kNR weight rows = 12 accumulators + 3 weight registers
// + 1 activation register, all 16 ymm registers. Decode tiles (T <= kDecodeT): T x kDecodeNR.
constexpr int kMR = 4, kNR = 3;
constexpr int kDecodeT = 3, kDecodeNR = 4;
constexpr int kMaxNR = 4;
// Weight rows per block of the prefill order: the block stays in L2 while every activation tile
// passes over it, so its rows come from memory once.
constexpr int64_t kBlockBytes = 160 << 10;

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

// y[t0 + i, n0 + j*ns] for i < MR, j < NR: activation rows t0.. and weight rows n0, n0 + ns, ...
// Every output is the same computation whatever the tile: one 8-lane FMA chain over k in steps
// of 8, hsum8, then the K % 8 tail in order, then the bias.
template <DType WT, int MR, int NR>
void tile(const GemmArgs& a, int64_t t0, int64_t n0, int64_t ns) {
  const int64_t K = a.K, K8 = K & ~int64_t(7);
  const float* x = a.x + t0 * K;
  const int64_t wrow = ns * K;  // elements between this tile's weight rows
  const int64_t w0 = n0 * K;
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wv[j] = load_w8<WT>(a.w, w0 + j * wrow + k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = hsum8(acc[i][j]);
      for (int64_t k = K8; k < K; k++) s += x[i * K + k] * load_scalar(a.w, WT, w0 + j * wrow + k);
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n0 + j * ns);
      a.y[(t0 + i) * a.N + n0 + j * ns] = s;
    }
}

using TileFn = void (*)(const GemmArgs&, int64_t, int64_t, int64_t);

template <DType WT>
struct Table {
  TileFn fns[kMR + 1][kMaxNR + 1] = {};
  Table() { fill<1, 1>(); }
  template <int M, int N>
  void fill() {
    fns[M][N] = &tile<WT, M, N>;
    if constexpr (N < kMaxNR) fill<M, N + 1>();
    else if constexpr (M < kMR) fill<M + 1, 1>();
  }
};

// Rows [nb, ne) cut into `parts` equal runs (plus a remainder); tile i takes row i of every run.
// NOTE: the tile's weight rows then stream from `parts` places pages apart. A few sequential
// streams keep more memory reads in flight than one, while adjacent short rows read
// side by side (rows of 1-2 KB) measured well below the bandwidth on Zen 3.
inline void strided_rows(const TileFn (&fns)[kMR + 1][kMaxNR + 1], const GemmArgs& a, int64_t t0, int mr,
                         int parts, int64_t nb, int64_t ne) {
  const int64_t run = (ne - nb) / parts;
  for (int64_t i = 0; i < run; i++) fns[mr][parts](a, t0, nb + i, run);
  for (int64_t n = nb + run * parts; n < ne; n++) fns[mr][1](a, t0, n, 1);
}

}  // namespace

void gemm_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const Table<DType::F32> f32;
  static const Table<DType::F16> f16;
  static const Table<DType::BF16> bf16;
  const auto& fns = a.w_dtype == DType::F32 ? f32.fns : a.w_dtype == DType::F16 ? f16.fns : bf16.fns;
  if (a.T <= kDecodeT) {  // weight streaming: every weight row is read once
    strided_rows(fns, a, 0, int(a.T), kDecodeNR, n_begin, n_end);
    return;
  }
  // Blocks of weight rows sized for L2; inside a block, every 4-row activation tile (in L1)
  // passes over all the block's rows.
  const int64_t row_bytes = a.K * (a.w_dtype == DType::F32 ? 4 : 2);
  const int64_t block = kNR * (kBlockBytes / row_bytes / kNR > 1 ? kBlockBytes / row_bytes / kNR : 1);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t ne = min64(n_end, nb + block);
    for (int64_t t = 0; t < a.T; t += kMR) strided_rows(fns, a, t, int(min64(kMR, a.T - t)), kNR, nb, ne);
  }
}

}  // namespace sluice::cpu::detail
