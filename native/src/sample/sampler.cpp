#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sluice {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::next_double() { return double(next_u64() >> 11) * 0x1.0p-53; }

namespace {

// What a sampled draw chooses from: the first `keep` tokens of `order` (or token ids 0..keep-1
// when not `sorted`) with unnormalised weights probs[0..keep) summing to `total`.
struct Candidates {
  int64_t keep = 0;
  bool sorted = false;
  double total = 0;
  int32_t id(const std::vector<int32_t>& order, int64_t i) const { return sorted ? order[size_t(i)] : int32_t(i); }
};

// The candidates of softmax(logits / T) after min-p, top-k and top-p (temperature > 0, top_k != 1).
Candidates candidates(const float* logits, int64_t vocab, int32_t best, const SamplingParams& params,
                      std::vector<float>& probs, std::vector<int32_t>& order) {
  const float max_logit = logits[best];
  // Candidates sorted by logit (desc, then id) so top-k / top-p cut a well-defined prefix.
  order.resize(size_t(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const double inv_t = 1.0 / double(params.temperature);
  // A token a mask ruled out (-inf) weighs nothing; skipping its exp also skips libm's slow path.
  auto weight = [&](int32_t id) {
    return logits[id] == -INFINITY ? 0.0 : std::exp((double(logits[id]) - double(max_logit)) * inv_t);
  };
  int64_t keep = params.top_k > 0 && params.top_k < vocab ? params.top_k : vocab;
  if (params.min_p > 0.f) {
    // min_p keeps p >= min_p * p_max, i.e. (logit - max) / T >= log(min_p): every token at or
    // above one logit, a prefix of the sorted order with ties all in or all out. Intersected
    // with top-k's prefix it is the shorter one; top-p then cuts the mass of what is left.
    const double log_min_p = std::log(double(params.min_p));
    int64_t above = 0;
    for (int64_t i = 0; i < vocab; i++) above += (double(logits[i]) - double(max_logit)) * inv_t >= log_min_p;
    keep = std::min(keep, above);
  }
  const bool nucleus = params.top_p < 1.f;
  const bool sorted = keep < vocab || nucleus;
  double total = 0;  // softmax(logits / T) mass of the kept candidates, in double
  if (nucleus) {
    // Only the head of the distribution can be in the nucleus: sort a growing prefix (64, 256,
    // ...) until it holds top_p of the mass, instead of sorting the whole vocabulary per token.
    double all = 0;
    if (keep < vocab) {
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
      for (int64_t i = 0; i < keep; i++) all += weight(order[size_t(i)]);
    } else {
      for (int64_t i = 0; i < vocab; i++) all += weight(int32_t(i));
    }
    const double target = double(params.top_p) * all;
    int64_t sorted_len = keep < vocab ? keep : 0;
    probs.clear();
    double cum = 0;
    int64_t cut = 0;
    for (int64_t want = std::min<int64_t>(64, keep); cut == 0; want = std::min<int64_t>(want * 4, keep)) {
      if (want > sorted_len) {
        std::partial_sort(order.begin() + sorted_len, order.begin() + want, order.end(), by_logit);
        sorted_len = want;
      }
      for (int64_t i = int64_t(probs.size()); i < want; i++) {
        probs.push_back(float(weight(order[size_t(i)])));
        cum += probs.back();
        if (cum >= target) {
          cut = i + 1;
          break;
        }
      }
      if (want == keep && cut == 0) cut = keep;  // rounding left the target just out of reach
    }
    keep = cut;
    total = 0;
    for (int64_t i = 0; i < keep; i++) total += probs[size_t(i)];
  } else {
    if (keep < vocab) std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
    probs.resize(size_t(keep));
    for (int64_t i = 0; i < keep; i++) {
      probs[size_t(i)] = float(weight(sorted ? order[size_t(i)] : int32_t(i)));
      total += probs[size_t(i)];
    }
  }
  return {keep, sorted, total};
}

// Position of the draw u * total in the cumulative weights. If rounding runs out before it, the
// last candidate with any weight: never one of weight 0 (a masked token, or a rejected draft).
int64_t pick(const std::vector<float>& probs, int64_t keep, double target) {
  double acc = 0;
  int64_t last = keep - 1;
  for (int64_t i = 0; i < keep; i++) {
    if (probs[size_t(i)] > 0.f) last = i;
    acc += probs[size_t(i)];
    if (target < acc) return i;
  }
  return last;
}

// The top_n tokens by logit (ties by id) and their log-softmax values; -1 / -inf past the vocabulary.
void top_alternatives(const float* logits, int64_t vocab, double lse, int top_n, int32_t* top_ids, float* top_logprobs,
                      std::vector<int32_t>& order) {
  if (top_n > 0) {
    const int64_t n = std::min<int64_t>(top_n, vocab);
    order.resize(size_t(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < top_n; i++) {
      if (i < n) {
        top_ids[i] = order[size_t(i)];
        top_logprobs[i] = float(double(logits[order[size_t(i)]]) - lse);
      } else {
        top_ids[i] = -1;
        top_logprobs[i] = -INFINITY;
      }
    }
  }
}

}  // namespace

SampledToken sample_token(const float* logits, int64_t vocab, int32_t best, float log_sum_exp,
                          const SamplingParams& params, Rng& rng, int top_n, int32_t* top_ids, float* top_logprobs,
                          std::vector<float>& probs, std::vector<int32_t>& order) {
  const double lse = log_sum_exp;

  SampledToken out;
  if (params.temperature <= 0.f || params.top_k == 1) {
    out.token = best;
  } else {
    const Candidates c = candidates(logits, vocab, best, params, probs, order);
    out.token = c.id(order, pick(probs, c.keep, rng.next_double() * c.total));
  }
  out.logprob = float(double(logits[out.token]) - lse);
  top_alternatives(logits, vocab, lse, top_n, top_ids, top_logprobs, order);
  return out;
}

DraftVerdict verify_draft_token(const float* logits, int64_t vocab, int32_t best, float log_sum_exp,
                                const SamplingParams& params, Rng& rng, int32_t draft, int top_n, int32_t* top_ids,
                                float* top_logprobs, std::vector<float>& probs, std::vector<int32_t>& order) {
  DraftVerdict v;
  if (params.temperature <= 0.f || params.top_k == 1) {
    v.accepted = draft == best;
    v.token.token = best;
  } else {
    const Candidates c = candidates(logits, vocab, best, params, probs, order);
    int64_t at = -1;
    for (int64_t i = 0; i < c.keep && at < 0; i++)
      if (c.id(order, i) == draft) at = i;
    const double w = at >= 0 ? double(probs[size_t(at)]) : 0.0;
    // Accepted with probability p(draft) = w / total.
    if (rng.next_double() * c.total < w || c.total - w <= 0) {
      v.accepted = true;
      v.token.token = draft;
    } else {
      // Rejected: a draw from p with the draft's weight removed (p(y) / (1 - p(draft)) for y != draft).
      if (at >= 0) probs[size_t(at)] = 0.f;
      v.token.token = c.id(order, pick(probs, c.keep, rng.next_double() * (c.total - w)));
    }
  }
  v.token.logprob = float(double(logits[v.token.token]) - double(log_sum_exp));
  top_alternatives(logits, vocab, log_sum_exp, top_n, top_ids, top_logprobs, order);
  return v;
}

}  // namespace sluice
