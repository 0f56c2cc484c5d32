// Q4 (AWQ / GPTQ 4-bit) weights: the activation quantizer against Q8_0's (bit exact, through the
// permutation), the buffer's dequantization in the model's column order, every kernel against an
// exact integer reference and a double reference of the quantized arithmetic (within 1e-5 of the
// sum of the terms' magnitudes), the quantized matmul against the float one within the rounding
// bound of the activations' quantization, batch and slice invariance bit for bit, and the
// dispatcher (matmul, matmul_multi, matmul_groups) mixing Q4, permuted Q4, bf16 and Q8_0 outputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/gemm_q4.h"
#include "cpu/gemm_q8.h"
#include "cpu/kernels.h"
#include "test_util.h"

using namespace sluice;
using namespace sluice::cpu;

namespace {

std::mt19937 rng(4404);

std::vector<float> randn(size_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

bool bits_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

std::vector<const char*> levels() {
  std::vector<const char*> out{"generic"};
  if (detected_simd_level() >= SimdLevel::Avx2) out.push_back("avx2");
  if (detected_simd_level() >= SimdLevel::Avx512) out.push_back("avx512");  // VNNI kernel where the CPU has it
  if (detected_simd_level() >= SimdLevel::Avx512Bf16) out.push_back("avx512bf16");  // bf16 outputs on vdpbf16ps
  return out;
}

using Kernel = void (*)(const detail::GemmArgs&, int64_t, int64_t);
struct NamedKernel {
  const char* name;
  Kernel fn;
};
std::vector<NamedKernel> kernels() {
  std::vector<NamedKernel> out{{"generic", detail::gemm_q4_generic}};
  if (detected_simd_level() >= SimdLevel::Avx2) out.push_back({"avx2", detail::gemm_q4_avx2});
  if (detected_simd_level() >= SimdLevel::Avx512 && detail::cpu_has_avx512vnni())
    out.push_back({"avx512vnni", detail::gemm_q4_avx512vnni});
  return out;
}
// The kernel matmul() runs at a forced level.
Kernel kernel_at(const char* level) {
  if (std::strcmp(level, "generic") == 0) return detail::gemm_q4_generic;
  if (std::strcmp(level, "avx2") == 0 || !detail::cpu_has_avx512vnni()) return detail::gemm_q4_avx2;
  return detail::gemm_q4_avx512vnni;
}

std::vector<int32_t> random_perm(int64_t K) {
  std::vector<int32_t> p(static_cast<size_t>(K));
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

// A Q4 matrix [N, K] and its meaning, built independently of q4_dequantize_row.
struct Q4Matrix {
  int64_t N = 0, K = 0, group = 0, ng = 0;
  std::vector<int32_t> perm;  // empty: none
  std::vector<uint8_t> buf;
  std::vector<uint8_t> code;  // [N, K] packed column order
  std::vector<float> scale;   // [N, ng]
  std::vector<uint8_t> zero;  // [N, ng]
  std::vector<float> w;       // [N, K] model column order: scale * (code - zero)
  const int32_t* perm_ptr() const { return perm.empty() ? nullptr : perm.data(); }
  int64_t model_col(int64_t j) const { return perm.empty() ? j : perm[size_t(j)]; }
};

// Codes 0..15 and zeros 0..16 (row 0 has both extremes in its first groups); scales of about
// `mag`, bf16 values as checkpoints store them, some negative; `exact`: scales 0.5 or 1.
Q4Matrix make_q4(int64_t N, int64_t K, int64_t group, bool permuted, float mag = 0.02f, bool exact = false) {
  Q4Matrix m;
  m.N = N;
  m.K = K;
  m.group = group;
  m.ng = q4_groups(q4_padded_k(K), group);
  if (permuted) m.perm = random_perm(K);
  m.buf.resize(q4_bytes(N, K, group, permuted));
  q4_init(m.buf.data(), N, K, group, m.perm_ptr());
  m.code.resize(size_t(N * K));
  m.scale.assign(size_t(N * m.ng), 0.f);
  m.zero.assign(size_t(N * m.ng), 0);
  m.w.resize(size_t(N * K));
  for (int64_t n = 0; n < N; n++) {
    for (int64_t j = 0; j < K; j++) {
      const uint8_t q = uint8_t(rand_int(0, 15));
      m.code[size_t(n * K + j)] = q;
      q4_set_code(m.buf.data(), n, j, q);
    }
    for (int64_t g = 0; g < m.ng; g++) {
      if (g * group >= K) continue;  // all padding: scale 0, zero 0
      float s;
      if (exact) {
        s = rand_int(0, 1) ? 0.5f : 1.f;
      } else {
        s = bf16_to_f32(f32_to_bf16(mag * (0.5f + std::uniform_real_distribution<float>(0.f, 1.f)(rng))));
        if (rand_int(0, 7) == 0) s = -s;
      }
      uint8_t z = uint8_t(rand_int(0, 16));
      if (n == 0 && g < 2) z = g == 0 ? 0 : 16;
      m.scale[size_t(n * m.ng + g)] = s;
      m.zero[size_t(n * m.ng + g)] = z;
      q4_set_group(m.buf.data(), n, g, s, z);
    }
    for (int64_t j = 0; j < K; j++) {
      const size_t gi = size_t(n * m.ng + j / group);
      m.w[size_t(n * K + m.model_col(j))] = m.scale[gi] * (float(m.code[size_t(n * K + j)]) - float(m.zero[gi]));
    }
  }
  return m;
}

// quantize_activations_q4 of x [T, K] through m's permutation.
struct QAct {
  std::vector<int8_t> xq;
  std::vector<float> xd, xs;
};
QAct quantize(const Q4Matrix& m, const float* x, int64_t T) {
  const int64_t Kp = q4_padded_k(m.K);
  QAct a;
  a.xq.resize(size_t(T * Kp));
  a.xd.resize(size_t(T * Kp / 32));
  a.xs.resize(size_t(T * Kp / 32));
  quantize_activations_q4(x, T, m.K, m.perm_ptr(), a.xq.data(), a.xd.data(), a.xs.data());
  return a;
}

detail::GemmArgs args_for(const Q4Matrix& m, const QAct& q, int64_t T, float* y, const void* bias = nullptr,
                          DType bias_dtype = DType::F32) {
  detail::GemmArgs a;
  a.T = T;
  a.K = m.K;
  a.N = m.N;
  a.w = m.buf.data();
  a.w_dtype = DType::Q4;
  a.xq = q.xq.data();
  a.xd = q.xd.data();
  a.xs = q.xs.data();
  a.bias = bias;
  a.bias_dtype = bias_dtype;
  a.y = y;
  return a;
}

// Double reference of the quantized arithmetic for y[t, n] (from the model-order weights and the
// dequantized activations), and the sum of the magnitudes of every term any kernel adds.
struct Ref {
  double y, mag;
};
Ref reference(const Q4Matrix& m, const QAct& q, int64_t t, int64_t n, double bias) {
  const int64_t K = m.K, Kp = q4_padded_k(K), nb = Kp / 32;
  Ref r{bias, std::fabs(bias)};
  for (int64_t j = 0; j < K; j++) {
    const double xv = double(q.xq[size_t(t * Kp + j)]) * double(q.xd[size_t(t * nb + j / 32)]);
    r.y += double(m.w[size_t(n * K + m.model_col(j))]) * xv;
    const size_t gi = size_t(n * m.ng + j / m.group);
    r.mag += std::fabs(double(m.scale[gi])) * (double(m.code[size_t(n * K + j)]) + double(m.zero[gi])) * std::fabs(xv);
  }
  return r;
}

}  // namespace

TEST_CASE(activation_quantizer_is_q8s_on_the_permuted_rows) {
  for (int64_t K : {int64_t(5), int64_t(96), int64_t(200), int64_t(896), int64_t(4864)})
    for (bool permuted : {false, true}) {
      const int64_t T = 3, Kp = q4_padded_k(K), nb = Kp / 32, Kp8 = q8_padded_k(K), nb8 = Kp8 / 32;
      std::vector<float> x = randn(size_t(T * K), 2.f);
      for (int64_t k = 0; k < std::min<int64_t>(K, 32); k++) x[size_t(K + k)] = 0.f;  // a zero block (row 1)
      x[size_t(2 * K)] = 1e4f;
      const std::vector<int32_t> perm = permuted ? random_perm(K) : std::vector<int32_t>{};
      std::vector<int8_t> xq(size_t(T * Kp), 99);
      std::vector<float> xd(size_t(T * nb), 99.f), xs(size_t(T * nb), 99.f);
      quantize_activations_q4(x.data(), T, K, permuted ? perm.data() : nullptr, xq.data(), xd.data(), xs.data());
      std::vector<float> gathered(size_t(T * K));
      for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++) gathered[size_t(t * K + j)] = x[size_t(t * K + (permuted ? perm[size_t(j)] : j))];
      std::vector<int8_t> q8(size_t(T * Kp8));
      std::vector<float> d8(size_t(T * nb8));
      quantize_activations_q8(gathered.data(), T, K, q8.data(), d8.data());
      int mismatches = 0;
      for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < Kp; k++) mismatches += xq[size_t(t * Kp + k)] != (k < Kp8 ? q8[size_t(t * Kp8 + k)] : 0);
        for (int64_t b = 0; b < nb; b++) {
          const float want_d = b < nb8 ? d8[size_t(t * nb8 + b)] : 0.f;
          mismatches += std::memcmp(&xd[size_t(t * nb + b)], &want_d, 4) != 0;
          int sum = 0;
          for (int64_t k = b * 32; k < b * 32 + 32; k++) sum += xq[size_t(t * Kp + k)];
          const float want_s = want_d * float(sum);
          mismatches += std::memcmp(&xs[size_t(t * nb + b)], &want_s, 4) != 0;
        }
      }
      if (mismatches) std::printf("  K=%ld perm=%d: %d mismatches\n", long(K), int(permuted), mismatches);
      CHECK(mismatches == 0);
    }
}

