// The epilogues of the cuBLASLt GEMM path that cuBLASLt cannot fuse: a bias row added to f32
// outputs, and SiLU-and-mul over the interleaved gate/up rows (the same arithmetic as the fused
// epilogue of our GEMM kernel, so both paths round alike), and the gated activations of gated_act.cuh;
// also the gated activation over separate gate and up outputs (the Q4 decode path's GEMVs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/gated_act.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

__global__ void add_bias_rows_kernel(float* y, int N, int ld_y, const float* bias) {
  float* row = y + size_t(blockIdx.x) * ld_y;
  for (int n = threadIdx.x; n < N; n += blockDim.x) row[n] += bias[n];
}

template <typename E>
__global__ void gated_mul_interleaved_kernel(const float* g, int N, const float* bias, GateAct act, float limit, E* h,
                                             int ld_h) {
  const float* row = g + size_t(blockIdx.x) * N;
  E* out = h + size_t(blockIdx.x) * ld_h;
  for (int i = threadIdx.x; i < N / 2; i += blockDim.x) {
    const int n_gate = (i >> 3) * 16 + (i & 7);
    float gate = row[n_gate], up = row[n_gate + 8];
    if (bias) {
      gate += bias[n_gate];
      up += bias[n_gate + 8];
    }
    out[i] = from_float<E>(gated_value(gate, up, act, limit));
  }
}

template <typename E>
__global__ void gated_mul_kernel(const float* gate, const float* up, int I, int ld_g, GateAct act, float limit, E* h,
                                 int ld_h) {
  const size_t g0 = size_t(blockIdx.x) * ld_g;
  E* out = h + size_t(blockIdx.x) * ld_h;
  for (int i = threadIdx.x; i < ld_h; i += blockDim.x)
    out[i] = from_float<E>(i < I ? gated_value(gate[g0 + i], up[g0 + i], act, limit) : 0.f);
}

}  // namespace

void add_bias_rows(float* y, int T, int N, int ld_y, const float* bias, cudaStream_t stream) {
  if (T <= 0) return;
  add_bias_rows_kernel<<<T, 256, 0, stream>>>(y, N, ld_y, bias);
  SLUICE_CUDA_LAUNCH_CHECK("add_bias_rows_kernel");
}

void gated_mul_interleaved(const float* g, int T, int N, const float* bias, GateAct act, float act_limit, void* h,
                           int ld_h, DType e, cudaStream_t stream) {
  if (T <= 0) return;
  if (e == DType::BF16)
    gated_mul_interleaved_kernel<<<T, 256, 0, stream>>>(g, N, bias, act, act_limit, static_cast<__nv_bfloat16*>(h),
                                                        ld_h);
  else
    gated_mul_interleaved_kernel<<<T, 256, 0, stream>>>(g, N, bias, act, act_limit, static_cast<__half*>(h), ld_h);
  SLUICE_CUDA_LAUNCH_CHECK("gated_mul_interleaved_kernel");
}

void gated_mul(const float* gate, const float* up, int T, int I, int ld_g, GateAct act, float act_limit, void* h,
               int ld_h, DType e, cudaStream_t stream) {
  if (T <= 0) return;
  if (e == DType::BF16)
    gated_mul_kernel<<<T, 256, 0, stream>>>(gate, up, I, ld_g, act, act_limit, static_cast<__nv_bfloat16*>(h), ld_h);
  else
    gated_mul_kernel<<<T, 256, 0, stream>>>(gate, up, I, ld_g, act, act_limit, static_cast<__half*>(h), ld_h);
  SLUICE_CUDA_LAUNCH_CHECK("gated_mul_kernel");
}

}  // namespace sluice::cuda
