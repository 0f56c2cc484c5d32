// LoRA adapters on the CUDA backend (issue 36):
//  - the kernels (cuda/lora.h): adapters of ranks 1, 7, 16 and 64 and one that leaves the
//    projection alone, rows of every slot and of none (-1) mixed, plain and gate/up-interleaved
//    output columns, bf16 and f16 inputs, against a float64 reference of the same rounded inputs;
//  - the engine: each adapter alone, and all of them batched with the base model (whole and
//    chunked prefill, a prefill longer than a gate/up chunk), against the CPU backend with the
//    same adapters; pipelined steps (device tokens) give the serial steps' bits;
//  - lifetime: adapters installed and retired again and again free their device copies, and a
//    retired adapter serves the sequence still using it to its end.
// Exits 77 (ctest: skipped) without a CUDA device.
//
// Tolerances: the kernels sum in f32, so each output is within 2e-5 * (|y| + sum_j |B_oj| *
// sum_i |A_ji x_i|) of the float64 value; rows of slot -1 and columns outside the projection's
// are untouched, bit for bit. Engines: cuda_test_util.h's (greedy tokens equal up to the first
// near tie of the CPU backend, logprobs within 0.05 + 0.5%).
#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/lora.h"
#include "lora/lora_adapter.h"
#include "lora_writer.h"
#include "sluice/dtype.h"
#include "sluice/engine.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_cuda_test::compare;
using sluice_cuda_test::Dev;
using sluice_cuda_test::Step;
using sluice_cuda_test::temp_dir;
using sluice_test::AdapterSpec;
using sluice_test::prompt_of;
using sluice_test::TinyModelSpec;

