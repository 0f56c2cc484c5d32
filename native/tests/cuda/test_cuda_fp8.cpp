// FP8 kernels (cuda/fp8_gemm.h) against host references. Exits 77 (ctest: skipped) when no CUDA
// device is present; the GEMM checks print and pass on a device without e4m3 MMA (before sm_89).
//
// Quantization: bit for bit against an emulation of cvt.rn.satfinite.e4m3 (the nearest code, ties
// to the even code, saturated to +-448, the sign kept) of x / (amax / 448) in f32.
//
// GEMM: against float64 sums of the exact e4m3 values times their scales. Two tolerances:
// - Small-integer operands (codes of -8 .. 8): every 128-column partial is an integer under 2^14,
//   exact in the MMA's accumulator whatever its width, so the only errors are the f32 promotions
//   (one rounding of w_scale * x_scale and one FMA per block, or a sum then two products) and
//   the bias: |y - ref| <= (blocks + 3) * 2^-23 * (sum|x * w| + |bias|). This pins the fragment
//   mapping, the scale layouts and the edges at f32 accuracy.
// - Quantized activations times full-range weights: the e4m3 MMA accumulates in fewer bits than
//   f32 on sm_89 / sm_90 (13 mantissa bits reported), up to 4 chained MMAs per promotion, so the
//   check allows 1e-3 * sum|x * w| (about 4 steps of 2^-13).
// A 16-bit output adds its rounding: 2^-8 (bf16) or 2^-11 (f16) of |y|, plus 2^-24 for f16
// subnormals. Bit for bit: reruns, and each token's row alone (T = 1) against the same row in
// calls of every tile shape (T = 7, 20, 64, 300).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cuda/fp8_gemm.h"
#include "model/fp8.h"
#include "sluice/dtype.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// The nearest e4m3 code to v (ties to the even code, which is the even mantissa), magnitudes of
// 448 and beyond saturated to 448, the sign kept: -0 and negatives that round to zero give 0x80.
uint8_t e4m3_rne(float v) {
  static const std::vector<double> mag = [] {
    std::vector<double> m;
    for (int c = 0; c < 0x7f; c++) m.push_back(e4m3_to_float(uint8_t(c)));  // increasing; 0x7e = 448
    return m;
  }();
  const double a = std::fabs(double(v));
  int c = 0x7e;
  if (a < 448.0) {
    c = int(std::upper_bound(mag.begin(), mag.end(), a) - mag.begin()) - 1;  // mag[c] <= a < mag[c + 1]
    const double below = a - mag[size_t(c)], above = mag[size_t(c) + 1] - a;
    if (above < below || (above == below && (c & 1))) c++;
  }
  return uint8_t(c | (std::signbit(v) ? 0x80 : 0));
}

// The code of integer v in -8 .. 8 (a table: the large cases draw tens of millions).
uint8_t e4m3_small(int v) {
  static const std::vector<uint8_t> codes = [] {
    std::vector<uint8_t> c;
    for (int i = -8; i <= 8; i++) c.push_back(e4m3_rne(float(i)));
    return c;
  }();
  return codes[size_t(v + 8)];
}

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
float from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

// Activations [T, ld_x] (E, zero past K): normal values with per-row magnitudes over 6 decades;
// row 0 all zeros, row 1 negative zeros, row 2 one outlier, and (K > 128) row 3's second block zero.
std::vector<uint16_t> random_activations(std::mt19937& rng, int T, int K, int ld_x, DType e) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> decade(-3.f, 3.f);
  const float max_mag = e == DType::F16 ? 1e2f : 1e3f;  // f16: outliers stay finite
  std::vector<uint16_t> x(size_t(T) * ld_x, 0);
  for (int t = 0; t < T; t++) {
    const float mag = std::min(max_mag, std::pow(10.f, decade(rng)));
    for (int k = 0; k < K; k++) {
      float v = nd(rng) * mag;
      if (t == 0) v = 0.f;
      if (t == 1) v = -0.f;
      if (t == 2 && k == K / 2) v = 40.f * mag;
      if (t == 3 && k >= 128 && k < 256) v = 0.f;
      x[size_t(t) * ld_x + k] = to_e(v, e);
    }
  }
  return x;
}

