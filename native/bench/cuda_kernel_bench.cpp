// Per-kernel timings of the CUDA backend for a model's shapes, no Node needed:
//   sluice_cuda_kernel_bench [--shape qwen2.5-0.5b|llama-3.1-8b] [--json FILE]
// Each kernel runs on random data (weights rotated through enough copies to defeat the L2
// cache) and is timed with CUDA events, median of 20 runs after warm-up. The table gives
// microseconds, achieved bandwidth (bytes that must move: weights, activations, KV) and
// TFLOP/s, to set each kernel against the device's ceilings.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/cublaslt.h"
#include "cuda/device_weights.h"
#include "cuda/flash_attention.h"
#include "cuda/flash_decode.h"
#include "cuda/kernels.h"
#include "cuda/sampling_wide.h"

using namespace sluice;
using cuda::DeviceBuffer;

namespace {

struct Shape {
  const char* name;
  int H, I, nq, nkv, hd, V;
};
const Shape kShapes[] = {{"qwen2.5-0.5b", 896, 4864, 14, 2, 64, 151936}, {"llama-3.1-8b", 4096, 14336, 32, 8, 128, 128256}};

struct Row {
  std::string op;
  int T;
  double us, bytes, flops;
};

// Median over 7 trials of the mean time of `reps` back-to-back launches (so launch latency
// overlaps, as in a graph replay), after warm-up launches.
template <typename F>
double time_us(F&& fn, int reps = 50) {
  cudaEvent_t a, b;
  SLUICE_CUDA_CHECK(cudaEventCreate(&a));
  SLUICE_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; i++) fn(i);
  std::vector<float> ms;
  for (int trial = 0; trial < 7; trial++) {
    SLUICE_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) fn(i);
    SLUICE_CUDA_CHECK(cudaEventRecord(b));
    SLUICE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    SLUICE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / float(reps));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