namespace {

uint16_t to_e(float f, DType e) { return e == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f); }
double from_e(uint16_t h, DType e) { return e == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

struct HostMats {
  int rank = 0;
  std::vector<float> a, b;  // [rank, in], [out, rank]
};

// One launch of lora_add over T rows with the given slot ranks (0: the slot's entry is absent),
// checked against the float64 reference. The tested entry is 1 of each slot's two-entry table
// (entry 0 is a decoy of other ranks). group > 0: gate/up-interleaved columns.
void check_launch(DType e, int T, int in, int out, const std::vector<int>& ranks, int col0, int group, int group_stride,
                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int slots_n = int(ranks.size());
  const int ld_x = (in + 7) / 8 * 8 + 8;
  const int span = group > 0 ? ((out - 1) / group) * group_stride + (out - 1) % group + 1 : out;
  const int ld_y = col0 + span + 5;

  std::vector<uint16_t> x(size_t(T) * ld_x, 0);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < in; i++) x[size_t(t) * ld_x + i] = to_e(normal(rng), e);
  std::vector<float> y0(size_t(T) * ld_y);
  for (float& v : y0) v = normal(rng);
  std::vector<int32_t> slots(static_cast<size_t>(T));
  std::uniform_int_distribution<int> pick(-1, slots_n - 1);
  for (int t = 0; t < T; t++)  // every slot at least once, then (T permitting) -1, then any
    slots[size_t(t)] = t < slots_n ? t : t == slots_n ? -1 : pick(rng);

  // Per slot: the tested matrices, a decoy entry, the device copies and the two-entry table.
  std::vector<HostMats> mats(static_cast<size_t>(slots_n));
  std::vector<std::unique_ptr<Dev<float>>> keep;
  std::vector<std::unique_ptr<Dev<cuda::LoraMats>>> tables;
  std::vector<const cuda::LoraMats*> table_ptrs;
  for (int s = 0; s < slots_n; s++) {
    HostMats& m = mats[size_t(s)];
    m.rank = ranks[size_t(s)];
    cuda::LoraMats entry[2];
    const int decoy_rank = 3;
    entry[0].rank = decoy_rank;
    keep.push_back(std::make_unique<Dev<float>>(std::vector<float>(size_t(decoy_rank) * std::max(in, out), 1e6f)));
    entry[0].a = entry[0].b = keep.back()->p;
    if (m.rank > 0) {
      for (int i = 0; i < m.rank * in; i++) m.a.push_back(normal(rng) / std::sqrt(float(in)));
      for (int i = 0; i < out * m.rank; i++) m.b.push_back(normal(rng) / std::sqrt(float(m.rank)));
      keep.push_back(std::make_unique<Dev<float>>(m.a));
      entry[1].a = keep.back()->p;
      keep.push_back(std::make_unique<Dev<float>>(m.b));
      entry[1].b = keep.back()->p;
      entry[1].rank = m.rank;
    }
    tables.push_back(std::make_unique<Dev<cuda::LoraMats>>(std::vector<cuda::LoraMats>{entry[0], entry[1]}));
    table_ptrs.push_back(tables.back()->p);
  }
  Dev<const cuda::LoraMats*> d_tables(table_ptrs);
  Dev<int32_t> d_slots(slots);
  Dev<uint16_t> d_x(x);
  Dev<float> d_y(y0);
  Dev<float> d_tmp(size_t(T) * kMaxLoraRank);  // poisoned: the expand reads only what the shrink wrote

  cuda::LoraArgs a;
  a.slots = d_slots.p;
  a.tables = d_tables.p;
  a.entry = 1;
  a.T = T;
  a.x = d_x.p;
  a.ld_x = ld_x;
  a.in = in;
  a.tmp = d_tmp.p;
  a.y = d_y.p;
  a.ld_y = ld_y;
  a.out = out;
  a.col0 = col0;
  a.group = group;
  a.group_stride = group_stride;
  cuda::lora_add(a, e, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> y = d_y.read();

  int bad = 0, untouched_bad = 0;
  double worst = 0;
  for (int t = 0; t < T; t++) {
    const int s = slots[size_t(t)];
    const HostMats* m = s >= 0 && mats[size_t(s)].rank > 0 ? &mats[size_t(s)] : nullptr;
    std::vector<double> tmp, tmp_mag;
    if (m)
      for (int j = 0; j < m->rank; j++) {
        double d = 0, mag = 0;
        for (int i = 0; i < in; i++) {
          const double p = double(m->a[size_t(j) * in + i]) * from_e(x[size_t(t) * ld_x + i], e);
          d += p;
          mag += std::fabs(p);
        }
        tmp.push_back(d);
        tmp_mag.push_back(mag);
      }
    std::vector<char> written(size_t(ld_y), 0);
    for (int o = 0; o < out && m; o++) {
      const int col = group > 0 ? col0 + (o / group) * group_stride + o % group : col0 + o;
      written[size_t(col)] = 1;
      const double base = y0[size_t(t) * ld_y + col];
      double want = base, mag = std::fabs(base);
      for (int j = 0; j < m->rank; j++) {
        want += double(m->b[size_t(o) * m->rank + j]) * tmp[size_t(j)];
        mag += std::fabs(double(m->b[size_t(o) * m->rank + j])) * tmp_mag[size_t(j)];
      }
      const double err = std::fabs(double(y[size_t(t) * ld_y + col]) - want);
      worst = std::max(worst, err / (mag + 1e-30));
      bad += !(err <= 2e-5 * mag);
    }
    for (int c = 0; c < ld_y; c++)
      if (!written[size_t(c)]) untouched_bad += y[size_t(t) * ld_y + c] != y0[size_t(t) * ld_y + c];
  }
  std::printf("  %s T %d in %d out %d%s: worst error %.2g of the magnitude\n", dtype_name(e), T, in, out,
              group > 0 ? " interleaved" : "", worst);
  if (bad || untouched_bad) std::printf("    %d outputs off, %d untouched values changed\n", bad, untouched_bad);
  CHECK(bad == 0);
  CHECK(untouched_bad == 0);
}

// ---- engines ----

// The models of the engine tests: a Llama in bf16, and a Qwen2 in f16 (q/k/v biases, one KV head,
// hidden and intermediate sizes padded to 8-element rows on the GPU).
std::vector<TinyModelSpec> models() {
  std::vector<TinyModelSpec> v(2);
  v[0].seed = 3;
  v[1].architecture = "Qwen2ForCausalLM", v[1].model_type = "qwen2", v[1].qkv_bias = true, v[1].dtype = "F16";
  v[1].heads = 4, v[1].kv_heads = 1, v[1].head_dim = 32, v[1].hidden = 100, v[1].inter = 196, v[1].seed = 4;
  return v;
}

// Four adapters (ids 1..4): every projection of both layers at rank 8; attention only at rank 16
// with rsLoRA in bf16; layer 1's MLP only at rank 4; everything at rank 64.
std::vector<std::string> write_adapters(const std::string& dir, const TinyModelSpec& model) {
  AdapterSpec all, attn, mlp, big;
  attn.rank = 16, attn.alpha = 8, attn.rslora = true, attn.bf16 = true, attn.targets = {0, 1, 2, 3}, attn.seed = 2;
  mlp.rank = 4, mlp.alpha = 12, mlp.targets = {4, 5, 6}, mlp.layers = {1}, mlp.seed = 3;
  big.rank = 64, big.alpha = 32, big.seed = 4;
  std::vector<std::string> dirs;
  for (const AdapterSpec& s : {all, attn, mlp, big}) {
    dirs.push_back(dir + "/adapter" + std::to_string(dirs.size() + 1));
    sluice_test::write_adapter(dirs.back(), s, model);
  }
  return dirs;
}

std::unique_ptr<Engine> load(const std::string& dir, const std::string& backend, const std::vector<std::string>& adapters,
                             bool device_tokens = false) {
  EngineOptions o;
  o.model_dir = dir;
  o.backend = backend;
  o.kv_cache_bytes = size_t(64) << 20;
  o.block_size = 16;
  o.num_threads = 2;
  o.prefix_caching = false;  // every run computes its whole prompt
  o.gpu_memory_utilization = 0.45;
  o.lora_adapters = adapters;
  o.cuda_device_tokens = device_tokens;
  sluice_cuda_test::apply_test_env(o);
  return Engine::load(o);
}

// Sequences first_id + i with prompts[i] and adapters[i], all in the same steps (prefills in chunks
// of at most `chunk` tokens, then one token per step), until each sampled n tokens; greedy, top-2
// logprobs. The plans never depend on the results, so pipelined (begin_step of step k + 1 before
// end_step of step k) runs the same batches.
std::vector<std::vector<Step>> run_batch(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                         const std::vector<int32_t>& adapters, int n, int chunk, uint32_t first_id = 1,
                                         bool pipelined = false) {
  const SamplingParams greedy{0.f, 1.f, 0, 0, 2};
  const size_t count = prompts.size();
  std::vector<int64_t> remaining;
  int steps = 0;
  for (const auto& p : prompts) {
    remaining.push_back(int64_t(p.size()));
    steps = std::max(steps, int((p.size() + size_t(chunk) - 1) / size_t(chunk)) + n - 1);
  }
  auto plan_for = [&](int k) {
    StepPlan plan;
    for (size_t i = 0; i < count; i++) {
      if (k == 0) {
        SequenceAdd add;
        add.seq_id = first_id + uint32_t(i);
        add.prompt = prompts[i];
        add.params = greedy;
        add.adapter = adapters[i];
        plan.adds.push_back(add);
      }
      const uint32_t tokens = remaining[i] > 0 ? uint32_t(std::min<int64_t>(remaining[i], chunk)) : 1;
      remaining[i] = std::max<int64_t>(0, remaining[i] - tokens);
      plan.seq_ids.push_back(first_id + uint32_t(i));
      plan.num_tokens.push_back(tokens);
    }
    return plan;
  };
  std::vector<std::vector<Step>> out(count);
  auto record = [&](const StepResult& r) {
    CHECK(r.errors.empty());
    for (size_t j = 0; j < r.seq_ids.size(); j++) {
      const size_t i = r.seq_ids[j] - first_id;
      if (i >= count || int(out[i].size()) >= n) continue;
      Step s{r.tokens[j], r.logprobs[j], {}, {}};
      for (int k = 0; k < r.top_n; k++) {
        s.top_ids.push_back(r.top_ids[j * size_t(r.top_n) + size_t(k)]);
        s.top_logprobs.push_back(r.top_logprobs[j * size_t(r.top_n) + size_t(k)]);
      }
      out[i].push_back(std::move(s));
    }
  };
  if (pipelined) {
    e.begin_step(plan_for(0));
    for (int k = 1; k < steps; k++) {
      e.begin_step(plan_for(k));
      record(e.end_step());
    }
    record(e.end_step());
  } else {
    for (int k = 0; k < steps; k++) record(e.step(plan_for(k)));
  }
  for (size_t i = 0; i < count; i++) e.free_sequence(first_id + uint32_t(i));
  for (const auto& o : out) CHECK(int(o.size()) == n);
  return out;
}

bool differ(const std::vector<Step>& a, const std::vector<Step>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    if (a[i].token != b[i].token || std::fabs(a[i].logprob - b[i].logprob) > 0.01f) return true;
  return false;
}

}  // namespace

