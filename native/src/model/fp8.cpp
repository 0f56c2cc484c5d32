#include "model/fp8.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "cpu/thread_pool.h"
#include "sluice/error.h"

namespace sluice {

uint16_t f64_to_bf16(double v) {
  // Round to odd into f32 (truncate, then set the last bit when inexact), then to nearest even
  // into bf16: f32 keeps 16 more bits than bf16, so the second rounding sees the exact tie
  // position and the sticky bit, and the result is v rounded once.
  float f = float(v);
  if (std::isfinite(v) && double(f) != v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (std::fabs(double(f)) > std::fabs(v)) bits -= 1;  // one step towards zero (sign-magnitude)
    bits |= 1;
    std::memcpy(&f, &bits, 4);
  }
  return f32_to_bf16(f);
}

namespace {

float scale_element(const TensorView& t, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data);
  if (t.dtype == DType::F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace

TensorView dequantize_fp8(const TensorView& w, const TensorView& scale, const QuantizationConfig& q,
                          std::vector<std::shared_ptr<HostBuffer>>& owned, cpu::ThreadPool& pool) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  auto buf = std::make_shared<HostBuffer>(size_t(rows * cols) * sizeof(uint16_t));
  uint16_t* out = reinterpret_cast<uint16_t*>(buf->data());  // [rows, cols]
  const auto* codes = static_cast<const uint8_t*>(w.data);  // [rows, cols]
  const int64_t scale_cols = q.fp8 == Fp8Scales::Block ? (cols + q.block_cols - 1) / q.block_cols : 1;
  double table[256];  // e4m3 values; NaN codes are caught before use
  for (int c = 0; c < 256; c++) table[c] = e4m3_to_float(uint8_t(c));
  std::atomic<int64_t> nan_at{-1};
  pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; r++) {
      const int64_t scale_row = q.fp8 == Fp8Scales::Block ? r / q.block_rows : q.fp8 == Fp8Scales::Channel ? r : 0;
      for (int64_t col = 0; col < cols; col++) {
        const uint8_t code = codes[r * cols + col];
        if (e4m3_is_nan(code)) {
          nan_at.store(r * cols + col);
          return;
        }
        const int64_t s = q.fp8 == Fp8Scales::Block ? scale_row * scale_cols + col / q.block_cols : scale_row;
        // e4m3 has 4 significant bits and f32 24: the product is exact in double.
        out[r * cols + col] = f64_to_bf16(table[code] * double(scale_element(scale, s)));
      }
    }
  });
  if (const int64_t at = nan_at.load(); at >= 0)
    throw Error(ErrorCode::kModelFileInvalid, w.file + ": tensor \"" + w.name + "\" holds a NaN e4m3 code at row " +
                                                  std::to_string(at / cols) + ", column " + std::to_string(at % cols));
  TensorView v = w;
  v.dtype = DType::BF16;
  v.data = out;
  v.nbytes = size_t(rows * cols) * sizeof(uint16_t);
  owned.push_back(std::move(buf));
  return v;
}

}  // namespace sluice