TEST_CASE(q4_buffer_holds_the_codes_where_the_layout_says_and_dequantizes_in_model_order) {
  for (int64_t group : {int64_t(32), int64_t(128)})
    for (bool permuted : {false, true}) {
      const int64_t N = 5, K = 200, Kp = q4_padded_k(K);
      const Q4Matrix m = make_q4(N, K, group, permuted);
      const Q4View v = q4_view(m.buf.data());
      CHECK(v.h->N == N && v.h->K == K && v.h->Kp == 256 && v.h->group == group && v.ng == m.ng);
      CHECK((v.perm != nullptr) == permuted);
      CHECK(reinterpret_cast<uintptr_t>(v.codes) % 64 == reinterpret_cast<uintptr_t>(m.buf.data()) % 64);
      int bad = 0;
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < Kp; j++) {
          const uint8_t byte = v.codes[n * (Kp / 2) + (j / 128) * 64 + (j % 128) % 64];
          const int q = (j % 128) < 64 ? byte & 0xf : byte >> 4;
          bad += q != (j < K ? m.code[size_t(n * K + j)] : 0);
        }
        for (int64_t g = 0; g < m.ng; g++)
          bad += v.scales[n * m.ng + g] != m.scale[size_t(n * m.ng + g)] || v.zeros[n * m.ng + g] != m.zero[size_t(n * m.ng + g)];
        q4_dequantize_row(m.buf.data(), n, row.data());
        bad += !bits_equal(row.data(), m.w.data() + n * K, size_t(K));
      }
      CHECK(bad == 0);
    }
}

