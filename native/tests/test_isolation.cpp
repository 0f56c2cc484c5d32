// Failure isolation in the engine: a bad plan row, or a fault injected while one row of a busy
// step is prepared or sampled, fails that row only (the other rows produce exactly what they
// produce without the fault); a device fault breaks the engine for good with a reason; the thread
// pool survives a task that throws; sampling parameters that do not fit are refused per sequence;
// prefix-cache blocks are scoped (by organization) and keyed.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "cpu/thread_pool.h"
#include "engine_driver.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::prompt_of;
using sluice_test::temp_dir;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;

namespace {

std::string model_dir() {
  static const std::string dir = [] {
    std::string d = temp_dir("isolation");
    write_tiny_model(d, TinyModelSpec{});
    return d;
  }();
  return dir;
}

std::unique_ptr<Engine> load(bool prefix_caching = false, std::array<uint64_t, 2> key = {0, 0}) {
  EngineOptions o;
  o.model_dir = model_dir();
  o.kv_cache_bytes = size_t(8) << 20;
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  o.prefix_hash_key = key;
  return Engine::load(o);
}

constexpr int kSeqs = 6;
constexpr int kTokens = 6;
const SamplingParams kSampled{0.8f, 0.95f, 0, 0, 2};

// Runs kSeqs sequences (ids 1..kSeqs) together for kTokens samples each; a fault may be injected
// for one of them before the first step. Returns what each sampled, and the errors per sequence.
struct BusyRun {
  std::vector<std::vector<int32_t>> tokens;  // [kSeqs + 1] (index = seq id)
  std::vector<std::vector<RowError>> errors;
};

BusyRun run_busy(Engine& e, uint32_t faulty = 0, FaultPoint point = FaultPoint::kSampleRow) {
  const int vocab = int(e.info().config.vocab_size);
  BusyRun out{std::vector<std::vector<int32_t>>(kSeqs + 1), std::vector<std::vector<RowError>>(kSeqs + 1)};
  std::vector<int64_t> remaining(kSeqs + 1, 0);
  for (uint32_t id = 1; id <= kSeqs; id++) {
    SamplingParams p = kSampled;
    p.seed = 1000 + id;
    const auto prompt = prompt_of(5 + int(id) * 3, int(id), vocab);
    remaining[id] = int64_t(prompt.size()) - e.add_sequence(id, prompt, p);
  }
  if (faulty != 0) e.inject_fault(faulty, point);
  std::vector<bool> done(kSeqs + 1, false);
  for (int step = 0; step < 40; step++) {
    StepPlan plan;
    for (uint32_t id = 1; id <= kSeqs; id++) {
      if (done[id]) continue;
      plan.seq_ids.push_back(id);
      const uint32_t count = remaining[id] > 0 ? uint32_t(std::min<int64_t>(remaining[id], 4)) : 1;
      plan.num_tokens.push_back(count);
      remaining[id] = std::max<int64_t>(0, remaining[id] - count);
    }
    if (plan.seq_ids.empty()) break;
    const StepResult r = e.step(plan);
    for (size_t j = 0; j < r.seq_ids.size(); j++) {
      out.tokens[r.seq_ids[j]].push_back(r.tokens[j]);
      if (int(out.tokens[r.seq_ids[j]].size()) == kTokens) done[r.seq_ids[j]] = true;
    }
    for (const RowError& err : r.errors) {
      out.errors[err.seq_id].push_back(err);
      done[err.seq_id] = true;  // as the scheduler does: the failed sequence is ended
      e.free_sequence(err.seq_id);
    }
  }
  for (uint32_t id = 1; id <= kSeqs; id++) e.free_sequence(id);
  return out;
}

}  // namespace

TEST_CASE(bad_plan_rows_fail_alone) {
  auto e = load();
  const int vocab = int(e->info().config.vocab_size);
  e->add_sequence(1, prompt_of(6, 1, vocab), {0.f, 1.f, 0, 0, 0});
  e->add_sequence(2, prompt_of(6, 2, vocab), {0.f, 1.f, 0, 0, 0});
  // Unknown sequence 9, sequence 2 named twice, sequence 1 asked for no token.
  StepResult r = e->step({{9, 1, 2, 2, 1}, {1, 6, 6, 3, 0}});
  CHECK(r.seq_ids.size() == 2 && r.seq_ids[0] == 1 && r.seq_ids[1] == 2);
  // Rows of known sequences are checked first, unknown ones last (they might be this step's adds).
  CHECK(r.errors.size() == 3);
  CHECK(r.errors[0].seq_id == 2 && r.errors[0].code == ErrorCode::kInvalidArgument);
  CHECK(r.errors[1].seq_id == 1 && r.errors[1].code == ErrorCode::kInvalidArgument);
  CHECK(r.errors[2].seq_id == 9 && r.errors[2].code == ErrorCode::kSequenceUnknown);
  CHECK(r.row_status == std::vector<uint8_t>({2, 0, 0, 2, 2}));
  // The same two rows alone sample the same tokens (greedy).
  auto ref = load();
  ref->add_sequence(1, prompt_of(6, 1, vocab), {0.f, 1.f, 0, 0, 0});
  ref->add_sequence(2, prompt_of(6, 2, vocab), {0.f, 1.f, 0, 0, 0});
  StepResult clean = ref->step({{1, 2}, {6, 6}});
  CHECK(clean.tokens == r.tokens && clean.errors.empty());
  // A plan of only bad rows does nothing and throws nothing.
  StepResult none = e->step({{42}, {1}});
  CHECK(none.seq_ids.empty() && none.errors.size() == 1);
}

