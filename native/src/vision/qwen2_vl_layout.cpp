#include "vision/qwen2_vl_layout.h"

#include <algorithm>
#include <cstring>

namespace sluice::vision {

namespace {

// The processor's (row, col) of each patch row: per frame, merge-group row, merge-group column,
// row in the group, column in the group (visionPatchPositions).
void patch_positions(int t, int h, int w, int64_t m, std::vector<int32_t>& row, std::vector<int32_t>& col) {
  row.clear();
  col.clear();
  for (int f = 0; f < t; f++)
    for (int64_t br = 0; br < h / m; br++)
      for (int64_t bc = 0; bc < w / m; bc++)
        for (int64_t r = 0; r < m; r++)
          for (int64_t c = 0; c < m; c++) {
            row.push_back(int32_t(br * m + r));
            col.push_back(int32_t(bc * m + c));
          }
}

// get_window_index: merged tokens listed window by window (windows of `ws` merged tokens per side,
// anchored top left, per frame), and the boundaries of each non-empty window's patch rows.
void window_index(int t, int h, int w, int64_t m, int64_t ws, std::vector<int64_t>& index, std::vector<int64_t>& cu) {
  const int64_t gh = h / m, gw = w / m;
  index.clear();
  cu.assign(1, 0);
  const int64_t wh = (gh + ws - 1) / ws, ww = (gw + ws - 1) / ws;
  for (int64_t f = 0; f < t; f++)
    for (int64_t wr = 0; wr < wh; wr++)
      for (int64_t wc = 0; wc < ww; wc++) {
        int64_t n = 0;
        for (int64_t r = wr * ws; r < std::min(gh, (wr + 1) * ws); r++)
          for (int64_t c = wc * ws; c < std::min(gw, (wc + 1) * ws); c++, n++) index.push_back((f * gh + r) * gw + c);
        if (n > 0) cu.push_back(cu.back() + n * m * m);
      }
}

}  // namespace

Qwen2VlBatchLayout qwen2vl_batch_layout(const std::vector<EncoderImage>& images, int64_t patch_dim, int64_t merge,
                                        int64_t window) {
  const size_t n_img = images.size();
  const int64_t unit = merge * merge;
  Qwen2VlBatchLayout L;
  L.row0.assign(n_img + 1, 0);
  for (size_t i = 0; i < n_img; i++) L.row0[i + 1] = L.row0[i] + images[i].num_values / patch_dim;
  const size_t rows = size_t(L.rows());
  L.windows.resize(n_img);
  L.src.resize(rows);
  L.row.resize(rows);
  L.col.resize(rows);
  L.cu_window.assign(1, 0);
  L.cu_frames.assign(1, 0);
  std::vector<int32_t> prow, pcol;
  std::vector<int64_t> cu;
  for (size_t i = 0; i < n_img; i++) {
    const EncoderImage& im = images[i];
    const int64_t base = L.row0[i], img_tokens = (L.row0[i + 1] - L.row0[i]) / unit;
    patch_positions(im.t, im.h, im.w, merge, prow, pcol);
    window_index(im.t, im.h, im.w, merge, window, L.windows[i], cu);
    for (size_t s = 1; s < cu.size(); s++) L.cu_window.push_back(base + cu[s]);
    for (int f = 1; f <= im.t; f++) L.cu_frames.push_back(base + int64_t(f) * im.h * im.w);
    // Rows in window order (whole merged tokens move).
    const std::vector<int64_t>& win = L.windows[i];
    for (int64_t k = 0; k < img_tokens; k++)
      for (int64_t r = 0; r < unit; r++) {
        const int64_t from = win[size_t(k)] * unit + r, to = base + k * unit + r;
        L.src[size_t(to)] = im.pixel_values + from * patch_dim;
        L.row[size_t(to)] = prow[size_t(from)];
        L.col[size_t(to)] = pcol[size_t(from)];
      }
  }
  return L;
}

std::vector<std::vector<float>> qwen2vl_unwindow(const Qwen2VlBatchLayout& layout, const float* y, int64_t unit,
                                                 int64_t out_hidden) {
  const size_t n_img = layout.windows.size();
  std::vector<std::vector<float>> outs(n_img);
  for (size_t i = 0; i < n_img; i++) {
    const int64_t tok0 = layout.row0[i] / unit, img_tokens = (layout.row0[i + 1] - layout.row0[i]) / unit;
    std::vector<float>& out = outs[i];
    out.resize(size_t(img_tokens * out_hidden));
    const std::vector<int64_t>& win = layout.windows[i];
    for (int64_t k = 0; k < img_tokens; k++)
      std::memcpy(&out[size_t(win[size_t(k)] * out_hidden)], y + (tok0 + k) * out_hidden, size_t(out_hidden) * sizeof(float));
  }
  return outs;
}

}  // namespace sluice::vision
