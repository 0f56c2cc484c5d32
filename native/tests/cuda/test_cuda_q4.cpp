// Q4 (AWQ / GPTQ 4-bit) weights on the GPU (cuda/q4_gemm.h) against host references built from
// the same buffers: the exact f32 weights q4_dequantize_row gives (model column order) times the
// bf16 / f16 activations, in double. Exits 77 (ctest: skipped) when no CUDA device is present.
//
// Tolerances of q4_gemv: the weights are exact, so the error is the f32 summation's. A lane sums
// 32 columns per piece of its 32-piece stride (at most 32 * ceil(Kp / 1024) FMAs), then five
// butterfly adds: |y - ref| <= (that count + 5) * 2^-24 * sum|x * w|, under 1e-5 * sum|x * w| at
// every K here; the check allows 2e-5 * sum|x * w| + 1e-6. A 16-bit output adds its one rounding:
// u * |y| with u = 2^-8 (bf16) or 2^-11 (f16), and 2^-25 for f16 subnormals. Beyond those bounds,
// bit for bit: the 16-bit output is the f32 one rounded, a token's output is the same alone and
// inside any call of 2..8 tokens and with 2 or 4 rows per warp, the residual add is y0 + y, and
// q4_dequantize is q4_dequantize_row rounded to bf16 / f16.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/gemm_q4.h"
#include "cuda/q4_gemm.h"
#include "sluice/dtype.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
float from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
constexpr uint16_t kPoison16 = 0xffff;

// A random Q4 matrix as AWQ / GPTQ checkpoints make them: codes 0..15, zeros 0..16 (16 included),
// positive scales (f16 values, or any f32 when !f16_scales), scale 0 and zero 0 on groups wholly
// past K, as the format stores them.
struct HostQ4 {
  int64_t N = 0, K = 0, group = 0;
  std::vector<uint8_t> buf;  // q4_bytes(N, K, group, perm)
  std::vector<float> w;      // [N, K]: q4_dequantize_row, model column order
};
HostQ4 make_q4(int64_t N, int64_t K, int64_t group, bool perm, bool f16_scales, std::mt19937& rng) {
  HostQ4 q;
  q.N = N, q.K = K, q.group = group;
  std::vector<int32_t> order(static_cast<size_t>(K));
  std::iota(order.begin(), order.end(), 0);
  if (perm) std::shuffle(order.begin(), order.end(), rng);
  q.buf.assign(cpu::q4_bytes(N, K, group, perm), 0);
  cpu::q4_init(q.buf.data(), N, K, group, perm ? order.data() : nullptr);
  const int64_t ng = cpu::q4_groups(cpu::q4_padded_k(K), group);
  std::uniform_int_distribution<int> code(0, 15), zero(0, 16);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  const float unit = 0.25f / std::sqrt(float(K));  // w of about unit variance / sqrt(K)
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; n++) {
    for (auto& c : codes) c = uint8_t(code(rng));
    cpu::q4_set_row(q.buf.data(), n, codes.data());
    for (int64_t g = 0; g < ng; g++) {
      if (g * group >= K) {
        cpu::q4_set_group(q.buf.data(), n, g, 0.f, 0);
        continue;
      }
      float s = scale(rng) * unit;
      if (f16_scales) s = f16_to_f32(f32_to_f16(s));
      cpu::q4_set_group(q.buf.data(), n, g, s, uint8_t(zero(rng)));
    }
  }
  q.w.resize(size_t(N) * size_t(K));
  for (int64_t n = 0; n < N; n++) cpu::q4_dequantize_row(q.buf.data(), n, q.w.data() + size_t(n) * size_t(K));
  return q;
}

struct DeviceQ4 {
  Dev<uint8_t> mem;
  cuda::Q4DeviceWeights w;
  explicit DeviceQ4(const HostQ4& q) : mem(cuda::q4_device_bytes(q.buf.data())), w(cuda::q4_upload(q.buf.data(), mem.p)) {}
};

