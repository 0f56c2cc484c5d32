// The CUDA kernels the model families added (kernels.h), against double-precision references
// computed on the host from the same rounded inputs:
//  - gemm with the gated epilogue (SiLU, GELU-tanh, clamped SwiGLU; with and without bias) on the
//    GEMV path (T <= 8) and the tensor-core path (forced K splits too), and the cuBLASLt path's
//    separate epilogue gated_mul_interleaved, on GEMM outputs and on raw f32 inputs;
//  - the mixture-of-experts step end to end as the backend runs it: moe_route -> moe_plan ->
//    grouped gate/up gemm (gathering token rows) -> grouped down gemm -> moe_combine (store and
//    add), with empty experts, expert biases, K splits and bit-identical reruns;
//  - moe_route alone (exact ties: the lower index first) and moe_plan's invariants alone;
//  - paged_attention with a sliding window and with attention sinks, 1 and 4 KV splits, over a
//    shuffled paged cache whose blocks before the window are -1 in the table;
//  - add_rmsnorm, soft_cap and embedding with a scale.
// Exits 77 (ctest: skipped) without a CUDA device.
//
// Tolerances, with u the unit roundoff of E (bf16 2^-8, f16 2^-11):
//  - GEMM sums in f32: |acc - exact| <= eg = 2e-5 * sum|x*w| + 1e-7 * |acc| + 1e-6.
//  - A gated value from gate/up known within eg/eu: A = 1.2 * (|up| + eu + 1) * eg + (|gate| + eg)
//    * eu (the activations' slopes are below 1.2) + 1e-5 * |h| + 1e-6 * (|gate| + 1) * (|up| + 1)
//    (f32 exp/tanh), then rounded to E: |h_E - h| <= u * |h| + (1 + u) * A + 1e-7.
//  - The MoE output: each down row within sum_i tol_h_i * |wd_i| + 2e-5 * sum|h_i * wd_i| + 1e-6,
//    combined as sum_j |w_j| * tol_y_j + 1e-5 * |y_j| (the routing weight's own error) + 1e-6.
//  - Routing weights within 1e-5 of the double softmax; ids and the plan exact.
//  - Attention outputs (E): 2u * |o| + 1e-3 (f32 scores, softmax and P.V, then rounding to E).
//  - add_rmsnorm 1e-6 * |x| + 5e-6 * |normed| + 1e-6; soft_cap 3e-6 * |v| + 1e-12; the
//    embedding exact (one f32 product).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/kernels.h"
#include "sluice/dtype.h"
#include "test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

constexpr uint16_t kPoisonE = 0xffff;  // what Dev leaves in an E element nobody wrote

uint16_t to_e(double f, DType e) { return e == DType::BF16 ? f32_to_bf16(float(f)) : f32_to_f16(float(f)); }
double from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
double unit(DType e) { return e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }
int round8(int v) { return (v + 7) / 8 * 8; }

const char* act_name(cuda::GateAct act) {
  switch (act) {
    case cuda::GateAct::kGeluTanh: return "gelu_tanh";
    case cuda::GateAct::kSwigluClamped: return "swiglu_clamped";
    default: return "silu";
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A random [rows, ld] matrix in E with zero padding past `cols`, and its rounded values as double.
std::vector<uint16_t> random_matrix(std::mt19937& rng, int rows, int cols, int ld, double scale, DType e,
                                    std::vector<double>* values) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<uint16_t> m(size_t(rows) * size_t(ld), 0);
  values->assign(size_t(rows) * size_t(cols), 0.0);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      m[size_t(r) * ld + c] = to_e(nd(rng), e);
      (*values)[size_t(r) * cols + c] = from_e(m[size_t(r) * ld + c], e);
    }
  return m;
}

cuda::GemmWorkspace make_workspace(Dev<float>& partials, Dev<int>& tickets) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  tickets.zero();
  cuda::GemmWorkspace ws;
  ws.partials = partials.p;
  ws.partial_floats = partials.n;
  ws.tickets = tickets.p;
  ws.num_tickets = int(tickets.n);
  ws.num_sms = sms;
  return ws;
}

// The gated activations as the CPU kernels define them.
double gated(double g, double u, cuda::GateAct act, double limit) {
  switch (act) {
    case cuda::GateAct::kGeluTanh:
      return 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    case cuda::GateAct::kSwigluClamped: {
      const double gc = std::min(g, limit), uc = std::min(std::max(u, -limit), limit);
      return (uc + 1) * gc / (1 + std::exp(-1.702 * gc));
    }
    default: return g / (1 + std::exp(-g)) * u;
  }
}

// The bound on |h_E - h| for h = gated(g, u) when the device's gate and up are within eg and eu.
double gated_tol(double g, double u, double h, double eg, double eu, DType e) {
  const double propagated = 1.2 * (std::fabs(u) + eu + 1) * eg + (std::fabs(g) + eg) * eu;
  const double f32_act = 1e-5 * std::fabs(h) + 1e-6 * (std::fabs(g) + 1) * (std::fabs(u) + 1);
  const double a = propagated + f32_act;
  return unit(e) * std::fabs(h) + (1 + unit(e)) * a + 1e-7;
}

// f32 accumulation of a dot product whose sum of |terms| is `mag`.
double gemm_err(double mag, double value) { return 2e-5 * mag + 1e-7 * std::fabs(value) + 1e-6; }

// Fused row r of a 16-row group [gate 8 | up 8] -> (intermediate feature, is up).
std::pair<int, bool> fused_row(int r) { return {(r / 16) * 8 + r % 8, r % 16 >= 8}; }
int gate_row(int i) { return (i / 8) * 16 + i % 8; }  // the up row is gate_row(i) + 8

// ---- 1. gemm with the gated epilogue, and 2. the separate epilogue on its kStore output ----

int g_clamped_gates = 0, g_clamped_ups = 0;  // how often swiglu's clamps were exercised

