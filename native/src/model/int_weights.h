// AWQ and GPTQ checkpoints' linear weights (config.json quantization_config quant_method "awq" /
// "gptq"), repacked at load into what the CPU kernels stream, values unchanged:
// - 4 bits: Q4 (cpu/gemm_q4.h), with GPTQ's act-order kept as a column permutation;
// - 8 bits (GPTQ), symmetric without act-order: Q8_0 (cpu/gemm_q8.h), the group's scale on each
//   of its 32-blocks;
// - anything else (8-bit asymmetric or act-order, a g_idx that is no grouping of whole groups):
//   f32, each weight scale * (code - zero) exactly.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "sluice/model_config.h"
#include "util/host_memory.h"

namespace sluice {

namespace cpu {
class ThreadPool;
}

// A quantized linear's tensors as stored ("<module>.qweight", ".qzeros", ".scales", ".g_idx").
struct IntLinear {
  TensorView qweight, qzeros, scales;
  TensorView g_idx;  // GPTQ; data == nullptr when absent (then input k is in group k / group_size)
};

// The stored shapes of a [out, in] linear's tensors under `q` (g_idx: [in]).
struct IntLinearShapes {
  std::vector<int64_t> qweight, qzeros, scales;
};
IntLinearShapes int_linear_shapes(const QuantizationConfig& q, int64_t out, int64_t in);

// The [out, in] weight of `t` (shapes and dtypes already checked by the caller: qweight and
// qzeros I32, scales a float dtype, g_idx I32), in memory pushed to `owned`. Throws
// kModelFileInvalid naming the tensor when g_idx names a group that does not exist.
TensorView repack_int_linear(const IntLinear& t, const QuantizationConfig& q, int64_t out, int64_t in,
                             const std::string& name, std::vector<std::shared_ptr<HostBuffer>>& owned,
                             cpu::ThreadPool& pool);

}  // namespace sluice
