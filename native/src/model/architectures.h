// The model families the engine serves, as one table: for each, the tensor layout its
// checkpoints use and the optional pieces of the decoder layer it turns on. The config reader
// (model_config.cpp), both weight binders (model_weights.cpp, and the CUDA upload that reads
// what it bound) and the decoder (engine/decoder.h) read it; the TypeScript side's mirror is
// src/engine/architectures.ts (test/architectures.test.ts checks they agree).
//
// Adding a family: one row here (and in the TypeScript table), then any operation its layer
// needs that the backends lack (engine/decoder.h lists them).
#pragma once
#include <cstdint>
#include <string>

namespace sluice {

// How a family's feed-forward blocks are laid out.
enum class MlpLayout : uint8_t {
  kDense,     // mlp.{gate,up,down}_proj
  kQwen3Moe,  // mlp.gate (router) + mlp.experts.E.{gate,up,down}_proj; dense layers as kDense
  kMixtral,   // block_sparse_moe.gate (router) + block_sparse_moe.experts.E.{w1 (gate), w3 (up), w2 (down)}
  kGptOss,    // mlp.router (with bias) + mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}: MXFP4, all experts in one tensor
};

// How config.json turns sliding-window attention on, per family.
enum class WindowRule : uint8_t {
  kSlidingWindowSet,  // Mistral: sliding_window non-null (served within the window: see model_config.cpp)
  kUseSlidingWindow,  // Llama, Qwen: use_sliding_window true (served within the window)
  kLayerTypes,        // Gemma 3, gpt-oss: layer_types (or the family's default pattern); real windows
};

struct ArchSpec {
  const char* architecture;  // config.json architectures[0]
  const char* model_type;    // its model_type (assumed when config.json has none)
  bool qkv_bias;             // q/k/v biases whatever attention_bias says (Qwen2)
  bool qk_norm;              // per-head RMSNorm of q and k before rope (Qwen3, Gemma 3)
  MlpLayout mlp;
  bool gemma_norms;          // RMSNorm scales by (1 + w); embeddings scaled by sqrt(hidden)
  bool sandwich_norms;       // norms after the attention and MLP outputs, and before the MLP (Gemma)
  WindowRule window;
  const char* text_config;   // key of the nested text config (multimodal checkpoints), or nullptr
  const char* prefix;        // tensor name prefix of the decoder ("model." or "language_model.model.")
};

// Rows in the order the TypeScript table lists them.
extern const ArchSpec kArchitectures[];
extern const int kNumArchitectures;

// The row of `architecture`, else of `model_type` when architecture is empty; nullptr if none.
const ArchSpec* find_architecture(const std::string& architecture, const std::string& model_type);

}  // namespace sluice
