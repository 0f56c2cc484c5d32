// Mixture-of-experts kernels around the grouped GEMM (gemm.cu): routing (top-k of the router's
// logits), the plan that groups a step's routes by expert with the row counts kept on the device
// (so a captured decode graph replays any routing), and the combine that sums each token's
// experts in rank order (batch invariant, as on the CPU).
#include <cfloat>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kRouteWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 32;

// (value, index) with the larger value first, the lower index first on ties.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// One warp per token. Chosen experts are compared by logit (the softmax is monotonic).
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(const float* logits, int T, int E, int k, bool softmax_first, bool renormalize, int32_t* ids,
                     float* weights) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  const float* row = logits + size_t(t) * E;
  // Softmax over every expert: its max and sum (fixed reduction order).
  float mx = -INFINITY;
  for (int i = lane; i < E; i += 32) mx = fmaxf(mx, row[i]);
  mx = warp_max(mx);
  float sum = 0.f;
  if (softmax_first) {
    for (int i = lane; i < E; i += 32) sum += __expf(row[i] - mx);
    sum = warp_sum(sum);
  }
  int chosen[kMaxTopK];
  float chosen_logit[kMaxTopK];
  for (int j = 0; j < k; j++) {
    float bv = -INFINITY;
    int bi = E;
    for (int i = lane; i < E; i += 32) {
      bool taken = false;
      for (int q = 0; q < j; q++) taken |= chosen[q] == i;
      // The first free expert is always a candidate, so that NaN logits still name an expert.
      if (!taken && (bi == E || better(row[i], i, bv, bi))) {
        bv = row[i];
        bi = i;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    chosen[j] = bi;  // every lane holds the same choice
    chosen_logit[j] = bv;
  }
  if (lane != 0) return;
  float w[kMaxTopK];
  float total = 0.f;
  for (int j = 0; j < k; j++) {
    // softmax_first: the expert's probability; else the softmax over the k chosen (best first).
    w[j] = softmax_first ? __expf(chosen_logit[j] - mx) / sum : __expf(chosen_logit[j] - chosen_logit[0]);
    total += w[j];
  }
  const bool divide = !softmax_first || renormalize;
  for (int j = 0; j < k; j++) {
    ids[size_t(t) * k + j] = chosen[j];
    weights[size_t(t) * k + j] = divide ? w[j] / total : w[j];
  }
}

// One block: counts per expert, their prefix sums and row tiles (thread 0), then each route's row.
// Rows of one expert land in an order the atomics decide; a row's GEMM result does not depend on
// its place, and moe_combine reads each token's rows by rank, so the outputs are deterministic.
__global__ void __launch_bounds__(1024)
    moe_plan_kernel(const int32_t* ids, int R, int k, int E, int tile_rows, MoePlan plan) {
  __shared__ int count[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) atomicAdd(&count[ids[r]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int offset = 0, tiles = 0;
    for (int e = 0; e < E; e++) {
      plan.expert_offsets[e] = offset;
      fill[e] = offset;
      for (int row = 0; row < count[e]; row += tile_rows) {
        plan.tile_expert[tiles] = e;
        plan.tile_row0[tiles] = offset + row;
        tiles++;
      }
      offset += count[e];
    }
    plan.expert_offsets[E] = offset;
    *plan.num_tiles = tiles;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    const int row = atomicAdd(&fill[ids[r]], 1);
    plan.route_row[r] = row;
    plan.row_token[row] = r / k;
  }
}

__global__ void moe_combine_kernel(const float* y, const int32_t* route_row, const float* weights, int k, int H,
                                   float* out, bool add) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = 0.f;
    for (int j = 0; j < k; j++) v = fmaf(weights[size_t(t) * k + j], y[size_t(route_row[size_t(t) * k + j]) * H + i], v);
    float* dst = out + size_t(t) * H + i;
    *dst = add ? *dst + v : v;
  }
}

}  // namespace

void moe_route(const float* logits, int T, int E, int k, bool softmax_first, bool renormalize, int32_t* ids,
               float* weights, cudaStream_t stream) {
  if (T <= 0) return;
  if (E > kMaxExperts || k > kMaxTopK || k > E || k < 1)
    throw Error(ErrorCode::kInternal, "moe_route: at most 1024 experts and 32 per token");
  moe_route_kernel<<<(T + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(logits, T, E, k, softmax_first,
                                                                                        renormalize, ids, weights);
  SLUICE_CUDA_LAUNCH_CHECK("moe_route_kernel");
}

void moe_plan(const int32_t* ids, int T, int k, int E, int tile_rows, const MoePlan& plan, cudaStream_t stream) {
  if (T <= 0) return;
  if (E > kMaxExperts) throw Error(ErrorCode::kInternal, "moe_plan: at most 1024 experts");
  moe_plan_kernel<<<1, 1024, 0, stream>>>(ids, T * k, k, E, tile_rows, plan);
  SLUICE_CUDA_LAUNCH_CHECK("moe_plan_kernel");
}

void moe_combine(const float* y, const int32_t* route_row, const float* weights, int T, int k, int H, float* out,
                 bool add, cudaStream_t stream) {
  if (T <= 0) return;
  moe_combine_kernel<<<T, 256, 0, stream>>>(y, route_row, weights, k, H, out, add);
  SLUICE_CUDA_LAUNCH_CHECK("moe_combine_kernel");
}

}  // namespace sluice::cuda
