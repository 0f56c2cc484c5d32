// The CPU backend: the decoder (engine/decoder.h) over CPU kernels and a paged KV cache, for
// every family of the architecture table: dense and mixture-of-experts MLPs, sandwich norms,
// sliding windows and local rope bases are operations here, chosen by the config.
#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "engine/backend.h"
#include "engine/decoder.h"
#include "lora/lora_adapter.h"
#include "sample/sampler.h"
#include "sluice/error.h"

namespace sluice {

namespace {

class CpuBackend final : public Backend, private DecoderOps {
 public:
  CpuBackend(const ModelConfig& c, const ModelWeights& w, int num_threads, bool bf16_activations, bool fp8_kv)
      : c_(c),
        w_(w),
        pool_(num_threads),
        inv_freq_(c.rope_inv_freq()),
        local_inv_freq_(c.rope_local_inv_freq()),
        precision_(bf16_activations ? cpu::MatmulPrecision::BF16 : cpu::MatmulPrecision::F32),
        // Precision bf16 also keeps K/V in bf16 (as vLLM does for bf16 models): half the bytes
        // that attention reads. Precision f32 keeps them in f32; --kv-cache-dtype fp8 in e4m3.
        kv_dtype_(fp8_kv ? DType::F8E4M3 : bf16_activations ? DType::BF16 : DType::F32) {}

  ~CpuBackend() override {
    if (kv_mem_) ::munmap(kv_mem_, kv_bytes_);
  }

  std::string name() const override { return "cpu"; }
  std::string kernel_info() const override { return cpu::simd_level_name(); }
  int num_threads() const override { return pool_.size(); }
  DType kv_dtype() const override { return kv_dtype_; }

  // Sliding-window layers (Gemma 3, gpt-oss) keep their KV in window blocks of their own.
  int64_t num_window_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < c_.num_layers; l++) n += c_.window(l) > 0;
    return n;
  }
  size_t layer_block_bytes(int64_t block_size) const {
    return 2 * size_t(block_size) * size_t(c_.num_kv_heads * c_.head_dim) * dtype_size(kv_dtype_);
  }
  size_t kv_bytes_per_block(int64_t block_size) const override {
    return size_t(c_.num_layers - num_window_layers()) * layer_block_bytes(block_size);
  }
  size_t kv_bytes_per_window_block(int64_t block_size) const override {
    return size_t(num_window_layers()) * layer_block_bytes(block_size);
  }

