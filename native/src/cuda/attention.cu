// Paged attention for decode tokens and prefill chunks alike: one block per (query token,
// kv head [, group of its q heads], KV split). All q heads that share a kv head are handled by
// the same block, so each K/V row is read once per block. Within a block, 4 warps take tiles of
// 32 KV positions in turn: lane j scores position j against every q head (online softmax per
// warp), then the warp accumulates P·V with lane-strided head dims. Warps merge in shared
// memory; KV splits (flash-decoding, for long contexts and small batches) merge in a second kernel.
// A sliding window (Gemma 3, gpt-oss) narrows the positions a token reads (its start from the
// token's position), bidirectional image attention (Gemma 3, a.last) extends them to the image's
// last token; an attention sink (gpt-oss) joins the softmax's sum when the parts are merged.
// An fp8 cache (kv_fp8) holds e4m3 codes: K rows are converted to f32 as they are scored, with
// k_scale folded into q's pre-scale; V rows are staged as f16 (exact for every e4m3 value) and
// v_scale multiplies the block's merged output, so partial_acc holds V units either way and the
// split merge is the same kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/e4m3_convert.cuh"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kAttnWarps = 4;

// 8 consecutive elements as f32 from a 16-byte aligned address.
template <typename E>
__device__ __forceinline__ void load8(const E* p, float (&out)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const E* e = reinterpret_cast<const E*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; i++) out[i] = to_float(e[i]);
}

__device__ __forceinline__ float2 f16x2_to_float2(uint32_t bits) {
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(bits >> 16))));
}

// 8 consecutive e4m3 codes as f32 (their exact values) from an 8-byte aligned address.
__device__ __forceinline__ void load8(const __nv_fp8_storage_t* p, float (&out)[8]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 f0 = f16x2_to_float2(e4m3x2_to_f16x2(raw.x)), f1 = f16x2_to_float2(e4m3x2_to_f16x2(raw.x >> 16));
  const float2 f2 = f16x2_to_float2(e4m3x2_to_f16x2(raw.y)), f3 = f16x2_to_float2(e4m3x2_to_f16x2(raw.y >> 16));
  out[0] = f0.x, out[1] = f0.y, out[2] = f1.x, out[3] = f1.y;
  out[4] = f2.x, out[5] = f2.y, out[6] = f3.x, out[7] = f3.y;
}

// 8 consecutive V elements of a cache row into the staged tile (16 bytes): E copied, or e4m3
// codes as f16.
template <typename E>
__device__ __forceinline__ void stage8(const E* src, E* dst) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}
__device__ __forceinline__ void stage8(const __nv_fp8_storage_t* src, __half* dst) {
  *reinterpret_cast<uint4*>(dst) = e4m3x8_to_e8<__half>(*reinterpret_cast<const uint2*>(src));
}

// Shared memory of attention_kernel, in floats: the V tiles (one per warp, rows padded by 8
// elements so lane-per-row 16-byte stores do not collide in banks; E, or f16 for an fp8 cache) share their space with the
// warps' final states, which are written only after every warp has left its loop.
__host__ __device__ constexpr size_t attn_tile_floats(int hd, int maxg) {
  const size_t v_tiles = size_t(kAttnWarps) * 32 * (hd + 8) / 2;  // E is 2 bytes
  const size_t states = size_t(kAttnWarps) * maxg * hd;
  return v_tiles > states ? v_tiles : states;
}
__host__ __device__ constexpr size_t attn_smem_floats(int hd, int maxg) {
  return attn_tile_floats(hd, maxg) + size_t(maxg) * hd + kAttnWarps * maxg * 32 + kAttnWarps * maxg * 2;
}

// The head's output element from its merged state (acc, sum, max): acc / sum, or with a sink
// logit (sinks[h]) acc / (sum + exp(sink - max)), both scaled to the larger of max and sink.
__device__ __forceinline__ float finish_head(float acc, float sum, float mx, const float* sinks, int h) {
  if (!sinks) return acc / sum;
  const float s = sinks[h];
  const float m = fmaxf(mx, s);
  const float f = __expf(mx - m);
  return acc * f / (sum * f + __expf(s - m));
}

