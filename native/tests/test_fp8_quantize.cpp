// --quantization fp8 (quantize_weights_fp8): each output row of a float projection becomes e4m3
// codes of w / s with s = the row's largest magnitude / 448, checked code for code against the
// format's definition (a nearest-code search over the 254 finite values, independent of the
// encoder), and the layout dequantize_fp8_weights reads back as an FP8 checkpoint with channel
// scales.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/fp8.h"
#include "model/quantize.h"
#include "test_util.h"

using namespace sluice;

namespace {

// The finite e4m3 code nearest to x (ties: the code with an even mantissa), saturating at 448.
uint8_t nearest_code(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 0x7f; c++) {
    const double d = std::fabs(double(e4m3_to_float(uint8_t(c))) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return uint8_t(sign | best);
}

struct Matrix {
  std::vector<uint16_t> bf16;
  TensorView view;
  Matrix(int64_t N, int64_t K, std::mt19937& rng, const char* name) : bf16(size_t(N * K)) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_int_distribution<int> binade(-12, 4);
    for (int64_t n = 0; n < N; n++) {
      const float row_scale = std::ldexp(1.f, binade(rng));  // rows of very different magnitudes
      for (int64_t k = 0; k < K; k++) bf16[size_t(n * K + k)] = f32_to_bf16(normal(rng) * row_scale);
    }
    if (N > 2)  // an all-zero row keeps scale 1
      for (int64_t k = 0; k < K; k++) bf16[size_t(2 * K + k)] = 0;
    view.name = name;
    view.data = bf16.data();
    view.dtype = DType::BF16;
    view.shape = {N, K};
    view.nbytes = bf16.size() * 2;
  }
};

}  // namespace

TEST_CASE(fp8_quantization_codes_and_channel_scales) {
  std::mt19937 rng(11);
  const int64_t H = 96, I = 160;
  std::vector<Matrix> ms;
  ms.reserve(7);
  for (auto [n, k, name] : {std::tuple{H, H, "q"}, {int64_t(32), H, "k"}, {int64_t(32), H, "v"}, {H, H, "o"},
                           {I, H, "gate"}, {I, H, "up"}, {H, I, "down"}})
    ms.emplace_back(n, k, rng, name);
  ModelWeights w;
  w.layers.resize(1);
  LayerWeights& l = w.layers[0];
  TensorView* views[] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
  const TensorView* scales[] = {&l.fp8_scale.q, &l.fp8_scale.k, &l.fp8_scale.v, &l.fp8_scale.o,
                                &l.fp8_scale.gate, &l.fp8_scale.up, &l.fp8_scale.down};
  for (size_t i = 0; i < 7; i++) *views[i] = ms[i].view;
  quantize_weights_fp8(w, 2);
  CHECK(w.main_dtype == DType::F8E4M3);
  int64_t bad_codes = 0, bad_scales = 0;
  for (size_t i = 0; i < 7; i++) {
    const TensorView& t = *views[i];
    const TensorView& s = *scales[i];
    CHECK(t.dtype == DType::F8E4M3 && s.dtype == DType::F32);
    const int64_t N = t.shape[0], K = t.shape[1];
    CHECK(s.shape == std::vector<int64_t>({N, 1}));
    for (int64_t n = 0; n < N; n++) {
      double amax = 0;
      for (int64_t k = 0; k < K; k++) amax = std::max(amax, std::fabs(double(bf16_to_f32(ms[i].bf16[size_t(n * K + k)]))));
      const float want_scale = amax > 0 ? float(amax) / 448.f : 1.f;
      const float scale = static_cast<const float*>(s.data)[n];
      if (scale != want_scale && bad_scales < 3) std::printf("  matrix %zu row %lld scale %g want %g\n", i, (long long)n, scale, want_scale);
      bad_scales += scale != want_scale;
      for (int64_t k = 0; k < K; k++) {
        const float x = bf16_to_f32(ms[i].bf16[size_t(n * K + k)]);
        const uint8_t got = static_cast<const uint8_t*>(t.data)[n * K + k];
        const uint8_t want = nearest_code(double(x / scale));
        // +0 and -0 are both exact for a zero weight.
        if (got != want && !((got & 0x7f) == 0 && (want & 0x7f) == 0)) bad_codes++;
      }
    }
  }
  if (bad_codes || bad_scales) std::printf("  %lld bad codes, %lld bad scales\n", (long long)bad_codes, (long long)bad_scales);
  CHECK(bad_codes == 0 && bad_scales == 0);

  // Read back as an FP8 checkpoint with channel scales: each weight within e4m3's half-step
  // (2^-4 relative) of the original, or of a subnormal step for the smallest.
  QuantizationConfig q;
  q.fp8 = Fp8Scales::Channel;
  dequantize_fp8_weights(w, q, 2);
  int64_t far = 0;
  for (size_t i = 0; i < 7; i++) {
    const TensorView& t = *views[i];
    CHECK(t.dtype == DType::BF16);
    const int64_t N = t.shape[0], K = t.shape[1];
    for (int64_t n = 0; n < N; n++) {
      double amax = 0;
      for (int64_t k = 0; k < K; k++) amax = std::max(amax, std::fabs(double(bf16_to_f32(ms[i].bf16[size_t(n * K + k)]))));
      for (int64_t k = 0; k < K; k++) {
        const double x = bf16_to_f32(ms[i].bf16[size_t(n * K + k)]);
        const double y = bf16_to_f32(static_cast<const uint16_t*>(t.data)[n * K + k]);
        const double tol = std::max(std::fabs(x) * (1.0 / 16 + 1.0 / 256), amax / 448 * std::ldexp(1.0, -10));
        far += std::fabs(y - x) > tol;
      }
    }
  }
  if (far) std::printf("  %lld weights beyond e4m3's rounding\n", (long long)far);
  CHECK(far == 0);
}

TEST_CASE(fp8_quantization_leaves_experts_and_quantized_layers) {
  std::mt19937 rng(3);
  Matrix q(64, 64, rng, "q"), k(32, 64, rng, "k"), v(32, 64, rng, "v"), o(64, 64, rng, "o");
  Matrix eg(48, 64, rng, "gate"), eu(48, 64, rng, "up"), ed(64, 48, rng, "down");
  ModelWeights w;
  w.layers.resize(1);
  LayerWeights& l = w.layers[0];
  l.q = q.view, l.k = k.view, l.v = v.view, l.o = o.view;
  l.experts.resize(1);
  l.experts[0].gate = eg.view, l.experts[0].up = eu.view, l.experts[0].down = ed.view;
  l.gate = eg.view, l.up = eu.view, l.down = ed.view;  // a sparse layer's dense fields are never quantized
  quantize_weights_fp8(w, 1);
  CHECK(l.q.dtype == DType::F8E4M3 && l.o.dtype == DType::F8E4M3);
  CHECK(l.experts[0].gate.dtype == DType::BF16 && l.gate.dtype == DType::BF16 && l.fp8_scale.gate.data == nullptr);
}

int main() { return sluice_test::run_all("test_fp8_quantize"); }
