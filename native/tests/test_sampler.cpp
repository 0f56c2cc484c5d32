// Sampling: greedy, temperature, top-k, top-p and min-p draw from exactly the distribution they
// define (checked by frequencies over many seeded draws), and logprobs are log-softmax values.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "sample/sampler.h"
#include "test_util.h"

using namespace sluice;

namespace {

struct Draws {
  std::map<int32_t, int> counts;
  int n = 0;
};

Draws draw(const std::vector<float>& logits, const SamplingParams& p, int n) {
  std::vector<float> probs;
  std::vector<int32_t> order;
  int32_t best = 0;
  double mx = logits[0];
  for (size_t i = 1; i < logits.size(); i++)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i), mx = logits[i];
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const float lse = float(mx + std::log(sum));
  Draws d;
  for (int i = 0; i < n; i++) {
    Rng rng(p.seed + uint64_t(i) * 7919);
    SampledToken t = sample_token(logits.data(), int64_t(logits.size()), best, lse, p, rng, 0, nullptr, nullptr, probs, order);
    CHECK(std::fabs(t.logprob - (logits[size_t(t.token)] - lse)) < 1e-5);
    d.counts[t.token]++;
    d.n++;
  }
  return d;
}

// Expected probabilities of softmax(logits / T) restricted to `allowed`.
std::map<int32_t, double> expected(const std::vector<float>& logits, float T, const std::vector<int32_t>& allowed) {
  std::map<int32_t, double> e;
  double z = 0;
  for (int32_t id : allowed) z += std::exp(double(logits[size_t(id)]) / T);
  for (int32_t id : allowed) e[id] = std::exp(double(logits[size_t(id)]) / T) / z;
  return e;
}

void check_frequencies(const Draws& d, const std::map<int32_t, double>& want) {
  for (auto& [id, c] : d.counts) CHECK(want.count(id) == 1);  // nothing outside the allowed set
  for (auto& [id, p] : want) {
    const double got = double(d.counts.count(id) ? d.counts.at(id) : 0) / d.n;
    const double sigma = std::sqrt(p * (1 - p) / d.n);
    if (!(std::fabs(got - p) <= 5 * sigma + 1e-3)) {
      std::printf("  token %d: frequency %.4f, expected %.4f\n", id, got, p);
      CHECK(false);
    }
  }
}

}  // namespace

TEST_CASE(greedy_and_top_k_1_pick_the_argmax_lowest_id_on_ties) {
  std::vector<float> logits{0.f, 3.f, 1.f, 3.f};
  Draws g = draw(logits, {0.f, 1.f, 0, 1, 0}, 50);
  CHECK(g.counts.size() == 1 && g.counts.count(1) == 1);
  Draws k1 = draw(logits, {1.3f, 1.f, 1, 9, 0}, 50);
  CHECK(k1.counts.size() == 1 && k1.counts.count(1) == 1);
}

TEST_CASE(temperature_top_k_and_top_p_sample_their_distributions) {
  std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const int n = 40000;
  check_frequencies(draw(logits, {1.0f, 1.f, 0, 11, 0}, n), expected(logits, 1.0f, {0, 1, 2, 3, 4, 5}));
  check_frequencies(draw(logits, {0.5f, 1.f, 0, 12, 0}, n), expected(logits, 0.5f, {0, 1, 2, 3, 4, 5}));
  check_frequencies(draw(logits, {1.0f, 1.f, 3, 13, 0}, n), expected(logits, 1.0f, {0, 1, 2}));
  // softmax: 0.561, 0.206, 0.125, 0.076, ... -> top_p 0.8 keeps the first three (0.561 + 0.206 < 0.8).
  check_frequencies(draw(logits, {1.0f, 0.8f, 0, 14, 0}, n), expected(logits, 1.0f, {0, 1, 2}));
  check_frequencies(draw(logits, {1.0f, 0.5f, 0, 15, 0}, n), expected(logits, 1.0f, {0}));
  check_frequencies(draw(logits, {1.0f, 0.9f, 2, 16, 0}, n), expected(logits, 1.0f, {0, 1}));
}

TEST_CASE(top_p_over_a_flat_large_vocabulary_widens_past_the_first_candidates) {
  // 150k tokens with equal logits but 1000 slightly preferred ones: the nucleus (p = 0.5) needs
  // far more than the first 64 sorted candidates.
  std::vector<float> logits(150000, 0.f);
  for (int i = 0; i < 1000; i++) logits[size_t(i * 150)] = 0.01f;
  Draws d = draw(logits, {1.0f, 0.5f, 0, 21, 0}, 300);
  int preferred = 0;
  for (auto& [id, c] : d.counts) preferred += (id % 150 == 0 && id < 150000) ? c : 0;
  CHECK(d.counts.size() > 250);  // many distinct tokens: the nucleus is wide
  // Every kept token must rank within the top half of the mass: the 1000 preferred + the lowest ids.
  int32_t max_id_unpreferred = 0;
  for (auto& [id, c] : d.counts)
    if (id % 150 != 0) max_id_unpreferred = std::max(max_id_unpreferred, id);
  CHECK(max_id_unpreferred < 76000);  // ties broken by id: the nucleus is a prefix of the id order
  CHECK(preferred > 0);
}