// Weights with scales 0.5 or 1 and activations with dx 0.5 or 1: every product is a multiple of
// 1/4 and every partial sum (in any order, of either form of the dot in gemm_q4.h) is at most
// 2 * mag < 2^23 in multiples of 1/2 or mag < 2^22 in multiples of 1/4, exact in f32: every kernel
// must return the exact value bit for bit.
TEST_CASE(q4_kernels_compute_the_exact_dot_when_it_is_representable) {
  const int64_t N = 13;
  for (int64_t K : {int64_t(96), int64_t(200), int64_t(896)})
    for (int64_t group : {int64_t(32), int64_t(64), int64_t(96), int64_t(128), int64_t(256), q4_padded_k(K)}) {
      const int64_t T = 6, Kp = q4_padded_k(K), nb = Kp / 32;
      const Q4Matrix m = make_q4(N, K, group, false, 0.f, true);
      QAct q;
      q.xq.assign(size_t(T * Kp), 0);
      q.xd.resize(size_t(T * nb));
      q.xs.resize(size_t(T * nb));
      for (int64_t t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++) q.xq[size_t(t * Kp + k)] = int8_t(t == 0 && k < 32 ? 127 : t == 1 && k < 32 ? -127 : rand_int(-127, 127));
        for (int64_t b = 0; b < nb; b++) {
          q.xd[size_t(t * nb + b)] = rand_int(0, 1) ? 0.5f : 1.f;
          int sum = 0;
          for (int64_t k = b * 32; k < b * 32 + 32; k++) sum += q.xq[size_t(t * Kp + k)];
          q.xs[size_t(t * nb + b)] = q.xd[size_t(t * nb + b)] * float(sum);
        }
      }
      std::vector<float> want(size_t(T * N));
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
          const Ref r = reference(m, q, t, n, 0.);
          CHECK(r.mag < double(1 << 22));
          want[size_t(t * N + n)] = float(r.y);
        }
      for (const NamedKernel& k : kernels())
        for (int64_t rows = 1; rows <= T; rows++) {
          std::vector<float> y(size_t(rows * N));
          k.fn(args_for(m, q, rows, y.data()), 0, N);
          if (!bits_equal(y.data(), want.data(), y.size()))
            std::printf("  %s K=%ld group=%ld rows=%ld differs\n", k.name, long(K), long(group), long(rows));
          CHECK(bits_equal(y.data(), want.data(), y.size()));
        }
    }
}

