// Internal to image_preprocess.cpp: the two passes of Pillow's bicubic resize, as a portable
// reference and as AVX2 kernels (resize_avx2.cpp) that give the same bytes. Not part of the
// vision API.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "vision/image_preprocess.h"

// Whether this build has the AVX2 kernels (x86-64 with GCC or Clang); the caller also asks the
// CPU (cpu::simd_level()).
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define SLUICE_VISION_AVX2 1
#else
#define SLUICE_VISION_AVX2 0
#endif

namespace sluice::vision::detail {

constexpr int kPrecisionBits = 22;  // Pillow's 8-bit path: 32 - 8 - 2

// One axis of the resize: output i reads count[i] inputs from first[i] with weights
// [i * taps, i * taps + count[i]) of `weights`, Pillow's 22-bit fixed point (the rest are 0).
struct Coefficients {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out, taps]
};

Coefficients bicubic_coefficients(int in_size, int out_size);
Coefficients resize_coefficients(ResizeFilter filter, int in_size, int out_size);

// Horizontal pass of one row: in_row [in_width, 3] -> out_row [out_width, 3]. The AVX2 kernel
// reads a little past a pixel's last tap (never changing a result) where `in_readable`, the bytes
// readable from in_row on, allows, and writes up to 16 bytes past the row's end (slack the
// caller provides). Its weights are laid out once per resize by horizontal_weights_avx2.
void horizontal_row_scalar(const uint8_t* in_row, const Coefficients& h, uint8_t* out_row, int out_width);
std::vector<int16_t> horizontal_weights_avx2(const Coefficients& h);
void horizontal_row_avx2(const uint8_t* in_row, size_t in_readable, const Coefficients& h,
                         const std::vector<int16_t>& weights, uint8_t* out_row, int out_width);

// Vertical pass of one output row: out [row_bytes] = the rows rows[0..n) weighted by k[0..n).
// `acc` is scratch of row_bytes int32 for the scalar version.
void vertical_row_scalar(const uint8_t* const* rows, const int32_t* k, int n, size_t row_bytes, uint8_t* out,
                         int32_t* acc);
void vertical_row_avx2(const uint8_t* const* rows, const int32_t* k, int n, size_t row_bytes, uint8_t* out);

}  // namespace sluice::vision::detail
