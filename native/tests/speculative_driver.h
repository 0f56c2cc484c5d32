// The speculative decoding tests' driver (test_speculative, cuda/test_cuda_speculative): a
// sequence generated step by step with drafts from a proposer, proposers against a reference
// continuation, and the two-sample chi-square the sampled tests use.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "sluice/engine.h"

namespace sluice_test {

using sluice::Engine;
using sluice::RowStatus;
using sluice::SamplingParams;
using sluice::StepPlan;
using sluice::StepResult;

struct Emitted {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  int steps = 0;
  int drafted = 0, accepted = 0;
  int64_t generated = 0;  // before the cut to n
};

// The drafts to propose for a sequence whose tokens so far are `known` (the pending one last).
using Proposer = std::function<std::vector<int32_t>(const std::vector<int32_t>& known)>;

// Runs sequence `id` from `prompt` until it has n generated tokens (the last step may overshoot:
// the result is cut to n), proposing drafts at every decode step; the sequence is left in the
// engine.
inline Emitted generate(Engine& e, uint32_t id, const std::vector<int32_t>& prompt, int n, const SamplingParams& params,
                 const Proposer& propose, int max_drafts = 4) {
  Emitted out;
  std::vector<int32_t> known = prompt;
  const int64_t cached = e.add_sequence(id, prompt, params);
  int64_t remaining = int64_t(prompt.size()) - cached;
  while (int(out.tokens.size()) < n) {
    StepPlan plan;
    plan.seq_ids = {id};
    if (remaining > 0) {
      plan.num_tokens = {uint32_t(remaining)};
      remaining = 0;
    } else {
      std::vector<int32_t> d = propose ? propose(known) : std::vector<int32_t>{};
      if (int(d.size()) > max_drafts) d.resize(size_t(max_drafts));
      plan.num_tokens = {uint32_t(1 + d.size())};
      plan.num_drafts = {uint32_t(d.size())};
      plan.drafts = d;
    }
    const StepResult r = e.step(plan);
    out.steps++;
    if (r.row_status[0] != uint8_t(RowStatus::kRan) || r.seq_ids.empty()) {
      std::printf("  step %d: row status %d, %zu errors\n", out.steps, int(r.row_status[0]), r.errors.size());
      return out;
    }
    out.drafted += int(r.row_drafted[0]);
    out.accepted += int(r.row_accepted[0]);
    for (size_t j = 0; j < r.seq_ids.size(); j++) {
      known.push_back(r.tokens[j]);
      out.tokens.push_back(r.tokens[j]);
      out.logprobs.push_back(r.logprobs[j]);
      for (int k = 0; k < r.top_n; k++) {
        out.top_ids.push_back(r.top_ids[j * size_t(r.top_n) + size_t(k)]);
        out.top_logprobs.push_back(r.top_logprobs[j * size_t(r.top_n) + size_t(k)]);
      }
    }
  }
  out.generated = int64_t(out.tokens.size());
  const size_t top_n = out.tokens.empty() ? 0 : out.top_ids.size() / out.tokens.size();
  out.tokens.resize(size_t(n));
  out.logprobs.resize(size_t(n));
  out.top_ids.resize(size_t(n) * top_n);
  out.top_logprobs.resize(size_t(n) * top_n);
  return out;
}

inline const SamplingParams kGreedy{0.f, 1.f, 0, 0, 2};

inline bool same(const Emitted& a, const Emitted& b) {
  return a.tokens == b.tokens && a.top_ids == b.top_ids && a.logprobs.size() == b.logprobs.size() &&
         std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)) == 0;
}

inline std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; i++) p.push_back((i * 7 + salt * 13 + 3) % 96);
  return p;
}

// Proposers against a reference continuation `ref` of `prompt`: the next k tokens of it, those
// tokens each shifted (always wrong), or right for `right` tokens then wrong.
inline Proposer from_reference(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ref, int k, int right, int vocab) {
  return [=](const std::vector<int32_t>& known) {
    std::vector<int32_t> d;
    const size_t at = known.size() - prompt.size();  // generated so far (the pending token included)
    for (int j = 0; j < k && at + size_t(j) < ref.size(); j++) {
      const int32_t t = ref[at + size_t(j)];
      d.push_back(j < right ? t : (t + 1 + j) % vocab);
    }
    return d;
  };
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson-Hilferty).
inline double chi2_critical(int df) {
  const double z = 3.09, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Two-sample chi-square of two histograms of equal totals, bins with fewer than 10 expected
// counts pooled; returns (statistic, df).
inline std::pair<double, int> chi2_two_sample(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> bins;
  for (auto [k, v] : a) bins[k].first += v;
  for (auto [k, v] : b) bins[k].second += v;
  std::vector<std::pair<int, int>> merged;
  std::pair<int, int> pool{0, 0};
  for (auto& [k, v] : bins) {
    if (v.first + v.second < 20) {
      pool.first += v.first;
      pool.second += v.second;
    } else {
      merged.push_back(v);
    }
  }
  if (pool.first + pool.second > 0) merged.push_back(pool);
  double stat = 0;
  for (auto [x, y] : merged) stat += double(x - y) * double(x - y) / double(x + y);
  return {stat, int(merged.size()) - 1};
}

// Sampled runs of `prompt` with and without one verified draft per step, over `runs` seeds: the
// histograms of generated tokens 1 .. n-1 (token 0 comes from the prefill; token 1 is the first
// verified one) and the drafts made and kept. The draft after token t is the greedy token that
// follows prompt + t (likely, so drafts are both accepted and rejected).
struct SampledRuns {
  std::vector<std::map<int32_t, int>> plain, spec;  // [n - 1]
  int drafted = 0, accepted = 0;
};

inline SampledRuns sample_with_and_without_drafts(Engine& e, const std::vector<int32_t>& prompt, int vocab, int runs, int n) {
  std::vector<int32_t> greedy_next(static_cast<size_t>(vocab));
  for (int32_t t = 0; t < vocab; t++) {
    std::vector<int32_t> p = prompt;
    p.push_back(t);
    greedy_next[size_t(t)] = generate(e, 0, p, 1, kGreedy, nullptr).tokens[0];
    e.free_sequence(0);
  }
  const Proposer propose = [&](const std::vector<int32_t>& known) { return std::vector<int32_t>{greedy_next[size_t(known.back())]}; };
  SampledRuns out;
  out.plain.resize(size_t(n - 1));
  out.spec.resize(size_t(n - 1));
  for (int seed = 0; seed < runs; seed++) {
    // Independent seeds for the two runs (the same seed would correlate them).
    const SamplingParams p{0.4f, 0.95f, 8, uint64_t(seed) * 7919 + 1, 0, 0.01f};
    SamplingParams q = p;
    q.seed += 1000003;
    const Emitted a = generate(e, 0, prompt, n, p, nullptr);
    e.free_sequence(0);
    const Emitted b = generate(e, 0, prompt, n, q, propose, 1);
    e.free_sequence(0);
    for (int i = 1; i < n; i++) {
      out.plain[size_t(i - 1)][a.tokens[size_t(i)]]++;
      out.spec[size_t(i - 1)][b.tokens[size_t(i)]]++;
    }
    out.accepted += b.accepted;
    out.drafted += b.drafted;
  }
  return out;
}

}  // namespace sluice_test
