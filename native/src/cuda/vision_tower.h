// The vision towers on a CUDA device: Qwen2.5-VL (window attention, 2D rotary positions, the
// patch merger) and Gemma 3's SigLIP with its projector, the CPU towers' computation
// (vision/qwen2_vl_encoder.h, vision/siglip_encoder.h) with the decoder's kernels: tensor-core
// GEMMs with activations in the checkpoint's bf16 / f16 between them (f32 residual stream, norms
// and softmax), and attention through the flash prefill kernel, each window, frame or image a
// sequence of its own whose tokens all see each other (AttentionArgs::last), heads zero padded to
// the kernel's head dims (Qwen's 80 and SigLIP's 72 run as 128).
//
// A tower is built from the loaded CPU encoder (its bound tensors are uploaded once, then only its
// configuration and checks are used) and keeps its own stream and buffers on `device`. The images
// of one encode_batch run in passes of whole images of at most kPassRows rows together (an image
// with more runs alone); the buffers grow to the largest pass seen and are kept.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vision/encoder_image.h"

namespace sluice::vision {
class VisionEncoder;
class SiglipEncoder;
}  // namespace sluice::vision

namespace sluice::cuda {

class VisionTower {
 public:
  virtual ~VisionTower() = default;

  // kUnsupportedModel when a head is wider than 256; kOutOfMemory (via the CUDA checks) when the
  // weights do not fit. Uploads synchronously. flash_attention false runs attention through the
  // per-token paged kernel instead (the same results; the tests compare both).
  static std::unique_ptr<VisionTower> qwen2vl(std::shared_ptr<const vision::VisionEncoder> cpu, int device,
                                              bool flash_attention = true);
  static std::unique_ptr<VisionTower> siglip(std::shared_ptr<const vision::SiglipEncoder> cpu, int device,
                                             bool flash_attention = true);

  // What the CPU tower's encode_batch returns for `images` (its checks and errors, then one output
  // per image), within the CUDA tolerances of bf16 activations. One call at a time runs; others wait.
  virtual std::vector<std::vector<float>> encode_batch(const std::vector<vision::EncoderImage>& images) = 0;

  // Device bytes held: the weights, and the pass buffers as they stand.
  virtual size_t device_bytes() const = 0;

  // Rows (patch rows) of the images a pass holds together.
  static constexpr int64_t kPassRows = 16384;
};

}  // namespace sluice::cuda