void check_gated_gemm(int T, int N, int K, cuda::GateAct act, bool bias, DType e, uint32_t seed, int splits = 0) {
  std::mt19937 rng(seed);
  const int ld = round8(K), half = N / 2, ld_h = half + 8;  // h rows padded: the pad stays unwritten
  const double limit = 7.0;
  // Clamped SwiGLU gets pre-activations of about 4 sigma... of 4: a good share beyond +-7.
  const double w_scale = (act == cuda::GateAct::kSwigluClamped ? 4.0 : 1.5) / std::sqrt(double(K));
  std::vector<double> xv, wv;
  const auto x = random_matrix(rng, T, K, ld, 1.0, e, &xv);
  const auto w = random_matrix(rng, N, K, ld, w_scale, e, &wv);
  std::vector<float> b(size_t(N), 0.f);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (auto& v : b) v = nd(rng);
  Dev<uint16_t> dx(x), dw(w), dh(size_t(T) * ld_h), dh2(size_t(T) * ld_h);
  Dev<float> db(b), dg(size_t(T) * N), partials(size_t(4) << 20);
  Dev<int> tickets(8192);

  cuda::GemmArgs a;
  a.x = dx.p, a.ld_x = ld, a.w = dw.p, a.ld_w = ld, a.bias = bias ? db.p : nullptr;
  a.T = T, a.N = N, a.K = K, a.epilogue = cuda::Epilogue::kGatedMul;
  a.act = act, a.act_limit = float(limit), a.h = dh.p, a.ld_h = ld_h, a.splits = splits;
  cuda::gemm(a, e, make_workspace(partials, tickets), nullptr);
  // The cuBLASLt path's shape: products (and bias) stored in f32, then the separate epilogue.
  cuda::GemmArgs s = a;
  s.epilogue = cuda::Epilogue::kStore, s.y = dg.p, s.ld_y = N, s.bias = nullptr, s.h = nullptr, s.ld_h = 0;
  cuda::gemm(s, e, make_workspace(partials, tickets), nullptr);
  cuda::gated_mul_interleaved(dg.p, T, N, bias ? db.p : nullptr, act, float(limit), dh2.p, ld_h, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto h = dh.read(), h2 = dh2.read();

  int bad = 0, bad_pad = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < half; i++) {
      const int gr = gate_row(i), ur = gr + 8;
      double g = bias ? b[size_t(gr)] : 0.0, u = bias ? b[size_t(ur)] : 0.0, mg = 0, mu = 0;
      for (int c = 0; c < K; c++) {
        const double xc = xv[size_t(t) * K + c];
        g += xc * wv[size_t(gr) * K + c];
        u += xc * wv[size_t(ur) * K + c];
        mg += std::fabs(xc * wv[size_t(gr) * K + c]);
        mu += std::fabs(xc * wv[size_t(ur) * K + c]);
      }
      if (act == cuda::GateAct::kSwigluClamped) {
        g_clamped_gates += g > limit;
        g_clamped_ups += std::fabs(u) > limit;
      }
      const double want = gated(g, u, act, limit);
      const double tol = gated_tol(g, u, want, gemm_err(mg, g), gemm_err(mu, u), e);
      for (const auto* hh : {&h, &h2}) {
        const double err = std::fabs(from_e((*hh)[size_t(t) * ld_h + i], e) - want);
        worst = std::max(worst, err / tol);
        if (!(err <= tol)) bad++;
      }
    }
    for (int i = half; i < ld_h; i++)
      bad_pad += (h[size_t(t) * ld_h + i] != kPoisonE) + (h2[size_t(t) * ld_h + i] != kPoisonE);
  }
  if (bad || bad_pad)
    std::printf("  gated gemm %s T=%d N=%d K=%d bias=%d %s splits=%d: %d bad (worst %.2fx tol), %d pad writes\n",
                act_name(act), T, N, K, int(bias), dtype_name(e), splits, bad, worst, bad_pad);
  CHECK(bad == 0);
  CHECK(bad_pad == 0);
}

}  // namespace

TEST_CASE(gemm_gated_epilogue_matches_the_host_for_every_activation) {
  struct Shape {
    int T, N, K;
  };
  // T <= 8: the GEMV kernel; more: the tensor-core kernel. Ragged K (zero padded to ld) included.
  const Shape shapes[] = {{1, 96, 100}, {1, 512, 1024}, {5, 256, 264}, {40, 160, 136}, {200, 128, 72}, {200, 256, 264}};
  uint32_t seed = 1;
  for (cuda::GateAct act : {cuda::GateAct::kSilu, cuda::GateAct::kGeluTanh, cuda::GateAct::kSwigluClamped})
    for (DType e : {DType::BF16, DType::F16})
      for (const Shape& s : shapes)
        for (bool bias : {false, true}) check_gated_gemm(s.T, s.N, s.K, act, bias, e, seed++);
  // Forced K splits on the tensor-core path (decode-sized T included).
  for (cuda::GateAct act : {cuda::GateAct::kSilu, cuda::GateAct::kGeluTanh, cuda::GateAct::kSwigluClamped}) {
    check_gated_gemm(5, 256, 520, act, true, DType::BF16, seed++, 3);
    check_gated_gemm(40, 160, 264, act, false, DType::F16, seed++, 2);
  }
  // The clamps of the clamped SwiGLU were reached (gate above the limit, |up| above it).
  std::printf("  swiglu clamps: %d gates, %d ups beyond the limit\n", g_clamped_gates, g_clamped_ups);
  CHECK(g_clamped_gates > 0 && g_clamped_ups > 0);
}

