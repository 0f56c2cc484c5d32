// Prefix cache: block hash golden vectors, the block pool's reference counts and LRU eviction,
// and the engine's reuse of cached prefixes (outputs bit-identical to a cache-off engine, also
// under eviction pressure with preemptions).
#include <unistd.h>

#include <cstring>
#include <deque>
#include <algorithm>
#include <random>

#include "engine_driver.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::prompt_of;
using sluice_test::temp_dir;
using sluice_test::run_sequence;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;

namespace {


// Tiny model: 2048 bytes per KV block of 4 tokens.
constexpr size_t kBlockBytes = 2048;

std::unique_ptr<Engine> load(const std::string& dir, bool prefix_caching, int64_t num_blocks = 4096) {
  EngineOptions o;
  o.model_dir = dir;
  o.kv_cache_bytes = kBlockBytes * size_t(num_blocks);
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  return Engine::load(o);
}

std::string model_dir() {
  static const std::string dir = [] {
    std::string d = temp_dir("prefix");
    write_tiny_model(d, TinyModelSpec{});
    return d;
  }();
  return dir;
}

const SamplingParams kGreedy{0.f, 1.f, 0, 0, 2};

bool same_steps(const std::vector<sluice_test::SampledStep>& a, const std::vector<sluice_test::SampledStep>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i].token != b[i].token || std::memcmp(&a[i].logprob, &b[i].logprob, sizeof(float)) != 0 ||
        a[i].top_ids != b[i].top_ids)
      return false;
  return true;
}

}  // namespace

TEST_CASE(block_hash_golden_vectors) {
  const int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5}, minus_one[1] = {-1};
  const HashKey zero{0, 0};
  HashKey paper{};  // the SipHash paper's key: bytes 00..0f
  {
    uint8_t kb[16];
    for (int i = 0; i < 16; i++) kb[i] = uint8_t(i);
    std::memcpy(paper.data(), kb, 16);  // little-endian words (x86-64, as the build assumes)
  }
  // SipHash-2-4 itself, on the paper's test vector (message 00..0e).
  uint8_t msg[15];
  for (int i = 0; i < 15; i++) msg[i] = uint8_t(i);
  CHECK(SipHasher(paper).bytes(msg, 15).finish() == 0xa129ca6149be45e5ull);
  // Fed in pieces, the same.
  CHECK(SipHasher(paper).bytes(msg, 3).bytes(msg + 3, 12).finish() == 0xa129ca6149be45e5ull);

  // Golden values from the independent reference native/tests/reference/block_hash.py. A change
  // here invalidates every stored or exchanged prefix hash.
  const BlockHash root = root_block_hash(zero, 0, "");
  CHECK(root.value == 0x1af9084ce513de87ull);
  const BlockHash h1 = hash_block(zero, root, a, 4, 0);
  const BlockHash h2 = hash_block(zero, h1, a, 4, 0);
  CHECK(h1.value == 0xab2f1ce03d03f493ull);
  CHECK(h2.value == 0xce4120c6fff2d052ull);
  CHECK(root_block_hash(paper, 0, "").value == 0x976e3d5d45222632ull);
  CHECK(root_block_hash(zero, 0, "org_a").value == 0x749091f66f5bfffdull);
  CHECK(hash_block(zero, root, a, 4, 9).value == 0x39fdf41f9bd6f386ull);
  CHECK(hash_block(zero, root, minus_one, 1, 0).value == 0x060bc403277b7c34ull);
  CHECK(fnv1a64("sluice") == 0xf9a02fd5dc574c88ull);
  // Every input matters: parent, each token, the count, the extra key, the key, the scope.
  CHECK(hash_block(zero, root, a, 4, 0) == h1);
  CHECK(h2 != h1);
  CHECK(hash_block(zero, root, b, 4, 0) != h1);
  CHECK(hash_block(zero, root, a, 3, 0) != h1);
  CHECK(hash_block(zero, root, a, 4, 1) != h1);
  CHECK(hash_block(paper, root, a, 4, 0) != h1);
  CHECK(root_block_hash(zero, 1, "") != root);
  CHECK(root_block_hash(zero, 0, "org_a") != root_block_hash(zero, 0, "org_b"));
  // The scope's length is hashed, so scope/extra boundaries cannot be shifted to collide.
  CHECK(root_block_hash(zero, 0, std::string("a\0", 2)) != root_block_hash(zero, 0, "a"));
}

