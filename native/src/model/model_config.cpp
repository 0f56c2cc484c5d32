#include "sluice/model_config.h"

#include <cctype>
#include <cmath>

#include "model/architectures.h"
#include "sluice/error.h"
#include "util/json.h"

namespace sluice {

namespace {

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
  static const std::string list = [] {
    std::string out;
    for (int i = 0; i < kNumArchitectures; i++) out += (i ? ", " : "") + std::string(kArchitectures[i].architecture);
    return out;
  }();
  return list.c_str();
}

namespace {

// Fields transformers' Gemma3TextConfig fills in when config.json leaves them out: published
// multimodal checkpoints (gemma-3-4b-it) give only a handful in text_config.
struct GemmaDefaults {
  const char* key;
  double value;
};
constexpr GemmaDefaults kGemma3Defaults[] = {
    {"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 26},
    {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256}, {"max_position_embeddings", 131072},
    {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"query_pre_attn_scalar", 256}, {"sliding_window", 4096},
    {"rope_local_base_freq", 10000.0}, {"sliding_window_pattern", 6},
};

void read_experts(const Fields& f, const ArchSpec& arch, ModelConfig& c) {
  std::vector<uint8_t> sparse(size_t(c.num_layers), 1);
  if (arch.mlp == MlpLayout::kMixtral) {
    c.num_experts = f.integer_or("num_local_experts", 8);
    c.experts_per_token = f.integer_or("num_experts_per_tok", 2);
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
  } else if (arch.mlp == MlpLayout::kGptOss) {
    // Top-k logits (router bias added), softmax over those; experts with biases and the clamped SwiGLU.
    c.num_experts = f.integer_or("num_local_experts", 32);
    c.experts_per_token = f.integer_or("num_experts_per_tok", f.integer_or("experts_per_token", 4));
    c.moe_intermediate_size = c.intermediate_size;
    c.routing = Routing::TopKSoftmax;
    c.norm_topk_prob = false;
    c.router_bias = true;
    c.expert_bias = true;
    c.activation = Activation::SwigluClamped;
    c.swiglu_limit = f.number_or("swiglu_limit", 7.0);
    if (!(c.swiglu_limit > 0)) f.invalid("swiglu_limit must be > 0");
    if (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0)
      f.invalid("MXFP4 experts need hidden_size and intermediate_size multiples of 32");
  } else {  // kQwen3Moe
    c.num_experts = f.integer_or("num_experts", 128);
    c.experts_per_token = f.integer_or("num_experts_per_tok", 8);
    c.moe_intermediate_size = f.integer_or("moe_intermediate_size", 768);
    c.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
    const int64_t step = f.integer_or("decoder_sparse_step", 1);
    if (step < 1) f.invalid("decoder_sparse_step must be >= 1");
    for (int64_t l = 0; l < c.num_layers; l++) sparse[size_t(l)] = c.num_experts > 0 && (l + 1) % step == 0;
    if (const json::Value* only = f.get("mlp_only_layers")) {
      if (!only->is_array()) f.invalid("mlp_only_layers must be an array of layer indices");
      for (const json::Value& v : only->as_array()) {
        if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || v.as_number() < 0 ||
            v.as_number() >= double(c.num_layers))
          f.invalid("mlp_only_layers holds a layer index outside 0..num_hidden_layers-1");
        sparse[size_t(v.as_number())] = 0;
      }
    }
  }
  if (c.num_experts < 1 || c.num_experts > 1024) f.invalid("the number of experts must be 1..1024");
  if (c.experts_per_token < 1 || c.experts_per_token > c.num_experts)
    f.invalid("num_experts_per_tok must be 1..the number of experts");
  if (c.moe_intermediate_size < 1) f.invalid("the experts' intermediate size must be > 0");
  c.layer_sparse = sparse;
}

// Sliding-window layers and full ones. Gemma 3: local layers with their own rope base, every
// sliding_window_pattern-th layer global; gpt-oss: one rope, sliding and full layers alternate.
void read_layer_types(const Fields& f, ModelConfig& c, bool gemma) {
  const int64_t window = f.integer_or("sliding_window", gemma ? 4096 : 128);
  if (window < 1) f.invalid("sliding_window must be >= 1");
  c.layer_window.assign(size_t(c.num_layers), 0);
  c.layer_local_rope.assign(size_t(c.num_layers), 0);
  c.rope_local_theta = f.number_or("rope_local_base_freq", 10000.0);
  const json::Value* types = f.get("layer_types");
  if (types && (!types->is_array() || int64_t(types->as_array().size()) != c.num_layers))
    f.invalid("layer_types must list one type per layer");
  const int64_t pattern = gemma ? f.integer_or("sliding_window_pattern", 6) : 2;
  if (!types && pattern < 1) f.invalid("sliding_window_pattern must be >= 1");
  for (int64_t l = 0; l < c.num_layers; l++) {
    bool local;
    if (types) {
      const json::Value& t = types->as_array()[size_t(l)];
      const std::string name = t.is_string() ? t.as_string() : "";
      if (name != "sliding_attention" && name != "full_attention")
        f.invalid("layer_types entries must be \"sliding_attention\" or \"full_attention\"");
      local = name == "sliding_attention";
    } else {
      local = (l + 1) % pattern != 0;
    }
    if (local) {
      c.layer_window[size_t(l)] = window;
      c.layer_local_rope[size_t(l)] = gemma;
    }
  }
}

constexpr const char* kSupportedQuantizations =
    "supported: fp8 (e4m3, weight_block_size), compressed-tensors float-quantized FP8 (strategy tensor or "
    "channel), modelopt FP8, awq (4-bit, GEMM packing), gptq (4 or 8 bits), and gpt-oss's mxfp4";

[[noreturn]] void unsupported_quantization(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::kUnsupportedModel, source + ": " + what + " is not supported (" + kSupportedQuantizations + ")");
}

std::string string_or(const json::Value* v, const std::string& fallback) {
  return v && v->is_string() ? v->as_string() : fallback;
}

void check_module_list(const Fields& q, const char* key) {
  const json::Value* list = q.get(key);
  if (!list) return;
  if (!list->is_array()) q.invalid(std::string("field \"") + key + "\" must be an array of module names");
  for (const json::Value& m : list->as_array())
    if (!m.is_string()) q.invalid(std::string("field \"") + key + "\" must be an array of module names");
}

// compressed-tensors (llm-compressor): every config group's weights must be 8-bit floats with a
// per-tensor or per-channel scale (one strategy for the whole checkpoint), symmetric and static.
Fp8Scales read_compressed_tensors(const Fields& q, const std::string& source) {
  const std::string format = string_or(q.get("format"), "");
  if (format != "float-quantized")
    unsupported_quantization(source, "compressed-tensors format \"" + format + "\"");
  const json::Value* groups = q.get("config_groups");
  if (!groups || !groups->is_object() || groups->as_object().empty())
    q.invalid("compressed-tensors needs a non-empty \"config_groups\" object");
  Fp8Scales scales = Fp8Scales::None;
  for (const auto& [name, group] : groups->as_object()) {
    const std::string where = "compressed-tensors config_groups." + name;
    if (!group.is_object()) q.invalid(where + " must be an object");
    const json::Value* weights = group.find("weights");
    if (!weights || !weights->is_object()) q.invalid(where + " has no \"weights\" object");
    Fields w(*weights, source + " " + where + ".weights");
    const std::string type = string_or(w.get("type"), "");
    const int64_t bits = w.integer_or("num_bits", 0);
    if (type != "float" || bits != 8)
      unsupported_quantization(source, where + " weights of type \"" + type + "\" with " + std::to_string(bits) + " bits");
    if (!w.boolean_or("symmetric", true)) unsupported_quantization(source, where + " asymmetric weights");
    if (w.boolean_or("dynamic", false)) unsupported_quantization(source, where + " dynamic weight scales");
    const std::string strategy = string_or(w.get("strategy"), "");
    const Fp8Scales s = strategy == "tensor" ? Fp8Scales::Tensor : strategy == "channel" ? Fp8Scales::Channel : Fp8Scales::None;
    if (s == Fp8Scales::None) unsupported_quantization(source, where + " weight strategy \"" + strategy + "\"");
    if (scales != Fp8Scales::None && scales != s)
      unsupported_quantization(source, "compressed-tensors config groups with different weight strategies");
    scales = s;
    // Static or dynamic activation scales: ignored on the CPU (weights are dequantized), but an
    // activation format other than 8-bit float means a scheme this loader does not know.
    if (const json::Value* act = group.find("input_activations"); act && !act->is_null()) {
      if (!act->is_object()) q.invalid(where + " input_activations must be an object or null");
      Fields a(*act, source + " " + where + ".input_activations");
      const std::string atype = string_or(a.get("type"), "");
      if (atype != "float" || a.integer_or("num_bits", 0) != 8)
        unsupported_quantization(source, where + " input activations of type \"" + atype + "\"");
    }
  }
  check_module_list(q, "ignore");
  // An fp8 KV cache calibration: per-tensor e4m3 k_scale / v_scale tensors, which the binder reads
  // (LayerWeights::k_scale) for --kv-cache-dtype fp8. Another KV scheme is a format we cannot serve.
  if (const json::Value* kv = q.get("kv_cache_scheme"); kv && !kv->is_null()) {
    if (!kv->is_object()) q.invalid("kv_cache_scheme must be an object or null");
    Fields k(*kv, source + " kv_cache_scheme");
    const std::string type = string_or(k.get("type"), "");
    const std::string strategy = string_or(k.get("strategy"), "tensor");
    if (type != "float" || k.integer_or("num_bits", 0) != 8 || strategy != "tensor" || k.boolean_or("dynamic", false))
      unsupported_quantization(source, "compressed-tensors kv_cache_scheme (" + type + ", " + strategy +
                                           ") other than static per-tensor 8-bit float");
  }
  return scales;
}

// group_size: a positive multiple of 32 up to 65536, or -1 (one group over all inputs; 0 here).
int64_t read_group_size(const Fields& q, const std::string& source) {
  const json::Value* g = q.get("group_size");
  if (!g) q.invalid("missing the \"group_size\" integer");
  if (!g->is_number() || g->as_number() != std::floor(g->as_number()))
    q.invalid("group_size must be an integer");
  const double v = g->as_number();
  if (v == -1) return 0;
  if (v < 1 || v > 65536) q.invalid("group_size must be -1 or in 1..65536");
  if (int64_t(v) % 32 != 0)
    unsupported_quantization(source, "group_size " + std::to_string(int64_t(v)) + " (only multiples of 32, or -1)");
  return int64_t(v);
}

// AWQ (AutoAWQ's GEMM packing, zero points) and GPTQ (AutoGPTQ / optimum's "gptq" format, or
// GPTQModel's "gptq_v2", which stores zeros without the offset; with or without act-order).
void read_int_quantization(const Fields& q, const std::string& source, QuantizationConfig& out) {
  const bool awq = out.method == "awq";
  out.int_format = awq ? IntFormat::Awq : IntFormat::Gptq;
  out.bits = q.integer_or("bits", q.integer_or("w_bit", 0));
  if (out.bits != 4 && !(out.bits == 8 && !awq))
    unsupported_quantization(source, out.method + " with " + std::to_string(out.bits) + " bits" +
                                         (awq ? " (awq: 4)" : " (gptq: 4 or 8)"));
  if (awq) {
    // Older AutoAWQ exports spell it q_group_size; version "gemm" is the packing published.
    if (!q.get("group_size") && q.get("q_group_size")) {
      out.group_size = q.integer("q_group_size");
      if (out.group_size % 32 != 0 || out.group_size == 0 || out.group_size > 65536)
        unsupported_quantization(source, "q_group_size " + std::to_string(out.group_size) + " (only multiples of 32)");
    } else {
      out.group_size = read_group_size(q, source);
    }
    const std::string version = string_or(q.get("version"), "gemm");
    std::string lower;
    for (char ch : version) lower += char(std::tolower(static_cast<unsigned char>(ch)));
    if (lower != "gemm")
      unsupported_quantization(source, "awq version \"" + version + "\" (only the GEMM packing)");
    if (!q.boolean_or("zero_point", true)) unsupported_quantization(source, "awq without zero points");
    check_module_list(q, "modules_to_not_convert");
    return;
  }
  out.group_size = read_group_size(q, source);
  const std::string format = string_or(q.get("checkpoint_format"), "gptq");
  if (format != "gptq" && format != "gptq_v2")
    unsupported_quantization(source, "gptq checkpoint_format \"" + format + "\" (only gptq and gptq_v2)");
  if (q.boolean_or("is_marlin_format", false)) unsupported_quantization(source, "gptq in Marlin's packing");
  out.zero_offset = format == "gptq";
  // desc_act and sym need no flag: g_idx and the stored zeros carry both.
  q.boolean_or("desc_act", false);
  q.boolean_or("sym", true);
}

// quantization_config (from the top level, else the nested text config). Malformed fields are
// kModelFileInvalid; methods, formats and options the loader does not implement kUnsupportedModel.
QuantizationConfig read_quantization(const json::Value& qv, const std::string& source, const ArchSpec& arch) {
  if (!qv.is_object()) throw Error(ErrorCode::kModelFileInvalid, source + ": must be an object");
  Fields q(qv, source);
  QuantizationConfig out;
  const json::Value* method = q.get("quant_method");
  if (!method || !method->is_string()) q.invalid("missing the \"quant_method\" string");
  out.method = method->as_string();
  if (out.method == "mxfp4") {
    // gpt-oss's experts; the binder reads their blocks and scales (bind_gpt_oss_experts).
    if (arch.mlp != MlpLayout::kGptOss) unsupported_quantization(source, "quant_method \"mxfp4\" outside gpt-oss");
  } else if (out.method == "fp8") {
    // The block-wise format of the Qwen3 and DeepSeek FP8 releases.
    const std::string fmt = string_or(q.get("fmt"), "e4m3");
    if (fmt != "e4m3") unsupported_quantization(source, "fp8 fmt \"" + fmt + "\" (only e4m3)");
    const std::string scheme = string_or(q.get("activation_scheme"), "dynamic");
    if (scheme != "dynamic") unsupported_quantization(source, "fp8 activation_scheme \"" + scheme + "\" (only dynamic)");
    const json::Value* block = q.get("weight_block_size");
    if (!block) unsupported_quantization(source, "fp8 without weight_block_size (per-tensor fp8)");
    if (!block->is_array() || block->as_array().size() != 2)
      q.invalid("weight_block_size must be [rows, cols]");
    for (const json::Value& d : block->as_array())
      if (!d.is_number() || d.as_number() != std::floor(d.as_number()) || d.as_number() < 1 || d.as_number() > 65536)
        q.invalid("weight_block_size must be two integers in 1..65536");
    out.fp8 = Fp8Scales::Block;
    out.block_rows = int64_t(block->as_array()[0].as_number());
    out.block_cols = int64_t(block->as_array()[1].as_number());
    check_module_list(q, "modules_to_not_convert");
  } else if (out.method == "compressed-tensors") {
    out.fp8 = read_compressed_tensors(q, source);
  } else if (out.method == "modelopt") {
    // NVIDIA ModelOpt: quant_algo at the top, or under "quantization" in newer exports.
    const json::Value* nested = q.get("quantization");
    const json::Value* algo = q.get("quant_algo");
    if (!algo && nested && nested->is_object()) algo = nested->find("quant_algo");
    const std::string name = string_or(algo, "");
    if (name != "FP8") unsupported_quantization(source, "modelopt quant_algo \"" + name + "\" (only FP8)");
    // kv_cache_quant_algo FP8: k_scale / v_scale tensors, which the binder reads for
    // --kv-cache-dtype fp8 (the KV cache otherwise keeps the engine's own dtype).
    const json::Value* kv_algo = q.get("kv_cache_quant_algo");
    if (!kv_algo && nested && nested->is_object()) kv_algo = nested->find("kv_cache_quant_algo");
    if (kv_algo && !kv_algo->is_null() && string_or(kv_algo, "") != "FP8")
      unsupported_quantization(source, "modelopt kv_cache_quant_algo \"" + string_or(kv_algo, "?") + "\" (only FP8)");
    check_module_list(q, "exclude_modules");
    out.fp8 = Fp8Scales::Tensor;
  } else if (out.method == "awq" || out.method == "gptq") {
    read_int_quantization(q, source, out);
  } else {
    unsupported_quantization(source, "quant_method \"" + out.method + "\"");
  }
  return out;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source, const char* as_architecture) {
  json::Value root;
  try {
    root = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kModelFileInvalid, source + ": " + e.what());
  }
  if (!root.is_object()) throw Error(ErrorCode::kModelFileInvalid, source + ": expected a JSON object");
  Fields top(root, source);
  ModelConfig c;

