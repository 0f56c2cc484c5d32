// AVX512-VNNI Q4 matmul. One 64-byte load of a row's codes is one 128-column chunk: the low
// nibbles are columns 0..63, the high ones 64..127, each lined up with a 64-byte load of the
// activations. vpdpbusd multiplies codes (u8) by activations (s8) into 16 exact int32 lanes:
// w & 0x0f against columns 0..63 (lanes 0-7: block 0, 8-15: block 1), w & 0xf0 (16 q, the
// shift saved) against columns 64..127 (blocks 2 and 3; their dx are taken / 16, exact). Per
// chunk and output the lanes are converted and scaled by their blocks' dx, then by the groups'
// scales, into one 16-lane f32 accumulator:
//   group a multiple of 128: f = cvt(d_lo) * dx_01 + cvt(d_hi) * dx_23 / 16, acc += f * scale
//   other groups (32, 64, ...): acc += cvt(d_lo) * dx_01 * scale_01, then the same for d_hi
// (scale_01: the scales of the chunk's blocks 0 and 1, 8 lanes each). The accumulator starts
// from the zero points' term, -scale * zero * (the group's xs summed) summed over the groups in 16
// lanes; y = reduce(acc) + bias, an order that depends only on K and the group (see gemm_q4.h,
// gemm.h).
// Decode (small T) streams every weight row once, several far-apart rows per tile; prefill keeps
// a block of weight rows in L2 while 4-row activation tiles pass over it.
// NOTE: compiled for one ISA; it calls no inline function or template shared with baseline files
// (see gemm_avx2.cpp): the buffer's sections come from q4_view_of, out of line.
#include <immintrin.h>

#include "cpu/gemm_q4.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int kMR = 4, kNR = 4;
constexpr int kPrefillNR = 3;
constexpr int kDecodeT = 4;
// Decode: rows of up to this many code bytes stream 4 at a time (from 4 places), longer rows 2.
// NOTE: every row also streams its scales and zeros from their own sections; 4 long rows (12
// streams) measured 15-25% below 2 on the 2-core Zen 4 (K = 3072..8192), 4 short ones better.
constexpr int64_t kDecodeShortRow = 1024;
constexpr int64_t kBlockBytes = 256 << 10;

// What every tile of one call reads.
struct Ctx {
  const GemmArgs* a;
  Q4View v;
  int64_t Kp, nb, nc, bpg;  // bpg: blocks per group
  const float* xs_group;    // [T, ng]: xs summed over each group's blocks, in block order
};

// z[i][j] = -(scale[j, g] * zero[j, g] * xs_group[t0 + i, g]) summed over the groups g in 16
// lanes, 16 groups a step.
template <int MR, int NR>
void zero_terms(const Ctx& cx, int64_t t0, const float* scales, const uint8_t* zeros, int64_t stride, __m512 (&z)[MR][NR]) {
  const int64_t ng = cx.v.ng;
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) z[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; g += 16) {
    const __mmask16 m = ng - g >= 16 ? __mmask16(0xffff) : __mmask16((1u << (ng - g)) - 1);
    __m512 sz[NR];
    for (int j = 0; j < NR; j++) {
      const __m512 zero = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, zeros + j * stride + g)));
      sz[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, scales + j * stride + g), zero);
    }
    for (int i = 0; i < MR; i++) {
      const __m512 s = _mm512_maskz_loadu_ps(m, cx.xs_group + (t0 + i) * ng + g);
      for (int j = 0; j < NR; j++) z[i][j] = _mm512_fnmadd_ps(sz[j], s, z[i][j]);
    }
  }
}

