// Drives an Engine step by step for the native tests: sequence 0 is the one under test, with
// `others` companion sequences; every prompt is prefilled in chunks of at most `chunk` tokens.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sluice/engine.h"

namespace sluice_test {

struct SampledStep {
  int32_t token;
  float logprob;
  std::vector<int32_t> top_ids;       // best first
  std::vector<float> top_logprobs;
};

inline std::vector<int32_t> prompt_of(int len, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; i++) p.push_back((i * 7 + salt * 13 + 3) % vocab);
  return p;
}

// Generates n tokens for `prompt` and returns what sequence 0 sampled at each step.
inline std::vector<SampledStep> run_sequence(sluice::Engine& e, const std::vector<int32_t>& prompt, int n, int others,
                                             int chunk, const sluice::SamplingParams& params) {
  const int vocab = int(e.info().config.vocab_size);
  std::vector<std::vector<int32_t>> prompts{prompt};
  for (int i = 1; i <= others; i++) prompts.push_back(prompt_of(3 + 5 * i % 17, i, vocab));
  std::vector<int64_t> remaining(prompts.size());
  for (size_t i = 0; i < prompts.size(); i++) {
    // With the prefix cache on, a repeated prompt starts after its cached blocks.
    remaining[i] = int64_t(prompts[i].size()) - e.add_sequence(uint32_t(i), prompts[i], params);
  }
  std::vector<SampledStep> out;
  while (int(out.size()) < n) {
    sluice::StepPlan plan;
    for (size_t i = 0; i < prompts.size(); i++) {
      plan.seq_ids.push_back(uint32_t(i));
      const uint32_t count = remaining[i] > 0 ? uint32_t(std::min<int64_t>(remaining[i], chunk)) : 1;
      plan.num_tokens.push_back(count);
      remaining[i] = std::max<int64_t>(0, remaining[i] - count);
    }
    const sluice::StepResult r = e.step(plan);
    for (size_t j = 0; j < r.seq_ids.size(); j++) {
      if (r.seq_ids[j] != 0) continue;
      SampledStep s{r.tokens[j], r.logprobs[j], {}, {}};
      for (int k = 0; k < r.top_n; k++) {
        s.top_ids.push_back(r.top_ids[j * size_t(r.top_n) + size_t(k)]);
        s.top_logprobs.push_back(r.top_logprobs[j * size_t(r.top_n) + size_t(k)]);
      }
      out.push_back(std::move(s));
    }
  }
  for (size_t i = 0; i < prompts.size(); i++) e.free_sequence(uint32_t(i));
  return out;
}

}  // namespace sluice_test
