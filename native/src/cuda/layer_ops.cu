// Per-token kernels of the forward pass: embedding gather (and the scatter of given input rows),
// RMSNorm (and the sandwich norm's normed add), the RoPE cos/sin table (M-RoPE's too), the step
// after the q/k/v projection (q/k norm, rotary embedding, KV-cache write), and the logits' soft cap.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

template <typename E>
__global__ void embedding_kernel(const int32_t* ids, const E* table, int ld_table, int H, float scale, float* x) {
  const int t = blockIdx.x;
  const E* row = table + size_t(ids[t]) * ld_table;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(t) * H + i] = to_float(row[i]) * scale;
}

__global__ void resolve_device_tokens_kernel(int32_t* ids, int T, const int32_t* sampled, int num_sampled, int V) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int32_t id = ids[t];
  if (id >= 0) return;
  const int64_t r = -2 - int64_t(id);
  const int32_t tok = r < num_sampled ? sampled[r] : -1;
  ids[t] = tok >= 0 && tok < V ? tok : 0;
}

// One block per row. Sum of squares in f32 per thread, then a fixed-order block reduction.
template <typename E>
__global__ void rmsnorm_kernel(const float* x, int D, const int32_t* rows, const float* w, float eps, E* out,
                               int ld_out) {
  __shared__ float scratch[32];
  const int r = blockIdx.x;
  const float* src = x + size_t(rows ? rows[r] : r) * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += src[i] * src[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / float(D) + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[size_t(r) * ld_out + i] = from_float<E>(src[i] * inv * w[i]);
}

// One block per row: x[r] += y[r] * rsqrt(mean(y[r]^2) + eps) * w.
__global__ void add_rmsnorm_kernel(float* x, const float* y, int D, const float* w, float eps) {
  __shared__ float scratch[32];
  const float* src = y + size_t(blockIdx.x) * D;
  float* dst = x + size_t(blockIdx.x) * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += src[i] * src[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / float(D) + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] += src[i] * inv * w[i];
}

__global__ void soft_cap_kernel(float* v, size_t n, float cap) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = cap * tanhf(v[i] / cap);
}

__global__ void rope_table_kernel(const int32_t* positions, int T, const float* inv_freq, int half, float* cos_sin) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * half) return;
  const int t = idx / half, i = idx % half;
  const double angle = double(positions[t]) * double(inv_freq[i]);
  double s, c;
  sincos(angle, &s, &c);
  cos_sin[size_t(t) * 2 * half + i] = float(c);
  cos_sin[size_t(t) * 2 * half + half + i] = float(s);
}

// rope_table_kernel's angles with pair i's position taken from component 0, 1 or 2 of the token's
// rope position (the section holding i).
__global__ void rope_table_mrope_kernel(const int32_t* rope_positions, int T, const float* inv_freq, int half,
                                        int section0, int section1, float* cos_sin) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= T * half) return;
  const int t = idx / half, i = idx % half;
  const int component = i < section0 ? 0 : i < section0 + section1 ? 1 : 2;
  const double angle = double(rope_positions[3 * size_t(t) + component]) * double(inv_freq[i]);
  double s, c;
  sincos(angle, &s, &c);
  cos_sin[size_t(t) * 2 * half + i] = float(c);
  cos_sin[size_t(t) * 2 * half + half + i] = float(s);
}

// One block per given row.
__global__ void scatter_rows_kernel(const float* src, const int32_t* rows, int H, float* x) {
  const float* from = src + size_t(blockIdx.x) * H;
  float* to = x + size_t(rows[blockIdx.x]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) to[i] = from[i];
}

// Grid: T blocks of 8 warps; each warp takes whole heads (q heads, then k heads, then v heads).
// A head is staged in shared memory so the rotate-half pairs (i, i + rot_half) can sit in any lane.
constexpr int kPostWarps = 8;

// Element i of a K or V cache row: E, or (kFp8) the e4m3 code of v / scale, rounded to nearest
// even and saturated to +-448 as the CPU's f32_to_e4m3 (util/e4m3.h). The division is IEEE
// (__fdiv_rn, as the CPU's `/`), not a multiplication by 1 / scale, which can round differently.
template <typename E, bool kFp8>
__device__ __forceinline__ void store_kv(void* row, int i, float v, float scale) {
  if constexpr (kFp8)
    static_cast<__nv_fp8_storage_t*>(row)[i] = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
  else
    static_cast<E*>(row)[i] = from_float<E>(v);
}

