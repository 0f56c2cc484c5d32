// Speculative decoding on the CUDA backend (issue 35, phase 4): the block sampler verifies drafts
// (sampling.cu: greedy keeps the argmax, sampled rows keep a draft with its probability and else
// draw from the distribution without it). Greedy runs with right, wrong and half-right drafts give
// the plain CUDA run's tokens up to its first near tie (CUDA computes a verification chunk with the
// prefill kernels, a plain decode with the decode ones: the same up to bf16 rounding); sampled rows
// follow the plain run's distribution (two-sample chi-square over seeds); the wide sampler and
// pipelined steps do not verify. Exits 77 (ctest: skipped) without a CUDA device.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "speculative_driver.h"
#include "tiny_model_writer.h"

using namespace sluice;
using namespace sluice_test;

namespace {

const std::string& model() {
  static const std::string d = [] {
    const std::string dir = sluice_cuda_test::temp_dir("speculative-llama");
    TinyModelSpec spec;
    spec.dtype = "BF16";
    write_tiny_model(dir, spec);
    return dir;
  }();
  return d;
}

std::unique_ptr<Engine> cuda_engine() { return sluice_cuda_test::load(model(), "cuda", false); }

// Tokens of `a` and `b` agree up to the first position where `ref` (top-2 logprobs) had a near tie.
bool agree_until_near_tie(const Emitted& a, const Emitted& ref, int* compared) {
  const size_t n = std::min(a.tokens.size(), ref.tokens.size());
  for (size_t i = 0; i < n; i++) {
    const float gap = ref.top_logprobs.size() >= 2 * (i + 1) ? ref.top_logprobs[2 * i] - ref.top_logprobs[2 * i + 1] : 1.f;
    if (gap < sluice_cuda_test::kNearTie) {
      *compared = int(i);
      return true;  // past a near tie the runs may part
    }
    if (a.tokens[i] != ref.tokens[i]) {
      std::printf("  token %zu: %d, plain %d (gap %.3f)\n", i, a.tokens[i], ref.tokens[i], gap);
      *compared = int(i);
      return false;
    }
  }
  *compared = int(n);
  return true;
}

TEST_CASE(cuda_engine_verifies_drafts_with_the_block_sampler_only) {
  CHECK(cuda_engine()->info().draft_verification);
  EngineOptions o;
  o.model_dir = model();
  o.backend = "cuda";
  o.kv_cache_bytes = size_t(64) << 20;
  o.gpu_memory_utilization = 0.45;
  o.cuda_sampler = "wide";
  CHECK(!Engine::load(o)->info().draft_verification);
  o.cuda_sampler = "block";
  o.cuda_device_tokens = true;
  CHECK(!Engine::load(o)->info().draft_verification);
}

TEST_CASE(cuda_greedy_rows_gain_the_plain_runs_tokens) {
  auto e = cuda_engine();
  const std::vector<int32_t> prompt = prompt_of(11, 1);
  const int n = 30;
  const Emitted plain = generate(*e, 0, prompt, n, kGreedy, nullptr);
  e->free_sequence(0);
  CHECK(int(plain.tokens.size()) == n);
  struct Case {
    const char* name;
    int k, right;
  };
  for (const Case c : {Case{"all right", 4, 4}, Case{"all wrong", 4, 0}, Case{"right then wrong", 4, 2}}) {
    const Emitted spec = generate(*e, 1, prompt, n, kGreedy, from_reference(prompt, plain.tokens, c.k, c.right, 96), c.k);
    int compared = 0;
    const bool ok = agree_until_near_tie(spec, plain, &compared);
    std::printf("  %s: %d steps (plain %d), %d drafted, %d accepted, %d tokens compared\n", c.name, spec.steps, plain.steps,
                spec.drafted, spec.accepted, compared);
    CHECK(ok);
    CHECK(spec.drafted > 0);
    if (c.right == 0) CHECK(spec.accepted == 0);
    if (c.right == c.k && compared == n) CHECK(spec.accepted == spec.drafted);
    e->free_sequence(1);
  }
}

TEST_CASE(cuda_sampled_rows_follow_the_plain_distribution) {
  auto e = cuda_engine();
  const SampledRuns r = sample_with_and_without_drafts(*e, prompt_of(7, 4), 96, 3000, 2);
  std::printf("  %d of %d drafts accepted\n", r.accepted, r.drafted);
  CHECK(r.accepted > r.drafted / 10 && r.accepted < r.drafted * 9 / 10);
  const auto [stat, df] = chi2_two_sample(r.plain[0], r.spec[0]);
  std::printf("  second token: chi-square %.1f, df %d, critical %.1f\n", stat, df, chi2_critical(df));
  CHECK(df >= 3);
  CHECK(stat < chi2_critical(df));
}

}  // namespace

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda speculative")) return rc;
  return sluice_test::run_all("cuda speculative");
}
