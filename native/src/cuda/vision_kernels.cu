#include "cuda/vision_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_math.cuh"

namespace sluice::cuda {

namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

template <typename E>
__global__ void rows_to_e_kernel(const float* x, int T, int K, int ld_x, E* out, int ld_out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * ld_out) return;
  const int t = int(i / ld_out), c = int(i % ld_out);
  out[i] = from_float<E>(c < K ? x[size_t(t) * ld_x + c] : 0.f);
}

template <typename E>
__global__ void siglip_patches_kernel(const float* pixels, int B, int C, int S, int P, E* out, int ld_out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int side = S / P, n = side * side;
  if (i >= size_t(B) * n * ld_out) return;
  const size_t row = i / ld_out;
  const int col = int(i % ld_out);
  float v = 0.f;
  if (col < C * P * P) {
    const int b = int(row / n), p = int(row % n), pr = p / side, pc = p % side;
    const int ch = col / (P * P), y = (col / P) % P, xx = col % P;
    v = pixels[((size_t(b) * C + ch) * S + size_t(pr) * P + y) * S + size_t(pc) * P + xx];
  }
  out[i] = from_float<E>(v);
}

__global__ void vision_rope_table_kernel(const int32_t* rc, int T, const float* inv_freq, int quarter, float* cos_sin) {
  const int half = 2 * quarter;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * half) return;
  const int t = int(i / half), j = int(i % half);
  const double a = j < quarter ? double(rc[2 * t]) * double(inv_freq[j]) : double(rc[2 * t + 1]) * double(inv_freq[j - quarter]);
  cos_sin[size_t(t) * 2 * half + j] = float(cos(a));
  cos_sin[size_t(t) * 2 * half + half + j] = float(sin(a));
}

// One thread per (token, head, padded dim) of q, k and v.
template <typename E>
__global__ void vision_qkv_split_kernel(const float* qkv, int T, int nh, int hd, int hd_pad, const float* cos_sin, float* q,
                                        E* k, E* v) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * nh * hd_pad) return;
  const int d = int(i % hd_pad);
  const size_t th = i / hd_pad;
  const int h = int(th % nh);
  const size_t t = th / nh;
  const size_t H = size_t(nh) * hd;
  const float* row = qkv + t * 3 * H + size_t(h) * hd;
  float qv = 0.f, kv = 0.f, vv = 0.f;
  if (d < hd) {
    qv = row[d];
    kv = row[H + d];
    vv = row[2 * H + d];
    if (cos_sin) {
      const int half = hd / 2, j = d < half ? d : d - half;
      const float c = cos_sin[t * hd + j], s = cos_sin[t * hd + half + j];
      // rotate-half: first half x1 c - x2 s, second half x2 c + x1 s.
      if (d < half) {
        qv = qv * c - row[d + half] * s;
        kv = kv * c - row[H + d + half] * s;
      } else {
        qv = qv * c + row[d - half] * s;
        kv = kv * c + row[H + d - half] * s;
      }
    }
  }
  q[i] = qv;
  k[i] = from_float<E>(kv);
  v[i] = from_float<E>(vv);
}

// One block per row: mean, then the variance around it (two passes, as the CPU).
template <typename O>
__global__ void layer_norm_kernel(const float* x, int D, const float* w, const float* b, float eps, O* out, int ld_out) {
  __shared__ float scratch[32];
  const float* r = x + size_t(blockIdx.x) * D;
  float s = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) s += r[i];
  const float mean = block_sum(s, scratch) / float(D);
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += (r[i] - mean) * (r[i] - mean);
  const float inv = rsqrtf(block_sum(ss, scratch) / float(D) + eps);
  O* o = out + size_t(blockIdx.x) * ld_out;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = (r[i] - mean) * inv * w[i] + b[i];
    if constexpr (std::is_same_v<O, float>) o[i] = v;
    else o[i] = from_float<O>(v);
  }
}

template <typename E>
__global__ void gelu_rows_kernel(const float* x, int T, int N, int ld_x, bool tanh_approx, E* out, int ld_out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T) * ld_out) return;
  const int t = int(i / ld_out), c = int(i % ld_out);
  float g = 0.f;
  if (c < N) {
    const float v = x[size_t(t) * ld_x + c];
    g = tanh_approx ? 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                    : 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
  }
  out[i] = from_float<E>(g);
}

__global__ void add_repeated_rows_kernel(float* x, size_t total, const float* add, size_t period) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) x[i] += add[i % period];
}

__global__ void avg_pool_patches_kernel(const float* x, int B, int side, int k, int D, float* out) {
  const int os = side / k;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * os * os * D) return;
  const int d = int(i % D);
  const size_t tok = i / D;
  const int b = int(tok / (size_t(os) * os)), p = int(tok % (size_t(os) * os)), r0 = (p / os) * k, c0 = (p % os) * k;
  const float* img = x + size_t(b) * side * side * D;
  float acc = 0.f;
  for (int r = r0; r < r0 + k; r++)
    for (int c = c0; c < c0 + k; c++) acc += img[(size_t(r) * side + c) * D + d];
  out[i] = acc / float(k * k);
}