TEST_CASE(pool_ref_counts_lookup_and_lru_eviction) {
  BlockPool pool(4);
  std::vector<int32_t> a, b;
  CHECK(pool.allocate(3, &a) && a == (std::vector<int32_t>{0, 1, 2}));
  const BlockHash h0{100}, h1{101}, h2{102};
  CHECK(pool.register_block(0, h0) && pool.register_block(1, h1) && pool.register_block(2, h2));
  CHECK(!pool.register_block(0, BlockHash{200}));  // already cached
  CHECK(pool.num_cached() == 3 && pool.num_free() == 1);
  // A second holder shares block 0.
  CHECK(pool.lookup(h0) == 0 && pool.lookup(BlockHash{999}) == -1);
  pool.acquire(0);
  CHECK(pool.ref_count(0) == 2);
  // Released tail first: 2 then 1 become evictable (2 evicted first); 0 is still held once.
  pool.release({2, 1, 0});
  CHECK(pool.ref_count(0) == 1 && pool.num_evictable() == 2 && pool.num_free() == 3);
  // Reusing an evictable block takes it off the LRU list.
  pool.acquire(1);
  CHECK(pool.num_evictable() == 1 && pool.num_free() == 2);
  // Allocation takes the free block first (3), then evicts block 2, dropping its hash.
  CHECK(pool.allocate(2, &b) && b == (std::vector<int32_t>{3, 2}));
  CHECK(pool.lookup(h2) == -1 && !pool.is_cached(2) && pool.lookup(h1) == 1 && pool.lookup(h0) == 0);
  CHECK(!pool.allocate(1, &b) && b.size() == 2);  // nothing free or evictable: refused, nothing taken
  // A hash already cached keeps its block: the duplicate stays uncached and is freed plainly.
  CHECK(!pool.register_block(3, h0));
  pool.release({3});
  CHECK(pool.num_free() == 1 && pool.num_evictable() == 0);
  CHECK_THROWS_CODE(pool.release({3}), ErrorCode::kInternal);
  pool.release({0, 1, 2});
  CHECK(pool.num_free() == 4 && pool.num_evictable() == 2 && pool.num_cached() == 2);
  pool.clear_cache();
  CHECK(pool.num_free() == 4 && pool.num_evictable() == 0 && pool.lookup(h0) == -1);
}

TEST_CASE(pool_evicts_unkeyed_lru_before_keyed_lru) {
  BlockPool pool(6);
  std::vector<int32_t> a, b;
  CHECK(pool.allocate(6, &a));
  for (int32_t i = 0; i < 6; i++) CHECK(pool.register_block(i, BlockHash{uint64_t(300 + i)}));
  // Block 4 is shared by a keyed and an unkeyed holder; the unkeyed one releases it last.
  pool.acquire(4);
  pool.release({0}, true);   // keyed, released first
  pool.release({1});         // unkeyed
  pool.release({2}, true);   // keyed
  pool.release({3});         // unkeyed
  pool.release({4}, true);   // keyed holder of the shared block (still held once)
  pool.release({4});         // unkeyed holder: keyed wins
  CHECK(pool.num_evictable() == 5 && pool.num_keyed_evictable() == 3 && pool.num_free() == 5);
  // Eviction order: unkeyed LRU (1, 3), then keyed LRU (0, 2, 4).
  CHECK(pool.allocate(5, &b) && b == (std::vector<int32_t>{1, 3, 0, 2, 4}));
  CHECK(pool.num_cached() == 1 && pool.lookup(BlockHash{305}) == 5);
  // Reacquiring an evictable keyed block resets its class: released unkeyed, it is unkeyed.
  pool.release({5}, true);
  CHECK(pool.num_keyed_evictable() == 1);
  pool.acquire(5);
  pool.release({5});
  CHECK(pool.num_keyed_evictable() == 0 && pool.num_evictable() == 1);
  // A reallocated block starts unkeyed: freed uncached, it goes to the free list.
  pool.release(b, true);
  CHECK(pool.num_evictable() == 1 && pool.num_free() == 6);
  pool.clear_cache();
  CHECK(pool.num_free() == 6 && pool.num_evictable() == 0 && pool.num_keyed_evictable() == 0);
}

TEST_CASE(keyed_prefix_outlives_unkeyed_prefix_under_pressure) {
  // 12 blocks of 4 tokens. Two 9-token prompts (2 cached blocks each, one keyed, the keyed one
  // released first), then a 33-token prompt that needs 9 blocks: 8 free, so exactly one cached
  // block is evicted. Plain LRU would take the keyed prefix's leaf; the retention class takes
  // the unkeyed one's.
  auto on = load(model_dir(), true, 12);
  const int vocab = int(on->info().config.vocab_size);
  auto prefill = [&](uint32_t id, const std::vector<int32_t>& prompt, bool keyed) {
    on->add_sequence(id, prompt, kGreedy, keyed);
    StepPlan plan;
    plan.seq_ids = {id};
    plan.num_tokens = {uint32_t(prompt.size())};
    on->step(plan);
    on->free_sequence(id);
  };
  const auto keyed = prompt_of(9, 11, vocab), unkeyed = prompt_of(9, 12, vocab);
  prefill(1, keyed, true);
  prefill(2, unkeyed, false);
  prefill(3, prompt_of(33, 5, vocab), false);
  CHECK(on->add_sequence(10, keyed, kGreedy) == 8);    // keyed prefix intact
  CHECK(on->add_sequence(11, unkeyed, kGreedy) == 4);  // unkeyed lost its leaf block
}

