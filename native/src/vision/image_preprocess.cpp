#include "vision/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_features.h"
#include "vision/resize_passes.h"

namespace sluice::vision {

namespace detail {

namespace {

double bilinear(double x) {
  if (x < 0) x = -x;
  return x < 1 ? 1 - x : 0;
}

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

// Sums in 32 bits as Pillow's: 22 fraction bits leave 2 bits of headroom over 255 * the weights.
inline uint8_t clip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;  // arithmetic shift: floor
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

constexpr int32_t kHalf = int32_t(1) << (kPrecisionBits - 1);

}  // namespace

Coefficients bicubic_coefficients(int in_size, int out_size) { return resize_coefficients(ResizeFilter::kBicubic, in_size, out_size); }

Coefficients resize_coefficients(ResizeFilter filter, int in_size, int out_size) {
  Coefficients c;
  const bool cubic = filter == ResizeFilter::kBicubic;
  const double scale = double(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = (cubic ? 2.0 : 1.0) * filter_scale;
  c.taps = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size));
  c.count.resize(size_t(out_size));
  c.weights.assign(size_t(out_size) * size_t(c.taps), 0);
  std::vector<double> k(size_t(c.taps));
  for (int xx = 0; xx < out_size; xx++) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filter_scale;
    // C casts truncate towards zero, as Pillow's do.
    const int xmin = std::max(0, int(center - support + 0.5));
    const int xmax = std::min(in_size, int(center + support + 0.5)) - xmin;
    double ww = 0;
    for (int x = 0; x < xmax; x++) {
      const double at = (x + xmin - center + 0.5) * ss;
      k[size_t(x)] = cubic ? bicubic(at) : bilinear(at);
      ww += k[size_t(x)];
    }
    for (int x = 0; x < xmax; x++) {
      const double w = ww != 0 ? k[size_t(x)] / ww : k[size_t(x)];
      const double fixed = w * double(1 << kPrecisionBits);
      c.weights[size_t(xx) * size_t(c.taps) + size_t(x)] = int32_t(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.first[size_t(xx)] = xmin;
    c.count[size_t(xx)] = xmax;
  }
  return c;
}

void horizontal_row_scalar(const uint8_t* in_row, const Coefficients& h, uint8_t* out_row, int out_width) {
  for (int xx = 0; xx < out_width; xx++) {
    const int x0 = h.first[size_t(xx)], n = h.count[size_t(xx)];
    const int32_t* k = h.weights.data() + size_t(xx) * size_t(h.taps);
    int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
    for (int x = 0; x < n; x++) {
      const uint8_t* p = in_row + size_t(x0 + x) * 3;
      s0 += int32_t(p[0]) * k[x];
      s1 += int32_t(p[1]) * k[x];
      s2 += int32_t(p[2]) * k[x];
    }
    out_row[xx * 3] = clip8(s0);
    out_row[xx * 3 + 1] = clip8(s1);
    out_row[xx * 3 + 2] = clip8(s2);
  }
}

void vertical_row_scalar(const uint8_t* const* rows, const int32_t* k, int n, size_t row_bytes, uint8_t* out,
                         int32_t* acc) {
  std::fill(acc, acc + row_bytes, kHalf);
  // Row by row, so the inner loop runs along contiguous bytes (the compiler vectorises it).
  for (int y = 0; y < n; y++) {
    const uint8_t* in = rows[y];
    const int32_t w = k[y];
    for (size_t i = 0; i < row_bytes; i++) acc[i] += int32_t(in[i]) * w;
  }
  for (size_t i = 0; i < row_bytes; i++) out[i] = clip8(acc[i]);
}

}  // namespace detail

// Pillow's order (the horizontal pass first, into 8 bits, then the vertical one), fused: the
// horizontal rows live in a ring of v.taps rows (an output row's window spans at most that many
// and windows only move down), each made when the vertical pass first needs it. Nothing
// image-sized is allocated, and a row is still in cache when the vertical pass reads it.
void resize_bicubic_rgb(const uint8_t* rgb, int width, int height, uint8_t* out, int out_width, int out_height) {
  resize_rgb(ResizeFilter::kBicubic, rgb, width, height, out, out_width, out_height);
}

void resize_rgb(ResizeFilter filter, const uint8_t* rgb, int width, int height, uint8_t* out, int out_width, int out_height) {
  using namespace detail;
  const bool horizontal = out_width != width, vertical = out_height != height;
  const size_t in_row_bytes = size_t(width) * 3, row_bytes = size_t(out_width) * 3;
  if (!horizontal && !vertical) {
    std::memcpy(out, rgb, in_row_bytes * size_t(height));
    return;
  }
#if SLUICE_VISION_AVX2
  // AVX2 only: an AVX-512 version of the horizontal kernel (eight taps per vector) measured no
  // faster on Zen 4, which splits 512-bit multiplies in two.
  const bool avx2 = cpu::simd_level() >= cpu::SimdLevel::Avx2;
#else
  const bool avx2 = false;
#endif
  Coefficients h;
  std::vector<int16_t> h_weights;
  if (horizontal) {
    h = resize_coefficients(filter, width, out_width);
    if (avx2) h_weights = horizontal_weights_avx2(h);
  }
  const size_t in_bytes = in_row_bytes * size_t(height);
  auto horizontal_row = [&](int y, uint8_t* dst) {  // source row y, horizontally resized, into dst
    const uint8_t* in_row = rgb + size_t(y) * in_row_bytes;
    if (avx2)
      horizontal_row_avx2(in_row, in_bytes - size_t(y) * in_row_bytes, h, h_weights, dst, out_width);
    else
      horizontal_row_scalar(in_row, h, dst, out_width);
  };
  const size_t stride = row_bytes + 16;  // + the AVX2 kernel's store slack

  if (!vertical) {
    std::vector<uint8_t> row(stride);
    for (int y = 0; y < height; y++) {
      horizontal_row(y, row.data());
      std::memcpy(out + size_t(y) * row_bytes, row.data(), row_bytes);
    }
    return;
  }
  const Coefficients v = resize_coefficients(filter, height, out_height);
  const size_t ring_rows = size_t(v.taps);
  std::vector<uint8_t> ring(horizontal ? ring_rows * stride : 0);
  std::vector<const uint8_t*> rows(ring_rows);
  std::vector<int32_t> acc(avx2 ? 0 : row_bytes);
  int made = 0;  // horizontal rows made so far: the source rows before `made` (from the first window on)
  for (int yy = 0; yy < out_height; yy++) {
    const int y0 = v.first[size_t(yy)], n = v.count[size_t(yy)];
    for (int j = 0; j < n; j++) {
      const int y = y0 + j;
      if (!horizontal) {
        rows[size_t(j)] = rgb + size_t(y) * in_row_bytes;
        continue;
      }
      uint8_t* slot = ring.data() + (size_t(y) % ring_rows) * stride;
      if (y >= made) {  // windows only move down: the next row, or any row of the first window
        horizontal_row(y, slot);
        made = y + 1;
      }
      rows[size_t(j)] = slot;
    }
    const int32_t* k = v.weights.data() + size_t(yy) * size_t(v.taps);
    uint8_t* o = out + size_t(yy) * row_bytes;
    if (avx2)
      vertical_row_avx2(rows.data(), k, n, row_bytes, o);
    else
      vertical_row_scalar(rows.data(), k, n, row_bytes, o, acc.data());
  }
}

void qwen2vl_patches(const uint8_t* rgb, int width, int height, int patch, int merge, int temporal, const float* tables,
                     float* out) {
  const int gh = height / patch, gw = width / patch;
  const size_t patch_dim = size_t(3) * size_t(temporal) * size_t(patch) * size_t(patch);
  size_t row = 0;
  for (int bh = 0; bh < gh / merge; bh++)
    for (int bw = 0; bw < gw / merge; bw++)
      for (int ih = 0; ih < merge; ih++)
        for (int iw = 0; iw < merge; iw++, row++) {
          const int y0 = (bh * merge + ih) * patch, x0 = (bw * merge + iw) * patch;
          float* base = out + row * patch_dim;
          for (int ch = 0; ch < 3; ch++) {
            const float* t = tables + ch * 256;
            float* first = base + size_t(ch) * size_t(temporal) * size_t(patch) * size_t(patch);
            for (int y = 0; y < patch; y++) {
              const uint8_t* src = rgb + (size_t(y0 + y) * size_t(width) + size_t(x0)) * 3 + size_t(ch);
              for (int x = 0; x < patch; x++) first[y * patch + x] = t[src[size_t(x) * 3]];
            }
            for (int f = 1; f < temporal; f++)
              std::memcpy(first + size_t(f) * size_t(patch) * size_t(patch), first, sizeof(float) * size_t(patch) * size_t(patch));
          }
        }
}

void channels_first(const uint8_t* rgb, int width, int height, const float* tables, float* out) {
  const size_t plane = size_t(width) * size_t(height);
  for (int ch = 0; ch < 3; ch++) {
    const float* t = tables + ch * 256;
    float* dst = out + size_t(ch) * plane;
    for (size_t i = 0; i < plane; i++) dst[i] = t[rgb[i * 3 + size_t(ch)]];
  }
}

}  // namespace sluice::vision
