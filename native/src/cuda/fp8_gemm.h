// FP8 (OCP e4m3, "e4m3fn") linear layers on sm_89 / sm_90: activations quantized per token at
// run time, weights as FP8 checkpoints store them (e4m3 codes [N, K] with f32 scales: per tensor,
// per output channel, or per [block_rows x 128] block as in the DeepSeek-V3 / Qwen3-FP8 releases).
//
//   y[t, n] = sum_k e4m3(xq[t, k]) * x_scale(t, k / 128) * e4m3(w[n, k]) * w_scale(n, k / 128) (+ bias[n])
//
// Layout contract: codes are row-major bytes; row strides (ld_*) are multiples of 16 bytes and
// base pointers 16-byte aligned; the GEMM reads K rounded up to a multiple of 32 (Kp), so columns
// K .. Kp - 1 of x and w must hold zero codes (quantize_rows_fp8* writes them for x; the weight
// upload pads W). Launchers only enqueue (no allocation, no synchronization): safe to capture in
// a CUDA graph once each kernel has been launched outside capture (its shared-memory attribute is
// set at the first launch) or fp8_gemm_prepare has run.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "sluice/dtype.h"
#include "sluice/model_config.h"

namespace sluice::cuda {

// Columns per activation scale of block-scaled activations, and the weight blocks' width: the
// GEMM applies scales once per 128 columns of K.
constexpr int kFp8BlockCols = 128;

// Whether the current device has the e4m3 tensor-core MMA (compute capability 8.9 or newer).
bool fp8_gemm_supported();

// Sets every GEMM kernel's shared-memory attribute now (otherwise done at its first launch, which
// must not happen inside a CUDA graph capture). No-op on a device without FP8 MMA.
void fp8_gemm_prepare();

// Dynamic per-token quantization of x [T, K] (E = bf16 or f16, ld_x % 8 == 0) into e4m3 codes
// xq [T, ld_q] and f32 scales: scale = amax / 448 over the row, code = e4m3(x / scale) rounded to
// nearest even and saturated to +-448; an all-zero row gets scale 0 and zero codes. Columns
// K .. roundup(K, 32) - 1 get zero codes (ld_q >= that). x_scale: [T]. Runs on any device.
void quantize_rows_fp8(const void* x, DType e, int T, int K, int ld_x, uint8_t* xq, int ld_q, float* x_scale,
                       cudaStream_t stream);
// The same with one scale per token per 128 columns (DeepSeek-style activation blocks):
// x_scale [T, ld_scale], ld_scale >= ceil(K / 128); block b covers columns 128 b .. 128 b + 127.
void quantize_rows_fp8_blocks(const void* x, DType e, int T, int K, int ld_x, uint8_t* xq, int ld_q, float* x_scale,
                              int ld_scale, cudaStream_t stream);

struct Fp8GemmArgs {
  const uint8_t* x = nullptr;  // [T, ld_x] e4m3 codes, zero past K
  int ld_x = 0;
  const float* x_scale = nullptr;  // [T], or [T, ld_x_scale] with x_block_scales
  int ld_x_scale = 0;
  bool x_block_scales = false;     // one activation scale per token per 128 columns
  const uint8_t* w = nullptr;      // [N, ld_w] e4m3 codes (the Hugging Face Linear layout), zero past K
  int ld_w = 0;
  // Tensor: [1]; Channel: [N]; Block: [ceil(N / w_block_rows), ceil(K / 128)] (weight_block_size
  // [w_block_rows, 128]; checkpoints with other block widths are rescaled at upload).
  const float* w_scale = nullptr;
  Fp8Scales w_scales = Fp8Scales::Tensor;
  int w_block_rows = 128;
  const float* bias = nullptr;  // [N] or nullptr
  int T = 0, N = 0, K = 0;
  void* y = nullptr;  // [T, ld_y] of y_type (f32, bf16 or f16)
  int ld_y = 0;
  DType y_type = DType::F32;
  bool accumulate = false;  // f32 output only: y += result (the residual add)
};

// Tensor cores (mma.sync m16n8k32 e4m3, f32 accumulators). No split K and a fixed order of
// summation per output: the result for a token is the same bits whatever T, the tile shape or
// the other tokens of the batch, and reruns are bit-identical. Throws kInternal on a device
// without FP8 MMA or arguments outside the layout contract.
void fp8_gemm(const Fp8GemmArgs& a, cudaStream_t stream);

}  // namespace sluice::cuda
