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
      "rope_scaling":{"rope_type":"yarn","factor":4}})",
                                       "c"),
                    ErrorCode::kUnsupportedModel);
  CHECK_THROWS_CODE(parse_model_config("[1,2", "c"), ErrorCode::kModelFileInvalid);
}

int main() { return sluice_test::run_all("config"); }