TEST_CASE(kernels_match_the_float64_reference) {
  for (DType e : {DType::BF16, DType::F16}) {
    // Ranks 1, 7 (no 16-byte rows of B), 16, 64 (the largest) and an absent projection.
    const std::vector<int> ranks = {1, 7, 16, 64, 0};
    check_launch(e, 37, 200, 300, ranks, 0, 0, 0, 1);  // in and out off the block sizes
    check_launch(e, 9, 4096, 1024, ranks, 3, 0, 0, 2);  // long rows, an offset column range
    // Gate then up of a gate/up output interleaved in 16-column groups.
    check_launch(e, 21, 256, 196, ranks, 0, 8, 16, 3);
    check_launch(e, 21, 256, 196, ranks, 8, 8, 16, 4);
  }
  // Decode-shaped: one row, using an adapter.
  check_launch(DType::BF16, 1, 512, 640, {32}, 0, 0, 0, 5);
}

TEST_CASE(each_adapter_alone_matches_the_cpu_backend) {
  int m = 0;
  for (const TinyModelSpec& spec : models()) {
    const std::string dir = temp_dir("alone" + std::to_string(m));
    sluice_test::write_tiny_model(dir, spec);
    const std::vector<std::string> adapters = write_adapters(dir, spec);
    auto cpu = load(dir, "cpu", adapters);
    auto gpu = load(dir, "cuda", adapters);
    const auto prompt = prompt_of(21, m + 1, spec.vocab);
    std::vector<std::vector<Step>> seen;
    for (int32_t k = 0; k <= 4; k++) {
      const auto ref = run_batch(*cpu, {prompt}, {k}, 24, 1000)[0];
      const auto got = run_batch(*gpu, {prompt}, {k}, 24, 1000)[0];
      const std::string what = spec.architecture + "/" + spec.dtype + " adapter " + std::to_string(k);
      std::printf("  %s: %d of 24 greedy tokens agree with the CPU backend\n", what.c_str(), compare(ref, got, what));
      seen.push_back(got);
    }
    // Each adapter changes what the GPU computes (else the comparisons above say little).
    for (size_t k = 1; k < seen.size(); k++) CHECK(differ(seen[0], seen[k]));
    m++;
  }
}

