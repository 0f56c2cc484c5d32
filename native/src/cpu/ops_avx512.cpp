// AVX-512 versions of attention and the SwiGLU activation, with a vector exp.
// NOTE: this file is compiled for one ISA; it calls no inline function or template shared with
// baseline files (no std::min, no dtype.h helpers), so the linker can never hand a baseline
// caller a copy built with these instructions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu/kv_cursor.h"
#include "cpu/ops_simd.h"
#include "cpu/reduce_avx512.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// exp(x) to ~2 ulp: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite split), a degree-6
// polynomial for e^r, then scale by 2^n. Large negative inputs underflow to 0.
inline __m512 exp512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-103.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 K/V elements as f32 from an f32, bf16 or fp8 e4m3 cache (KV = float, uint16_t or uint8_t),
// masked. An e4m3 code b reads as its value times 2^-8, exactly: the fp16 with b's sign, and its
// exponent and mantissa bits shifted in place (bias 15 = 7 + 8), so vcvtph2ps does the rest,
// subnormals included. The 2^8 and the layer's scale are folded into the score scale and the
// output factor (kv_unit). The NaN code 0x7f (kv_write stores it only for a NaN input) reads as
// 480 * 2^-8, not NaN.
template <typename KV>
inline __m512 load_kv16(const void* base, int64_t off, __mmask16 m) {
  if constexpr (std::is_same_v<KV, float>) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + off);
  } else if constexpr (std::is_same_v<KV, uint16_t>) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + off);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    static_assert(std::is_same_v<KV, uint8_t>, "f32, bf16 or e4m3 elements");
    const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const uint8_t*>(base) + off);
    // Sign-extended and shifted left 7: the sign lands in bits 15 and 14; bit 14 is cleared.
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16(-16385));
    return _mm512_cvtph_ps(h);
  }
}

// What the kernels multiply a K (or V) element as read by load_kv16 by to get its value: 1 for
// f32 and bf16, 2^8 * the layer's scale for e4m3. Applied once to each score (with the softmax
// scale) and to each output (with 1 / sum); an exact 1 for f32 and bf16 keeps their results.
template <typename KV>
inline float kv_unit(float fp8_scale) {
  if constexpr (std::is_same_v<KV, uint8_t>) return 256.f * fp8_scale;
  else return 1.f;
}

// scores[0:P] = exp(scores - max_score) in place; returns 1 / their sum. The sum runs in 16
// fixed lanes then a fixed reduction, so it depends only on the scores.
inline float softmax_weights(float* scores, int64_t P, float max_score) {
  const __m512 mx = _mm512_set1_ps(max_score);
  __m512 sumv = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= P; p += 16) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + p), mx));
    _mm512_storeu_ps(scores + p, e);
    sumv = _mm512_add_ps(sumv, e);
  }
  if (p < P) {
    const __mmask16 m = __mmask16((1u << (P - p)) - 1);
    __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + p), mx)));
    _mm512_mask_storeu_ps(scores + p, m, e);
    sumv = _mm512_add_ps(sumv, e);
  }
  return 1.0f / _mm512_reduce_add_ps(sumv);
}

// scores[0:n] = the sums of acc[0:n] (reduce16) times scale, and mxv = their running maximum
// (lane-wise; a NaN score is skipped, as `s > max ? s : max` would). The sum of a position's dot
// product lanes is the same tree in every slot, so a score never depends on its block.
inline void store_scores(const __m512* acc, int n, __m512 scale, float* scores, __m512& mxv) {
  const __m512 s = _mm512_mul_ps(reduce16(acc), scale);
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  _mm512_mask_storeu_ps(scores, m, s);
  mxv = _mm512_mask_max_ps(mxv, m, s, mxv);  // max(s, mxv): the second operand where s is NaN
}

}  // namespace

// softmax_weights, with the head's sink (PagedKV::has_sink) joining the sum: it takes its share
// of the probability and adds nothing to the output.
inline float sink_adjusted(float* scores, int64_t P, float max_score, const PagedKV& c) {
  if (!c.has_sink) return softmax_weights(scores, P, max_score);
  const float m = max_score > c.sink ? max_score : c.sink;
  const float inv = softmax_weights(scores, P, m);
  return 1.f / (1.f / inv + std::exp(c.sink - m));
}