TEST_CASE(q4_matmul_matches_the_references_at_every_level) {
  ThreadPool pool(2);
  struct Shape {
    int64_t T, K, N, group;
    bool permuted;
    int bias;  // 0: none, 1: f32, 2: bf16
  };
  // T <= 2 / 4 take the decode tiles, larger T the prefill ones; K = 96 and 200 pad to 128 and
  // 256; groups 32 and 64 (and 96) take the per-block scale path, multiples of 128 the per-chunk
  // one; a group of Kp is per-channel.
  const Shape shapes[] = {{1, 96, 7, 32, false, 1},    {2, 200, 13, 64, true, 2},  {3, 896, 37, 128, true, 0},
                          {4, 200, 25, 256, false, 1}, {5, 896, 41, 896, true, 2}, {17, 200, 29, 96, true, 1},
                          {17, 896, 31, 32, true, 1},  {64, 896, 45, 128, false, 2}, {64, 200, 33, 64, true, 0},
                          {1, 4864, 19, 128, true, 1}};
  for (const char* level : levels()) {
    force_simd_level(level);
    for (const Shape& sh : shapes) {
      const int64_t T = sh.T, K = sh.K, N = sh.N, nb = q4_padded_k(K) / 32;
      const Q4Matrix m = make_q4(N, K, sh.group, sh.permuted);
      std::vector<float> x = randn(size_t(T * K), 1.f), bias = randn(size_t(N), 0.5f);
      std::vector<uint16_t> bias16(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; n++) {
        bias16[size_t(n)] = f32_to_bf16(bias[size_t(n)]);
        if (sh.bias == 2) bias[size_t(n)] = bf16_to_f32(bias16[size_t(n)]);
        if (sh.bias == 0) bias[size_t(n)] = 0.f;
      }
      const void* b = sh.bias == 0 ? nullptr : sh.bias == 1 ? static_cast<const void*>(bias.data()) : bias16.data();
      const DType bdt = sh.bias == 2 ? DType::BF16 : DType::F32;
      std::vector<float> y(size_t(T * N)), yf(size_t(T * N)), yk(size_t(T * N));
      matmul(pool, x.data(), T, K, m.buf.data(), DType::Q4, N, b, bdt, y.data());
      matmul(pool, x.data(), T, K, m.w.data(), DType::F32, N, b, bdt, yf.data());
      const QAct q = quantize(m, x.data(), T);
      kernel_at(level)(args_for(m, q, T, yk.data(), b, bdt), 0, N);
      CHECK(bits_equal(y.data(), yk.data(), y.size()));  // matmul ran the level's kernel
      int bad = 0;
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
          const Ref r = reference(m, q, t, n, bias[size_t(n)]);
          const double got = y[size_t(t * N + n)];
          if (!(std::fabs(got - r.y) <= 1e-5 * r.mag + 1e-6)) bad++;
          // Against the float matmul: each activation is off by at most half its block's step.
          double bound = 1e-5 * r.mag + 1e-5;
          for (int64_t j = 0; j < K; j++) {
            const int64_t k = m.model_col(j);
            bound += std::fabs(m.w[size_t(n * K + k)]) * (0.5005 * q.xd[size_t(t * nb + j / 32)] + 1e-5 * std::fabs(x[size_t(t * K + k)]));
          }
          if (!(std::fabs(got - double(yf[size_t(t * N + n)])) <= bound)) bad++;
        }
      if (bad)
        std::printf("  level %s T=%ld K=%ld N=%ld group=%ld: %d outputs out of bounds\n", level, long(T), long(K), long(N),
                    long(sh.group), bad);
      CHECK(bad == 0);
    }
  }
  force_simd_level(nullptr);
}

