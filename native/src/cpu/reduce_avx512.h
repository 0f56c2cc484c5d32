// Horizontal sums of 16 AVX-512 accumulators at once, for the *_avx512.cpp files only (they
// are all compiled with the same ISA flags, so this inline function has one meaning; a
// baseline file must never include it).
#pragma once
#include <immintrin.h>

namespace sluice::cpu::detail {

// Lane j of the result = sum of v[j], by a transpose-and-add tree: within each 128-bit quarter
// (l0 + l2) + (l1 + l3), then quarters (q0 + q1) + (q2 + q3). Every slot gets the same tree, and
// zero padding leaves other slots untouched, so a sum never depends on its slot.
inline __m512 reduce16(const __m512* v) {
  __m512 s[8], w[4], y[2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++)
    s[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {
    const __m512d a = _mm512_castps_pd(s[2 * k]), b = _mm512_castps_pd(s[2 * k + 1]);
    w[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; k++)
    y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88), _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
}

}  // namespace sluice::cpu::detail
