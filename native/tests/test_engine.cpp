// Engine mechanics on small generated models: loading and its errors, block accounting,
// batch invariance (alone == batch of 16 == chunked prefill), seeded sampling.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "model/safetensors.h"
#include "sluice/engine.h"
#include "sluice/error.h"
#include "test_util.h"
#include "engine_driver.h"
#include "tiny_model_writer.h"

using namespace sluice;
using sluice_test::prompt_of;
using sluice_test::temp_dir;
using sluice_test::run_sequence;
using sluice_test::TinyModelSpec;
using sluice_test::write_tiny_model;

namespace {


std::unique_ptr<Engine> load(const std::string& dir, size_t kv_bytes = size_t(8) << 20, int threads = 2,
                             bool prefix_caching = true) {
  EngineOptions o;
  o.prefix_caching = prefix_caching;
  o.model_dir = dir;
  o.kv_cache_bytes = kv_bytes;
  o.block_size = 4;
  o.num_threads = threads;
  return Engine::load(o);
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Runs seq 0 (the one under test) with `others` companions; prefill in chunks of `chunk` tokens.
Generated generate(Engine& e, const std::vector<int32_t>& prompt, int n, int others, int chunk,
                   const SamplingParams& params = {0.f, 1.f, 0, 0, 2}) {
  Generated g;
  for (const auto& s : run_sequence(e, prompt, n, others, chunk, params)) {
    g.tokens.push_back(s.token);
    g.logprobs.push_back(s.logprob);
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE(loads_every_architecture_variant) {
  const char* dtypes[] = {"F32", "F16", "BF16"};
  for (const char* dt : dtypes) {
    TinyModelSpec specs[4];
    specs[1].architecture = "Qwen2ForCausalLM", specs[1].model_type = "qwen2", specs[1].qkv_bias = true, specs[1].tied = true;
    specs[2].architecture = "Qwen3ForCausalLM", specs[2].model_type = "qwen3", specs[2].qk_norm = true, specs[2].head_dim = 24;
    specs[3].architecture = "MistralForCausalLM", specs[3].model_type = "mistral";
    specs[0].extra_config =
        ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":64}";
    for (int i = 0; i < 4; i++) {
      specs[i].dtype = dt;
      std::string dir = temp_dir(std::string("arch") + std::to_string(i) + dt);
      write_tiny_model(dir, specs[i]);
      auto e = load(dir);
      CHECK(e->info().config.architecture == specs[i].architecture);
      Generated g = generate(*e, prompt_of(9, 1, specs[i].vocab), 8, 0, 64);
      CHECK(g.tokens.size() == 8);
      for (int32_t t : g.tokens) CHECK(t >= 0 && t < specs[i].vocab);
      for (float lp : g.logprobs) CHECK(lp <= 0.f && std::isfinite(lp));
    }
  }
}

TEST_CASE(same_tokens_alone_in_batch_and_chunked) {
  TinyModelSpec spec;
  spec.extra_config = ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}";
  std::string dir = temp_dir("invariance");
  write_tiny_model(dir, spec);
  auto e = load(dir, size_t(8) << 20, 2, false);  // every run computes its whole prompt
  auto prompt = prompt_of(23, 5, spec.vocab);
  Generated alone = generate(*e, prompt, 40, 0, 1000);
  Generated batched = generate(*e, prompt, 40, 15, 1000);
  Generated chunked = generate(*e, prompt, 40, 0, 5);
  Generated chunked_batched = generate(*e, prompt, 40, 15, 3);
  CHECK(alone.tokens == batched.tokens);
  CHECK(alone.tokens == chunked.tokens);
  CHECK(alone.tokens == chunked_batched.tokens);
  // Bit-identical logprobs: the kernels are batch invariant, not merely close.
  CHECK(same_bits(alone.logprobs, batched.logprobs));
  CHECK(same_bits(alone.logprobs, chunked.logprobs));
  auto e1 = load(dir, size_t(8) << 20, 1, false);  // thread count must not matter either
  CHECK(same_bits(alone.logprobs, generate(*e1, prompt, 40, 0, 7).logprobs));
}

TEST_CASE(mrope_text_equals_plain_rope_and_bad_images_are_refused) {
  // The same weights as Qwen2 and as Qwen2.5-VL's language model: a text prompt's M-RoPE positions
  // have three equal components, which is plain rope, bit for bit.
  TinyModelSpec spec;
  spec.architecture = "Qwen2ForCausalLM";
  spec.model_type = "qwen2";
  spec.qkv_bias = true;
  const std::string plain_dir = temp_dir("mrope-plain");
  write_tiny_model(plain_dir, spec);
  spec.architecture = "Qwen2_5_VLForConditionalGeneration";
  spec.model_type = "qwen2_5_vl";
  spec.extra_config = ",\"image_token_id\":95,\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[2,3,3]}";
  const std::string vl_dir = temp_dir("mrope-vl");
  write_tiny_model(vl_dir, spec);
  auto plain = load(plain_dir, size_t(8) << 20, 2, false);
  auto vl = load(vl_dir, size_t(8) << 20, 2, false);
  const auto prompt = prompt_of(21, 3, 90);
  CHECK(same_bits(generate(*plain, prompt, 12, 2, 5).logprobs, generate(*vl, prompt, 12, 2, 5).logprobs));

  // Images: the placeholders must be the image token, fit the prompt and not overlap; the
  // embeddings must match the grid and be finite; a text model takes none.
  std::vector<int32_t> with_image = prompt;
  for (int i = 4; i < 10; i++) with_image[size_t(i)] = 95;
  SequenceImage img;
  img.offset = 4;
  img.grid_h = 2;
  img.grid_w = 3;
  img.embeds.assign(size_t(6 * spec.hidden), 0.5f);
  const SamplingParams greedy{0.f, 1.f, 0, 0, 0};
  CHECK(vl->add_sequence(1, with_image, greedy, false, "", {img}) == 0);
  vl->free_sequence(1);
  auto refused = [&](SequenceImage bad, const std::vector<int32_t>& tokens, Engine& e) {
    CHECK_THROWS_CODE(e.add_sequence(2, tokens, greedy, false, "", {bad}), ErrorCode::kInvalidArgument);
    CHECK(e.num_sequence_blocks(2) == 0);
  };
  SequenceImage b = img;
  b.offset = 5;  // token 10 is not the image token
  refused(b, with_image, *vl);
  b = img;
  b.offset = int64_t(with_image.size()) - 3;  // runs past the prompt
  refused(b, with_image, *vl);
  b = img;
  b.embeds.pop_back();
  refused(b, with_image, *vl);
  b = img;
  b.embeds[7] = NAN;
  refused(b, with_image, *vl);
  b = img;
  b.grid_t = 2;
  refused(b, with_image, *vl);
  refused(img, with_image, *plain);
  CHECK_THROWS_CODE(vl->add_sequence(3, with_image, greedy, false, "", {img, img}), ErrorCode::kInvalidArgument);  // overlap
}

TEST_CASE(int8_quantization_loads_on_cpu_is_batch_invariant_and_refused_elsewhere) {
  TinyModelSpec spec;
  std::string dir = temp_dir("int8");
  write_tiny_model(dir, spec);
  EngineOptions o;
  o.model_dir = dir;
  o.kv_cache_bytes = size_t(8) << 20;
  o.block_size = 4;
  o.num_threads = 2;
  o.prefix_caching = false;
  o.quantization = "int8";
  auto e = Engine::load(o);
  CHECK(e->info().weight_dtype == "q8_0");
  auto prompt = prompt_of(23, 5, spec.vocab);
  Generated alone = generate(*e, prompt, 24, 0, 1000);
  Generated both = generate(*e, prompt, 24, 7, 3);
  CHECK(alone.tokens == both.tokens);
  CHECK(same_bits(alone.logprobs, both.logprobs));
  o.quantization = "int4";
  CHECK_THROWS_CODE(Engine::load(o), ErrorCode::kInvalidArgument);
  o.quantization = "int8";
  o.backend = "cuda";  // refused before anything loads, CUDA build or not
  CHECK_THROWS_CODE(Engine::load(o), ErrorCode::kInvalidArgument);
}

TEST_CASE(weights_copied_to_host_memory_compute_what_the_file_mapping_does) {
  // The CPU backend copies the streamed matrices out of the checkpoint mapping at load
  // (model/resident_weights.h) unless SLUICE_CPU_WEIGHTS=mmap: the values, and so every logprob,
  // must be the same bits either way, tied (the embedding is the copied lm_head) or not.
  for (bool tied : {false, true}) {
    TinyModelSpec spec;
    spec.tied = tied;
    spec.dtype = "BF16";
    std::string dir = temp_dir(std::string("resident") + (tied ? "-tied" : ""));
    write_tiny_model(dir, spec);
    auto prompt = prompt_of(17, 3, spec.vocab);
    ::unsetenv("SLUICE_CPU_WEIGHTS");
    auto copied = load(dir, size_t(8) << 20, 2, false);
    ::setenv("SLUICE_CPU_WEIGHTS", "mmap", 1);
    auto mapped = load(dir, size_t(8) << 20, 2, false);
    CHECK(copied->info().weight_bytes == mapped->info().weight_bytes);
    Generated a = generate(*copied, prompt, 16, 3, 5), b = generate(*mapped, prompt, 16, 3, 5);
    CHECK(a.tokens == b.tokens);
    CHECK(same_bits(a.logprobs, b.logprobs));
  }
  ::setenv("SLUICE_CPU_WEIGHTS", "ram", 1);
  TinyModelSpec spec;
  std::string dir = temp_dir("resident-bad-env");
  write_tiny_model(dir, spec);
  CHECK_THROWS_CODE(load(dir), ErrorCode::kInvalidArgument);
  ::unsetenv("SLUICE_CPU_WEIGHTS");
}

TEST_CASE(seeded_sampling_repeats_and_differs_by_seed) {
  TinyModelSpec spec;
  std::string dir = temp_dir("sampling");
  write_tiny_model(dir, spec);
  auto e = load(dir);
  auto prompt = prompt_of(6, 2, spec.vocab);
  SamplingParams p{1.0f, 0.9f, 40, 1234, 3};
  Generated a = generate(*e, prompt, 32, 0, 64, p);
  Generated b = generate(*e, prompt, 32, 7, 2, p);
  CHECK(a.tokens == b.tokens);
  p.seed = 99;
  Generated c = generate(*e, prompt, 32, 0, 64, p);
  CHECK(a.tokens != c.tokens);
  // top_k = 1 is greedy whatever the temperature.
  Generated greedy = generate(*e, prompt, 16, 0, 64, {0.f, 1.f, 0, 0, 0});
  Generated k1 = generate(*e, prompt, 16, 0, 64, {1.5f, 1.f, 1, 5, 0});
  CHECK(greedy.tokens == k1.tokens);
  // So is min_p = 1 (only tokens as likely as the best are kept), and at this temperature
  // without it the draws leave the greedy path.
  Generated p1 = generate(*e, prompt, 16, 0, 64, {1.5f, 1.f, 0, 5, 0, 1.f});
  CHECK(greedy.tokens == p1.tokens);
  CHECK(greedy.tokens != generate(*e, prompt, 16, 0, 64, {1.5f, 1.f, 0, 5, 0, 0.f}).tokens);
  for (float bad : {-0.01f, 1.01f, NAN})
    CHECK_THROWS_CODE(e->add_sequence(50, prompt, {1.f, 1.f, 0, 0, 0, bad}), ErrorCode::kInvalidArgument);
}

TEST_CASE(logprobs_top_n_are_sorted_and_include_greedy_choice) {
  TinyModelSpec spec;
  std::string dir = temp_dir("logprobs");
  write_tiny_model(dir, spec);
  auto e = load(dir);
  e->add_sequence(1, prompt_of(5, 3, spec.vocab), {0.f, 1.f, 0, 0, 5});
  StepResult r = e->step({{1}, {5}});
  CHECK(r.top_n == 5 && r.seq_ids.size() == 1);
  CHECK(r.top_ids[0] == r.tokens[0]);
  CHECK(r.top_logprobs[0] == r.logprobs[0]);
  double mass = 0;
  for (int i = 0; i < 5; i++) {
    if (i) CHECK(r.top_logprobs[size_t(i)] <= r.top_logprobs[size_t(i - 1)]);
    mass += std::exp(double(r.top_logprobs[size_t(i)]));
  }
  CHECK(mass <= 1.0 + 1e-5);
}

TEST_CASE(kv_blocks_are_accounted_and_refusal_changes_nothing) {
  TinyModelSpec spec;
  std::string dir = temp_dir("blocks");
  write_tiny_model(dir, spec);
  // 2 layers * 2 (k,v) * 4 tokens * 2 kv heads * 16 dims * 4 bytes = 2048 bytes per block.
  auto e = load(dir, 2048 * 5);
  CHECK(e->info().num_blocks == 5);
  e->add_sequence(7, prompt_of(10, 1, spec.vocab), {});
  CHECK_THROWS_CODE(e->add_sequence(7, prompt_of(3, 1, spec.vocab), {}), ErrorCode::kSequenceExists);
  e->step({{7}, {6}});
  CHECK(e->num_sequence_blocks(7) == 2 && e->num_free_blocks() == 3);
  e->add_sequence(8, prompt_of(13, 2, spec.vocab), {});
  // 8 needs 4 blocks, 3 are free: its row is skipped (a value, not an exception); 7 needs 1 and
  // completes its prompt, so it samples one token.
  StepResult r = e->step({{8, 7}, {13, 4}});
  CHECK(r.row_status == std::vector<uint8_t>({uint8_t(RowStatus::kNoKvBlocks), uint8_t(RowStatus::kRan)}));
  CHECK(r.row_computed == std::vector<uint32_t>({0, 4}) && r.row_pending == std::vector<uint32_t>({0, 1}));
  CHECK(r.row_blocks == std::vector<uint32_t>({0, 3}));
  CHECK(r.seq_ids.size() == 1 && r.seq_ids[0] == 7 && r.errors.empty());
  CHECK(e->num_sequence_blocks(8) == 0 && r.num_free_blocks == 2 && e->num_free_blocks() == 2);
  e->free_sequence(7);
  e->free_sequence(7);  // twice is fine
  CHECK(e->num_free_blocks() == 5);
  // Bad rows are errors of their own row (see test_isolation.cpp), not of the step.
  StepResult unknown = e->step({{7}, {1}});
  CHECK(unknown.seq_ids.empty() && unknown.errors.size() == 1 && unknown.errors[0].code == ErrorCode::kSequenceUnknown);
  CHECK(unknown.row_status[0] == uint8_t(RowStatus::kFailed));
  StepResult zero = e->step({{8}, {0}});
  CHECK(zero.errors.size() == 1 && zero.errors[0].code == ErrorCode::kInvalidArgument);
  // A bound above what is left computes what is left.
  StepResult bounded = e->step({{8}, {100}});
  CHECK(bounded.row_computed[0] == 13 && bounded.seq_ids.size() == 1 && bounded.seq_ids[0] == 8);
  CHECK_THROWS_CODE(e->add_sequence(9, {int32_t(spec.vocab)}, {}), ErrorCode::kInvalidArgument);
}

TEST_CASE(a_plan_frees_adds_and_runs_with_every_outcome_a_value) {
  TinyModelSpec spec;
  std::string dir = temp_dir("plan");
  write_tiny_model(dir, spec);
  auto e = load(dir, 2048 * 5);  // 5 blocks of 4 tokens
  e->add_sequence(1, prompt_of(8, 1, spec.vocab), {});
  e->step({{1}, {8}});  // 2 blocks held, 3 free
  StepPlan plan;
  plan.seq_ids = {2, 1, 3, 4};
  plan.num_tokens = {5, 1, 4, 4};
  plan.adds.push_back({2, prompt_of(5, 2, spec.vocab), {}, false, ""});         // 2 blocks: admitted
  plan.adds.push_back({3, prompt_of(9, 3, spec.vocab), {}, false, ""});         // 3 blocks: none left
  plan.adds.push_back({4, {int32_t(spec.vocab)}, {}, false, ""});               // a bad token
  StepResult r = e->step(plan);
  CHECK(r.add_status == std::vector<uint8_t>({uint8_t(AddStatus::kAdmitted), uint8_t(AddStatus::kNoKvBlocks),
                                              uint8_t(AddStatus::kFailed)}));
  CHECK(r.add_cached == std::vector<int32_t>({0, -1, -1}));
  CHECK(r.errors.size() == 2 && r.errors[0].seq_id == 4 && r.errors[0].code == ErrorCode::kInvalidArgument);
  CHECK(r.errors[1].seq_id == 4 && r.errors[1].code == ErrorCode::kSequenceUnknown);  // its row
  CHECK(r.row_status == std::vector<uint8_t>({uint8_t(RowStatus::kRan), uint8_t(RowStatus::kRan),
                                              uint8_t(RowStatus::kNoKvBlocks), uint8_t(RowStatus::kFailed)}));
  CHECK(r.row_computed == std::vector<uint32_t>({5, 1, 0, 0}));
  CHECK(r.seq_ids == std::vector<uint32_t>({2, 1}));  // plan order
  CHECK(r.num_free_blocks == 0 && e->num_sequence_blocks(3) == 0);
  // Frees come first: 1 and 2 make room for 3 in the same step.
  StepPlan next;
  next.frees = {1, 2};
  next.adds.push_back({3, prompt_of(9, 3, spec.vocab), {}, false, ""});
  next.seq_ids = {3};
  next.num_tokens = {9};
  StepResult n2 = e->step(next);
  CHECK(n2.add_status[0] == uint8_t(AddStatus::kAdmitted) && n2.row_computed[0] == 9 && n2.seq_ids.size() == 1);
}

TEST_CASE(broken_model_directories_fail_with_named_files) {
  std::string dir = temp_dir("broken");
  TinyModelSpec spec;
  write_tiny_model(dir, spec);
  // Missing directory.
  try {
    load(temp_dir("does-not-exist"));
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kModelFileMissing);
    CHECK(std::string(e.what()).find("config.json") != std::string::npos);
  }
  // Unsupported architecture names the supported ones.
  TinyModelSpec gpt = spec;
  gpt.architecture = "GPT2LMHeadModel";
  gpt.model_type = "gpt2";
  write_tiny_model(dir + "-gpt", gpt);
  try {
    load(dir + "-gpt");
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsupportedModel);
    CHECK(std::string(e.what()).find("Qwen2ForCausalLM") != std::string::npos);
  }
  // Truncated weights file.
  std::string trunc = dir + "-trunc";
  write_tiny_model(trunc, spec);
  {
    std::string path = trunc + "/model.safetensors";
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size() / 2));
  }
  try {
    load(trunc);
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kModelFileInvalid);
    CHECK(std::string(e.what()).find("model.safetensors") != std::string::npos);
  }
  // Garbage header.
  std::string garbage = dir + "-garbage";
  write_tiny_model(garbage, spec);
  std::ofstream(garbage + "/model.safetensors", std::ios::binary | std::ios::trunc) << "\x10\0\0\0\0\0\0\0{not json at all";
  CHECK_THROWS_CODE(load(garbage), ErrorCode::kModelFileInvalid);
  // Wrong tensor shape against config.
  std::string shape = dir + "-shape";
  write_tiny_model(shape, spec);
  std::ofstream(shape + "/config.json", std::ios::trunc)
      << "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":100,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":96}";
  try {
    load(shape);
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kModelFileInvalid);
    CHECK(std::string(e.what()).find("gate_proj") != std::string::npos);
  }
  // Corrupt config.json.
  std::string badcfg = dir + "-badcfg";
  write_tiny_model(badcfg, spec);
  std::ofstream(badcfg + "/config.json", std::ios::trunc) << "{\"hidden_size\": 64,";
  CHECK_THROWS_CODE(load(badcfg), ErrorCode::kModelFileInvalid);
}

int main() {
  int rc = sluice_test::run_all("engine");
  std::system(("rm -rf /tmp/sluice-native-test-" + std::to_string(::getpid())).c_str());
  return rc;
}