int num_sms() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms;
}

struct Case {
  int64_t N, K, group;
  bool perm;
};

// Every check of q4_gemv on one matrix: 8 random tokens (x [8, ld_x], NaN past K so that a read
// there shows), each call of rows 1..8 against the double reference, bit-identical batch
// invariance, 2 vs 4 rows per warp, the rounded output, the residual add, and nothing written
// outside y[0:rows, 0:N].
void check_gemv(const Case& c, DType e, bool bias, bool f16_scales, uint32_t seed) {
  std::mt19937 rng(seed);
  const HostQ4 q = make_q4(c.N, c.K, c.group, c.perm, f16_scales, rng);
  DeviceQ4 dq(q);
  const int T = 8, N = int(c.N), K = int(c.K);
  const int ld_x = K + (seed % 3 == 0 ? 3 : 0), ld_y = N + (seed % 2 == 0 ? 5 : 0);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(T) * ld_x, to_e(NAN, e));
  std::vector<double> xv(size_t(T) * K);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      x[size_t(t) * ld_x + k] = to_e(nd(rng), e);
      xv[size_t(t) * K + k] = from_e(x[size_t(t) * ld_x + k], e);
    }
  std::vector<float> b(static_cast<size_t>(N)), y0(size_t(T) * ld_y);
  for (auto& v : b) v = nd(rng);
  for (auto& v : y0) v = nd(rng);
  Dev<uint16_t> dx(x);
  Dev<float> db(b);

  std::vector<double> ref(size_t(T) * N), mag(size_t(T) * N);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = bias ? b[size_t(n)] : 0.0, m = 0;
      const float* wr = q.w.data() + size_t(n) * K;
      for (int k = 0; k < K; k++) {
        s += xv[size_t(t) * K + k] * double(wr[k]);
        m += std::fabs(xv[size_t(t) * K + k] * double(wr[k]));
      }
      ref[size_t(t) * N + n] = s;
      mag[size_t(t) * N + n] = m;
    }

  cuda::Q4GemvArgs a;
  a.ld_x = ld_x, a.bias = bias ? db.p : nullptr, a.ld_y = ld_y;
  // y [T, ld_y] of a call on `rows` tokens from token t0 on, from a poisoned (or `init`) buffer.
  auto launch = [&](int t0, int rows, cuda::Q4Out out, int sms, void* y) {
    a.x = dx.p + size_t(t0) * ld_x, a.rows = rows, a.out = out, a.num_sms = sms, a.y = y;
    cuda::q4_gemv(dq.w, a, e, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
  };
  auto run32 = [&](int t0, int rows, cuda::Q4Out out, int sms, const std::vector<float>* init = nullptr) {
    Dev<float> y(size_t(T) * ld_y);
    if (init) y.write(*init);
    launch(t0, rows, out, sms, y.p);
    return y.read();
  };
  auto run16 = [&](int t0, int rows, int sms) {
    Dev<uint16_t> y(size_t(T) * ld_y);
    launch(t0, rows, cuda::Q4Out::kStore16, sms, y.p);
    return y.read();
  };
  auto same_bits = [](float u, float v) { return std::memcmp(&u, &v, 4) == 0; };
  auto poisoned = [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return bits == 0xffffffffu;
  };
  const double u16 = e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
  const int sms = num_sms();

  std::vector<std::vector<float>> alone32(T);
  std::vector<std::vector<uint16_t>> alone16(T);
  for (int t = 0; t < T; t++) {
    alone32[size_t(t)] = run32(t, 1, cuda::Q4Out::kStoreF32, sms);
    alone16[size_t(t)] = run16(t, 1, sms);
  }
  int bad = 0, variant = 0, rounding = 0, stray = 0;
  double worst = 0;
  for (int rows = 1; rows <= T; rows++) {
    const auto y32 = run32(0, rows, cuda::Q4Out::kStoreF32, sms);
    const auto y16 = run16(0, rows, sms);
    for (int t = 0; t < T; t++)
      for (int col = 0; col < ld_y; col++) {
        const size_t at = size_t(t) * ld_y + col;
        if (t >= rows || col >= N) {
          stray += !poisoned(y32[at]) + (y16[at] != kPoison16);
          continue;
        }
        const double want = ref[size_t(t) * N + col], m = mag[size_t(t) * N + col];
        const double got32 = y32[at], got16 = from_e(y16[at], e);
        const double tol32 = 2e-5 * m + 1e-6;
        const double tol16 = tol32 * (1 + u16) + u16 * std::fabs(want) + 3e-8;
        worst = std::max({worst, std::fabs(got32 - want) / tol32, std::fabs(got16 - want) / tol16});
        if (!(std::fabs(got32 - want) <= tol32) || !(std::fabs(got16 - want) <= tol16)) bad++;
        if (to_e(y32[at], e) != y16[at]) rounding++;
        // Token t computed alone sits in row 0 of its call.
        if (!same_bits(y32[at], alone32[size_t(t)][size_t(col)]) || y16[at] != alone16[size_t(t)][size_t(col)]) variant++;
      }
  }
  // Four rows per warp (num_sms 0) instead of the launcher's choice: the same bits.
  bool rows_per_warp_same = true;
  for (int rows : {2, 7}) {
    const auto four = run32(0, rows, cuda::Q4Out::kStoreF32, 0);
    const auto chosen = run32(0, rows, cuda::Q4Out::kStoreF32, sms);
    rows_per_warp_same = rows_per_warp_same && std::memcmp(four.data(), chosen.data(), four.size() * 4) == 0;
  }
  // The residual add: y0 + y in f32, nothing else touched.
  const auto added = run32(0, 5, cuda::Q4Out::kAddF32, sms, &y0);
  const auto stored = run32(0, 5, cuda::Q4Out::kStoreF32, sms);
  int add_bad = 0;
  for (int t = 0; t < T; t++)
    for (int col = 0; col < ld_y; col++) {
      const size_t at = size_t(t) * ld_y + col;
      const float want = t < 5 && col < N ? y0[at] + stored[at] : y0[at];
      add_bad += !same_bits(added[at], want);
    }
  if (bad || variant || rounding || stray || !rows_per_warp_same || add_bad)
    std::printf("  q4_gemv %s N=%d K=%d group=%d perm=%d bias=%d f16 scales=%d: %d off the reference (worst %.2fx tol), "
                "%d batch-variant, %d not the f32 result rounded, %d stray writes, rows per warp %s, %d bad adds\n",
                dtype_name(e), N, K, int(c.group), int(c.perm), int(bias), int(f16_scales), bad, worst, variant, rounding,
                stray, rows_per_warp_same ? "same" : "DIFFER", add_bad);
  CHECK(bad == 0);
  CHECK(variant == 0);
  CHECK(rounding == 0);
  CHECK(stray == 0);
  CHECK(rows_per_warp_same);
  CHECK(add_bad == 0);
}

