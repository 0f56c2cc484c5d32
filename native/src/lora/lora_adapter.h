// LoRA adapters in PEFT's layout (issue 36): adapter_config.json (r, lora_alpha, target_modules,
// use_rslora) and adapter_model.safetensors with, per adapted projection,
// `...layers.N.{self_attn,mlp}.<proj>.lora_A.weight` [r, in] and `lora_B.weight` [out, r]. The
// adapted projection computes W x + scale * B (A x), scale = lora_alpha / r (lora_alpha / sqrt(r)
// with use_rslora). Loaded once into f32 (the scale folded into B); the backend adds the low-rank
// product to the base projection's output for the rows of the sequences that use the adapter.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sluice/model_config.h"

namespace sluice {

// The projections an adapter may adapt, in this order.
enum class LoraTarget : uint8_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumLoraTargets = 7;
constexpr int64_t kMaxLoraRank = 64;

struct LoraPair {
  std::vector<float> a;  // [r, in]
  std::vector<float> b;  // [out, r], times the adapter's scale
  bool present() const { return !a.empty(); }
};

class LoraAdapter {
 public:
  // Reads `dir` for a model with config `c`. Throws kModelFileMissing / kModelFileInvalid naming
  // the file or tensor, kUnsupportedModel for what the engine does not adapt (experts, DoRA,
  // ranks over kMaxLoraRank), kInvalidArgument for an adapter of other shapes.
  LoraAdapter(const std::string& dir, const ModelConfig& c) : LoraAdapter(dir, c, true) {}

  // What the constructor checks (the config, every tensor's name, dtype and shape), without reading
  // the matrices: the rank and the bytes the adapter would hold. Throws as the constructor does.
  struct Summary {
    int64_t rank = 0;
    size_t bytes = 0;
  };
  static Summary inspect(const std::string& dir, const ModelConfig& c);

  int64_t rank() const { return rank_; }
  float scale() const { return scale_; }
  // Identifies the adapter's weights (FNV-1a over its files): part of its sequences' block hashes.
  uint64_t content_key() const { return content_key_; }
  size_t bytes() const { return bytes_; }
  const LoraPair& pair(int64_t layer, LoraTarget t) const { return layers_[size_t(layer)][size_t(t)]; }
  int64_t num_layers() const { return int64_t(layers_.size()); }

  // The CUDA backend's copy of the matrices on CUDA device `device`: made by `make` on the first
  // step that uses the adapter there, then shared by every engine on that device, and released
  // with the adapter, when its last holder lets go (the engine's table, the sequences using it).
  // Thread-safe. The adapter never looks inside: the deleter `make` gave frees the memory.
  std::shared_ptr<void> device_copy(int device, const std::function<std::shared_ptr<void>()>& make) const;

 private:
  LoraAdapter(const std::string& dir, const ModelConfig& c, bool read_matrices);

  int64_t rank_ = 0;
  float scale_ = 1.f;
  uint64_t content_key_ = 0;
  size_t bytes_ = 0;
  std::vector<std::array<LoraPair, kNumLoraTargets>> layers_;
  mutable std::mutex copies_mu_;
  mutable std::vector<std::pair<int, std::shared_ptr<void>>> copies_;  // (device, copy)
};

}  // namespace sluice
