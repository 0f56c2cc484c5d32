// Speculative decoding in the engine (StepPlan::drafts, issue 35): a decode row computes its
// pending token and the proposed drafts in one chunk and verifies them. Greedy rows gain exactly
// the tokens, logprobs and top alternatives a token-by-token run gives (the CPU kernels are chunk
// invariant), whatever the drafts; rejected drafts leave nothing behind (blocks given back, no
// block hashed with a rejected token: a later prefix hit matches a plain run's); sampled rows
// follow the plain run's distribution (two-sample chi-square over seeds); a failing row gains
// nothing; drafts that do not apply are ignored and bad ones fail their row. (Sliding-window
// families, whose window blocks are given back too, are covered through the addon:
// test/speculative-engine.test.ts, since the tiny writer here makes Llama-family models only.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/engine.h"
#include "sluice/error.h"
#include "speculative_driver.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::temp_dir;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;
using namespace sluice_test;

namespace {

constexpr size_t kBlockBytes = 2048;  // the tiny model's KV block of 4 tokens

std::string model_dir(const std::string& name, const TinyModelSpec& spec) {
  const std::string d = temp_dir(name);
  write_tiny_model(d, spec);
  return d;
}

const std::string& llama_dir() {
  static const std::string d = model_dir("llama", TinyModelSpec{});
  return d;
}

std::unique_ptr<Engine> load(const std::string& dir, bool prefix_caching = false, int64_t num_blocks = 512) {
  EngineOptions o;
  o.model_dir = dir;
  o.kv_cache_bytes = kBlockBytes * size_t(num_blocks);
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  return Engine::load(o);
}


TEST_CASE(cpu_engine_verifies_drafts) {
  auto e = load(llama_dir());
  CHECK(e->info().draft_verification);
}

TEST_CASE(greedy_rows_gain_what_a_plain_run_gains_whatever_the_drafts) {
  auto e = load(llama_dir());
  const std::vector<int32_t> prompt = prompt_of(11, 1);
  const int n = 30;
  const Emitted plain = generate(*e, 0, prompt, n, kGreedy, nullptr);
  e->free_sequence(0);
  CHECK(int(plain.tokens.size()) == n);
  const int64_t free_after_plain = e->num_free_blocks();
  struct Case {
    const char* name;
    int k, right;
  };
  for (const Case c : {Case{"all right", 4, 4}, Case{"all wrong", 4, 0}, Case{"right then wrong", 4, 2}, Case{"one right", 1, 1},
                       Case{"seven, three right", 7, 3}}) {
    const Emitted spec = generate(*e, 1, prompt, n, kGreedy, from_reference(prompt, plain.tokens, c.k, c.right, 96), c.k);
    std::printf("  %s: %d steps (plain %d), %d drafted, %d accepted\n", c.name, spec.steps, plain.steps, spec.drafted,
                spec.accepted);
    CHECK(same(spec, plain));
    CHECK(spec.drafted > 0);
    if (c.right == c.k) CHECK(spec.accepted == spec.drafted && spec.steps <= plain.steps / (1 + c.k) + 2);
    if (c.right == 0) CHECK(spec.accepted == 0 && spec.steps == plain.steps);
    if (c.right > 0 && c.right < c.k) CHECK(spec.accepted > 0 && spec.accepted < spec.drafted);
    // The sequence holds only its computed tokens' blocks (all but the pending one); freed, the
    // pool is whole again.
    CHECK(e->num_sequence_blocks(1) == (int64_t(prompt.size()) + spec.generated - 1 + 3) / 4);
    e->free_sequence(1);
    CHECK(e->num_free_blocks() == free_after_plain);
  }
}

TEST_CASE(rejected_drafts_are_never_hashed_into_the_prefix_cache) {
  const std::vector<int32_t> prompt = prompt_of(9, 2);
  const int n = 26;
  // The plain run, then a prompt that extends its tokens: the cached prefix a plain engine serves.
  auto plain_engine = load(llama_dir(), true);
  const Emitted plain = generate(*plain_engine, 0, prompt, n, kGreedy, nullptr);
  plain_engine->free_sequence(0);
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), plain.tokens.begin(), plain.tokens.end());
  longer.push_back(5);
  const int64_t plain_hit = plain_engine->add_sequence(9, longer, kGreedy);
  // Every draft wrong, so every step computes rejected tokens into blocks it then gives back.
  auto spec_engine = load(llama_dir(), true);
  const Emitted spec = generate(*spec_engine, 0, prompt, n, kGreedy, from_reference(prompt, plain.tokens, 5, 1, 96), 5);
  CHECK(same(spec, plain));
  spec_engine->free_sequence(0);
  const int64_t spec_hit = spec_engine->add_sequence(9, longer, kGreedy);
  std::printf("  prefix hit: plain %lld, speculative %lld tokens\n", (long long)plain_hit, (long long)spec_hit);
  CHECK(plain_hit > int64_t(prompt.size()));
  CHECK(spec_hit == plain_hit);
  // And a prompt that follows a rejected draft hits no more than its true prefix.
  std::vector<int32_t> wrong = prompt;
  wrong.insert(wrong.end(), plain.tokens.begin(), plain.tokens.begin() + 8);
  wrong.push_back((plain.tokens[8] + 2) % 96);
  for (int i = 0; i < 6; i++) wrong.push_back(1);
  CHECK(spec_engine->add_sequence(10, wrong, kGreedy) <= int64_t(prompt.size()) + 8);
}


