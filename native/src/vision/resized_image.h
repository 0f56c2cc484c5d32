// An image resized to what a vision tower reads, kept as 8-bit RGB (3 bytes a pixel, where the
// tower's float input is 12 to 24) until the tower runs, with the SHA-256 that keys it in the
// prefix and encoder caches. The float input is a fixed function of these bytes for a given model
// (its processor's normalisation and layout), so the hash of the bytes names it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vision/image_preprocess.h"

namespace sluice::vision {

struct ResizedImage {
  std::unique_ptr<uint8_t[]> rgb;  // [height, width, 3]
  int width = 0, height = 0;
  // SHA-256 of width and height (4 bytes each, little-endian) followed by rgb.
  std::array<uint8_t, 32> sha256{};

  size_t bytes() const { return size_t(width) * size_t(height) * 3; }
};

// rgb [height, width, 3] resized with `filter` to [out_height, out_width, 3], and hashed.
std::shared_ptr<const ResizedImage> resize_for_encoder(ResizeFilter filter, const uint8_t* rgb, int width, int height,
                                                       int out_width, int out_height);

// The SHA-256 ResizedImage::sha256 holds for these pixels.
std::array<uint8_t, 32> resized_image_hash(const uint8_t* rgb, int width, int height);

// The Qwen2-VL patch rows of the image (image_preprocess.h's qwen2vl_patches).
std::vector<float> qwen2vl_patch_rows(const ResizedImage& image, int patch, int merge, int temporal, const float* tables);

// The image channels first (image_preprocess.h's channels_first).
std::vector<float> channels_first_values(const ResizedImage& image, const float* tables);

}  // namespace sluice::vision
