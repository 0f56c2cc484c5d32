// AVX2 Q4 matmul. A 128-column chunk's 64 code bytes are two 32-byte halves h = 0, 1: half h's
// low nibbles are the chunk's 32-block h, its high nibbles block 2 + h. Per block, vpmaddubsw
// multiplies codes (u8, 0..15) by activations (s8) into int16 pair sums (|.| <= 2 * 15 * 127, no
// saturation), which vpmaddwd with ones adds into 8 exact int32 lanes. Per chunk and output the
// blocks' lanes are converted and scaled by their dx, then by the groups' scales, into one 8-lane
// f32 accumulator:
//   group a multiple of 128: f = cvt(p0) dx0 + cvt(p1) dx1 + cvt(p2) dx2 + cvt(p3) dx3 (in that
//                            order), acc += f * scale
//   other groups (32, 64, ...): acc += cvt(p_b) * dx_b * scale_b for b = 0, 1, 2, 3
// The accumulator starts from the zero points' term, -scale * zero * (the group's xs summed)
// summed over the groups in 8 lanes; y = hsum8(acc) + bias, an order that depends only on K and
// the group (see gemm_q4.h, gemm.h).
// Decode (small T) streams every weight row once, several far-apart rows per tile; prefill keeps
// a block of weight rows in L2 while 2-row activation tiles pass over it.
// NOTE: compiled for one ISA; it calls no inline function or template shared with baseline files
// (see gemm_avx2.cpp): the buffer's sections come from q4_view_of, out of line.
#include <immintrin.h>

#include "cpu/gemm_q4.h"

namespace sluice::cpu::detail {

namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int kMR = 2, kNR = 4;
constexpr int kDecodeT = 2;
constexpr int64_t kBlockBytes = 128 << 10;
// Decode: rows of up to this many code bytes stream 4 at a time (from 4 places), longer rows 2
// (see gemm_q4_avx512vnni.cpp).
constexpr int64_t kDecodeShortRow = 1024;

inline float hsum8(__m256 v) {  // fixed reduction tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// What every tile of one call reads.
struct Ctx {
  const GemmArgs* a;
  Q4View v;
  int64_t Kp, nb, nc, bpg;  // bpg: blocks per group
  const float* xs_group;    // [T, ng]: xs summed over each group's blocks, in block order
};

// z[i][j] = -(scale[j, g] * zero[j, g] * xs_group[t0 + i, g]) summed over the groups g in 8 lanes,
// 8 groups a step (the last step's missing groups read as 0).
template <int MR, int NR>
void zero_terms(const Ctx& cx, int64_t t0, const float* scales, const uint8_t* zeros, int64_t stride, __m256 (&z)[MR][NR]) {
  const int64_t ng = cx.v.ng;
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) z[i][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; g += 8) {
    const int64_t n = min64(8, ng - g);
    __m256 sz[NR];
    for (int j = 0; j < NR; j++) {
      const float* s = scales + j * stride + g;
      const uint8_t* zb = zeros + j * stride + g;
      if (n == 8) {
        const __m256 zf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zb))));
        sz[j] = _mm256_mul_ps(_mm256_loadu_ps(s), zf);
      } else {
        alignas(32) float sp[8] = {}, zp[8] = {};
        for (int64_t k = 0; k < n; k++) {
          sp[k] = s[k];
          zp[k] = float(zb[k]);
        }
        sz[j] = _mm256_mul_ps(_mm256_load_ps(sp), _mm256_load_ps(zp));
      }
    }
    for (int i = 0; i < MR; i++) {
      const float* xs = cx.xs_group + (t0 + i) * ng + g;
      alignas(32) float xp[8] = {};
      for (int64_t k = 0; k < n && n < 8; k++) xp[k] = xs[k];
      const __m256 x = n == 8 ? _mm256_loadu_ps(xs) : _mm256_load_ps(xp);
      for (int j = 0; j < NR; j++) z[i][j] = _mm256_fnmadd_ps(sz[j], x, z[i][j]);
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
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];  // starts from the zero points' term
  zero_terms<MR, NR>(cx, t0, scales, zeros, group_stride, acc);
  int64_t g = 0, left = bpg;  // the group of the chunk's first block; blocks of it from there
  for (int64_t c = 0; c < nc; c++) {
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
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * code_stride + c * 64));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * code_stride + c * 64 + 32));
      const __m256i q[4] = {_mm256_and_si256(w0, m4), _mm256_and_si256(w1, m4),
                            _mm256_and_si256(_mm256_srli_epi16(w0, 4), m4), _mm256_and_si256(_mm256_srli_epi16(w1, 4), m4)};
      const float* s = scales + j * group_stride;
#pragma GCC unroll 4
      for (int i = 0; i < MR; i++) {
        const int8_t* x = xq + i * Kp + c * kQ4Chunk;
        const float* dx = xd + i * nb + c * 4;
        __m256 f[4];
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
          const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * 32));
          f[b] = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q[b], xb), ones));
        }
        if constexpr (Wide) {
          __m256 sum = _mm256_mul_ps(f[0], _mm256_broadcast_ss(dx));
          sum = _mm256_fmadd_ps(f[1], _mm256_broadcast_ss(dx + 1), sum);
          sum = _mm256_fmadd_ps(f[2], _mm256_broadcast_ss(dx + 2), sum);
          sum = _mm256_fmadd_ps(f[3], _mm256_broadcast_ss(dx + 3), sum);
          acc[i][j] = _mm256_fmadd_ps(sum, _mm256_broadcast_ss(s + gb[0]), acc[i][j]);
        } else {
#pragma GCC unroll 4
          for (int b = 0; b < 4; b++)
            acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(f[b], _mm256_broadcast_ss(dx + b)), _mm256_broadcast_ss(s + gb[b]), acc[i][j]);
        }
      }
    }
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float s = hsum8(acc[i][j]);
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

void gemm_q4_avx2(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
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
    const int64_t block = kNR * (kBlockBytes / row_bytes / kNR > 1 ? kBlockBytes / row_bytes / kNR : 1);
    for (int64_t nb = n_begin; nb < n_end; nb += block) {
      const int64_t ne = min64(n_end, nb + block);
      for (int64_t t = 0; t < a.T; t += kMR) strided_rows(fns, cx, t, int(min64(kMR, a.T - t)), kNR, nb, ne);
    }
  }
}

}  // namespace sluice::cpu::detail