TEST_CASE(sampled_rows_follow_the_plain_distribution) {
  auto e = load(llama_dir());
  const SampledRuns r = sample_with_and_without_drafts(*e, prompt_of(7, 4), 96, 3000, 3);
  std::printf("  %d of %d drafts accepted\n", r.accepted, r.drafted);
  CHECK(r.accepted > r.drafted / 10 && r.accepted < r.drafted * 9 / 10);
  for (size_t i = 0; i < r.plain.size(); i++) {
    const auto [stat, df] = chi2_two_sample(r.plain[i], r.spec[i]);
    std::printf("  token %zu: chi-square %.1f, df %d, critical %.1f\n", i + 1, stat, df, chi2_critical(df));
    CHECK(df >= 3);
    CHECK(stat < chi2_critical(df));
  }
}

TEST_CASE(a_failing_verifying_row_gains_nothing) {
  auto e = load(llama_dir());
  const std::vector<int32_t> prompt = prompt_of(10, 5);
  const Emitted plain = generate(*e, 0, prompt, 3, kGreedy, nullptr);
  e->inject_fault(0, FaultPoint::kSampleRow);
  StepPlan plan;
  plan.seq_ids = {0};
  plan.num_tokens = {7};
  plan.num_drafts = {6};
  plan.drafts = {1, 2, 3, 4, 5, 6};
  const StepResult r = e->step(plan);
  CHECK(r.row_status[0] == uint8_t(RowStatus::kFailed));
  CHECK(r.seq_ids.empty() && r.errors.size() == 1);
  CHECK(r.row_computed[0] == 1 && r.row_pending[0] == 0);
  // Blocks for the computed tokens only (10 prompt + 3 generated, all computed), not the 5 the
  // drafts' positions took.
  CHECK(e->num_sequence_blocks(0) == 4);
  (void)plain;
}

TEST_CASE(drafts_that_do_not_apply_are_ignored_and_bad_ones_fail_their_row) {
  auto e = load(llama_dir());
  const std::vector<int32_t> prompt = prompt_of(10, 6);
  e->add_sequence(0, prompt, kGreedy);
  e->add_sequence(1, prompt, kGreedy);
  // A prefill row ignores its drafts.
  StepPlan plan;
  plan.seq_ids = {0, 1};
  plan.num_tokens = {10, 10};
  plan.num_drafts = {2, 0};
  plan.drafts = {1, 2};
  StepResult r = e->step(plan);
  CHECK(r.row_drafted[0] == 0 && r.seq_ids.size() == 2 && r.row_computed[0] == 10);
  // The bound cuts them (1 + 1 here), a constrained row ignores them, a draft outside the
  // vocabulary fails its row alone.
  plan.num_tokens = {2, 4};
  plan.num_drafts = {3, 1};
  plan.drafts = {5, 6, 7, 96};
  r = e->step(plan);
  CHECK(r.row_drafted[0] == 1);
  CHECK(r.row_status[1] == uint8_t(RowStatus::kFailed) && r.errors.size() == 1);
  if (!r.errors.empty()) CHECK(r.errors[0].code == ErrorCode::kInvalidArgument && r.errors[0].seq_id == 1);
  // Drafts whose counts do not match the plan fail the step.
  plan.seq_ids = {0};
  plan.num_tokens = {3};
  plan.num_drafts = {3};
  plan.drafts = {1, 2};
  CHECK_THROWS_CODE(e->step(plan), ErrorCode::kInvalidArgument);
  plan.num_drafts = {1, 1};
  CHECK_THROWS_CODE(e->step(plan), ErrorCode::kInvalidArgument);
}

