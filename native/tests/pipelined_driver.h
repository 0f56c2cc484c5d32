// Drives an Engine through a fixed script of plans, either one step at a time (step()) or
// pipelined (begin_step() of step k+1 before end_step() of step k, as the addon does with
// cuda_device_tokens), so that a test can require both to give the same tokens.
//
// The plans never depend on a result: sequence 0 (the one under test) and `others` companions
// are added by the first plan, prefilled in chunks of at most `chunk` tokens, then decode one
// token per step. Churn frees companion 1 mid-run and adds sequence 100, then frees that and
// adds sequence 1 again under the same id with another prompt (no prompt shares a cached block
// with another, so both loops compute the same batches).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "engine_driver.h"
#include "sluice/engine.h"

namespace sluice_test {

struct ScriptOptions {
  int steps = 40;
  int others = 0;
  int chunk = 1000;
  bool churn = false;
  int fault_step = -1;          // inject_fault(fault_seq, kSampleRow) before this step
  uint32_t fault_seq = 0;
  int mask_step = -1;           // this step constrains sequence 0 to token `mask_token`
  int32_t mask_token = 5;
};

// What the tests compare of one step's result.
struct ScriptStep {
  std::vector<uint32_t> seq_ids;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<uint32_t> failed;  // seq ids of the step's errors, in order
  bool operator==(const ScriptStep& o) const {
    return seq_ids == o.seq_ids && tokens == o.tokens && failed == o.failed &&
           std::equal(logprobs.begin(), logprobs.end(), o.logprobs.begin(), o.logprobs.end(),
                      [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; });
  }
};

class FixedMasks final : public sluice::TokenMaskSource {
 public:
  FixedMasks(int64_t vocab, int32_t token) : words_(size_t(sluice::token_mask_words(vocab)), 0u) {
    words_[size_t(token / 32)] = 1u << (token % 32);
  }
  const uint32_t* wait() override { return words_.data(); }

 private:
  std::vector<uint32_t> words_;
};

inline std::vector<ScriptStep> run_script(sluice::Engine& e, const std::vector<int32_t>& prompt,
                                          const sluice::SamplingParams& params, const ScriptOptions& o, bool pipelined) {
  const int vocab = int(e.info().config.vocab_size);
  struct Live {
    uint32_t id;
    int64_t remaining;  // prompt tokens not yet planned
  };
  std::vector<Live> live;
  auto plan_for = [&](int k) {
    sluice::StepPlan plan;
    auto add = [&](uint32_t id, std::vector<int32_t> p) {
      live.push_back({id, int64_t(p.size())});
      plan.adds.push_back({id, std::move(p), params, false, ""});
    };
    auto drop = [&](uint32_t id) {
      plan.frees.push_back(id);
      live.erase(std::remove_if(live.begin(), live.end(), [&](const Live& l) { return l.id == id; }), live.end());
    };
    if (k == 0) {
      add(0, prompt);
      for (int i = 1; i <= o.others; i++) add(uint32_t(i), prompt_of(3 + 5 * i % 17, i, vocab));
    }
    if (o.churn && k == 6) {
      drop(1);
      add(100, prompt_of(29, 50, vocab));
    }
    if (o.churn && k == 12) {
      drop(100);
      add(1, prompt_of(11, 60, vocab));
    }
    for (Live& l : live) {
      const uint32_t count = l.remaining > 0 ? uint32_t(std::min<int64_t>(l.remaining, o.chunk)) : 1;
      l.remaining = std::max<int64_t>(0, l.remaining - count);
      plan.seq_ids.push_back(l.id);
      plan.num_tokens.push_back(count);
    }
    if (k == o.mask_step) {
      plan.constrained.push_back(0);
      plan.masks = std::make_shared<FixedMasks>(vocab, o.mask_token);
    }
    if (k == o.fault_step) e.inject_fault(o.fault_seq, sluice::FaultPoint::kSampleRow);
    return plan;
  };
  auto record = [](const sluice::StepResult& r) {
    ScriptStep s{r.seq_ids, r.tokens, r.logprobs, {}};
    for (const auto& err : r.errors) s.failed.push_back(err.seq_id);
    return s;
  };
  std::vector<ScriptStep> out;
  if (pipelined) {
    e.begin_step(plan_for(0));
    for (int k = 1; k < o.steps; k++) {
      e.begin_step(plan_for(k));
      out.push_back(record(e.end_step()));
    }
    out.push_back(record(e.end_step()));
  } else {
    for (int k = 0; k < o.steps; k++) out.push_back(record(e.step(plan_for(k))));
  }
  for (const Live& l : live) e.free_sequence(l.id);
  return out;
}

// The tokens sequence `id` sampled, step by step (-1 where it sampled nothing).
inline std::vector<int32_t> tokens_of(const std::vector<ScriptStep>& steps, uint32_t id) {
  std::vector<int32_t> t;
  for (const ScriptStep& s : steps) {
    auto it = std::find(s.seq_ids.begin(), s.seq_ids.end(), id);
    t.push_back(it == s.seq_ids.end() ? -1 : s.tokens[size_t(it - s.seq_ids.begin())]);
  }
  return t;
}

}  // namespace sluice_test