  void allocate_kv(int64_t num_blocks, int64_t num_window_blocks, int64_t block_size) override {
    const size_t full = kv_bytes_per_block(block_size) * size_t(num_blocks);
    kv_bytes_ = full + kv_bytes_per_window_block(block_size) * size_t(num_window_blocks);
    // Anonymous mapping: pages are committed when first written, so RSS tracks KV actually used.
    void* p = ::mmap(nullptr, kv_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(ErrorCode::kOutOfMemory, "cannot reserve " + std::to_string(kv_bytes_) + " bytes for the KV cache");
    kv_mem_ = p;
    // Per layer [blocks, block_size, n_kv_heads, head_dim] elements, k then v: the full-attention
    // layers' in the first region, the window layers' (over the window blocks) after it.
    const size_t row = size_t(block_size) * size_t(c_.num_kv_heads * c_.head_dim) * dtype_size(kv_dtype_);
    uint8_t* full_base = static_cast<uint8_t*>(p);
    uint8_t* window_base = full_base + full;
    layers_kv_.resize(size_t(c_.num_layers));
    for (int64_t l = 0; l < c_.num_layers; l++) {
      const bool windowed = c_.window(l) > 0;
      const size_t per_layer = row * size_t(windowed ? num_window_blocks : num_blocks);
      uint8_t*& base = windowed ? window_base : full_base;
      cpu::PagedKV& kv = layers_kv_[size_t(l)];
      kv.k = base;
      kv.v = base + per_layer;
      base += 2 * per_layer;
      kv.dtype = kv_dtype_;
      kv.k_scale = w_.layers[size_t(l)].k_scale;
      kv.v_scale = w_.layers[size_t(l)].v_scale;
      kv.block_size = block_size;
      kv.n_kv_heads = c_.num_kv_heads;
      kv.head_dim = c_.head_dim;
    }
  }

  size_t kv_budget_bytes(size_t requested) const override { return requested ? requested : size_t(1) << 30; }

  void forward(const ForwardBatch& b) override;
  void sample(const SampleRow* rows, int64_t R, const SampleOutput& out) override;
  bool verifies_drafts() const override { return true; }
  bool capture_hidden(const std::vector<int64_t>& layers) override {
    capture_layers_ = layers;
    return true;
  }
  const float* captured_hidden() const override { return captured_.data(); }
  cpu::ThreadPool* cpu_threads() override { return &pool_; }
  bool applies_lora() const override { return true; }
  void read_logits(float* out) override { std::memcpy(out, logits_.data(), logits_.size() * sizeof(float)); }

 private:
  void ensure_scratch(int64_t T);
  void layer_input(int64_t layer) override;
  // LoRA (ForwardBatch::seq_adapters): the step's rows grouped by adapter, and
  // y[rows of each group, 0:out] += B (A x[rows, 0:in]) for its pair of `target` in `layer`.
  struct LoraGroup {
    const LoraAdapter* adapter;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) token rows
    int64_t rows = 0;
  };
  std::vector<LoraGroup> lora_groups_;
  std::vector<float> lora_x_, lora_t_, lora_u_;
  void group_lora_rows();
  void add_lora(int64_t layer, LoraTarget target, const float* x, int64_t in, float* y, int64_t out);
  std::vector<int64_t> capture_layers_;  // EAGLE-3: layers whose input forward() keeps
  std::vector<float> captured_;          // [T, capture_layers_.size() * H]

  // DecoderOps over batch_ (engine/decoder.h).
  void embed() override;
  void norm(int64_t layer, LayerNorm which) override;
  void qkv(int64_t layer) override;
  void rope_kv_write(int64_t layer) override;
  void attention(int64_t layer) override;
  void attention_out(int64_t layer, BlockOut out) override;
  void mlp(int64_t layer, BlockOut out) override;
  void experts(int64_t layer, BlockOut out) override;
  void add_normed(int64_t layer, LayerNorm which) override;
  void logits() override;
  const TensorView& norm_weight(int64_t layer, LayerNorm which) const;
  // The block's [T, H] output: added into x, or kept in y for a sandwich norm.
  void block_output(const float* v, BlockOut out);
  // gate[rows, D] = act(gate) * up, the family's activation.
  void gated_activation(float* gate, const float* up, int64_t rows, int64_t D);
  // Routes each token to its experts: route_expert_/route_weight_ [T, k], best first.
  void route(int64_t layer);
  using LinearOut = cpu::LinearOut;
  static cpu::LinearOut out(const TensorView& w, const TensorView& bias, float* y) {
    return {w.data, w.dtype, w.shape[0], bias.data, bias.dtype, y};
  }
  void linear(const float* x, int64_t T, const TensorView& w, const TensorView& bias, float* y) {
    cpu::matmul(pool_, x, T, w.shape[1], w.data, w.dtype, w.shape[0], bias.data, bias.dtype, y, precision_);
  }

  const ModelConfig c_;
  const ModelWeights& w_;
  cpu::ThreadPool pool_;
  std::vector<float> inv_freq_;
  std::vector<float> local_inv_freq_;  // Gemma 3's local layers
  cpu::MatmulPrecision precision_;
  DType kv_dtype_;
  void* kv_mem_ = nullptr;
  size_t kv_bytes_ = 0;
  std::vector<cpu::PagedKV> layers_kv_;

  // Activations for up to scratch_tokens_ tokens.
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_, xn_, y_, q_, k_, v_, attn_, gate_, up_;  // [T, hidden] / [T, heads*hd] / [T, inter]
  std::vector<float> last_;  // [R, hidden]
  const ForwardBatch* batch_ = nullptr;  // the forward() in progress
  int64_t T_ = 0;

