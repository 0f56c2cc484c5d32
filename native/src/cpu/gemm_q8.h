// Q8_0 weights: blocks of 32 int8 values with one scale each (symmetric, round to nearest, as
// llama.cpp's Q8_0), made at load from bf16/f16/f32 weights, and the matmul kernels over them.
//
// Layout of a [N, K] matrix: rows padded to Kp = round_up(K, 64) (zeros past K, so every row
// holds an even number of whole blocks), then
//   q: int8 [N, Kp]          w[n, k] ~= d[n, k / 32] * q[n, k],  |q| <= 127
//   d: f16  [N, Kp / 32]     d = f16(amax / 127) of the block; 0 for an all-zero block
// in one buffer, d right after q.
//
// Activations are quantized per row the same way at each matmul (scale in f32, not rounded), so
// a dot is  sum over blocks b of (dx[t, b] * dw[n, b]) * sumi(t, n, b),  where sumi is the exact
// integer dot of the block. The float sum over blocks has a fixed order per kernel that depends
// only on K (gemm.h's contract), so quantized matmul is batch invariant too.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu/gemm.h"
#include "sluice/dtype.h"

namespace sluice::cpu {

constexpr int64_t kQ8Block = 32;
inline int64_t q8_padded_k(int64_t K) { return (K + 63) / 64 * 64; }
inline size_t q8_bytes(int64_t N, int64_t K) {
  return size_t(N) * size_t(q8_padded_k(K)) + size_t(N) * size_t(q8_padded_k(K) / kQ8Block) * 2;
}
inline const int8_t* q8_values(const void* w) { return static_cast<const int8_t*>(w); }
inline const uint16_t* q8_scales(const void* w, int64_t N, int64_t K) {
  return reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(w) + size_t(N) * size_t(q8_padded_k(K)));
}

// Quantizes rows [row_begin, row_end) of src [N, K] (dtype src_dtype) into dst, a q8_bytes(N, K)
// buffer laid out as above.
void quantize_rows_q8(const void* src, DType src_dtype, int64_t N, int64_t K, int64_t row_begin, int64_t row_end,
                      void* dst);

// Activations x[T, K] -> xq[T, Kp] (zero padded) and xd[T, Kp / 32]:
// xd = amax / 127, xq = round_to_nearest_even(x * (127 / amax)) (0 where amax is 0).
void quantize_activations_q8(const float* x, int64_t T, int64_t K, int8_t* xq, float* xd);

namespace detail {
// Q8_0 matmul kernels: y[:, n_begin:n_end] from a.xq / a.xd and Q8_0 weights a.w (a.w_dtype ==
// DType::Q8_0), plus the bias. The integer block dots are exact in all of them.
void gemm_q8_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_q8_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_q8_avx512vnni(const GemmArgs& a, int64_t n_begin, int64_t n_end);  // AVX512-VNNI (vpdpbusd)
bool cpu_has_avx512vnni();
}  // namespace detail

}  // namespace sluice::cpu