// q4_dequantize against q4_dequantize_row rounded to E, bit for bit; columns K..ld_out untouched.
void check_dequantize(const Case& c, DType e, int ld_out, uint32_t seed) {
  std::mt19937 rng(seed);
  const HostQ4 q = make_q4(c.N, c.K, c.group, c.perm, seed % 2 == 0, rng);
  DeviceQ4 dq(q);
  Dev<uint16_t> out(size_t(c.N) * ld_out);
  cuda::q4_dequantize(dq.w, out.p, ld_out, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.read();
  int bad = 0, stray = 0;
  for (int64_t n = 0; n < c.N; n++)
    for (int col = 0; col < ld_out; col++) {
      const uint16_t v = got[size_t(n) * ld_out + col];
      if (col >= c.K) stray += v != kPoison16;
      else bad += v != to_e(q.w[size_t(n) * c.K + col], e);
    }
  if (bad || stray)
    std::printf("  q4_dequantize %s N=%d K=%d group=%d perm=%d ld_out=%d: %d wrong, %d stray writes\n", dtype_name(e),
                int(c.N), int(c.K), int(c.group), int(c.perm), ld_out, bad, stray);
  CHECK(bad == 0);
  CHECK(stray == 0);
}

// Gate and up ([N, K] each) dequantized with kGateRows / kUpRows into one fused matrix of 2 *
// round_up8(N) rows: row (n / 8) * 16 + n % 8 holds gate row n, 8 rows further up row n (as
// kGatedMul reads them); rows no weight row maps to and columns K..ld_out untouched.
void check_dequantize_gate_up(const Case& c, DType e, uint32_t seed) {
  std::mt19937 rng(seed);
  const HostQ4 gate = make_q4(c.N, c.K, c.group, c.perm, true, rng), up = make_q4(c.N, c.K, c.group, c.perm, false, rng);
  DeviceQ4 dgate(gate), dup(up);
  const int ld_out = int((c.K + 7) / 8 * 8);
  const int64_t rows = 2 * ((c.N + 7) / 8 * 8);
  Dev<uint16_t> out(size_t(rows) * ld_out);
  cuda::q4_dequantize(dgate.w, out.p, ld_out, e, nullptr, cuda::Q4Rows::kGateRows);
  cuda::q4_dequantize(dup.w, out.p, ld_out, e, nullptr, cuda::Q4Rows::kUpRows);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.read();
  int bad = 0, stray = 0;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t n = (r / 16) * 8 + r % 8;
    const HostQ4& src = r % 16 < 8 ? gate : up;
    for (int col = 0; col < ld_out; col++) {
      const uint16_t v = got[size_t(r) * ld_out + col];
      if (n >= c.N || col >= c.K) stray += v != kPoison16;
      else bad += v != to_e(src.w[size_t(n) * c.K + col], e);
    }
  }
  if (bad || stray)
    std::printf("  q4_dequantize gate/up %s N=%d K=%d group=%d perm=%d: %d wrong, %d stray writes\n", dtype_name(e),
                int(c.N), int(c.K), int(c.group), int(c.perm), bad, stray);
  CHECK(bad == 0);
  CHECK(stray == 0);
}