  // Mixture of experts, for up to scratch_tokens_ tokens x experts_per_token routes.
  std::vector<float> router_logits_;          // [T, experts]
  std::vector<int32_t> route_expert_;         // [T, k]
  std::vector<float> route_weight_;           // [T, k]
  std::vector<int32_t> route_row_;            // [T, k] the route's row in the expert-grouped buffers
  std::vector<int64_t> expert_begin_;         // [experts + 1] first grouped row of each expert
  std::vector<int64_t> expert_fill_;          // [experts] scratch of the grouping
  std::vector<float> moe_x_, moe_gate_, moe_up_, moe_out_;  // grouped rows: [T*k, H] / [T*k, moe_inter] / [T*k, H]
  std::vector<LinearOut> moe_outs_;
  std::vector<cpu::MatmulGroup> moe_groups_;

  // Logits of the last forward() and sampling scratch.
  std::vector<float> logits_;        // [R, vocab]
  std::vector<int32_t> row_argmax_;  // [R]
  std::vector<float> row_lse_;       // [R]
  std::vector<uint8_t> row_allows_any_;  // [R] a token mask left some token allowed
  std::vector<const uint32_t*> row_allow_;  // [R] the row's token mask, or null
  struct RowFailure {
    bool failed = false;
    ErrorCode code = ErrorCode::kInternal;
    std::string message;
  };
  std::vector<RowFailure> row_failure_;  // [R]
  struct SampleScratch {
    std::vector<float> probs;
    std::vector<int32_t> order;
  };
  std::vector<SampleScratch> sample_scratch_;  // [pool threads]
};

void CpuBackend::ensure_scratch(int64_t T) {
  if (T <= scratch_tokens_) return;
  scratch_tokens_ = T;
  const size_t t = size_t(T);
  x_.resize(t * size_t(c_.hidden_size));
  xn_.resize(t * size_t(c_.hidden_size));
  q_.resize(t * size_t(c_.num_heads * c_.head_dim));
  k_.resize(t * size_t(c_.num_kv_heads * c_.head_dim));
  v_.resize(t * size_t(c_.num_kv_heads * c_.head_dim));
  attn_.resize(t * size_t(c_.num_heads * c_.head_dim));
  gate_.resize(t * size_t(c_.intermediate_size));
  up_.resize(t * size_t(c_.intermediate_size));
  if (c_.sandwich_norms) y_.resize(t * size_t(c_.hidden_size));
  if (c_.num_experts > 0) {
    const size_t routes = t * size_t(c_.experts_per_token);
    router_logits_.resize(t * size_t(c_.num_experts));
    route_expert_.resize(routes);
    route_weight_.resize(routes);
    route_row_.resize(routes);
    moe_x_.resize(routes * size_t(c_.hidden_size));
    moe_gate_.resize(routes * size_t(c_.moe_intermediate_size));
    moe_up_.resize(routes * size_t(c_.moe_intermediate_size));
    moe_out_.resize(routes * size_t(c_.hidden_size));
  }
}

void CpuBackend::layer_input(int64_t layer) {
  const int64_t H = c_.hidden_size, n = int64_t(capture_layers_.size());
  for (int64_t j = 0; j < n; j++) {
    if (capture_layers_[size_t(j)] != layer) continue;
    for (int64_t t = 0; t < T_; t++)
      std::memcpy(captured_.data() + (t * n + j) * H, x_.data() + t * H, size_t(H) * sizeof(float));
  }
}

void CpuBackend::group_lora_rows() {
  lora_groups_.clear();
  if (!batch_->seq_adapters) return;
  // A sequence's tokens are contiguous: one range per sequence, grouped by adapter.
  const int64_t T = batch_->num_tokens;
  for (int64_t t = 0; t < T;) {
    const int32_t seq = batch_->token_seq[t];
    int64_t end = t + 1;
    while (end < T && batch_->token_seq[end] == seq) end++;
    if (const LoraAdapter* a = batch_->seq_adapters[seq]) {
      auto g = std::find_if(lora_groups_.begin(), lora_groups_.end(), [&](const LoraGroup& x) { return x.adapter == a; });
      if (g == lora_groups_.end()) g = lora_groups_.insert(lora_groups_.end(), LoraGroup{a, {}, 0});
      g->ranges.emplace_back(t, end);
      g->rows += end - t;
    }
    t = end;
  }
}

