// EAGLE-3 draft heads (issue 35): a one-layer decoder, trained beside a target model, that
// proposes the target's next tokens from the target's own hidden states. Loaded from the layout
// EAGLE-3 checkpoints are published in (config.json with architectures LlamaForCausalLMEagle3,
// weights fc / midlayer.* / norm / lm_head / d2t in safetensors).
//
// For each position t of a sequence the target computed, the head keeps one K/V entry made from
// (fc(the target's residual stream entering its three aux layers at t), embed(token t + 1)),
// roped at position t. Its output there predicts token t + 2; drafting past that feeds the
// head's own output back in place of the target's features. A draft is a greedy argmax over the
// head's (reduced) draft vocabulary, mapped to a target id (d2t): a point mass, which the engine's
// verification keeps exactly (greedy) or by rejection sampling (sampled rows).
//
// Entries live in a paged pool of the head's own; a sequence's entries are contiguous in its
// block table even where the target computed nothing (a prefix-cache hit gives the head no
// features for the cached positions: those are simply absent from its context, which costs
// acceptance, never correctness). A sequence that cannot get a block loses its head state and
// drafts nothing from then on.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/safetensors.h"
#include "sluice/model_config.h"

namespace sluice {
namespace cpu {
class ThreadPool;
}

struct Eagle3Config {
  ModelConfig layer;              // the midlayer's shapes, norms eps and rope (a Llama layer)
  int64_t target_hidden = 0;      // width of each aux hidden state (fc input is 3x this)
  int64_t draft_vocab = 0;        // lm_head rows
  std::vector<int64_t> aux_layers;  // the target layers whose input the head reads, in fc order
  bool norm_before_residual = false;
};

// Reads <dir>/config.json: shapes, and the aux layers (eagle_config.eagle_aux_hidden_state_layer_ids,
// else 2, L / 2 and L - 3 of the target's L layers). Throws kModelFileInvalid / kUnsupportedModel
// naming the field, and kInvalidArgument when the head does not fit `target`.
Eagle3Config parse_eagle3_config(const std::string& dir, const ModelConfig& target);

class Eagle3Head {
 public:
  // target_embed: the target's embedding table, used when the head has none of its own.
  // max_entries: K/V entries the head's pool holds, all sequences together.
  Eagle3Head(const std::string& dir, const ModelConfig& target, const TensorView& target_embed, cpu::ThreadPool& pool,
             int64_t max_entries);
  ~Eagle3Head();

  const Eagle3Config& config() const { return cfg_; }
  size_t weight_bytes() const;
  size_t kv_bytes() const;

  // One sequence's part of run(): n new positions first .. first + n - 1 with their features
  // ([n, 3 * target_hidden], rows `stride` floats apart) and the token that follows each; then,
  // when k > 0, k drafts to follow next_tokens[n - 1] (appended to *drafts).
  struct Update {
    uint32_t seq_id = 0;
    const float* features = nullptr;
    int64_t stride = 0;
    const int32_t* next_tokens = nullptr;
    int64_t first = 0;
    int64_t n = 0;
    int k = 0;
    std::vector<int32_t>* drafts = nullptr;
  };
  // Appends every update's positions to its sequence (creating the state on first use) and drafts.
  // A sequence whose positions do not follow its last ones, or whose entries do not fit the pool,
  // loses its state (no drafts); the call itself fails only for a fault of the whole head.
  void run(const std::vector<Update>& updates);
  void remove(uint32_t seq_id);
  // Entries a sequence holds (tests); -1 when it has no state.
  int64_t num_entries(uint32_t seq_id) const;
  // Tests: called with each drafting round's logits over the draft vocabulary, [R, draft_vocab].
  std::function<void(int64_t R, const float* logits)> logits_observer;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Eagle3Config cfg_;
};

}  // namespace sluice