namespace {

// The kept set by the definitions, straight from the probabilities: softmax(logits / T); min_p
// drops p < min_p * max p; top-k keeps the k most likely; top-p the shortest most-likely head of
// what is left (renormalised) holding top_p of it. Ties by id.
std::vector<int32_t> reference_kept(const std::vector<float>& logits, float T, int top_k, float top_p, float min_p) {
  std::vector<double> p(logits.size());
  double z = 0, pmax = 0;
  for (size_t i = 0; i < logits.size(); i++) z += p[i] = std::exp(double(logits[i]) / T);
  for (double& x : p) pmax = std::max(pmax, x /= z);
  std::vector<int32_t> kept;
  for (size_t i = 0; i < p.size(); i++)
    if (p[i] >= double(min_p) * pmax) kept.push_back(int32_t(i));
  std::stable_sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  if (top_k > 0 && size_t(top_k) < kept.size()) kept.resize(size_t(top_k));
  double mass = 0, cum = 0;
  for (int32_t id : kept) mass += p[size_t(id)];
  for (size_t n = 0; n < kept.size(); n++)
    if ((cum += p[size_t(kept[n])]) >= double(top_p) * mass) {
      kept.resize(n + 1);
      break;
    }
  return kept;
}

}  // namespace

TEST_CASE(min_p_samples_what_it_keeps_in_proportion) {
  // softmax(l / 1) / max: 1, 0.368, 0.223, 0.135, 0.050, 0.007; at T = 0.5: 1, 0.135, 0.050, ...
  std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const int n = 40000;
  struct Case {
    float T, top_p;
    int top_k;
    float min_p;
    size_t num_kept;  // what the reference must find, so that each case tests the cut it names
  };
  const Case cases[] = {
      {1.0f, 1.f, 0, 0.2f, 3},   // min_p alone
      {1.0f, 1.f, 0, 0.1f, 4},
      {0.5f, 1.f, 0, 0.1f, 2},   // after temperature: the same min_p keeps fewer
      {2.0f, 1.f, 0, 0.1f, 5},   // ... or more
      {1.0f, 1.f, 2, 0.1f, 2},   // top-k shorter than min_p's set
      {1.0f, 1.f, 5, 0.2f, 3},   // min_p's set shorter than top-k
      // top-p over the mass min_p left: {0..3} renormalised holds 0.579, 0.792 -> two tokens;
      // over the whole distribution (0.561, 0.767) it would take three.
      {1.0f, 0.78f, 0, 0.1f, 2},
      {1.0f, 1.f, 0, 1.0f, 1},   // min_p 1: only the most likely token, whatever the temperature
      {1.0f, 1.f, 0, 0.f, 6},    // 0: off
  };
  uint64_t seed = 31;
  for (const Case& c : cases) {
    const std::vector<int32_t> kept = reference_kept(logits, c.T, c.top_k, c.top_p, c.min_p);
    CHECK(kept.size() == c.num_kept);
    check_frequencies(draw(logits, {c.T, c.top_p, c.top_k, seed++, 0, c.min_p}, n), expected(logits, c.T, kept));
  }
}

TEST_CASE(min_p_keeps_ties_and_never_masked_tokens) {
  // min_p 1 keeps every token tied at the maximum (in proportion: equal), nothing else.
  std::vector<float> tied{1.f, 3.f, 3.f, 0.f, 3.f};
  check_frequencies(draw(tied, {1.5f, 1.f, 0, 41, 0, 1.f}, 20000), expected(tied, 1.5f, {1, 2, 4}));
  // A tiny min_p over a wide vocabulary with masked (-inf) tokens: the cut lands past the first
  // sorted candidates, and a masked token is never drawn.
  std::vector<float> wide(9000, 0.f);
  for (size_t i = 0; i < wide.size(); i += 3) wide[i] = -INFINITY;
  for (size_t i = 1; i < wide.size(); i += 3) wide[i] = -2.f;  // ratio e^-2 = 0.135 to the best
  const int n = 2000;
  Draws keep_all = draw(wide, {1.f, 1.f, 0, 42, 0, 0.1f}, n);
  Draws keep_top = draw(wide, {1.f, 1.f, 0, 43, 0, 0.2f}, n);
  int low = 0;
  for (auto& [id, c] : keep_all.counts) {
    CHECK(id % 3 != 0);
    low += id % 3 == 1 ? c : 0;
  }
  // 3000 tokens at -2 and 3000 at 0: the low ones get e^-2 / (1 + e^-2) = 0.1192 of the draws
  // (sigma 0.0072 over 2000 draws: 5 sigma allowed).
  CHECK(std::fabs(double(low) / n - 0.1192) < 0.036);
  for (auto& [id, c] : keep_top.counts) CHECK(id % 3 == 2);
  // 2000 draws over the 3000 kept tokens hit about 1460 distinct ones, not a short prefix.
  CHECK(keep_top.counts.size() > 1200);
}