void CpuBackend::add_lora(int64_t layer, LoraTarget target, const float* x, int64_t in, float* y, int64_t out) {
  for (const LoraGroup& g : lora_groups_) {
    const LoraPair& p = g.adapter->pair(layer, target);
    if (!p.present()) continue;
    const int64_t n = g.rows, r = g.adapter->rank();
    lora_x_.resize(size_t(n * in));
    lora_t_.resize(size_t(n * r));
    lora_u_.resize(size_t(n * out));
    int64_t at = 0;
    for (auto [b, e] : g.ranges) {
      std::memcpy(lora_x_.data() + at * in, x + b * in, size_t((e - b) * in) * sizeof(float));
      at += e - b;
    }
    cpu::matmul(pool_, lora_x_.data(), n, in, p.a.data(), DType::F32, r, nullptr, DType::F32, lora_t_.data());
    cpu::matmul(pool_, lora_t_.data(), n, r, p.b.data(), DType::F32, out, nullptr, DType::F32, lora_u_.data());
    at = 0;
    for (auto [b, e] : g.ranges) {
      cpu::add_inplace(pool_, y + b * out, lora_u_.data() + at * out, (e - b) * out);
      at += e - b;
    }
  }
}

void CpuBackend::forward(const ForwardBatch& b) {
  ensure_scratch(b.num_tokens);
  if (!capture_layers_.empty()) captured_.resize(size_t(b.num_tokens) * capture_layers_.size() * size_t(c_.hidden_size));
  batch_ = &b;
  T_ = b.num_tokens;
  group_lora_rows();
  run_decoder(c_, *this);
  batch_ = nullptr;
}

void CpuBackend::embed() {
  const int64_t H = c_.hidden_size;
  cpu::embedding(pool_, batch_->token_ids, T_, w_.embed.data, w_.embed.dtype, H, x_.data());
  if (c_.embed_scale != 1.0) {
    const float scale = float(c_.embed_scale);
    float* x = x_.data();
    pool_.parallel_for(T_ * H, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) x[i] *= scale;
    });
  }
  for (int64_t i = 0; i < batch_->num_input_embeds; i++)
    std::memcpy(x_.data() + int64_t(batch_->input_embed_rows[i]) * H, batch_->input_embeds[i], size_t(H) * sizeof(float));
}

const TensorView& CpuBackend::norm_weight(int64_t layer, LayerNorm which) const {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  switch (which) {
    case LayerNorm::kAttnIn: return lw.input_norm;
    case LayerNorm::kAttnOut: return lw.attn_out_norm;
    case LayerNorm::kMlpIn: return lw.post_norm;
    case LayerNorm::kMlpOut: return lw.mlp_out_norm;
  }
  return lw.input_norm;
}

void CpuBackend::norm(int64_t layer, LayerNorm which) {
  const TensorView& w = norm_weight(layer, which);
  cpu::rmsnorm(pool_, x_.data(), T_, c_.hidden_size, w.data, w.dtype, float(c_.rms_norm_eps), xn_.data());
}

void CpuBackend::add_normed(int64_t layer, LayerNorm which) {
  const TensorView& w = norm_weight(layer, which);
  cpu::rmsnorm(pool_, y_.data(), T_, c_.hidden_size, w.data, w.dtype, float(c_.rms_norm_eps), y_.data());
  cpu::add_inplace(pool_, x_.data(), y_.data(), T_ * c_.hidden_size);
}

void CpuBackend::block_output(const float* v, BlockOut out) {
  const int64_t n = T_ * c_.hidden_size;
  if (out == BlockOut::kAddToResidual) cpu::add_inplace(pool_, x_.data(), v, n);
  else if (v != y_.data()) std::memcpy(y_.data(), v, size_t(n) * sizeof(float));
}