TEST_CASE(a_fault_in_one_row_of_a_busy_step_fails_that_row_only) {
  auto e = load();
  const BusyRun clean = run_busy(*e);
  for (uint32_t id = 1; id <= kSeqs; id++) CHECK(int(clean.tokens[id].size()) == kTokens && clean.errors[id].empty());
  for (FaultPoint point : {FaultPoint::kPrepareRow, FaultPoint::kSampleRow}) {
    const uint32_t faulty = 4;
    const BusyRun faulted = run_busy(*e, faulty, point);
    CHECK(faulted.errors[faulty].size() == 1 && faulted.tokens[faulty].empty());
    CHECK(std::string(faulted.errors[faulty][0].message).find("injected") != std::string::npos);
    for (uint32_t id = 1; id <= kSeqs; id++) {
      if (id == faulty) continue;
      CHECK(faulted.errors[id].empty());
      CHECK(faulted.tokens[id] == clean.tokens[id]);  // bit-for-bit the run without the fault
    }
    // The engine carries on: the same workload again is clean.
    const BusyRun after = run_busy(*e);
    for (uint32_t id = 1; id <= kSeqs; id++) CHECK(after.tokens[id] == clean.tokens[id]);
  }
  CHECK(e->num_free_blocks() == e->info().num_blocks);  // nothing leaked
}

TEST_CASE(a_device_fault_breaks_the_engine_with_its_reason) {
  auto e = load();
  const int vocab = int(e->info().config.vocab_size);
  e->add_sequence(1, prompt_of(6, 1, vocab), {});
  e->inject_fault(0, FaultPoint::kDevice);
  CHECK_THROWS_CODE(e->step({{1}, {6}}), ErrorCode::kDeviceFault);
  CHECK(e->info().broken_reason.find("injected device fault") != std::string::npos);
  CHECK_THROWS_CODE(e->step({{1}, {6}}), ErrorCode::kEngineBroken);
  CHECK_THROWS_CODE(e->add_sequence(2, prompt_of(6, 2, vocab), {}), ErrorCode::kEngineBroken);
  e->free_sequence(1);  // still allowed: callers release what they hold
}

TEST_CASE(sampling_parameters_are_checked_per_sequence) {
  auto e = load();
  const int vocab = int(e->info().config.vocab_size);
  CHECK_THROWS_CODE(e->add_sequence(1, prompt_of(4, 1, vocab), {1.f, 1.f, vocab + 1, 0, 0}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(e->add_sequence(1, prompt_of(4, 1, vocab), {1.f, 1.f, -1, 0, 0}), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(e->add_sequence(1, prompt_of(4, 1, vocab), {1.f, 1.f, 0, 0, 21}), ErrorCode::kInvalidArgument);
  e->add_sequence(1, prompt_of(4, 1, vocab), {1.f, 1.f, vocab, 0, 0});  // top_k = the vocabulary is fine
  CHECK(e->step({{1}, {4}}).seq_ids.size() == 1);
}

TEST_CASE(thread_pool_survives_throwing_tasks) {
  cpu::ThreadPool pool(3);
  for (int thrower : {0, 1, 2}) {
    std::atomic<int> ran{0};
    bool caught = false;
    try {
      pool.run([&](int index, int) {
        ran++;
        if (index == thrower) throw std::runtime_error("task " + std::to_string(index) + " failed");
      });
    } catch (const std::runtime_error& err) {
      caught = std::string(err.what()) == "task " + std::to_string(thrower) + " failed";
    }
    CHECK(caught);
    CHECK(ran.load() == 3);  // every thread finished its share before run() returned
  }
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1000, 1, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; i++) sum += i;
  });
  CHECK(sum.load() == 999 * 1000 / 2);
}

TEST_CASE(prefix_cache_is_scoped_and_keyed) {
  auto e = load(true, {0x1234, 0x5678});
  const int vocab = int(e->info().config.vocab_size);
  const auto prompt = prompt_of(21, 7, vocab);
  CHECK(e->add_sequence(1, prompt, {}, false, "org_a") == 0);
  e->step({{1}, {21}});
  e->free_sequence(1);
  CHECK(e->add_sequence(2, prompt, {}, false, "org_b") == 0);   // another organization: no hit
  CHECK(e->add_sequence(3, prompt, {}, false, "org_a") == 20);  // the same one: 5 blocks of 4
  CHECK(e->add_sequence(4, prompt, {}, false, "") == 0);        // unscoped is a scope of its own
  // Another deployment key names different blocks.
  auto other = load(true, {0x1234, 0x5679});
  CHECK(other->add_sequence(1, prompt, {}, false, "org_a") == 0);
}

int main() {
  int rc = sluice_test::run_all("isolation");
  std::system(("rm -rf /tmp/sluice-native-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