  const json::Value* archs = top.get("architectures");
  if (archs && archs->is_array() && !archs->as_array().empty() && archs->as_array()[0].is_string())
    c.architecture = archs->as_array()[0].as_string();
  if (const json::Value* mt = top.get("model_type"); mt && mt->is_string()) c.model_type = mt->as_string();
  if (as_architecture) {
    c.architecture = as_architecture;
    c.model_type.clear();
  }

  const ArchSpec* arch = find_architecture(c.architecture, c.model_type);
  if (!arch) {
    std::string got = !c.architecture.empty() ? c.architecture
                      : !c.model_type.empty() ? "model_type " + c.model_type
                                              : std::string("no \"architectures\" field");
    throw Error(ErrorCode::kUnsupportedModel, source + ": unsupported architecture (" + got +
                                                  "); supported: " + supported_architectures());
  }
  c.architecture = arch->architecture;
  if (c.model_type.empty()) c.model_type = arch->model_type;

  // Multimodal checkpoints nest the text model's fields; their other parts are not read.
  const json::Value* text = &root;
  std::string text_source = source;
  if (arch->text_config) {
    text = top.get(arch->text_config);
    if (!text || !text->is_object()) top.invalid(std::string("missing the \"") + arch->text_config + "\" object");
    text_source = source + " " + arch->text_config;
  }
  Fields f(*text, text_source);
  const bool gemma = arch->gemma_norms;
  // A field the family may leave to its config class's default (Gemma 3), else required.
  const auto gemma_default = [&](const char* key) -> const double* {
    if (!gemma) return nullptr;
    for (const GemmaDefaults& d : kGemma3Defaults)
      if (std::string(d.key) == key) return &d.value;
    return nullptr;
  };
  const auto integer = [&](const char* key) {
    const double* d = gemma_default(key);
    return d ? f.integer_or(key, int64_t(*d)) : f.integer(key);
  };
  const auto number_or = [&](const char* key, double fallback) {
    const double* d = gemma_default(key);
    return f.number_or(key, d ? *d : fallback);
  };