template <typename KV>
void attend_single(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                   float* scores, float* out) {
  const int64_t hd = c.head_dim, P = pos + 1 - c.first;
  const int64_t chunks = (hd + 15) / 16;
  const __mmask16 tail = (hd % 16) ? __mmask16((1u << (hd % 16)) - 1) : __mmask16(0xffff);
  // q is held in registers (head_dim <= 256).
  __m512 qv[16];
  for (int64_t i = 0; i < chunks; i++) qv[i] = _mm512_maskz_loadu_ps(i + 1 < chunks ? 0xffff : tail, q + 16 * i);
  // Scores 16 positions at a time: their dot products' lanes summed together (reduce16).
  const __m512 sv = _mm512_set1_ps(scale * kv_unit<KV>(c.k_scale));
  __m512 mxv = _mm512_set1_ps(-INFINITY);
  KvCursor kc(table, c, kv_head);
  for (int64_t p0 = 0; p0 < P; p0 += 16) {
    const int n = int(min64(16, P - p0));
    __m512 acc[16];
    for (int r = 0; r < 16; r++) {
      acc[r] = _mm512_setzero_ps();
      if (r >= n) continue;
      const int64_t off = kc.offset();
      kc.next();
      for (int64_t i = 0; i < chunks; i++)
        acc[r] = _mm512_fmadd_ps(qv[i], load_kv16<KV>(c.k, off + 16 * i, i + 1 < chunks ? 0xffff : tail), acc[r]);
    }
    store_scores(acc, n, sv, scores + p0, mxv);
  }
  const float inv_sum = sink_adjusted(scores, P, _mm512_reduce_max_ps(mxv), c);
  __m512 o[16];
  for (int64_t i = 0; i < chunks; i++) o[i] = _mm512_setzero_ps();
  KvCursor vc(table, c, kv_head);
  for (int64_t j = 0; j < P; j++, vc.next()) {
    const int64_t off = vc.offset();
    const __m512 w = _mm512_set1_ps(scores[j]);
    for (int64_t i = 0; i < chunks; i++)
      o[i] = _mm512_fmadd_ps(w, load_kv16<KV>(c.v, off + 16 * i, i + 1 < chunks ? 0xffff : tail), o[i]);
  }
  const __m512 is = _mm512_set1_ps(inv_sum * kv_unit<KV>(c.v_scale));
  for (int64_t i = 0; i < chunks; i++)
    _mm512_mask_storeu_ps(out + 16 * i, i + 1 < chunks ? 0xffff : tail, _mm512_mul_ps(o[i], is));
}

void attend_avx512(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                   float* scores, float* out) {
  switch (c.dtype) {
    case DType::BF16: attend_single<uint16_t>(q, table, pos, kv_head, c, scale, scores, out); break;
    case DType::F8E4M3: attend_single<uint8_t>(q, table, pos, kv_head, c, scale, scores, out); break;
    default: attend_single<float>(q, table, pos, kv_head, c, scale, scores, out); break;  // F32 (paged_attention checked)
  }
}

