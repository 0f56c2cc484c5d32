// Where the Qwen2.5-VL tower's rows go for a batch of images, shared by the CPU and CUDA towers.
// The processor gives each image's patch rows merge group by merge group; the tower reorders
// whole merged tokens window by window (get_window_index) so that window attention runs over
// contiguous rows, and the images' rows are concatenated. Attention segments (windows, frames)
// never cross an image; the merger's output is put back in the processor's order per image.
#pragma once
#include <cstdint>
#include <vector>

#include "vision/encoder_image.h"

namespace sluice::vision {

struct Qwen2VlBatchLayout {
  std::vector<int64_t> row0;                  // [images + 1]: image i owns rows [row0[i], row0[i + 1])
  std::vector<std::vector<int64_t>> windows;  // per image: its merged tokens in window order
  std::vector<const float*> src;              // [rows]: the patch row (patch_dim values) each row holds
  std::vector<int32_t> row, col;              // [rows]: that patch's row and column in the image, in patches
  std::vector<int64_t> cu_window;             // row boundaries of every non-empty window, all images
  std::vector<int64_t> cu_frames;             // row boundaries of every frame, all images
  int64_t rows() const { return row0.back(); }
};

// The layout of `images` (already checked: whole merge groups, t * h * w rows of patch_dim values
// each) for windows of `window` merged tokens per side.
Qwen2VlBatchLayout qwen2vl_batch_layout(const std::vector<EncoderImage>& images, int64_t patch_dim, int64_t merge,
                                        int64_t window);

// Splits the merger's output y ([rows / unit, out_hidden], window order, all images) into one
// output per image in the processor's order.
std::vector<std::vector<float>> qwen2vl_unwindow(const Qwen2VlBatchLayout& layout, const float* y, int64_t unit,
                                                 int64_t out_hidden);

}  // namespace sluice::vision
