// One image handed to a vision encoder's encode_batch: its pixel values as the processor gives
// them (num_values floats, owned by the caller for the call) and its grid (t, h, w) in patches.
// What the values hold depends on the encoder: Qwen2.5-VL takes patch rows [t*h*w, patch_dim],
// SigLIP one image [num_channels, image_size, image_size].
#pragma once
#include <cstdint>

namespace sluice::vision {

struct EncoderImage {
  const float* pixel_values = nullptr;
  int64_t num_values = 0;
  int t = 0, h = 0, w = 0;
};

}  // namespace sluice::vision
