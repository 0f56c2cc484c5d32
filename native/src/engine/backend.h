// The interface every compute backend implements (CPU now, CUDA beside it). The engine owns
// sequences, block tables and sampling; a backend owns weights on its device, the KV memory
// and the forward pass over one flattened batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/model_weights.h"
#include "sluice/model_config.h"

namespace sluice {

// One step's tokens, flattened across sequences. Host pointers, valid during forward().
struct ForwardBatch {
  int64_t num_tokens = 0;                   // T
  const int32_t* token_ids = nullptr;       // [T]
  const int32_t* positions = nullptr;       // [T] absolute position in its sequence
  const int32_t* token_seq = nullptr;       // [T] index into block_tables
  const int32_t* slots = nullptr;           // [T] KV slot = block_id * block_size + offset
  int64_t num_seqs = 0;                     // S
  const int32_t* const* block_tables = nullptr;  // [S] -> block ids covering positions 0..max pos
  int64_t num_logit_rows = 0;               // R
  const int32_t* logit_rows = nullptr;      // [R] indices into the T tokens whose logits are wanted
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;         // "cpu" | "cuda"
  virtual std::string kernel_info() const = 0;  // e.g. SIMD level, device name
  virtual int num_threads() const = 0;
  virtual size_t kv_bytes_per_block(int64_t block_size) const = 0;
  // Called once before the first forward().
  virtual void allocate_kv(int64_t num_blocks, int64_t block_size) = 0;
  // Writes the batch's K/V into the cache and the logits of the selected rows: [R, vocab] f32.
  virtual void forward(const ForwardBatch& batch, float* logits) = 0;
  // Per row of logits [R, vocab]: argmax (lowest id on ties) and log-sum-exp, for sampling.
  virtual void logits_stats(const float* logits, int64_t R, int64_t vocab, int32_t* argmax, float* log_sum_exp) = 0;
};

std::unique_ptr<Backend> create_cpu_backend(const ModelConfig& config, const ModelWeights& weights, int num_threads,
                                           bool bf16_activations);

}  // namespace sluice