// The expected output of quantize_rows_fp8 (group = 0: one scale per row) or of the block variant
// (group = 128): codes [T, ld_q] with 0xff (the poison) from Kp = roundup(K, 32) on, scales [T, ld_s].
void quantize_host(const std::vector<uint16_t>& x, DType e, int T, int K, int ld_x, int group, int ld_q, int ld_s,
                   std::vector<uint8_t>* codes, std::vector<float>* scales) {
  const int Kp = round_up(K, 32), width = group ? group : K, groups = group ? (K + group - 1) / group : 1;
  codes->assign(size_t(T) * ld_q, 0xff);
  scales->assign(size_t(T) * ld_s, 0.f);
  for (int t = 0; t < T; t++) {
    for (int b = 0; b < groups; b++) {
      const int k0 = b * width, k1 = std::min(K, k0 + width);
      float amax = 0.f;
      for (int k = k0; k < k1; k++) amax = std::max(amax, std::fabs(from_e(x[size_t(t) * ld_x + k], e)));
      const float scale = amax / 448.f;
      (*scales)[size_t(t) * ld_s + b] = scale;
      for (int k = k0; k < k1; k++)
        (*codes)[size_t(t) * ld_q + k] = scale == 0.f ? 0 : e4m3_rne(from_e(x[size_t(t) * ld_x + k], e) / scale);
    }
    for (int k = K; k < Kp; k++) (*codes)[size_t(t) * ld_q + k] = 0;
  }
}

// Quantizes x on the device (per row, or per 128-column block) and checks codes and scales bit
// for bit; returns them through the device buffers.
bool check_quantize(const std::vector<uint16_t>& x, DType e, int T, int K, int ld_x, bool blocks, int ld_q,
                    Dev<uint8_t>& dq, Dev<float>& ds, int ld_s) {
  Dev<uint16_t> dx(x);
  if (blocks) cuda::quantize_rows_fp8_blocks(dx.p, e, T, K, ld_x, dq.p, ld_q, ds.p, ld_s, nullptr);
  else cuda::quantize_rows_fp8(dx.p, e, T, K, ld_x, dq.p, ld_q, ds.p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> want_q;
  std::vector<float> want_s;
  quantize_host(x, e, T, K, ld_x, blocks ? cuda::kFp8BlockCols : 0, ld_q, ld_s, &want_q, &want_s);
  const auto got_q = dq.read();
  const auto got_s = ds.read();
  int bad_codes = 0, bad_scales = 0;
  for (size_t i = 0; i < want_q.size(); i++) bad_codes += got_q[i] != want_q[i];
  const int groups = blocks ? (K + 127) / 128 : 1;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < groups; b++)
      bad_scales += std::memcmp(&got_s[size_t(t) * ld_s + b], &want_s[size_t(t) * ld_s + b], 4) != 0;
  if (bad_codes || bad_scales)
    std::printf("  quantize%s %s T=%d K=%d: %d codes, %d scales differ\n", blocks ? "_blocks" : "", dtype_name(e), T, K,
                bad_codes, bad_scales);
  CHECK(bad_codes == 0 && bad_scales == 0);
  return bad_codes == 0 && bad_scales == 0;
}

struct Fp8Case {
  int T, N, K;
  Fp8Scales w_scales;
  bool x_blocks;
  DType y_type;
  bool accumulate, bias;
  int w_block_rows = 128;
};

