#include "model/architectures.h"

namespace sluice {

// architecture, model_type, qkv_bias, qk_norm, mlp, gemma_norms, sandwich_norms, window, text_config, prefix
const ArchSpec kArchitectures[] = {
    {"LlamaForCausalLM", "llama", false, false, MlpLayout::kDense, false, false, WindowRule::kUseSlidingWindow, nullptr, "model."},
    {"MistralForCausalLM", "mistral", false, false, MlpLayout::kDense, false, false, WindowRule::kSlidingWindowSet, nullptr, "model."},
    {"Qwen2ForCausalLM", "qwen2", true, false, MlpLayout::kDense, false, false, WindowRule::kUseSlidingWindow, nullptr, "model."},
    {"Qwen3ForCausalLM", "qwen3", false, true, MlpLayout::kDense, false, false, WindowRule::kUseSlidingWindow, nullptr, "model."},
    {"Qwen3MoeForCausalLM", "qwen3_moe", false, true, MlpLayout::kQwen3Moe, false, false, WindowRule::kUseSlidingWindow, nullptr, "model."},
    {"MixtralForCausalLM", "mixtral", false, false, MlpLayout::kMixtral, false, false, WindowRule::kSlidingWindowSet, nullptr, "model."},
    {"Gemma3ForCausalLM", "gemma3_text", false, true, MlpLayout::kDense, true, true, WindowRule::kLayerTypes, nullptr, "model."},
    {"Gemma3ForConditionalGeneration", "gemma3", false, true, MlpLayout::kDense, true, true, WindowRule::kLayerTypes, "text_config", "language_model.model."},
    // Qwen2.5-VL's language model: Qwen2 layers with M-RoPE (the vision tower, visual.*, is read
    // by vision/qwen2_vl_encoder.h); published with the text fields at the top level.
    {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", true, false, MlpLayout::kDense, false, false, WindowRule::kUseSlidingWindow, nullptr, "model."},
    {"GptOssForCausalLM", "gpt_oss", false, false, MlpLayout::kGptOss, false, false, WindowRule::kLayerTypes, nullptr, "model."},
};
const int kNumArchitectures = int(sizeof(kArchitectures) / sizeof(kArchitectures[0]));

const ArchSpec* find_architecture(const std::string& architecture, const std::string& model_type) {
  for (const ArchSpec& a : kArchitectures)
    if (!architecture.empty() ? architecture == a.architecture : model_type == a.model_type) return &a;
  return nullptr;
}

}  // namespace sluice