TEST_CASE(batched_adapters_and_the_base_model_match_the_cpu_backend) {
  int m = 0;
  for (const TinyModelSpec& spec : models()) {
    const std::string dir = temp_dir("batched" + std::to_string(m));
    sluice_test::write_tiny_model(dir, spec);
    const std::vector<std::string> adapters = write_adapters(dir, spec);
    auto cpu = load(dir, "cpu", adapters);
    auto gpu = load(dir, "cuda", adapters);
    // Six sequences of four adapters and the base model; one prompt longer than a gate/up chunk
    // of a step with adapters (256 tokens), so that its prefill takes two.
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; i++) prompts.push_back(prompt_of(5 + 7 * i, 10 + i, spec.vocab));
    prompts.push_back(prompt_of(300, 20, spec.vocab));
    const std::vector<int32_t> ids = {1, 2, 3, 0, 4, 1};
    for (int chunk : {1000, 5}) {  // whole prefills; chunks beside decoding rows (mixed steps)
      const auto ref = run_batch(*cpu, prompts, ids, 16, chunk);
      const auto got = run_batch(*gpu, prompts, ids, 16, chunk);
      for (size_t i = 0; i < prompts.size(); i++)
        compare(ref[i], got[i], spec.architecture + " chunk " + std::to_string(chunk) + " sequence " + std::to_string(i) +
                                    " (adapter " + std::to_string(ids[i]) + ")");
    }
    m++;
  }
}

