// Decode-sized products (T <= 8 tokens): y[T, N] = x[T, K] · W[N, K]^T without tensor cores.
// At these sizes the work is streaming W once; what matters is many 16-byte loads in flight
// and no second pass. Each warp owns ROWS weight rows and walks K in 16-byte chunks (lane c
// takes chunks c, c + 32, ...), reading the few activation rows from L1/L2, then reduces across
// lanes with a fixed butterfly. A row's arithmetic depends only on K, never on T or ROWS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/gated_act.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kGemvWarps = 4;

__device__ __forceinline__ void widen8(const uint4& v, float (&out)[8], __nv_bfloat16) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void widen8(const uint4& v, float (&out)[8], __half) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Weight row r of warp `wg`. For the gated epilogue a warp takes ROWS / 2 intermediate
// features and reads each one's gate row and up row (16-row groups [gate 8 | up 8]).
template <int ROWS>
__device__ __forceinline__ int weight_row(int wg, int r, bool gated) {
  if (!gated) return wg * ROWS + r;
  const int f = wg * (ROWS / 2) + r / 2;
  return (f / 8) * 16 + f % 8 + (r % 2) * 8;
}

// U: 16-byte chunks per row in flight before any is used.
template <typename E, int TMAX, int ROWS, int U>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemmArgs a) {
  const int lane = threadIdx.x & 31;
  const int wg = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const bool gated = a.epilogue == Epilogue::kGatedMul;
  const int chunks = (a.K + 7) / 8;  // operands are zero padded to 8-element rows
  const uint4* w = static_cast<const uint4*>(a.w);
  const uint4* x = static_cast<const uint4*>(a.x);
  const int ldw = a.ld_w / 8, ldx = a.ld_x / 8;

  int rows[ROWS];
  bool row_ok[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    rows[r] = weight_row<ROWS>(wg, r, gated);
    row_ok[r] = rows[r] < a.N;
  }
  float acc[ROWS][TMAX];
#pragma unroll
  for (int r = 0; r < ROWS; r++)
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[r][t] = 0.f;

  for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
    uint4 wv[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < ROWS; r++)
        wv[u][r] = c < chunks && row_ok[r] ? __ldg(w + size_t(rows[r]) * ldw + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + 32 * u;
      if (c >= chunks) break;
      float xf[TMAX][8];
#pragma unroll
      for (int t = 0; t < TMAX; t++) {
        const uint4 xv = t < a.T ? x[size_t(t) * ldx + c] : make_uint4(0, 0, 0, 0);
        widen8(xv, xf[t], E());
      }
#pragma unroll
      for (int r = 0; r < ROWS; r++) {
        float wf[8];
        widen8(wv[u][r], wf, E());
#pragma unroll
        for (int t = 0; t < TMAX; t++)
#pragma unroll
          for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wf[i], xf[t][i], acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; r++)
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[r][t] = warp_sum(acc[r][t]);

  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < TMAX; t++) {
    if (t >= a.T) break;
    if (gated) {
#pragma unroll
      for (int r = 0; r < ROWS; r += 2) {
        if (!row_ok[r]) continue;
        float g = acc[r][t], u = acc[r + 1][t];
        if (a.bias) {
          g += a.bias[rows[r]];
          u += a.bias[rows[r + 1]];
        }
        const int f = wg * (ROWS / 2) + r / 2;
        static_cast<E*>(a.h)[size_t(t) * a.ld_h + f] = from_float<E>(gated_value(g, u, a.act, a.act_limit));
      }
    } else {
#pragma unroll
      for (int r = 0; r < ROWS; r++) {
        if (!row_ok[r]) continue;
        const float v = acc[r][t] + (a.bias ? a.bias[rows[r]] : 0.f);
        float* dst = a.y + size_t(t) * a.ld_y + rows[r];
        if (a.epilogue == Epilogue::kStore) *dst = v;
        else *dst += v;
      }
    }
  }
}

// Chunks in flight per row. On an H100, 2 beat 4 and 8 for every llama-3.1-8b projection at T = 1
// (bench/results/cuda-kernels-llama-3.1-8b-h100.json): fewer registers, more resident warps.
template <int TMAX>
constexpr int default_unroll() {
  return TMAX <= 4 ? 2 : 1;
}

template <typename E, int TMAX, int ROWS, int U = default_unroll<TMAX>()>
void launch(const GemmArgs& a, cudaStream_t stream) {
  const int warps = (a.N + ROWS - 1) / ROWS;
  gemv_kernel<E, TMAX, ROWS, U><<<(warps + kGemvWarps - 1) / kGemvWarps, kGemvWarps * 32, 0, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("gemv_kernel");
}

template <typename E, int TMAX>
void launch_rows(const GemmArgs& a, int num_sms, cudaStream_t stream) {
  // Four rows per warp amortise the activation loads; two when that would leave SMs idle.
  if (a.N / 4 >= num_sms * 8) launch<E, TMAX, 4>(a, stream);
  else launch<E, TMAX, 2>(a, stream);
}

template <typename E>
void gemv_typed(const GemmArgs& a, int num_sms, cudaStream_t stream) {
  if (a.T == 1) launch_rows<E, 1>(a, num_sms, stream);
  else if (a.T == 2) launch_rows<E, 2>(a, num_sms, stream);
  else if (a.T <= 4) launch_rows<E, 4>(a, num_sms, stream);
  else launch_rows<E, 8>(a, num_sms, stream);
}

}  // namespace

void gemv_variant(const GemmArgs& a, int rows, int unroll, cudaStream_t stream) {
  using E = __nv_bfloat16;
  if (a.T != 1) throw Error(ErrorCode::kInvalidArgument, "gemv_variant: T must be 1");
#define SLUICE_GEMV_VARIANT(R, U) \
  if (rows == R && unroll == U) return launch<E, 1, R, U>(a, stream);
  SLUICE_GEMV_VARIANT(2, 2) SLUICE_GEMV_VARIANT(2, 4) SLUICE_GEMV_VARIANT(2, 8)
  SLUICE_GEMV_VARIANT(4, 2) SLUICE_GEMV_VARIANT(4, 4) SLUICE_GEMV_VARIANT(4, 8)
  SLUICE_GEMV_VARIANT(8, 2) SLUICE_GEMV_VARIANT(8, 4)
#undef SLUICE_GEMV_VARIANT
  throw Error(ErrorCode::kInvalidArgument, "gemv_variant: no such variant");
}

void gemv(const GemmArgs& a, DType e, int num_sms, cudaStream_t stream) {
  if (e == DType::BF16) gemv_typed<__nv_bfloat16>(a, num_sms, stream);
  else gemv_typed<__half>(a, num_sms, stream);
}

}  // namespace sluice::cuda
