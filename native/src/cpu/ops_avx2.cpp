// AVX2 + FMA versions of attention, the SwiGLU activation, the sampling row statistics and
// the RMSNorm row, with a vector exp (8 f32 lanes; the level for x86-64 CPUs without AVX-512).
// NOTE: this file is compiled for one ISA; it calls no inline function or template shared with
// baseline files (no std::min, no dtype.h helpers), so the linker can never hand a baseline
// caller a copy built with these instructions.
#include <immintrin.h>

#include <cmath>
#include <type_traits>

#include "cpu/kv_cursor.h"
#include "cpu/ops_simd.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// exp(x) to ~2 ulp: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite split), a degree-6
// polynomial for e^r, then 2^n built in the exponent field. Inputs are clamped to
// [-87.33, 88.3] so 2^n stays a normal float (n in [-126, 127]); inputs below -87.33
// (including -inf) give exactly 0, as the true value is below the smallest normal float.
inline __m256 exp256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);  // false for x < lo and for NaN
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(pow2n)), keep);
}

// Fixed reduction tree: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) set, for masked loads of a tail of n < 8 floats.
inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float bf16_value(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// 8 K/V elements as f32 from an f32, bf16 or fp8 e4m3 cache (KV = float, uint16_t or uint8_t).
// An e4m3 code b reads as its value times 2^-8, exactly: the fp16 with b's sign, and its
// exponent and mantissa bits shifted in place (bias 15 = 7 + 8), so vcvtph2ps (F16C) does the
// rest, subnormals included. The 2^8 and the layer's scale are folded into the score scale and
// the output factor (kv_unit). The NaN code 0x7f (kv_write stores it only for a NaN input) reads
// as 480 * 2^-8, not NaN.
inline __m128i e4m3_as_f16(__m128i codes_i16) {
  // Sign-extended and shifted left 7: the sign lands in bits 15 and 14; bit 14 is cleared.
  return _mm_and_si128(_mm_slli_epi16(codes_i16, 7), _mm_set1_epi16(-16385));
}
template <typename KV>
inline __m256 load_kv8(const void* base, int64_t off) {
  if constexpr (std::is_same_v<KV, float>) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + off);
  } else if constexpr (std::is_same_v<KV, uint16_t>) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    static_assert(std::is_same_v<KV, uint8_t>, "f32, bf16 or e4m3 elements");
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + off));
    return _mm256_cvtph_ps(e4m3_as_f16(_mm_cvtepi8_epi16(b)));
  }
}
template <typename KV>
inline float load_kv1(const void* base, int64_t off) {
  if constexpr (std::is_same_v<KV, float>) {
    return static_cast<const float*>(base)[off];
  } else if constexpr (std::is_same_v<KV, uint16_t>) {
    return bf16_value(static_cast<const uint16_t*>(base)[off]);
  } else {
    const int8_t b = static_cast<const int8_t*>(base)[off];
    return _mm_cvtss_f32(_mm_cvtph_ps(e4m3_as_f16(_mm_set1_epi16(b))));
  }
}

// What the kernels multiply a K (or V) element as read by load_kv8 / load_kv1 by to get its
// value: 1 for f32 and bf16, 2^8 * the layer's scale for e4m3. Applied once to each score (with
// the softmax scale) and to each output (with 1 / sum); an exact 1 for f32 and bf16 keeps their
// results.
template <typename KV>
inline float kv_unit(float fp8_scale) {
  if constexpr (std::is_same_v<KV, uint8_t>) return 256.f * fp8_scale;
  else return 1.f;
}

// scores[0:P] = exp(scores - max_score) in place; returns 1 / their sum. The sum runs in 8
// fixed lanes then the fixed hsum8 tree, so it depends only on the scores.
inline float softmax_weights(float* scores, int64_t P, float max_score) {
  const __m256 mx = _mm256_set1_ps(max_score);
  __m256 sumv = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= P; p += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + p), mx));
    _mm256_storeu_ps(scores + p, e);
    sumv = _mm256_add_ps(sumv, e);
  }
  if (p < P) {
    const __m256i m = tail_mask(P - p);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(scores + p, m), mx)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(scores + p, m, e);
    sumv = _mm256_add_ps(sumv, e);
  }
  return 1.0f / hsum8(sumv);
}

