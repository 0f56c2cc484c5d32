// AVX-512 matmul kernels. Dot-product form: each output keeps one 16-lane accumulator over
// K (chunks of 32 bf16 pairs with vdpbf16ps, or 16 f32 with FMA), reduced once at the end.
// Tiles of MR activation rows x NR weight rows share loads; tails use smaller tiles, which
// changes nothing for any single output (see gemm.h).
// NOTE: this file is compiled for one ISA; it calls no inline function or template shared with
// baseline files (no std::min, no dtype.h helpers), so the linker can never hand a baseline
// caller a copy built with these instructions.
#include <immintrin.h>

#include <algorithm>

#include "cpu/gemm.h"
#include "cpu/reduce_avx512.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
// Local copies of the bf16 conversions (round to nearest even), see the NOTE above.
inline uint16_t to_bf16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

constexpr int kMR = 4;   // activation rows per tile
constexpr int kNR = 6;   // weight rows per tile: 24 accumulators + 6 weight + 1 activation registers
constexpr int64_t kTB = 64;  // activation rows per cache block (kept in L2 while W streams)

inline float bias_at(const GemmArgs& a, int64_t n) {
  return a.bias ? load_scalar(a.bias, a.bias_dtype, n) : 0.f;
}

// y[t0 + i, n0 + j] = sum(acc[i][j]) + bias[n0 + j]
template <int MR, int NR>
inline void store_tile(const __m512 (&acc)[MR][NR], const GemmArgs& a, int64_t t0, int64_t n0) {
  constexpr int kTotal = MR * NR;
  alignas(64) float sums[(kTotal + 15) / 16 * 16];
#pragma GCC unroll 2
  for (int g = 0; g < kTotal; g += 16) {
    __m512 v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = g + i < kTotal ? acc[(g + i) / NR][(g + i) % NR] : _mm512_setzero_ps();
    _mm512_store_ps(sums + g, reduce16(v));
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) a.y[(t0 + i) * a.N + n0 + j] = sums[i * NR + j] + bias_at(a, n0 + j);
}

// ---- bf16 weights with vdpbf16ps -------------------------------------------------------------
// SPLIT (precision f32): activations are split as x = hi + lo, both bf16 (hi = bf16(x),
// lo = bf16(x - hi)); two vdpbf16ps per chunk carry ~16 mantissa bits of x instead of 8, so
// results track an f32 computation closely, while the weights stream once as stored. xb holds
// [T, 2K]: the hi row then the lo row. Without SPLIT (precision bf16) xb is [T, K] = bf16(x):
// half the instructions, the activation rounding llama.cpp and vLLM use on CPU.
template <bool SPLIT, int MR, int NR>
void tile_bf16(const GemmArgs& a, int64_t t0, int64_t n0, const char* pf) {
  const int64_t K = a.K;
  constexpr int64_t kRows = SPLIT ? 2 : 1;  // xb rows per activation row
  const uint16_t* xb = a.xb + t0 * kRows * K;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + n0 * K;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
    if (pf) {  // one line per weight row loaded: the prefetch keeps pace with the loads
      const char* p = pf + k * 2 * NR;
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++)
        if (p + 64 * j < a.pf_end) _mm_prefetch(p + 64 * j, _MM_HINT_T1);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      const __m512bh hi = (__m512bh)_mm512_loadu_si512(xb + i * kRows * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], hi, wv[j]);
      if constexpr (SPLIT) {
        const __m512bh lo = (__m512bh)_mm512_loadu_si512(xb + i * kRows * K + K + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], lo, wv[j]);
      }
    }
  }
  if (k < K) {  // zero-filled tail chunk: the same extra step for every output of this K
    const __mmask32 m = (__mmask32)((1ull << (K - k)) - 1);
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      const __m512bh hi = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + i * kRows * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], hi, wv[j]);
      if constexpr (SPLIT) {
        const __m512bh lo = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + i * kRows * K + K + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], lo, wv[j]);
      }
    }
  }
  store_tile<MR, NR>(acc, a, t0, n0);
}