template <typename E, bool kFp8>
__global__ void qkv_post_kernel(QkvPostArgs a) {
  using KV = std::conditional_t<kFp8, __nv_fp8_storage_t, E>;  // a cache element
  extern __shared__ float head_buf[];  // [kPostWarps, hd]
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.hd, nq = a.nq, nkv = a.nkv;
  float* buf = head_buf + warp * hd;
  const float* row = a.qkv + size_t(t) * (nq + 2 * nkv) * hd;
  const float* cs = a.cos_sin + size_t(t) * 2 * a.rot_half;
  const size_t cache_row = (size_t(a.slots[t]) * nkv) * hd;
  for (int head = warp; head < nq + 2 * nkv; head += kPostWarps) {
    const float* src = row + size_t(head) * hd;
    const bool is_q = head < nq, is_v = head >= nq + nkv;
    if (is_v) {  // v: straight into the cache
      KV* dst = static_cast<KV*>(a.v_cache) + cache_row + size_t(head - nq - nkv) * hd;
      for (int i = lane; i < hd; i += 32) store_kv<E, kFp8>(dst, i, src[i], a.v_scale);
      continue;
    }
    const float* norm_w = is_q ? a.q_norm : a.k_norm;
    float scale = 1.f;
    if (norm_w) {
      float ss = 0.f;
      for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
      scale = rsqrtf(warp_sum(ss) / float(hd) + a.eps);
    }
    for (int i = lane; i < hd; i += 32) buf[i] = norm_w ? src[i] * scale * norm_w[i] : src[i];
    __syncwarp();
    float* q_dst = a.q_out + (size_t(t) * nq + head) * hd;
    KV* k_dst = static_cast<KV*>(a.k_cache) + cache_row + size_t(head - nq) * hd;
    for (int i = lane; i < hd; i += 32) {
      float v = buf[i];
      if (i < 2 * a.rot_half) {
        const int j = i < a.rot_half ? i : i - a.rot_half;
        const float c = cs[j], s = cs[a.rot_half + j];
        v = i < a.rot_half ? buf[i] * c - buf[i + a.rot_half] * s : buf[i] * c + buf[i - a.rot_half] * s;
      }
      if (is_q) q_dst[i] = v;
      else store_kv<E, kFp8>(k_dst, i, v, a.k_scale);
    }
    __syncwarp();  // the buffer is reused by this warp's next head
  }
}

template <typename E>
void qkv_post_typed(const QkvPostArgs& a, cudaStream_t stream) {
  const size_t smem = size_t(kPostWarps) * a.hd * sizeof(float);
  if (a.kv_fp8) qkv_post_kernel<E, true><<<a.T, kPostWarps * 32, smem, stream>>>(a);
  else qkv_post_kernel<E, false><<<a.T, kPostWarps * 32, smem, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("qkv_post_kernel");
}

}  // namespace

void resolve_device_tokens(int32_t* ids, int T, const int32_t* sampled, int num_sampled, int V, cudaStream_t stream) {
  if (T <= 0) return;
  resolve_device_tokens_kernel<<<(T + 255) / 256, 256, 0, stream>>>(ids, T, sampled, num_sampled, V);
  SLUICE_CUDA_LAUNCH_CHECK("resolve_device_tokens_kernel");
}

void embedding(const int32_t* ids, int T, const void* table, int ld_table, DType e, int H, float scale, float* x,
               cudaStream_t stream) {
  if (T <= 0) return;
  if (e == DType::BF16)
    embedding_kernel<<<T, 256, 0, stream>>>(ids, static_cast<const __nv_bfloat16*>(table), ld_table, H, scale, x);
  else
    embedding_kernel<<<T, 256, 0, stream>>>(ids, static_cast<const __half*>(table), ld_table, H, scale, x);
  SLUICE_CUDA_LAUNCH_CHECK("embedding_kernel");
}

void rmsnorm(const float* x, int R, int D, const int32_t* rows, const float* w, float eps, void* out, int ld_out,
             DType e, cudaStream_t stream) {
  if (R <= 0) return;
  const int threads = D >= 1024 ? 512 : 256;
  if (e == DType::BF16)
    rmsnorm_kernel<<<R, threads, 0, stream>>>(x, D, rows, w, eps, static_cast<__nv_bfloat16*>(out), ld_out);
  else
    rmsnorm_kernel<<<R, threads, 0, stream>>>(x, D, rows, w, eps, static_cast<__half*>(out), ld_out);
  SLUICE_CUDA_LAUNCH_CHECK("rmsnorm_kernel");
}

void add_rmsnorm(float* x, const float* y, int T, int D, const float* w, float eps, cudaStream_t stream) {
  if (T <= 0) return;
  add_rmsnorm_kernel<<<T, D >= 1024 ? 512 : 256, 0, stream>>>(x, y, D, w, eps);
  SLUICE_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
}

void soft_cap(float* v, size_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  soft_cap_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(v, n, cap);
  SLUICE_CUDA_LAUNCH_CHECK("soft_cap_kernel");
}

void rope_table(const int32_t* positions, int T, const float* inv_freq, int half, float* cos_sin,
                cudaStream_t stream) {
  if (T <= 0 || half <= 0) return;
  const int n = T * half;
  rope_table_kernel<<<(n + 255) / 256, 256, 0, stream>>>(positions, T, inv_freq, half, cos_sin);
  SLUICE_CUDA_LAUNCH_CHECK("rope_table_kernel");
}

void rope_table_mrope(const int32_t* rope_positions, int T, const float* inv_freq, int half, int section0,
                      int section1, float* cos_sin, cudaStream_t stream) {
  if (T <= 0 || half <= 0) return;
  const int n = T * half;
  rope_table_mrope_kernel<<<(n + 255) / 256, 256, 0, stream>>>(rope_positions, T, inv_freq, half, section0, section1,
                                                                 cos_sin);
  SLUICE_CUDA_LAUNCH_CHECK("rope_table_mrope_kernel");
}

void scatter_rows(const float* src, const int32_t* rows, int n, int H, float* x, cudaStream_t stream) {
  if (n <= 0 || H <= 0) return;
  scatter_rows_kernel<<<n, 256, 0, stream>>>(src, rows, H, x);
  SLUICE_CUDA_LAUNCH_CHECK("scatter_rows_kernel");
}

void qkv_post(const QkvPostArgs& a, DType e, cudaStream_t stream) {
  if (a.T <= 0) return;
  if (e == DType::BF16) qkv_post_typed<__nv_bfloat16>(a, stream);
  else qkv_post_typed<__half>(a, stream);
}

}  // namespace sluice::cuda
