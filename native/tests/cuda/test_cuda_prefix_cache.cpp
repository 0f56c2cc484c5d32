// The prefix cache on the CUDA backend: hits at block granularity (the same counts as on the CPU:
// the pool and the hashes are the backend-independent part), running sequences sharing blocks
// read-only, eviction under pressure, and outputs that match a cache-off CUDA engine within the
// CUDA tolerances (cuda_test_util.h): a cached prefix's KV was computed in another chunk, which
// on the GPU may round differently. Exits 77 (skipped) without a device.
#include <cuda_runtime.h>

#include <cstdlib>

#include "cuda/cuda_test_util.h"
#include "sluice/engine.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_cuda_test::compare;
using sluice_cuda_test::generate;
using sluice_cuda_test::load;
using sluice_cuda_test::Step;
using sluice_cuda_test::temp_dir;
using sluice_test::prompt_of;

namespace {

constexpr int kBlock = 16;  // tokens per KV block (cuda_test_util's load)
const SamplingParams kGreedy{0.f, 1.f, 0, 0, 2};

std::string model_dir() {
  static const std::string dir = [] {
    std::string d = temp_dir("prefix");
    sluice_test::write_tiny_model(d, sluice_test::TinyModelSpec{});
    return d;
  }();
  return dir;
}

// KV bytes of `blocks` blocks of the tiny model, measured from a probe engine's pool.
size_t bytes_for_blocks(int64_t blocks) {
  auto probe = load(model_dir(), "cuda", true, size_t(8) << 20);
  const EngineInfo info = probe->info();
  return size_t(double(info.kv_cache_bytes) / double(info.num_blocks) * double(blocks)) + 1;
}

}  // namespace

TEST_CASE(cuda_shared_prefix_hits_at_block_granularity_and_matches_cache_off) {
  auto on = load(model_dir(), "cuda", true);
  auto off = load(model_dir(), "cuda", false);
  const int vocab = int(on->info().config.vocab_size);
  CHECK(on->info().prefix_caching && !off->info().prefix_caching);
  const auto base = prompt_of(2 * kBlock + 7, 1, vocab);  // 39 tokens
  const auto first = generate(*on, base, 6, 0, 1000);
  compare(generate(*off, base, 6, 0, 1000), first, "first run");
  // 39 prompt + 5 sampled tokens computed: two whole blocks cached (the third is partial).
  CHECK(on->info().num_cached_blocks == 2 && on->num_free_blocks() == on->info().num_blocks);
  // Shares 35 tokens with base: its two whole blocks come from the cache.
  auto other = base;
  other.resize(2 * kBlock + 3);
  for (int t : {5, 6, 7, 8, 9, 10}) other.push_back(t);
  CHECK(on->add_sequence(50, other, kGreedy) == 2 * kBlock);
  CHECK(on->num_sequence_blocks(50) == 2);
  on->free_sequence(50);
  compare(generate(*off, other, 8, 0, 1000), generate(*on, other, 8, 0, 1000), "shared prefix");
  // A prompt of exactly two blocks: the last block is left to compute (its logits give the first token).
  auto exact = base;
  exact.resize(2 * kBlock);
  CHECK(on->add_sequence(51, exact, kGreedy) == kBlock);
  on->free_sequence(51);
  // Differing first token: nothing shared.
  auto different = base;
  different[0] = (different[0] + 1) % vocab;
  CHECK(on->add_sequence(52, different, kGreedy) == 0);
  on->free_sequence(52);
  // With several sequences in the batch and prefill in chunks, the cached path still agrees.
  compare(generate(*off, other, 8, 3, 5), generate(*on, other, 8, 3, 5), "shared prefix, batched, chunked");
}

TEST_CASE(cuda_running_sequences_share_blocks_read_only) {
  auto on = load(model_dir(), "cuda", true, bytes_for_blocks(8));
  auto off = load(model_dir(), "cuda", false);
  const int vocab = int(on->info().config.vocab_size);
  CHECK(on->info().num_blocks >= 8);
  const int64_t total = on->info().num_blocks;
  const auto prompt = prompt_of(2 * kBlock + 8, 3, vocab);  // 40 tokens: blocks 0, 1 full, 2 partial
  on->add_sequence(1, prompt, kGreedy);
  std::vector<int32_t> a{on->step({{1}, {uint32_t(prompt.size())}}).tokens.at(0)}, b;
  CHECK(on->num_free_blocks() == total - 3);
  // A second sequence with the same prompt shares blocks 0 and 1 while the first still runs.
  CHECK(on->add_sequence(2, prompt, kGreedy) == 2 * kBlock);
  CHECK(on->num_free_blocks() == total - 3);  // the shared blocks were in use already
  for (int i = 0; i < 6; i++) {
    const StepResult r = on->step({{1, 2}, {1, uint32_t(i == 0 ? 8 : 1)}});
    CHECK(r.seq_ids.size() == 2);
    a.push_back(r.tokens[0]);
    b.push_back(r.tokens[1]);
  }
  on->free_sequence(1);  // the other holder keeps the shared blocks
  const StepResult r = on->step({{2}, {1}});
  CHECK(r.seq_ids.size() == 1);
  b.push_back(r.tokens[0]);
  on->free_sequence(2);
  CHECK(on->num_free_blocks() == total);
  const std::vector<Step> ref = generate(*off, prompt, 7, 0, 1000);
  std::vector<Step> got_a, got_b;
  for (size_t i = 0; i < ref.size(); i++) {
    got_a.push_back(ref[i]), got_a.back().token = a[i];
    got_b.push_back(ref[i]), got_b.back().token = b[i];
  }
  // Tokens only (the steps above did not ask for logprobs): the first divergence must be a near tie.
  compare(ref, got_a, "first holder");
  compare(ref, got_b, "second holder");
}

TEST_CASE(cuda_eviction_under_pressure_keeps_outputs) {
  // A pool of 12 blocks and prompts of 3 blocks each: the fifth prompt evicts the oldest cached
  // prefix (least recently used), whose next run then misses; every output matches cache off.
  auto on = load(model_dir(), "cuda", true, bytes_for_blocks(12));
  auto off = load(model_dir(), "cuda", false);
  const int vocab = int(on->info().config.vocab_size);
  const int64_t total = on->info().num_blocks;
  CHECK(total >= 12 && total < 16);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 5; p++) prompts.push_back(prompt_of(3 * kBlock + 2, 40 + p, vocab));
  for (int p = 0; p < 5; p++) compare(generate(*off, prompts[size_t(p)], 3, 0, 1000), generate(*on, prompts[size_t(p)], 3, 0, 1000), "fill");
  CHECK(on->info().num_cached_blocks <= total);
  // The most recent prompt hits all three of its blocks; the first one was evicted (at least its leaf).
  CHECK(on->add_sequence(60, prompts[4], kGreedy) == 3 * kBlock);
  on->free_sequence(60);
  CHECK(on->add_sequence(61, prompts[0], kGreedy) < 3 * kBlock);
  on->free_sequence(61);
  compare(generate(*off, prompts[0], 6, 0, 1000), generate(*on, prompts[0], 6, 0, 1000), "after eviction");
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda prefix cache")) return rc;
  const int rc = sluice_test::run_all("cuda prefix cache");
  std::system(("rm -rf /tmp/sluice-cuda-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
