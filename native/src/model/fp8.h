// FP8 checkpoints' linear weights, dequantized to bf16 at load: the CPU computes with them as
// with a bf16 checkpoint, so no backend sees F8E4M3.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/safetensors.h"
#include "sluice/model_config.h"
#include "util/e4m3.h"  // e4m3_to_float
#include "util/host_memory.h"

namespace sluice {

namespace cpu {
class ThreadPool;
}


// `v` rounded once to bf16, to nearest even (f32_to_bf16(float(v)) would round twice).
uint16_t f64_to_bf16(double v);

// The [rows, cols] F8E4M3 weight `w` times its scales (`scale`, shaped as q.fp8 says; any float
// dtype), each product rounded once to bf16, into a buffer pushed to `owned`. Throws
// kModelFileInvalid naming the tensor at a NaN code. The caller has checked the scale's shape.
TensorView dequantize_fp8(const TensorView& w, const TensorView& scale, const QuantizationConfig& q,
                          std::vector<std::shared_ptr<HostBuffer>>& owned, cpu::ThreadPool& pool);

}  // namespace sluice
