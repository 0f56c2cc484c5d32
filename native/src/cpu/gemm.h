// Internal matmul kernels, one per SIMD level, each computing a slice of output features.
// Contract shared by all: every y[t, n] is one dot product over K whose arithmetic (chunking,
// accumulation order, final reduction) depends only on K — never on T, the tile shape, or the
// slice — which is what makes matmul batch invariant.
#pragma once
#include <cstdint>

#include "sluice/dtype.h"

namespace sluice::cpu::detail {

struct GemmArgs {
  const float* x = nullptr;       // [T, K] f32 activations
  const uint16_t* xb = nullptr;   // AVX512-BF16 path: x as bf16, [T, 2K] hi/lo rows if xb_split else [T, K]
  bool xb_split = true;
  int64_t T = 0, K = 0, N = 0;
  const void* w = nullptr;        // [N, K] weights in w_dtype
  DType w_dtype = DType::F32;
  const void* bias = nullptr;     // [N] or nullptr
  DType bias_dtype = DType::F32;
  float* y = nullptr;             // [T, N]
  const char* pf_end = nullptr;   // end of the weights this call may prefetch (set by the kernel)
  // Q8_0 weights (see gemm_q8.h): x quantized the same way, [T, Kp] int8 and [T, Kp / 32] scales.
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  // Q4 weights (see gemm_q4.h): xq / xd as above with row stride q4_padded_k(K), and the blocks'
  // activation sums xs [T, q4_padded_k(K) / 32].
  const float* xs = nullptr;
};

// Computes y[:, n_begin:n_end].
void gemm_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end);       // f32 accumulate, any dtype
void gemm_avx512bf16(const GemmArgs& a, int64_t n_begin, int64_t n_end);   // bf16 weights, xb required
// Rounds x[rows, K] to bf16 (out[rows, K]) or, when split, into hi = bf16(x) and
// lo = bf16(x - hi) rows (out[rows, 2K]).
void rows_to_bf16_avx512bf16(const float* x, int64_t rows, int64_t K, bool split, uint16_t* out);

float load_scalar(const void* p, DType t, int64_t i);

}  // namespace sluice::cpu::detail
