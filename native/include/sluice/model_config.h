// The model hyper-parameters the engine needs, read from a Hugging Face config.json.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

enum class RopeScaling { None, Linear, Llama3, Yarn };
// The gated MLP's activation. SwigluClamped (gpt-oss): gate clamped to <= limit, up to
// [-limit, limit], out = (up + 1) * gate * sigmoid(1.702 * gate).
enum class Activation { Silu, GeluTanh, SwigluClamped };
// How a mixture-of-experts router weighs a token's experts: softmax over all experts then the
// top k (Qwen3-MoE, Mixtral), or the top k logits then a softmax over those (gpt-oss).
enum class Routing { SoftmaxTopK, TopKSoftmax };

// How an FP8 checkpoint scales its F8_E4M3 linear weights (weight = e4m3 value * scale):
// Block: "<name>_scale_inv" [ceil(rows / block_rows), ceil(cols / block_cols)] (quant_method fp8);
// Tensor: "<name>_scale" [] or [1] (compressed-tensors strategy tensor, ModelOpt FP8);
// Channel: "<name>_scale" [rows, 1] (compressed-tensors strategy channel).
enum class Fp8Scales { None, Block, Tensor, Channel };

// config.json's quantization_config, as far as loading needs it. Activation scales (input_scale)
// are not read: the CPU dequantizes FP8 weights to bf16 at load and computes as for bf16.
// Integer weight-only formats: AWQ (qweight [in, out / 8] packed along the outputs in AWQ's
// interleaved nibble order) and GPTQ (qweight [in * bits / 32, out] packed along the inputs,
// g_idx giving each input's group). Both: qzeros packed along the outputs, scales [groups, out].
enum class IntFormat { None, Awq, Gptq };

struct QuantizationConfig {
  std::string method;  // quant_method: "" (none), "mxfp4", "fp8", "compressed-tensors", "modelopt", "awq", "gptq"
  Fp8Scales fp8 = Fp8Scales::None;
  int64_t block_rows = 0, block_cols = 0;  // Fp8Scales::Block: weight_block_size
  IntFormat int_format = IntFormat::None;
  int64_t bits = 0;        // 4 (AWQ, GPTQ) or 8 (GPTQ)
  int64_t group_size = 0;  // input features per scale; 0: one group over all inputs (GPTQ's -1)
  bool zero_offset = false;  // GPTQ's original format: zeros are stored minus one
};

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
  double rope_beta_fast = 32, rope_beta_slow = 1;  // YaRN's correction range (in rotations)
  bool rope_truncate = true;                       // YaRN: correction range rounded outwards
  double rope_attention_factor = 1.0;              // YaRN: cos/sin scaled by it (scores by its square)
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 (and Llama/Mistral with attention_bias: true)
  bool o_bias = false;    // Llama/Mistral with attention_bias: true
  bool mlp_bias = false;
  bool qk_norm = false;   // Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE

  // Pieces of the decoder layer some families turn on (model/architectures.h says which).
  bool norm_plus_one = false;   // Gemma: RMSNorm scales by (1 + w) (folded into the weights at load)
  bool sandwich_norms = false;  // Gemma: attention and MLP outputs normed before the residual add
  double embed_scale = 1.0;     // Gemma: sqrt(hidden_size)
  Activation activation = Activation::Silu;
  double attention_scale = 0;       // softmax scale; 0: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
  double final_logit_softcap = 0;   // logits = cap * tanh(logits / cap) when > 0
  // Per layer: the attention window (keys j with j > pos - window; 0 = full causal), and
  // whether its rope uses rope_local_theta without scaling (Gemma 3's local layers).
  std::vector<int64_t> layer_window;
  std::vector<uint8_t> layer_local_rope;
  double rope_local_theta = 10000.0;

  // Mixture of experts (0 experts: every layer dense). A sparse layer routes each token to its
  // experts_per_token best experts of num_experts, by softmax of the router's logits; the k
  // weights are renormalised to sum 1 when norm_topk_prob.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  Routing routing = Routing::SoftmaxTopK;
  bool router_bias = false;    // gpt-oss: the router has a bias
  bool expert_bias = false;    // gpt-oss: the experts' projections have biases
  double swiglu_limit = 7.0;   // Activation::SwigluClamped's limit
  bool attention_sinks = false;  // gpt-oss: a learned logit per head joins every softmax (and takes its share)
  std::vector<uint8_t> layer_sparse;  // [num_layers]

  // Qwen2-VL's multimodal rope (M-RoPE): rotary pair i takes its position from the token's time,
  // height or width component, whichever of mrope_section's three consecutive ranges holds i. A
  // text token's three components are equal, which is plain rope. All zero: not an M-RoPE model.
  std::array<int64_t, 3> mrope_section{0, 0, 0};
  // Vision-language checkpoints: the placeholder token whose rows take image embeddings (-1: none).
  int64_t image_token_id = -1;
  // Gemma 3: an image's tokens attend to each other in both directions (the rest stays causal), so
  // an image is never split across prefill chunks (engine.cpp).
  bool image_attention_bidirectional = false;

  QuantizationConfig quantization;

  bool is_sparse(int64_t layer) const { return !layer_sparse.empty() && layer_sparse[size_t(layer)] != 0; }
  int64_t window(int64_t layer) const { return layer_window.empty() ? 0 : layer_window[size_t(layer)]; }
  bool local_rope(int64_t layer) const { return !layer_local_rope.empty() && layer_local_rope[size_t(layer)] != 0; }
  bool any_window() const;
  // The softmax scale of attention scores: attention_scale (or 1/sqrt(head_dim)) times YaRN's
  // attention factor squared (it scales both q and k).
  double softmax_scale() const;
  bool any_local_rope() const;
  bool mrope() const { return mrope_section[0] > 0; }

  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor) & ~int64_t(1); }
  // Inverse frequencies for RoPE with the configured scaling applied: [rotary_dim/2].
  std::vector<float> rope_inv_freq() const;
  // Gemma 3's local layers: rope_local_theta, no scaling.
  std::vector<float> rope_local_inv_freq() const;
};

// Architectures the engine implements, for error messages.
const char* supported_architectures();

// Parses config.json text. `source` names the file in errors. Throws sluice::Error
// (kModelFileInvalid for malformed or inconsistent fields, kUnsupportedModel otherwise).
// as_architecture: read the fields as this table architecture's whatever the file names (an
// EAGLE-3 head's config describes a Llama layer under an architecture of its own).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source,
                               const char* as_architecture = nullptr);

}  // namespace sluice