TEST_CASE(shared_prefix_hits_at_block_granularity_with_identical_outputs) {
  auto on = load(model_dir(), true);
  auto off = load(model_dir(), false);
  const int vocab = int(on->info().config.vocab_size);
  CHECK(on->info().prefix_caching && !off->info().prefix_caching);
  const auto base = prompt_of(11, 1, vocab);
  const auto first = run_sequence(*on, base, 6, 0, 1000, kGreedy);
  CHECK(same_steps(first, run_sequence(*off, base, 6, 0, 1000, kGreedy)));
  // base's computed tokens (11 prompt + 5 sampled) filled 4 blocks, all cached and evictable now.
  CHECK(on->info().num_cached_blocks == 4 && on->num_free_blocks() == on->info().num_blocks);
  // Shares 9 tokens with base: two whole blocks (8 tokens) are served from the cache.
  auto other = base;
  other.resize(9);
  for (int t : {5, 6, 7, 8, 9}) other.push_back(t);
  CHECK(on->add_sequence(50, other, kGreedy) == 8);
  CHECK(on->num_sequence_blocks(50) == 2);
  on->free_sequence(50);
  CHECK(same_steps(run_sequence(*on, other, 8, 0, 1000, kGreedy), run_sequence(*off, other, 8, 0, 1000, kGreedy)));
  // The whole prompt cached: the last block is left to compute (its logits give the first token).
  auto exact = base;
  exact.resize(8);
  CHECK(on->add_sequence(51, exact, kGreedy) == 4);
  on->free_sequence(51);
  // Prompt + generated tokens (as a preempted sequence is re-added): 15 of 16 would be cached, 12 are.
  auto resumed = base;
  for (size_t i = 0; i + 1 < first.size(); i++) resumed.push_back(first[i].token);
  CHECK(on->add_sequence(52, resumed, kGreedy) == 12);
  on->free_sequence(52);
  CHECK(on->add_sequence(53, {base[0], base[1], base[2], base[3]}, kGreedy) == 0);  // < one block + 1
  on->free_sequence(53);
  // Differing first token: nothing shared, whatever follows.
  auto different = base;
  different[0] = (different[0] + 1) % vocab;
  CHECK(on->add_sequence(54, different, kGreedy) == 0);
  on->free_sequence(54);
  CHECK(off->add_sequence(55, base, kGreedy) == 0);
  off->free_sequence(55);
}

TEST_CASE(running_sequences_share_blocks_read_only) {
  auto on = load(model_dir(), true, 8);
  auto off = load(model_dir(), false, 8);
  const int vocab = int(on->info().config.vocab_size);
  const auto prompt = prompt_of(10, 3, vocab);
  on->add_sequence(1, prompt, kGreedy);
  std::vector<int32_t> a{on->step({{1}, {10}}).tokens.at(0)}, b;  // blocks 0, 1 full and cached; 2 partial
  CHECK(on->num_free_blocks() == 5);
  // A second sequence with the same prompt shares blocks 0 and 1 while the first still runs.
  CHECK(on->add_sequence(2, prompt, kGreedy) == 8);
  CHECK(on->num_free_blocks() == 5);  // shared blocks were in use already: nothing taken
  for (int i = 0; i < 6; i++) {
    const StepResult r = on->step({{1, 2}, {1, uint32_t(i == 0 ? 2 : 1)}});
    CHECK(r.seq_ids.size() == 2);
    a.push_back(r.tokens[0]);
    b.push_back(r.tokens[1]);
  }
  // Freeing one holder keeps the shared blocks for the other.
  on->free_sequence(1);
  const StepResult r = on->step({{2}, {1}});
  CHECK(r.seq_ids.size() == 1);
  b.push_back(r.tokens[0]);
  on->free_sequence(2);
  CHECK(on->num_free_blocks() == 8);
  std::vector<int32_t> ref;
  for (const auto& s : run_sequence(*off, prompt, 7, 0, 1000, kGreedy)) ref.push_back(s.token);
  CHECK(a == ref && b == ref);
}

