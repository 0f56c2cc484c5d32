// config.json parsing (every supported architecture, rope scaling) and the JSON reader.
#include <cmath>

#include "sluice/error.h"
#include "sluice/model_config.h"
#include "test_util.h"
#include "util/json.h"

using namespace sluice;

TEST_CASE(json_reader_handles_escapes_numbers_and_errors) {
  json::Value v = json::parse(R"({"a": [1, -2.5e3, true, null], "s": "caf\u00e9 \ud83d\ude00 \"q\"", "n": {}})");
  CHECK(v.find("a")->as_array().size() == 4);
  CHECK(v.find("a")->as_array()[1].as_number() == -2500.0);
  CHECK(v.find("s")->as_string() == "caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\"");
  CHECK(v.find("n")->is_object() && v.find("missing") == nullptr);
  bool threw = false;
  try {
    json::parse("{\"a\": [1, 2}");
  } catch (const std::runtime_error&) {
    threw = true;
  }
  CHECK(threw);
}

static const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": false, "mlp_bias": false})";

TEST_CASE(llama31_config_and_llama3_rope_frequencies) {
  ModelConfig c = parse_model_config(kLlama31, "config.json");
  CHECK(c.head_dim == 128 && c.num_kv_heads == 8 && c.rope_scaling == RopeScaling::Llama3);
  std::vector<float> f = c.rope_inv_freq();
  CHECK(f.size() == 64);
  const double pi = 3.14159265358979323846;
  for (size_t i = 0; i < f.size(); i++) {
    double base = 1.0 / std::pow(500000.0, double(2 * i) / 128.0);
    double wavelen = 2 * pi / base;
    if (wavelen < 8192.0 / 4.0) CHECK(std::fabs(f[i] - base) <= 1e-6 * base);          // high frequencies kept
    else if (wavelen > 8192.0) CHECK(std::fabs(f[i] - base / 8.0) <= 1e-6 * base);      // low ones slowed 8x
    else CHECK(f[i] < base && f[i] > base / 8.0);                                       // blended band
  }
}

TEST_CASE(qwen_variants_set_bias_and_norm_flags) {
  ModelConfig q2 = parse_model_config(
      R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
          "num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true,
          "rope_theta":1000000.0,"use_sliding_window":false,"sliding_window":32768,"max_position_embeddings":32768})",
      "q2");
  CHECK(q2.qkv_bias && !q2.o_bias && !q2.qk_norm && q2.head_dim == 64 && q2.tie_word_embeddings);
  CHECK(q2.max_position_embeddings == 32768);
  ModelConfig q3 = parse_model_config(
      R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,
          "num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"rope_scaling":null})",
      "q3");
  CHECK(q3.qk_norm && !q3.qkv_bias && q3.head_dim == 128 && q3.rope_scaling == RopeScaling::None);
  ModelConfig lin = parse_model_config(
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
          "num_attention_heads":4,"vocab_size":10,"rope_scaling":{"type":"linear","factor":4.0}})",
      "lin");
  CHECK(lin.rope_scaling == RopeScaling::Linear && lin.num_kv_heads == 4);
  CHECK(std::fabs(lin.rope_inv_freq()[0] - 0.25f) < 1e-7);
}

TEST_CASE(bad_configs_are_refused_with_clear_codes) {
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["BertModel"]})", "c"), ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64})", "c"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":3,"vocab_size":5})",
                                       "c"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":5,
      "rope_scaling":{"rope_type":"longrope","factor":4}})",
                                       "c"),
                    ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(parse_model_config("[1,2", "c"), ErrorCode::kModelFileInvalid);
}

TEST_CASE(qwen3_moe_reads_experts_and_which_layers_are_sparse) {
  // Qwen/Qwen3-30B-A3B's config.json, as published (fields the reader does not use included).
  ModelConfig c = parse_model_config(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})",
                                     "qwen3-30b-a3b");
  CHECK(c.num_experts == 128 && c.experts_per_token == 8 && c.moe_intermediate_size == 768 && c.norm_topk_prob);
  CHECK(c.qk_norm && !c.qkv_bias && c.head_dim == 128 && c.layer_sparse.size() == 48);
  for (int64_t l = 0; l < 48; l++) CHECK(c.is_sparse(l));
  CHECK(!c.sandwich_norms && c.activation == Activation::Silu && !c.any_window());
  // Every second layer sparse, and layer 1 forced dense.
  ModelConfig mixed = parse_model_config(
      R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"intermediate_size":96,"num_hidden_layers":4,
          "num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"vocab_size":100,"num_experts":4,
          "num_experts_per_tok":2,"moe_intermediate_size":32,"decoder_sparse_step":2,"mlp_only_layers":[3]})",
      "mixed");
  CHECK(!mixed.is_sparse(0) && mixed.is_sparse(1) && !mixed.is_sparse(2) && !mixed.is_sparse(3));
  CHECK(!mixed.norm_topk_prob);  // Qwen3MoeConfig's default
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
      "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"num_experts":4,
      "num_experts_per_tok":5})", "c"), ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,
      "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"mlp_only_layers":[2]})",
                                       "c"),
                    ErrorCode::kModelFileInvalid);
}