// ---- f32 accumulate: weights f32 / f16 / bf16 widened to f32 in registers --------------------
template <DType WT>
inline __m512 load_w16(const void* w, int64_t off) {
  if constexpr (WT == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + off);
  } else if constexpr (WT == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + off)));
  } else {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + off)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}
template <DType WT>
inline __m512 load_w16_masked(const void* w, int64_t off, __mmask16 m) {
  if constexpr (WT == DType::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + off);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + off);
    if constexpr (WT == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType WT, int MR, int NR>
void tile_f32(const GemmArgs& a, int64_t t0, int64_t n0, const char*) {
  const int64_t K = a.K;
  const float* x = a.x + t0 * K;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) wv[j] = load_w16<WT>(a.w, (n0 + j) * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512 xv = _mm512_loadu_ps(x + i * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) wv[j] = load_w16_masked<WT>(a.w, (n0 + j) * K + k, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + i * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  store_tile<MR, NR>(acc, a, t0, n0);
}

// pf: where to prefetch weights from while this tile computes (nullptr: nowhere), see run_tiles.
using TileFn = void (*)(const GemmArgs&, int64_t, int64_t, const char* pf);

template <template <int, int> class Maker>
struct TileTable {
  TileFn fns[kMR + 1][kNR + 1] = {};
  TileTable() { fill<1, 1>(); }
  template <int M, int N>
  void fill() {
    fns[M][N] = Maker<M, N>::fn;
    if constexpr (N < kNR) fill<M, N + 1>();
    else if constexpr (M < kMR) fill<M + 1, 1>();
  }
};

template <int M, int N>
struct Bf16SplitMaker {
  static constexpr TileFn fn = &tile_bf16<true, M, N>;
};
template <int M, int N>
struct Bf16RoundMaker {
  static constexpr TileFn fn = &tile_bf16<false, M, N>;
};
template <int M, int N>
struct F32Maker {
  static constexpr TileFn fn = &tile_f32<DType::F32, M, N>;
};
template <int M, int N>
struct F16Maker {
  static constexpr TileFn fn = &tile_f32<DType::F16, M, N>;
};
template <int M, int N>
struct Bf16WidenMaker {
  static constexpr TileFn fn = &tile_f32<DType::BF16, M, N>;
};

// Software prefetch of the weights, kPrefetchBytes ahead of the tile being computed, into L2:
// a tile reads NR rows as NR interleaved streams (only K * 2 bytes each, a few dozen lines),
// too short for the hardware prefetchers to train on, so a batch-1 GEMV stalled on memory at
// about half the bandwidth of a plain streaming read. The slice [n_begin, n_end) of W is
// contiguous, so the prefetch walks it linearly and stops at its end (the next slice may be
// another thread's). Only the first tile of activation rows per weight tile prefetches; the
// others reuse the weights from cache. Loads and arithmetic are unchanged (see gemm.h).
constexpr int64_t kPrefetchBytes = 16384;

void run_tiles(const TileFn (&fns)[kMR + 1][kNR + 1], const GemmArgs& args, int64_t n_begin, int64_t n_end) {
  GemmArgs a = args;
  const char* w = static_cast<const char*>(a.w);
  const int64_t row_bytes = a.w_dtype == DType::F32 ? a.K * 4 : a.K * 2;
  a.pf_end = w + n_end * row_bytes;
  for (int64_t tb = 0; tb < a.T; tb += kTB) {
    const int64_t te = min64(a.T, tb + kTB);
    for (int64_t n = n_begin; n < n_end; n += kNR) {
      const int nr = int(min64(kNR, n_end - n));
      const char* pf = w + n * row_bytes + kPrefetchBytes;
      for (int64_t t = tb; t < te; t += kMR) {
        const int mr = int(min64(kMR, te - t));
        fns[mr][nr](a, t, n, t == tb ? pf : nullptr);
      }
    }
  }
}

// One activation row (batch-1 decode): weight rows one after another, so W streams as one
// linear read that the hardware prefetchers follow at close to a plain streaming read, instead
// of a tile's NR interleaved short streams (single-thread GEMV over the qwen2.5-0.5b matrices:
// about 23-25 GB/s against 19-20 for prefetched tiles and 13-15 for plain tiles; interleaving
// even two rows here halves it). Each row's dot product is the chain tile_bf16 computes (one
// 16-lane accumulator, chunks of 32 in order, the zero-filled tail chunk), and 16 rows are
// reduced together by reduce16, whose every slot gets the same tree: bit for bit the tiles'
// results (gemm.h). The rows' chains are independent, so out-of-order execution overlaps them.
template <bool SPLIT>
void row_stream_bf16(const GemmArgs& a, int64_t t, int64_t n_begin, int64_t n_end) {
  const int64_t K = a.K;
  constexpr int64_t kRows = SPLIT ? 2 : 1;  // xb rows per activation row
  const uint16_t* xb = a.xb + t * kRows * K;
  const int64_t full = K / 32 * 32;
  const __mmask32 tail = (__mmask32)((1ull << (K - full)) - 1);
  for (int64_t g = n_begin; g < n_end; g += 16) {
    const int rows = int(min64(16, n_end - g));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
      const uint16_t* w = static_cast<const uint16_t*>(a.w) + (g + r) * K;
      __m512 c = _mm512_setzero_ps();
      for (int64_t k = 0; k < full; k += 32) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
        c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512(xb + k), wv);
        if constexpr (SPLIT) c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512(xb + K + k), wv);
      }
      if (full < K) {
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, w + full);
        c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_maskz_loadu_epi16(tail, xb + full), wv);
        if constexpr (SPLIT) c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_maskz_loadu_epi16(tail, xb + K + full), wv);
      }
      acc[r] = c;
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, reduce16(acc));
    for (int r = 0; r < rows; r++) a.y[t * a.N + g + r] = sums[r] + bias_at(a, g + r);
  }
}

}  // namespace