// Many sequences over a few shared prefixes through a pool far smaller than their sum: admission,
// chunked prefill, preemption (free + re-add with prompt + generated tokens) and eviction under
// pressure. Every greedy output must equal the sequence's output alone on a cache-off engine.
TEST_CASE(stress_small_pool_outputs_equal_cache_off) {
  const int64_t num_blocks = 20, bs = 4;
  auto on = load(model_dir(), true, num_blocks);
  auto off = load(model_dir(), false);
  const int vocab = int(on->info().config.vocab_size);
  std::mt19937 rng(7);
  struct Sim {
    std::vector<int32_t> prompt;
    int n = 0;
    std::vector<int32_t> generated;
    uint32_t id = 0;
    int64_t num_known = 0, num_computed = 0;
  };
  std::vector<Sim> sims(36);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 4; p++) prefixes.push_back(prompt_of(6 + 3 * p, 20 + p, vocab));
  for (auto& s : sims) {
    s.prompt = prefixes[rng() % prefixes.size()];
    const int extra = int(rng() % 7);
    for (int t = 0; t < extra; t++) s.prompt.push_back(int32_t(rng() % uint32_t(vocab)));
    s.n = 4 + int(rng() % 9);
  }
  std::deque<Sim*> waiting;
  for (auto& s : sims) waiting.push_back(&s);
  std::vector<Sim*> running;
  uint32_t next_id = 1;
  int64_t num_hit_tokens = 0, num_preemptions = 0, num_steps = 0;
  auto blocks_for = [&](int64_t tokens) { return (tokens + bs - 1) / bs; };
  auto preempt = [&](Sim* s) {
    on->free_sequence(s->id);
    running.erase(std::find(running.begin(), running.end(), s));
    waiting.push_front(s);
    num_preemptions++;
  };
  while (!waiting.empty() || !running.empty()) {
    // Admit while the whole prompt fits in the free (or evictable) blocks, at most 5 running.
    while (!waiting.empty() && running.size() < 5) {
      Sim* s = waiting.front();
      std::vector<int32_t> known = s->prompt;
      known.insert(known.end(), s->generated.begin(), s->generated.end());
      if (blocks_for(int64_t(known.size())) > on->num_free_blocks()) break;
      waiting.pop_front();
      s->id = next_id++;
      s->num_computed = on->add_sequence(s->id, known, kGreedy);
      s->num_known = int64_t(known.size());
      num_hit_tokens += s->num_computed;
      running.push_back(s);
    }
    // Plan: oldest first, chunks of 3; preempt the youngest while the plan does not fit.
    StepPlan plan;
    for (;;) {
      plan = {};
      int64_t need = 0;
      for (Sim* s : running) {
        const int64_t count = std::min<int64_t>(3, s->num_known - s->num_computed);
        need += std::max<int64_t>(0, blocks_for(s->num_computed + count) - on->num_sequence_blocks(s->id));
        plan.seq_ids.push_back(s->id);
        plan.num_tokens.push_back(uint32_t(count));
      }
      if (need <= on->num_free_blocks()) break;
      preempt(running.back());
    }
    CHECK(!plan.seq_ids.empty());
    if (plan.seq_ids.empty()) break;
    const StepResult r = on->step(plan);
    num_steps++;
    for (size_t i = 0; i < running.size(); i++) running[i]->num_computed += plan.num_tokens[i];
    for (size_t j = 0; j < r.seq_ids.size(); j++) {
      Sim* s = *std::find_if(running.begin(), running.end(), [&](Sim* x) { return x->id == r.seq_ids[j]; });
      s->generated.push_back(r.tokens[j]);
      s->num_known++;
    }
    for (size_t i = running.size(); i-- > 0;) {
      Sim* s = running[i];
      if (int(s->generated.size()) < s->n) continue;
      on->free_sequence(s->id);
      running.erase(running.begin() + int64_t(i));
    }
  }
  std::printf("  stress: %lld steps, %lld prompt tokens from the cache, %lld preemptions\n", (long long)num_steps,
              (long long)num_hit_tokens, (long long)num_preemptions);
  CHECK(num_hit_tokens > 0 && num_preemptions > 0);
  CHECK(on->num_free_blocks() == num_blocks);
  int mismatches = 0;
  for (auto& s : sims) {
    std::vector<int32_t> ref;
    for (const auto& step : run_sequence(*off, s.prompt, s.n, 0, 1000, kGreedy)) ref.push_back(step.token);
    if (ref != s.generated) mismatches++;
  }
  CHECK(mismatches == 0);
}

int main() {
  int rc = sluice_test::run_all("prefix_cache");
  std::system(("rm -rf /tmp/sluice-native-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
