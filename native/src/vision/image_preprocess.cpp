#include "vision/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sluice::vision {

namespace {

constexpr int kPrecisionBits = 22;  // Pillow's 8-bit path: 32 - 8 - 2
constexpr double kSupport = 2.0;    // bicubic

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

struct Coefficients {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out, taps]
};

Coefficients coefficients(int in_size, int out_size) {
  Coefficients c;
  const double scale = double(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
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
      k[size_t(x)] = bicubic((x + xmin - center + 0.5) * ss);
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

// Sums in 32 bits as Pillow's: 22 fraction bits leave 2 bits of headroom over 255 * the weights.
inline uint8_t clip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;  // arithmetic shift: floor
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

void resize_bicubic_rgb(const uint8_t* rgb, int width, int height, uint8_t* out, int out_width, int out_height) {
  const bool horizontal = out_width != width, vertical = out_height != height;
  if (!horizontal && !vertical) {
    std::memcpy(out, rgb, size_t(width) * size_t(height) * 3);
    return;
  }
  const Coefficients h = coefficients(width, out_width);
  const Coefficients v = coefficients(height, out_height);
  const int row_first = v.first[0];
  const int row_end = v.first[size_t(out_height) - 1] + v.count[size_t(out_height) - 1];
  constexpr int32_t kHalf = int32_t(1) << (kPrecisionBits - 1);

  std::vector<uint8_t> tmp;
  const uint8_t* src = rgb;
  int src_width = width, src_row0 = 0;
  if (horizontal) {
    const int rows = row_end - row_first;
    tmp.resize(size_t(rows) * size_t(out_width) * 3);
    for (int y = 0; y < rows; y++) {
      const uint8_t* in_row = rgb + size_t(y + row_first) * size_t(width) * 3;
      uint8_t* out_row = tmp.data() + size_t(y) * size_t(out_width) * 3;
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
    src = tmp.data();
    src_width = out_width;
    src_row0 = row_first;
  }
  const size_t row_bytes = size_t(src_width) * 3;
  if (!vertical) {
    std::memcpy(out, src, row_bytes * size_t(out_height));
    return;
  }
  std::vector<int32_t> acc(row_bytes);
  for (int yy = 0; yy < out_height; yy++) {
    const int y0 = v.first[size_t(yy)] - src_row0, n = v.count[size_t(yy)];
    const int32_t* k = v.weights.data() + size_t(yy) * size_t(v.taps);
    std::fill(acc.begin(), acc.end(), kHalf);
    // Row by row, so the inner loop runs along contiguous bytes (the compiler vectorises it).
    for (int y = 0; y < n; y++) {
      const uint8_t* in = src + size_t(y0 + y) * row_bytes;
      const int32_t w = k[y];
      for (size_t i = 0; i < row_bytes; i++) acc[i] += int32_t(in[i]) * w;
    }
    uint8_t* o = out + size_t(yy) * row_bytes;
    for (size_t i = 0; i < row_bytes; i++) o[i] = clip8(acc[i]);
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

}  // namespace sluice::vision