void fill_random(DeviceBuffer& b, uint32_t seed) {
  std::vector<uint16_t> h(b.bytes() / 2);
  std::mt19937 rng(seed);
  for (auto& v : h) v = uint16_t(0x3c00 | (rng() & 0x3ff)) ^ uint16_t((rng() & 1) << 15);  // ~+-1 in bf16 and f16 alike
  SLUICE_CUDA_CHECK(cudaMemcpy(b.get(), h.data(), b.bytes(), cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name = "qwen2.5-0.5b", json;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shape")) shape_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
  }
  const Shape* sp = nullptr;
  for (const Shape& s : kShapes)
    if (shape_name == s.name) sp = &s;
  if (!sp) {
    std::fprintf(stderr, "unknown --shape %s\n", shape_name.c_str());
    return 2;
  }
  const Shape s = *sp;
  try {
    int sms = 0;
    SLUICE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const DType e = DType::BF16;
    const int Tmax = 8192;
    DeviceBuffer x(size_t(Tmax) * std::max(s.I, s.H) * 2);
    fill_random(x, 1);
    DeviceBuffer partials(sizeof(float) * (size_t(8) << 20)), tickets(sizeof(int) * 65536);
    cuda::GemmWorkspace ws{partials.get<float>(), partials.bytes() / 4, tickets.get<int>(), 65536, sms};
    // cuBLASLt beside our kernels where the host has it (the engine's --cuda-gemm cublaslt path).
    std::string lt_why;
    auto lt = cuda::CublasLt::open(&lt_why);
    DeviceBuffer lt_workspace(size_t(32) << 20), lt_scratch(size_t(1024) * 2 * s.I * sizeof(float));
    cuda::GemmWorkspace ws_lt = ws;
    if (lt) {
      ws_lt.lt = lt.get();
      ws_lt.lt_workspace = lt_workspace.get();
      ws_lt.lt_workspace_bytes = lt_workspace.bytes();
      ws_lt.lt_scratch = lt_scratch.get<float>();
      ws_lt.lt_scratch_floats = lt_scratch.bytes() / 4;
      std::printf("gemm rows marked [cuBLASLt]: %s\n", lt->describe().c_str());
    } else {
      std::printf("no cuBLASLt rows: %s\n", lt_why.c_str());
    }
    std::vector<Row> rows;
    {  // Bring the clocks up from idle: half a second of large products before any timing.
      DeviceBuffer w(size_t(8192) * 8192 * 2), wx(size_t(2048) * 8192 * 2), out(size_t(2048) * 8192 * 4);
      fill_random(wx, 2);
      cuda::GemmArgs g;
      g.x = wx.get(), g.ld_x = 8192, g.w = w.get(), g.ld_w = 8192, g.T = 2048, g.N = 8192, g.K = 8192;
      g.y = out.get<float>(), g.ld_y = 8192;
      auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
        cuda::gemm(g, e, ws, nullptr);
        SLUICE_CUDA_CHECK(cudaDeviceSynchronize());
      }
    }

    struct Proj {
      const char* op;
      int N, K;
      cuda::Epilogue ep;
    };
    const int qkv = (s.nq + 2 * s.nkv) * s.hd;
    const Proj projs[] = {{"gemm qkv", qkv, s.H, cuda::Epilogue::kStore},
                          {"gemm o (+residual)", s.H, s.nq * s.hd, cuda::Epilogue::kAddTo},
                          {"gemm gate_up (+silu)", 2 * s.I, s.H, cuda::Epilogue::kGatedMul},
                          {"gemm down (+residual)", s.H, s.I, cuda::Epilogue::kAddTo},
                          {"gemm lm_head", s.V, s.H, cuda::Epilogue::kStore}};
    for (const Proj& p : projs) {
      const size_t wbytes = size_t(p.N) * p.K * 2;
      const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
      std::vector<DeviceBuffer> w;
      for (int c = 0; c < copies; c++) {
        w.emplace_back(wbytes);
        fill_random(w.back(), 10 + c);
      }
      for (int T : {1, 8, 16, 64, 256, 2048, 8192}) {
        if (p.N == s.V && T > 256) continue;
        DeviceBuffer out(size_t(T) * p.N * 4);
        cuda::GemmArgs g;
        g.x = x.get(), g.ld_x = p.K, g.T = T, g.N = p.N, g.K = p.K, g.epilogue = p.ep, g.ld_w = p.K;
        g.y = out.get<float>(), g.ld_y = p.N, g.h = out.get(), g.ld_h = p.N / 2;
        for (const bool use_lt : {false, true}) {
          if (use_lt && (!lt || T <= 8)) continue;
          const double us = time_us([&](int i) {
            g.w = w[size_t(i % copies)].get();
            cuda::gemm(g, e, use_lt ? ws_lt : ws, nullptr);
          });
          rows.push_back({std::string(p.op) + (use_lt ? " [cuBLASLt]" : ""), T, us,
                          double(wbytes) + double(T) * p.K * 2 + double(T) * p.N * 4, 2.0 * T * double(p.N) * p.K});
        }
      }
    }

    // The same products with K split a fixed number of ways (the launcher picks automatically).
    for (const Proj& p : {projs[0], projs[3]}) {
      DeviceBuffer w(size_t(p.N) * p.K * 2), out(size_t(256) * p.N * 4);
      fill_random(w, 99);
      for (int T : {1, 64}) {
        for (int splits : {1, 2, 4, 8}) {
          cuda::GemmArgs g;
          g.x = x.get(), g.ld_x = p.K, g.w = w.get(), g.ld_w = p.K, g.T = T, g.N = p.N, g.K = p.K, g.epilogue = p.ep;
          g.y = out.get<float>(), g.ld_y = p.N, g.h = out.get(), g.ld_h = p.N / 2, g.splits = splits;
          const double us = time_us([&](int) { cuda::gemm(g, e, ws, nullptr); });
          rows.push_back({std::string(p.op) + " (L2-hot) splits " + std::to_string(splits), T, us,
                          double(p.N) * p.K * 2, 2.0 * T * double(p.N) * p.K});
        }
      }
    }

    // The decode GEMV's shape: rows per warp x chunks in flight, T = 1, weights past L2.
    for (const Proj& p : {projs[0], projs[1], projs[3]}) {
      const size_t wbytes = size_t(p.N) * p.K * 2;
      const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / wbytes));
      std::vector<DeviceBuffer> w;
      for (int c = 0; c < copies; c++) {
        w.emplace_back(wbytes);
        fill_random(w.back(), 40 + c);
      }
      DeviceBuffer out(size_t(p.N) * 4);
      const int variants[][2] = {{2, 2}, {2, 4}, {2, 8}, {4, 2}, {4, 4}, {4, 8}, {8, 2}, {8, 4}};
      for (const auto& v : variants) {
        cuda::GemmArgs g;
        g.x = x.get(), g.ld_x = p.K, g.T = 1, g.N = p.N, g.K = p.K, g.ld_w = p.K, g.y = out.get<float>(), g.ld_y = p.N;
        g.epilogue = p.ep == cuda::Epilogue::kGatedMul ? cuda::Epilogue::kStore : p.ep;
        const double us = time_us([&](int i) {
          g.w = w[size_t(i % copies)].get();
          cuda::gemv_variant(g, v[0], v[1], nullptr);
        });
        rows.push_back({std::string(p.op) + " gemv rows " + std::to_string(v[0]) + " unroll " + std::to_string(v[1]), 1,
                        us, double(wbytes), 2.0 * double(p.N) * p.K});
      }
    }

    // Decode attention: T sequences of ctx positions each (544: a 512-token prompt and 32
    // outputs; 1k-32k for issue 32's bandwidth target), K/V up to 8 GB.
    for (const int ctx : {544, 1024, 4096, 32768}) {
      const int bs = 16, blocks_per_seq = (ctx + bs - 1) / bs;
      for (int T : {1, 8, 64, 256}) {
        const size_t slots = size_t(T) * blocks_per_seq * bs;
        if (slots * s.nkv * s.hd * 2 * 2 > (size_t(8) << 30)) continue;
        DeviceBuffer kc(slots * s.nkv * s.hd * 2), vc(slots * s.nkv * s.hd * 2), q(size_t(T) * s.nq * s.hd * 4);
        fill_random(kc, 3);
        fill_random(vc, 4);
        std::vector<int32_t> tables(size_t(T) * blocks_per_seq), seq(static_cast<size_t>(T)), pos(size_t(T), ctx - 1);
        for (size_t i = 0; i < tables.size(); i++) tables[i] = int32_t(i);
        for (int t = 0; t < T; t++) seq[size_t(t)] = t;
        DeviceBuffer dt(tables.size() * 4), dseq(size_t(T) * 4), dpos(size_t(T) * 4), dstride(4), out(size_t(T) * s.nq * s.hd * 2);
        SLUICE_CUDA_CHECK(cudaMemcpy(dt.get(), tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
        SLUICE_CUDA_CHECK(cudaMemcpy(dseq.get(), seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
        SLUICE_CUDA_CHECK(cudaMemcpy(dpos.get(), pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
        SLUICE_CUDA_CHECK(cudaMemcpy(dstride.get(), &blocks_per_seq, 4, cudaMemcpyHostToDevice));
        for (int splits : {1, 4, 16}) {
          DeviceBuffer pacc(size_t(T) * s.nq * splits * s.hd * 4), pml(size_t(T) * s.nq * splits * 8);
          cuda::AttentionArgs a;
          a.q = q.get<float>(), a.T = T, a.nq = s.nq, a.nkv = s.nkv, a.hd = s.hd, a.token_seq = dseq.get<int32_t>();
          a.positions = dpos.get<int32_t>(), a.block_tables = dt.get<int32_t>(), a.table_stride = dstride.get<int32_t>();
          a.block_size = bs, a.k_cache = kc.get(), a.v_cache = vc.get(), a.scale = 0.1f, a.num_splits = splits;
          a.partial_acc = pacc.get<float>(), a.partial_ml = pml.get<float>(), a.out = out.get(), a.ld_out = s.nq * s.hd;
          const double us = time_us([&](int) { cuda::paged_attention(a, e, nullptr); });
          rows.push_back({"attention ctx " + std::to_string(ctx) + ", splits " + std::to_string(splits), T, us,
                          double(T) * ctx * s.nkv * s.hd * 2 * 2, 4.0 * T * ctx * s.nq * s.hd});
        }
        // Issue 32's tensor-core decode kernel at the split count it suggests (cuda_attention "flash").
        if (cuda::flash_decode_supported(s.hd, s.nq, s.nkv)) {
          const int splits = cuda::flash_decode_splits(T, s.nq, s.nkv, s.hd, ctx, sms, 16);
          DeviceBuffer pacc(size_t(T) * s.nq * splits * s.hd * 4), pml(size_t(T) * s.nq * splits * 8);
          cuda::AttentionArgs a;
          a.q = q.get<float>(), a.T = T, a.nq = s.nq, a.nkv = s.nkv, a.hd = s.hd, a.token_seq = dseq.get<int32_t>();
          a.positions = dpos.get<int32_t>(), a.block_tables = dt.get<int32_t>(), a.table_stride = dstride.get<int32_t>();
          a.block_size = bs, a.k_cache = kc.get(), a.v_cache = vc.get(), a.scale = 0.1f, a.num_splits = splits;
          a.partial_acc = pacc.get<float>(), a.partial_ml = pml.get<float>(), a.out = out.get(), a.ld_out = s.nq * s.hd;
          const double us = time_us([&](int) { cuda::flash_decode_attention(a, e, tickets.get<int>(), nullptr); });
          rows.push_back({"attention ctx " + std::to_string(ctx) + " (flash), splits " + std::to_string(splits), T, us,
                          double(T) * ctx * s.nkv * s.hd * 2 * 2, 4.0 * T * ctx * s.nq * s.hd});
        }
      }
    }

    // Prefill attention (issue 32): one sequence of T tokens attending causally to itself over the
    // paged cache, as one prefill chunk; FLOPs are the causal half of 4 T^2 nq hd. The peer is
    // bench/peer_torch_sdpa.py (torch's flash backend) on the same shapes. The paged kernel
    // re-reads K/V per query token: it is timed up to 8k tokens only.
    for (int T : {2048, 8192, 32768}) {
      const int bs = 16, blocks = (T + bs - 1) / bs;
      const size_t slots = size_t(blocks) * bs;
      DeviceBuffer kc(slots * s.nkv * s.hd * 2), vc(slots * s.nkv * s.hd * 2), q(size_t(T) * s.nq * s.hd * 4);
      fill_random(kc, 6);
      fill_random(vc, 7);
      std::vector<int32_t> table(static_cast<size_t>(blocks)), seq(size_t(T), 0), pos(static_cast<size_t>(T));
      for (int i = 0; i < blocks; i++) table[size_t(i)] = i;
      for (int t = 0; t < T; t++) pos[size_t(t)] = t;
      DeviceBuffer dt(table.size() * 4), dseq(size_t(T) * 4), dpos(size_t(T) * 4), dstride(4), out(size_t(T) * s.nq * s.hd * 2);
      SLUICE_CUDA_CHECK(cudaMemcpy(dt.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      SLUICE_CUDA_CHECK(cudaMemcpy(dseq.get(), seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
      SLUICE_CUDA_CHECK(cudaMemcpy(dpos.get(), pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      SLUICE_CUDA_CHECK(cudaMemcpy(dstride.get(), &blocks, 4, cudaMemcpyHostToDevice));
      cuda::AttentionArgs a;
      a.q = q.get<float>(), a.T = T, a.nq = s.nq, a.nkv = s.nkv, a.hd = s.hd, a.token_seq = dseq.get<int32_t>();
      a.positions = dpos.get<int32_t>(), a.block_tables = dt.get<int32_t>(), a.table_stride = dstride.get<int32_t>();
      a.block_size = bs, a.k_cache = kc.get(), a.v_cache = vc.get(), a.scale = 0.1f, a.num_splits = 1;
      a.out = out.get(), a.ld_out = s.nq * s.hd;
      const double flops = 2.0 * double(T) * T * s.nq * s.hd, bytes = double(T) * s.nkv * s.hd * 2 * 2;
      const int reps = T >= 8192 ? 2 : 10;
      if (T <= 8192) {
        const double us = time_us([&](int) { cuda::paged_attention(a, e, nullptr); }, reps);
        rows.push_back({"prefill attention (paged)", T, us, bytes, flops});
      }
      if (cuda::flash_prefill_supported(s.hd, s.nq, s.nkv)) {
        const double us = time_us([&](int) { cuda::flash_prefill_attention(a, e, nullptr); }, reps);
        rows.push_back({"prefill attention (flash)", T, us, bytes, flops});
      }
    }

    // Greedy sampling (argmax + log-sum-exp) and top-p sampling over the vocabulary.
    for (int R : {1, 64, 256}) {
      DeviceBuffer logits(size_t(R) * s.V * 4), params(size_t(R) * sizeof(cuda::SampleRowParams)), outb(size_t(R) * 8);
      DeviceBuffer stats(size_t(R) * cuda::kSampleStatsFloatsPerRow * 4);
      std::vector<float> h(size_t(R) * s.V);
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0.f, 3.f);
      for (auto& v : h) v = nd(rng);
      SLUICE_CUDA_CHECK(cudaMemcpy(logits.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
      for (int greedy : {1, 0}) {
        std::vector<cuda::SampleRowParams> p(size_t(R), {{greedy ? 0.f : 1.f, greedy ? 1.f : 0.9f, greedy ? 0 : 50, 0, 0}, 0.37});
        SLUICE_CUDA_CHECK(cudaMemcpy(params.get(), p.data(), p.size() * sizeof(p[0]), cudaMemcpyHostToDevice));
        cuda::SampleArgs a;
        a.logits = logits.get<float>(), a.R = R, a.V = s.V, a.params = params.get<cuda::SampleRowParams>();
        a.tokens = outb.get<int32_t>(), a.logprobs = outb.get<float>() + R, a.row_stats = stats.get<float>();
        const double us = time_us([&](int) { cuda::sample(a, nullptr); });
        rows.push_back({greedy ? "sample greedy" : "sample top-k 50, top-p 0.9", R, us, double(R) * s.V * 4, 0});
        // Issue 32's sampler, many blocks per row (cuda_sampler "wide"), on its own zeroed workspace.
        DeviceBuffer wide_ws(cuda::sample_wide_workspace_bytes(R, s.V));
        cuda::SampleArgs w = a;
        w.row_stats = wide_ws.get<float>();
        const double wide_us = time_us([&](int) { cuda::sample_wide(w, nullptr, nullptr); });
        const cuda::SampleWidePlan plan = cuda::sample_wide_plan(R, s.V);
        rows.push_back({std::string(greedy ? "sample greedy" : "sample top-k 50, top-p 0.9") + " [wide, " +
                            std::to_string(plan.blocks_per_row) + " blocks/row]",
                        R, wide_us, double(R) * s.V * 4, 0});
      }
    }

    std::printf("kernel timings, %s shapes, bf16 (median of 7 trials of 50 launches, weights rotated past L2)\n", s.name);
    std::printf("%-32s %6s %10s %10s %10s\n", "op", "T", "us", "GB/s", "TFLOP/s");
    for (const Row& r : rows)
      std::printf("%-32s %6d %10.1f %10.1f %10.1f\n", r.op.c_str(), r.T, r.us, r.bytes / r.us / 1e3, r.flops / r.us / 1e6);
    if (!json.empty()) {
      std::ofstream out(json);
      cudaDeviceProp prop{};
      SLUICE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));  // the result names the device it ran on
      out << "{\"shape\":\"" << s.name << "\",\"device\":\"" << prop.name << "\",\"rows\":[";
      for (size_t i = 0; i < rows.size(); i++)
        out << (i ? "," : "") << "{\"op\":\"" << rows[i].op << "\",\"T\":" << rows[i].T << ",\"us\":" << rows[i].us
            << ",\"bytes\":" << rows[i].bytes << ",\"flops\":" << rows[i].flops << "}";
      out << "]}\n";
    }
  } catch (const Error& err) {
    std::fprintf(stderr, "error: %s\n", err.what());
    return 1;
  }
  return 0;
}
