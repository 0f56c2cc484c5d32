// The interface every compute backend implements (CPU and CUDA). The engine owns sequences,
// block tables and the sampling parameters; a backend owns weights on its device, the KV
// memory, the forward pass over one flattened batch, and the sampling of its logits (which stay
// on the backend's device: copying [R, vocab] logits to the host would cost more than the step).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_weights.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "sluice/model_config.h"

namespace sluice {
namespace cpu {
class ThreadPool;
}
class LoraAdapter;

// One step's tokens, flattened across sequences. Host pointers, valid during forward().
// Tokens of one sequence are contiguous and in position order.
struct ForwardBatch {
  int64_t num_tokens = 0;                   // T
  const int32_t* token_ids = nullptr;       // [T] (< 0: Backend::device_token_ref, pipelined steps only)
  const int32_t* positions = nullptr;       // [T] absolute position in its sequence
  const int32_t* token_seq = nullptr;       // [T] index into block_tables
  const int32_t* slots = nullptr;           // [T] KV slot = block_id * block_size + offset
  // Sliding-window layers (Backend::kv_bytes_per_window_block() > 0): their KV lives in blocks of
  // their own, which the engine frees once they fall out of every window. Entries of a table
  // before the window are -1 (never read). nullptr when the model has no such layers.
  const int32_t* window_slots = nullptr;              // [T]
  const int32_t* const* window_block_tables = nullptr;  // [S]
  int64_t num_seqs = 0;                     // S
  const int32_t* const* block_tables = nullptr;  // [S] -> block ids covering positions 0..max pos
  const int32_t* num_seq_blocks = nullptr;  // [S] length of each block table
  // M-RoPE models (ModelConfig::mrope()): [3T] each token's rope position, (time, height, width) at
  // 3t..3t+2; `positions` stays the token's place in its sequence (KV slot, causal order). Text
  // tokens have three equal components. nullptr for other models.
  const int32_t* rope_positions = nullptr;
  // Tokens whose input row is given instead of embed[token] (image placeholders): token
  // input_embed_rows[i] (ascending) takes the hidden_size floats at input_embeds[i], unscaled (no
  // embed_scale). Host memory, valid during forward().
  // Models whose image tokens attend in both directions (ModelConfig::image_attention_bidirectional):
  // [T] the last position each token attends to (an image's last token for its tokens, else its own
  // position); a sliding window still starts from `positions`. nullptr: causal.
  const int32_t* attn_last = nullptr;
  int64_t num_input_embeds = 0;
  const int32_t* input_embed_rows = nullptr;
  const float* const* input_embeds = nullptr;
  // LoRA adapters: [S] the adapter of each sequence (nullptr: the base model), or nullptr when no
  // sequence of the step has one. The backend adds each adapter's low-rank products to its rows.
  const LoraAdapter* const* seq_adapters = nullptr;
  int64_t num_logit_rows = 0;               // R
  const int32_t* logit_rows = nullptr;      // [R] indices into the T tokens whose logits are wanted
};

// How to sample one logit row of the last forward() (rows in ForwardBatch::logit_rows order).
struct SampleRow {
  SamplingParams params;     // temperature, top_p, top_k; params.logprobs = top-N wanted
  uint64_t stream_seed = 0;  // seeds this row's draw (Rng): same sequence seed and position, same draw
  bool inject_fault = false; // testing hook (FaultPoint::kSampleRow): this row's sampling fails
  // Structured outputs: [token_mask_words(V)] bits, token v allowed when bit v is set; logits of
  // the other tokens become -inf before sampling (so logprobs are those of the constrained
  // distribution). nullptr: unconstrained.
  const uint32_t* allow = nullptr;
  // Speculative decoding: >= 0, the proposed token this row verifies (verify_draft_token: kept
  // with its probability, else a token drawn without it; SampleOutput::accepted says which).
  // Only backends whose verifies_drafts() is true get such rows.
  int32_t draft = -1;
};

// A row whose sampling failed on its own; its token is -1 and the other rows are unaffected.
struct SampleRowError {
  int64_t row = 0;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Sampled tokens, [R] each, and the top-N alternatives, [R * top_n] (best first; id -1 and
// logprob -inf past the vocabulary). Logprobs are the log-softmax of the raw logits.
struct SampleOutput {
  int32_t* tokens = nullptr;
  float* logprobs = nullptr;
  int top_n = 0;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
  std::vector<SampleRowError>* row_errors = nullptr;  // appended to for each failed row
  uint8_t* accepted = nullptr;  // [R] rows with a draft: 1 when it was kept (may be null without drafts)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;         // "cpu" | "cuda"
  virtual std::string kernel_info() const = 0;  // e.g. SIMD level, device name
  virtual int num_threads() const = 0;
  // What the KV cache holds: f32, bf16, f16 or F8E4M3 (EngineOptions::kv_cache_dtype).
  virtual DType kv_dtype() const = 0;
  // KV bytes of one block of the full-attention layers (every layer when the backend keeps no
  // window blocks).
  virtual size_t kv_bytes_per_block(int64_t block_size) const = 0;
  // KV bytes of one block of the sliding-window layers when the backend keeps them apart (so the
  // engine can free what falls out of the window), else 0.
  virtual size_t kv_bytes_per_window_block(int64_t block_size) const {
    (void)block_size;
    return 0;
  }
  // The KV pool size to allocate: `requested` bytes, or when it is 0 the backend's own default
  // (CUDA: what gpu_memory_utilization leaves after weights and activations).
  virtual size_t kv_budget_bytes(size_t requested) const = 0;
  // Called once before the first forward(); num_window_blocks is 0 unless
  // kv_bytes_per_window_block() is.
  virtual void allocate_kv(int64_t num_blocks, int64_t num_window_blocks, int64_t block_size) = 0;
  // Writes the batch's K/V into the cache and keeps the logits of the selected rows.
  virtual void forward(const ForwardBatch& batch) = 0;
  // Samples one token per logit row of the last forward(). A failure confined to one row (a bad
  // parameter, an injected fault) is reported in out.row_errors and the other rows are sampled;
  // a device failure throws (kDeviceFault when the device is unusable from then on).
  virtual void sample(const SampleRow* rows, int64_t R, const SampleOutput& out) = 0;
  // Copies the logits of the last forward() to the host: [R, vocab] f32 (tests and tools).
  virtual void read_logits(float* out) = 0;
  // Accelerator memory the backend holds (weights, activations, KV); 0 for the CPU.
  virtual size_t device_bytes() const { return 0; }
  // Whether sample() verifies SampleRow::draft (speculative decoding).
  virtual bool verifies_drafts() const { return false; }
  // EAGLE-3 heads: from now on forward() keeps, for every token, the residual stream entering each
  // of `layers` (the embedding output for layer 0), side by side: captured_hidden() is then
  // [T, layers.size() * hidden_size] f32 on the host, valid until the next forward(). False when
  // the backend cannot (the engine then refuses the head).
  virtual bool capture_hidden(const std::vector<int64_t>& layers) {
    (void)layers;
    return false;
  }
  virtual const float* captured_hidden() const { return nullptr; }
  // The CPU backend's compute threads, for work the engine runs between steps (an EAGLE-3 head);
  // nullptr for other backends.
  virtual cpu::ThreadPool* cpu_threads() { return nullptr; }
  // Whether forward() applies ForwardBatch::seq_adapters (LoRA).
  virtual bool applies_lora() const { return false; }

  // Pipelined steps (EngineOptions::cuda_device_tokens). sample() split in two: sample_launch()
  // starts sampling the last forward()'s rows into output slot `slot` (0 or 1: the engine keeps
  // at most two steps in flight, each with its own slot) and returns without waiting;
  // sample_collect() waits for that slot and fills `out` as sample() would (row errors
  // included). Between the two, the next forward() may name a token this launch sampled:
  // ForwardBatch::token_ids entries < 0 are device_token_ref(r), the token row r sampled.
  // Contract: such refs name the last launch only, r < its R; a row whose sample failed reads
  // some valid token id (the engine discards what it computed).
  // The defaults serve any synchronous backend (the CPU one, in tests): they sample at once into
  // a host copy, and resolve_host_refs() replaces the refs with it before forward().
  virtual bool resolves_device_tokens() const { return false; }
  virtual void sample_launch(const SampleRow* rows, int64_t R, int top_n, int slot) {
    HostSample& h = host_samples_[slot & 1];
    h.R = R;
    h.top_n = top_n;
    h.tokens.assign(size_t(R), -1);
    h.logprobs.assign(size_t(R), 0.f);
    h.top_ids.assign(size_t(R) * size_t(top_n), -1);
    h.top_logprobs.assign(size_t(R) * size_t(top_n), -INFINITY);
    h.errors.clear();
    sample(rows, R, {h.tokens.data(), h.logprobs.data(), top_n, h.top_ids.data(), h.top_logprobs.data(), &h.errors});
    last_launch_slot_ = slot & 1;
  }
  virtual void sample_collect(int slot, const SampleOutput& out) {
    const HostSample& h = host_samples_[slot & 1];
    std::copy(h.tokens.begin(), h.tokens.end(), out.tokens);
    std::copy(h.logprobs.begin(), h.logprobs.end(), out.logprobs);
    std::copy(h.top_ids.begin(), h.top_ids.end(), out.top_ids);
    std::copy(h.top_logprobs.begin(), h.top_logprobs.end(), out.top_logprobs);
    if (out.row_errors) out.row_errors->insert(out.row_errors->end(), h.errors.begin(), h.errors.end());
  }
  // Whether sample_collect(slot) would return without waiting.
  virtual bool sample_ready(int slot) const {
    (void)slot;
    return true;
  }
  // For a backend that does not resolve device tokens: ids[t] < 0 becomes the token the last
  // sample_launch() drew for that row (0 where it failed).
  void resolve_host_refs(int32_t* ids, int64_t T, int64_t vocab) const {
    const HostSample& h = host_samples_[last_launch_slot_];
    for (int64_t t = 0; t < T; t++) {
      if (ids[t] >= 0) continue;
      const int64_t r = device_token_row(ids[t]);
      const int32_t tok = r < h.R ? h.tokens[size_t(r)] : -1;
      ids[t] = tok >= 0 && tok < vocab ? tok : 0;
    }
  }
  static int32_t device_token_ref(int64_t row) { return int32_t(-2 - row); }
  static int64_t device_token_row(int32_t ref) { return -2 - int64_t(ref); }

 private:
  struct HostSample {
    int64_t R = 0;
    int top_n = 0;
    std::vector<int32_t> tokens, top_ids;
    std::vector<float> logprobs, top_logprobs;
    std::vector<SampleRowError> errors;
  };
  HostSample host_samples_[2];
  int last_launch_slot_ = 0;
};

// fp8_kv: the KV cache holds e4m3 codes (EngineOptions::kv_cache_dtype "fp8"), else f32 or, with
// bf16_activations, bf16.
std::unique_ptr<Backend> create_cpu_backend(const ModelConfig& config, const ModelWeights& weights, int num_threads,
                                           bool bf16_activations, bool fp8_kv = false);

// Whether this build has the CUDA backend and a usable device; when not, *why says why.
bool cuda_backend_available(std::string* why);
// Throws Error(kBackendUnavailable) when cuda_backend_available() is false.
std::unique_ptr<Backend> create_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                            const EngineOptions& options);

}  // namespace sluice
