// The pipelined step path (EngineOptions::cuda_device_tokens: begin_step / end_step, samples
// read by the next step before they reach the host) on the CPU backend, where the engine resolves
// the placeholders from the backend's host copy: every script gives the same results, bit for
// bit, as the serial loop, including churn, chunked prefill, seeded sampling, token masks and a
// failed sample. The CUDA test runs the same scripts on the device (test_cuda_engine.cpp).
#include <unistd.h>

#include "pipelined_driver.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::prompt_of;
using sluice_test::run_script;
using sluice_test::ScriptOptions;
using sluice_test::temp_dir;
using sluice_test::tokens_of;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;

namespace {

std::unique_ptr<Engine> load(const std::string& dir, bool pipelined) {
  EngineOptions o;
  o.model_dir = dir;
  o.kv_cache_bytes = size_t(8) << 20;
  o.block_size = 4;
  o.num_threads = 2;
  o.cuda_device_tokens = pipelined;
  return Engine::load(o);
}

}  // namespace

TEST_CASE(pipelined_steps_give_the_serial_results) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("pipelined");
  write_tiny_model(dir, spec);
  auto serial = load(dir, false);
  auto piped = load(dir, true);
  CHECK(!serial->pipelined() && piped->pipelined());
  const auto prompt = prompt_of(23, 5, spec.vocab);
  const SamplingParams greedy{0.f, 1.f, 0, 0, 2};
  const SamplingParams seeded{1.0f, 0.9f, 40, 1234, 3};
  struct Case {
    const char* name;
    ScriptOptions o;
    SamplingParams p;
  };
  std::vector<Case> cases;
  ScriptOptions alone;
  cases.push_back({"greedy alone", alone, greedy});
  cases.push_back({"seeded alone", alone, seeded});
  ScriptOptions batched;
  batched.others = 15;
  cases.push_back({"greedy batch 16", batched, greedy});
  ScriptOptions chunked;
  chunked.others = 3, chunked.chunk = 5;
  cases.push_back({"seeded chunked", chunked, seeded});
  ScriptOptions churn;
  churn.others = 4, churn.chunk = 7, churn.churn = true;
  cases.push_back({"greedy churn", churn, greedy});
  cases.push_back({"seeded churn", churn, seeded});
  ScriptOptions masked = churn;
  masked.mask_step = 20;
  cases.push_back({"token mask mid-run", masked, seeded});
  for (const Case& c : cases) {
    const auto want = run_script(*serial, prompt, c.p, c.o, false);
    const auto got = run_script(*piped, prompt, c.p, c.o, true);
    CHECK(want.size() == got.size());
    bool same = true;
    for (size_t k = 0; k < want.size() && k < got.size(); k++) same = same && want[k] == got[k];
    if (!same) std::printf("  %s: the pipelined results differ from the serial ones\n", c.name);
    CHECK(same);
    if (c.o.mask_step >= 0) CHECK(tokens_of(got, 0)[size_t(c.o.mask_step)] == c.o.mask_token);
  }
  // Every sequence ended: all blocks back (cached ones evictable).
  CHECK(piped->num_free_blocks() == serial->num_free_blocks());
}

TEST_CASE(a_failed_sample_fails_the_next_steps_row_that_computed_it) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("pipelined-fault");
  write_tiny_model(dir, spec);
  auto serial = load(dir, false);
  auto piped = load(dir, true);
  ScriptOptions o;
  o.others = 3, o.fault_step = 10, o.fault_seq = 2, o.steps = 16;
  const auto prompt = prompt_of(9, 3, spec.vocab);
  const SamplingParams greedy{0.f, 1.f, 0, 0, 0};
  const auto want = run_script(*serial, prompt, greedy, o, false);
  const auto got = run_script(*piped, prompt, greedy, o, true);
  // Serial: step 10's row of sequence 2 fails, and every later row of it finds nothing to compute.
  CHECK(want[10].failed == std::vector<uint32_t>{2});
  CHECK(want[11].failed == std::vector<uint32_t>{2});
  bool same = want.size() == got.size();
  for (size_t k = 0; same && k < want.size(); k++) same = want[k] == got[k];
  CHECK(same);
}

TEST_CASE(begin_and_end_are_checked) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("pipelined-misuse");
  write_tiny_model(dir, spec);
  auto e = load(dir, true);
  CHECK_THROWS_CODE(e->end_step(), ErrorCode::kInvalidArgument);
  StepPlan p;
  p.adds.push_back({7, prompt_of(5, 1, spec.vocab), {0.f, 1.f, 0, 0, 0}, false, ""});
  p.seq_ids = {7};
  p.num_tokens = {5};
  e->begin_step(p);
  StepPlan decode;
  decode.seq_ids = {7};
  decode.num_tokens = {1};
  e->begin_step(decode);
  CHECK_THROWS_CODE(e->begin_step(decode), ErrorCode::kInvalidArgument);  // two in flight already
  CHECK_THROWS_CODE(e->step(decode), ErrorCode::kInvalidArgument);        // step() needs none in flight
  const StepResult first = e->end_step();
  const StepResult second = e->end_step();
  CHECK(first.seq_ids == std::vector<uint32_t>{7} && second.seq_ids == std::vector<uint32_t>{7});
  CHECK(first.row_pending == std::vector<uint32_t>{1} && second.row_pending == std::vector<uint32_t>{1});
  // A plan of different lengths is refused before anything is in flight.
  StepPlan bad = decode;
  bad.num_tokens.clear();
  CHECK_THROWS_CODE(e->begin_step(bad), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(e->end_step(), ErrorCode::kInvalidArgument);
  // Without the option begin_step runs the whole step.
  auto s = load(dir, false);
  s->begin_step(p);
  CHECK(s->end_step().seq_ids == std::vector<uint32_t>{7});
}

int main() {
  const int rc = sluice_test::run_all("pipelined steps");
  std::system(("rm -rf /tmp/sluice-native-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