TEST_CASE(gated_mul_interleaved_matches_the_host_for_every_activation) {
  uint32_t seed = 500;
  for (cuda::GateAct act : {cuda::GateAct::kSilu, cuda::GateAct::kGeluTanh, cuda::GateAct::kSwigluClamped})
    for (DType e : {DType::BF16, DType::F16})
      for (int T : {1, 7, 64})
        for (int N : {16, 96, 1024})
          for (bool bias : {false, true}) {
            std::mt19937 rng(seed++);
            const int half = N / 2, ld_h = half + 8;
            const double limit = 7.0;
            std::normal_distribution<float> nd(0.f, act == cuda::GateAct::kSwigluClamped ? 5.f : 2.5f);
            std::vector<float> g(size_t(T) * N), b(static_cast<size_t>(N));
            for (auto& v : g) v = nd(rng);
            for (auto& v : b) v = 0.3f * nd(rng);
            Dev<float> dg(g), db(b);
            Dev<uint16_t> dh(size_t(T) * ld_h);
            cuda::gated_mul_interleaved(dg.p, T, N, bias ? db.p : nullptr, act, float(limit), dh.p, ld_h, e, nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            const auto h = dh.read();
            int bad = 0, bad_pad = 0;
            for (int t = 0; t < T; t++) {
              for (int i = 0; i < half; i++) {
                const int gr = gate_row(i), ur = gr + 8;
                const double gb = bias ? b[size_t(gr)] : 0.0, ub = bias ? b[size_t(ur)] : 0.0;
                const double gv = g[size_t(t) * N + gr] + gb, uv = g[size_t(t) * N + ur] + ub;
                const double want = gated(gv, uv, act, limit);
                // The only input error: the f32 bias add.
                const double tol = gated_tol(gv, uv, want, 6e-8 * std::fabs(gv), 6e-8 * std::fabs(uv), e);
                if (!(std::fabs(from_e(h[size_t(t) * ld_h + i], e) - want) <= tol)) bad++;
              }
              for (int i = half; i < ld_h; i++) bad_pad += h[size_t(t) * ld_h + i] != kPoisonE;
            }
            if (bad || bad_pad)
              std::printf("  gated_mul_interleaved %s %s T=%d N=%d bias=%d: %d bad, %d pad writes\n", act_name(act),
                          dtype_name(e), T, N, int(bias), bad, bad_pad);
            CHECK(bad == 0);
            CHECK(bad_pad == 0);
          }
}

namespace {

// ---- 4./5. routing and the plan ----

// The host's routing of logits row `row` ([E]): the k best (lower index first on ties), weights
// in double as kernels.h defines them.
void route_host(const float* row, int E, int k, bool softmax_first, bool renormalize, std::vector<int>* ids,
                std::vector<double>* w) {
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  ids->assign(order.begin(), order.begin() + k);
  const double mx = row[order[0]];
  double all = 0;
  for (int i = 0; i < E; i++) all += std::exp(double(row[i]) - mx);
  w->assign(size_t(k), 0.0);
  double chosen = 0;
  for (int j = 0; j < k; j++) chosen += ((*w)[size_t(j)] = std::exp(double(row[(*ids)[size_t(j)]]) - mx));
  for (double& v : *w) v /= softmax_first && !renormalize ? all : chosen;
}

struct PlanBuffers {
  Dev<int32_t> offsets, route_row, row_token, tile_expert, tile_row0, num_tiles;
  int R, E, tile_rows, max_tiles;
  // tile_* get 4 spare entries past max_tiles, which must stay poisoned.
  PlanBuffers(int routes, int experts, int rows_per_tile)
      : offsets(size_t(experts) + 1),
        route_row(size_t(routes)),
        row_token(size_t(routes)),
        tile_expert(size_t(cuda::grouped_max_tiles(routes, experts, rows_per_tile)) + 4),
        tile_row0(size_t(cuda::grouped_max_tiles(routes, experts, rows_per_tile)) + 4),
        num_tiles(1),
        R(routes),
        E(experts),
        tile_rows(rows_per_tile),
        max_tiles(cuda::grouped_max_tiles(routes, experts, rows_per_tile)) {}
  cuda::MoePlan plan() const {
    cuda::MoePlan p;
    p.expert_offsets = offsets.p, p.route_row = route_row.p, p.row_token = row_token.p;
    p.tile_expert = tile_expert.p, p.tile_row0 = tile_row0.p, p.num_tiles = num_tiles.p;
    return p;
  }
  cuda::GroupedRows rows() const {
    cuda::GroupedRows g;
    g.expert_offsets = offsets.p, g.tile_expert = tile_expert.p, g.tile_row0 = tile_row0.p, g.num_tiles = num_tiles.p;
    g.max_tiles = max_tiles, g.tile_rows = tile_rows;
    return g;
  }
};

// moe_plan's invariants for routes `ids` ([T * k]); returns the number of violations (printed).
int check_plan(const std::vector<int32_t>& ids, int k, const PlanBuffers& pb, const char* what) {
  const int R = pb.R, E = pb.E;
  const auto offs = pb.offsets.read(), rr = pb.route_row.read(), rt = pb.row_token.read();
  const auto te = pb.tile_expert.read(), t0 = pb.tile_row0.read();
  const int ntiles = pb.num_tiles.read()[0];
  int bad = 0;
  auto fail = [&](const char* why, int a, int b) {
    if (bad++ < 5)
      std::printf("  plan %s (R=%d E=%d tile_rows=%d): %s (%d, %d)\n", what, R, E, pb.tile_rows, why, a, b);
  };
  std::vector<int> count(size_t(E), 0);
  for (int r = 0; r < R; r++) count[size_t(ids[size_t(r)])]++;
  if (offs[0] != 0) fail("offsets[0] != 0", offs[0], 0);
  for (int x = 0; x < E; x++)
    if (offs[size_t(x) + 1] - offs[size_t(x)] != count[size_t(x)])
      fail("offsets are not the counts' prefix sums", x, offs[size_t(x)]);
  std::vector<int> seen(size_t(R), 0);
  for (int r = 0; r < R; r++) {
    const int row = rr[size_t(r)], ex = ids[size_t(r)];
    if (row < 0 || row >= R) {
      fail("route_row out of range", r, row);
      continue;
    }
    if (row < offs[size_t(ex)] || row >= offs[size_t(ex) + 1]) fail("route outside its expert's rows", r, row);
    if (seen[size_t(row)]++) fail("grouped row taken twice", r, row);
    if (rt[size_t(row)] != r / k) fail("row_token[route_row[r]] != r / k", r, rt[size_t(row)]);
  }
  if (ntiles < 0 || ntiles > pb.max_tiles) {
    fail("num_tiles out of range", ntiles, pb.max_tiles);
    return bad;
  }
  std::vector<int> covered(size_t(R), 0);
  for (int i = 0; i < ntiles; i++) {
    const int ex = te[size_t(i)], row0 = t0[size_t(i)];
    if (ex < 0 || ex >= E) {
      fail("tile_expert out of range", i, ex);
      continue;
    }
    if (row0 < offs[size_t(ex)] || row0 >= offs[size_t(ex) + 1] || (row0 - offs[size_t(ex)]) % pb.tile_rows != 0)
      fail("tile not at a tile_rows step of its expert's rows", i, row0);
    for (int row = row0; row < std::min(row0 + pb.tile_rows, offs[size_t(ex) + 1]); row++)
      if (row >= 0 && row < R) covered[size_t(row)]++;
  }
  for (int r = 0; r < R; r++)
    if (covered[size_t(r)] != 1) fail("grouped row not covered exactly once", r, covered[size_t(r)]);
  for (int i = pb.max_tiles; i < pb.max_tiles + 4; i++)
    if (te[size_t(i)] != -1 || t0[size_t(i)] != -1) fail("write past max_tiles", i, te[size_t(i)]);
  return bad;
}

}  // namespace

TEST_CASE(moe_route_picks_the_host_top_k_with_ties_to_the_lower_index) {
  struct Case {
    int E, k;
    bool softmax_first, renormalize;
  };
  const Case cases[] = {{8, 2, true, true},   {16, 4, true, false}, {32, 4, false, false}, {60, 6, true, true},
                        {128, 8, true, false}, {4, 4, true, true},   {1024, 32, false, false}, {1, 1, true, false},
                        {100, 1, false, false}};
  uint32_t seed = 900;
  for (const Case& c : cases)
    for (int T : {1, 7, 100}) {
      std::mt19937 rng(seed++);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> logits(size_t(T) * c.E);
      for (int t = 0; t < T; t++) {
        float* row = logits.data() + size_t(t) * c.E;
        switch (t % 5) {
          case 0:  // continuous
            for (int i = 0; i < c.E; i++) row[i] = 2.f * nd(rng);
            break;
          case 1:  // coarse values: many exact ties, across the k boundary too
            for (int i = 0; i < c.E; i++) row[i] = 0.5f * std::round(3.f * nd(rng));
            break;
          case 2:  // every expert ties
            for (int i = 0; i < c.E; i++) row[i] = 0.75f;
            break;
          case 3: {  // the k-th best copied to a few experts below and above it
            for (int i = 0; i < c.E; i++) row[i] = 2.f * nd(rng);
            std::vector<int> order(size_t(c.E));
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
            const float kth = row[order[size_t(c.k) - 1]];
            for (int n = 0; n < 3; n++) row[rng() % unsigned(c.E)] = kth;
            break;
          }
          default:  // wide logits: the softmax's tail underflows in f32
            for (int i = 0; i < c.E; i++) row[i] = 40.f * nd(rng);
        }
      }
      Dev<float> dl(logits), dw(size_t(T) * c.k);
      Dev<int32_t> dids(size_t(T) * c.k);
      cuda::moe_route(dl.p, T, c.E, c.k, c.softmax_first, c.renormalize, dids.p, dw.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto ids = dids.read();
      const auto w = dw.read();
      int bad_ids = 0, bad_w = 0;
      for (int t = 0; t < T; t++) {
        std::vector<int> want_ids;
        std::vector<double> want_w;
        route_host(logits.data() + size_t(t) * c.E, c.E, c.k, c.softmax_first, c.renormalize, &want_ids, &want_w);
        for (int j = 0; j < c.k; j++) {
          const size_t at = size_t(t) * c.k + j;
          if (ids[at] != want_ids[size_t(j)]) {
            if (bad_ids++ < 3)
              std::printf("  moe_route E=%d k=%d T=%d token %d rank %d: expert %d, expected %d\n", c.E, c.k, T, t, j,
                          ids[at], want_ids[size_t(j)]);
          }
          if (!(std::fabs(w[at] - want_w[size_t(j)]) <= 1e-5)) {
            if (bad_w++ < 3)
              std::printf("  moe_route E=%d k=%d T=%d token %d rank %d: weight %.7f, expected %.7f\n", c.E, c.k, T, t,
                          j, double(w[at]), want_w[size_t(j)]);
          }
        }
      }
      CHECK(bad_ids == 0);
      CHECK(bad_w == 0);
    }
}

TEST_CASE(moe_plan_groups_routes_by_expert_in_tiles) {
  struct Case {
    int T, k, E;
    // 0: uniform; 1: every token on experts 0..k-1; 2: every other token on one expert; 3: every
    // other expert empty.
    int skew;
  };
  const Case cases[] = {{1, 2, 8, 0},   {3, 2, 8, 0},   {17, 4, 16, 0}, {150, 4, 32, 0},  {150, 2, 8, 1},
                        {64, 4, 32, 2}, {40, 4, 32, 3}, {1, 1, 1, 0},   {600, 8, 64, 0},  {300, 8, 128, 2},
                        {5, 32, 1024, 0}, {1000, 1, 3, 0}};
  uint32_t seed = 1300;
  for (const Case& c : cases) {
    std::mt19937 rng(seed++);
    const int R = c.T * c.k;
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int t = 0; t < c.T; t++) {
      // k distinct experts per token, as routing gives.
      std::vector<int> pool;
      for (int x = 0; x < c.E; x++)
        if (c.skew != 3 || x % 2 == 0 || c.E < 2 * c.k) pool.push_back(x);
      std::shuffle(pool.begin(), pool.end(), rng);
      if (c.skew == 1) std::iota(pool.begin(), pool.end(), 0);
      if (c.skew == 2 && t % 2 == 0) {
        auto it = std::find(pool.begin(), pool.end(), c.E / 3);
        std::iter_swap(pool.begin(), it);
      }
      for (int j = 0; j < c.k; j++) ids[size_t(t) * c.k + j] = pool[size_t(j)];
    }
    Dev<int32_t> dids(ids);
    for (int tile_rows : {cuda::grouped_tile_rows(R, c.E), 8, 32, 128}) {
      PlanBuffers pb(R, c.E, tile_rows);
      cuda::moe_plan(dids.p, c.T, c.k, c.E, tile_rows, pb.plan(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      CHECK(check_plan(ids, c.k, pb, "alone") == 0);
    }
  }
  // grouped_tile_rows: 8, 32 or 128 rows, growing with the routes per expert.
  for (int experts : {1, 8, 32, 128}) {
    int last = 0;
    for (int routes : {1, 8, 64, 300, 1000, 4096, 20000}) {
      const int rows = cuda::grouped_tile_rows(routes, experts);
      CHECK(rows == 8 || rows == 32 || rows == 128);
      CHECK(rows >= last);
      last = rows;
    }
  }
}

namespace {

// ---- 3. the mixture-of-experts step end to end ----

struct MoeCase {
  int E, k;
  bool softmax_first, renormalize, biases;
  cuda::GateAct act;
  int H, MI;         // hidden and expert intermediate sizes (padded to ld_h = round8(H), mip = round8(MI))
  double gu_scale;   // gate/up weights ~ N(0, gu_scale / sqrt(H))
};

void check_moe(const MoeCase& m, int T, DType e, uint32_t seed) {
  const int E = m.E, k = m.k, H = m.H, MI = m.MI, ld_h = round8(H), mip = round8(MI), R = T * k;
  const double limit = 7.0;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);

  // Token rows [T, ld_h], zero past H.
  std::vector<double> xv;
  const auto x = random_matrix(rng, T, H, ld_h, 1.0, e, &xv);
  // Gate/up of every expert: [E * 2 * mip, ld_h], 16-row groups [gate 8 | up 8]; features past MI
  // are zero rows (and zero bias), as the loader pads them.
  std::vector<uint16_t> gate_up(size_t(E) * 2 * mip * ld_h, 0);
  std::vector<double> gv(size_t(E) * MI * H), uv(size_t(E) * MI * H);  // [E, MI, H]
  std::vector<float> gu_b(size_t(E) * 2 * mip, 0.f);
  std::vector<double> gb(size_t(E) * MI, 0.0), ub(size_t(E) * MI, 0.0);
  const double gs = m.gu_scale / std::sqrt(double(H));
  for (int ex = 0; ex < E; ex++)
    for (int r = 0; r < 2 * mip; r++) {
      const auto [i, up] = fused_row(r);
      if (i >= MI) continue;
      const size_t row = size_t(ex) * 2 * mip + r, feat = size_t(ex) * MI + i;
      for (int c = 0; c < H; c++) {
        gate_up[row * ld_h + c] = to_e(gs * nd(rng), e);
        (up ? uv : gv)[feat * H + c] = from_e(gate_up[row * ld_h + c], e);
      }
      if (m.biases) (up ? ub : gb)[feat] = gu_b[row] = float(0.5 * nd(rng));
    }
  // Down of every expert: [E * H, mip], zero past MI.
  std::vector<double> dv;
  const auto down = random_matrix(rng, E * H, MI, mip, 1.0 / std::sqrt(double(MI)), e, &dv);
  std::vector<float> down_b(size_t(E) * H, 0.f);
  if (m.biases)
    for (auto& v : down_b) v = float(0.3 * nd(rng));
  // Router logits; in larger steps two experts (one the last) are muted so that they get no rows.
  std::vector<float> logits(size_t(T) * E);
  for (auto& v : logits) v = float(2.0 * nd(rng));
  const int muted[2] = {E / 2 + 1, E - 1};
  if (T >= 17)
    for (int t = 0; t < T; t++)
      for (int ex : muted) logits[size_t(t) * E + ex] = -30.f;
  std::vector<float> base(size_t(T) * H);
  for (auto& v : base) v = float(nd(rng));

  // The host reference: routing, h of every route (exact, not rounded: the tolerance covers E's
  // rounding), down rows and the weighted sum in rank order, with their error bounds.
  std::vector<double> want(size_t(T) * H, 0.0), tol(size_t(T) * H, 1e-6);
  std::vector<std::vector<int>> want_ids(static_cast<size_t>(T));
  std::vector<std::vector<double>> want_w(static_cast<size_t>(T));
  for (int t = 0; t < T; t++) {
    route_host(logits.data() + size_t(t) * E, E, k, m.softmax_first, m.renormalize, &want_ids[size_t(t)],
               &want_w[size_t(t)]);
    for (int j = 0; j < k; j++) {
      const int ex = want_ids[size_t(t)][size_t(j)];
      const double wj = want_w[size_t(t)][size_t(j)];
      std::vector<double> h(static_cast<size_t>(MI)), th(static_cast<size_t>(MI));
      for (int i = 0; i < MI; i++) {
        const size_t feat = size_t(ex) * MI + i;
        double g = gb[feat], u = ub[feat], mg = 0, mu = 0;
        for (int c = 0; c < H; c++) {
          const double xc = xv[size_t(t) * H + c];
          g += xc * gv[feat * H + c];
          u += xc * uv[feat * H + c];
          mg += std::fabs(xc * gv[feat * H + c]);
          mu += std::fabs(xc * uv[feat * H + c]);
        }
        h[size_t(i)] = gated(g, u, m.act, limit);
        th[size_t(i)] = gated_tol(g, u, h[size_t(i)], gemm_err(mg, g), gemm_err(mu, u), e);
      }
      for (int n = 0; n < H; n++) {
        const double* wd = dv.data() + (size_t(ex) * H + n) * MI;
        double y = down_b[size_t(ex) * H + n], my = 0, ty = 0;
        for (int i = 0; i < MI; i++) {
          y += h[size_t(i)] * wd[i];
          my += std::fabs(h[size_t(i)] * wd[i]);
          ty += th[size_t(i)] * std::fabs(wd[i]);
        }
        want[size_t(t) * H + n] += wj * y;
        tol[size_t(t) * H + n] +=
            std::fabs(wj) * (ty + gemm_err(my, y)) + 1e-5 * std::fabs(y) + 1e-6 * std::fabs(wj * y);
      }
    }
  }

  Dev<uint16_t> dx(x), dgu(gate_up), ddown(down), dh(size_t(R) * mip);
  Dev<float> dgub(gu_b), ddownb(down_b), dlogits(logits), dw(static_cast<size_t>(R)), dy(size_t(R) * H);
  Dev<float> out(size_t(T) * H), out_add(size_t(T) * H), partials(size_t(4) << 20);
  Dev<int32_t> dids(static_cast<size_t>(R));
  Dev<int> tickets(65536);
  const int tile_rows = cuda::grouped_tile_rows(R, E);
  PlanBuffers pb(R, E, tile_rows);

  for (int splits : {0, 2, 3}) {
    const cuda::GemmWorkspace ws = make_workspace(partials, tickets);
    auto run = [&] {
      cuda::moe_route(dlogits.p, T, E, k, m.softmax_first, m.renormalize, dids.p, dw.p, nullptr);
      cuda::moe_plan(dids.p, T, k, E, tile_rows, pb.plan(), nullptr);
      cuda::GroupedRows rows = pb.rows();
      rows.gather = pb.row_token.p;
      rows.w_stride = size_t(2 * mip) * size_t(ld_h);
      rows.bias_stride = 2 * mip;
      cuda::GemmArgs gu;
      gu.x = dx.p, gu.ld_x = ld_h, gu.w = dgu.p, gu.ld_w = ld_h, gu.bias = m.biases ? dgub.p : nullptr;
      gu.T = R, gu.N = 2 * mip, gu.K = H, gu.epilogue = cuda::Epilogue::kGatedMul;
      gu.act = m.act, gu.act_limit = float(limit), gu.h = dh.p, gu.ld_h = mip, gu.splits = splits, gu.grouped = &rows;
      cuda::gemm(gu, e, ws, nullptr);
      cuda::GroupedRows down_rows = rows;
      down_rows.gather = nullptr;  // h is in grouped order
      down_rows.w_stride = size_t(H) * size_t(mip);
      down_rows.bias_stride = H;
      cuda::GemmArgs dn;
      dn.x = dh.p, dn.ld_x = mip, dn.w = ddown.p, dn.ld_w = mip, dn.bias = m.biases ? ddownb.p : nullptr;
      dn.T = R, dn.N = H, dn.K = mip, dn.epilogue = cuda::Epilogue::kStore, dn.y = dy.p, dn.ld_y = H;
      dn.splits = splits, dn.grouped = &down_rows;
      cuda::gemm(dn, e, ws, nullptr);
      cuda::moe_combine(dy.p, pb.route_row.p, dw.p, T, k, H, out.p, false, nullptr);
    };
    out_add.write(base);
    run();
    cuda::moe_combine(dy.p, pb.route_row.p, dw.p, T, k, H, out_add.p, true, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = out.read(), got_add = out_add.read(), w = dw.read(), y = dy.read();
    const auto ids = dids.read(), rr = pb.route_row.read(), offs = pb.offsets.read();
    const std::string what = std::string("moe E=") + std::to_string(E) + " k=" + std::to_string(k) +
                             " T=" + std::to_string(T) + " " + dtype_name(e) + " splits=" + std::to_string(splits);

    int bad_route = 0;
    for (int t = 0; t < T; t++)
      for (int j = 0; j < k; j++) {
        const size_t at = size_t(t) * k + j;
        bad_route += ids[at] != want_ids[size_t(t)][size_t(j)];
        bad_route += !(std::fabs(w[at] - want_w[size_t(t)][size_t(j)]) <= 1e-5);
      }
    if (bad_route) std::printf("  %s: %d routes differ from the host's\n", what.c_str(), bad_route);
    CHECK(bad_route == 0);
    CHECK(check_plan(ids, k, pb, what.c_str()) == 0);
    if (T >= 17)
      for (int ex : muted) CHECK(offs[size_t(ex) + 1] == offs[size_t(ex)]);  // empty experts were in the step

    int bad = 0, bad_add = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++) {
      const double err = std::fabs(got[i] - want[i]);
      const double err_add = std::fabs(got_add[i] - (double(base[i]) + want[i]));
      worst = std::max(worst, err / tol[i]);
      if (!(err <= tol[i])) bad++;
      if (!(err_add <= tol[i] + 1e-6 * (1 + std::fabs(base[i])))) bad_add++;
    }
    if (bad || bad_add)
      std::printf("  %s: %d bad, %d bad with add (worst %.2fx tol)\n", what.c_str(), bad, bad_add, worst);
    CHECK(bad == 0);
    CHECK(bad_add == 0);

    // The same inputs again: the same bits, for the output and for every route's down row
    // (wherever the plan's atomics placed it this time).
    run();
    CUDA_OK(cudaDeviceSynchronize());
    const auto again = out.read(), y2 = dy.read();
    const auto rr2 = pb.route_row.read();
    CHECK(same_bits(again, got));
    int moved = 0;
    for (int r = 0; r < R; r++)
      moved += std::memcmp(y.data() + size_t(rr[size_t(r)]) * H, y2.data() + size_t(rr2[size_t(r)]) * H,
                           size_t(H) * sizeof(float)) != 0;
    if (moved) std::printf("  %s: %d route rows changed bits on a rerun\n", what.c_str(), moved);
    CHECK(moved == 0);
  }
}

}  // namespace

TEST_CASE(moe_step_end_to_end_matches_the_host) {
  const MoeCase cases[] = {
      // Mixtral-like: softmax over all experts, renormalised over the 2.
      {8, 2, true, true, false, cuda::GateAct::kSilu, 128, 96, 1.0},
      // Softmax top-k without renormalisation (Qwen-MoE style), GELU-tanh.
      {16, 4, true, false, false, cuda::GateAct::kGeluTanh, 200, 136, 1.0},
      // gpt-oss: top-k then softmax, expert biases, clamped SwiGLU past its limit; ragged H and MI.
      {32, 4, false, false, true, cuda::GateAct::kSwigluClamped, 270, 132, 4.0},
  };
  uint32_t seed = 2000;
  for (const MoeCase& m : cases)
    for (DType e : {DType::BF16, DType::F16})
      for (int T : {1, 3, 17, 150}) check_moe(m, T, e, seed++);
}

namespace {

// ---- 6. windowed attention and sinks ----

void check_window_attention(int nq, int nkv, int hd, int splits, int window, bool sinks, DType e, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int bs = 16;
  // Sequences: (context length, tokens computed this step): decode rows and prefill chunks.
  const std::vector<std::pair<int, int>> seqs = {{1, 1}, {37, 1}, {300, 1}, {20, 20}, {90, 13}, {600, 1}, {48, 17}};
  const int S = int(seqs.size());
  // The window's first position of each sequence's first token this step; blocks before the
  // block holding it are never read: -1 in the table, no cache block at all.
  std::vector<int> lowest(static_cast<size_t>(S)), first_block(static_cast<size_t>(S));
  std::vector<int> num_blocks(static_cast<size_t>(S));
  int max_blocks = 0, physical = 0;
  for (int s = 0; s < S; s++) {
    const int p0 = seqs[size_t(s)].first - seqs[size_t(s)].second;
    lowest[size_t(s)] = window > 0 ? std::max(0, p0 - window + 1) : 0;
    first_block[size_t(s)] = lowest[size_t(s)] / bs;
    num_blocks[size_t(s)] = (seqs[size_t(s)].first + bs - 1) / bs;
    max_blocks = std::max(max_blocks, num_blocks[size_t(s)]);
    physical += num_blocks[size_t(s)] - first_block[size_t(s)];
  }
  std::vector<int> perm(static_cast<size_t>(physical));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int stride = max_blocks + 3;  // rows of the table wider than any sequence needs
  std::vector<int32_t> tables(size_t(S) * stride, -1);
  int next = 0;
  for (int s = 0; s < S; s++)
    for (int b = first_block[size_t(s)]; b < num_blocks[size_t(s)]; b++)
      tables[size_t(s) * stride + b] = perm[size_t(next++)];

  const size_t slots = size_t(physical) * bs, row = size_t(nkv) * hd;
  std::vector<uint16_t> kc(slots * row), vc(slots * row);
  for (auto& v : kc) v = to_e(nd(rng), e);
  for (auto& v : vc) v = to_e(nd(rng), e);
  // Positions of a kept block before every token's window: values that would show if read.
  for (int s = 0; s < S; s++)
    for (int p = first_block[size_t(s)] * bs; p < lowest[size_t(s)]; p++) {
      const size_t slot = size_t(tables[size_t(s) * stride + p / bs]) * bs + p % bs;
      for (size_t i = 0; i < row; i++) {
        kc[slot * row + i] = to_e(4.0, e);
        vc[slot * row + i] = to_e(50.0, e);
      }
    }
  std::vector<int32_t> token_seq, positions;
  for (int s = 0; s < S; s++)
    for (int p = seqs[size_t(s)].first - seqs[size_t(s)].second; p < seqs[size_t(s)].first; p++) {
      token_seq.push_back(s);
      positions.push_back(p);
    }
  const int T = int(token_seq.size());
  std::vector<float> q(size_t(T) * nq * hd), sink(static_cast<size_t>(nq));
  for (auto& v : q) v = nd(rng);
  for (auto& v : sink) v = 2.f * nd(rng);
  sink[0] = 6.f;  // a sink that outweighs most contexts

  Dev<float> dq(q), dsink(sink);
  Dev<int32_t> dseq(token_seq), dpos(positions), dtab(tables), dstride(std::vector<int32_t>{stride});
  Dev<uint16_t> dk(kc), dv(vc), dout(size_t(T) * nq * hd);
  Dev<float> pacc(size_t(T) * nq * splits * hd), pml(size_t(T) * nq * splits * 2);
  const double scale = 1.0 / std::sqrt(double(hd));
  cuda::AttentionArgs a;
  a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
  a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = bs, a.k_cache = dk.p, a.v_cache = dv.p;
  a.scale = float(scale), a.num_splits = splits;
  a.partial_acc = splits > 1 ? pacc.p : nullptr, a.partial_ml = splits > 1 ? pml.p : nullptr;
  a.out = dout.p, a.ld_out = nq * hd, a.window = window, a.sinks = sinks ? dsink.p : nullptr;
  cuda::paged_attention(a, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto out = dout.read();

  int bad = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    const int s = token_seq[size_t(t)], pos = positions[size_t(t)];
    const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int h = 0; h < nq; h++) {
      const int kvh = h / (nq / nkv);
      std::vector<double> sc(size_t(pos - lo + 1));
      std::vector<size_t> at(sc.size());
      double mx = sinks ? double(sink[size_t(h)]) : -1e300;
      for (int p = lo; p <= pos; p++) {
        const size_t slot = size_t(tables[size_t(s) * stride + p / bs]) * bs + p % bs;
        at[size_t(p - lo)] = slot * row + size_t(kvh) * hd;
        double d = 0;
        for (int i = 0; i < hd; i++)
          d += double(q[(size_t(t) * nq + h) * hd + i]) * from_e(kc[at[size_t(p - lo)] + i], e);
        mx = std::max(mx, sc[size_t(p - lo)] = d * scale);
      }
      double sum = sinks ? std::exp(double(sink[size_t(h)]) - mx) : 0.0;
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      for (int i = 0; i < hd; i++) {
        double o = 0;
        for (size_t p = 0; p < sc.size(); p++) o += sc[p] / sum * from_e(vc[at[p] + i], e);
        const double got = from_e(out[(size_t(t) * nq + h) * hd + i], e);
        const double tol = 2 * unit(e) * std::fabs(o) + 1e-3;
        worst = std::max(worst, std::fabs(got - o) / tol);
        if (!(std::fabs(got - o) <= tol)) bad++;
      }
    }
  }
  if (bad)
    std::printf("  attention nq=%d nkv=%d hd=%d splits=%d window=%d sinks=%d %s: %d bad (worst %.2fx tol)\n", nq, nkv,
                hd, splits, window, int(sinks), dtype_name(e), bad, worst);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE(paged_attention_with_window_and_sinks_matches_the_host) {
  struct Heads {
    int nq, nkv, hd;
  };
  // GQA 4:1, MHA with 128-dim heads, 16:1 with 32-dim heads.
  const Heads heads[] = {{8, 2, 64}, {4, 4, 128}, {16, 1, 32}};
  // (window, sinks): sinks alone, windows from the token alone (1) to wider than any context.
  const std::pair<int, bool> variants[] = {{0, true},   {1, false},  {1, true},    {16, false},  {16, true},
                                           {50, false}, {50, true},  {1000, false}, {1000, true}};
  uint32_t seed = 3000;
  for (const Heads& h : heads)
    for (const auto& [window, sinks] : variants)
      for (int splits : {1, 4}) {
        check_window_attention(h.nq, h.nkv, h.hd, splits, window, sinks, DType::BF16, seed++);
        if (h.hd == 64) check_window_attention(h.nq, h.nkv, h.hd, splits, window, sinks, DType::F16, seed++);
      }
}

// ---- 7. sandwich-norm add, soft cap, embedding scale ----

TEST_CASE(add_rmsnorm_soft_cap_and_embedding_scale_match_the_host) {
  std::mt19937 rng(4000);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int D : {100, 1152, 4096}) {
    const int T = 5;
    std::vector<float> x(size_t(T) * D), y(size_t(T) * D), w(static_cast<size_t>(D));
    for (auto& v : x) v = nd(rng);
    for (auto& v : y) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    Dev<float> dx(x), dy(y), dw(w);
    cuda::add_rmsnorm(dx.p, dy.p, T, D, dw.p, 1e-6f, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto gx = dx.read(), gy = dy.read();
    CHECK(same_bits(gy, y));  // y is read only
    int bad = 0;
    for (int t = 0; t < T; t++) {
      double ss = 0;
      for (int i = 0; i < D; i++) ss += double(y[size_t(t) * D + i]) * y[size_t(t) * D + i];
      const double inv = 1 / std::sqrt(ss / D + 1e-6);
      for (int i = 0; i < D; i++) {
        const size_t at = size_t(t) * D + i;
        const double normed = y[at] * inv * w[size_t(i)];
        const double want = x[at] + normed;
        if (!(std::fabs(gx[at] - want) <= 1e-6 * std::fabs(x[at]) + 5e-6 * std::fabs(normed) + 1e-6)) bad++;
      }
    }
    if (bad) std::printf("  add_rmsnorm D=%d: %d bad\n", D, bad);
    CHECK(bad == 0);
  }

  for (float cap : {30.f, 50.f}) {
    std::vector<float> v(3001);
    for (size_t i = 0; i < v.size(); i++)
      v[i] = i % 3 == 0 ? 20.f * nd(rng) : i % 3 == 1 ? 1e-3f * nd(rng) : 500.f * nd(rng);
    v[0] = 1e4f, v[1] = -1e4f, v[2] = 0.f;
    Dev<float> dv(v);
    cuda::soft_cap(dv.p, v.size(), cap, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = dv.read();
    int bad = 0;
    for (size_t i = 0; i < v.size(); i++) {
      const double want = cap * std::tanh(double(v[i]) / cap);
      if (!(std::fabs(got[i] - want) <= 3e-6 * std::fabs(want) + 1e-12)) bad++;
    }
    if (bad) std::printf("  soft_cap %.0f: %d bad\n", double(cap), bad);
    CHECK(bad == 0);
  }

  for (DType e : {DType::BF16, DType::F16}) {
    const int V = 10, H = 40, ld = 48, T = 7;
    const float scale = std::sqrt(float(H));  // Gemma: sqrt(H)
    std::vector<uint16_t> table(size_t(V) * ld);
    for (auto& v : table) v = to_e(nd(rng), e);
    const std::vector<int32_t> ids = {3, 0, 9, 3, 7, 1, 9};
    Dev<uint16_t> dtable(table);
    Dev<int32_t> dids(ids);
    Dev<float> emb(size_t(T) * H);
    cuda::embedding(dids.p, T, dtable.p, ld, e, H, scale, emb.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = emb.read();
    int bad = 0;
    for (int t = 0; t < T; t++)
      for (int i = 0; i < H; i++) {
        const float want = float(from_e(table[size_t(ids[size_t(t)]) * ld + i], e)) * scale;
        bad += got[size_t(t) * H + i] != want;
      }
    if (bad) std::printf("  embedding %s: %d differ\n", dtype_name(e), bad);
    CHECK(bad == 0);
  }
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda family kernels")) return rc;
  return sluice_test::run_all("cuda family kernels");
}
