// CUDA kernels against double-precision references computed on the host from the same
// (bf16/f16-rounded) inputs. Exits 77 (ctest: skipped) when no CUDA device is present.
//
// Tolerances: GEMM outputs in f32 accumulate in f32 over K, so |y - ref| <= 2e-5 * sum|x*w|
// (+1e-6); outputs rounded to bf16 (SiLU-and-mul, attention) add 2^-8 relative rounding.
// With an fp8 KV cache the attention reference reads code * scale (sluice_cuda_test::e4m3_values),
// and its tolerance scales with the attention-weighted mean |v| (V spans many binades).
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cublaslt.h"
#include "cuda/kernels.h"
#include "sample/sampler.h"
#include "util/e4m3.h"
#include "sluice/dtype.h"
#include "engine/backend.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace sluice;
using sluice_cuda_test::Dev;

namespace {

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
float from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

// Random [rows, ld] matrix with zero padding past `cols`, and its rounded values as double.
std::vector<uint16_t> random_matrix(std::mt19937& rng, int rows, int cols, int ld, float scale, DType e,
                                    std::vector<double>* values) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<uint16_t> m(static_cast<size_t>(rows) * ld, 0);
  values->assign(size_t(rows) * cols, 0.0);
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
  cudaMemset(tickets.p, 0, tickets.n * sizeof(int));
  return {partials.p, partials.n, tickets.p, int(tickets.n), sms};
}

