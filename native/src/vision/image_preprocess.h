// Image preprocessing for vision-language models, the heavy half of src/vision/ (which chooses the
// sizes and the normalisation tables): Pillow's bicubic resize of 8-bit RGB, exactly, and the
// Qwen2-VL patch layout. Pure functions of their inputs, run on the addon's worker pool.
#pragma once
#include <cstdint>

namespace sluice::vision {

// rgb [height, width, 3] resized to [out_height, out_width, 3] as Pillow's Image.resize with
// BICUBIC does it: per axis, a bicubic (a = -0.5) kernel whose support widens with the downscale
// factor, weights normalised per output pixel and rounded to 22-bit fixed point, the horizontal
// pass first into 8 bits over the rows the vertical pass reads, then the vertical pass; each
// output the rounded fixed-point sum clipped to 0..255. Same size: a copy.
void resize_bicubic_rgb(const uint8_t* rgb, int width, int height, uint8_t* out, int out_width, int out_height);

// The same resampling with Pillow's other filters: BICUBIC as above, or BILINEAR (a triangle of
// support 1, widened with the downscale factor as bicubic's is) as Gemma 3's processor uses.
enum class ResizeFilter { kBicubic, kBilinear };
void resize_rgb(ResizeFilter filter, const uint8_t* rgb, int width, int height, uint8_t* out, int out_width,
                int out_height);

// rgb [height, width, 3] as channels-first floats [3, height, width], a value being
// tables[channel * 256 + byte] (Gemma 3's processor: rescaled and normalised).
void channels_first(const uint8_t* rgb, int width, int height, const float* tables, float* out);

// The Qwen2-VL processor's patch rows of an already resized image rgb [height, width, 3]:
// [(height / patch) * (width / patch), 3 * temporal * patch * patch] floats, rows ordered by merge
// group (group row, group column, row in group, column in group), each row channel-major, then
// the temporal copies (identical for an image), then the patch's pixels row-major; a pixel's value
// is tables[channel * 256 + byte]. height and width are multiples of patch * merge.
void qwen2vl_patches(const uint8_t* rgb, int width, int height, int patch, int merge, int temporal, const float* tables,
                     float* out);

}  // namespace sluice::vision
