// The CUDA kernels the model families of issue 31 added, against double-precision references on
// the host from the same rounded inputs: MoE routing, the routes' grouping by expert, the grouped
// GEMMs (gate/up with each gated activation and expert biases, down) and the combine, end to end;
// the gated activations on the GEMV, tensor-core and separate-epilogue paths; the sandwich norm's
// add, the logits' soft cap and the embedding scale. (Windowed attention and sinks are checked in
// test_cuda_flash_attention / test_cuda_flash_decode, against the paged kernel and a reference.)
// Exits 77 (ctest: skipped) without a CUDA device.
//
// Tolerances: products accumulate in f32 (|err| <= 2e-5 * sum|x*w|); the gated activation's
// output is rounded to E (bf16: u = 2^-8, f16: 2^-11), and an input a hair from a rounding
// boundary may round the other way on the host, so h differs by up to one unit of E: the MoE
// output is held to 4u * sum_j |w_j| * sum_i |h_i * wd_i| + 1e-4.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/kernels.h"
#include "sluice/dtype.h"
#include "test_util.h"

using namespace sluice;

namespace {

#define CUDA_OK(call) CHECK((call) == cudaSuccess)

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    cudaMalloc(&p, count * sizeof(T) + 16);
    cudaMemset(p, 0, count * sizeof(T) + 16);
  }
  explicit Dev(const std::vector<T>& host) : Dev(host.size()) {
    cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> read() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

uint16_t to_e(double f, DType e) { return e == DType::BF16 ? f32_to_bf16(float(f)) : f32_to_f16(float(f)); }
double from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }
double unit(DType e) { return e == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }

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

cuda::GemmWorkspace workspace(Dev<float>& partials, Dev<int>& tickets) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return {partials.p, partials.n, tickets.p, int(tickets.n), sms};
}

// A random [rows, ld] matrix in E (zero past cols) and its rounded values.
std::vector<uint16_t> matrix(std::mt19937& rng, int rows, int cols, int ld, double scale, DType e,
                             std::vector<double>& values) {
  std::normal_distribution<double> nd(0, scale);
  std::vector<uint16_t> m(size_t(rows) * ld, 0);
  values.assign(size_t(rows) * cols, 0);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      m[size_t(r) * ld + c] = to_e(nd(rng), e);
      values[size_t(r) * cols + c] = from_e(m[size_t(r) * ld + c], e);
    }
  return m;
}

struct MoeCase {
  int E, k;
  bool softmax_first, renormalize, biases;
  cuda::GateAct act;
};

