// The Qwen2.5-VL vision tower on the CPU (Qwen2_5_VisionTransformerPretrainedModel): the
// processor's patch rows of one image in, its image embeddings (one per merged token, in the
// processor's order) out, computed in f32 with the CPU kernels over the checkpoint's weights used
// in place (f32, bf16 or f16). test/reference/qwen2-5-vl.ts's visionEncode is the float64
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

// Qwen2_5_VLVisionConfig: config.json's vision_config, its defaults filling what it leaves out.
struct VisionConfig {
  int64_t depth = 32;
  int64_t hidden = 3584;
  int64_t intermediate = 3420;
  int64_t num_heads = 16;
  int64_t in_chans = 3;
  int64_t patch = 14;
  int64_t merge = 2;
  int64_t temporal = 2;
  int64_t window_size = 112;  // pixels
  int64_t out_hidden = 3584;
  std::vector<int64_t> fullatt_blocks = {7, 15, 23, 31};

  int64_t head_dim() const { return hidden / num_heads; }
  int64_t patch_dim() const { return in_chans * temporal * patch * patch; }
  int64_t unit() const { return merge * merge; }  // patch rows per merged token
  int64_t window_merged() const { return window_size / merge / patch; }  // a window's side in merged tokens
};

class VisionEncoder {
 public:
  // Reads <model_dir>/config.json's vision_config and binds every visual.* (or model.visual.*)
  // tensor, shapes checked. kUnsupportedModel without a vision_config or with an activation other
  // than silu; kModelFileInvalid naming the tensor that is missing or misshapen.
  static std::unique_ptr<VisionEncoder> load(const std::string& model_dir, int num_threads);

  // pixel_values [rows, patch_dim] of one image in the processor's row order, grid (t, h, w) in
  // patches -> [tokens_for(t, h, w), out_hidden()] row-major. kInvalidArgument when the grid does
  // not fit the rows. One encode at a time per encoder: concurrent calls wait for each other (the
  // pool runs one parallel region at a time).
  std::vector<float> encode(const float* pixel_values, int64_t rows, int64_t patch_dim, int t, int h, int w) const;

  // Several images in one pass: each image's num_values = rows * config().patch_dim() values,
  // checked as encode checks them (every image before anything is computed; with more than one
  // image the message names it, "image i: ..."). The linear layers run once over all images'
  // rows; attention, rotary positions and windows stay per image. One output per image, in order,
  // each what encode() gives that image alone (bit for bit: the kernels are batch invariant).
  std::vector<std::vector<float>> encode_batch(const std::vector<EncoderImage>& images) const;

  // Throws what encode_batch throws for `images` (kInvalidArgument naming the image), computing nothing.
  void check_batch(const std::vector<EncoderImage>& images) const;

  int64_t out_hidden() const { return cfg_.out_hidden; }
  int64_t tokens_for(int t, int h, int w) const { return int64_t(t) * h * w / cfg_.unit(); }
  const VisionConfig& config() const { return cfg_; }

  // The checkpoint's tensors as bound at load (memory-mapped; valid while the encoder lives), for
  // the CUDA tower's upload (cuda/vision_tower.h).
  struct Linear {
    const TensorView* w = nullptr;  // [out, in]
    const TensorView* b = nullptr;  // [out]
  };
  struct Block {
    const TensorView* norm1 = nullptr;
    const TensorView* norm2 = nullptr;
    Linear qkv, proj, gate, up, down;
  };
  const TensorView& patch_embed() const { return *patch_embed_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  const TensorView& merger_norm() const { return *ln_q_; }
  const Linear& merger_fc1() const { return fc1_; }
  const Linear& merger_fc2() const { return fc2_; }
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }  // [head_dim / 4]

 private:
  VisionEncoder() = default;
  void validate(int64_t rows, int64_t patch_dim, int t, int h, int w, const std::string& where = "") const;
  void linear(const float* x, int64_t T, int64_t K, const Linear& l, int64_t N, float* y) const;

  VisionConfig cfg_;
  std::unique_ptr<SafetensorsModel> model_;
  const TensorView* patch_embed_ = nullptr;  // [hidden, in_chans, temporal, patch, patch]
  std::vector<Block> blocks_;
  const TensorView* ln_q_ = nullptr;
  Linear fc1_, fc2_;  // merger mlp.0 [hidden*unit, hidden*unit], mlp.2 [out_hidden, hidden*unit]
  std::vector<float> inv_freq_;  // [head_dim / 4]
  mutable std::unique_ptr<cpu::ThreadPool> pool_;
  mutable std::mutex mu_;  // one encode at a time
};

}  // namespace sluice::vision