// ---- attention ---------------------------------------------------------------------------
// Per (token, head) the arithmetic is fixed by head_dim alone, whichever entry point runs it:
//   score[p] = hsum8(q[0:8]*k[0:8] + q[8:16]*k[8:16] + ... as one FMA chain) (+ the hd % 8
//              tail in order) * scale
//   w[p] = exp(score[p] - max), inv = 1 / (8-lane sum then hsum8)
//   out[d] = (sum over p in order of w[p] * v[p][d]) * inv
// Grouped heads share each K/V load but keep exactly this order per head.

constexpr int kMaxHeads = 8;   // query heads whose scores one pass over K computes
constexpr int kPvAcc = 12;     // accumulator registers of the P·V blocks

// Scores of heads [0, HB) (q rows of hd floats, hd % 8 == 0) over positions 0..P-1, and their maxima.
template <typename KV, int HB>
void qk_block(const float* q, int64_t hd, const int32_t* table, int64_t P, int64_t kv_head, const PagedKV& c,
              float scale, float* const* sc, float* mx) {
  for (int h = 0; h < HB; h++) mx[h] = -INFINITY;
  KvCursor kc(table, c, kv_head);
  for (int64_t p = 0; p < P; p++, kc.next()) {
    const int64_t off = kc.offset();
    __m256 acc[HB];
#pragma GCC unroll 8
    for (int h = 0; h < HB; h++) acc[h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 kv = load_kv8<KV>(c.k, off + i);
#pragma GCC unroll 8
      for (int h = 0; h < HB; h++) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + i), kv, acc[h]);
    }
    for (int h = 0; h < HB; h++) {
      const float s = hsum8(acc[h]) * scale;
      sc[h][p] = s;
      mx[h] = s > mx[h] ? s : mx[h];
    }
  }
}

// out[h][c0*8 : (c0+CB)*8] for heads [0, HB): weights sc[h][0:P] times V, then * inv[h].
template <typename KV, int HB, int CB>
void pv_block(int64_t hd, int64_t c0, const int32_t* table, int64_t P, int64_t kv_head, const PagedKV& c,
              float* const* sc, const float* inv, float* out) {
  __m256 o[HB][CB];
  for (int h = 0; h < HB; h++)
    for (int j = 0; j < CB; j++) o[h][j] = _mm256_setzero_ps();
  KvCursor kc(table, c, kv_head);
  for (int64_t p = 0; p < P; p++, kc.next()) {
    const int64_t off = kc.offset() + c0 * 8;
    __m256 vv[CB];
#pragma GCC unroll 12
    for (int j = 0; j < CB; j++) vv[j] = load_kv8<KV>(c.v, off + 8 * j);
#pragma GCC unroll 4
    for (int h = 0; h < HB; h++) {
      const __m256 w = _mm256_broadcast_ss(sc[h] + p);
#pragma GCC unroll 12
      for (int j = 0; j < CB; j++) o[h][j] = _mm256_fmadd_ps(w, vv[j], o[h][j]);
    }
  }
  for (int h = 0; h < HB; h++) {
    const __m256 is = _mm256_set1_ps(inv[h]);
    for (int j = 0; j < CB; j++) _mm256_storeu_ps(out + h * hd + (c0 + j) * 8, _mm256_mul_ps(o[h][j], is));
  }
}

using QkFn = void (*)(const float*, int64_t, const int32_t*, int64_t, int64_t, const PagedKV&, float, float* const*,
                      float*);
using PvFn = void (*)(int64_t, int64_t, const int32_t*, int64_t, int64_t, const PagedKV&, float* const*, const float*,
                      float*);

// Kernels by block shape: qk[HB], pv[HB][CB] with HB * CB <= kPvAcc.
template <typename KV>
struct AttnTable {
  QkFn qk[kMaxHeads + 1] = {};
  PvFn pv[5][kPvAcc + 1] = {};
  AttnTable() {
    fill_qk<1>();
    fill_pv<1, 1>();
  }
  template <int HB>
  void fill_qk() {
    qk[HB] = &qk_block<KV, HB>;
    if constexpr (HB < kMaxHeads) fill_qk<HB + 1>();
  }
  template <int HB, int CB>
  void fill_pv() {
    pv[HB][CB] = &pv_block<KV, HB, CB>;
    if constexpr ((CB + 1) * HB <= kPvAcc) fill_pv<HB, CB + 1>();
    else if constexpr (HB < 4) fill_pv<HB + 1, 1>();
  }
};