// Each kernel alone: a row's result is the same bits with T = 1, inside any batch, and in any
// slice of the outputs (which changes the tiles' shapes and strides).
TEST_CASE(q4_kernels_are_batch_and_slice_invariant) {
  const int64_t T = 37, N = 53;
  // K = 2304: rows of more than 1 KiB of codes, which decode streams 2 at a time, not 4.
  for (int64_t K : {int64_t(200), int64_t(896), int64_t(2304)})
    for (int64_t group : {int64_t(32), int64_t(128)}) {
      const Q4Matrix m = make_q4(N, K, group, true);
      const std::vector<float> x = randn(size_t(T * K), 1.f), bias = randn(size_t(N), 0.5f);
      const QAct q = quantize(m, x.data(), T);
      const int64_t Kp = q4_padded_k(K), nb = Kp / 32;
      for (const NamedKernel& k : kernels()) {
        std::vector<float> all(size_t(T * N));
        k.fn(args_for(m, q, T, all.data(), bias.data()), 0, N);
        int bad = 0;
        auto window = [&](int64_t t0, int64_t rows, int64_t nb0, int64_t ne) {
          QAct w;
          w.xq.assign(q.xq.begin() + t0 * Kp, q.xq.begin() + (t0 + rows) * Kp);
          w.xd.assign(q.xd.begin() + t0 * nb, q.xd.begin() + (t0 + rows) * nb);
          w.xs.assign(q.xs.begin() + t0 * nb, q.xs.begin() + (t0 + rows) * nb);
          std::vector<float> y(size_t(rows * N), -1.f);
          k.fn(args_for(m, w, rows, y.data(), bias.data()), nb0, ne);
          for (int64_t t = 0; t < rows; t++)
            bad += !bits_equal(y.data() + t * N + nb0, all.data() + (t0 + t) * N + nb0, size_t(ne - nb0));
        };
        for (int64_t t = 0; t < T; t++) window(t, 1, 0, N);
        for (int64_t rows : {int64_t(2), int64_t(3), int64_t(4), int64_t(5), int64_t(6), int64_t(17)})
          for (int64_t t0 : {int64_t(1), int64_t(T - rows)}) window(t0, rows, 0, N);
        for (int64_t rows : {int64_t(1), int64_t(3), int64_t(5)})
          for (auto [nb0, ne] : {std::pair<int64_t, int64_t>{0, 1}, {3, 4}, {5, 12}, {7, 50}, {1, 53}, {13, 31}}) window(4, rows, nb0, ne);
        if (bad) std::printf("  %s K=%ld group=%ld: %d windows differ\n", k.name, long(K), long(group), bad);
        CHECK(bad == 0);
      }
    }
}

