// Q4 activation quantizer and the portable Q4 matmul (the reference the SIMD kernels are tested
// against). See gemm_q4.h for the layout and the arithmetic.
#include "cpu/gemm_q4.h"

#include <cstring>
#include <vector>

#include "cpu/gemm_q8.h"

namespace sluice::cpu {

Q4View q4_view_of(const void* w) { return q4_view(w); }

const float* q4_group_xs(const detail::GemmArgs& a, const Q4View& v) {
  thread_local std::vector<float> out;
  const int64_t nb = v.h->Kp / kQ8Block, bpg = v.h->group / kQ8Block;
  out.resize(size_t(a.T * v.ng));
  for (int64_t t = 0; t < a.T; t++)
    for (int64_t g = 0; g < v.ng; g++) {
      float s = 0.f;
      for (int64_t b = g * bpg; b < (g + 1) * bpg && b < nb; b++) s += a.xs[t * nb + b];
      out[size_t(t * v.ng + g)] = s;
    }
  return out.data();
}

void quantize_activations_q4(const float* x, int64_t T, int64_t K, const int32_t* perm, int8_t* xq, float* xd,
                             float* xs) {
  const int64_t Kp = q4_padded_k(K), nb = Kp / kQ8Block;
  const int64_t Kp8 = q8_padded_k(K), nb8 = Kp8 / kQ8Block;  // Kp8 <= Kp: Q8 pads to 64 only
  std::vector<float> gathered(perm ? size_t(K) : 0);
  for (int64_t t = 0; t < T; t++) {
    const float* row = x + t * K;
    if (perm) {
      for (int64_t j = 0; j < K; j++) gathered[size_t(j)] = row[perm[j]];
      row = gathered.data();
    }
    int8_t* q = xq + t * Kp;
    float* d = xd + t * nb;
    // NOTE: the Q8 quantizer itself, one row at a time, so the two are bit-identical by
    // construction; the rest of the Kp row is padding (zero blocks).
    quantize_activations_q8(row, 1, K, q, d);
    std::memset(q + Kp8, 0, size_t(Kp - Kp8));
    for (int64_t b = nb8; b < nb; b++) d[b] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kQ8Block; i++) sum += q[b * kQ8Block + i];
      xs[t * nb + b] = d[b] * float(sum);
    }
  }
}

namespace detail {

// The sum exactly as gemm_q4.h writes it: per group, the blocks' dx * sumi and xs summed in
// block order, then scale * (dot - zero * xs sum); groups summed in order, then the bias.
void gemm_q4_generic(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  const Q4View v = q4_view(a.w);
  const int64_t Kp = v.h->Kp, nb = Kp / kQ8Block, bpg = v.h->group / kQ8Block;
  for (int64_t t = 0; t < a.T; t++) {
    const int8_t* xq = a.xq + t * Kp;
    const float* xd = a.xd + t * nb;
    const float* xs = a.xs + t * nb;
    for (int64_t n = n_begin; n < n_end; n++) {
      const uint8_t* row = v.codes + n * (Kp / 2);
      float s = 0.f;
      for (int64_t g = 0; g < v.ng; g++) {
        float dot = 0.f, xsum = 0.f;
        for (int64_t b = g * bpg; b < (g + 1) * bpg && b < nb; b++) {
          int32_t sumi = 0;
          for (int64_t k = b * kQ8Block; k < (b + 1) * kQ8Block; k++) {
            const int64_t r = k % kQ4Chunk;
            const uint8_t byte = row[(k / kQ4Chunk) * 64 + r % 64];
            sumi += int32_t(r < 64 ? byte & 0xf : byte >> 4) * int32_t(xq[k]);
          }
          dot += xd[b] * float(sumi);
          xsum += xs[b];
        }
        s += v.scales[n * v.ng + g] * (dot - float(v.zeros[n * v.ng + g]) * xsum);
      }
      if (a.bias) s += load_scalar(a.bias, a.bias_dtype, n);
      a.y[t * a.N + n] = s;
    }
  }
}

}  // namespace detail

}  // namespace sluice::cpu
