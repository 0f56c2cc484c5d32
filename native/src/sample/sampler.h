// Token sampling from one row of logits: greedy, temperature, min-p, top-k, top-p, seeded, with
// logprobs of the chosen token and the top N. Pure functions of (logits, params, rng state).
#pragma once
#include <cstdint>
#include <vector>

#include "sluice/engine.h"

namespace sluice {

// xoshiro256** seeded through splitmix64: one stream per sequence, so a sequence's draws do
// not depend on what else is in the batch.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  double next_double();  // uniform in [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.f;  // log-softmax of the raw logits (temperature does not change it)
};

// logits: [vocab], with its argmax (lowest id on ties) and log-sum-exp precomputed by the
// backend. top_ids/top_logprobs: [top_n] outputs (best first) when top_n > 0. The scratch
// vectors are reused between calls to keep the decode loop free of allocations.
SampledToken sample_token(const float* logits, int64_t vocab, int32_t argmax, float log_sum_exp,
                          const SamplingParams& params, Rng& rng, int top_n, int32_t* top_ids, float* top_logprobs,
                          std::vector<float>& scratch, std::vector<int32_t>& index_scratch);

// Speculative decoding's check of one proposed token `draft` against this row, for a proposer that
// put all its mass on it (prompt lookup, a greedy draft model): accepted with probability p(draft)
// under sample_token's distribution for (logits, params); rejected, the token is drawn from that
// distribution with the draft removed and renormalised. Either way the token returned follows
// sample_token's distribution exactly. Greedy (temperature 0 or top_k 1): accepted when the draft
// is the argmax; the token is the argmax. logprob and the top_n alternatives as sample_token's.
struct DraftVerdict {
  bool accepted = false;
  SampledToken token;
};
DraftVerdict verify_draft_token(const float* logits, int64_t vocab, int32_t argmax, float log_sum_exp,
                                const SamplingParams& params, Rng& rng, int32_t draft, int top_n, int32_t* top_ids,
                                float* top_logprobs, std::vector<float>& scratch, std::vector<int32_t>& index_scratch);

}  // namespace sluice