void CpuBackend::qkv(int64_t layer) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  const cpu::LinearOut qkv[3] = {out(lw.q, lw.q_bias, q_.data()),   // [T, nq*hd]
                                 out(lw.k, lw.k_bias, k_.data()),   // [T, nkv*hd]
                                 out(lw.v, lw.v_bias, v_.data())};  // [T, nkv*hd]
  cpu::matmul_multi(pool_, xn_.data(), T_, c_.hidden_size, qkv, 3, precision_);
  if (!lora_groups_.empty()) {
    const int64_t H = c_.hidden_size, q = c_.num_heads * c_.head_dim, kv = c_.num_kv_heads * c_.head_dim;
    add_lora(layer, LoraTarget::kQ, xn_.data(), H, q_.data(), q);
    add_lora(layer, LoraTarget::kK, xn_.data(), H, k_.data(), kv);
    add_lora(layer, LoraTarget::kV, xn_.data(), H, v_.data(), kv);
  }
}

void CpuBackend::rope_kv_write(int64_t layer) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  const int64_t hd = c_.head_dim, nq = c_.num_heads, nkv = c_.num_kv_heads;
  const float eps = float(c_.rms_norm_eps);
  if (c_.qk_norm) {  // per-head RMSNorm: view q as [T*nq, hd]
    cpu::rmsnorm(pool_, q_.data(), T_ * nq, hd, lw.q_norm.data, lw.q_norm.dtype, eps, q_.data());
    cpu::rmsnorm(pool_, k_.data(), T_ * nkv, hd, lw.k_norm.data, lw.k_norm.dtype, eps, k_.data());
  }
  const float* inv_freq = c_.local_rope(layer) ? local_inv_freq_.data() : inv_freq_.data();
  const int32_t* mrope = c_.mrope() ? batch_->rope_positions : nullptr;
  cpu::rope(pool_, q_.data(), T_, nq, hd, c_.rotary_dim(), inv_freq, batch_->positions, mrope, c_.mrope_section.data());
  cpu::rope(pool_, k_.data(), T_, nkv, hd, c_.rotary_dim(), inv_freq, batch_->positions, mrope, c_.mrope_section.data());
  const bool windowed = c_.window(layer) > 0;
  cpu::kv_write(pool_, layers_kv_[size_t(layer)], k_.data(), v_.data(), windowed ? batch_->window_slots : batch_->slots, T_);
}

void CpuBackend::attention(int64_t layer) {
  cpu::AttentionBatch ab;
  ab.token_seq = batch_->token_seq;
  ab.token_pos = batch_->positions;
  ab.token_last = batch_->attn_last;
  ab.block_tables = c_.window(layer) > 0 ? batch_->window_block_tables : batch_->block_tables;
  ab.n_heads = c_.num_heads;
  ab.scale = float(c_.softmax_scale());
  ab.window = c_.window(layer);
  if (c_.attention_sinks) ab.sinks = static_cast<const float*>(w_.layers[size_t(layer)].sinks.data);
  cpu::paged_attention(pool_, q_.data(), T_, ab, layers_kv_[size_t(layer)], attn_.data());  // [T, nq*hd]
}

void CpuBackend::attention_out(int64_t layer, BlockOut dest) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  float* y = dest == BlockOut::kToY ? y_.data() : xn_.data();
  linear(attn_.data(), T_, lw.o, lw.o_bias, y);  // [T, H]
  if (!lora_groups_.empty()) add_lora(layer, LoraTarget::kO, attn_.data(), c_.num_heads * c_.head_dim, y, c_.hidden_size);
  block_output(y, dest);
}

