// Kernels of the CUDA vision towers (cuda/vision_tower.h) beyond the decoder's (kernels.h):
// input layout, LayerNorm, GELU, the tower's 2D rotary table, the q/k/v split into the attention
// kernels' layout (heads padded to a head dim the flash kernel has), and SigLIP's pooling.
// Shapes are row-major; `ld_*` are row strides in elements; E is bf16 or f16 (the tower's dtype);
// outputs of E leave their padding columns zero, so they are GEMM operands as kernels.h requires.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "sluice/dtype.h"

namespace sluice::cuda {

// out[t, 0:ld_out] (E) = x[t, 0:K] (f32, ld_x), zeros in K..ld_out.
void rows_to_e(const float* x, int T, int K, int ld_x, void* out, int ld_out, DType e, cudaStream_t stream);

// SigLIP's patch rows: pixels [B, C, S, S] f32 (channels first) -> out [B * (S/P)^2, ld_out] (E),
// row b * (S/P)^2 + pr * (S/P) + pc holding patch (pr, pc)'s values in [c, y, x] order (the
// Conv2d weight's), zeros past C * P * P.
void siglip_patches(const float* pixels, int B, int C, int S, int P, void* out, int ld_out, DType e, cudaStream_t stream);

// The Qwen2.5-VL tower's rotary table: cos_sin[t, 0:2 * half] (cos then sin, half = 2 * quarter)
// of rc[2t] * inv_freq[j] for j < quarter and rc[2t + 1] * inv_freq[j - quarter] after (a patch's
// row, then its column), angles in double as the CPU tower computes them.
void vision_rope_table(const int32_t* rc, int T, const float* inv_freq, int quarter, float* cos_sin, cudaStream_t stream);

// qkv [T, 3 * nh * hd] f32 (q heads, k heads, v heads) -> q [T, nh, hd_pad] f32 and k, v
// [T, nh, hd_pad] (E), each head zero padded past hd. With cos_sin ([T, hd], vision_rope_table's),
// q and k are turned rotate-half over the whole head first.
void vision_qkv_split(const float* qkv, int T, int nh, int hd, int hd_pad, const float* cos_sin, float* q, void* k, void* v,
                      DType e, cudaStream_t stream);

// LayerNorm of x [T, D] f32: (x - mean) / sqrt(var + eps) * w + b into out [T, ld_out], E, or f32
// when out_f32.
void layer_norm(const float* x, int T, int D, const float* w, const float* b, float eps, void* out, int ld_out, bool out_f32,
                DType e, cudaStream_t stream);

// out[t, 0:ld_out] (E) = gelu(x[t, 0:N]) (f32, ld_x), zeros past N: the tanh approximation
// (gelu_pytorch_tanh) or the exact erf form.
void gelu_rows(const float* x, int T, int N, int ld_x, bool tanh_approx, void* out, int ld_out, DType e, cudaStream_t stream);

// x[i, :] += add[i % n, :] over x [rows, D] f32 (position embeddings repeated per image).
void add_repeated_rows(float* x, int rows, const float* add, int n, int D, cudaStream_t stream);

// Gemma 3's projector pooling: x [B, side * side, D] f32 (patch row-major) -> out [B * (side/k)^2, D],
// token (pr, pc) the mean of the k x k patches from (pr * k, pc * k).
void avg_pool_patches(const float* x, int B, int side, int k, int D, float* out, cudaStream_t stream);

}  // namespace sluice::cuda