// NH heads (their q rows back to back, then their scores and outputs likewise) sharing every
// K/V row load. NH and CH are compile-time, so q, the running maxima and the NH x CH output
// accumulators stay in registers.
template <typename KV, int CH, int NH>
void attend_heads(const float* q, const int32_t* table, int64_t P, int64_t kv_head, const PagedKV& c, float scale,
                  float* scores, float* out) {
  __m512 qv[NH][CH];
#pragma GCC unroll 16
  for (int h = 0; h < NH; h++)
#pragma GCC unroll 16
    for (int i = 0; i < CH; i++) qv[h][i] = _mm512_loadu_ps(q + h * CH * 16 + 16 * i);
  const __m512 sv = _mm512_set1_ps(scale * kv_unit<KV>(c.k_scale));
  __m512 mxv[NH];
#pragma GCC unroll 16
  for (int h = 0; h < NH; h++) mxv[h] = _mm512_set1_ps(-INFINITY);
  KvCursor kc(table, c, kv_head);
  for (int64_t p0 = 0; p0 < P; p0 += 16) {
    const int n = int(min64(16, P - p0));
    __m512 acc[NH][16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
      if (r >= n) {
#pragma GCC unroll 16
        for (int h = 0; h < NH; h++) acc[h][r] = _mm512_setzero_ps();
        continue;
      }
      const int64_t off = kc.offset();
      kc.next();
      __m512 kv[CH];
#pragma GCC unroll 16
      for (int i = 0; i < CH; i++) kv[i] = load_kv16<KV>(c.k, off + 16 * i, 0xffff);
#pragma GCC unroll 16
      for (int h = 0; h < NH; h++) {
        __m512 d = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < CH; i++) d = _mm512_fmadd_ps(qv[h][i], kv[i], d);
        acc[h][r] = d;
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < NH; h++) store_scores(acc[h], n, sv, scores + h * P + p0, mxv[h]);
  }
  float inv_sum[NH];
#pragma GCC unroll 16
  for (int h = 0; h < NH; h++) inv_sum[h] = softmax_weights(scores + h * P, P, _mm512_reduce_max_ps(mxv[h]));
  __m512 o[NH][CH];
#pragma GCC unroll 16
  for (int h = 0; h < NH; h++)
#pragma GCC unroll 16
    for (int i = 0; i < CH; i++) o[h][i] = _mm512_setzero_ps();
  KvCursor vc(table, c, kv_head);
  for (int64_t j = 0; j < P; j++, vc.next()) {
    const int64_t off = vc.offset();
    __m512 vv[CH];
#pragma GCC unroll 16
    for (int i = 0; i < CH; i++) vv[i] = load_kv16<KV>(c.v, off + 16 * i, 0xffff);
#pragma GCC unroll 16
    for (int h = 0; h < NH; h++) {
      const __m512 w = _mm512_set1_ps(scores[h * P + j]);
#pragma GCC unroll 16
      for (int i = 0; i < CH; i++) o[h][i] = _mm512_fmadd_ps(w, vv[i], o[h][i]);
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < NH; h++) {
    const __m512 is = _mm512_set1_ps(inv_sum[h] * kv_unit<KV>(c.v_scale));
#pragma GCC unroll 16
    for (int i = 0; i < CH; i++) _mm512_storeu_ps(out + h * CH * 16 + 16 * i, _mm512_mul_ps(o[h][i], is));
  }
}

// All heads of one GQA group for one token, HB at a time (attend_heads). Per head the
// arithmetic is exactly the single-head order, so grouping never changes a result.
template <typename KV, int CH, int HB>
void attend_group_impl(const float* q, int64_t G, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c,
                       float scale, float* scores, float* out) {
  using Fn = void (*)(const float*, const int32_t*, int64_t, int64_t, const PagedKV&, float, float*, float*);
  static constexpr Fn fns[8] = {&attend_heads<KV, CH, 1>, &attend_heads<KV, CH, 2>, &attend_heads<KV, CH, 3>,
                                &attend_heads<KV, CH, 4>, &attend_heads<KV, CH, (HB > 4 ? 5 : 1)>,
                                &attend_heads<KV, CH, (HB > 4 ? 6 : 1)>, &attend_heads<KV, CH, (HB > 4 ? 7 : 1)>,
                                &attend_heads<KV, CH, (HB > 4 ? 8 : 1)>};
  static_assert(HB >= 1 && HB <= 8, "at most 8 heads per pass");
  const int64_t P = pos + 1 - c.first;
  for (int64_t g0 = 0; g0 < G; g0 += HB) {
    const int hb = int(min64(HB, G - g0));
    fns[hb - 1](q + g0 * CH * 16, table, P, kv_head, c, scale, scores, out + g0 * CH * 16);
  }
}

template <typename KV>
bool attend_group_typed(const float* q, int64_t G, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c,
                        float scale, float* scores, float* out) {
  switch (c.head_dim) {
    case 16: attend_group_impl<KV, 1, 8>(q, G, table, pos, kv_head, c, scale, scores, out); return true;
    case 32: attend_group_impl<KV, 2, 8>(q, G, table, pos, kv_head, c, scale, scores, out); return true;
    case 48: attend_group_impl<KV, 3, 4>(q, G, table, pos, kv_head, c, scale, scores, out); return true;
    case 64: attend_group_impl<KV, 4, 4>(q, G, table, pos, kv_head, c, scale, scores, out); return true;
    case 128: attend_group_impl<KV, 8, 2>(q, G, table, pos, kv_head, c, scale, scores, out); return true;
    default: return false;
  }
}

bool attend_group_avx512(const float* q, int64_t G, const int32_t* table, int64_t pos, int64_t kv_head,
                         const PagedKV& c, float scale, float* scores, float* out) {
  switch (c.dtype) {
    case DType::BF16: return attend_group_typed<uint16_t>(q, G, table, pos, kv_head, c, scale, scores, out);
    case DType::F8E4M3: return attend_group_typed<uint8_t>(q, G, table, pos, kv_head, c, scale, scores, out);
    default: return attend_group_typed<float>(q, G, table, pos, kv_head, c, scale, scores, out);  // F32
  }
}

void logits_row_stats_avx512(const float* row, int64_t V, int32_t* argmax, float* lse) {
  // Pass 1: the maximum, then its lowest index.
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= V; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(row + i));
  float mx = _mm512_reduce_max_ps(mv);
  for (; i < V; i++) mx = row[i] > mx ? row[i] : mx;
  int64_t best = 0;
  while (best < V && !(row[best] == mx)) best++;
  *argmax = int32_t(best < V ? best : 0);
  // Pass 2: sum of exp(x - max) in 16 fixed lanes, then a fixed reduction.
  const __m512 m = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= V; i += 16) sum = _mm512_add_ps(sum, exp512(_mm512_sub_ps(_mm512_loadu_ps(row + i), m)));
  if (i < V) {
    const __mmask16 mk = __mmask16((1u << (V - i)) - 1);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, row + i), m))));
  }
  *lse = mx + logf(_mm512_reduce_add_ps(sum));
}

bool mask_row_avx512(float* row, int64_t V, const uint32_t* allow) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  uint32_t any = 0;
  for (int64_t i = 0; i < V; i += 16) {
    const uint32_t half = (allow[i >> 5] >> (i & 16)) & 0xffffu;  // the 16 bits of tokens i .. i + 15
    const __mmask16 in_range = V - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (V - i)) - 1);
    any |= half & in_range;
    if (half == 0xffffu) continue;
    // Lanes whose bit is clear take -inf; the others keep their logit.
    const __mmask16 cleared = __mmask16(~half) & in_range;
    _mm512_mask_storeu_ps(row + i, cleared, neg_inf);
  }
  return any != 0;
}

void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, u));
  }
}

}  // namespace sluice::cpu::detail