// K of 96 and 200 (ragged, below one 128-column chunk and across two), 896 and 4864 (Qwen2.5
// shapes: a piece count below and above 32 lanes per tile), every group (32, 64, 128, one group of
// Kp), with and without act-order, odd N.
std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t Ks[] = {96, 200, 896, 4864};
  const int64_t Ns[] = {37, 129, 301, 515};
  for (int i = 0; i < 4; i++)
    for (int64_t group : {int64_t(32), int64_t(64), int64_t(128), cpu::q4_padded_k(Ks[i])})
      for (bool perm : {false, true}) out.push_back({Ns[i], Ks[i], group, perm});
  return out;
}

}  // namespace

TEST_CASE(q4_gemv_matches_double_reference) {
  uint32_t seed = 1;
  for (DType e : {DType::BF16, DType::F16})
    for (const Case& c : cases()) {
      check_gemv(c, e, seed % 2 == 0, seed % 4 < 2, seed);
      seed++;
    }
  // Enough rows that the launcher takes four rows per warp for one or two tokens on a 132-SM
  // H100 / H200 (the last block holding one full warp and one of a single row), and a single row.
  check_gemv({8453, 896, 128, true}, DType::BF16, true, true, seed++);
  check_gemv({1, 4864, 64, false}, DType::F16, false, false, seed++);
}

TEST_CASE(q4_dequantize_matches_host_rows) {
  uint32_t seed = 100;
  for (DType e : {DType::BF16, DType::F16})
    for (const Case& c : cases()) {
      // ld_out a multiple of 8 (16-byte stores where there is no permutation) and an odd one.
      check_dequantize(c, e, int((c.K + 7) / 8 * 8), seed++);
      check_dequantize(c, e, int(c.K + 1), seed++);
    }
  // Interleaved gate/up rows: N a multiple of 8 and ragged ones (a last group of 8 part empty).
  for (DType e : {DType::BF16, DType::F16})
    for (const Case& c : {Case{37, 200, 64, false}, Case{64, 896, 128, true}, Case{129, 96, 32, true}})
      check_dequantize_gate_up(c, e, seed++);
}

