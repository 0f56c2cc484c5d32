// Q8_0 quantizers and the portable Q8_0 matmul (the reference the SIMD kernels are tested
// against). See gemm_q8.h for the layout and the arithmetic.
#include "cpu/gemm_q8.h"

#include <cmath>
#include <cstring>

namespace sluice::cpu {

namespace {

// Round to nearest even for |v| < 2^22 with plain adds (the default rounding mode), so the
// compiler vectorizes it on any x86-64 and it matches cvtps2dq bit for bit.
inline float round_even(float v) {
  const float magic = 12582912.f;  // 1.5 * 2^23
  return (v + magic) - magic;
}

// std::fmax / std::fmin as comparisons: the same results (a NaN operand is ignored, as fmax and
// fmin do; clamp127(NaN) = 127 = fmax(-127, fmin(127, NaN))), but the compiler vectorizes them,
// where fmaxf / fminf stayed library calls (17% of an int8 load's time in quantization).
inline float max_ignoring_nan(float acc, float v) { return v > acc ? v : acc; }
inline float clamp127(float v) {
  const float hi = v < 127.f ? v : 127.f;  // NaN -> 127
  return hi > -127.f ? hi : -127.f;
}

inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::Q8_0:
    case DType::Q4:
    case DType::U8:
    case DType::I32:
    case DType::I64:
    case DType::F8E4M3: break;  // quantize_weights_q8 is given float matrices only
  }
  return 0.f;
}

}  // namespace

void quantize_rows_q8(const void* src, DType src_dtype, int64_t N, int64_t K, int64_t row_begin, int64_t row_end,
                      void* dst) {
  const int64_t Kp = q8_padded_k(K), nb = Kp / kQ8Block;
  int8_t* q = static_cast<int8_t*>(dst);
  uint16_t* d = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(dst) + size_t(N) * size_t(Kp));
  float block[kQ8Block];
  for (int64_t n = row_begin; n < row_end; n++) {
    for (int64_t b = 0; b < nb; b++) {
      float amax = 0.f;
      for (int64_t i = 0; i < kQ8Block; i++) {
        const int64_t k = b * kQ8Block + i;
        block[i] = k < K ? load_f32(src, src_dtype, n * K + k) : 0.f;
        amax = max_ignoring_nan(amax, std::fabs(block[i]));
      }
      // The stored (f16) scale is the one the values are divided by, so q * d is the nearest
      // grid point of the grid actually used. f16 overflow cannot happen for real weights
      // (|w| > 8e6); such a block saturates at the largest f16.
      const uint16_t dh = f32_to_f16(std::fmin(amax / 127.f, 65504.f));
      const float dd = f16_to_f32(dh);
      const float id = dd > 0.f ? 1.f / dd : 0.f;
      d[n * nb + b] = dh;
      int8_t* qb = q + n * Kp + b * kQ8Block;
      for (int64_t i = 0; i < kQ8Block; i++) qb[i] = int8_t(clamp127(round_even(block[i] * id)));
    }
  }
}

void quantize_activations_q8(const float* x, int64_t T, int64_t K, int8_t* xq, float* xd) {
  const int64_t Kp = q8_padded_k(K), nb = Kp / kQ8Block;
  for (int64_t t = 0; t < T; t++) {
    const float* xr = x + t * K;
    int8_t* qr = xq + t * Kp;
    for (int64_t b = 0; b < nb; b++) {
      const int64_t k0 = b * kQ8Block, n = K - k0 < kQ8Block ? (K - k0 > 0 ? K - k0 : 0) : kQ8Block;
      float amax = 0.f;
      for (int64_t i = 0; i < n; i++) amax = max_ignoring_nan(amax, std::fabs(xr[k0 + i]));
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      xd[t * nb + b] = amax / 127.f;
      // |x * id| <= 127 up to one rounding, which round_even maps back to 127.
      for (int64_t i = 0; i < n; i++) qr[k0 + i] = int8_t(round_even(xr[k0 + i] * id));
      for (int64_t i = n; i < kQ8Block; i++) qr[k0 + i] = 0;
    }
  }
}

namespace detail {

void gemm_q8_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  const int64_t Kp = q8_padded_k(a.K), nb = Kp / kQ8Block;
  const int8_t* wq = q8_values(a.w);
  const uint16_t* wd = q8_scales(a.w, a.N, a.K);
  for (int64_t t = 0; t < a.T; t++)
    for (int64_t n = n_begin; n < n_end; n++) {
      float s = 0.f;
      for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        const int8_t* xb = a.xq + t * Kp + b * kQ8Block;
        const int8_t* wb = wq + n * Kp + b * kQ8Block;
        for (int64_t i = 0; i < kQ8Block; i++) sumi += int32_t(xb[i]) * int32_t(wb[i]);
        s += float(sumi) * (a.xd[t * nb + b] * f16_to_f32(wd[n * nb + b]));
      }
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n);
      a.y[t * a.N + n] = s;
    }
}

bool cpu_has_avx512vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

}  // namespace detail

}  // namespace sluice::cpu