TEST_CASE(same_seed_same_draw) {
  std::vector<float> logits{0.3f, 0.2f, 0.1f, 0.0f};
  std::vector<float> probs;
  std::vector<int32_t> order;
  for (uint64_t seed : {1ull, 2ull, 99ull}) {
    Rng a(seed), b(seed);
    SamplingParams p{1.f, 1.f, 0, seed, 0};
    for (int i = 0; i < 20; i++) {
      auto x = sample_token(logits.data(), 4, 0, 1.5f, p, a, 0, nullptr, nullptr, probs, order);
      auto y = sample_token(logits.data(), 4, 0, 1.5f, p, b, 0, nullptr, nullptr, probs, order);
      CHECK(x.token == y.token);
    }
  }
}

namespace {

// Draws verify_draft_token verdicts for one draft over many seeds: the tokens it returns, and how
// often it accepted.
Draws verify_draws(const std::vector<float>& logits, const SamplingParams& p, int32_t draft, int n, double& accept_rate) {
  std::vector<float> probs;
  std::vector<int32_t> order;
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); i++)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  double z = 0;
  for (float l : logits) z += l == -INFINITY ? 0.0 : std::exp(double(l) - logits[size_t(best)]);
  const float lse = float(logits[size_t(best)] + std::log(z));
  Draws d;
  int accepted = 0;
  for (int i = 0; i < n; i++) {
    Rng rng(p.seed + uint64_t(i) * 7919);
    int32_t top_ids[2];
    float top_lp[2];
    DraftVerdict v = verify_draft_token(logits.data(), int64_t(logits.size()), best, lse, p, rng, draft, 2, top_ids, top_lp, probs, order);
    CHECK(v.accepted == (v.token.token == draft) || (!v.accepted && v.token.token != draft));
    CHECK(std::fabs(v.token.logprob - (logits[size_t(v.token.token)] - lse)) < 1e-5);
    CHECK(top_ids[0] == best);
    accepted += v.accepted;
    d.counts[v.token.token]++;
    d.n++;
  }
  accept_rate = double(accepted) / n;
  return d;
}

}  // namespace

TEST_CASE(a_verified_draft_leaves_the_sampled_distribution_unchanged) {
  // Speculative decoding: whatever the proposer guessed, the token a row yields follows the
  // distribution sample_token draws from, and a draft is accepted with exactly its probability.
  const float masked = -INFINITY;
  std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.0f, masked, -1.0f, -3.0f};
  const std::vector<int32_t> unmasked{0, 1, 2, 3, 5, 6};
  const int n = 40000;
  struct Case {
    SamplingParams p;
    std::vector<int32_t> kept;
  };
  const Case cases[] = {
      {{1.0f, 1.f, 0, 31, 0}, unmasked},
      {{0.7f, 1.f, 0, 32, 0}, unmasked},
      {{1.0f, 1.f, 3, 33, 0}, {0, 1, 2}},
      {{1.0f, 0.8f, 0, 34, 0}, {0, 1, 2}},
      {{1.0f, 1.f, 0, 35, 0, 0.2f}, {0, 1, 2}},  // min_p 0.2: p / p_max = 1, 0.37, 0.22, 0.14, ...
  };
  for (const Case& c : cases) {
    const std::map<int32_t, double> want = expected(logits, c.p.temperature, c.kept);
    // The likeliest token, a middling one, one the filters drop, the masked one.
    for (int32_t draft : {0, 2, 6, 4}) {
      double rate = 0;
      check_frequencies(verify_draws(logits, c.p, draft, n, rate), want);
      const double p_draft = want.count(draft) ? want.at(draft) : 0.0;
      const double sigma = std::sqrt(std::max(p_draft * (1 - p_draft), 1e-12) / n);
      if (!(std::fabs(rate - p_draft) <= 5 * sigma + 1e-3)) {
        std::printf("  draft %d: accepted %.4f of the time, p = %.4f\n", draft, rate, p_draft);
        CHECK(false);
      }
    }
  }
  // Greedy: accepted exactly when the draft is the argmax; the token is the argmax either way.
  for (int32_t draft : {0, 1, 4}) {
    double rate = 0;
    Draws d = verify_draws(logits, {0.f, 1.f, 0, 36, 0}, draft, 50, rate);
    CHECK(d.counts.size() == 1 && d.counts.count(0) == 1);
    CHECK(rate == (draft == 0 ? 1.0 : 0.0));
  }
}

TEST_CASE(sampling_never_falls_back_to_a_token_of_no_weight) {
  // Masked tokens at the end of the kept set: whatever the draw, never one of them.
  std::vector<float> logits(64, 0.f);
  for (size_t i = 40; i < logits.size(); i++) logits[i] = -INFINITY;
  Draws d = draw(logits, {1.0f, 1.f, 0, 41, 0}, 20000);
  for (auto& [id, c] : d.counts) CHECK(id < 40);
}

int main() { return sluice_test::run_all("sampler"); }