void CpuBackend::mlp(int64_t layer, BlockOut dest) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  const int64_t I = c_.intermediate_size;
  const cpu::LinearOut gate_up[2] = {out(lw.gate, lw.gate_bias, gate_.data()),  // [T, I]
                                     out(lw.up, lw.up_bias, up_.data())};       // [T, I]
  cpu::matmul_multi(pool_, xn_.data(), T_, c_.hidden_size, gate_up, 2, precision_);
  if (!lora_groups_.empty()) {
    add_lora(layer, LoraTarget::kGate, xn_.data(), c_.hidden_size, gate_.data(), I);
    add_lora(layer, LoraTarget::kUp, xn_.data(), c_.hidden_size, up_.data(), I);
  }
  gated_activation(gate_.data(), up_.data(), T_, I);
  float* y = dest == BlockOut::kToY ? y_.data() : xn_.data();
  linear(gate_.data(), T_, lw.down, lw.down_bias, y);  // [T, H]
  if (!lora_groups_.empty()) add_lora(layer, LoraTarget::kDown, gate_.data(), I, y, c_.hidden_size);
  block_output(y, dest);
}

void CpuBackend::gated_activation(float* gate, const float* up, int64_t rows, int64_t D) {
  switch (c_.activation) {
    case Activation::Silu: cpu::silu_mul_split(pool_, gate, up, rows, D, gate); break;
    case Activation::GeluTanh: cpu::gelu_tanh_mul_split(pool_, gate, up, rows, D, gate); break;
    case Activation::SwigluClamped:
      cpu::swiglu_clamped_mul_split(pool_, gate, up, rows, D, float(c_.swiglu_limit), gate);
      break;
  }
}

void CpuBackend::route(int64_t layer) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  const int64_t E = c_.num_experts, K = c_.experts_per_token;
  cpu::matmul(pool_, xn_.data(), T_, c_.hidden_size, lw.router.data, lw.router.dtype, E, lw.router_bias.data,
              lw.router_bias.dtype, router_logits_.data(), precision_);
  const bool softmax_first = c_.routing == Routing::SoftmaxTopK;
  // Per token, in a fixed order: the k best experts (the lower index first on ties) by softmax
  // over every expert (renormalised when the family says so), or by logit with a softmax over
  // the k chosen (gpt-oss).
  pool_.parallel_for(T_, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) {
      float* p = router_logits_.data() + t * E;
      if (softmax_first) {
        float mx = -INFINITY;
        for (int64_t i = 0; i < E; i++) mx = std::max(mx, p[i]);
        double sum = 0;
        for (int64_t i = 0; i < E; i++) sum += p[i] = std::exp(p[i] - mx);
        for (int64_t i = 0; i < E; i++) p[i] = float(p[i] / sum);
      }
      int32_t* ex = route_expert_.data() + t * K;
      float* wt = route_weight_.data() + t * K;
      float chosen = 0;
      for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t i = 0; i < E; i++) {
          bool taken = false;
          for (int64_t j = 0; j < k; j++) taken |= ex[j] == i;
          if (!taken && (best < 0 || p[i] > p[best])) best = i;
        }
        ex[k] = int32_t(best);
        wt[k] = p[best];
        chosen += p[best];
      }
      if (!softmax_first) {  // wt holds the k logits, best first
        const float top = wt[0];
        double sum = 0;
        for (int64_t k = 0; k < K; k++) sum += wt[k] = std::exp(wt[k] - top);
        for (int64_t k = 0; k < K; k++) wt[k] = float(wt[k] / sum);
      } else if (c_.norm_topk_prob) {
        for (int64_t k = 0; k < K; k++) wt[k] /= chosen;
      }
    }
  });
}

