// Per-level entry points of the non-matmul kernels that have SIMD versions.
#pragma once
#include <cstdint>

#include "cpu/kernels.h"

namespace sluice::cpu::detail {

// Attention for one (token, head): out[hd] from q[hd] over positions 0..pos of one sequence.
// scores: scratch of at least pos+1 floats.
using AttendFn = void (*)(const float* q, const int32_t* block_table, int64_t pos, int64_t kv_head,
                          const PagedKV& cache, float scale, float* scores, float* out);
void attend_generic(const float* q, const int32_t* block_table, int64_t pos, int64_t kv_head, const PagedKV& cache,
                    float scale, float* scores, float* out);
void attend_avx2(const float* q, const int32_t* block_table, int64_t pos, int64_t kv_head, const PagedKV& cache,
                 float scale, float* scores, float* out);
void attend_avx512(const float* q, const int32_t* block_table, int64_t pos, int64_t kv_head, const PagedKV& cache,
                   float scale, float* scores, float* out);

// All G query heads of kv_head's group (q: [G, hd] contiguous) for one token; scores: scratch
// of G * (pos + 1) floats. Returns false when head_dim has no specialized kernel.
bool attend_group_avx2(const float* q, int64_t G, const int32_t* block_table, int64_t pos, int64_t kv_head,
                       const PagedKV& cache, float scale, float* scores, float* out);
bool attend_group_avx512(const float* q, int64_t G, const int32_t* block_table, int64_t pos, int64_t kv_head,
                         const PagedKV& cache, float scale, float* scores, float* out);

// Row statistics for sampling: argmax (lowest index on ties) and log-sum-exp.
void logits_row_stats_generic(const float* row, int64_t V, int32_t* argmax, float* lse);
void logits_row_stats_avx2(const float* row, int64_t V, int32_t* argmax, float* lse);
void logits_row_stats_avx512(const float* row, int64_t V, int32_t* argmax, float* lse);

// One row of a token mask (see apply_token_masks): disallowed logits become -inf; returns
// whether any token in [0, V) is allowed.
bool mask_row_generic(float* row, int64_t V, const uint32_t* allow);
bool mask_row_avx2(float* row, int64_t V, const uint32_t* allow);
bool mask_row_avx512(float* row, int64_t V, const uint32_t* allow);

void silu_mul_generic(const float* gate, const float* up, int64_t n, float* out);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);
void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out);

// One row of RMSNorm: out[D] = x[D] / rms(x) * weight[D], the sum of squares in double.
// out may alias x.
void rmsnorm_row_generic(const float* x, int64_t D, const void* weight, DType w_dtype, float eps, float* out);
void rmsnorm_row_avx2(const float* x, int64_t D, const void* weight, DType w_dtype, float eps, float* out);

float load_scalar(const void* p, DType t, int64_t i);

}  // namespace sluice::cpu::detail
