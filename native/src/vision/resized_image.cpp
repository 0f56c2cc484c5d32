#include "vision/resized_image.h"

#include "util/sha256.h"

namespace sluice::vision {

std::array<uint8_t, 32> resized_image_hash(const uint8_t* rgb, int width, int height) {
  uint8_t dims[8];
  for (int i = 0; i < 4; i++) {
    dims[i] = uint8_t(uint32_t(width) >> (8 * i));
    dims[4 + i] = uint8_t(uint32_t(height) >> (8 * i));
  }
  Sha256 h;
  h.update(dims, sizeof dims);
  h.update(rgb, size_t(width) * size_t(height) * 3);
  return h.finish();
}

std::shared_ptr<const ResizedImage> resize_for_encoder(ResizeFilter filter, const uint8_t* rgb, int width, int height,
                                                       int out_width, int out_height) {
  auto image = std::make_shared<ResizedImage>();
  image->width = out_width;
  image->height = out_height;
  // Not zero-filled: the resize writes every byte.
  image->rgb.reset(new uint8_t[image->bytes()]);
  resize_rgb(filter, rgb, width, height, image->rgb.get(), out_width, out_height);
  image->sha256 = resized_image_hash(image->rgb.get(), out_width, out_height);
  return image;
}

std::vector<float> qwen2vl_patch_rows(const ResizedImage& image, int patch, int merge, int temporal, const float* tables) {
  std::vector<float> out(size_t(image.width) * size_t(image.height) * 3 * size_t(temporal));
  qwen2vl_patches(image.rgb.get(), image.width, image.height, patch, merge, temporal, tables, out.data());
  return out;
}

std::vector<float> channels_first_values(const ResizedImage& image, const float* tables) {
  std::vector<float> out(image.bytes());
  channels_first(image.rgb.get(), image.width, image.height, tables, out.data());
  return out;
}

}  // namespace sluice::vision
