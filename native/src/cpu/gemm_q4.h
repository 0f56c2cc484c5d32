// Q4: 4-bit weights as AWQ and GPTQ checkpoints publish them (unsigned 4-bit codes, one f16/bf16
// scale and one 4-bit zero point per group of input features), repacked at load into the layout
// the matmul kernels stream, values unchanged:
//
//   w[n, k] = scale[n, g] * (q[n, k] - zero[n, g]),   g = k / group,  0 <= q <= 15, 0 <= zero <= 16
//
// computed exactly in f32 (a 16-bit float scale times an integer of at most 5 bits). A zero of 16
// is what GPTQ's original format stores for a zero point of 0 (it saves zero - 1 and adds 1 back).
//
// Buffer of a [N, K] matrix (one allocation, every section 64-byte aligned):
//   Q4Header                     N, K, Kp = round_up(K, 128), group, flags
//   perm:   int32 [K]            act-order (GPTQ desc_act) only: input feature j of the packed
//                                matrix is feature perm[j] of the model's; the kernels read
//                                x[:, perm[j]] for packed column j. Groups are contiguous after it.
//   codes:  uint8 [N, Kp / 2]    per row, per 128-column chunk c: byte j (0..63) holds column
//                                c*128 + j in its low nibble and c*128 + 64 + j in its high one
//   scales: f32   [N, ng]        ng = ceil(Kp / group); 0 for the padding past K
//   zeros:  uint8 [N, ng]
// Columns K..Kp have code 0 and zero 0 (the activations there are zero too).
//
// Activations are quantized per row and per 32-block as for Q8_0 (gemm_q8.h), so a dot is
//   sum over groups g of scale[n, g] * ( sum over blocks b in g of dx[t, b] * sumi(t, n, b)
//                                        - zero[n, g] * sum over b in g of dx[t, b] * xsum[t, b] )
// with sumi the exact integer dot of codes and int8 activations and xsum the block's integer sum
// of activations. Every kernel sums in an order that depends only on K and group (gemm.h's
// contract): quantized matmul is batch invariant.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu/gemm.h"
#include "sluice/dtype.h"

namespace sluice::cpu {

struct Q4Header {
  int64_t N = 0, K = 0, Kp = 0, group = 0;
  uint32_t flags = 0;  // kQ4Perm
  uint32_t pad_[7] = {};
};
static_assert(sizeof(Q4Header) == 64);
constexpr uint32_t kQ4Perm = 1;
constexpr int64_t kQ4Chunk = 128;

inline int64_t q4_padded_k(int64_t K) { return (K + kQ4Chunk - 1) / kQ4Chunk * kQ4Chunk; }
inline int64_t q4_groups(int64_t Kp, int64_t group) { return (Kp + group - 1) / group; }
inline size_t q4_align(size_t b) { return (b + 63) / 64 * 64; }

// Byte offsets of the sections of a Q4 buffer.
struct Q4Sections {
  size_t perm = 0, codes = 0, scales = 0, zeros = 0, total = 0;
};
inline Q4Sections q4_sections(int64_t N, int64_t K, int64_t group, bool perm) {
  const int64_t Kp = q4_padded_k(K), ng = q4_groups(Kp, group);
  Q4Sections s;
  s.perm = sizeof(Q4Header);
  s.codes = s.perm + (perm ? q4_align(size_t(K) * 4) : 0);
  s.scales = s.codes + q4_align(size_t(N) * size_t(Kp / 2));
  s.zeros = s.scales + q4_align(size_t(N) * size_t(ng) * 4);
  s.total = s.zeros + q4_align(size_t(N) * size_t(ng));
  return s;
}
inline size_t q4_bytes(int64_t N, int64_t K, int64_t group, bool perm) { return q4_sections(N, K, group, perm).total; }

// Read-only view of a Q4 buffer.
struct Q4View {
  const Q4Header* h;
  const int32_t* perm;    // nullptr without act-order
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros;
  int64_t ng;
};
inline Q4View q4_view(const void* w) {
  const auto* base = static_cast<const uint8_t*>(w);
  const auto* h = reinterpret_cast<const Q4Header*>(base);
  const Q4Sections s = q4_sections(h->N, h->K, h->group, (h->flags & kQ4Perm) != 0);
  return {h, (h->flags & kQ4Perm) ? reinterpret_cast<const int32_t*>(base + s.perm) : nullptr, base + s.codes,
          reinterpret_cast<const float*>(base + s.scales), base + s.zeros, q4_groups(h->Kp, h->group)};
}
// q4_view out of line, for the files compiled for one ISA (gemm_q4_avx2.cpp, ...): they may call
// no inline function shared with baseline files (see the NOTE in gemm_avx2.cpp).
Q4View q4_view_of(const void* w);
// The SIMD kernels' zero-point factors: out[t, g] = a.xs[t, b] summed over group g's blocks b in
// block order, [a.T, v.ng], in this thread's buffer (valid until its next call). Out of line, for
// the same reason as q4_view_of.
const float* q4_group_xs(const detail::GemmArgs& a, const Q4View& v);

// Writes the header and the permutation (perm may be nullptr) of a buffer of q4_bytes(N, K,
// group, perm != nullptr) bytes and zero-fills codes, scales and zeros. group: a multiple of 32.
void q4_init(void* dst, int64_t N, int64_t K, int64_t group, const int32_t* perm);
// Sets row n's column j (packed order) to code q (0..15), and group g's scale and zero (0..16).
void q4_set_code(void* dst, int64_t n, int64_t j, uint8_t q);
void q4_set_group(void* dst, int64_t n, int64_t g, float scale, uint8_t zero);
// Sets all K codes of row n from codes[j] (packed column order, 0..15).
void q4_set_row(void* dst, int64_t n, const uint8_t* codes);
// Row n of the matrix in the model's column order (the permutation undone), as f32: exact.
void q4_dequantize_row(const void* w, int64_t n, float* out);

// Activations for Q4 weights: x[T, K] (read through perm when it is not nullptr: packed column j
// is x[t, perm[j]]) quantized in 32-blocks exactly as quantize_activations_q8 does, but with row
// stride Kp = q4_padded_k(K): xq [T, Kp] int8 (zero padded), xd [T, Kp / 32] scales, and
// xs [T, Kp / 32] = xd * (integer sum of the block's xq), the zero-point term's factor.
void quantize_activations_q4(const float* x, int64_t T, int64_t K, const int32_t* perm, int8_t* xq, float* xd,
                             float* xs);

namespace detail {
// Q4 matmul kernels: y[:, n_begin:n_end] from a.xq / a.xd / a.xs (quantize_activations_q4 of x,
// through the weights' permutation when they carry one) and Q4 weights a.w (a.w_dtype ==
// DType::Q4), plus the bias.
void gemm_q4_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_q4_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end);
void gemm_q4_avx512vnni(const GemmArgs& a, int64_t n_begin, int64_t n_end);
}  // namespace detail

}  // namespace sluice::cpu
