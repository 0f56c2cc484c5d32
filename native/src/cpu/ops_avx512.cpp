// AVX-512 versions of attention and the SwiGLU activation, with a vector exp.
#include <immintrin.h>

#include <cmath>

#include "cpu/ops_simd.h"

namespace sluice::cpu::detail {

namespace {

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

inline const float* kv_row(const float* base, const int32_t* table, int64_t p, const PagedKV& c, int64_t kv_head) {
  const int64_t slot = int64_t(table[p / c.block_size]) * c.block_size + p % c.block_size;
  return base + (slot * c.n_kv_heads + kv_head) * c.head_dim;
}

}  // namespace

void attend_avx512(const float* q, const int32_t* table, int64_t pos, int64_t kv_head, const PagedKV& c, float scale,
                   float* scores, float* out) {
  const int64_t hd = c.head_dim, P = pos + 1;
  const int64_t chunks = (hd + 15) / 16;
  const __mmask16 tail = (hd % 16) ? __mmask16((1u << (hd % 16)) - 1) : __mmask16(0xffff);
  // q is held in registers (head_dim <= 256).
  __m512 qv[16];
  for (int64_t i = 0; i < chunks; i++) qv[i] = _mm512_maskz_loadu_ps(i + 1 < chunks ? 0xffff : tail, q + 16 * i);
  float max_score = -INFINITY;
  for (int64_t p = 0; p < P; p++) {
    const float* k = kv_row(c.k, table, p, c, kv_head);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < chunks; i++)
      acc = _mm512_fmadd_ps(qv[i], _mm512_maskz_loadu_ps(i + 1 < chunks ? 0xffff : tail, k + 16 * i), acc);
    const float s = _mm512_reduce_add_ps(acc) * scale;
    scores[p] = s;
    max_score = s > max_score ? s : max_score;
  }
  // Softmax weights, 16 at a time; the sum uses one fixed lane-wise order then a fixed reduction.
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
  const float inv_sum = 1.0f / _mm512_reduce_add_ps(sumv);
  __m512 o[16];
  for (int64_t i = 0; i < chunks; i++) o[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < P; j++) {
    const float* v = kv_row(c.v, table, j, c, kv_head);
    const __m512 w = _mm512_set1_ps(scores[j]);
    for (int64_t i = 0; i < chunks; i++)
      o[i] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(i + 1 < chunks ? 0xffff : tail, v + 16 * i), o[i]);
  }
  const __m512 is = _mm512_set1_ps(inv_sum);
  for (int64_t i = 0; i < chunks; i++)
    _mm512_mask_storeu_ps(out + 16 * i, i + 1 < chunks ? 0xffff : tail, _mm512_mul_ps(o[i], is));
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
