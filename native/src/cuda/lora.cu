// The LoRA kernels (lora.h): shrink, a warp per (row, rank index) dotting a row of A with the
// row's input; expand, a thread per (row, output) dotting a row of B with the shrink's output.
// Both read the row's slot and the slot's matrices from the device tables, so one launch covers
// every adapter of the step whatever their ranks; blocks of base-model rows exit at once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/lora.h"

namespace sluice::cuda {

namespace {

constexpr int kRankCap = int(kMaxLoraRank);  // tmp's row stride
constexpr int kShrinkWarps = 8;              // rank indices per shrink block
constexpr int kExpandThreads = 256;          // outputs per expand block

// grid (T, kRankCap / kShrinkWarps): block (t, y) computes tmp[t, j] for its warps' j = y * 8 + warp.
template <typename E>
__global__ void lora_shrink_kernel(LoraArgs a) {
  const int t = blockIdx.x;
  const int s = a.slots[t];
  if (s < 0) return;
  const LoraMats m = a.tables[s][a.entry];
  const int j = blockIdx.y * kShrinkWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (j >= m.rank) return;  // (whole warps: warp_sum below needs every lane)
  const E* x = static_cast<const E*>(a.x) + size_t(t) * size_t(a.ld_x);
  const float* row = m.a + size_t(j) * size_t(a.in);
  // Four independent sums (loads in flight), combined in a fixed order: deterministic.
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int k = lane;
  for (; k + 96 < a.in; k += 128) {
#pragma unroll
    for (int u = 0; u < 4; u++) acc[u] += row[k + 32 * u] * to_float(x[k + 32 * u]);
  }
  for (; k < a.in; k += 32) acc[0] += row[k] * to_float(x[k]);
  const float sum = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  if (lane == 0) a.tmp[size_t(t) * kRankCap + j] = sum;
}

// grid (T, ceil(out / kExpandThreads)).
__global__ void lora_expand_kernel(LoraArgs a) {
  __shared__ float v[kRankCap];
  const int t = blockIdx.x;
  const int s = a.slots[t];
  if (s < 0) return;
  const LoraMats m = a.tables[s][a.entry];
  if (m.rank == 0) return;
  if (int(threadIdx.x) < m.rank) v[threadIdx.x] = a.tmp[size_t(t) * kRankCap + threadIdx.x];
  __syncthreads();
  const int o = blockIdx.y * kExpandThreads + threadIdx.x;
  if (o >= a.out) return;
  const float* row = m.b + size_t(o) * size_t(m.rank);
  float acc = 0.f;
  if ((m.rank & 3) == 0) {  // rows 16-byte aligned (the copy aligns every matrix to 256 bytes)
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int k = 0; k < m.rank / 4; k++) {
      const float4 b = row4[k];
      acc += b.x * v[4 * k] + b.y * v[4 * k + 1] + b.z * v[4 * k + 2] + b.w * v[4 * k + 3];
    }
  } else {
    for (int k = 0; k < m.rank; k++) acc += row[k] * v[k];
  }
  const int col = a.group > 0 ? a.col0 + (o / a.group) * a.group_stride + o % a.group : a.col0 + o;
  a.y[size_t(t) * size_t(a.ld_y) + col] += acc;
}

}  // namespace

void lora_add(const LoraArgs& a, DType e, cudaStream_t stream) {
  if (a.T <= 0 || a.out <= 0) return;
  const dim3 shrink(unsigned(a.T), kRankCap / kShrinkWarps);
  if (e == DType::BF16) lora_shrink_kernel<__nv_bfloat16><<<shrink, 32 * kShrinkWarps, 0, stream>>>(a);
  else lora_shrink_kernel<__half><<<shrink, 32 * kShrinkWarps, 0, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("lora_shrink_kernel");
  const dim3 expand(unsigned(a.T), unsigned((a.out + kExpandThreads - 1) / kExpandThreads));
  lora_expand_kernel<<<expand, kExpandThreads, 0, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("lora_expand_kernel");
}

}  // namespace sluice::cuda