  c.hidden_size = integer("hidden_size");
  c.intermediate_size = integer("intermediate_size");
  c.num_layers = integer("num_hidden_layers");
  c.num_heads = integer("num_attention_heads");
  c.num_kv_heads = gemma ? integer("num_key_value_heads") : f.integer_or("num_key_value_heads", c.num_heads);
  c.vocab_size = integer("vocab_size");
  if (c.num_heads <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0)
    f.invalid("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be > 0");
  c.head_dim = gemma ? integer("head_dim") : f.integer_or("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) f.invalid("head_dim must be a positive even number");
  if (!gemma && !f.get("head_dim") && c.hidden_size % c.num_heads != 0)
    f.invalid("hidden_size is not divisible by num_attention_heads and no head_dim is given");
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    f.invalid("num_attention_heads must be a multiple of num_key_value_heads");
  c.max_position_embeddings = gemma ? integer("max_position_embeddings") : f.integer_or("max_position_embeddings", 2048);
  c.rms_norm_eps = number_or("rms_norm_eps", 1e-6);
  c.rope_theta = number_or("rope_theta", 10000.0);
  c.partial_rotary_factor = f.number_or("partial_rotary_factor", 1.0);
  // Gemma 3's text config ties by default; a multimodal checkpoint says so at its top level.
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", top.boolean_or("tie_word_embeddings", gemma));
  c.qk_norm = arch->qk_norm;
  c.qkv_bias = arch->qkv_bias;
  // GptOssConfig turns every attention bias on unless told otherwise.
  bool attention_bias = f.boolean_or("attention_bias", arch->mlp == MlpLayout::kGptOss);
  if (attention_bias) {  // Llama/Mistral/Qwen3/Gemma option: bias on q, k, v and o
    c.qkv_bias = true;
    c.o_bias = true;
  }
  c.mlp_bias = f.boolean_or("mlp_bias", false);

  if (gemma) {
    c.norm_plus_one = true;
    c.embed_scale = std::sqrt(double(c.hidden_size));
    const double scalar = number_or("query_pre_attn_scalar", 256);
    if (!(scalar > 0)) f.invalid("query_pre_attn_scalar must be > 0");
    c.attention_scale = 1.0 / std::sqrt(scalar);
    c.final_logit_softcap = f.number_or("final_logit_softcapping", 0);
    if (c.final_logit_softcap < 0) f.invalid("final_logit_softcapping must be >= 0");
    if (f.get("attn_logit_softcapping"))
      throw Error(ErrorCode::kUnsupportedModel, text_source + ": attn_logit_softcapping is not supported");
  }
  c.sandwich_norms = arch->sandwich_norms;

  // The gated MLP's activation: silu, or GELU's tanh form (Gemma spells it hidden_activation).
  const json::Value* act = f.get(gemma ? "hidden_activation" : "hidden_act");
  const std::string act_name = act && act->is_string() ? act->as_string() : gemma ? "gelu_pytorch_tanh" : "silu";
  if (act_name == "silu") c.activation = Activation::Silu;
  else if (act_name == "gelu_pytorch_tanh" || act_name == "gelu_new") c.activation = Activation::GeluTanh;
  else
    throw Error(ErrorCode::kUnsupportedModel, text_source + ": activation \"" + act_name +
                                                  "\" is not supported (silu, gelu_pytorch_tanh)");

  // Multimodal checkpoints put quantization_config at the top level; some text configs carry it.
  if (const json::Value* qc = top.get("quantization_config"))
    c.quantization = read_quantization(*qc, source + " quantization_config", *arch);
  else if (const json::Value* tq = text != &root ? f.get("quantization_config") : nullptr)
    c.quantization = read_quantization(*tq, text_source + " quantization_config", *arch);

  // Qwen2-VL spells it image_token_id, Gemma 3 image_token_index (the latter only with a vision tower).
  const char* image_key = gemma ? "image_token_index" : "image_token_id";
  const json::Value* id = top.get(image_key);
  if (gemma && !top.get("vision_config")) id = nullptr;
  if (id && !id->is_null()) {
    if (!id->is_number() || id->as_number() != std::floor(id->as_number()) || id->as_number() < 0 ||
        id->as_number() >= double(c.vocab_size))
      top.invalid(std::string(image_key) + " must be a token id below vocab_size");
    c.image_token_id = int64_t(id->as_number());
    c.image_attention_bidirectional = gemma;
  }

  if (arch->mlp != MlpLayout::kDense) read_experts(f, *arch, c);
  if (arch->mlp == MlpLayout::kGptOss) c.attention_sinks = true;

  if (arch->window == WindowRule::kLayerTypes) {
    read_layer_types(f, c, gemma);
  } else {
    // Sliding-window attention changes results only past the window; these families are served
    // within it rather than with silently wrong output beyond it.
    bool sliding = arch->window == WindowRule::kSlidingWindowSet ? (f.get("sliding_window") != nullptr)
                                                                 : f.boolean_or("use_sliding_window", false);
    if (sliding) {
      int64_t window = f.integer_or("sliding_window", 0);
      if (window > 0 && window < c.max_position_embeddings) c.max_position_embeddings = window;
    }
  }

  if (const json::Value* rs = f.get("rope_scaling")) {
    if (!rs->is_object()) f.invalid("rope_scaling must be an object or null");
    const json::Value* type = rs->find("rope_type");
    if (!type || type->is_null()) type = rs->find("type");
    std::string t = type && type->is_string() ? type->as_string() : "";
    Fields r(*rs, text_source + " rope_scaling");
    if (t == "mrope" || ((t == "default" || t.empty()) && r.get("mrope_section"))) {
      // Qwen2-VL: rope_scaling {type: "mrope", mrope_section: [t, h, w]} (transformers rewrites the
      // type to "default" and keeps the section).
      c.rope_scaling = RopeScaling::None;
      const json::Value* sec = r.get("mrope_section");
      if (!sec || !sec->is_array() || sec->as_array().size() != 3)
        f.invalid("rope_scaling mrope_section must be three integers (time, height, width)");
      int64_t sum = 0;
      for (size_t i = 0; i < 3; i++) {
        const json::Value& v = sec->as_array()[i];
        if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || v.as_number() < 1 || v.as_number() > 65536)
          f.invalid("rope_scaling mrope_section must be three positive integers");
        c.mrope_section[i] = int64_t(v.as_number());
        sum += c.mrope_section[i];
      }
      if (sum != c.rotary_dim() / 2)
        f.invalid("rope_scaling mrope_section must sum to head_dim / 2 (" + std::to_string(c.rotary_dim() / 2) + "), got " +
                  std::to_string(sum));
    } else if (t == "default" || t.empty()) {
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
    } else if (t == "yarn") {
      c.rope_scaling = RopeScaling::Yarn;
      c.rope_factor = r.number_or("factor", 1.0);
      c.rope_beta_fast = r.number_or("beta_fast", 32.0);
      c.rope_beta_slow = r.number_or("beta_slow", 1.0);
      c.rope_truncate = r.boolean_or("truncate", true);
      c.rope_original_max_position = r.integer_or("original_max_position_embeddings", c.max_position_embeddings);
      if (c.rope_original_max_position <= 0) f.invalid("rope_scaling original_max_position_embeddings must be > 0");
      if (r.get("mscale") || r.get("mscale_all_dim"))
        throw Error(ErrorCode::kUnsupportedModel, text_source + ": yarn mscale / mscale_all_dim are not supported");
      // transformers: attention_factor, else 0.1 ln(factor) + 1 (1 when factor <= 1).
      c.rope_attention_factor = r.number_or("attention_factor", c.rope_factor > 1 ? 0.1 * std::log(c.rope_factor) + 1.0 : 1.0);
      if (!(c.rope_attention_factor > 0)) f.invalid("rope_scaling attention_factor must be > 0");
    } else {
      throw Error(ErrorCode::kUnsupportedModel,
                  text_source + ": rope_scaling type \"" + t + "\" is not supported (supported: linear, llama3, yarn)");
    }
    if (c.rope_factor <= 0) f.invalid("rope_scaling factor must be > 0");
  }
  return c;
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int64_t half = rotary_dim() / 2;
  std::vector<float> out(static_cast<size_t>(half));
  if (rope_scaling == RopeScaling::Yarn) {
    // Dimensions that turn fewer than beta_slow times over the original context are
    // interpolated (divided by factor), those that turn more than beta_fast times kept, with a
    // linear ramp between (transformers' _compute_yarn_parameters).
    const double pi = 3.14159265358979323846, dim = double(rotary_dim());
    const auto correction_dim = [&](double rotations) {
      return dim * std::log(double(rope_original_max_position) / (rotations * 2 * pi)) / (2 * std::log(rope_theta));
    };
    double low = correction_dim(rope_beta_fast), high = correction_dim(rope_beta_slow);
    if (rope_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; i++) {
      const double extrapolation = 1.0 / std::pow(rope_theta, double(2 * i) / dim);
      const double interpolation = extrapolation / rope_factor;
      const double ramp = std::min(1.0, std::max(0.0, (double(i) - low) / (high - low)));
      const double keep = 1.0 - ramp;  // share of the unscaled frequency
      out[size_t(i)] = float(interpolation * (1 - keep) + extrapolation * keep);
    }
    return out;
  }
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

std::vector<float> ModelConfig::rope_local_inv_freq() const {
  const int64_t half = rotary_dim() / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++)
    out[size_t(i)] = float(1.0 / std::pow(rope_local_theta, double(2 * i) / double(rotary_dim())));
  return out;
}

double ModelConfig::softmax_scale() const {
  const double base = attention_scale > 0 ? attention_scale : 1.0 / std::sqrt(double(head_dim));
  return base * rope_attention_factor * rope_attention_factor;
}

bool ModelConfig::any_window() const {
  for (int64_t w : layer_window)
    if (w > 0) return true;
  return false;
}

bool ModelConfig::any_local_rope() const {
  for (uint8_t l : layer_local_rope)
    if (l) return true;
  return false;
}

}  // namespace sluice
