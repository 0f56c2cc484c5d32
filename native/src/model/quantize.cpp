#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "cpu/gemm_q4.h"
#include "cpu/gemm_q8.h"
#include "cpu/thread_pool.h"
#include "model/fp8.h"
#include "util/e4m3.h"
#include "util/host_memory.h"

namespace sluice {

void quantize_weights_q8(ModelWeights& w, int num_threads) {
  std::vector<TensorView*> targets;
  std::vector<const TensorView*> routers;
  for (const LayerWeights& l : w.layers)
    if (!l.experts.empty()) routers.push_back(&l.router);
  // Routers stay as stored: rounding their logits would change which experts a token picks. Q4
  // (AWQ / GPTQ) matrices stay 4-bit.
  for (TensorView* t : streamed_matrices(w))
    if (t->dtype != DType::Q8_0 && t->dtype != DType::Q4 && std::find(routers.begin(), routers.end(), t) == routers.end()) targets.push_back(t);
  if (targets.empty()) return;
  const bool tied = w.lm_head.data == w.embed.data;
  // One huge-page arena for every Q8_0 copy (host_memory.h), each copy 64-byte aligned.
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const TensorView* t : targets) {
    offsets.push_back(total);
    total += (cpu::q8_bytes(t->shape[0], t->shape[1]) + 63) / 64 * 64;
  }
  auto arena = std::make_shared<HostBuffer>(total);
  cpu::ThreadPool pool(num_threads);
  for (size_t i = 0; i < targets.size(); i++) {
    TensorView* t = targets[i];
    const int64_t N = t->shape[0], K = t->shape[1];
    void* dst = arena->data() + offsets[i];
    const TensorView src = *t;
    pool.parallel_for(N, 64, [&](int64_t b, int64_t e) { cpu::quantize_rows_q8(src.data, src.dtype, N, K, b, e, dst); });
    const size_t bytes = cpu::q8_bytes(N, K);
    // Tied: the embedding keeps its bytes (still counted once), the quantized lm_head adds its own.
    if (!(t == &w.lm_head && tied)) {
      w.total_bytes -= t->nbytes;
      release_mapped_pages(src.data, src.nbytes);  // (a tied lm_head's bytes are the embedding's: kept)
    }
    w.total_bytes += bytes;
    t->data = dst;
    t->dtype = DType::Q8_0;
    t->nbytes = bytes;
  }
  w.owned.push_back(std::move(arena));
  if (!w.layers.empty()) w.main_dtype = w.layers[0].q.dtype;
}

namespace {

// Row n of a float matrix [N, K] (f32, f16 or bf16) as f32.
void float_row(const TensorView& t, int64_t n, float* out) {
  const int64_t K = t.shape[1];
  switch (t.dtype) {
    case DType::F32: std::copy_n(static_cast<const float*>(t.data) + n * K, K, out); break;
    case DType::BF16:
      for (int64_t k = 0; k < K; k++) out[k] = bf16_to_f32(static_cast<const uint16_t*>(t.data)[n * K + k]);
      break;
    default:
      for (int64_t k = 0; k < K; k++) out[k] = f16_to_f32(static_cast<const uint16_t*>(t.data)[n * K + k]);
      break;
  }
}

// A bound float matrix (an unbound view has no data).
bool is_float(const TensorView& t) {
  return t.data && t.shape.size() == 2 && (t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16);
}

}  // namespace

void quantize_weights_fp8(ModelWeights& w, int num_threads) {
  std::vector<std::pair<TensorView*, TensorView*>> targets;  // (weight, its scale view)
  for (LayerWeights& l : w.layers) {
    LayerWeights::Fp8ScaleViews& s = l.fp8_scale;
    if (is_float(l.q) && is_float(l.k) && is_float(l.v) && is_float(l.o))
      targets.insert(targets.end(), {{&l.q, &s.q}, {&l.k, &s.k}, {&l.v, &s.v}, {&l.o, &s.o}});
    if (l.experts.empty() && is_float(l.gate) && is_float(l.up) && is_float(l.down))
      targets.insert(targets.end(), {{&l.gate, &s.gate}, {&l.up, &s.up}, {&l.down, &s.down}});
  }
  if (targets.empty()) return;
  cpu::ThreadPool pool(num_threads);
  for (auto [t, scale_view] : targets) {
    const int64_t N = t->shape[0], K = t->shape[1];
    auto codes = std::make_shared<HostBuffer>(size_t(N * K), false);
    auto scales = std::make_shared<HostBuffer>(size_t(N) * sizeof(float), false);
    uint8_t* q = reinterpret_cast<uint8_t*>(codes->data());
    float* sc = reinterpret_cast<float*>(scales->data());
    const TensorView src = *t;
    pool.parallel_for(N, 16, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t n = b; n < e; n++) {
        float_row(src, n, row.data());
        float amax = 0.f;
        for (float v : row) amax = std::max(amax, std::fabs(v));
        // The row's largest magnitude lands on 448, e4m3's largest finite value; an all-zero row
        // keeps scale 1 (its codes are 0 either way).
        const float scale = amax > 0.f && std::isfinite(amax) ? amax / 448.f : 1.f;
        sc[n] = scale;
        for (int64_t k = 0; k < K; k++) q[n * K + k] = f32_to_e4m3(row[size_t(k)] / scale);
      }
    });
    w.total_bytes += codes->size() + scales->size();
    w.total_bytes -= t->nbytes;
    t->data = q;
    t->dtype = DType::F8E4M3;
    t->nbytes = size_t(N * K);
    *scale_view = TensorView{};
    scale_view->name = t->name + "_scale";
    scale_view->file = "(quantized at load)";
    scale_view->data = sc;
    scale_view->dtype = DType::F32;
    scale_view->shape = {N, 1};
    scale_view->nbytes = size_t(N) * sizeof(float);
    w.owned.push_back(std::move(codes));
    w.owned.push_back(std::move(scales));
  }
  if (!w.layers.empty()) w.main_dtype = w.layers[0].q.dtype;
}

