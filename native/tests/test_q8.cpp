// Q8_0 (int8) weights: the quantizers against plain reference loops (bit exact), the matmul
// kernels at every SIMD level against an integer/double reference (the integer block dots exact,
// the f32 sum over blocks within 1e-5 relative), batch invariance bit for bit, and the quantized
// matmul against the float one within the worst-case rounding bound of the two quantizations.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/gemm_q8.h"
#include "cpu/kernels.h"
#include "test_util.h"

using namespace sluice;
using namespace sluice::cpu;

namespace {

std::mt19937 rng(4242);

std::vector<float> randn(size_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<const char*> levels() {
  std::vector<const char*> out{"generic"};
  if (detected_simd_level() >= SimdLevel::Avx2) out.push_back("avx2");
  if (detected_simd_level() >= SimdLevel::Avx512) out.push_back("avx512");  // VNNI kernel where the CPU has it
  return out;
}

bool bits_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Weights [N, K] stored as `dt` (bytes) and their values as floats.
struct Src {
  std::vector<uint8_t> bytes;
  std::vector<float> value;
};
Src make_src(int64_t N, int64_t K, DType dt, float scale) {
  Src s;
  s.value = randn(size_t(N * K), scale);
  s.bytes.resize(size_t(N * K) * dtype_size(dt));
  for (size_t i = 0; i < s.value.size(); i++) {
    if (dt == DType::F32) {
      std::memcpy(s.bytes.data() + 4 * i, &s.value[i], 4);
    } else {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(s.value[i]) : f32_to_f16(s.value[i]);
      std::memcpy(s.bytes.data() + 2 * i, &h, 2);
      s.value[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  // An all-zero block and a block with one outlier.
  if (K >= 64) {
    std::vector<size_t> edits;
    for (size_t k = 0; k < 32; k++) {
      s.value[k] = 0.f;
      edits.push_back(k);
    }
    s.value[size_t(K + 40)] = 50.f * scale;
    edits.push_back(size_t(K + 40));
    for (size_t i : edits) {
      if (dt == DType::F32) {
        std::memcpy(s.bytes.data() + 4 * i, &s.value[i], 4);
      } else {
        const uint16_t h = dt == DType::BF16 ? f32_to_bf16(s.value[i]) : f32_to_f16(s.value[i]);
        std::memcpy(s.bytes.data() + 2 * i, &h, 2);
        s.value[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
  }
  return s;
}

std::vector<uint8_t> quantize(const Src& s, DType dt, int64_t N, int64_t K) {
  std::vector<uint8_t> q(q8_bytes(N, K));
  quantize_rows_q8(s.bytes.data(), dt, N, K, 0, N / 2, q.data());
  quantize_rows_q8(s.bytes.data(), dt, N, K, N / 2, N, q.data());
  return q;
}

}  // namespace

TEST_CASE(weight_quantizer_matches_reference_bit_for_bit) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t K : {int64_t(64), int64_t(100), int64_t(688), int64_t(896)}) {
      const int64_t N = 7, Kp = q8_padded_k(K), nb = Kp / 32;
      Src s = make_src(N, K, dt, 0.05f);
      std::vector<uint8_t> q = quantize(s, dt, N, K);
      const int8_t* qv = q8_values(q.data());
      const uint16_t* qd = q8_scales(q.data(), N, K);
      int mismatches = 0;
      for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
          float amax = 0.f;
          for (int64_t k = b * 32; k < b * 32 + 32 && k < K; k++) amax = std::max(amax, std::fabs(s.value[size_t(n * K + k)]));
          const uint16_t dh = f32_to_f16(amax / 127.f);
          const float d = f16_to_f32(dh), id = d > 0.f ? 1.f / d : 0.f;
          mismatches += qd[n * nb + b] != dh;
          for (int64_t k = b * 32; k < b * 32 + 32; k++) {
            const float w = k < K ? s.value[size_t(n * K + k)] : 0.f;
            const int want = int(std::max(-127.f, std::min(127.f, std::nearbyint(w * id))));
            mismatches += qv[n * Kp + k] != want;
            // Round to nearest: within half a step (plus the f16 rounding of the step).
            if (k < K && !(std::fabs(double(w) - double(qv[n * Kp + k]) * d) <= 0.5 * d * (1 + 1e-3) + 1e-30)) mismatches++;
          }
        }
      if (mismatches) std::printf("  %s K=%ld: %d mismatches\n", dtype_name(dt), long(K), mismatches);
      CHECK(mismatches == 0);
      CHECK(qd[0] == 0);  // the all-zero block
    }
}

TEST_CASE(activation_quantizer_matches_reference_bit_for_bit) {
  for (int64_t K : {int64_t(5), int64_t(64), int64_t(100), int64_t(4864)}) {
    const int64_t T = 3, Kp = q8_padded_k(K), nb = Kp / 32;
    std::vector<float> x = randn(size_t(T * K), 2.f);
    x[0] = 0.f;
    std::vector<int8_t> xq(size_t(T * Kp), 99);
    std::vector<float> xd(size_t(T * nb));
    quantize_activations_q8(x.data(), T, K, xq.data(), xd.data());
    int mismatches = 0;
    for (int64_t t = 0; t < T; t++)
      for (int64_t b = 0; b < nb; b++) {
        float amax = 0.f;
        for (int64_t k = b * 32; k < b * 32 + 32 && k < K; k++) amax = std::max(amax, std::fabs(x[size_t(t * K + k)]));
        const float id = amax > 0.f ? 127.f / amax : 0.f;
        mismatches += xd[size_t(t * nb + b)] != amax / 127.f;
        for (int64_t k = b * 32; k < b * 32 + 32; k++) {
          const int want = k < K ? int(std::nearbyint(x[size_t(t * K + k)] * id)) : 0;
          mismatches += xq[size_t(t * Kp + k)] != want;
        }
      }
    CHECK(mismatches == 0);
  }
}

// Weights and activations built directly in Q8_0 form with scales of 1: the result is the integer
// dot, exact in f32 (|sum| < 2^24), so every kernel must return it bit for bit.
TEST_CASE(q8_kernels_compute_the_integer_dot_exactly) {
  const int64_t T = 6, K = 896, N = 21, Kp = q8_padded_k(K), nb = Kp / 32;
  std::uniform_int_distribution<int> d8(-127, 127);
  std::vector<uint8_t> w(q8_bytes(N, K));
  int8_t* wq = reinterpret_cast<int8_t*>(w.data());
  for (int64_t i = 0; i < N * Kp; i++) wq[i] = int8_t(i % Kp < K ? d8(rng) : 0);
  uint16_t* wd = reinterpret_cast<uint16_t*>(w.data() + N * Kp);
  for (int64_t i = 0; i < N * nb; i++) wd[i] = 0x3c00;  // 1.0
  std::vector<int8_t> xq(size_t(T * Kp));
  for (int64_t i = 0; i < T * Kp; i++) xq[size_t(i)] = int8_t(i % Kp < K ? d8(rng) : 0);
  xq[0] = xq[1] = 127;
  wq[0] = wq[1] = -127;
  std::vector<float> xd(size_t(T * nb), 1.f);
  std::vector<float> want(size_t(T * N));
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      int64_t s = 0;
      for (int64_t k = 0; k < Kp; k++) s += int64_t(xq[size_t(t * Kp + k)]) * wq[n * Kp + k];
      want[size_t(t * N + n)] = float(s);
    }
  using Kernel = void (*)(const detail::GemmArgs&, int64_t, int64_t);
  std::vector<std::pair<const char*, Kernel>> kernels{{"generic", detail::gemm_q8_generic}};
  if (detected_simd_level() >= SimdLevel::Avx2) kernels.push_back({"avx2", detail::gemm_q8_avx2});
  if (detected_simd_level() >= SimdLevel::Avx512 && detail::cpu_has_avx512vnni())
    kernels.push_back({"avx512vnni", detail::gemm_q8_avx512vnni});
  for (auto& [name, fn] : kernels)
    for (int64_t rows : {int64_t(1), int64_t(2), int64_t(3), int64_t(6)}) {
      detail::GemmArgs a;
      a.xq = xq.data();
      a.xd = xd.data();
      a.T = rows;
      a.K = K;
      a.N = N;
      a.w = w.data();
      a.w_dtype = DType::Q8_0;
      std::vector<float> y(size_t(rows * N));
      a.y = y.data();
      fn(a, 0, N);
      if (!bits_equal(y.data(), want.data(), y.size())) std::printf("  kernel %s rows %ld differs\n", name, long(rows));
      CHECK(bits_equal(y.data(), want.data(), y.size()));
    }
}

TEST_CASE(q8_matmul_matches_reference_at_every_level) {
  ThreadPool pool(2);
  // T <= 2 / 4 take the decode tiles, larger T the prefill ones; K not a multiple of 64 pads.
  const int64_t shapes[][3] = {{1, 64, 10}, {3, 100, 37}, {17, 96, 13}, {5, 896, 70}, {2, 688, 45}, {6, 1536, 700}};
  for (const char* level : levels()) {
    force_simd_level(level);
    for (auto& sh : shapes) {
      const int64_t T = sh[0], K = sh[1], N = sh[2], Kp = q8_padded_k(K), nb = Kp / 32;
      Src s = make_src(N, K, DType::BF16, 0.05f);
      std::vector<uint8_t> w = quantize(s, DType::BF16, N, K);
      std::vector<float> x = randn(size_t(T * K), 1.f), bias = randn(size_t(N), 0.5f);
      std::vector<float> y(size_t(T * N)), yf(size_t(T * N));
      matmul(pool, x.data(), T, K, w.data(), DType::Q8_0, N, bias.data(), DType::F32, y.data());
      matmul(pool, x.data(), T, K, s.bytes.data(), DType::BF16, N, bias.data(), DType::F32, yf.data());
      std::vector<int8_t> xq(size_t(T * Kp));
      std::vector<float> xd(size_t(T * nb));
      quantize_activations_q8(x.data(), T, K, xq.data(), xd.data());
      const int8_t* wq = q8_values(w.data());
      const uint16_t* wd = q8_scales(w.data(), N, K);
      int bad = 0;
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
          // Kernel vs the reference of the same quantized arithmetic.
          double want = bias[size_t(n)], mag = std::fabs(want);
          for (int64_t b = 0; b < nb; b++) {
            int64_t sumi = 0;
            for (int64_t k = b * 32; k < b * 32 + 32; k++) sumi += int64_t(xq[size_t(t * Kp + k)]) * wq[n * Kp + k];
            const double term = double(sumi) * double(xd[size_t(t * nb + b)] * f16_to_f32(wd[n * nb + b]));
            want += term;
            mag += std::fabs(term);
          }
          const double got = y[size_t(t * N + n)];
          if (!(std::fabs(got - want) <= 1e-5 * mag + 1e-6)) bad++;
          // Quantized vs float: each product is off by at most |x| dw/2 + |w| dx/2 + dx dw/4.
          double bound = 1e-5 * mag + 1e-5;
          for (int64_t k = 0; k < K; k++) {
            const double dx = xd[size_t(t * nb + k / 32)], dw = f16_to_f32(wd[n * nb + k / 32]);
            bound += std::fabs(x[size_t(t * K + k)]) * dw * 0.5005 + std::fabs(s.value[size_t(n * K + k)]) * dx * 0.5 + dx * dw * 0.25;
          }
          if (!(std::fabs(got - double(yf[size_t(t * N + n)])) <= bound)) bad++;
        }
      if (bad) std::printf("  level %s T=%ld K=%ld N=%ld: %d outputs out of bounds\n", level, long(T), long(K), long(N), bad);
      CHECK(bad == 0);
    }
  }
  force_simd_level(nullptr);
}

TEST_CASE(q8_matmul_rows_are_bit_identical_whatever_the_batch_and_threads) {
  ThreadPool one(1), two(2);
  const int64_t K = 200, N = 53, T = 37;
  for (const char* level : levels()) {
    force_simd_level(level);
    Src s = make_src(N, K, DType::F32, 0.1f);
    std::vector<uint8_t> w = quantize(s, DType::F32, N, K);
    std::vector<float> x = randn(size_t(T * K), 1.f);
    std::vector<float> all(size_t(T * N)), all1(size_t(T * N)), single(static_cast<size_t>(N));
    matmul(two, x.data(), T, K, w.data(), DType::Q8_0, N, nullptr, DType::F32, all.data());
    matmul(one, x.data(), T, K, w.data(), DType::Q8_0, N, nullptr, DType::F32, all1.data());
    CHECK(bits_equal(all.data(), all1.data(), all.size()));
    for (int64_t t : {int64_t(0), int64_t(5), int64_t(36)}) {
      matmul(two, x.data() + t * K, 1, K, w.data(), DType::Q8_0, N, nullptr, DType::F32, single.data());
      CHECK(bits_equal(single.data(), all.data() + t * N, size_t(N)));
    }
    for (int64_t t0 : {int64_t(1), int64_t(30)})
      for (int64_t rows = 2; rows <= 6; rows++) {
        std::vector<float> part(size_t(rows * N));
        matmul(two, x.data() + t0 * K, rows, K, w.data(), DType::Q8_0, N, nullptr, DType::F32, part.data());
        CHECK(bits_equal(part.data(), all.data() + t0 * N, part.size()));
      }
  }
  force_simd_level(nullptr);
}

int main() { return sluice_test::run_all("q8"); }
