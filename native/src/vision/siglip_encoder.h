// Gemma 3's vision tower on the CPU: SigLIP (SiglipVisionModel) and Gemma3MultiModalProjector.
// One image's pixel values [3, image_size, image_size] in, its mm_tokens_per_image soft tokens of
// the text model's width out, computed in f32 with the CPU kernels over the checkpoint's weights
// used in place (f32, bf16 or f16). test/reference/gemma3-vl.ts's siglipEncode is the float64
// reference the tests hold it to.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "model/safetensors.h"
#include "vision/encoder_image.h"

namespace sluice::vision {

// config.json's architectures[0], or "" when it names none. kModelFileMissing without a
// config.json, kModelFileInvalid when it is not JSON.
std::string model_architecture(const std::string& model_dir);

// SiglipVisionConfig (config.json's vision_config) and the projector's sizes, defaults filling
// what the config leaves out.
struct SiglipConfig {
  // Transformers' defaults (SiglipVisionConfig, Gemma3Config, Gemma3TextConfig); Gemma 3's
  // checkpoints set 1152, 4304, 27, 16, 896 and 14.
  int64_t hidden = 768;
  int64_t intermediate = 3072;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch = 16;
  float eps = 1e-6f;            // layer_norm_eps: the LayerNorms' and the projector's RMSNorm's
  int64_t mm_tokens = 256;      // mm_tokens_per_image
  int64_t text_hidden = 2304;   // text_config.hidden_size: the output width

  int64_t head_dim() const { return hidden / num_heads; }
  int64_t side() const { return image_size / patch; }  // patches per side
  int64_t num_patches() const { return side() * side(); }
  int64_t patch_dim() const { return num_channels * patch * patch; }
  int64_t pixel_values() const { return num_channels * image_size * image_size; }
  int64_t pool() const;  // the projector's average-pool kernel and stride, in patches
};

class SiglipEncoder {
 public:
  // Reads <model_dir>/config.json (architecture Gemma3ForConditionalGeneration) and binds every
  // vision_tower.vision_model.* and multi_modal_projector.* tensor, shapes checked.
  // kUnsupportedModel for another architecture or an activation other than gelu_pytorch_tanh;
  // kModelFileInvalid for sizes that do not fit together, or naming the tensor that is missing or
  // misshapen.
  static std::unique_ptr<SiglipEncoder> load(const std::string& model_dir, int num_threads);

  // pixel_values [num_channels, image_size, image_size] channels first, as the processor gives
  // them (num_values of them), grid (t, h, w) in patches: (1, image_size / patch, image_size /
  // patch) -> [mm_tokens, text_hidden] row-major. kInvalidArgument when the values or the grid
  // are not one whole image. One encode at a time per encoder: concurrent calls wait for each
  // other (the pool runs one parallel region at a time).
  std::vector<float> encode(const float* pixel_values, int64_t num_values, int t, int h, int w) const;

  // Several images in one pass, each checked as encode checks it (every image before anything is
  // computed; with more than one image the message names it, "image i: ..."). The linear layers
  // and the projection run once over all images' patches; attention and pooling stay per image.
  // One output per image, in order, each what encode() gives that image alone (bit for bit: the
  // kernels are batch invariant).
  std::vector<std::vector<float>> encode_batch(const std::vector<EncoderImage>& images) const;

  // Throws what encode_batch throws for `images` (kInvalidArgument naming the image), computing nothing.
  void check_batch(const std::vector<EncoderImage>& images) const;

  int64_t out_hidden() const { return cfg_.text_hidden; }
  const SiglipConfig& config() const { return cfg_; }

  // The weights as bound at load (tensors memory-mapped, valid while the encoder lives; norms,
  // position embeddings and the projection in f32), for the CUDA tower's upload (cuda/vision_tower.h).
  struct Linear {
    const TensorView* w = nullptr;  // [out, in]
    const TensorView* b = nullptr;  // [out]
  };
  struct Norm {
    std::vector<float> w, b;  // [hidden] each, f32
  };
  struct Block {
    Norm norm1, norm2;
    Linear q, k, v, out, fc1, fc2;
  };
  const TensorView& patch_weight() const { return *patch_w_; }  // [hidden, num_channels, patch, patch]
  const TensorView& patch_bias() const { return *patch_b_; }
  const std::vector<float>& position_embedding() const { return pos_; }  // [num_patches, hidden]
  const std::vector<Block>& blocks() const { return blocks_; }
  const Norm& post_norm() const { return post_norm_; }
  const std::vector<float>& soft_norm() const { return soft_norm_; }   // [hidden]: 1 + mm_soft_emb_norm.weight
  const std::vector<float>& projection_t() const { return proj_t_; }   // [text_hidden, hidden]

 private:
  SiglipEncoder() = default;
  void validate(const EncoderImage& image, const std::string& where) const;
  void linear(const float* x, int64_t T, int64_t K, const Linear& l, int64_t N, float* y) const;
  void layer_norm(const float* x, int64_t T, const Norm& n, float* out) const;
  // attn[N, hidden] = softmax(q k^T * head_dim^-0.5) v per head, every patch attending to all.
  void attention(const float* q, const float* k, const float* v, int64_t N, float* attn) const;

  SiglipConfig cfg_;
  std::unique_ptr<SafetensorsModel> model_;
  const TensorView* patch_w_ = nullptr;  // [hidden, num_channels, patch, patch], used as [hidden, patch_dim]
  const TensorView* patch_b_ = nullptr;  // [hidden]
  std::vector<float> pos_;               // [num_patches, hidden] position embeddings, f32
  std::vector<Block> blocks_;
  Norm post_norm_;
  std::vector<float> soft_norm_;         // [hidden] 1 + mm_soft_emb_norm.weight
  std::vector<float> proj_t_;            // [text_hidden, hidden] mm_input_projection_weight transposed, f32
  mutable std::unique_ptr<cpu::ThreadPool> pool_;
  mutable std::mutex mu_;  // one encode at a time
};

}  // namespace sluice::vision
