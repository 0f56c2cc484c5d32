#include "lora/lora_adapter.h"

#include <cmath>
#include <cstring>

#include "model/safetensors.h"
#include "sluice/error.h"
#include "util/json.h"

namespace sluice {

namespace {

const char* const kTargetNames[kNumLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

[[noreturn]] void invalid(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kModelFileInvalid, where + ": " + what);
}

// "...layers.<n>.<self_attn|mlp>.<proj>.lora_<A|B>[.default].weight" -> (layer, target, is_b);
// false for any other name.
bool parse_name(const std::string& name, int64_t* layer, int* target, bool* is_b) {
  const size_t at = name.rfind("layers.");
  if (at == std::string::npos) return false;
  // A vision tower's layers (SigLIP's "vision_tower.vision_model.encoder.layers.N...") are not the
  // decoder's, whatever their names share.
  const std::string path = name.substr(0, at);
  for (const char* tower : {"vision", "visual", "encoder.", "multi_modal_projector"})
    if (path.find(tower) != std::string::npos) return false;
  size_t p = at + 7;
  int64_t n = 0;
  const size_t digits = p;
  while (p < name.size() && name[p] >= '0' && name[p] <= '9') n = n * 10 + (name[p++] - '0');
  if (p == digits || p >= name.size() || name[p] != '.') return false;
  std::string rest = name.substr(p + 1);
  for (const char* suffix : {".default.weight", ".weight"}) {
    const std::string s = suffix;
    if (rest.size() > s.size() && rest.compare(rest.size() - s.size(), s.size(), s) == 0) {
      rest.resize(rest.size() - s.size());
      break;
    }
  }
  bool b;
  if (rest.size() > 7 && rest.compare(rest.size() - 7, 7, ".lora_A") == 0) b = false;
  else if (rest.size() > 7 && rest.compare(rest.size() - 7, 7, ".lora_B") == 0) b = true;
  else return false;
  rest.resize(rest.size() - 7);
  for (int t = 0; t < kNumLoraTargets; t++) {
    const bool attn = t <= int(LoraTarget::kO);
    if (rest == std::string(attn ? "self_attn." : "mlp.") + kTargetNames[t]) {
      *layer = n;
      *target = t;
      *is_b = b;
      return true;
    }
  }
  return false;
}

// [out, in] of a target projection of layer l.
std::pair<int64_t, int64_t> target_shape(const ModelConfig& c, int t) {
  const int64_t H = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim, I = c.intermediate_size;
  switch (LoraTarget(t)) {
    case LoraTarget::kQ: return {q, H};
    case LoraTarget::kK:
    case LoraTarget::kV: return {kv, H};
    case LoraTarget::kO: return {H, q};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {I, H};
    case LoraTarget::kDown: return {H, I};
  }
  return {0, 0};
}

}  // namespace

LoraAdapter::Summary LoraAdapter::inspect(const std::string& dir, const ModelConfig& c) {
  const LoraAdapter checked(dir, c, false);
  return Summary{checked.rank_, checked.bytes_};
}

LoraAdapter::LoraAdapter(const std::string& dir, const ModelConfig& c, bool read_matrices) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string config_path = base + "adapter_config.json";
  const std::string text = read_text_file(config_path);
  json::Value cfg;
  try {
    cfg = json::parse(text);
  } catch (const std::exception& e) {
    invalid(config_path, e.what());
  }
  if (!cfg.is_object()) invalid(config_path, "expected a JSON object");
  const json::Value* r = cfg.find("r");
  const json::Value* alpha = cfg.find("lora_alpha");
  if (!r || !r->is_number() || r->as_number() != std::floor(r->as_number()) || r->as_number() < 1)
    invalid(config_path, "\"r\" must be a positive integer");
  rank_ = int64_t(r->as_number());
  if (rank_ > kMaxLoraRank)
    throw Error(ErrorCode::kUnsupportedModel, config_path + ": rank " + std::to_string(rank_) + " is over the largest served, " +
                                                  std::to_string(kMaxLoraRank));
  const double a = alpha && alpha->is_number() ? alpha->as_number() : double(rank_);
  const json::Value* rs = cfg.find("use_rslora");
  const bool rslora = rs && rs->is_bool() && rs->as_bool();
  scale_ = float(rslora ? a / std::sqrt(double(rank_)) : a / double(rank_));
  auto refuse_if = [&](const char* key, const char* what) {
    const json::Value* v = cfg.find(key);
    const bool set = v && ((v->is_bool() && v->as_bool()) || (v->is_string() && v->as_string() != "none") ||
                           (v->is_array() && !v->as_array().empty()) || (v->is_object() && !v->as_object().empty()));
    if (set) throw Error(ErrorCode::kUnsupportedModel, config_path + ": " + what + " is not supported");
  };
  // Other PEFT methods (AdaLoRA, IA3, LoHa, ...) share the directory layout, not the math.
  if (const json::Value* type = cfg.find("peft_type"); type && type->is_string() && type->as_string() != "LORA")
    throw Error(ErrorCode::kUnsupportedModel, config_path + ": peft_type " + type->as_string() + " is not served (LORA only)");
  refuse_if("use_dora", "DoRA (use_dora)");
  refuse_if("lora_bias", "LoRA B biases (lora_bias)");
  refuse_if("layer_replication", "layer replication (layer_replication)");
  refuse_if("fan_in_fan_out", "fan_in_fan_out");
  refuse_if("bias", "LoRA biases (bias)");
  refuse_if("modules_to_save", "modules_to_save");
  refuse_if("rank_pattern", "per-module ranks (rank_pattern)");
  refuse_if("alpha_pattern", "per-module alphas (alpha_pattern)");

