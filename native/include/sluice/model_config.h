// The model hyper-parameters the engine needs, read from a Hugging Face config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

enum class RopeScaling { None, Linear, Llama3 };

struct ModelConfig {
  std::string architecture;  // config.json architectures[0], e.g. "Qwen2ForCausalLM"
  std::string model_type;    // "llama" | "mistral" | "qwen2" | "qwen3"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  RopeScaling rope_scaling = RopeScaling::None;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 (and Llama/Mistral with attention_bias: true)
  bool o_bias = false;    // Llama/Mistral with attention_bias: true
  bool mlp_bias = false;
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k before RoPE

  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor) & ~int64_t(1); }
  // Inverse frequencies for RoPE with the configured scaling applied: [rotary_dim/2].
  std::vector<float> rope_inv_freq() const;
};

// Architectures the engine implements, for error messages.
const char* supported_architectures();

// Parses config.json text. `source` names the file in errors. Throws sluice::Error
// (kModelFileInvalid for malformed or inconsistent fields, kUnsupportedModel otherwise).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace sluice
