// LoRA adapters in PEFT's layout (issue 36): each adapter's output equals the float64 reference of
// its merged weights (base + scale * B A), for all seven projections, attention only with rsLoRA
// and bf16 matrices, and one layer's MLP only; batched with the other adapters and the base model
// in the same steps it gains exactly what it gains alone (the CPU kernels are batch invariant);
// prefix-cache blocks are never shared across adapters or with the base; and the checks at load.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "llama_reference.h"
#include "lora_writer.h"
#include "lora/lora_adapter.h"
#include "model/safetensors.h"
#include "sluice/dtype.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "tiny_model_writer.h"

using namespace sluice;
using namespace sluice_test;

namespace {

const std::string& target_dir() {
  static const std::string d = [] {
    const std::string dir = temp_dir("lora-target");
    TinyModelSpec spec;
    spec.dtype = "F32";
    spec.seed = 3;
    write_tiny_model(dir, spec);
    return dir;
  }();
  return d;
}

// Eight adapters of different shapes and targets: the first three in every test, the last five
// (ranks 1 to 64, f32 and bf16, some projections of some layers) in the eight-way batch.
const std::vector<AdapterSpec>& specs() {
  static const std::vector<AdapterSpec> s = [] {
    AdapterSpec all;  // every projection of both layers, rank 8
    AdapterSpec attn;
    attn.rank = 16;
    attn.alpha = 8;
    attn.rslora = true;
    attn.bf16 = true;
    attn.targets = {0, 1, 2, 3};
    attn.seed = 2;
    AdapterSpec mlp;
    mlp.rank = 4;
    mlp.alpha = 12;
    mlp.targets = {4, 5, 6};
    mlp.layers = {1};
    mlp.seed = 3;
    std::vector<AdapterSpec> out{all, attn, mlp};
    const int ranks[5] = {1, 64, 32, 2, 12};
    const std::vector<int> targets[5] = {{0, 6}, {1, 2, 4}, {0, 1, 2, 3, 4, 5, 6}, {3, 5}, {2, 6}};
    const std::vector<int> layers[5] = {{0, 1}, {0}, {1}, {0, 1}, {1}};
    for (int i = 0; i < 5; i++) {
      AdapterSpec x;
      x.rank = ranks[i];
      x.alpha = 4.0 * (i + 1);
      x.rslora = i % 2 == 1;
      x.bf16 = i % 2 == 0;
      x.targets = targets[i];
      x.layers = layers[i];
      x.seed = uint32_t(40 + i);
      out.push_back(x);
    }
    return out;
  }();
  return s;
}

const std::vector<std::string>& adapter_dirs() {
  static const std::vector<std::string> d = [] {
    std::vector<std::string> out;
    for (size_t i = 0; i < specs().size(); i++) {
      out.push_back(temp_dir("lora-" + std::to_string(i + 1)));
      write_adapter(out.back(), specs()[i]);
    }
    return out;
  }();
  return d;
}

// The first three adapters (the eight-way batch loads all).
std::vector<std::string> first_three() { return {adapter_dirs().begin(), adapter_dirs().begin() + 3}; }

std::unique_ptr<Engine> load(bool prefix_caching = false, std::vector<std::string> adapters = first_three()) {
  EngineOptions o;
  o.model_dir = target_dir();
  o.kv_cache_bytes = size_t(4) << 20;
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = prefix_caching;
  o.lora_adapters = std::move(adapters);
  return Engine::load(o);
}

// The base weights with adapter k's scale * B A added (k = 0: the base).
WeightFn merged(int k) {
  static const CheckpointWeights base(target_dir());
  if (k == 0) return [](const std::string& n) { return base.get(n); };
  const AdapterSpec s = specs()[size_t(k - 1)];
  auto st = std::make_shared<SafetensorsModel>();
  st->add_file(adapter_dirs()[size_t(k - 1)] + "/adapter_model.safetensors");
  const double scale = s.rslora ? s.alpha / std::sqrt(double(s.rank)) : s.alpha / double(s.rank);
  return [st, scale, s](const std::string& n) {
    Vec w = base.get(n);
    const size_t at = n.find("model.layers.");
    if (at == std::string::npos) return w;
    const std::string stem = "base_model.model." + n.substr(0, n.size() - std::string(".weight").size());
    const TensorView* a = st->find(stem + ".lora_A.weight");
    const TensorView* b = st->find(stem + ".lora_B.weight");
    if (!a || !b) return w;
    const int64_t r = a->shape[0], in = a->shape[1], out = b->shape[0];
    for (int64_t o = 0; o < out; o++)
      for (int64_t i = 0; i < in; i++) {
        double d = 0;
        for (int64_t j = 0; j < r; j++) d += double(b->float_at(o * r + j)) * double(a->float_at(j * in + i));
        w[size_t(o * in + i)] += scale * d;
      }
    return w;
  };
}

struct Gen {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Sequences `ids` (adapter adapters[i]) from their prompts, all in the same steps, n tokens each.
std::vector<Gen> run_together(Engine& e, const std::vector<uint32_t>& ids, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int32_t>& adapters, int n) {
  std::vector<Gen> out(ids.size());
  StepPlan plan;
  for (size_t i = 0; i < ids.size(); i++) {
    SequenceAdd add;
    add.seq_id = ids[i];
    add.prompt = prompts[i];
    add.params = SamplingParams{0.f, 1.f, 0, 0, 0};
    add.adapter = adapters[i];
    plan.adds.push_back(add);
    plan.seq_ids.push_back(ids[i]);
    plan.num_tokens.push_back(uint32_t(prompts[i].size()));
  }
  for (int step = 0; step < n; step++) {
    const StepResult r = e.step(plan);
    CHECK(r.errors.empty());
    for (size_t j = 0; j < r.seq_ids.size(); j++)
      for (size_t i = 0; i < ids.size(); i++)
        if (r.seq_ids[j] == ids[i]) {
          out[i].tokens.push_back(r.tokens[j]);
          out[i].logprobs.push_back(r.logprobs[j]);
        }
    plan = StepPlan{};
    plan.seq_ids = ids;
    plan.num_tokens.assign(ids.size(), 1);
  }
  for (uint32_t id : ids) e.free_sequence(id);
  return out;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; i++) p.push_back((i * 13 + salt * 7 + 1) % 96);
  return p;
}

// Log-softmax of v at index i.
double log_softmax_at(const Vec& v, int32_t i) {
  double mx = -1e300, z = 0;
  for (double x : v) mx = std::max(mx, x);
  for (double x : v) z += std::exp(x - mx);
  return v[size_t(i)] - mx - std::log(z);
}

}  // namespace

