// Building and reading Q4 buffers (layout in gemm_q4.h); the kernels are in gemm_q4*.cpp.
#include <cstring>

#include "cpu/gemm_q4.h"

namespace sluice::cpu {

namespace {

struct Mutable {
  Q4Header* h;
  Q4Sections s;
  uint8_t* base;
};
Mutable open(void* dst) {
  auto* base = static_cast<uint8_t*>(dst);
  auto* h = reinterpret_cast<Q4Header*>(base);
  return {h, q4_sections(h->N, h->K, h->group, (h->flags & kQ4Perm) != 0), base};
}

}  // namespace

void q4_init(void* dst, int64_t N, int64_t K, int64_t group, const int32_t* perm) {
  const Q4Sections s = q4_sections(N, K, group, perm != nullptr);
  std::memset(dst, 0, s.total);
  Q4Header h;
  h.N = N;
  h.K = K;
  h.Kp = q4_padded_k(K);
  h.group = group;
  h.flags = perm ? kQ4Perm : 0;
  std::memcpy(dst, &h, sizeof h);
  if (perm) std::memcpy(static_cast<uint8_t*>(dst) + s.perm, perm, size_t(K) * 4);
}

void q4_set_code(void* dst, int64_t n, int64_t j, uint8_t q) {
  const Mutable m = open(dst);
  const int64_t c = j / kQ4Chunk, r = j % kQ4Chunk;
  uint8_t& byte = m.base[m.s.codes + size_t(n) * size_t(m.h->Kp / 2) + size_t(c * 64 + r % 64)];
  byte = r < 64 ? uint8_t((byte & 0xf0) | (q & 0xf)) : uint8_t((byte & 0x0f) | ((q & 0xf) << 4));
}

void q4_set_row(void* dst, int64_t n, const uint8_t* codes) {
  const Mutable m = open(dst);
  const int64_t K = m.h->K, Kp = m.h->Kp;
  uint8_t* row = m.base + m.s.codes + size_t(n) * size_t(Kp / 2);
  for (int64_t c = 0; c < Kp / kQ4Chunk; c++)
    for (int64_t j = 0; j < 64; j++) {
      const int64_t lo = c * kQ4Chunk + j, hi = lo + 64;
      row[c * 64 + j] = uint8_t((lo < K ? codes[lo] & 0xf : 0) | (hi < K ? (codes[hi] & 0xf) << 4 : 0));
    }
}

void q4_set_group(void* dst, int64_t n, int64_t g, float scale, uint8_t zero) {
  const Mutable m = open(dst);
  const int64_t ng = q4_groups(m.h->Kp, m.h->group);
  std::memcpy(m.base + m.s.scales + size_t(n * ng + g) * 4, &scale, 4);
  m.base[m.s.zeros + size_t(n * ng + g)] = zero;
}

void q4_dequantize_row(const void* w, int64_t n, float* out) {
  const Q4View v = q4_view(w);
  const int64_t K = v.h->K, Kp = v.h->Kp, G = v.h->group;
  const uint8_t* row = v.codes + size_t(n) * size_t(Kp / 2);
  for (int64_t j = 0; j < K; j++) {
    const uint8_t byte = row[(j / kQ4Chunk) * 64 + (j % kQ4Chunk) % 64];
    const int q = (j % kQ4Chunk) < 64 ? byte & 0xf : byte >> 4;
    const int64_t g = j / G;
    const float value = v.scales[n * v.ng + g] * float(q - int(v.zeros[n * v.ng + g]));
    out[v.perm ? v.perm[j] : j] = value;
  }
}

}  // namespace sluice::cpu