TEST_CASE(mixtral_routes_every_layer_top2_renormalised) {
  ModelConfig c = parse_model_config(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 32000})",
                                     "mixtral-8x7b");
  CHECK(c.num_experts == 8 && c.experts_per_token == 2 && c.moe_intermediate_size == 14336 && c.norm_topk_prob);
  CHECK(c.is_sparse(0) && c.is_sparse(31) && !c.qk_norm && c.max_position_embeddings == 32768);
}

TEST_CASE(gemma3_multimodal_text_config_takes_the_config_class_defaults) {
  // google/gemma-3-4b-it: the text model's fields nest under text_config, most left to defaults.
  ModelConfig c = parse_model_config(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": false}})",
                                     "gemma-3-4b-it");
  CHECK(c.architecture == "Gemma3ForConditionalGeneration" && c.hidden_size == 2560 && c.num_layers == 34);
  CHECK(c.num_heads == 8 && c.num_kv_heads == 4 && c.head_dim == 256 && c.vocab_size == 262208);
  CHECK(c.max_position_embeddings == 131072 && c.tie_word_embeddings && c.qk_norm);
  CHECK(c.norm_plus_one && c.sandwich_norms && c.activation == Activation::GeluTanh);
  CHECK(std::fabs(c.embed_scale - std::sqrt(2560.0)) < 1e-9 && std::fabs(c.attention_scale - 1.0 / 16.0) < 1e-12);
  // sliding_window_pattern 6: layers 5, 11, ... global with rope_theta and the linear scaling.
  for (int64_t l = 0; l < 34; l++) {
    const bool global = (l + 1) % 6 == 0;
    CHECK(c.window(l) == (global ? 0 : 1024) && c.local_rope(l) == !global);
  }
  CHECK(c.rope_scaling == RopeScaling::Linear && std::fabs(c.rope_inv_freq()[0] - 0.125f) < 1e-7);
  CHECK(std::fabs(c.rope_local_inv_freq()[1] - float(1.0 / std::pow(10000.0, 2.0 / 256.0))) < 1e-9);
}

TEST_CASE(gemma3_layer_types_and_refusals) {
  ModelConfig c = parse_model_config(
      R"({"architectures":["Gemma3ForCausalLM"],"model_type":"gemma3_text","hidden_size":64,"intermediate_size":96,
          "num_hidden_layers":3,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":32,"vocab_size":100,
          "query_pre_attn_scalar":24,"sliding_window":8,"final_logit_softcapping":30.0,
          "layer_types":["full_attention","sliding_attention","full_attention"]})",
      "gemma3-1b-shape");
  CHECK(c.window(0) == 0 && c.window(1) == 8 && c.window(2) == 0 && c.local_rope(1) && !c.local_rope(2));
  CHECK(std::fabs(c.final_logit_softcap - 30.0) < 1e-12 && std::fabs(c.attention_scale - 1 / std::sqrt(24.0)) < 1e-12);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Gemma3ForCausalLM"],"hidden_size":64,
      "num_hidden_layers":2,"layer_types":["full_attention"]})", "c"), ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Gemma3ForCausalLM"],"attn_logit_softcapping":50.0})", "c"),
                    ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Gemma3ForConditionalGeneration"]})", "c"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(R"({"architectures":["Gemma3ForCausalLM"],"hidden_activation":"relu"})", "c"),
                    ErrorCode::kUnsupportedModel);
}