// Teacher-forced against the float64 reference of adapter k's merged weights (k = 0: the base):
// the reference's logits at each position of the engine's own sequence; every greedy token is the
// reference's argmax unless its two best are within 1e-3, logprobs within 1e-5 (f32 engine; ~1e-6
// observed).
void check_against_reference(const Gen& g, const std::vector<int32_t>& prompt, int k) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
  const LlamaRun ref = run_llama(RefDims{}, merged(k), all);
  double worst = 0;
  int compared = 0;
  for (size_t j = 0; j < g.tokens.size(); j++) {
    const Vec& logits = ref.logits[prompt.size() - 1 + j];
    worst = std::max(worst, std::abs(double(g.logprobs[j]) - log_softmax_at(logits, g.tokens[j])));
    Vec sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] > 1e-3) {
      CHECK(logits[size_t(g.tokens[j])] == sorted[0]);
      compared++;
    }
  }
  std::printf("  adapter %d: logprobs within %.2g of the reference, %d tokens compared\n", k, worst, compared);
  CHECK(worst < 1e-5);
  CHECK(compared >= int(g.tokens.size()) - 2);
}

TEST_CASE(each_adapter_matches_the_float64_reference_of_its_merged_weights) {
  auto e = load();
  CHECK(e->info().lora_ranks == (std::vector<int64_t>{8, 16, 4}));
  const std::vector<int32_t> prompt = prompt_of(9, 1);
  std::vector<std::vector<int32_t>> seen;
  for (int k = 0; k <= 3; k++) {
    const Gen g = run_together(*e, {uint32_t(10 + k)}, {prompt}, {k}, 8)[0];
    check_against_reference(g, prompt, k);
    seen.push_back(g.tokens);
  }
  // The adapters change the output (else the test above would say nothing).
  for (size_t a = 0; a < seen.size(); a++)
    for (size_t b = a + 1; b < seen.size(); b++) CHECK(seen[a] != seen[b]);
}

