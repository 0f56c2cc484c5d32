// The CPU backend: the Llama-family forward pass (Llama, Mistral, Qwen2, Qwen3 differ only in
// flags: q/k/v biases, q/k norms, rope scaling) over CPU kernels and a paged KV cache.
#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "engine/backend.h"
#include "sample/sampler.h"
#include "sluice/error.h"

namespace sluice {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& c, const ModelWeights& w, int num_threads, bool bf16_activations)
      : c_(c),
        w_(w),
        pool_(num_threads),
        inv_freq_(c.rope_inv_freq()),
        precision_(bf16_activations ? cpu::MatmulPrecision::BF16 : cpu::MatmulPrecision::F32),
        // Precision bf16 also keeps K/V in bf16 (as vLLM does for bf16 models): half the bytes
        // that attention reads. Precision f32 keeps them in f32.
        kv_dtype_(bf16_activations ? DType::BF16 : DType::F32) {}

  ~CpuBackend() override {
    if (kv_mem_) ::munmap(kv_mem_, kv_bytes_);
  }

  std::string name() const override { return "cpu"; }
  std::string kernel_info() const override { return cpu::simd_level_name(); }
  int num_threads() const override { return pool_.size(); }

  size_t kv_bytes_per_block(int64_t block_size) const override {
    return size_t(c_.num_layers) * 2 * size_t(block_size) * size_t(c_.num_kv_heads * c_.head_dim) * dtype_size(kv_dtype_);
  }

  void allocate_kv(int64_t num_blocks, int64_t block_size) override {
    kv_bytes_ = kv_bytes_per_block(block_size) * size_t(num_blocks);
    // Anonymous mapping: pages are committed when first written, so RSS tracks KV actually used.
    void* p = ::mmap(nullptr, kv_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(ErrorCode::kOutOfMemory, "cannot reserve " + std::to_string(kv_bytes_) + " bytes for the KV cache");
    kv_mem_ = p;
    // [num_blocks, block_size, n_kv_heads, head_dim] elements per layer, k then v.
    const size_t per_layer = size_t(num_blocks) * size_t(block_size) * size_t(c_.num_kv_heads * c_.head_dim) *
                             dtype_size(kv_dtype_);
    uint8_t* base = static_cast<uint8_t*>(p);
    layers_kv_.resize(size_t(c_.num_layers));
    for (int64_t l = 0; l < c_.num_layers; l++) {
      cpu::PagedKV& kv = layers_kv_[size_t(l)];
      kv.k = base + size_t(2 * l) * per_layer;
      kv.v = base + size_t(2 * l + 1) * per_layer;
      kv.dtype = kv_dtype_;
      kv.block_size = block_size;
      kv.n_kv_heads = c_.num_kv_heads;
      kv.head_dim = c_.head_dim;
    }
  }

  size_t kv_budget_bytes(size_t requested) const override { return requested ? requested : size_t(1) << 30; }

  void forward(const ForwardBatch& b) override;
  void sample(const SampleRow* rows, int64_t R, const SampleOutput& out) override;
  void read_logits(float* out) override { std::memcpy(out, logits_.data(), logits_.size() * sizeof(float)); }

 private:
  void ensure_scratch(int64_t T);
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
  cpu::MatmulPrecision precision_;
  DType kv_dtype_;
  void* kv_mem_ = nullptr;
  size_t kv_bytes_ = 0;
  std::vector<cpu::PagedKV> layers_kv_;

  // Activations for up to scratch_tokens_ tokens.
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_;  // [T, hidden] / [T, heads*hd] / [T, inter]
  std::vector<float> last_;  // [R, hidden]

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
}