TEST_CASE(q4_matmul_rows_are_bit_identical_whatever_the_batch_and_threads) {
  ThreadPool one(1), two(2);
  const int64_t K = 200, N = 53, T = 37;
  for (const char* level : levels()) {
    force_simd_level(level);
    const Q4Matrix m = make_q4(N, K, 64, true);
    std::vector<float> x = randn(size_t(T * K), 1.f);
    std::vector<float> all(size_t(T * N)), all1(size_t(T * N)), single(static_cast<size_t>(N));
    matmul(two, x.data(), T, K, m.buf.data(), DType::Q4, N, nullptr, DType::F32, all.data());
    matmul(one, x.data(), T, K, m.buf.data(), DType::Q4, N, nullptr, DType::F32, all1.data());
    CHECK(bits_equal(all.data(), all1.data(), all.size()));
    for (int64_t t : {int64_t(0), int64_t(5), int64_t(36)}) {
      matmul(two, x.data() + t * K, 1, K, m.buf.data(), DType::Q4, N, nullptr, DType::F32, single.data());
      CHECK(bits_equal(single.data(), all.data() + t * N, size_t(N)));
    }
    for (int64_t t0 : {int64_t(1), int64_t(30)})
      for (int64_t rows = 2; rows <= 6; rows++) {
        std::vector<float> part(size_t(rows * N));
        matmul(two, x.data() + t0 * K, rows, K, m.buf.data(), DType::Q4, N, nullptr, DType::F32, part.data());
        CHECK(bits_equal(part.data(), all.data() + t0 * N, part.size()));
      }
  }
  force_simd_level(nullptr);
}

// One parallel region over two groups of activations, mixing Q4 without and with a permutation
// (the same permuted weights twice: they share one quantized copy), bf16 and Q8_0 outputs: every
// output is what matmul() gives it alone.
TEST_CASE(matmul_groups_mix_q4_permuted_q4_bf16_and_q8) {
  ThreadPool pool(2);
  const int64_t K = 200;
  const Q4Matrix plain = make_q4(31, K, 128, false), permuted = make_q4(29, K, 32, true), other = make_q4(27, K, 64, true);
  std::vector<uint16_t> wb(size_t(23 * K));
  for (auto& h : wb) h = f32_to_bf16(std::normal_distribution<float>(0.f, 0.05f)(rng));
  const std::vector<float> w8f = randn(size_t(17 * K), 0.05f);
  std::vector<uint8_t> w8(q8_bytes(17, K));
  quantize_rows_q8(w8f.data(), DType::F32, 17, K, 0, 17, w8.data());
  const std::vector<float> bias = randn(64, 0.5f);
  for (const char* level : levels()) {
    force_simd_level(level);
    const int64_t Ta = 5, Tb = 3;
    const std::vector<float> xa = randn(size_t(Ta * K), 1.f), xb = randn(size_t(Tb * K), 1.f);
    std::vector<std::vector<float>> ys;
    auto out = [&](const void* w, DType dt, int64_t N, int64_t T) {
      ys.emplace_back(size_t(T * N), -1.f);
      return LinearOut{w, dt, N, bias.data(), DType::F32, ys.back().data()};
    };
    ys.reserve(8);
    const LinearOut outs_a[] = {out(plain.buf.data(), DType::Q4, 31, Ta), out(permuted.buf.data(), DType::Q4, 29, Ta),
                                out(wb.data(), DType::BF16, 23, Ta), out(permuted.buf.data(), DType::Q4, 29, Ta),
                                out(w8.data(), DType::Q8_0, 17, Ta)};
    const LinearOut outs_b[] = {out(other.buf.data(), DType::Q4, 27, Tb), out(plain.buf.data(), DType::Q4, 31, Tb)};
    const MatmulGroup groups[] = {{xa.data(), Ta, K, outs_a, 5}, {xb.data(), Tb, K, outs_b, 2}};
    matmul_groups(pool, groups, 2);
    int bad = 0;
    for (const MatmulGroup& g : groups)
      for (int i = 0; i < g.num_outs; i++) {
        const LinearOut& o = g.outs[i];
        std::vector<float> alone(size_t(g.T * o.N));
        matmul(pool, g.x, g.T, K, o.w, o.w_dtype, o.N, o.bias, o.bias_dtype, alone.data());
        bad += !bits_equal(alone.data(), o.y, alone.size());
      }
    // matmul_multi over the first group's outputs: the same bits again.
    std::vector<std::vector<float>> again;
    std::vector<LinearOut> outs_multi(outs_a, outs_a + 5);
    for (LinearOut& o : outs_multi) {
      again.emplace_back(size_t(Ta * o.N));
      o.y = again.back().data();
    }
    matmul_multi(pool, xa.data(), Ta, K, outs_multi.data(), 5);
    for (int i = 0; i < 5; i++) bad += !bits_equal(again[size_t(i)].data(), outs_a[i].y, again[size_t(i)].size());
    if (bad) std::printf("  level %s: %d outputs differ\n", level, bad);
    CHECK(bad == 0);
  }
  force_simd_level(nullptr);
}