// A token mask that depends on the token before (as a grammar's does): t may follow p unless
// (7t + 3p) % 5 == 0. Rows: the masks after each of `prevs`.
bool rule_allows(int32_t t, int32_t prev) { return (t * 7 + prev * 3) % 5 != 0; }

struct RuleMasks : TokenMaskSource {
  std::vector<uint32_t> bits;
  explicit RuleMasks(const std::vector<int32_t>& prevs) : bits(prevs.size() * 3, 0) {
    for (size_t r = 0; r < prevs.size(); r++)
      for (int32_t t = 0; t < 96; t++)
        if (rule_allows(t, prevs[r])) bits[r * 3 + size_t(t / 32)] |= 1u << (t % 32);
  }
  const uint32_t* wait() override { return bits.data(); }
};

// Runs constrained sequence `id` to n tokens, each step's drafts from `propose` (masks after the
// pending token and after each draft, as a grammar that looks ahead gives them).
Emitted generate_constrained(Engine& e, uint32_t id, const std::vector<int32_t>& prompt, int n, const Proposer& propose) {
  Emitted out;
  std::vector<int32_t> known = prompt;
  e.add_sequence(id, prompt, kGreedy);
  bool first = true;
  while (int(out.tokens.size()) < n && out.steps < 4 * n) {
    StepPlan plan;
    plan.seq_ids = {id};
    std::vector<int32_t> d = first || !propose ? std::vector<int32_t>{} : propose(known);
    plan.num_tokens = {first ? uint32_t(prompt.size()) : uint32_t(1 + d.size())};
    plan.num_drafts = {uint32_t(d.size())};
    plan.drafts = d;
    std::vector<int32_t> prevs = {known.back()};
    prevs.insert(prevs.end(), d.begin(), d.end());
    plan.constrained = {id};
    plan.masks = std::make_shared<RuleMasks>(prevs);
    first = false;
    const StepResult r = e.step(plan);
    out.steps++;
    if (r.row_status[0] != uint8_t(RowStatus::kRan)) break;
    out.drafted += int(r.row_drafted[0]);
    out.accepted += int(r.row_accepted[0]);
    for (int32_t t : r.tokens) {
      CHECK(rule_allows(t, known.back()));  // each token under the mask of the token before it
      known.push_back(t);
      out.tokens.push_back(t);
    }
  }
  out.tokens.resize(std::min(out.tokens.size(), size_t(n)));
  e.free_sequence(id);
  return out;
}

TEST_CASE(constrained_rows_verify_drafts_under_the_mask_after_each) {
  auto e = load(llama_dir());
  const std::vector<int32_t> prompt = prompt_of(6, 7);
  const Emitted plain = generate_constrained(*e, 1, prompt, 24, nullptr);
  CHECK(plain.tokens.size() == 24);
  // Right drafts (the plain run's own continuation) are all kept...
  auto right = [&](const std::vector<int32_t>& known) {
    std::vector<int32_t> d;
    for (size_t j = known.size() - prompt.size(); j < plain.tokens.size() && d.size() < 3; j++) d.push_back(plain.tokens[j]);
    return d;
  };
  const Emitted spec = generate_constrained(*e, 2, prompt, 24, right);
  CHECK(spec.tokens == plain.tokens);
  CHECK(spec.drafted > 0 && spec.accepted == spec.drafted);
  // ... and a draft the mask refuses is rejected (its probability is 0) whatever its logit.
  auto refused_second = [&](const std::vector<int32_t>& known) {
    std::vector<int32_t> d = right(known);
    if (d.size() >= 2) {
      for (int32_t t = 0; t < 96; t++)
        if (!rule_allows(t, d[0])) {
          d[1] = t;
          break;
        }
    }
    return d;
  };
  const Emitted mixed = generate_constrained(*e, 3, prompt, 24, refused_second);
  CHECK(mixed.tokens == plain.tokens);
  CHECK(mixed.drafted > mixed.accepted && mixed.accepted > 0);
}

}  // namespace

int main() {
  const int rc = sluice_test::run_all("speculative");
  std::system(("rm -rf '" + temp_dir("") + "'").c_str());
  return rc;
}