void CpuBackend::forward(const ForwardBatch& b) {
  const int64_t T = b.num_tokens, H = c_.hidden_size, I = c_.intermediate_size, hd = c_.head_dim;
  const int64_t nq = c_.num_heads, nkv = c_.num_kv_heads;
  ensure_scratch(T);
  float* x = x_.data();    // [T, H] residual stream
  float* xn = xn_.data();  // [T, H] normed
  const float eps = float(c_.rms_norm_eps);

  cpu::embedding(pool_, b.token_ids, T, w_.embed.data, w_.embed.dtype, H, x);

  cpu::AttentionBatch ab;
  ab.token_seq = b.token_seq;
  ab.token_pos = b.positions;
  ab.block_tables = b.block_tables;
  ab.n_heads = nq;
  ab.scale = float(1.0 / std::sqrt(double(hd)));

  for (int64_t l = 0; l < c_.num_layers; l++) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    cpu::rmsnorm(pool_, x, T, H, lw.input_norm.data, lw.input_norm.dtype, eps, xn);
    {
      const cpu::LinearOut qkv[3] = {out(lw.q, lw.q_bias, q_.data()),   // [T, nq*hd]
                                     out(lw.k, lw.k_bias, k_.data()),   // [T, nkv*hd]
                                     out(lw.v, lw.v_bias, v_.data())};  // [T, nkv*hd]
      cpu::matmul_multi(pool_, xn, T, H, qkv, 3, precision_);
    }
    if (c_.qk_norm) {  // per-head RMSNorm: view q as [T*nq, hd]
      cpu::rmsnorm(pool_, q_.data(), T * nq, hd, lw.q_norm.data, lw.q_norm.dtype, eps, q_.data());
      cpu::rmsnorm(pool_, k_.data(), T * nkv, hd, lw.k_norm.data, lw.k_norm.dtype, eps, k_.data());
    }
    cpu::rope(pool_, q_.data(), T, nq, hd, c_.rotary_dim(), inv_freq_.data(), b.positions);
    cpu::rope(pool_, k_.data(), T, nkv, hd, c_.rotary_dim(), inv_freq_.data(), b.positions);
    cpu::kv_write(pool_, layers_kv_[size_t(l)], k_.data(), v_.data(), b.slots, T);
    cpu::paged_attention(pool_, q_.data(), T, ab, layers_kv_[size_t(l)], attn_.data());  // [T, nq*hd]
    linear(attn_.data(), T, lw.o, lw.o_bias, xn);  // [T, H]
    cpu::add_inplace(pool_, x, xn, T * H);

    cpu::rmsnorm(pool_, x, T, H, lw.post_norm.data, lw.post_norm.dtype, eps, xn);
    {
      const cpu::LinearOut gate_up[2] = {out(lw.gate, lw.gate_bias, gate_.data()),  // [T, I]
                                         out(lw.up, lw.up_bias, up_.data())};       // [T, I]
      cpu::matmul_multi(pool_, xn, T, H, gate_up, 2, precision_);
    }
    cpu::silu_mul_split(pool_, gate_.data(), up_.data(), T, I, gate_.data());
    linear(gate_.data(), T, lw.down, lw.down_bias, xn);  // [T, H]
    cpu::add_inplace(pool_, x, xn, T * H);
  }

  // Only the rows that sample need the final norm and the (large) vocabulary projection.
  const int64_t R = b.num_logit_rows;
  logits_.resize(size_t(R * c_.vocab_size));
  if (R == 0) return;
  float* logits = logits_.data();
  last_.resize(size_t(R * H));
  for (int64_t r = 0; r < R; r++)
    std::memcpy(last_.data() + r * H, x + int64_t(b.logit_rows[r]) * H, size_t(H) * sizeof(float));
  cpu::rmsnorm(pool_, last_.data(), R, H, w_.final_norm.data, w_.final_norm.dtype, eps, last_.data());
  cpu::matmul(pool_, last_.data(), R, H, w_.lm_head.data, w_.lm_head.dtype, c_.vocab_size, nullptr, DType::F32,
              logits, precision_);
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
        const SampledToken tok =
            sample_token(logits_.data() + r * V, V, row_argmax_[size_t(r)], row_lse_[size_t(r)], rows[r].params, rng,
                         out.top_n, out.top_ids + r * out.top_n, out.top_logprobs + r * out.top_n, scratch.probs,
                         scratch.order);
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
                                           bool bf16_activations) {
  return std::make_unique<CpuBackend>(config, weights, num_threads, bf16_activations);
}

}  // namespace sluice