TEST_CASE(batched_with_other_adapters_and_the_base_each_gains_what_it_gains_alone) {
  auto e = load();
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(9, 2), prompt_of(5, 3), prompt_of(12, 4), prompt_of(9, 2),
                                                     prompt_of(7, 5)};
  const std::vector<int32_t> adapters = {1, 2, 3, 0, 1};
  std::vector<Gen> alone;
  for (size_t i = 0; i < prompts.size(); i++) alone.push_back(run_together(*e, {uint32_t(20 + i)}, {prompts[i]}, {adapters[i]}, 6)[0]);
  const std::vector<Gen> together = run_together(*e, {30, 31, 32, 33, 34}, prompts, adapters, 6);
  for (size_t i = 0; i < prompts.size(); i++) {
    CHECK(together[i].tokens == alone[i].tokens);
    CHECK(together[i].logprobs == alone[i].logprobs);
  }
}

// The judged case: each of eight adapters batched with the seven others and the base model
// in the same steps (different prompts and lengths) matches its own merged reference.
TEST_CASE(eight_adapters_and_the_base_batched_each_match_their_merged_reference) {
  auto e = load(false, adapter_dirs());
  CHECK(e->info().lora_ranks == (std::vector<int64_t>{8, 16, 4, 1, 64, 32, 2, 12}));
  std::vector<uint32_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> adapters;
  for (int k = 0; k <= 8; k++) {
    ids.push_back(uint32_t(50 + k));
    prompts.push_back(prompt_of(5 + k, 10 + k));
    adapters.push_back(k);
  }
  const std::vector<Gen> together = run_together(*e, ids, prompts, adapters, 8);
  for (int k = 0; k <= 8; k++) check_against_reference(together[size_t(k)], prompts[size_t(k)], k);
  // Every adapter changes what the base model gives for its prompt.
  const std::vector<Gen> base_alone = [&] {
    std::vector<Gen> out;
    for (int k = 1; k <= 8; k++) out.push_back(run_together(*e, {uint32_t(70 + k)}, {prompts[size_t(k)]}, {0}, 8)[0]);
    return out;
  }();
  for (int k = 1; k <= 8; k++) CHECK(base_alone[size_t(k - 1)].logprobs != together[size_t(k)].logprobs);
}

TEST_CASE(prefix_cache_blocks_are_never_shared_across_adapters) {
  auto e = load(true);
  const SamplingParams greedy{0.f, 1.f, 0, 0, 0};
  int salt = 6;
  // A prompt of its own per case: what an earlier case cached never counts.
  auto cached_after = [&](int32_t first, int32_t second) {
    const std::vector<int32_t> prompt = prompt_of(14, salt++);
    e->add_sequence(1, prompt, greedy, false, "", {}, first);
    StepPlan plan;
    plan.seq_ids = {1};
    plan.num_tokens = {100};
    e->step(plan);
    e->free_sequence(1);
    const int64_t cached = e->add_sequence(2, prompt, greedy, false, "", {}, second);
    e->free_sequence(2);
    return cached;
  };
  CHECK(cached_after(1, 1) > 0);
  CHECK(cached_after(0, 0) > 0);
  CHECK(cached_after(1, 2) == 0);
  CHECK(cached_after(2, 0) == 0);
  CHECK(cached_after(0, 3) == 0);
}