// y[t0 + i, n0 + j*ns] for i < MR, j < NR. Wide: the group is a multiple of 128 (one scale per
// chunk).
template <bool Wide, int MR, int NR>
void tile(const Ctx& cx, int64_t t0, int64_t n0, int64_t ns) {
  const GemmArgs& a = *cx.a;
  const int64_t Kp = cx.Kp, nb = cx.nb, nc = cx.nc, ng = cx.v.ng, bpg = cx.bpg;
  const uint8_t* codes = cx.v.codes + n0 * (Kp / 2);
  const float* scales = cx.v.scales + n0 * ng;
  const uint8_t* zeros = cx.v.zeros + n0 * ng;
  const int64_t code_stride = ns * (Kp / 2), group_stride = ns * ng;
  const int8_t* xq = a.xq + t0 * Kp;
  const float* xd = a.xd + t0 * nb;
  const __m512i lo_mask = _mm512_set1_epi8(0x0f), hi_mask = _mm512_set1_epi8(char(0xf0)), zero = _mm512_setzero_si512();
  // The chunk's four dx (one 128-bit load, the high nibbles' / 16) -> blocks 0, 1 (8 lanes each)
  // and blocks 2, 3.
  const __m128 sixteenth = _mm_setr_ps(1.f, 1.f, 1.f / 16, 1.f / 16);
  const __m512i spread01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i spread23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  __m512 acc[MR][NR];  // starts from the zero points' term
  zero_terms<MR, NR>(cx, t0, scales, zeros, group_stride, acc);
  int64_t g = 0, left = bpg;  // the group of the chunk's first block; blocks of it from there
  for (int64_t c = 0; c < nc; c++) {
    __m512i lo[NR], hi[NR];
    __m512 s01[NR], s23[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      const __m512i w = _mm512_loadu_si512(codes + j * code_stride + c * 64);
      lo[j] = _mm512_and_si512(w, lo_mask);
      hi[j] = _mm512_and_si512(w, hi_mask);
    }
    if constexpr (Wide) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) s01[j] = _mm512_set1_ps(scales[j * group_stride + g]);
      left -= 4;
      if (left == 0) {
        g++;
        left = bpg;
      }
    } else {
      int64_t gb[4];  // the group of each of the chunk's blocks
      for (int b = 0; b < 4; b++) {
        gb[b] = g;
        if (--left == 0) {
          g++;
          left = bpg;
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const float* s = scales + j * group_stride;
        s01[j] = _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(s[gb[0]]), _mm512_set1_ps(s[gb[1]]));
        s23[j] = _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(s[gb[2]]), _mm512_set1_ps(s[gb[3]]));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512i x0 = _mm512_loadu_si512(xq + i * Kp + c * kQ4Chunk);
      const __m512i x1 = _mm512_loadu_si512(xq + i * Kp + c * kQ4Chunk + 64);
      const __m512 dx = _mm512_castps128_ps512(_mm_mul_ps(_mm_loadu_ps(xd + i * nb + c * 4), sixteenth));
      const __m512 dx01 = _mm512_permutexvar_ps(spread01, dx), dx23 = _mm512_permutexvar_ps(spread23, dx);
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const __m512 f0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, lo[j], x0));
        const __m512 f1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, hi[j], x1));
        if constexpr (Wide) {
          const __m512 f = _mm512_fmadd_ps(f1, dx23, _mm512_mul_ps(f0, dx01));
          acc[i][j] = _mm512_fmadd_ps(f, s01[j], acc[i][j]);
        } else {
          acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(f0, dx01), s01[j], acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(f1, dx23), s23[j], acc[i][j]);
        }
      }
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n0 + j * ns);
      a.y[(t0 + i) * a.N + n0 + j * ns] = s;
    }
}

using TileFn = void (*)(const Ctx&, int64_t, int64_t, int64_t);

template <bool Wide>
struct Table {
  TileFn fns[kMR + 1][kNR + 1] = {};
  Table() { fill<1, 1>(); }
  template <int M, int N>
  void fill() {
    fns[M][N] = &tile<Wide, M, N>;
    if constexpr (N < kNR) fill<M, N + 1>();
    else if constexpr (M < kMR) fill<M + 1, 1>();
  }
};

// Rows [nb, ne) cut into `parts` runs; tile i takes row i of every run (see gemm_avx2.cpp).
inline void strided_rows(const TileFn (&fns)[kMR + 1][kNR + 1], const Ctx& cx, int64_t t0, int mr, int parts,
                         int64_t nb, int64_t ne) {
  const int64_t run = (ne - nb) / parts;
  for (int64_t i = 0; i < run; i++) fns[mr][parts](cx, t0, nb + i, run);
  for (int64_t n = nb + run * parts; n < ne; n++) fns[mr][1](cx, t0, n, 1);
}

}  // namespace

void gemm_q4_avx512vnni(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  static const Table<true> wide;
  static const Table<false> narrow;
  Ctx cx;
  cx.a = &a;
  cx.v = q4_view_of(a.w);
  cx.Kp = cx.v.h->Kp;
  cx.nb = cx.Kp / 32;
  cx.nc = cx.Kp / kQ4Chunk;
  cx.bpg = cx.v.h->group / 32;
  const int64_t ng = cx.v.ng;
  cx.xs_group = q4_group_xs(a, cx.v);
  const auto& fns = cx.v.h->group % kQ4Chunk == 0 ? wide.fns : narrow.fns;
  if (a.T <= kDecodeT) {
    strided_rows(fns, cx, 0, int(a.T), cx.Kp / 2 <= kDecodeShortRow ? 4 : 2, n_begin, n_end);
  } else {
    const int64_t row_bytes = cx.Kp / 2 + ng * 5;  // codes, scales, zeros
    const int64_t block = kPrefillNR * (kBlockBytes / row_bytes / kPrefillNR > 1 ? kBlockBytes / row_bytes / kPrefillNR : 1);
    for (int64_t nb = n_begin; nb < n_end; nb += block) {
      const int64_t ne = min64(n_end, nb + block);
      for (int64_t t = 0; t < a.T; t += kMR) strided_rows(fns, cx, t, int(min64(kMR, a.T - t)), kPrefillNR, nb, ne);
    }
  }
}

}  // namespace sluice::cpu::detail