// The GEMM's operands on the host, e4m3 codes zero past K.
struct Operands {
  int ld_x = 0, ld_w = 0, ld_xs = 0, blocks = 0;
  std::vector<uint8_t> xq, w;  // [T, ld_x], [N, ld_w]
  std::vector<float> xs, ws;   // [T] or [T, ld_xs]; [1], [N] or [ceil(N / rows), blocks]
  std::vector<float> bias;     // [N]
  double x_scale(const Fp8Case& c, int t, int k) const { return xs[c.x_blocks ? size_t(t) * ld_xs + k / 128 : size_t(t)]; }
  double w_scale(const Fp8Case& c, int n, int k) const {
    if (c.w_scales == Fp8Scales::Tensor) return ws[0];
    if (c.w_scales == Fp8Scales::Channel) return ws[size_t(n)];
    return ws[size_t(n / c.w_block_rows) * blocks + k / 128];
  }
};

// Layouts, weight scales and bias for case c; activations are the caller's.
Operands make_operands(std::mt19937& rng, const Fp8Case& c, bool small_integers) {
  Operands o;
  const int Kp = round_up(c.K, 32);
  o.ld_x = round_up(Kp, 16) + (c.T % 2 ? 16 : 0);  // tight and padded strides
  o.ld_w = round_up(Kp, 16) + (c.N % 2 ? 0 : 32);
  o.blocks = (c.K + 127) / 128;
  o.ld_xs = o.blocks + 1;
  std::uniform_real_distribution<float> unit(0.5f, 2.f);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> small(-8, 8);
  o.w.assign(size_t(c.N) * o.ld_w, 0);
  for (int n = 0; n < c.N; n++)
    for (int k = 0; k < c.K; k++)
      o.w[size_t(n) * o.ld_w + k] = small_integers ? e4m3_small(small(rng)) : e4m3_rne(nd(rng) * 112.f);
  const size_t num_ws = c.w_scales == Fp8Scales::Tensor    ? 1
                        : c.w_scales == Fp8Scales::Channel ? size_t(c.N)
                                                           : size_t((c.N + c.w_block_rows - 1) / c.w_block_rows) * o.blocks;
  for (size_t i = 0; i < num_ws; i++) o.ws.push_back(unit(rng) * 1e-3f);
  for (int n = 0; n < c.N; n++) o.bias.push_back(nd(rng));
  return o;
}

void small_integer_activations(std::mt19937& rng, const Fp8Case& c, Operands& o) {
  std::uniform_int_distribution<int> small(-8, 8);
  std::uniform_real_distribution<float> unit(0.5f, 2.f);
  o.xq.assign(size_t(c.T) * o.ld_x, 0);
  for (int t = 0; t < c.T; t++)
    for (int k = 0; k < c.K; k++) o.xq[size_t(t) * o.ld_x + k] = e4m3_small(small(rng));
  o.xs.assign(c.x_blocks ? size_t(c.T) * o.ld_xs : size_t(c.T), 0.f);
  for (auto& s : o.xs) s = unit(rng);
}

// y of case c ([T, ld_y] of y_type as raw bytes; ld_y = N + 8, the padding checked untouched).
struct Result {
  int ld_y = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> y0;  // the f32 y before an accumulating call
};

cuda::Fp8GemmArgs args_for(const Fp8Case& c, const Operands& o, const Dev<uint8_t>& dx, const Dev<float>& dxs,
                           const Dev<uint8_t>& dw, const Dev<float>& dws, const Dev<float>& db, void* y, int ld_y) {
  cuda::Fp8GemmArgs a;
  a.x = dx.p, a.ld_x = o.ld_x, a.x_scale = dxs.p, a.ld_x_scale = o.ld_xs, a.x_block_scales = c.x_blocks;
  a.w = dw.p, a.ld_w = o.ld_w, a.w_scale = dws.p, a.w_scales = c.w_scales, a.w_block_rows = c.w_block_rows;
  a.bias = c.bias ? db.p : nullptr;
  a.T = c.T, a.N = c.N, a.K = c.K, a.y = y, a.ld_y = ld_y, a.y_type = c.y_type, a.accumulate = c.accumulate;
  return a;
}