namespace {

// A Q4 matrix the CUDA kernels take (cuda/q4_gemm.h: groups a positive multiple of 32).
bool q4_for_gpu(const TensorView& t) {
  if (t.dtype != DType::Q4) return false;
  const int64_t group = static_cast<const cpu::Q4Header*>(t.data)->group;
  return group > 0 && group % 32 == 0;
}

bool all_q4_for_gpu(std::initializer_list<const TensorView*> ts) {
  return std::all_of(ts.begin(), ts.end(), [](const TensorView* t) { return q4_for_gpu(*t); });
}

}  // namespace

void dequantize_packed_weights(ModelWeights& w, int num_threads, bool keep_dense_q4) {
  // Kept as Q4: a layer's attention projections when all four are GPU-ready Q4, a dense layer's
  // MLP when gate, up and down all are (never experts).
  std::vector<const TensorView*> kept;
  if (keep_dense_q4) {
    for (const LayerWeights& l : w.layers) {
      if (all_q4_for_gpu({&l.q, &l.k, &l.v, &l.o})) kept.insert(kept.end(), {&l.q, &l.k, &l.v, &l.o});
      if (l.experts.empty() && all_q4_for_gpu({&l.gate, &l.up, &l.down})) kept.insert(kept.end(), {&l.gate, &l.up, &l.down});
    }
  }
  std::vector<TensorView*> targets;
  for (TensorView* t : streamed_matrices(w))
    if ((t->dtype == DType::Q4 || t->dtype == DType::Q8_0) && std::find(kept.begin(), kept.end(), t) == kept.end())
      targets.push_back(t);
  if (targets.empty()) return;
  cpu::ThreadPool pool(num_threads);
  for (TensorView* t : targets) {
    const int64_t N = t->shape[0], K = t->shape[1];
    auto buf = std::make_shared<HostBuffer>(size_t(N * K) * 2);
    uint16_t* out = reinterpret_cast<uint16_t*>(buf->data());
    const TensorView src = *t;
    pool.parallel_for(N, 16, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t n = b; n < e; n++) {
        if (src.dtype == DType::Q4) {
          cpu::q4_dequantize_row(src.data, n, row.data());
        } else {
          const int64_t Kp = cpu::q8_padded_k(K);
          const int8_t* q = cpu::q8_values(src.data) + n * Kp;
          const uint16_t* d = cpu::q8_scales(src.data, N, K) + n * (Kp / cpu::kQ8Block);
          for (int64_t k = 0; k < K; k++) row[size_t(k)] = float(q[k]) * f16_to_f32(d[k / cpu::kQ8Block]);
        }
        for (int64_t k = 0; k < K; k++) out[n * K + k] = f32_to_bf16(row[size_t(k)]);
      }
    });
    w.total_bytes += buf->size();
    w.total_bytes -= t->nbytes;
    t->data = out;
    t->dtype = DType::BF16;
    t->nbytes = size_t(N * K) * 2;
    w.owned.push_back(std::move(buf));
  }
  if (!w.layers.empty()) w.main_dtype = w.layers[0].q.dtype;
}

void dequantize_fp8_weights(ModelWeights& w, const QuantizationConfig& q, int num_threads, bool keep_fp8_groups) {
  std::vector<std::pair<TensorView*, TensorView*>> targets;  // (weight, its scale)
  const auto all_fp8 = [](std::initializer_list<const TensorView*> ts) {
    return std::all_of(ts.begin(), ts.end(), [](const TensorView* t) { return t->dtype == DType::F8E4M3; });
  };
  for (LayerWeights& l : w.layers) {
    LayerWeights::Fp8ScaleViews& s = l.fp8_scale;
    const bool keep_attn = keep_fp8_groups && all_fp8({&l.q, &l.k, &l.v, &l.o});
    const bool keep_mlp = keep_fp8_groups && l.experts.empty() && all_fp8({&l.gate, &l.up, &l.down});
    for (auto [t, scale] : {std::pair{&l.q, &s.q}, {&l.k, &s.k}, {&l.v, &s.v}, {&l.o, &s.o}})
      if (t->dtype == DType::F8E4M3 && !keep_attn) targets.emplace_back(t, scale);
    for (auto [t, scale] : {std::pair{&l.gate, &s.gate}, {&l.up, &s.up}, {&l.down, &s.down}})
      if (t->dtype == DType::F8E4M3 && !keep_mlp) targets.emplace_back(t, scale);
  }
  if (targets.empty()) return;
  cpu::ThreadPool pool(num_threads);
  for (auto [t, scale] : targets) {
    const TensorView out = dequantize_fp8(*t, *scale, q, w.owned, pool);
    w.total_bytes += out.nbytes;
    w.total_bytes -= t->nbytes + scale->nbytes;
    *t = out;
    *scale = TensorView{};
  }
  if (!w.layers.empty()) w.main_dtype = w.layers[0].q.dtype;
}

}  // namespace sluice