// Tokens grouped by expert: every expert the step's tokens chose runs once over the rows routed
// to it, all experts' gate/up projections in one parallel region and their down projections in
// another, so each expert's weights are read once per step. A token's result depends only on
// its own rows (the kernels are batch invariant) and sums its experts in rank order.
void CpuBackend::experts(int64_t layer, BlockOut dest) {
  const LayerWeights& lw = w_.layers[size_t(layer)];
  const int64_t E = c_.num_experts, K = c_.experts_per_token, H = c_.hidden_size, MI = c_.moe_intermediate_size;
  const int64_t routes = T_ * K;
  route(layer);
  expert_begin_.assign(size_t(E + 1), 0);
  for (int64_t r = 0; r < routes; r++) expert_begin_[size_t(route_expert_[size_t(r)]) + 1]++;
  for (int64_t e = 0; e < E; e++) expert_begin_[size_t(e + 1)] += expert_begin_[size_t(e)];
  expert_fill_.assign(expert_begin_.begin(), expert_begin_.end() - 1);  // the next free row of each expert
  for (int64_t r = 0; r < routes; r++) route_row_[size_t(r)] = int32_t(expert_fill_[size_t(route_expert_[size_t(r)])]++);
  pool_.parallel_for(routes, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++)
      std::memcpy(moe_x_.data() + int64_t(route_row_[size_t(r)]) * H, xn_.data() + (r / K) * H, size_t(H) * sizeof(float));
  });

  moe_outs_.clear();
  moe_groups_.clear();
  moe_outs_.reserve(size_t(2 * E));
  for (int64_t e = 0; e < E; e++) {
    const int64_t begin = expert_begin_[size_t(e)], n = expert_begin_[size_t(e + 1)] - begin;
    if (n == 0) continue;
    const ExpertWeights& ew = lw.experts[size_t(e)];
    moe_outs_.push_back(out(ew.gate, ew.gate_bias, moe_gate_.data() + begin * MI));
    moe_outs_.push_back(out(ew.up, ew.up_bias, moe_up_.data() + begin * MI));
    moe_groups_.push_back({moe_x_.data() + begin * H, n, H, &moe_outs_[moe_outs_.size() - 2], 2});
  }
  cpu::matmul_groups(pool_, moe_groups_.data(), int(moe_groups_.size()), precision_);
  gated_activation(moe_gate_.data(), moe_up_.data(), routes, MI);

  moe_outs_.clear();
  moe_groups_.clear();
  for (int64_t e = 0; e < E; e++) {
    const int64_t begin = expert_begin_[size_t(e)], n = expert_begin_[size_t(e + 1)] - begin;
    if (n == 0) continue;
    const ExpertWeights& ew = lw.experts[size_t(e)];
    moe_outs_.push_back(out(ew.down, ew.down_bias, moe_out_.data() + begin * H));
    moe_groups_.push_back({moe_gate_.data() + begin * MI, n, MI, &moe_outs_.back(), 1});
  }
  cpu::matmul_groups(pool_, moe_groups_.data(), int(moe_groups_.size()), precision_);

  float* y = dest == BlockOut::kToY ? y_.data() : xn_.data();
  pool_.parallel_for(T_, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) {
      float* yt = y + t * H;
      for (int64_t k = 0; k < K; k++) {
        const float w = route_weight_[size_t(t * K + k)];
        const float* o = moe_out_.data() + int64_t(route_row_[size_t(t * K + k)]) * H;
        if (k == 0) for (int64_t i = 0; i < H; i++) yt[i] = w * o[i];
        else for (int64_t i = 0; i < H; i++) yt[i] += w * o[i];
      }
    }
  });
  block_output(y, dest);
}

void CpuBackend::logits() {
  // Only the rows that sample need the final norm and the (large) vocabulary projection.
  const int64_t R = batch_->num_logit_rows, H = c_.hidden_size, V = c_.vocab_size;
  logits_.resize(size_t(R * V));
  if (R == 0) return;
  float* logits = logits_.data();
  last_.resize(size_t(R * H));
  for (int64_t r = 0; r < R; r++)
    std::memcpy(last_.data() + r * H, x_.data() + int64_t(batch_->logit_rows[r]) * H, size_t(H) * sizeof(float));
  cpu::rmsnorm(pool_, last_.data(), R, H, w_.final_norm.data, w_.final_norm.dtype, float(c_.rms_norm_eps), last_.data());
  cpu::matmul(pool_, last_.data(), R, H, w_.lm_head.data, w_.lm_head.dtype, V, nullptr, DType::F32, logits, precision_);
  if (c_.final_logit_softcap > 0) {
    const float cap = float(c_.final_logit_softcap);
    pool_.parallel_for(R * V, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) logits[i] = cap * std::tanh(logits[i] / cap);
    });
  }
}

