#include "sluice/model_config.h"

#include <cmath>

#include "sluice/error.h"
#include "util/json.h"

namespace sluice {

namespace {

struct ArchInfo {
  const char* architecture;
  const char* model_type;
  bool qkv_bias;  // always-on q/k/v bias (Qwen2)
  bool qk_norm;   // Qwen3
};

constexpr ArchInfo kArchitectures[] = {
    {"LlamaForCausalLM", "llama", false, false},
    {"MistralForCausalLM", "mistral", false, false},
    {"Qwen2ForCausalLM", "qwen2", true, false},
    {"Qwen3ForCausalLM", "qwen3", false, true},
};

class Fields {
 public:
  Fields(const json::Value& root, const std::string& source) : root_(root), source_(source) {}

  [[noreturn]] void invalid(const std::string& what) const {
    throw Error(ErrorCode::kModelFileInvalid, source_ + ": " + what);
  }
  const json::Value* get(const char* key) const {
    const json::Value* v = root_.find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  int64_t integer(const char* key) const {
    const json::Value* v = get(key);
    if (!v) invalid(std::string("missing required field \"") + key + "\"");
    return to_int(*v, key);
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    const json::Value* v = get(key);
    return v ? to_int(*v, key) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    const json::Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) invalid(std::string("field \"") + key + "\" must be a number");
    return v->as_number();
  }
  bool boolean_or(const char* key, bool fallback) const {
    const json::Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_bool()) invalid(std::string("field \"") + key + "\" must be true or false");
    return v->as_bool();
  }

 private:
  int64_t to_int(const json::Value& v, const char* key) const {
    if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || v.as_number() < 0)
      invalid(std::string("field \"") + key + "\" must be a non-negative integer");
    return int64_t(v.as_number());
  }
  const json::Value& root_;
  std::string source_;
};

}  // namespace

const char* supported_architectures() {
  return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json::Value root;
  try {
    root = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kModelFileInvalid, source + ": " + e.what());
  }
  if (!root.is_object()) throw Error(ErrorCode::kModelFileInvalid, source + ": expected a JSON object");
  Fields f(root, source);
  ModelConfig c;

  const json::Value* archs = f.get("architectures");
  if (archs && archs->is_array() && !archs->as_array().empty() && archs->as_array()[0].is_string())
    c.architecture = archs->as_array()[0].as_string();
  if (const json::Value* mt = f.get("model_type"); mt && mt->is_string()) c.model_type = mt->as_string();

  const ArchInfo* arch = nullptr;
  for (const ArchInfo& a : kArchitectures) {
    if (!c.architecture.empty() ? c.architecture == a.architecture : c.model_type == a.model_type) arch = &a;
  }
  if (!arch) {
    std::string got = !c.architecture.empty() ? c.architecture
                      : !c.model_type.empty() ? "model_type " + c.model_type
                                              : std::string("no \"architectures\" field");
    throw Error(ErrorCode::kUnsupportedModel, source + ": unsupported architecture (" + got +
                                                  "); supported: " + supported_architectures());
  }
  c.architecture = arch->architecture;
  if (c.model_type.empty()) c.model_type = arch->model_type;

  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_layers = f.integer("num_hidden_layers");
  c.num_heads = f.integer("num_attention_heads");
  c.num_kv_heads = f.integer_or("num_key_value_heads", c.num_heads);
  c.vocab_size = f.integer("vocab_size");
  if (c.num_heads <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0)
    f.invalid("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be > 0");
  c.head_dim = f.integer_or("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) f.invalid("head_dim must be a positive even number");
  if (!f.get("head_dim") && c.hidden_size % c.num_heads != 0)
    f.invalid("hidden_size is not divisible by num_attention_heads and no head_dim is given");
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    f.invalid("num_attention_heads must be a multiple of num_key_value_heads");
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 2048);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = f.number_or("rope_theta", 10000.0);
  c.partial_rotary_factor = f.number_or("partial_rotary_factor", 1.0);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  c.qk_norm = arch->qk_norm;
  c.qkv_bias = arch->qkv_bias;
  bool attention_bias = f.boolean_or("attention_bias", false);
  if (attention_bias) {  // Llama/Mistral/Qwen3 option: bias on q, k, v and o
    c.qkv_bias = true;
    c.o_bias = true;
  }
  c.mlp_bias = f.boolean_or("mlp_bias", false);

  if (const json::Value* act = f.get("hidden_act"); act && act->is_string() && act->as_string() != "silu")
    throw Error(ErrorCode::kUnsupportedModel, source + ": hidden_act \"" + act->as_string() +
                                                  "\" is not supported (only silu)");
  // Sliding-window attention changes results only past the window; refuse silently wrong output.
  bool sliding = c.model_type == "mistral" ? (f.get("sliding_window") != nullptr)
                                           : f.boolean_or("use_sliding_window", false);
  if (sliding) {
    int64_t window = f.integer_or("sliding_window", 0);
    if (window > 0 && window < c.max_position_embeddings) {
      // Serve within the window: beyond it full attention would differ from the model.
      c.max_position_embeddings = window;
    }
  }

  if (const json::Value* rs = f.get("rope_scaling")) {
    if (!rs->is_object()) f.invalid("rope_scaling must be an object or null");
    const json::Value* type = rs->find("rope_type");
    if (!type || type->is_null()) type = rs->find("type");
    std::string t = type && type->is_string() ? type->as_string() : "";
    Fields r(*rs, source + " rope_scaling");
    if (t == "default" || t.empty()) {
      c.rope_scaling = RopeScaling::None;
    } else if (t == "linear") {
      c.rope_scaling = RopeScaling::Linear;
      c.rope_factor = r.number_or("factor", 1.0);
    } else if (t == "llama3") {
      c.rope_scaling = RopeScaling::Llama3;
      c.rope_factor = r.number_or("factor", 8.0);
      c.rope_low_freq_factor = r.number_or("low_freq_factor", 1.0);
      c.rope_high_freq_factor = r.number_or("high_freq_factor", 4.0);
      c.rope_original_max_position = r.integer_or("original_max_position_embeddings", 8192);
      if (c.rope_high_freq_factor <= c.rope_low_freq_factor)
        f.invalid("rope_scaling high_freq_factor must exceed low_freq_factor");
    } else {
      throw Error(ErrorCode::kUnsupportedModel,
                  source + ": rope_scaling type \"" + t + "\" is not supported (supported: linear, llama3)");
    }
    if (c.rope_factor <= 0) f.invalid("rope_scaling factor must be > 0");
  }
  return c;
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int64_t half = rotary_dim() / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++) {
    double inv = 1.0 / std::pow(rope_theta, double(2 * i) / double(rotary_dim()));
    if (rope_scaling == RopeScaling::Linear) {
      inv /= rope_factor;
    } else if (rope_scaling == RopeScaling::Llama3) {
      // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
      const double pi = 3.14159265358979323846;
      double low_wavelen = double(rope_original_max_position) / rope_low_freq_factor;
      double high_wavelen = double(rope_original_max_position) / rope_high_freq_factor;
      double wavelen = 2 * pi / inv;
      if (wavelen > low_wavelen) {
        inv /= rope_factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (double(rope_original_max_position) / wavelen - rope_low_freq_factor) /
                        (rope_high_freq_factor - rope_low_freq_factor);
        inv = (1 - smooth) * inv / rope_factor + smooth * inv;
      }
    }
    out[size_t(i)] = float(inv);
  }
  return out;
}

}  // namespace sluice