// Host routing: the k best experts by logit (lower index on ties), weights as the kernel defines.
void route_host(const std::vector<float>& logits, int t, const MoeCase& m, std::vector<int>& ids,
                std::vector<double>& w) {
  const float* row = logits.data() + size_t(t) * m.E;
  std::vector<int> order(static_cast<size_t>(m.E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  ids.assign(order.begin(), order.begin() + m.k);
  const double mx = row[order[0]];
  double sum = 0;
  for (int i = 0; i < m.E; i++) sum += std::exp(row[i] - mx);
  w.resize(size_t(m.k));
  double total = 0;
  for (int j = 0; j < m.k; j++) {
    w[size_t(j)] = m.softmax_first ? std::exp(row[ids[size_t(j)]] - mx) / sum : std::exp(row[ids[size_t(j)]] - mx);
    total += w[size_t(j)];
  }
  if (!m.softmax_first || m.renormalize)
    for (double& v : w) v /= total;
}

void check_moe(const MoeCase& m, int T, int splits, DType e, uint32_t seed) {
  const int H = 72, MI = 40, mip = 40, R = T * m.k;  // H, MI multiples of 8: no padding
  std::mt19937 rng(seed);
  std::vector<double> xv, guv, dv;
  const auto x = matrix(rng, T, H, H, 1.0, e, xv);
  // Gate/up of every expert, interleaved in 16-row groups [gate 8 | up 8]; rows e*2*mip + r.
  const auto gate_up = matrix(rng, m.E * 2 * mip, H, H, 1.0 / std::sqrt(H), e, guv);
  const auto down = matrix(rng, m.E * H, MI, mip, 1.0 / std::sqrt(MI), e, dv);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> gu_b(size_t(m.E) * 2 * mip), down_b(size_t(m.E) * H), logits(size_t(T) * m.E);
  for (auto& v : gu_b) v = nd(rng);
  for (auto& v : down_b) v = 0.3f * nd(rng);
  for (auto& v : logits) v = 2.f * nd(rng);

  Dev<uint16_t> dx(x), dgu(gate_up), ddown(down), dh(size_t(R) * mip);
  Dev<float> dgub(gu_b), ddownb(down_b), dlogits(logits), dw(static_cast<size_t>(R)), dy(size_t(R) * H);
  Dev<float> out(size_t(T) * H), out_add(size_t(T) * H);
  Dev<int32_t> dids(static_cast<size_t>(R)), offsets(size_t(m.E) + 1), route_row(static_cast<size_t>(R)),
      row_token(static_cast<size_t>(R));
  const int tile_rows = cuda::grouped_tile_rows(R, m.E), max_tiles = cuda::grouped_max_tiles(R, m.E, tile_rows);
  Dev<int32_t> tile_expert(static_cast<size_t>(max_tiles)), tile_row0(static_cast<size_t>(max_tiles)), num_tiles(1);
  Dev<float> partials(size_t(4) << 20);
  Dev<int> tickets(65536);
  const cuda::GemmWorkspace ws = workspace(partials, tickets);
  std::vector<float> base(size_t(T) * H, 0.5f);
  cudaMemcpy(out_add.p, base.data(), base.size() * 4, cudaMemcpyHostToDevice);

  cuda::MoePlan plan;
  plan.expert_offsets = offsets.p, plan.route_row = route_row.p, plan.row_token = row_token.p;
  plan.tile_expert = tile_expert.p, plan.tile_row0 = tile_row0.p, plan.num_tiles = num_tiles.p;
  auto run = [&] {
    cuda::moe_route(dlogits.p, T, m.E, m.k, m.softmax_first, m.renormalize, dids.p, dw.p, nullptr);
    cuda::moe_plan(dids.p, T, m.k, m.E, tile_rows, plan, nullptr);
    cuda::GroupedRows rows;
    rows.gather = row_token.p, rows.expert_offsets = offsets.p, rows.tile_expert = tile_expert.p;
    rows.tile_row0 = tile_row0.p, rows.num_tiles = num_tiles.p, rows.max_tiles = max_tiles, rows.tile_rows = tile_rows;
    rows.w_stride = size_t(2 * mip) * H, rows.bias_stride = 2 * mip;
    cuda::GemmArgs g;
    g.x = dx.p, g.ld_x = H, g.w = dgu.p, g.ld_w = H, g.bias = m.biases ? dgub.p : nullptr;
    g.T = R, g.N = 2 * mip, g.K = H;
    g.epilogue = cuda::Epilogue::kGatedMul, g.act = m.act, g.act_limit = 7.f, g.h = dh.p, g.ld_h = mip;
    g.splits = splits, g.grouped = &rows;
    cuda::gemm(g, e, ws, nullptr);
    cuda::GroupedRows down_rows = rows;
    down_rows.gather = nullptr, down_rows.w_stride = size_t(H) * mip, down_rows.bias_stride = H;
    cuda::GemmArgs d;
    d.x = dh.p, d.ld_x = mip, d.w = ddown.p, d.ld_w = mip, d.bias = m.biases ? ddownb.p : nullptr, d.T = R, d.N = H;
    d.K = MI, d.epilogue = cuda::Epilogue::kStore, d.y = dy.p, d.ld_y = H, d.splits = splits, d.grouped = &down_rows;
    cuda::gemm(d, e, ws, nullptr);
    cuda::moe_combine(dy.p, route_row.p, dw.p, T, m.k, H, out.p, false, nullptr);
  };
  run();
  cuda::moe_combine(dy.p, route_row.p, dw.p, T, m.k, H, out_add.p, true, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.read(), got_add = out_add.read(), w = dw.read();
  const auto ids = dids.read(), offs = offsets.read(), rr = route_row.read(), rt = row_token.read();
  const auto te = tile_expert.read(), t0 = tile_row0.read();
  const int ntiles = num_tiles.read()[0];

  // The plan: offsets are the prefix sums of the counts; rows a permutation inside each expert's
  // range; every row's token; tiles covering each expert's rows once.
  std::vector<int> count(static_cast<size_t>(m.E), 0), seen(static_cast<size_t>(R), 0);
  for (int r = 0; r < R; r++) count[size_t(ids[size_t(r)])]++;
  CHECK(offs[0] == 0);
  for (int x = 0; x < m.E; x++) CHECK(offs[size_t(x) + 1] - offs[size_t(x)] == count[size_t(x)]);
  for (int r = 0; r < R; r++) {
    const int row = rr[size_t(r)], ex = ids[size_t(r)];
    CHECK(row >= offs[size_t(ex)] && row < offs[size_t(ex) + 1]);
    seen[size_t(row)]++;
    CHECK(rt[size_t(row)] == r / m.k);
  }
  for (int r = 0; r < R; r++) CHECK(seen[size_t(r)] == 1);
  CHECK(ntiles <= max_tiles);
  std::vector<int> covered(static_cast<size_t>(R), 0);
  for (int i = 0; i < ntiles; i++)
    for (int row = t0[size_t(i)]; row < std::min(t0[size_t(i)] + tile_rows, offs[size_t(te[size_t(i)]) + 1]); row++)
      covered[size_t(row)]++;
  for (int r = 0; r < R; r++) CHECK(covered[size_t(r)] == 1);

  int bad = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    std::vector<int> want_ids;
    std::vector<double> want_w;
    route_host(logits, t, m, want_ids, want_w);
    for (int j = 0; j < m.k; j++) {
      CHECK(ids[size_t(t) * m.k + j] == want_ids[size_t(j)]);
      CHECK(std::fabs(w[size_t(t) * m.k + j] - want_w[size_t(j)]) <= 1e-5);
    }
    std::vector<double> ref(static_cast<size_t>(H), 0.0), mag(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < m.k; j++) {
      const int ex = want_ids[size_t(j)];
      std::vector<double> h(static_cast<size_t>(MI));
      for (int i = 0; i < MI; i++) {
        const int gr = ex * 2 * mip + (i / 8) * 16 + i % 8, ur = gr + 8;
        double g = m.biases ? gu_b[size_t(gr)] : 0.0, u = m.biases ? gu_b[size_t(ur)] : 0.0;  // biases as W's rows
        for (int c = 0; c < H; c++) {
          g += xv[size_t(t) * H + c] * guv[size_t(gr) * H + c];
          u += xv[size_t(t) * H + c] * guv[size_t(ur) * H + c];
        }
        h[size_t(i)] = from_e(to_e(gated(g, u, m.act, 7.0), e), e);
      }
      for (int n = 0; n < H; n++) {
        double y = m.biases ? down_b[size_t(ex) * H + n] : 0.0, a = 0;
        for (int i = 0; i < MI; i++) {
          y += h[size_t(i)] * dv[(size_t(ex) * H + n) * MI + i];
          a += std::fabs(h[size_t(i)] * dv[(size_t(ex) * H + n) * MI + i]);
        }
        ref[size_t(n)] += want_w[size_t(j)] * y;
        mag[size_t(n)] += std::fabs(want_w[size_t(j)]) * (a + std::fabs(y));
      }
    }
    for (int n = 0; n < H; n++) {
      const double tol = 4 * unit(e) * mag[size_t(n)] + 1e-4;
      const double err = std::fabs(got[size_t(t) * H + n] - ref[size_t(n)]);
      const double err_add = std::fabs(got_add[size_t(t) * H + n] - (0.5 + ref[size_t(n)]));
      worst = std::max(worst, err / tol);
      if (!(err <= tol) || !(err_add <= tol + 1e-6)) bad++;
    }
  }
  // The same inputs again: the same bits (atomics place rows anywhere; results do not move).
  run();
  CUDA_OK(cudaDeviceSynchronize());
  const auto again = out.read();
  CHECK(std::equal(again.begin(), again.end(), got.begin(),
                   [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; }));
  if (bad)
    std::printf("  moe E=%d k=%d T=%d splits=%d: %d bad, worst %.2f of tolerance\n", m.E, m.k, T, splits, bad, worst);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE(moe_route_plan_grouped_gemms_and_combine_match_the_host) {
  const MoeCase cases[] = {
      {8, 2, true, true, false, cuda::GateAct::kSilu},             // Mixtral-like
      {16, 4, true, false, false, cuda::GateAct::kGeluTanh},       // softmax top-k, not renormalised
      {32, 4, false, false, true, cuda::GateAct::kSwigluClamped},  // gpt-oss: top-k then softmax, biases
  };
  uint32_t seed = 1;
  for (const MoeCase& m : cases)
    for (DType e : {DType::BF16, DType::F16})
      for (int T : {1, 3, 17, 150})
        for (int splits : {0, 2}) check_moe(m, T, splits, e, seed++);
}

TEST_CASE(gated_activations_on_every_path_match_the_host) {
  const int N = 64, K = 64;
  for (cuda::GateAct act : {cuda::GateAct::kSilu, cuda::GateAct::kGeluTanh, cuda::GateAct::kSwigluClamped})
    for (int T : {1, 5, 40}) {
      std::mt19937 rng(uint32_t(T) * 7 + uint32_t(act));
      std::vector<double> xv, wv;
      const DType e = DType::BF16;
      const auto x = matrix(rng, T, K, K, 1.0, e, xv);
      const auto w = matrix(rng, N, K, K, 3.0 / std::sqrt(K), e, wv);  // pre-activations past the limit 7
      Dev<uint16_t> dx(x), dw(w), dh(size_t(T) * (N / 2)), dh2(size_t(T) * (N / 2));
      Dev<float> partials(size_t(1) << 20), g(size_t(T) * N);
      Dev<int> tickets(4096);
      cuda::GemmArgs a;
      a.x = dx.p, a.ld_x = K, a.w = dw.p, a.ld_w = K, a.T = T, a.N = N, a.K = K, a.epilogue = cuda::Epilogue::kGatedMul;
      a.act = act, a.act_limit = 7.f, a.h = dh.p, a.ld_h = N / 2;
      cuda::gemm(a, e, workspace(partials, tickets), nullptr);
      // The cuBLASLt path's separate epilogue, on the products stored in f32.
      a.epilogue = cuda::Epilogue::kStore, a.y = g.p, a.ld_y = N;
      cuda::gemm(a, e, workspace(partials, tickets), nullptr);
      cuda::gated_mul_interleaved(g.p, T, N, nullptr, act, 7.f, dh2.p, N / 2, e, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto h = dh.read(), h2 = dh2.read();
      int bad = 0;
      for (int t = 0; t < T; t++)
        for (int i = 0; i < N / 2; i++) {
          const int gr = (i / 8) * 16 + i % 8, ur = gr + 8;
          double gv = 0, uv = 0, mag = 0;
          for (int c = 0; c < K; c++) {
            gv += xv[size_t(t) * K + c] * wv[size_t(gr) * K + c];
            uv += xv[size_t(t) * K + c] * wv[size_t(ur) * K + c];
            const double wg = std::fabs(wv[size_t(gr) * K + c]), wu = std::fabs(wv[size_t(ur) * K + c]);
            mag += std::fabs(xv[size_t(t) * K + c]) * (wg + wu);
          }
          const double want = gated(gv, uv, act, 7.0);
          const double tol = 2 * unit(e) * std::fabs(want) + 1e-4 * mag * (1 + std::fabs(gv) + std::fabs(uv)) + 1e-4;
          for (const auto* hh : {&h, &h2})
            if (!(std::fabs(from_e((*hh)[size_t(t) * (N / 2) + i], e) - want) <= tol)) bad++;
        }
      if (bad) std::printf("  gated act %d T=%d: %d bad\n", int(act), T, bad);
      CHECK(bad == 0);
    }
}

TEST_CASE(sandwich_add_soft_cap_and_embedding_scale_match_the_host) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int T = 5, D = 1152;
  std::vector<float> x(size_t(T) * D), y(size_t(T) * D), w(static_cast<size_t>(D));
  for (auto& v : x) v = nd(rng);
  for (auto& v : y) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  Dev<float> dx(x), dy(y), dw(w);
  cuda::add_rmsnorm(dx.p, dy.p, T, D, dw.p, 1e-6f, nullptr);
  std::vector<float> logits(3000);
  for (auto& v : logits) v = 20.f * nd(rng);
  Dev<float> dl(logits);
  cuda::soft_cap(dl.p, logits.size(), 30.f, nullptr);
  std::vector<uint16_t> table(size_t(4) * 16);
  for (auto& v : table) v = f32_to_bf16(nd(rng));
  const std::vector<int32_t> ids = {3, 0, 2};
  Dev<uint16_t> dtable(table);
  Dev<int32_t> dids(ids);
  Dev<float> emb(size_t(3) * 16);
  cuda::embedding(dids.p, 3, dtable.p, 16, DType::BF16, 16, 33.941125f, emb.p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto gx = dx.read(), gl = dl.read(), ge = emb.read();
  for (int t = 0; t < T; t++) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += double(y[size_t(t) * D + i]) * y[size_t(t) * D + i];
    const double inv = 1 / std::sqrt(ss / D + 1e-6);
    for (int i = 0; i < D; i++) {
      const double want = x[size_t(t) * D + i] + y[size_t(t) * D + i] * inv * w[size_t(i)];
      CHECK(std::fabs(gx[size_t(t) * D + i] - want) <= 1e-5 * (1 + std::fabs(want)));
    }
  }
  for (size_t i = 0; i < logits.size(); i++)
    CHECK(std::fabs(gl[i] - 30.0 * std::tanh(logits[i] / 30.0)) <= 1e-5 * 30);
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 16; i++)
      CHECK(ge[size_t(r) * 16 + i] == bf16_to_f32(table[size_t(ids[size_t(r)]) * 16 + i]) * 33.941125f);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda family kernels")) return rc;
  return sluice_test::run_all("cuda family kernels");
}
