// The CUDA backend against the CPU backend (the reference) on small generated models of every
// supported variant, through the Engine API: greedy continuations, logprobs, batches, chunked
// prefill, graph-replayed decode, sampling, and errors. Exits 77 (skipped) without a device.
//
// Tolerances: see cuda_test_util.h.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "engine_driver.h"
#include "tiny_model_writer.h"
#include "cuda/cuda_test_util.h"
#include "pipelined_driver.h"

using namespace sluice;
using sluice_test::prompt_of;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;
using sluice_cuda_test::close_logprobs;
using sluice_cuda_test::compare;
using sluice_cuda_test::generate;
using sluice_cuda_test::load;
using sluice_cuda_test::Step;
using sluice_cuda_test::temp_dir;

namespace {

std::vector<TinyModelSpec> variants() {
  std::vector<TinyModelSpec> v(5);
  v[0].extra_config =  // Llama 3 rope scaling, f32 weights (rounded to bf16 on the GPU)
      ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
      "\"original_max_position_embeddings\":64}";
  v[0].dtype = "F32";
  v[1].architecture = "Qwen2ForCausalLM", v[1].model_type = "qwen2", v[1].qkv_bias = true, v[1].tied = true;
  v[1].heads = 8, v[1].kv_heads = 2, v[1].head_dim = 16;
  v[2].architecture = "Qwen3ForCausalLM", v[2].model_type = "qwen3", v[2].qk_norm = true, v[2].head_dim = 24;
  v[3].architecture = "MistralForCausalLM", v[3].model_type = "mistral", v[3].dtype = "F16";
  // MQA; hidden and intermediate sizes that need padding to 8-element rows on the GPU.
  v[4].heads = 4, v[4].kv_heads = 1, v[4].head_dim = 32, v[4].hidden = 100, v[4].inter = 196;
  v[4].extra_config = ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}";
  return v;
}

}  // namespace

TEST_CASE(greedy_continuations_match_the_cpu_backend) {
  int i = 0;
  for (TinyModelSpec spec : variants()) {
    const std::string dir = temp_dir("variant" + std::to_string(i));
    write_tiny_model(dir, spec);
    auto cpu = load(dir, "cpu");
    auto gpu = load(dir, "cuda");
    CHECK(gpu->info().backend == "cuda");
    const auto prompt = prompt_of(21, i + 1, spec.vocab);
    const auto ref = generate(*cpu, prompt, 40, 0, 1000);
    const std::string name = spec.architecture + "/" + spec.dtype;
    const int agree = compare(ref, generate(*gpu, prompt, 40, 0, 1000), name);
    std::printf("  %s: %d of 40 greedy tokens agree with the CPU backend\n", name.c_str(), agree);
    // Top-5 logprobs agree too (while the tokens do).
    const auto gpu_steps = generate(*gpu, prompt, 8, 0, 1000);
    for (int s = 0; s < std::min(agree, 8); s++)
      for (int k = 0; k < 2; k++) {
        const float got = gpu_steps[size_t(s)].top_logprobs[size_t(k)], want = ref[size_t(s)].top_logprobs[size_t(k)];
        if (!close_logprobs(got, want))
          std::printf("  %s: step %d top-%d logprob %.5f (id %d) vs reference %.5f (id %d)\n", name.c_str(), s, k, got,
                      gpu_steps[size_t(s)].top_ids[size_t(k)], want, ref[size_t(s)].top_ids[size_t(k)]);
        CHECK(close_logprobs(got, want));
      }
    i++;
  }
}

TEST_CASE(batches_chunks_and_graph_decode_agree) {
  TinyModelSpec spec;
  spec.heads = 8, spec.kv_heads = 2;
  const std::string dir = temp_dir("batching");
  write_tiny_model(dir, spec);
  auto gpu = load(dir, "cuda");
  auto cpu = load(dir, "cpu");
  const auto prompt = prompt_of(37, 5, spec.vocab);
  const auto ref = generate(*cpu, prompt, 40, 0, 1000);
  // Alone (graph bucket 1), with 2 companions (bucket 4, padded), 15 (bucket 16), 40 (bucket 48),
  // prefilled whole or in chunks (mixed prefill + decode steps run eagerly).
  const int others[] = {0, 2, 15, 40, 0, 15};
  const int chunks[] = {1000, 1000, 1000, 1000, 5, 3};
  for (int c = 0; c < 6; c++) {
    const std::string what = "batch " + std::to_string(others[c] + 1) + " chunk " + std::to_string(chunks[c]);
    compare(ref, generate(*gpu, prompt, 40, others[c], chunks[c]), what);
  }
}