// G heads (q: [G, hd], hd % 8 == 0) attending one sequence through one kv head.
template <typename KV>
void attend_heads(const float* q, int64_t G, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c,
                  float scale, float* scores, float* out) {
  static const AttnTable<KV> tab;
  const int64_t hd = c.head_dim, P = pos + 1 - c.first, chunks = hd / 8;
  const float score_scale = scale * kv_unit<KV>(c.k_scale), v_unit = kv_unit<KV>(c.v_scale);
  for (int64_t g0 = 0; g0 < G; g0 += kMaxHeads) {
    const int hb = int(min64(kMaxHeads, G - g0));
    float* sc[kMaxHeads];
    float mx[kMaxHeads], inv[kMaxHeads];
    for (int h = 0; h < hb; h++) sc[h] = scores + h * P;
    tab.qk[hb](q + g0 * hd, hd, table, P, kv_head, c, score_scale, sc, mx);
    for (int h = 0; h < hb; h++) inv[h] = softmax_weights(sc[h], P, mx[h]) * v_unit;
    // P·V in blocks of up to 4 heads x (12 / heads) chunks: each V row loaded once per block.
    for (int h0 = 0; h0 < hb; h0 += 4) {
      const int nh = int(min64(4, hb - h0));
      const int64_t cb = kPvAcc / nh;
      for (int64_t c0 = 0; c0 < chunks; c0 += cb)
        tab.pv[nh][min64(cb, chunks - c0)](hd, c0, table, P, kv_head, c, sc + h0, inv + h0, out + (g0 + h0) * hd);
    }
  }
}

// One head of any head_dim: the hd % 8 == 0 part as attend_heads, the tail in scalar order.
template <typename KV>
void attend_one(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                float* scores, float* out) {
  const int64_t hd = c.head_dim, P = pos + 1 - c.first, hd8 = hd & ~int64_t(7);
  scale *= kv_unit<KV>(c.k_scale);
  float mx = -INFINITY;
  KvCursor kc(table, c, kv_head);
  for (int64_t p = 0; p < P; p++, kc.next()) {
    const int64_t off = kc.offset();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_kv8<KV>(c.k, off + i), acc);
    float s = hsum8(acc);
    for (int64_t i = hd8; i < hd; i++) s += q[i] * load_kv1<KV>(c.k, off + i);
    s *= scale;
    scores[p] = s;
    mx = s > mx ? s : mx;
  }
  float inv;
  if (c.has_sink) {  // the head's sink joins the sum: it takes its share and adds nothing to the output
    const float m = mx > c.sink ? mx : c.sink;
    inv = 1.f / (1.f / softmax_weights(scores, P, m) + std::exp(c.sink - m));
  } else {
    inv = softmax_weights(scores, P, mx);
  }
  inv *= kv_unit<KV>(c.v_scale);
  for (int64_t d0 = 0; d0 < hd8; d0 += 8 * 4) {  // 4 chunks of outputs per pass over V
    const int64_t nc = min64(4, (hd8 - d0) / 8);
    __m256 o[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    KvCursor vc(table, c, kv_head);
    for (int64_t p = 0; p < P; p++, vc.next()) {
      const int64_t off = vc.offset() + d0;
      const __m256 w = _mm256_broadcast_ss(scores + p);
      for (int64_t j = 0; j < nc; j++) o[j] = _mm256_fmadd_ps(w, load_kv8<KV>(c.v, off + 8 * j), o[j]);
    }
    for (int64_t j = 0; j < nc; j++) _mm256_storeu_ps(out + d0 + 8 * j, _mm256_mul_ps(o[j], _mm256_set1_ps(inv)));
  }
  for (int64_t d = hd8; d < hd; d++) {
    float o = 0.f;
    KvCursor vc(table, c, kv_head);
    for (int64_t p = 0; p < P; p++, vc.next()) o += scores[p] * load_kv1<KV>(c.v, vc.offset() + d);
    out[d] = o * inv;
  }
}

}  // namespace