void gemm_avx512bf16(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const TileTable<Bf16SplitMaker> split;
  static const TileTable<Bf16RoundMaker> round;
  if (a.T == 1) {
    if (a.xb_split) row_stream_bf16<true>(a, 0, n_begin, n_end);
    else row_stream_bf16<false>(a, 0, n_begin, n_end);
    return;
  }
  run_tiles(a.xb_split ? split.fns : round.fns, a, n_begin, n_end);
}

void gemm_avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const TileTable<F32Maker> f32;
  static const TileTable<F16Maker> f16;
  static const TileTable<Bf16WidenMaker> bf16;
  const auto& fns = a.w_dtype == DType::F32 ? f32.fns : a.w_dtype == DType::F16 ? f16.fns : bf16.fns;
  run_tiles(fns, a, n_begin, n_end);
}

void rows_to_bf16_avx512bf16(const float* x, int64_t rows, int64_t K, bool split, uint16_t* out) {
  for (int64_t r = 0; r < rows; r++) {
    const float* src = x + r * K;
    uint16_t* hi = out + r * (split ? 2 : 1) * K;
    uint16_t* lo = hi + K;
    if (!split) {
      int64_t i = 0;
      for (; i + 16 <= K; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
      for (; i < K; i++) hi[i] = to_bf16(src[i]);
      continue;
    }
    int64_t i = 0;
    for (; i + 16 <= K; i += 16) {
      const __m512 v = _mm512_loadu_ps(src + i);
      const __m256bh h = _mm512_cvtneps_pbh(v);
      const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), (__m256i)h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
    }
    for (; i < K; i++) {
      hi[i] = to_bf16(src[i]);
      lo[i] = to_bf16(src[i] - from_bf16(hi[i]));
    }
  }
}

}  // namespace sluice::cpu::detail