  const std::string weights_path = base + "adapter_model.safetensors";
  SafetensorsModel st;
  st.add_file(weights_path);
  layers_.resize(size_t(c.num_layers));
  // Which of lora_A (1) and lora_B (2) each projection has.
  std::vector<std::array<uint8_t, kNumLoraTargets>> seen(size_t(c.num_layers));
  // FNV-1a over every tensor's name and bytes.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; i++) hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  };
  for (const auto& [name, t] : st.tensors()) {
    int64_t layer;
    int target;
    bool is_b;
    if (!parse_name(name, &layer, &target, &is_b))
      throw Error(ErrorCode::kUnsupportedModel, weights_path + ": tensor " + name +
                                                    " is not a LoRA A/B matrix of a q/k/v/o or gate/up/down projection");
    if (layer < 0 || layer >= c.num_layers) invalid(weights_path, "tensor " + name + " names a layer the model does not have");
    if (target >= int(LoraTarget::kGate) && c.is_sparse(layer))
      throw Error(ErrorCode::kUnsupportedModel, weights_path + ": tensor " + name + " adapts a mixture-of-experts MLP (not served)");
    if (!is_float_dtype(t.dtype)) invalid(weights_path, "tensor " + name + " is " + dtype_name(t.dtype) + " (f32, f16 or bf16 expected)");
    const auto [out, in] = target_shape(c, target);
    const std::vector<int64_t> want = is_b ? std::vector<int64_t>{out, rank_} : std::vector<int64_t>{rank_, in};
    if (t.shape != want) {
      TensorView w;
      w.shape = want;
      throw Error(ErrorCode::kInvalidArgument, weights_path + ": tensor " + name + " has shape " + t.shape_string() + ", the model needs " +
                                                   w.shape_string() + " (rank " + std::to_string(rank_) + ")");
    }
    seen[size_t(layer)][size_t(target)] |= is_b ? 2 : 1;
    bytes_ += size_t(t.numel()) * sizeof(float);
    if (!read_matrices) continue;
    LoraPair& pair = layers_[size_t(layer)][size_t(target)];
    std::vector<float>& dst = is_b ? pair.b : pair.a;
    dst.resize(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); i++) dst[size_t(i)] = t.float_at(i) * (is_b ? scale_ : 1.f);
    mix(name.data(), name.size());
    mix(t.data, t.nbytes);
  }
  bool any = false;
  for (size_t l = 0; l < layers_.size(); l++)
    for (int t = 0; t < kNumLoraTargets; t++) {
      const uint8_t has = seen[l][size_t(t)];
      if (has == 1 || has == 2)
        invalid(weights_path, std::string("layer ") + std::to_string(l) + " " + kTargetNames[t] + " has only one of lora_A and lora_B");
      any = any || has == 3;
    }
  if (!any) invalid(weights_path, "no LoRA matrices");
  mix(&scale_, sizeof scale_);
  content_key_ = hash;
}

std::shared_ptr<void> LoraAdapter::device_copy(int device, const std::function<std::shared_ptr<void>()>& make) const {
  std::lock_guard<std::mutex> lock(copies_mu_);
  for (const auto& [d, copy] : copies_)
    if (d == device) return copy;
  std::shared_ptr<void> copy = make();
  copies_.emplace_back(device, copy);
  return copy;
}

}  // namespace sluice