// DPL: head dims per lane (ceil(hd / 32)); MAXG: most q heads per block. The q heads of one kv
// head (nq / nkv of them) are split into blocks of up to MAXG; G is this block's count.
// kFp8: the cache holds e4m3 codes (a.kv_fp8), read as code * k_scale / v_scale.
template <typename E, bool kFp8, int DPL, int MAXG>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_kernel(AttentionArgs a) {
  using KV = std::conditional_t<kFp8, __nv_fp8_storage_t, E>;  // a cache element
  using VT = std::conditional_t<kFp8, __half, E>;               // a staged V element
  extern __shared__ __align__(16) float sm[];
  const int hd = a.hd, hdp = hd + 8;
  float* acc_s = sm;                                 // [warps, MAXG, hd] (after the loop)
  VT* v_tiles = reinterpret_cast<VT*>(sm);           // [warps, 32, hdp] (during the loop)
  float* q_s = sm + attn_tile_floats(hd, MAXG);      // [MAXG, hd], pre-scaled
  float* p_s = q_s + MAXG * hd;                      // [warps, MAXG, 32]
  float* ml_s = p_s + kAttnWarps * MAXG * 32;        // [warps, MAXG, 2]

  const int t = blockIdx.x, split = blockIdx.z;
  const int heads_per_kv = a.nq / a.nkv, groups_per_kv = (heads_per_kv + MAXG - 1) / MAXG;
  const int kvh = blockIdx.y / groups_per_kv, group = blockIdx.y % groups_per_kv;
  const int h0 = kvh * heads_per_kv + group * MAXG;  // first q head of this block
  const int G = min(MAXG, heads_per_kv - group * MAXG);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  const int at = a.positions[t];
  const int ctx = (a.last ? a.last[t] : at) + 1;                   // past the last position read
  const int first = a.window > 0 ? max(0, at + 1 - a.window) : 0;  // the window's first position
  const int per_split = ((ctx - first + a.num_splits - 1) / a.num_splits + 31) / 32 * 32;
  const int begin = first + split * per_split, end = min(ctx, begin + per_split);
  const int32_t* table = a.block_tables + size_t(a.token_seq[t]) * (*a.table_stride);

  const float q_scale = kFp8 ? a.scale * a.k_scale : a.scale;  // q . (code * k_scale) * scale
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
    q_s[i] = a.q[(size_t(t) * a.nq + h0) * hd + i] * q_scale;
  __syncthreads();

  float m[MAXG], l[MAXG], acc[MAXG][DPL];
#pragma unroll
  for (int g = 0; g < MAXG; g++) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int d = 0; d < DPL; d++) acc[g][d] = 0.f;
  }

  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);
  const size_t head_off = size_t(kvh) * hd, row_stride = size_t(a.nkv) * hd;
  float* p_w = p_s + warp * MAXG * 32;
  VT* v_w = v_tiles + size_t(warp) * 32 * hdp;
  for (int tile = begin + warp * 32; tile < end; tile += kAttnWarps * 32) {
    const int pos = tile + lane;
    const bool valid = pos < end;
    float s[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; g++) s[g] = 0.f;
    if (valid) {
      // Lane j owns position j: it stages V row j for the warp and scores K row j.
      const size_t row = size_t(table[pos / a.block_size] * a.block_size + pos % a.block_size) * row_stride + head_off;
      const KV* vrow = vc + row;
      for (int c = 0; c < hd; c += 8) stage8(vrow + c, v_w + lane * hdp + c);
      const KV* krow = kc + row;
      for (int c = 0; c < hd; c += 8) {
        float k8[8];
        load8(krow + c, k8);
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
          if (g < G) {
            const float* qg = q_s + g * hd + c;
#pragma unroll
            for (int i = 0; i < 8; i++) s[g] = fmaf(qg[i], k8[i], s[g]);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
      if (g >= G) continue;
      const float sc = valid ? s[g] : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(sc));  // finite: lane 0 of a tile is always valid
      const float corr = __expf(m[g] - m_new);
      const float pg = valid ? __expf(sc - m_new) : 0.f;
      l[g] = l[g] * corr + warp_sum(pg);
      m[g] = m_new;
#pragma unroll
      for (int d = 0; d < DPL; d++) acc[g][d] *= corr;
      p_w[g * 32 + lane] = pg;
    }
    __syncwarp();
    const int n = min(32, end - tile);
    for (int j = 0; j < n; j++) {
      float v[DPL];
#pragma unroll
      for (int d = 0; d < DPL; d++) v[d] = lane + 32 * d < hd ? to_float(v_w[j * hdp + lane + 32 * d]) : 0.f;
#pragma unroll
      for (int g = 0; g < MAXG; g++) {
        if (g >= G) continue;
        const float pj = p_w[g * 32 + j];
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[g][d] = fmaf(pj, v[d], acc[g][d]);
      }
    }
    __syncwarp();
  }
  __syncthreads();  // the V tiles become the warps' state area

  // Merge the warps' running states.
#pragma unroll
  for (int g = 0; g < MAXG; g++) {
    if (g >= G) continue;
    if (lane == 0) {
      ml_s[(warp * MAXG + g) * 2] = m[g];
      ml_s[(warp * MAXG + g) * 2 + 1] = l[g];
    }
#pragma unroll
    for (int d = 0; d < DPL; d++)
      if (lane + 32 * d < hd) acc_s[(warp * MAXG + g) * hd + lane + 32 * d] = acc[g][d];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; w++) mx = fmaxf(mx, ml_s[(w * MAXG + g) * 2]);
    float sum = 0.f, out = 0.f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kAttnWarps; w++) {
        const float wm = ml_s[(w * MAXG + g) * 2];
        if (wm == -INFINITY) continue;
        const float f = __expf(wm - mx);
        sum += ml_s[(w * MAXG + g) * 2 + 1] * f;
        out += acc_s[(w * MAXG + g) * hd + d] * f;
      }
    }
    if constexpr (kFp8) out *= a.v_scale;  // acc summed codes: V units from here on (partial_acc too)
    const int h = h0 + g;
    if (a.num_splits == 1) {
      const float o = finish_head(out, sum, mx, a.sinks, h);
      static_cast<E*>(a.out)[size_t(t) * a.ld_out + size_t(h) * hd + d] = from_float<E>(o);
    } else {
      const size_t part = (size_t(t) * a.nq + h) * a.num_splits + split;
      a.partial_acc[part * hd + d] = out;
      if (d == 0) {
        a.partial_ml[part * 2] = mx;
        a.partial_ml[part * 2 + 1] = sum;
      }
    }
  }
}