TEST_CASE(matmul_refuses_q4_weights_of_another_shape) {
  ThreadPool pool(2);
  const Q4Matrix m = make_q4(7, 200, 64, false);
  std::vector<float> x(3 * 256), y(3 * 7);
  for (auto [K, N] : {std::pair<int64_t, int64_t>{256, 7}, {200, 8}}) {
    bool thrown = false;
    try {
      matmul(pool, x.data(), 3, K, m.buf.data(), DType::Q4, N, nullptr, DType::F32, y.data());
    } catch (const std::invalid_argument&) {
      thrown = true;
    }
    CHECK(thrown);
  }
}

// The work list balances the bytes the kernels stream: a Q4 row costs its codes, scales and
// zeros (Kp / 2 + 5 per group), far less than a bf16 row of the same K.
TEST_CASE(matmul_chunks_count_the_bytes_of_q4_rows) {
  const int64_t N = 4864, K = 896;
  std::vector<uint8_t> q(q4_bytes(N, K, 128, false));
  q4_init(q.data(), N, K, 128, nullptr);
  const int64_t q4_row = q4_padded_k(K) / 2 + q4_groups(q4_padded_k(K), 128) * 5, bf16_row = 2 * K;
  const LinearOut outs[] = {{nullptr, DType::BF16, N, nullptr, DType::F32, nullptr},
                            {q.data(), DType::Q4, N, nullptr, DType::F32, nullptr}};
  std::vector<MatmulChunk> chunks;
  matmul_chunks(outs, 2, K, 2, chunks);
  // Chunks cover every row of both outputs in order.
  int64_t next[2] = {0, 0};
  for (const MatmulChunk& c : chunks) {
    CHECK(c.begin == next[c.out] && c.end > c.begin);
    next[c.out] = c.end;
  }
  CHECK(next[0] == N && next[1] == N);
  // The first chunk takes about a quarter of all the bytes (1 / (2 * threads)), in whole 12 rows.
  const double quarter = double(N * (bf16_row + q4_row)) / 4;
  CHECK(chunks[0].out == 0 && std::fabs(double((chunks[0].end - chunks[0].begin) * bf16_row) - quarter) <= 12. * bf16_row);
}

int main() { return sluice_test::run_all("gemm_q4"); }