template <typename F>
void by_type(DType e, F&& f) {
  if (e == DType::BF16) f(__nv_bfloat16{});
  else if (e == DType::F16) f(__half{});
  else throw Error(ErrorCode::kInternal, "vision kernels: element type must be bf16 or f16");
}

}  // namespace

void rows_to_e(const float* x, int T, int K, int ld_x, void* out, int ld_out, DType e, cudaStream_t stream) {
  if (T <= 0) return;
  by_type(e, [&](auto tag) {
    using E = decltype(tag);
    rows_to_e_kernel<E><<<blocks_for(size_t(T) * ld_out), kThreads, 0, stream>>>(x, T, K, ld_x, static_cast<E*>(out), ld_out);
  });
  SLUICE_CUDA_LAUNCH_CHECK("rows_to_e_kernel");
}

void siglip_patches(const float* pixels, int B, int C, int S, int P, void* out, int ld_out, DType e, cudaStream_t stream) {
  if (B <= 0) return;
  const size_t n = size_t(B) * (S / P) * (S / P) * ld_out;
  by_type(e, [&](auto tag) {
    using E = decltype(tag);
    siglip_patches_kernel<E><<<blocks_for(n), kThreads, 0, stream>>>(pixels, B, C, S, P, static_cast<E*>(out), ld_out);
  });
  SLUICE_CUDA_LAUNCH_CHECK("siglip_patches_kernel");
}

void vision_rope_table(const int32_t* rc, int T, const float* inv_freq, int quarter, float* cos_sin, cudaStream_t stream) {
  if (T <= 0) return;
  vision_rope_table_kernel<<<blocks_for(size_t(T) * 2 * quarter), kThreads, 0, stream>>>(rc, T, inv_freq, quarter, cos_sin);
  SLUICE_CUDA_LAUNCH_CHECK("vision_rope_table_kernel");
}

void vision_qkv_split(const float* qkv, int T, int nh, int hd, int hd_pad, const float* cos_sin, float* q, void* k, void* v,
                      DType e, cudaStream_t stream) {
  if (T <= 0) return;
  by_type(e, [&](auto tag) {
    using E = decltype(tag);
    vision_qkv_split_kernel<E><<<blocks_for(size_t(T) * nh * hd_pad), kThreads, 0, stream>>>(
        qkv, T, nh, hd, hd_pad, cos_sin, q, static_cast<E*>(k), static_cast<E*>(v));
  });
  SLUICE_CUDA_LAUNCH_CHECK("vision_qkv_split_kernel");
}

void layer_norm(const float* x, int T, int D, const float* w, const float* b, float eps, void* out, int ld_out, bool out_f32,
                DType e, cudaStream_t stream) {
  if (T <= 0) return;
  if (out_f32) {
    layer_norm_kernel<float><<<T, kThreads, 0, stream>>>(x, D, w, b, eps, static_cast<float*>(out), ld_out);
  } else {
    by_type(e, [&](auto tag) {
      using E = decltype(tag);
      layer_norm_kernel<E><<<T, kThreads, 0, stream>>>(x, D, w, b, eps, static_cast<E*>(out), ld_out);
    });
  }
  SLUICE_CUDA_LAUNCH_CHECK("layer_norm_kernel");
}

void gelu_rows(const float* x, int T, int N, int ld_x, bool tanh_approx, void* out, int ld_out, DType e, cudaStream_t stream) {
  if (T <= 0) return;
  by_type(e, [&](auto tag) {
    using E = decltype(tag);
    gelu_rows_kernel<E><<<blocks_for(size_t(T) * ld_out), kThreads, 0, stream>>>(x, T, N, ld_x, tanh_approx,
                                                                                  static_cast<E*>(out), ld_out);
  });
  SLUICE_CUDA_LAUNCH_CHECK("gelu_rows_kernel");
}

void add_repeated_rows(float* x, int rows, const float* add, int n, int D, cudaStream_t stream) {
  if (rows <= 0) return;
  const size_t total = size_t(rows) * D;
  add_repeated_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, total, add, size_t(n) * D);
  SLUICE_CUDA_LAUNCH_CHECK("add_repeated_rows_kernel");
}

void avg_pool_patches(const float* x, int B, int side, int k, int D, float* out, cudaStream_t stream) {
  if (B <= 0) return;
  const int os = side / k;
  avg_pool_patches_kernel<<<blocks_for(size_t(B) * os * os * D), kThreads, 0, stream>>>(x, B, side, k, D, out);
  SLUICE_CUDA_LAUNCH_CHECK("avg_pool_patches_kernel");
}

}  // namespace sluice::cuda