// Both kernels captured in a graph and replayed on new activations: the eager launches' bits.
TEST_CASE(q4_graph_replay) {
  const DType e = DType::BF16;
  std::mt19937 rng(7);
  const HostQ4 q = make_q4(301, 896, 64, true, true, rng);
  DeviceQ4 dq(q);
  const int rows = 5, N = 301, K = 896;
  std::normal_distribution<float> nd(0.f, 1.f);
  auto activations = [&] {
    std::vector<uint16_t> x(size_t(rows) * K);
    for (auto& v : x) v = to_e(nd(rng), e);
    return x;
  };
  Dev<uint16_t> dx(activations()), y_graph(size_t(rows) * N), y_eager(size_t(rows) * N);
  Dev<uint16_t> w_graph(size_t(N) * K), w_eager(size_t(N) * K);
  cuda::Q4GemvArgs a;
  a.x = dx.p, a.ld_x = K, a.rows = rows, a.ld_y = N, a.num_sms = num_sms();

  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  a.y = y_graph.p;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::q4_gemv(dq.w, a, e, stream);
  cuda::q4_dequantize(dq.w, w_graph.p, K, e, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; replay++) {
    if (replay) dx.write(activations());
    CUDA_OK(cudaMemset(y_graph.p, 0xff, size_t(rows) * N * 2));
    CUDA_OK(cudaMemset(w_graph.p, 0xff, size_t(N) * K * 2));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    a.y = y_eager.p;
    cuda::q4_gemv(dq.w, a, e, nullptr);
    cuda::q4_dequantize(dq.w, w_eager.p, K, e, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto yg = y_graph.read(), ye = y_eager.read(), wg = w_graph.read(), we = w_eager.read();
    CHECK(std::memcmp(yg.data(), ye.data(), ye.size() * 2) == 0);
    CHECK(std::memcmp(wg.data(), we.data(), we.size() * 2) == 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE(q4_rejects_bad_arguments) {
  std::mt19937 rng(3);
  const HostQ4 q = make_q4(9, 200, 64, false, true, rng);
  DeviceQ4 dq(q);
  Dev<uint16_t> x(8 * 200), y(9 * 9);
  cuda::Q4GemvArgs a;
  a.x = x.p, a.ld_x = 200, a.y = y.p, a.ld_y = 9;
  for (int rows : {0, 9}) {
    a.rows = rows;
    CHECK_THROWS_CODE(cuda::q4_gemv(dq.w, a, DType::BF16, nullptr), ErrorCode::kInvalidArgument);
  }
  a.rows = 1;
  CHECK_THROWS_CODE(cuda::q4_gemv(dq.w, a, DType::F32, nullptr), ErrorCode::kInvalidArgument);
  a.ld_x = 199;
  CHECK_THROWS_CODE(cuda::q4_gemv(dq.w, a, DType::BF16, nullptr), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(cuda::q4_dequantize(dq.w, y.p, 199, DType::BF16, nullptr), ErrorCode::kInvalidArgument);
  // A group that is not a multiple of 32 (a 16-column half piece could straddle two), a misaligned copy.
  std::vector<uint8_t> odd(cpu::q4_bytes(9, 200, 48, false));
  cpu::q4_init(odd.data(), 9, 200, 48, nullptr);
  CHECK_THROWS_CODE(cuda::q4_device_view(odd.data(), dq.mem.p), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(cuda::q4_device_view(q.buf.data(), dq.mem.p + 8), ErrorCode::kInvalidArgument);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda q4")) return rc;
  return sluice_test::run_all("cuda q4");
}