TEST_CASE(pipelined_steps_with_adapters_give_the_serial_bits) {
  const TinyModelSpec spec = models()[0];
  const std::string dir = temp_dir("pipelined");
  sluice_test::write_tiny_model(dir, spec);
  const std::vector<std::string> adapters = write_adapters(dir, spec);
  auto serial = load(dir, "cuda", adapters);
  auto piped = load(dir, "cuda", adapters, true);
  CHECK(piped->pipelined());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; i++) prompts.push_back(prompt_of(9 + 4 * i, 30 + i, spec.vocab));
  const std::vector<int32_t> ids = {2, 0, 1, 4, 3};
  for (int chunk : {1000, 6}) {
    const auto want = run_batch(*serial, prompts, ids, 20, chunk);
    const auto got = run_batch(*piped, prompts, ids, 20, chunk, 1, true);
    for (size_t i = 0; i < prompts.size(); i++)
      for (size_t k = 0; k < want[i].size() && k < got[i].size(); k++) {
        CHECK(want[i][k].token == got[i][k].token);
        CHECK(std::memcmp(&want[i][k].logprob, &got[i][k].logprob, sizeof(float)) == 0);
      }
  }
}

// Installed, used and retired again and again: each adapter's device copy goes with it (device
// memory stays flat), and one retired while its sequence runs serves it to the end.
TEST_CASE(retired_adapters_free_their_device_copies) {
  TinyModelSpec spec;  // larger, so that one adapter's copy (rank 64, everything) is about 2 MiB
  spec.hidden = 256, spec.inter = 512, spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 64;
  const std::string dir = temp_dir("retire");
  sluice_test::write_tiny_model(dir, spec);
  const std::string adapter_dir = write_adapters(dir, spec)[3];
  auto e = load(dir, "cuda", {});
  const auto prompt = prompt_of(17, 7, spec.vocab);
  std::vector<Step> first;
  size_t free_after_warmup = 0, total = 0;
  for (int round = 0; round < 12; round++) {
    auto adapter = std::make_shared<const LoraAdapter>(adapter_dir, e->info().config);
    const std::weak_ptr<const LoraAdapter> watch = adapter;
    const int32_t id = e->install_adapter(std::move(adapter));
    std::vector<Step> got;
    if (round % 3 == 2) {
      // Retired after the prefill, while the sequence decodes: the sequence holds it.
      e->add_sequence(1, prompt, SamplingParams{0.f, 1.f, 0, 0, 2}, false, "", {}, id);
      StepPlan plan;
      plan.seq_ids = {1};
      plan.num_tokens = {uint32_t(prompt.size())};
      for (int step = 0; step < 8; step++) {
        const StepResult r = e->step(plan);
        CHECK(r.errors.empty() && r.tokens.size() == 1);
        if (r.tokens.empty()) break;
        got.push_back({r.tokens[0], r.logprobs[0], {r.top_ids[0], r.top_ids[1]}, {r.top_logprobs[0], r.top_logprobs[1]}});
        if (step == 0) e->retire_adapter(id);
        plan.num_tokens = {1};
      }
      CHECK(!watch.expired());  // the sequence still holds it
      e->free_sequence(1);
    } else {
      got = run_batch(*e, {prompt}, {id}, 8, 1000)[0];
      e->retire_adapter(id);
    }
    CHECK(watch.expired());  // neither the engine nor the backend holds it: its copy was freed
    if (round == 0) first = got;
    else compare(first, got, "round " + std::to_string(round));
    if (round == 1) CUDA_OK(cudaMemGetInfo(&free_after_warmup, &total));
  }
  size_t free_now = 0;
  CUDA_OK(cudaMemGetInfo(&free_now, &total));
  std::printf("  device memory free: %zu MiB after round 2, %zu MiB after round 12\n", free_after_warmup >> 20,
              free_now >> 20);
  // Ten rounds leaking a copy each would hold 20 MiB or more.
  CHECK(free_now + (size_t(6) << 20) >= free_after_warmup);
}

int main() {
  if (const int rc = sluice_cuda_test::cuda_device_check("cuda lora")) return rc;
  const int rc = sluice_test::run_all("cuda lora");
  std::system(("rm -rf /tmp/sluice-cuda-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