// Runs case c twice (bit-identical reruns) and returns the first result.
Result run_case(std::mt19937& rng, const Fp8Case& c, const Operands& o) {
  Result r;
  r.ld_y = c.N + 8;
  const size_t esize = dtype_size(c.y_type), bytes = size_t(c.T) * r.ld_y * esize;
  Dev<uint8_t> dx(o.xq), dw(o.w);
  Dev<float> dxs(o.xs), dws(o.ws), db(o.bias);
  Dev<uint8_t> dy(bytes);
  if (c.accumulate) {
    std::normal_distribution<float> nd(0.f, 1.f);
    r.y0.resize(size_t(c.T) * r.ld_y);
    for (auto& v : r.y0) v = nd(rng);
    cudaMemcpy(dy.p, r.y0.data(), bytes, cudaMemcpyHostToDevice);
  }
  const cuda::Fp8GemmArgs a = args_for(c, o, dx, dxs, dw, dws, db, dy.p, r.ld_y);
  cuda::fp8_gemm(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  r.bytes = dy.read();
  if (c.accumulate) cudaMemcpy(dy.p, r.y0.data(), bytes, cudaMemcpyHostToDevice);
  cuda::fp8_gemm(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(std::memcmp(dy.read().data(), r.bytes.data(), bytes) == 0);
  return r;
}

double output_at(const Fp8Case& c, const Result& r, int t, int n) {
  const size_t at = size_t(t) * r.ld_y + n;
  if (c.y_type == DType::F32) {
    float v;
    std::memcpy(&v, &r.bytes[at * 4], 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, &r.bytes[at * 2], 2);
  return c.y_type == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Checks y against the float64 reference within rel * (sum|x * w| + |bias|) plus the output's
// rounding, and that the row padding (columns N .. ld_y - 1) was not written.
void check_result(const Fp8Case& c, const Operands& o, const Result& r, double rel, const char* what) {
  const int Kp = round_up(c.K, 32);
  std::vector<double> xd(size_t(c.T) * Kp, 0.0), wd(size_t(c.N) * Kp, 0.0);
  for (int t = 0; t < c.T; t++)
    for (int k = 0; k < c.K; k++) xd[size_t(t) * Kp + k] = e4m3_to_float(o.xq[size_t(t) * o.ld_x + k]) * o.x_scale(c, t, k);
  for (int n = 0; n < c.N; n++)
    for (int k = 0; k < c.K; k++) wd[size_t(n) * Kp + k] = e4m3_to_float(o.w[size_t(n) * o.ld_w + k]) * o.w_scale(c, n, k);
  const double out_rel = c.y_type == DType::BF16 ? 1.0 / 256 : c.y_type == DType::F16 ? 1.0 / 2048 : 0.0;
  const double out_abs = c.y_type == DType::F16 ? std::ldexp(1.0, -24) : 0.0;
  // Rows split over host threads (the largest cases sum 5e9 products).
  const int num_threads = int(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<int> bad_of(size_t(num_threads), 0), bad_pad_of(size_t(num_threads), 0);
  std::vector<double> worst_of(size_t(num_threads), 0.0);
  auto check_rows = [&](int part) {
    for (int t = part; t < c.T; t += num_threads) {
      const double* xr = &xd[size_t(t) * Kp];
      for (int n = 0; n < c.N; n++) {
        const double* wr = &wd[size_t(n) * Kp];
        double s = 0, m = 0;
        for (int k = 0; k < Kp; k++) {
          s += xr[k] * wr[k];
          m += std::fabs(xr[k] * wr[k]);
        }
        if (c.bias) s += o.bias[size_t(n)], m += std::fabs(o.bias[size_t(n)]);
        if (c.accumulate) s += r.y0[size_t(t) * r.ld_y + n], m += std::fabs(r.y0[size_t(t) * r.ld_y + n]);
        const double got = output_at(c, r, t, n);
        const double tol = rel * m + out_rel * std::fabs(s) + out_abs + 1e-30;
        worst_of[size_t(part)] = std::max(worst_of[size_t(part)], std::fabs(got - s) / tol);
        if (!(std::fabs(got - s) <= tol)) bad_of[size_t(part)]++;
      }
      const size_t esize = dtype_size(c.y_type);
      for (size_t b = (size_t(t) * r.ld_y + c.N) * esize; b < size_t(t + 1) * r.ld_y * esize; b++)
        bad_pad_of[size_t(part)] += c.accumulate ? 0 : r.bytes[b] != 0xff;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < num_threads; i++) threads.emplace_back(check_rows, i);
  for (auto& th : threads) th.join();
  int bad = 0, bad_pad = 0;
  double worst = 0;
  for (int i = 0; i < num_threads; i++) {
    bad += bad_of[size_t(i)];
    bad_pad += bad_pad_of[size_t(i)];
    worst = std::max(worst, worst_of[size_t(i)]);
  }
  if (bad || bad_pad)
    std::printf("  %s T=%d N=%d K=%d w_scales=%d/%d x_blocks=%d %s%s bias=%d: %d bad, %d padding written, worst %.3gx tol\n",
                what, c.T, c.N, c.K, int(c.w_scales), c.w_block_rows, int(c.x_blocks), dtype_name(c.y_type),
                c.accumulate ? " (+=)" : "", int(c.bias), bad, bad_pad, worst);
  CHECK(bad == 0 && bad_pad == 0);
}

// The layouts the GEMM cases cycle through: (weight scales, block rows, block activation scales).
struct Layout {
  Fp8Scales w;
  int rows;
  bool x_blocks;
};
const Layout kLayouts[] = {{Fp8Scales::Tensor, 128, false}, {Fp8Scales::Channel, 128, false},
                           {Fp8Scales::Block, 128, true},   {Fp8Scales::Block, 128, false},
                           {Fp8Scales::Channel, 128, true}, {Fp8Scales::Block, 48, true}};
struct OutKind {
  DType type;
  bool accumulate;
};
const OutKind kOuts[] = {{DType::F32, false}, {DType::BF16, false}, {DType::F16, false}, {DType::F32, true}};

bool gemm_supported() {
  if (cuda::fp8_gemm_supported()) return true;
  std::printf("  this device has no e4m3 MMA (sm_89+): fp8_gemm not checked\n");
  return false;
}

}  // namespace

TEST_CASE(quantize_rows_fp8_is_bit_exact) {
  std::mt19937 rng(11);
  struct Shape {
    int T, K;
  };
  const Shape shapes[] = {{1, 128}, {7, 320}, {64, 4096}, {300, 200}, {5, 72}, {9, 1000}};
  for (DType e : {DType::BF16, DType::F16})
    for (const Shape& s : shapes)
      for (bool blocks : {false, true}) {
        const int ld_x = round_up(s.K, 8) + 8, ld_q = round_up(round_up(s.K, 32), 16) + 16;
        const int ld_s = blocks ? (s.K + 127) / 128 + 1 : 1;
        const auto x = random_activations(rng, s.T, s.K, ld_x, e);
        Dev<uint8_t> dq(size_t(s.T) * ld_q);
        Dev<float> ds(size_t(s.T) * ld_s);
        check_quantize(x, e, s.T, s.K, ld_x, blocks, ld_q, dq, ds, ld_s);
      }
  // The emulated rounding itself at fixed points: ties to even, saturation, subnormals, signs.
  CHECK(e4m3_rne(448.f) == 0x7e && e4m3_rne(1e9f) == 0x7e && e4m3_rne(-470.f) == 0xfe);
  CHECK(e4m3_rne(1.0625f) == 0x38 && e4m3_rne(1.1875f) == 0x3a);  // halfway: to the even mantissa
  CHECK(e4m3_rne(std::ldexp(1.f, -10)) == 0x00 && e4m3_rne(std::ldexp(3.f, -10)) == 0x02);  // subnormal ties
  CHECK(e4m3_rne(-0.f) == 0x80 && e4m3_rne(-1e-6f) == 0x80 && e4m3_rne(-2.f) == 0xc0);
}

TEST_CASE(fp8_gemm_small_integers_match_at_f32_accuracy) {
  if (!gemm_supported()) return;
  std::mt19937 rng(21);
  int which = 0;
  for (int T : {1, 7, 64, 300})
    for (int N : {128, 200, 4096})
      for (int K : {128, 4096, 320}) {
        const Layout& l = kLayouts[size_t(which % 6)];
        const OutKind& out = kOuts[size_t(which / 6 % 4)];
        const Fp8Case c{T, N, K, l.w, l.x_blocks, out.type, out.accumulate, which % 3 != 1, l.rows};
        Operands o = make_operands(rng, c, true);
        small_integer_activations(rng, c, o);
        const Result r = run_case(rng, c, o);
        check_result(c, o, r, double(o.blocks + 3) * std::ldexp(1.0, -23), "small integers");
        which++;
      }
  // K not a multiple of 32 or 128 (zero codes past K), every layout at every output once.
  for (int i = 0; i < 24; i++) {
    const Layout& l = kLayouts[size_t(i % 6)];
    const OutKind& out = kOuts[size_t(i / 6)];
    const int shapes[3][3] = {{7, 200, 200}, {64, 136, 72}, {20, 260, 1000}};
    const int* s = shapes[i % 3];
    const Fp8Case c{s[0], s[1], s[2], l.w, l.x_blocks, out.type, out.accumulate, i % 2 == 0, l.rows};
    Operands o = make_operands(rng, c, true);
    small_integer_activations(rng, c, o);
    check_result(c, o, run_case(rng, c, o), double(o.blocks + 3) * std::ldexp(1.0, -23), "small integers");
  }
}

TEST_CASE(fp8_gemm_on_quantized_activations_matches_double_reference) {
  if (!gemm_supported()) return;
  std::mt19937 rng(31);
  struct Shape {
    int T, N, K;
  };
  const Shape shapes[] = {{1, 128, 4096},  {1, 4096, 128},  {7, 200, 320},   {7, 4096, 4096}, {64, 128, 4096},
                          {64, 200, 320},  {300, 200, 320}, {300, 4096, 128}, {64, 4096, 4096}, {33, 520, 1000}};
  int which = 0;
  for (const Shape& s : shapes)
    for (int layout : {0, 1, 2}) {  // per tensor, per channel, block-wise with block activations
      const Layout& l = kLayouts[size_t(layout)];
      const OutKind& out = kOuts[size_t(which % 4)];
      const DType e = which % 2 ? DType::F16 : DType::BF16;
      const Fp8Case c{s.T, s.N, s.K, l.w, l.x_blocks, out.type, out.accumulate, which % 3 == 0, l.rows};
      Operands o = make_operands(rng, c, false);
      const int ld_e = round_up(c.K, 8);
      const auto x = random_activations(rng, c.T, c.K, ld_e, e);
      Dev<uint8_t> dq(size_t(c.T) * o.ld_x);
      Dev<float> ds(c.x_blocks ? size_t(c.T) * o.ld_xs : size_t(c.T));
      if (!check_quantize(x, e, c.T, c.K, ld_e, c.x_blocks, o.ld_x, dq, ds, c.x_blocks ? o.ld_xs : 1)) continue;
      o.xq = dq.read();
      o.xs = ds.read();
      for (int t = 0; t < c.T; t++)  // the bytes past Kp were never written: zero them for the reference
        for (int k = round_up(c.K, 32); k < o.ld_x; k++) o.xq[size_t(t) * o.ld_x + k] = 0;
      check_result(c, o, run_case(rng, c, o), 1e-3, "quantized");
      which++;
    }
}

TEST_CASE(fp8_gemm_rows_do_not_depend_on_the_batch) {
  if (!gemm_supported()) return;
  std::mt19937 rng(41);
  // Every tile shape (T = 7: decode tiles, 20: small, 64 and 300: prefill) against T = 1 per row.
  for (int T : {7, 20, 64, 300})
    for (int layout = 0; layout < 6; layout++) {
      const Layout& l = kLayouts[size_t(layout)];
      const DType y_type = layout % 2 ? DType::BF16 : DType::F32;
      const Fp8Case c{T, 520, 1000, l.w, l.x_blocks, y_type, false, layout % 3 == 0, l.rows};
      Operands o = make_operands(rng, c, false);
      std::uniform_real_distribution<float> unit(0.5f, 2.f);
      o.xq.assign(size_t(T) * o.ld_x, 0);
      for (int t = 0; t < T; t++)
        for (int k = 0; k < c.K; k++) {
          uint8_t code;
          do code = uint8_t(rng());
          while ((code & 0x7f) == 0x7f);  // any code but NaN
          o.xq[size_t(t) * o.ld_x + k] = code;
        }
      o.xs.resize(l.x_blocks ? size_t(T) * o.ld_xs : size_t(T));
      for (auto& s : o.xs) s = unit(rng) * 1e-2f;
      const Result all = run_case(rng, c, o);
      Dev<uint8_t> dx(o.xq), dw(o.w);
      Dev<float> dxs(o.xs), dws(o.ws), db(o.bias);
      const size_t esize = dtype_size(y_type), row_bytes = size_t(all.ld_y) * esize;
      Dev<uint8_t> dy(row_bytes);
      int differ = 0;
      const int step = T > 64 ? 7 : 1;
      for (int t = 0; t < T; t += step) {
        Fp8Case one = c;
        one.T = 1;
        cuda::Fp8GemmArgs a = args_for(one, o, dx, dxs, dw, dws, db, dy.p, all.ld_y);
        a.x = dx.p + size_t(t) * o.ld_x;
        a.x_scale = dxs.p + (l.x_blocks ? size_t(t) * o.ld_xs : size_t(t));
        cuda::fp8_gemm(a, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        differ += std::memcmp(dy.read().data(), &all.bytes[size_t(t) * row_bytes], size_t(c.N) * esize) != 0;
      }
      if (differ) std::printf("  T=%d layout %d: %d rows differ from the same row alone\n", T, layout, differ);
      CHECK(differ == 0);
    }
}

TEST_CASE(fp8_gemm_rejects_layouts_outside_the_contract) {
  if (!gemm_supported()) return;
  Dev<uint8_t> x(64 * 64), w(64 * 64), y(64 * 64 * 4);
  Dev<float> s(64);
  cuda::Fp8GemmArgs a;
  a.x = x.p, a.ld_x = 64, a.x_scale = s.p, a.w = w.p, a.ld_w = 64, a.w_scale = s.p;
  a.T = 4, a.N = 64, a.K = 64, a.y = y.p, a.ld_y = 64;
  cuda::fp8_gemm(a, nullptr);  // valid
  CUDA_OK(cudaDeviceSynchronize());
  cuda::Fp8GemmArgs bad = a;
  bad.ld_x = 72;  // not a multiple of 16
  CHECK_THROWS_CODE(cuda::fp8_gemm(bad, nullptr), ErrorCode::kInternal);
  bad = a;
  bad.K = 80;  // rounds up to 96 > ld
  CHECK_THROWS_CODE(cuda::fp8_gemm(bad, nullptr), ErrorCode::kInternal);
  bad = a;
  bad.y_type = DType::BF16, bad.accumulate = true;
  CHECK_THROWS_CODE(cuda::fp8_gemm(bad, nullptr), ErrorCode::kInternal);
  bad = a;
  bad.w_scales = Fp8Scales::None;
  CHECK_THROWS_CODE(cuda::fp8_gemm(bad, nullptr), ErrorCode::kInternal);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda fp8")) return rc;
  return sluice_test::run_all("cuda fp8");
}