void attend_avx2(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                 float* scores, float* out) {
  switch (c.dtype) {
    case DType::BF16: attend_one<uint16_t>(q, table, pos, kv_head, c, scale, scores, out); break;
    case DType::F8E4M3: attend_one<uint8_t>(q, table, pos, kv_head, c, scale, scores, out); break;
    default: attend_one<float>(q, table, pos, kv_head, c, scale, scores, out); break;  // F32 (paged_attention checked)
  }
}

bool attend_group_avx2(const float* q, int64_t G, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c,
                       float scale, float* scores, float* out) {
  if (c.head_dim % 8 != 0) return false;
  switch (c.dtype) {
    case DType::BF16: attend_heads<uint16_t>(q, G, table, pos, kv_head, c, scale, scores, out); break;
    case DType::F8E4M3: attend_heads<uint8_t>(q, G, table, pos, kv_head, c, scale, scores, out); break;
    default: attend_heads<float>(q, G, table, pos, kv_head, c, scale, scores, out); break;  // F32
  }
  return true;
}

// ---- elementwise and row kernels ------------------------------------------------------------

bool mask_row_avx2(float* row, int64_t V, const uint32_t* allow) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  uint32_t any = 0;
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const uint32_t byte = (allow[i >> 5] >> (i & 31)) & 0xffu;  // the 8 bits of tokens i .. i + 7
    any |= byte;
    if (byte == 0xffu) continue;
    // Lanes whose bit is set keep their logit, the others take -inf.
    const __m256i keep = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(byte)), lane_bit), lane_bit);
    _mm256_storeu_ps(row + i, _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(row + i), _mm256_castsi256_ps(keep)));
  }
  for (; i < V; i++) {
    const uint32_t bit = (allow[i >> 5] >> (i & 31)) & 1u;
    any |= bit;
    if (!bit) row[i] = -INFINITY;
  }
  return any != 0;
}

void logits_row_stats_avx2(const float* row, int64_t V, int32_t* argmax, float* lse) {
  // Pass 1: the maximum, then its lowest index.
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(row + i));
  float mx = hmax8(mv);
  for (; i < V; i++) mx = row[i] > mx ? row[i] : mx;
  int64_t best = 0;
  while (best < V && !(row[best] == mx)) best++;
  *argmax = int32_t(best < V ? best : 0);
  // Pass 2: sum of exp(x - max) in 2 x 4 double lanes (a fixed order), then a fixed reduction.
  const __m256 m = _mm256_set1_ps(mx);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  for (i = 0; i + 8 <= V; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(row + i), m));
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  if (i < V) {
    const __m256i mk = tail_mask(V - i);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(row + i, mk), m)), _mm256_castsi256_ps(mk));
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
  *lse = float(double(mx) + log(_mm_cvtsd_f64(h)));  // libm, not an inline copy
}

void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    if (n - i >= 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    } else {  // the same lane arithmetic on a masked tail
      const __m256i m = tail_mask(n - i);
      const __m256 g = _mm256_maskload_ps(gate + i, m);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(up + i, m)));
    }
  }
}

void rmsnorm_row_avx2(const float* x, int64_t D, const void* weight, DType w_dtype, float eps, float* out) {
  // Sum of squares in double (each square is exact), 2 x 4 lanes in a fixed order.
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + d)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + d + 4));
    s0 = _mm256_fmadd_pd(a, a, s0);
    s1 = _mm256_fmadd_pd(b, b, s1);
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  for (int64_t k = d; k < D; k++) ss += double(x[k]) * double(x[k]);
  const float r = float(1.0 / __builtin_sqrt(ss / double(D) + double(eps)));
  const __m256 rv = _mm256_set1_ps(r);
  for (d = 0; d + 8 <= D; d += 8) {
    __m256 w;
    if (w_dtype == DType::F32) {
      w = _mm256_loadu_ps(static_cast<const float*>(weight) + d);
    } else {
      const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(weight) + d));
      w = w_dtype == DType::F16 ? _mm256_cvtph_ps(h16) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h16), 16));
    }
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), rv), w));
  }
  for (; d < D; d++) out[d] = x[d] * r * load_scalar(weight, w_dtype, d);
}

}  // namespace sluice::cpu::detail