// With `lt`, the cuBLASLt path runs it (its SiLU-and-mul scratch holds 64 tokens, so longer
// problems go through it in chunks).
void check_gemm(int T, int N, int K, cuda::Epilogue ep, bool bias, DType e, uint32_t seed, int splits = 0,
                cuda::CublasLt* lt = nullptr) {
  std::mt19937 rng(seed);
  const int ld = (K + 7) / 8 * 8;
  std::vector<double> xv, wv;
  auto x = random_matrix(rng, T, K, ld, 1.f, e, &xv);
  auto w = random_matrix(rng, N, K, ld, 1.f / std::sqrt(float(K)), e, &wv);
  std::vector<float> b(static_cast<size_t>(N)), y0(size_t(T) * N);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (auto& v : b) v = nd(rng);
  for (auto& v : y0) v = nd(rng);
  Dev<uint16_t> dx(x), dw(w);
  Dev<float> db(b), dy(y0);
  Dev<uint16_t> dh(static_cast<size_t>(T) * (N / 2 + 8));
  Dev<float> partials(size_t(4) << 20);
  Dev<int> tickets(4096);
  Dev<uint8_t> lt_workspace(size_t(32) << 20);
  Dev<float> lt_scratch(size_t(64) * N);
  auto workspace = [&] {
    cuda::GemmWorkspace ws = make_workspace(partials, tickets);
    if (lt) {
      ws.lt = lt;
      ws.lt_workspace = lt_workspace.p;
      ws.lt_workspace_bytes = lt_workspace.n;
      ws.lt_scratch = lt_scratch.p;
      ws.lt_scratch_floats = lt_scratch.n;
    }
    return ws;
  };
  cuda::GemmArgs a;
  a.x = dx.p, a.ld_x = ld, a.w = dw.p, a.ld_w = ld, a.bias = bias ? db.p : nullptr;
  a.T = T, a.N = N, a.K = K, a.epilogue = ep, a.y = dy.p, a.ld_y = N, a.h = dh.p, a.ld_h = N / 2, a.splits = splits;
  cuda::gemm(a, e, workspace(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dy.read();
  const auto h = dh.read();
  int bad = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    std::vector<double> ref(static_cast<size_t>(N)), mag(static_cast<size_t>(N));
    for (int n = 0; n < N; n++) {
      double s = bias ? b[size_t(n)] : 0.0, m = 0;
      for (int k = 0; k < K; k++) {
        s += xv[size_t(t) * K + k] * wv[size_t(n) * K + k];
        m += std::fabs(xv[size_t(t) * K + k] * wv[size_t(n) * K + k]);
      }
      ref[size_t(n)] = s;
      mag[size_t(n)] = m;
    }
    if (ep == cuda::Epilogue::kGatedMul) {
      for (int i = 0; i < N / 2; i++) {
        const int gr = (i / 8) * 16 + i % 8, ur = gr + 8;
        const double g = ref[size_t(gr)], u = ref[size_t(ur)];
        const double want = g / (1 + std::exp(-g)) * u;
        const double got = from_e(h[size_t(t) * (N / 2) + i], e);
        const double tol = 1e-2 * std::fabs(want) + 2e-5 * (mag[size_t(gr)] + mag[size_t(ur)]) * (1 + std::fabs(u) + std::fabs(g)) + 1e-4;
        worst = std::max(worst, std::fabs(got - want) / tol);
        if (!(std::fabs(got - want) <= tol)) bad++;
      }
    } else {
      for (int n = 0; n < N; n++) {
        const double want = ref[size_t(n)] + (ep == cuda::Epilogue::kAddTo ? y0[size_t(t) * N + n] : 0.0);
        const double got = y[size_t(t) * N + n];
        const double tol = 2e-5 * mag[size_t(n)] + 1e-5 * std::fabs(want) + 1e-6;
        worst = std::max(worst, std::fabs(got - want) / tol);
        if (!(std::fabs(got - want) <= tol)) bad++;
      }
    }
  }
  if (bad) std::printf("  gemm%s T=%d N=%d K=%d ep=%d bias=%d %s splits=%d: %d bad, worst %.2fx tol\n", lt ? " (cuBLASLt)" : "",
                       T, N, K, int(ep), int(bias), dtype_name(e), splits, bad, worst);
  CHECK(bad == 0);
  // Deterministic: the same launch gives the same bits (split-K sums in a fixed order).
  if (ep == cuda::Epilogue::kStore) {
    cuda::gemm(a, e, workspace(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(std::memcmp(dy.read().data(), y.data(), y.size() * 4) == 0);
  }
}

}  // namespace

TEST_CASE(gemm_matches_double_reference) {
  const DType types[] = {DType::BF16, DType::F16};
  struct Shape {
    int T, N, K;
  };
  // Decode (T <= 8: split K), small batches, prefill tiles, ragged edges, K not a multiple of 64.
  const Shape shapes[] = {{1, 96, 64},  {3, 200, 72},   {8, 1000, 4096}, {5, 6144, 1024}, {17, 300, 264},
                          {32, 128, 48}, {40, 520, 136}, {130, 256, 128}, {300, 777, 520}, {1, 4096, 4096}};
  uint32_t seed = 1;
  for (DType e : types)
    for (const Shape& s : shapes) {
      check_gemm(s.T, s.N, s.K, cuda::Epilogue::kStore, seed % 2 == 0, e, seed);
      seed++;
    }
  for (const Shape& s : shapes) check_gemm(s.T, s.N, s.K, cuda::Epilogue::kAddTo, true, DType::BF16, seed++);
  const Shape silu[] = {{1, 512, 64}, {6, 1024, 256}, {20, 4096, 512}, {100, 768, 136}};
  for (DType e : types)
    for (const Shape& s : silu) check_gemm(s.T, s.N, s.K, cuda::Epilogue::kGatedMul, seed % 2 == 1, e, seed++);
  // Decode sizes take a GEMV kernel by default; the tensor-core path with forced K splits too.
  for (int splits : {1, 3, 7}) {
    check_gemm(5, 600, 1024, cuda::Epilogue::kStore, true, DType::BF16, seed++, splits);
    check_gemm(40, 300, 520, cuda::Epilogue::kAddTo, false, DType::BF16, seed++, splits);
    check_gemm(3, 1024, 512, cuda::Epilogue::kGatedMul, true, DType::F16, seed++, splits);
  }
}

// The same contract through cuBLASLt where the host has it (cuda_gemm cublaslt / auto).
TEST_CASE(gemm_cublaslt_matches_double_reference) {
  std::string why;
  auto lt = cuda::CublasLt::open(&why);
  if (!lt) {
    std::printf("  cuBLASLt not on this host (%s): its GEMM path is not checked here\n", why.c_str());
    return;
  }
  std::printf("  %s\n", lt->describe().c_str());
  struct Shape {
    int T, N, K;
  };
  const Shape shapes[] = {{9, 96, 64}, {17, 300, 264}, {130, 256, 128}, {300, 777, 520}, {256, 4096, 1024}};
  uint32_t seed = 1000;
  for (DType e : {DType::BF16, DType::F16})
    for (const Shape& s : shapes) {
      check_gemm(s.T, s.N, s.K, cuda::Epilogue::kStore, seed % 2 == 0, e, seed, 0, lt.get());
      check_gemm(s.T, s.N, s.K, cuda::Epilogue::kAddTo, seed % 2 == 1, e, seed + 1, 0, lt.get());
      seed += 2;
    }
  const Shape silu[] = {{20, 4096, 512}, {100, 768, 136}, {200, 1024, 256}};
  for (DType e : {DType::BF16, DType::F16})
    for (const Shape& s : silu) check_gemm(s.T, s.N, s.K, cuda::Epilogue::kGatedMul, seed % 2 == 1, e, seed++, 0, lt.get());
  CHECK(lt->num_plans() > 0);
}

namespace {

// A flattened batch over a paged cache with shuffled block tables, checked against double.
// fp8: the cache holds e4m3 codes (kc / vc keep them in 16-bit slots on the host).
void check_attention(int nq, int nkv, int hd, int splits, DType e, uint32_t seed, bool fp8 = false) {
  std::mt19937 rng(seed);
  const int bs = 16;
  // Sequences: (context length, tokens computed this step): decode rows and prefill chunks.
  const std::vector<std::pair<int, int>> seqs = {{1, 1}, {37, 1}, {300, 1}, {20, 20}, {90, 13}, {600, 1}};
  int num_blocks = 0;
  for (auto& s : seqs) num_blocks += (s.first + bs - 1) / bs;
  std::vector<int> perm(static_cast<size_t>(num_blocks));
  for (int i = 0; i < num_blocks; i++) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  int max_blocks = 0;
  for (auto& s : seqs) max_blocks = std::max(max_blocks, (s.first + bs - 1) / bs);
  std::vector<int32_t> tables(seqs.size() * size_t(max_blocks), 0);
  int next = 0;
  for (size_t s = 0; s < seqs.size(); s++)
    for (int b = 0; b < (seqs[s].first + bs - 1) / bs; b++) tables[s * max_blocks + b] = perm[size_t(next++)];
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t slots = size_t(num_blocks) * bs;
  std::vector<uint16_t> kc(slots * nkv * hd), vc(slots * nkv * hd);
  using sluice_cuda_test::kFp8KScale, sluice_cuda_test::kFp8VScale, sluice_cuda_test::wide_normal;
  if (fp8) {
    for (auto& v : kc) v = f32_to_e4m3(wide_normal(rng, -10, 0) / kFp8KScale);
    for (auto& v : vc) v = f32_to_e4m3(wide_normal(rng, -8, 2) / kFp8VScale);
  } else {
    for (auto& v : kc) v = to_e(nd(rng), e);
    for (auto& v : vc) v = to_e(nd(rng), e);
  }
  const std::vector<double> k8 = sluice_cuda_test::e4m3_values(kFp8KScale), v8 = sluice_cuda_test::e4m3_values(kFp8VScale);
  auto kval = [&](size_t i) { return fp8 ? k8[kc[i]] : double(from_e(kc[i], e)); };
  auto vval = [&](size_t i) { return fp8 ? v8[vc[i]] : double(from_e(vc[i], e)); };
  std::vector<int32_t> token_seq, positions;
  for (size_t s = 0; s < seqs.size(); s++)
    for (int p = seqs[s].first - seqs[s].second; p < seqs[s].first; p++) {
      token_seq.push_back(int32_t(s));
      positions.push_back(p);
    }
  const int T = int(token_seq.size());
  std::vector<float> q(static_cast<size_t>(T) * nq * hd);
  for (auto& v : q) v = nd(rng);
  Dev<float> dq(q);
  Dev<int32_t> dseq(token_seq), dpos(positions), dtab(tables), dstride(std::vector<int32_t>{max_blocks});
  Dev<uint16_t> dk(kc), dv(vc), dout(size_t(T) * nq * hd);
  Dev<uint8_t> dk8(sluice_cuda_test::narrow_codes(kc)), dv8(sluice_cuda_test::narrow_codes(vc));
  Dev<float> pacc(static_cast<size_t>(T) * nq * splits * hd), pml(size_t(T) * nq * splits * 2);
  cuda::AttentionArgs a;
  a.q = dq.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.token_seq = dseq.p, a.positions = dpos.p;
  a.block_tables = dtab.p, a.table_stride = dstride.p, a.block_size = bs, a.k_cache = dk.p, a.v_cache = dv.p;
  a.scale = float(1.0 / std::sqrt(double(hd))), a.num_splits = splits, a.partial_acc = pacc.p, a.partial_ml = pml.p;
  a.out = dout.p, a.ld_out = nq * hd;
  if (fp8) {
    a.k_cache = dk8.p, a.v_cache = dv8.p;
    a.kv_fp8 = true, a.k_scale = kFp8KScale, a.v_scale = kFp8VScale;
  }
  cuda::paged_attention(a, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto out = dout.read();
  int bad = 0;
  for (int t = 0; t < T; t++) {
    const int s = token_seq[size_t(t)], ctx = positions[size_t(t)] + 1;
    for (int h = 0; h < nq; h++) {
      const int kvh = h / (nq / nkv);
      std::vector<double> sc(static_cast<size_t>(ctx));
      double mx = -1e300;
      for (int p = 0; p < ctx; p++) {
        const size_t slot = size_t(tables[size_t(s) * max_blocks + p / bs]) * bs + p % bs;
        double d = 0;
        for (int i = 0; i < hd; i++)
          d += double(q[(size_t(t) * nq + h) * hd + i]) * kval((slot * nkv + kvh) * hd + i);
        sc[size_t(p)] = d / std::sqrt(double(hd));
        mx = std::max(mx, sc[size_t(p)]);
      }
      double sum = 0;
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      for (int i = 0; i < hd; i++) {
        double o = 0, wabs = 0;
        for (int p = 0; p < ctx; p++) {
          const size_t slot = size_t(tables[size_t(s) * max_blocks + p / bs]) * bs + p % bs;
          const double v = vval((slot * nkv + kvh) * hd + i);
          o += sc[size_t(p)] / sum * v;
          wabs += sc[size_t(p)] / sum * std::fabs(v);
        }
        const double got = from_e(out[(size_t(t) * nq + h) * hd + i], e);
        // fp8: V's magnitudes vary by 2^10, so the absolute term follows the weighted mean |v|.
        const double tol = fp8 ? 1e-2 * std::fabs(o) + 2e-3 * wabs + 1e-6 : 1e-2 * std::fabs(o) + 2e-3;
        if (!(std::fabs(got - o) <= tol)) bad++;
      }
    }
  }
  if (bad)
    std::printf("  attention nq=%d nkv=%d hd=%d splits=%d %s%s: %d bad\n", nq, nkv, hd, splits, dtype_name(e),
                fp8 ? " fp8 kv" : "", bad);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE(paged_attention_matches_double_reference) {
  struct Heads {
    int nq, nkv, hd;
  };
  // MHA, GQA 4:1 and 7:1 (Qwen2.5), 16:1 (two blocks of 8 q heads), head dims 16..256.
  const Heads hs[] = {{4, 4, 16}, {8, 2, 64}, {14, 2, 64}, {32, 8, 128}, {16, 1, 48}, {4, 2, 256}};
  uint32_t seed = 100;
  for (const Heads& h : hs)
    for (int splits : {1, 3, 16}) check_attention(h.nq, h.nkv, h.hd, splits, DType::BF16, seed++);
  check_attention(8, 2, 64, 4, DType::F16, seed++);
}

TEST_CASE(paged_attention_reads_fp8_kv_cache) {
  // The same shapes over an e4m3 cache (code * k_scale, code * v_scale), bf16 and f16 outputs.
  struct Heads {
    int nq, nkv, hd;
  };
  const Heads hs[] = {{4, 4, 16}, {8, 2, 64}, {14, 2, 64}, {32, 8, 128}, {16, 1, 48}, {4, 2, 256}};
  uint32_t seed = 150;
  for (const Heads& h : hs)
    for (int splits : {1, 3, 16}) check_attention(h.nq, h.nkv, h.hd, splits, DType::BF16, seed++, true);
  check_attention(8, 2, 64, 4, DType::F16, seed++, true);
  check_attention(32, 8, 128, 1, DType::F16, seed++, true);
}

TEST_CASE(qkv_post_writes_kv_cache_codes) {
  // No norms and no rotation, so K and V reach the cache as they are in qkv: every cache element
  // must be the host's rounding of it, code for code: f32_to_e4m3(x / scale) (nearest even,
  // saturated to +-448) with kv_fp8, bf16 (nearest even) otherwise; q passes through unchanged.
  const int T = 5, nq = 4, nkv = 2, hd = 64, num_slots = 8, width = (nq + 2 * nkv) * hd;
  const std::vector<int32_t> slots = {3, 0, 7, 1, 5};
  std::mt19937 rng(4242);
  std::vector<float> qkv(size_t(T) * width);
  for (auto& v : qkv) v = sluice_cuda_test::wide_normal(rng, -14, 6);
  // Specials in token 0's first K and V head: zeros, saturation, ties of the f32 quotient, NaN-free.
  const float specials[] = {0.f, -0.f, 1e6f, -1e6f, 448.f * 0.05f, 464.f * 0.05f, 0.05f * 0.0009765625f,
                            0.05f * 0.00390625f * 1.5f, 0.05f * 0.01171875f, -0.05f * 17.f};
  for (int i = 0; i < int(sizeof(specials) / sizeof(float)); i++) {
    qkv[size_t(nq * hd + i)] = specials[i];
    qkv[size_t((nq + nkv) * hd + i)] = specials[i] * (0.02f / 0.05f);
  }
  std::vector<float> cos_sin(static_cast<size_t>(T) * 2, 0.f);
  Dev<float> dqkv(qkv), dcs(cos_sin), dq(size_t(T) * nq * hd);
  Dev<int32_t> dslots(slots);
  for (DType e : {DType::BF16, DType::F16})
    for (bool fp8 : {false, true}) {
      if (!fp8 && e == DType::F16) continue;  // (f16's overflow of the specials is not the point here)
      const size_t elems = size_t(num_slots) * nkv * hd, bytes = elems * (fp8 ? 1 : 2);
      Dev<uint8_t> dk(bytes), dv(bytes);
      cuda::QkvPostArgs a;
      a.qkv = dqkv.p, a.T = T, a.nq = nq, a.nkv = nkv, a.hd = hd, a.rot_half = 0;
      a.cos_sin = dcs.p, a.slots = dslots.p, a.k_cache = dk.p, a.v_cache = dv.p, a.q_out = dq.p;
      a.kv_fp8 = fp8, a.k_scale = sluice_cuda_test::kFp8KScale, a.v_scale = sluice_cuda_test::kFp8VScale;
      cuda::qkv_post(a, e, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto k = dk.read(), v = dv.read();
      const auto qo = dq.read();
      int bad = 0, saturated = 0, subnormal = 0;
      for (int t = 0; t < T; t++) {
        for (int i = 0; i < nq * hd; i++)
          if (std::memcmp(&qo[size_t(t) * nq * hd + i], &qkv[size_t(t) * width + i], 4) != 0) bad++;
        for (int i = 0; i < nkv * hd; i++) {
          const size_t at = (size_t(slots[size_t(t)]) * nkv * hd + i);
          const float kx = qkv[size_t(t) * width + nq * hd + i], vx = qkv[size_t(t) * width + (nq + nkv) * hd + i];
          if (fp8) {
            const uint8_t kw = f32_to_e4m3(kx / a.k_scale), vw = f32_to_e4m3(vx / a.v_scale);
            if (k[at] != kw || v[at] != vw) {
              if (bad < 4) std::printf("    t=%d i=%d: k %g -> %#x (want %#x), v %g -> %#x (want %#x)\n", t, i, kx, k[at], kw, vx, v[at], vw);
              bad++;
            }
            saturated += (kw & 0x7f) == 0x7e;
            subnormal += (kw & 0x78) == 0 && (kw & 7) != 0;
          } else {
            uint16_t kg, vg;
            std::memcpy(&kg, &k[2 * at], 2);
            std::memcpy(&vg, &v[2 * at], 2);
            if (kg != to_e(kx, e) || vg != to_e(vx, e)) bad++;
          }
        }
      }
      if (bad) std::printf("  qkv_post %s%s: %d elements differ\n", dtype_name(e), fp8 ? " fp8 kv" : "", bad);
      CHECK(bad == 0);
      if (fp8) CHECK(saturated > 0 && subnormal > 0);  // the data reached both ends of e4m3
    }
}

namespace {

struct SampleCase {
  float temperature, top_p;
  int top_k;
  float min_p = 0.f;
};

}  // namespace

TEST_CASE(sampling_matches_the_cpu_sampler) {
  const int Vs[] = {1000, 151936};
  // The min_p cases cut at both widths (logits ~ N(0, 3): about max - 3 for 0.05 at T = 1), under
  // top-k and over top-p too; min_p 1 sits on a row of exact ties (r % 8 == 3 hits cases 3, 7, 11).
  const SampleCase cases[] = {{0.f, 1.f, 0},     {1.f, 1.f, 40},       {0.7f, 0.9f, 0},   {1.3f, 0.5f, 50},
                              {1.f, 0.99f, 0},   {2.f, 1.f, 1},        {0.5f, 0.3f, 5},   {1.f, 0.95f, 100000},
                              {1.f, 1.f, 0, .05f}, {0.7f, 0.9f, 0, .1f}, {1.f, 1.f, 100, .1f}, {1.f, 1.f, 0, 1.f}};
  const int num_cases = int(sizeof(cases) / sizeof(cases[0]));
  std::mt19937 rng(7);
  for (int V : Vs) {
    const int R = 96;
    std::vector<float> logits(static_cast<size_t>(R) * V);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (int r = 0; r < R; r++)
      for (int i = 0; i < V; i++) {
        float v = nd(rng);
        if (r % 8 == 3) v = std::round(v);  // many exact ties
        logits[size_t(r) * V + i] = v;
      }
    std::vector<cuda::SampleRowParams> params(static_cast<size_t>(R));
    std::vector<SamplingParams> sp(static_cast<size_t>(R));
    for (int r = 0; r < R; r++) {
      const SampleCase& c = cases[r % num_cases];
      sp[size_t(r)] = {c.temperature, c.top_p, c.top_k, uint64_t(r * 31 + V), 5, c.min_p};
      Rng draw(sp[size_t(r)].seed);
      params[size_t(r)] = {sp[size_t(r)], draw.next_double()};
    }
    Dev<float> dl(logits);
    Dev<cuda::SampleRowParams> dp(params);
    Dev<int32_t> tok(static_cast<size_t>(R)), top_ids(size_t(R) * 5);
    Dev<float> lp(static_cast<size_t>(R)), top_lp(size_t(R) * 5), stats(size_t(R) * cuda::kSampleStatsFloatsPerRow);
    cuda::SampleArgs a;
    a.row_stats = stats.p;
    a.logits = dl.p, a.R = R, a.V = V, a.params = dp.p, a.top_n = 5, a.tokens = tok.p, a.logprobs = lp.p;
    a.top_ids = top_ids.p, a.top_logprobs = top_lp.p;
    cuda::sample(a, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto gt = tok.read(), gti = top_ids.read();
    const auto glp = lp.read(), gtlp = top_lp.read();
    int token_mismatch = 0;
    std::vector<float> probs;
    std::vector<int32_t> order;
    for (int r = 0; r < R; r++) {
      const float* row = logits.data() + size_t(r) * V;
      int32_t best = 0;
      double m = row[0];
      for (int i = 1; i < V; i++)
        if (row[i] > m) m = row[i], best = i;
      double se = 0;
      for (int i = 0; i < V; i++) se += std::exp(double(row[i]) - m);
      const float lse = float(m + std::log(se));
      Rng cpu_rng(sp[size_t(r)].seed);
      int32_t cti[5];
      float ctlp[5];
      const SampledToken ct = sample_token(row, V, best, lse, sp[size_t(r)], cpu_rng, 5, cti, ctlp, probs, order);
      for (int i = 0; i < 5; i++) {
        CHECK(gti[size_t(r) * 5 + i] == cti[i]);
        CHECK(std::fabs(gtlp[size_t(r) * 5 + i] - ctlp[i]) <= 1e-4f * (1 + std::fabs(ctlp[i])));
      }
      // The CPU draws in id order when neither top-k, top-p nor min-p filters, the GPU always in
      // sorted order: the same distribution, different tokens for the same draw. Compare the rest
      // exactly (a draw landing within float rounding of a boundary could differ: allow 1 in 96).
      const SamplingParams& p = sp[size_t(r)];
      const bool greedy = p.temperature <= 0.f || p.top_k == 1;
      const bool sorted_cpu = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.f || p.min_p > 0.f;
      if (greedy) CHECK(gt[size_t(r)] == best);
      if (p.min_p == 1.f) CHECK(row[gt[size_t(r)]] == row[best]);  // only ties of the best are kept
      else if (sorted_cpu && gt[size_t(r)] != ct.token) token_mismatch++;
      CHECK(gt[size_t(r)] >= 0 && gt[size_t(r)] < V);
      CHECK(std::fabs(glp[size_t(r)] - (row[gt[size_t(r)]] - lse)) <= 1e-4f * (1 + std::fabs(glp[size_t(r)])));
    }
    if (token_mismatch) std::printf("  sampling V=%d: %d of %d sampled rows differ from the CPU draw\n", V, token_mismatch, R);
    CHECK(token_mismatch <= 1);
  }
}

TEST_CASE(token_masks_match_reference_at_every_level) {
  // The CPU test of the same name (native/tests/test_kernels.cpp) on the device: widths that end
  // mid-word, masks with empty, full and mixed words, an all-ones row (the CPU's unmasked row), a
  // row allowing only the last token; then greedy sampling of the masked rows. A row that allows
  // nothing (all-zero mask, or set bits only past V, which do not count) has no finite logit left:
  // the sampler must write token -1 and logprob -inf for it without reading outside the row.
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int V : {1, 7, 31, 32, 45, 1001, 4096 + 19, 151936}) {
    const int R = 6, words = (V + 31) / 32;
    std::vector<float> logits(size_t(R) * size_t(V));
    for (auto& v : logits) v = nd(rng);
    std::vector<uint32_t> masks(size_t(R) * size_t(words), 0u);
    auto mask = [&](int r, int w) -> uint32_t& { return masks[size_t(r) * size_t(words) + size_t(w)]; };
    for (int w = 0; w < words; w++) {
      const int kind = int(rng() % 3);
      mask(0, w) = kind == 0 ? 0u : kind == 1 ? 0xffffffffu : uint32_t(rng());
      mask(1, w) = uint32_t(rng()) & uint32_t(rng());  // sparse
      mask(2, w) = 0xffffffffu;
    }
    mask(3, (V - 1) / 32) = uint32_t(1) << ((V - 1) % 32);
    // Row 4 stays all zero; row 5 has bits past V only (all zero too when V is a multiple of 32).
    if (V % 32 != 0) mask(5, words - 1) = ~((uint32_t(1) << (V % 32)) - 1);
    Dev<float> dl(logits);
    Dev<uint32_t> dm(masks);
    cuda::apply_token_masks(dl.p, R, V, dm.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto masked = dl.read();
    std::vector<int32_t> want_token(static_cast<size_t>(R), -1);
    std::vector<double> want_lp(static_cast<size_t>(R), -INFINITY);
    for (int r = 0; r < R; r++) {
      double best = -INFINITY;
      for (int i = 0; i < V; i++) {
        const size_t at = size_t(r) * size_t(V) + size_t(i);
        const bool allowed = (mask(r, i >> 5) >> (i & 31)) & 1u;
        CHECK(allowed ? masked[at] == logits[at] : (std::isinf(masked[at]) && masked[at] < 0));
        if (allowed && logits[at] > best) best = logits[at], want_token[size_t(r)] = i;
      }
      if (want_token[size_t(r)] < 0) continue;
      double se = 0;
      for (int i = 0; i < V; i++)
        if ((mask(r, i >> 5) >> (i & 31)) & 1u) se += std::exp(double(logits[size_t(r) * size_t(V) + size_t(i)]) - best);
      want_lp[size_t(r)] = -std::log(se);
    }
    CHECK(want_token[2] >= 0 && want_token[3] == V - 1 && want_token[4] == -1 && want_token[5] == -1);
    // Greedy with no alternatives (the kernel's early exit) and with two (the selection path).
    for (int top_n : {0, 2}) {
      std::vector<cuda::SampleRowParams> params(static_cast<size_t>(R), cuda::SampleRowParams{{0.f, 1.f, 0, 0, 0}, 0.5});
      Dev<cuda::SampleRowParams> dp(params);
      Dev<int32_t> tok(static_cast<size_t>(R)), top_ids(size_t(R) * 2);
      Dev<float> lp(static_cast<size_t>(R)), top_lp(size_t(R) * 2), stats(size_t(R) * cuda::kSampleStatsFloatsPerRow);
      cuda::SampleArgs a;
      a.logits = dl.p, a.R = R, a.V = V, a.params = dp.p, a.top_n = top_n, a.tokens = tok.p, a.logprobs = lp.p;
      a.top_ids = top_ids.p, a.top_logprobs = top_lp.p, a.row_stats = stats.p;
      cuda::sample(a, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto gt = tok.read(), gti = top_ids.read();
      const auto glp = lp.read(), gtlp = top_lp.read();
      for (int r = 0; r < R; r++) {
        const size_t ri = size_t(r);
        if (gt[ri] != want_token[ri])
          std::printf("  masks V=%d top_n=%d row %d: token %d, expected %d\n", V, top_n, r, gt[ri], want_token[ri]);
        CHECK(gt[ri] == want_token[ri]);
        if (want_token[ri] < 0) {
          CHECK(std::isinf(glp[ri]) && glp[ri] < 0);
          for (int k = 0; k < top_n; k++) CHECK(gti[ri * 2 + size_t(k)] == -1 && std::isinf(gtlp[ri * 2 + size_t(k)]));
          continue;
        }
        CHECK(std::fabs(glp[ri] - want_lp[ri]) <= 1e-4 * (1 + std::fabs(want_lp[ri])));
        if (top_n > 0) CHECK(gti[ri * 2] == want_token[ri]);
      }
    }
  }
}

TEST_CASE(sampling_frequencies_follow_the_distribution) {
  // One row sampled with many draws: frequencies of temperature/top-p sampling match the
  // renormalised probabilities (chi-square over the kept tokens, generous bound).
  const int V = 50, R = 4000;
  std::vector<float> row(static_cast<size_t>(V));
  for (int i = 0; i < V; i++) row[size_t(i)] = float(std::sin(i * 1.7) * 2.0);
  std::vector<float> logits;
  std::vector<cuda::SampleRowParams> params;
  for (int r = 0; r < R; r++) {
    logits.insert(logits.end(), row.begin(), row.end());
    params.push_back({{0.8f, 0.9f, 0, 0, 0}, (r + 0.5) / R});
  }
  Dev<float> dl(logits);
  Dev<cuda::SampleRowParams> dp(params);
  Dev<int32_t> tok(static_cast<size_t>(R));
  Dev<float> lp(static_cast<size_t>(R)), stats(size_t(R) * cuda::kSampleStatsFloatsPerRow);
  cuda::SampleArgs a;
  a.row_stats = stats.p;
  a.logits = dl.p, a.R = R, a.V = V, a.params = dp.p, a.tokens = tok.p, a.logprobs = lp.p;
  cuda::sample(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = tok.read();
  // Expected: sorted by logit, keep the shortest head with >= 0.9 of softmax(row / 0.8).
  std::vector<int> idx(static_cast<size_t>(V));
  for (int i = 0; i < V; i++) idx[size_t(i)] = i;
  std::sort(idx.begin(), idx.end(), [&](int x, int y) { return row[size_t(x)] > row[size_t(y)] || (row[size_t(x)] == row[size_t(y)] && x < y); });
  std::vector<double> w(static_cast<size_t>(V));
  double all = 0;
  for (int i = 0; i < V; i++) all += (w[size_t(i)] = std::exp((row[size_t(i)] - row[size_t(idx[0])]) / 0.8));
  double cum = 0, kept = 0;
  std::vector<bool> in(static_cast<size_t>(V), false);
  for (int i : idx) {
    in[size_t(i)] = true;
    cum += w[size_t(i)];
    if (cum >= 0.9 * all) break;
  }
  for (int i = 0; i < V; i++)
    if (in[size_t(i)]) kept += w[size_t(i)];
  std::vector<int> count(static_cast<size_t>(V), 0);
  for (int t : got) count[size_t(t)]++;
  // Stratified draws (u = (r + 0.5) / R): each kept token's count is within 1 of R * p.
  for (int i = 0; i < V; i++) {
    if (!in[size_t(i)]) {
      CHECK(count[size_t(i)] == 0);
      continue;
    }
    const double want = R * w[size_t(i)] / kept;
    if (!(std::fabs(count[size_t(i)] - want) <= 1.5)) std::printf("  token %d: %d draws, expected %.1f\n", i, count[size_t(i)], want);
    CHECK(std::fabs(count[size_t(i)] - want) <= 1.5);
  }
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda kernels")) return rc;
  return sluice_test::run_all("cuda kernels");
}