void fail_row(const SampleOutput& out, int64_t r, ErrorCode code, const std::string& message) {
  out.tokens[r] = -1;
  out.logprobs[r] = 0.f;
  if (out.row_errors) out.row_errors->push_back({r, code, message});
}

void CpuBackend::sample(const SampleRow* rows, int64_t R, const SampleOutput& out) {
  const int64_t V = c_.vocab_size;
  if (int64_t(logits_.size()) != R * V) throw Error(ErrorCode::kInternal, "sample() rows differ from the last forward()");
  row_argmax_.resize(size_t(R));
  row_lse_.resize(size_t(R));
  row_allows_any_.resize(size_t(R));
  row_allow_.resize(size_t(R));
  for (int64_t r = 0; r < R; r++) row_allow_[size_t(r)] = rows[r].allow;
  cpu::apply_token_masks(pool_, logits_.data(), R, V, row_allow_.data(), row_allows_any_.data());
  cpu::logits_stats(pool_, logits_.data(), R, V, row_argmax_.data(), row_lse_.data());
  // Rows are sampled in parallel, each from its own seeded stream into its own outputs, so the
  // result is the same whatever the split; errors are gathered per row and reported in row order.
  const int threads = pool_.size();
  if (sample_scratch_.size() < size_t(threads)) sample_scratch_.resize(size_t(threads));
  row_failure_.assign(size_t(R), RowFailure{});
  std::atomic<int64_t> next_row{0};
  const auto sample_rows = [&](int index, int) {
    SampleScratch& scratch = sample_scratch_[size_t(index)];
    for (int64_t r = next_row.fetch_add(1); r < R; r = next_row.fetch_add(1)) {
      // One row's failure is that row's alone: it is reported and the next row is sampled.
      RowFailure& failure = row_failure_[size_t(r)];
      try {
        if (rows[r].inject_fault) throw Error(ErrorCode::kInternal, "injected sampler fault");
        if (!row_allows_any_[size_t(r)])
          throw Error(ErrorCode::kInvalidArgument, "the output grammar allows no token at this point");
        Rng rng(rows[r].stream_seed);
        SampledToken tok;
        if (rows[r].draft >= 0) {
          const DraftVerdict v = verify_draft_token(logits_.data() + r * V, V, row_argmax_[size_t(r)], row_lse_[size_t(r)],
                                                    rows[r].params, rng, rows[r].draft, out.top_n,
                                                    out.top_ids + r * out.top_n, out.top_logprobs + r * out.top_n,
                                                    scratch.probs, scratch.order);
          tok = v.token;
          if (out.accepted) out.accepted[r] = v.accepted ? 1 : 0;
        } else {
          tok = sample_token(logits_.data() + r * V, V, row_argmax_[size_t(r)], row_lse_[size_t(r)], rows[r].params, rng,
                             out.top_n, out.top_ids + r * out.top_n, out.top_logprobs + r * out.top_n, scratch.probs,
                             scratch.order);
        }
        out.tokens[r] = tok.token;
        out.logprobs[r] = tok.logprob;
      } catch (const Error& e) {
        failure = {true, e.code(), e.what()};
      } catch (const std::bad_alloc&) {
        failure = {true, ErrorCode::kOutOfMemory, "out of memory while sampling"};
      } catch (const std::exception& e) {
        failure = {true, ErrorCode::kInternal, e.what()};
      }
    }
  };
  // One row (batch-1 decode) is sampled on this thread: no parallel region to start and join.
  if (R == 1) sample_rows(0, 1);
  else pool_.run(sample_rows);
  for (int64_t r = 0; r < R; r++) {
    const RowFailure& f = row_failure_[size_t(r)];
    if (f.failed) fail_row(out, r, f.code, f.message);
  }
}

}  // namespace

std::unique_ptr<Backend> create_cpu_backend(const ModelConfig& config, const ModelWeights& weights, int num_threads,
                                           bool bf16_activations, bool fp8_kv) {
  return std::make_unique<CpuBackend>(config, weights, num_threads, bf16_activations, fp8_kv);
}

}  // namespace sluice