// Merges the KV splits of one (token, q head): grid (T, nq), one thread per head dim.
template <typename E>
__global__ void attention_combine_kernel(AttentionArgs a) {
  const int t = blockIdx.x, h = blockIdx.y, S = a.num_splits;
  const size_t base = (size_t(t) * a.nq + h) * S;
  float mx = -INFINITY;
  for (int s = 0; s < S; s++) mx = fmaxf(mx, a.partial_ml[(base + s) * 2]);
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x) {
    float sum = 0.f, out = 0.f;
    for (int s = 0; s < S; s++) {
      const float sm = a.partial_ml[(base + s) * 2];
      if (sm == -INFINITY) continue;  // an empty split
      const float f = __expf(sm - mx);
      sum += a.partial_ml[(base + s) * 2 + 1] * f;
      out += a.partial_acc[(base + s) * a.hd + d] * f;
    }
    const float o = finish_head(out, sum, mx, a.sinks, h);
    static_cast<E*>(a.out)[size_t(t) * a.ld_out + size_t(h) * a.hd + d] = from_float<E>(o);
  }
}

template <typename E, bool kFp8, int DPL, int MAXG>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  const int groups_per_kv = (a.nq / a.nkv + MAXG - 1) / MAXG;
  const size_t smem = sizeof(float) * attn_smem_floats(a.hd, MAXG);
  static size_t smem_allowed = 48 * 1024;  // raised once per instantiation when a head needs more
  if (smem > smem_allowed) {
    SLUICE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<E, kFp8, DPL, MAXG>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_allowed = smem;
  }
  dim3 grid(a.T, a.nkv * groups_per_kv, a.num_splits);
  attention_kernel<E, kFp8, DPL, MAXG><<<grid, kAttnWarps * 32, smem, stream>>>(a);
  SLUICE_CUDA_LAUNCH_CHECK("attention_kernel");
  if (a.num_splits > 1) {
    attention_combine_kernel<E><<<dim3(a.T, a.nq), a.hd < 128 ? a.hd : 128, 0, stream>>>(a);
    SLUICE_CUDA_LAUNCH_CHECK("attention_combine_kernel");
  }
}

template <typename E, bool kFp8, int DPL>
void launch_g(const AttentionArgs& a, cudaStream_t stream) {
  const int G = a.nq / a.nkv;
  if (G == 1) launch<E, kFp8, DPL, 1>(a, stream);
  else if (G <= 4) launch<E, kFp8, DPL, 4>(a, stream);
  else launch<E, kFp8, DPL, 8>(a, stream);
}

template <typename E, bool kFp8>
void launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  if (a.hd <= 32) launch_g<E, kFp8, 1>(a, stream);
  else if (a.hd <= 64) launch_g<E, kFp8, 2>(a, stream);
  else if (a.hd <= 128) launch_g<E, kFp8, 4>(a, stream);
  else launch_g<E, kFp8, 8>(a, stream);
}

}  // namespace

void paged_attention(const AttentionArgs& a, DType e, cudaStream_t stream) {
  if (a.T <= 0) return;
  if (e == DType::BF16) {
    if (a.kv_fp8) launch_typed<__nv_bfloat16, true>(a, stream);
    else launch_typed<__nv_bfloat16, false>(a, stream);
  } else {
    if (a.kv_fp8) launch_typed<__half, true>(a, stream);
    else launch_typed<__half, false>(a, stream);
  }
}

}  // namespace sluice::cuda