TEST_CASE(graphs_off_runs_decode_eagerly_and_agrees) {
  // SLUICE_CUDA_GRAPHS=0 (read when an engine loads) turns the decode graphs off, which
  // kernel_info() reports; the eager decode steps give the same continuations.
  TinyModelSpec spec;
  const std::string dir = temp_dir("graphs-off");
  write_tiny_model(dir, spec);
  const char* before = std::getenv("SLUICE_CUDA_GRAPHS");
  const std::string saved = before ? before : "";
  ::setenv("SLUICE_CUDA_GRAPHS", "0", 1);
  auto gpu = load(dir, "cuda");
  if (before) ::setenv("SLUICE_CUDA_GRAPHS", saved.c_str(), 1);
  else ::unsetenv("SLUICE_CUDA_GRAPHS");
  CHECK(gpu->info().simd.find("decode graphs: off") != std::string::npos);
  auto cpu = load(dir, "cpu");
  const auto prompt = prompt_of(19, 4, spec.vocab);
  const auto ref = generate(*cpu, prompt, 24, 0, 1000);
  compare(ref, generate(*gpu, prompt, 24, 0, 1000), "graphs off, alone");
  compare(ref, generate(*gpu, prompt, 24, 15, 1000), "graphs off, batch 16");
}

TEST_CASE(seeded_sampling_repeats_on_the_gpu) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("sampling");
  write_tiny_model(dir, spec);
  auto gpu = load(dir, "cuda");
  const auto prompt = prompt_of(6, 2, spec.vocab);
  SamplingParams p{1.0f, 0.9f, 40, 1234, 3};
  const auto a = generate(*gpu, prompt, 32, 0, 64, p);
  const auto b = generate(*gpu, prompt, 32, 7, 2, p);  // batched and chunked: same draws
  int same = 0;
  for (size_t i = 0; i < a.size(); i++) same += a[i].token == b[i].token;
  // Batched GPU kernels round differently, which can move a draw across a boundary: rare.
  CHECK(same >= 28);
  // min_p = 1 keeps only the best token: the greedy continuation at any temperature.
  const auto greedy = generate(*gpu, prompt, 16, 0, 64);
  const auto p1 = generate(*gpu, prompt, 16, 0, 64, {1.5f, 1.f, 0, 5, 0, 1.f});
  CHECK(p1.size() == greedy.size());
  for (size_t i = 0; i < greedy.size() && i < p1.size(); i++) CHECK(p1[i].token == greedy[i].token);
  p.seed = 99;
  const auto c = generate(*gpu, prompt, 32, 0, 64, p);
  int diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff += a[i].token != c[i].token;
  CHECK(diff > 0);
  for (const auto& s : a) {
    CHECK(s.logprob <= 0.f && std::isfinite(s.logprob));
    for (size_t k = 1; k < s.top_logprobs.size(); k++) CHECK(s.top_logprobs[k] <= s.top_logprobs[k - 1]);
  }
}

TEST_CASE(device_memory_and_errors_are_reported) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("errors");
  write_tiny_model(dir, spec);
  EngineOptions o;
  o.model_dir = dir;
  o.backend = "cuda";
  sluice_cuda_test::apply_test_env(o);
  o.gpu_memory_utilization = 0.5;  // KV sized from the fraction
  auto e = Engine::load(o);
  const EngineInfo info = e->info();
  CHECK(info.device_bytes > info.kv_cache_bytes && info.kv_cache_bytes > 0);
  size_t free_mem = 0, total = 0;
  cudaMemGetInfo(&free_mem, &total);
  CHECK(info.kv_cache_bytes < total / 2);
  e.reset();
  o.gpu_memory_utilization = 1.5;
  CHECK_THROWS_CODE(Engine::load(o), ErrorCode::kInvalidArgument);
  o.gpu_memory_utilization = 0.9;
  o.kv_cache_bytes = size_t(1) << 50;  // a petabyte of KV cannot fit
  CHECK_THROWS_CODE(Engine::load(o), ErrorCode::kOutOfMemory);
}

namespace {

// A CUDA engine like cuda_test_util's load(), with the pipelined-step options.
std::unique_ptr<Engine> load_cuda(const std::string& dir, bool device_tokens, bool graphs_at_load, int max_num_seqs = 0) {
  EngineOptions o;
  o.model_dir = dir;
  o.backend = "cuda";
  o.kv_cache_bytes = size_t(64) << 20;
  o.block_size = 16;
  o.prefix_caching = false;  // the CPU test covers the prefix cache under pipelined steps, bit for bit
  o.gpu_memory_utilization = 0.45;
  o.max_num_seqs = max_num_seqs;
  o.cuda_device_tokens = device_tokens;
  o.cuda_graphs_at_load = graphs_at_load;
  sluice_cuda_test::apply_test_env(o);
  return Engine::load(o);
}

// The scripts of test_pipelined_steps.cpp: alone, batched (graph buckets 16 and 8 padded),
// chunked prefill (eager mixed steps), churn (a sequence freed mid-run, others added), a token
// mask mid-run (its step ends the one in flight first), greedy and seeded.
std::vector<std::pair<std::string, std::pair<sluice_test::ScriptOptions, SamplingParams>>> scripts() {
  const SamplingParams greedy{0.f, 1.f, 0, 0, 2};
  const SamplingParams seeded{1.0f, 0.9f, 40, 1234, 3};
  sluice_test::ScriptOptions alone, batched, chunked, churn, masked;
  batched.others = 15;
  chunked.others = 3, chunked.chunk = 5;
  churn.others = 4, churn.chunk = 7, churn.churn = true;
  masked = churn;
  masked.mask_step = 20;
  return {{"greedy alone", {alone, greedy}},   {"seeded alone", {alone, seeded}},
          {"greedy batch 16", {batched, greedy}}, {"seeded chunked", {chunked, seeded}},
          {"greedy churn", {churn, greedy}},   {"seeded churn", {churn, seeded}},
          {"token mask mid-run", {masked, seeded}}};
}

// Same plans, same batches, deterministic kernels: the same bits whichever loop ran them.
void require_same(const std::vector<sluice_test::ScriptStep>& want, const std::vector<sluice_test::ScriptStep>& got,
                  const std::string& what) {
  CHECK(want.size() == got.size());
  for (size_t k = 0; k < want.size() && k < got.size(); k++) {
    if (want[k] == got[k]) continue;
    std::printf("  %s: step %zu differs\n", what.c_str(), k);
    CHECK(want[k] == got[k]);
    return;
  }
}

}  // namespace