TEST_CASE(gpt_oss_config_as_published) {
  std::string layer_types = "[";
  for (int l = 0; l < 24; l++) layer_types += std::string(l ? "," : "") + (l % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
  layer_types += "]";
  ModelConfig c = parse_model_config(R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": )" + layer_types + R"(, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
      "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
      "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 201088})",
                                     "gpt-oss-20b");
  CHECK(c.num_experts == 32 && c.experts_per_token == 4 && c.moe_intermediate_size == 2880);
  CHECK(c.routing == Routing::TopKSoftmax && c.router_bias && c.expert_bias && c.attention_sinks);
  CHECK(c.activation == Activation::SwigluClamped && c.swiglu_limit == 7.0 && c.qkv_bias && c.o_bias);
  for (int64_t l = 0; l < 24; l++) CHECK(c.window(l) == (l % 2 ? 0 : 128) && !c.local_rope(l) && c.is_sparse(l));
  CHECK(c.rope_scaling == RopeScaling::Yarn && !c.rope_truncate && c.max_position_embeddings == 131072);
  const double factor = 0.1 * std::log(32.0) + 1.0;
  CHECK(std::fabs(c.rope_attention_factor - factor) < 1e-12);
  CHECK(std::fabs(c.softmax_scale() - factor * factor / 8.0) < 1e-12);
  // YaRN: dimensions past the fast boundary keep their frequency, those below the slow one are
  // divided by the factor, a linear ramp between (hand-computed bounds for head_dim 64).
  const double pi = 3.14159265358979323846;
  const auto corr = [&](double r) { return 64.0 * std::log(4096.0 / (r * 2 * pi)) / (2 * std::log(150000.0)); };
  const double low = corr(32.0), high = corr(1.0);
  std::vector<float> f = c.rope_inv_freq();
  CHECK(f.size() == 32);
  for (int i = 0; i < 32; i++) {
    const double base = 1.0 / std::pow(150000.0, 2.0 * i / 64.0);
    const double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
    const double want = base / 32.0 * ramp + base * (1 - ramp);
    CHECK(std::fabs(f[size_t(i)] - want) <= 1e-6 * want);
  }
  CHECK(std::fabs(f[0] - 1.0f) < 1e-7 && std::fabs(f[31] - float(1.0 / std::pow(150000.0, 62.0 / 64.0) / 32.0)) < 1e-9);
}

TEST_CASE(qwen2_5_vl_reads_mrope_and_the_image_token) {
  // Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (the text fields; vision_config not read).
  const std::string base = R"({"architectures":["Qwen2_5_VLForConditionalGeneration"],"model_type":"qwen2_5_vl",
      "hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,
      "num_key_value_heads":4,"vocab_size":152064,"max_position_embeddings":128000,"rope_theta":1000000.0,
      "sliding_window":32768,"use_sliding_window":false,"image_token_id":151655,"vision_start_token_id":151652,
      "vision_config":{"depth":32,"hidden_size":1280},)";
  ModelConfig c = parse_model_config(base + R"("rope_scaling":{"type":"mrope","mrope_section":[16,24,24]}})", "vl");
  CHECK(c.mrope() && c.mrope_section[0] == 16 && c.mrope_section[1] == 24 && c.mrope_section[2] == 24);
  CHECK(c.image_token_id == 151655 && c.head_dim == 128 && c.qkv_bias && c.rope_scaling == RopeScaling::None);
  CHECK(c.max_position_embeddings == 128000);
  // transformers rewrites the type to "default" and keeps the section.
  ModelConfig d = parse_model_config(base + R"("rope_scaling":{"rope_type":"default","type":"default","mrope_section":[16,24,24]}})", "vl");
  CHECK(d.mrope() && d.mrope_section[2] == 24);
  // A section that does not cover head_dim / 2, or is not three positive integers.
  CHECK_THROWS_CODE(parse_model_config(base + R"("rope_scaling":{"type":"mrope","mrope_section":[16,24,23]}})", "vl"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(base + R"("rope_scaling":{"type":"mrope","mrope_section":[32,32]}})", "vl"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(base + R"("rope_scaling":{"type":"mrope","mrope_section":[0,32,32]}})", "vl"),
                    ErrorCode::kModelFileInvalid);
  CHECK_THROWS_CODE(parse_model_config(base + R"("rope_scaling":{"type":"mrope"}})", "vl"), ErrorCode::kModelFileInvalid);
  // An image token outside the vocabulary.
  std::string bad = base;
  bad.replace(bad.find("151655"), 6, "999999");
  CHECK_THROWS_CODE(parse_model_config(bad + R"("rope_scaling":{"type":"mrope","mrope_section":[16,24,24]}})", "vl"),
                    ErrorCode::kModelFileInvalid);
  // Gemma 3 spells it image_token_index, and takes images (bidirectionally) only with a vision tower.
  const std::string gemma = R"({"architectures":["Gemma3ForConditionalGeneration"],"image_token_index":262144,
      "mm_tokens_per_image":256,"text_config":{"hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":34,
      "num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,"vocab_size":262208})";
  ModelConfig g = parse_model_config(gemma + R"(,"vision_config":{"hidden_size":1152}})", "g");
  CHECK(g.image_token_id == 262144 && g.image_attention_bidirectional && !g.mrope());
  ModelConfig text_only = parse_model_config(gemma + "}", "g");
  CHECK(text_only.image_token_id == -1 && !text_only.image_attention_bidirectional);
  // Text models have neither.
  ModelConfig q2 = parse_model_config(
      R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
          "num_attention_heads":4,"vocab_size":10})", "q2");
  CHECK(!q2.mrope() && q2.image_token_id == -1);
}

int main() { return sluice_test::run_all("config"); }
