// The CUDA kernels of the vision-language (Qwen2-VL / Qwen2.5-VL) step, against host references:
//  - rope_table_mrope (M-RoPE): pair i of token t rotates by component 0 (time), 1 (height) or 2
//    (width) of t's rope position, by the section holding i, for sections [4, 6, 6] at head_dim 32
//    and [16, 24, 24] at head_dim 128 (Qwen2.5-VL), over tokens whose three components differ,
//    large positions and text tokens (three equal components); the latter's rows must equal
//    rope_table's bit for bit, as the plain path's table;
//  - scatter_rows after embedding (with a scale): the given rows take the f32 source rows exactly
//    (no scale), the others keep their embedding.
// Exits 77 (ctest: skipped) without a CUDA device.
//
// Tolerances: the kernels form angles and their cos/sin in double, as the reference, then round
// to f32: within 1.5 f32 ulps of 1 (the device's and the host's libm may differ in the last
// double bit, which can move the rounding). The scatter and embedding are exact.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/kernels.h"
#include "sluice/dtype.h"
#include "test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

// Qwen2.5-VL's inverse frequencies (theta 1e6), rounded to f32 as the weights upload holds them.
std::vector<float> inv_freq(int head_dim, double theta) {
  std::vector<float> f(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; i++) f[size_t(i)] = float(1.0 / std::pow(theta, 2.0 * i / head_dim));
  return f;
}

TEST_CASE(mrope_table_takes_each_pair_from_its_section) {
  struct Case {
    int head_dim;
    int sections[3];
  };
  for (const Case& k : {Case{32, {4, 6, 6}}, Case{128, {16, 24, 24}}}) {
    const int half = k.head_dim / 2;
    CHECK(k.sections[0] + k.sections[1] + k.sections[2] == half);
    const std::vector<float> freq = inv_freq(k.head_dim, 1e6);
    // (t, h, w) per token: an image patch grid (three different components), a text token after
    // it, a large position, and zeros.
    const std::vector<int32_t> rpos = {
        5,  17, 3,  5,     17, 4,    5, 18,     3,  // image tokens: three different components
        21, 21, 21,                                 // a text token: plain rope at 21
        0,  0,  0,  30000, 2,  9999, 7, 123456, 1,  400000, 400000, 400000,
    };
    const int T = int(rpos.size() / 3);
    Dev<int32_t> drpos(rpos);
    Dev<float> dfreq(freq);
    Dev<float> table(size_t(T) * 2 * half);
    cuda::rope_table_mrope(drpos.p, T, dfreq.p, half, k.sections[0], k.sections[1], table.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = table.read();
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < T; t++)
      for (int i = 0; i < half; i++) {
        const int c = i < k.sections[0] ? 0 : i < k.sections[0] + k.sections[1] ? 1 : 2;
        const double angle = double(rpos[size_t(3 * t + c)]) * double(freq[size_t(i)]);
        const double want_c = std::cos(angle), want_s = std::sin(angle);
        const double ec = std::fabs(got[size_t(t) * 2 * half + i] - want_c);
        const double es = std::fabs(got[size_t(t) * 2 * half + half + i] - want_s);
        worst = std::max({worst, ec, es});
        bad += !(ec <= 1.5 * 0x1p-24) + !(es <= 1.5 * 0x1p-24);
      }
    if (bad) std::printf("  head_dim %d: %d bad (worst %.3g)\n", k.head_dim, bad, worst);
    CHECK(bad == 0);

    // Text tokens (three equal components): the plain table's values, bit for bit.
    std::vector<int32_t> pos, text_rpos;
    for (int t = 0; t < T; t++)
      if (rpos[size_t(3 * t)] == rpos[size_t(3 * t + 1)] && rpos[size_t(3 * t)] == rpos[size_t(3 * t + 2)]) {
        pos.push_back(rpos[size_t(3 * t)]);
        for (int c = 0; c < 3; c++) text_rpos.push_back(rpos[size_t(3 * t)]);
      }
    const int Tt = int(pos.size());
    CHECK(Tt == 3);
    Dev<int32_t> dpos(pos), dtext(text_rpos);
    Dev<float> plain(size_t(Tt) * 2 * half), mrope(size_t(Tt) * 2 * half);
    cuda::rope_table(dpos.p, Tt, dfreq.p, half, plain.p, nullptr);
    cuda::rope_table_mrope(dtext.p, Tt, dfreq.p, half, k.sections[0], k.sections[1], mrope.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> a = plain.read(), b = mrope.read();
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

TEST_CASE(given_rows_replace_the_embedding_unscaled) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int H : {40, 3584}) {
    const int V = 12, ld = (H + 7) / 8 * 8, T = 9;
    const float scale = 2.5f;
    std::vector<uint16_t> table(size_t(V) * ld, 0);
    for (auto& v : table) v = f32_to_bf16(nd(rng));
    const std::vector<int32_t> ids = {3, 11, 11, 11, 0, 7, 11, 11, 2};  // 11: the image placeholder
    const std::vector<int32_t> rows = {1, 2, 3, 6, 7};
    std::vector<float> src(rows.size() * size_t(H));
    for (auto& v : src) v = nd(rng) * 100.f;
    Dev<uint16_t> dtable(table);
    Dev<int32_t> dids(ids), drows(rows);
    Dev<float> dsrc(src), x(size_t(T) * H);
    cuda::embedding(dids.p, T, dtable.p, ld, DType::BF16, H, scale, x.p, nullptr);
    cuda::scatter_rows(dsrc.p, drows.p, int(rows.size()), H, x.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got = x.read();
    int bad = 0;
    for (int t = 0, given = 0; t < T; t++) {
      const bool is_given = given < int(rows.size()) && rows[size_t(given)] == t;
      for (int i = 0; i < H; i++) {
        const float want = is_given ? src[size_t(given) * H + i]
                                    : bf16_to_f32(table[size_t(ids[size_t(t)]) * ld + i]) * scale;
        bad += std::memcmp(&got[size_t(t) * H + i], &want, sizeof(float)) != 0;
      }
      if (is_given) given++;
    }
    if (bad) std::printf("  H=%d: %d differ\n", H, bad);
    CHECK(bad == 0);
  }
}

}  // namespace

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda mrope")) return rc;
  return sluice_test::run_all("cuda mrope");
}