TEST_CASE(device_tokens_give_the_serial_tokens) {
  TinyModelSpec spec;
  spec.heads = 8, spec.kv_heads = 2;
  const std::string dir = temp_dir("device-tokens");
  write_tiny_model(dir, spec);
  auto serial = load_cuda(dir, false, false);
  auto piped = load_cuda(dir, true, false);
  CHECK(!serial->pipelined() && piped->pipelined());
  CHECK(piped->info().simd.find("device tokens: on") != std::string::npos);
  const auto prompt = prompt_of(37, 5, spec.vocab);
  for (const auto& [name, script] : scripts()) {
    const auto want = sluice_test::run_script(*serial, prompt, script.second, script.first, false);
    require_same(want, sluice_test::run_script(*piped, prompt, script.second, script.first, true), name);
    if (script.first.mask_step >= 0)
      CHECK(sluice_test::tokens_of(want, 0)[size_t(script.first.mask_step)] == script.first.mask_token);
  }
  // step() on a pipelined engine (begin + end, nothing overlapped) gives the same tokens too.
  const auto one = sluice_test::run_script(*serial, prompt, {0.f, 1.f, 0, 0, 2}, {}, false);
  require_same(one, sluice_test::run_script(*piped, prompt, {0.f, 1.f, 0, 0, 2}, {}, false), "step() pipelined");
}

TEST_CASE(device_tokens_fail_the_row_after_a_failed_sample) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("device-tokens-fault");
  write_tiny_model(dir, spec);
  auto serial = load_cuda(dir, false, false);
  auto piped = load_cuda(dir, true, false);
  sluice_test::ScriptOptions o;
  o.others = 3, o.fault_step = 10, o.fault_seq = 2, o.steps = 16;
  const auto prompt = prompt_of(9, 3, spec.vocab);
  const auto want = sluice_test::run_script(*serial, prompt, {0.f, 1.f, 0, 0, 0}, o, false);
  const auto got = sluice_test::run_script(*piped, prompt, {0.f, 1.f, 0, 0, 0}, o, true);
  // The pipelined step 11 computed sequence 2's row (the serial one did not), so the batches
  // differ from there and the other rows may differ by rounding: compare the outcomes only.
  CHECK(want.size() == got.size());
  for (size_t k = 0; k < want.size() && k < got.size(); k++) {
    CHECK(want[k].failed == got[k].failed);
    CHECK(want[k].seq_ids == got[k].seq_ids);
  }
  CHECK(want[11].failed == std::vector<uint32_t>{2});
}

TEST_CASE(graphs_at_load_cover_every_bucket_and_agree) {
  TinyModelSpec spec;
  const std::string dir = temp_dir("graphs-at-load");
  write_tiny_model(dir, spec);
  {
    auto all = load_cuda(dir, false, true);  // max_num_seqs 0: the default 256, all 15 buckets
    const std::string info = all->info().simd;
    std::printf("  %s\n", info.c_str());
    CHECK(info.find("decode graphs captured: 15 of 15 buckets") != std::string::npos);
  }
  auto at_load = load_cuda(dir, true, true, 64);  // buckets 1..64: 9
  CHECK(at_load->info().simd.find("decode graphs captured: 9 of 9 buckets") != std::string::npos);
  auto lazy = load_cuda(dir, false, false, 64);
  const auto prompt = prompt_of(19, 4, spec.vocab);
  for (const auto& [name, script] : scripts()) {
    const auto want = sluice_test::run_script(*lazy, prompt, script.second, script.first, false);
    require_same(want, sluice_test::run_script(*at_load, prompt, script.second, script.first, true),
                 name + " (graphs at load, device tokens)");
  }
  // No step captured anything more, and none was dropped.
  CHECK(at_load->info().simd.find("decode graphs captured: 9 of 9 buckets") != std::string::npos);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda engine")) return rc;
  const int rc = sluice_test::run_all("cuda engine");
  std::system(("rm -rf /tmp/sluice-cuda-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