// While serving: an adapter installed after load serves as one loaded with the engine; retired,
// new sequences may not name it while one that uses it finishes with it; its slot is taken again.
TEST_CASE(adapters_install_and_retire_while_sequences_run) {
  auto with = load();  // adapter 1 loaded with the engine
  const std::vector<int32_t> prompt = prompt_of(9, 8);
  const Gen ref = run_together(*with, {1}, {prompt}, {1}, 6)[0];
  auto e = load(false, {});
  const int32_t id = e->install_adapter(std::make_shared<const LoraAdapter>(adapter_dirs()[0], e->info().config));
  CHECK(id == 1);
  CHECK(e->info().lora_ids == std::vector<int32_t>{1});
  const Gen hot = run_together(*e, {2}, {prompt}, {id}, 6)[0];
  CHECK(hot.tokens == ref.tokens);
  CHECK(hot.logprobs == ref.logprobs);
  // Retired mid-sequence: the sequence finishes with it, exactly.
  e->add_sequence(3, prompt, SamplingParams{0.f, 1.f, 0, 0, 0}, false, "", {}, id);
  e->retire_adapter(id);
  CHECK(e->info().lora_ids.empty());
  CHECK_THROWS_CODE(e->add_sequence(4, prompt, SamplingParams{}, false, "", {}, id), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(e->retire_adapter(id), ErrorCode::kInvalidArgument);
  std::vector<int32_t> tokens;
  StepPlan plan;
  plan.seq_ids = {3};
  plan.num_tokens = {100};
  for (int step = 0; step < 6; step++) {
    const StepResult r = e->step(plan);
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    plan.num_tokens = {1};
  }
  CHECK(tokens == ref.tokens);
  e->free_sequence(3);
  // Installed again, it takes the free slot.
  CHECK(e->install_adapter(std::make_shared<const LoraAdapter>(adapter_dirs()[1], e->info().config)) == 1);
}

TEST_CASE(load_checks) {
  auto with = [](const std::string& name, const AdapterSpec& s) {
    const std::string dir = temp_dir(name);
    write_adapter(dir, s);
    return std::vector<std::string>{dir};
  };
  AdapterSpec big;
  big.rank = 65;
  CHECK_THROWS_CODE(load(false, with("lora-big", big)), ErrorCode::kUnsupportedModel);
  AdapterSpec off;
  off.b_rows_off = 1;
  CHECK_THROWS_CODE(load(false, with("lora-off", off)), ErrorCode::kInvalidArgument);
  AdapterSpec embed;
  embed.extra_tensor = "base_model.model.model.embed_tokens.lora_embedding_A";
  CHECK_THROWS_CODE(load(false, with("lora-embed", embed)), ErrorCode::kUnsupportedModel);
  AdapterSpec dora;
  dora.extra_config = ",\"use_dora\":true";
  CHECK_THROWS_CODE(load(false, with("lora-dora", dora)), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(load(false, {temp_dir("lora-missing")}), ErrorCode::kModelFileMissing);
  AdapterSpec tower;
  tower.extra_tensor = "base_model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight";
  CHECK_THROWS_CODE(load(false, with("lora-tower", tower)), ErrorCode::kUnsupportedModel);
  AdapterSpec adalora;
  adalora.peft_type = "ADALORA";
  CHECK_THROWS_CODE(load(false, with("lora-adalora", adalora)), ErrorCode::kUnsupportedModel);
  AdapterSpec replicated;
  replicated.extra_config = ",\"layer_replication\":[[0,2],[1,2]]";
  CHECK_THROWS_CODE(load(false, with("lora-replicated", replicated)), ErrorCode::kUnsupportedModel);
  // inspect() refuses what loading refuses, without reading the matrices, and sizes what it accepts.
  const ModelConfig config = load(false, {})->info().config;
  CHECK_THROWS_CODE(LoraAdapter::inspect(with("lora-big2", big)[0], config), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(LoraAdapter::inspect(with("lora-off2", off)[0], config), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(LoraAdapter::inspect(with("lora-embed2", embed)[0], config), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(LoraAdapter::inspect(with("lora-dora2", dora)[0], config), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(LoraAdapter::inspect(temp_dir("lora-missing2"), config), ErrorCode::kModelFileMissing);
  for (const std::string& dir : adapter_dirs()) {
    const LoraAdapter loaded(dir, config);
    const LoraAdapter::Summary s = LoraAdapter::inspect(dir, config);
    CHECK(s.rank == loaded.rank());
    CHECK(s.bytes == loaded.bytes());
  }
  auto e = load();
  CHECK_THROWS_CODE(e->add_sequence(1, prompt_of(4, 1), SamplingParams{}, false, "", {}, 4), ErrorCode::kInvalidArgument);
  CHECK_THROWS_CODE(e->add_sequence(1, prompt_of(4, 1), SamplingParams{}, false, "", {}, -1), ErrorCode::kInvalidArgument);
}

int main() {
  const int rc = sluice_test::run_all("lora");
  std::system(("rm -rf '" + temp_dir("") + "'").c_str());
  return rc;
}
