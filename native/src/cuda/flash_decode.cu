// Flash decoding over the paged KV cache on tensor cores: mma.sync m16n8k16 (bf16 / f16
// operands, f32 accumulators), ldmatrix, cp.async.
//
// Grid: (tokens, kv heads x groups of up to 16 of their q heads, KV splits). A block's q heads
// (G = nq / nkv of them, the GQA group, zero-padded to 16 rows) are the A operand of S = Q K^T,
// so every K/V row a block reads serves all of them. The block covers its split's share of the
// token's KV range [first, pos + 1) (first: the window's start), in tiles of BK positions
// gathered through the block table with cp.async into a multi-stage buffer (later tiles load
// while the current one is multiplied); the table lookups of the next tile are issued a tile
// ahead, so they are not on the copies' critical path. Warp w takes positions 16w..16w+15 of
// each tile: S (16 rows x 16 positions), the online softmax in the log2 domain, P rounded to E,
// O += P V (16 rows x hd); each warp keeps its own running max, sum and output in registers.
//
// At the end the warps' states are merged in shared memory (fixed order). With one split the
// block writes the output (the sink, if any, joins the sum then). With several, it writes its
// heads' partial (acc, max, sum) and takes a ticket of its (token, kv head); the last of the
// num_splits x groups blocks merges every split of every q head of the kv head, in split order,
// from global memory (its own partial included, so the bits do not depend on which block is
// last), writes the output and sets the ticket back to zero. Nothing else synchronises: one
// launch, no combine kernel.
//
// An fp8 cache (kv_fp8, e4m3 codes): cp.async fills the stages with raw codes, and each warp
// converts its own 16 positions of the current stage into its rows of one E stage of K and V
// (exact: bf16 and f16 hold every e4m3 value; only a __syncwarp before its MMAs read them, as no
// other warp reads those rows). k_scale is folded into the score scale, v_scale multiplies the
// block's merged output before it is written or published, so partial_acc holds V units.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/e4m3_convert.cuh"
#include "cuda/mma_primitives.cuh"
#include "cuda/flash_decode.h"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kQRows = 16;  // q heads per block: the mma's M (G of them used)
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory (16-bit elements): q [16, kLd], then K stages [kStagesE, BK, kLd] and V stages
// (kStagesE = kStages; with an fp8 cache one, the stages of codes, [kStages, BK, HD] bytes for K
// then V, follow). Rows of E are padded by 8 elements (16 bytes), so the 8 rows an ldmatrix reads
// hit distinct banks. After the loop the K/V area holds the warps' states for the merge:
// [kWarps, 16, kRedLd] floats of output and [kWarps, 16, 2] of (max, sum).
// (The fp8 variant needs less shared memory; blocks_per_sm, a split heuristic, counts the E one.)
template <int HD, bool kFp8 = false>
struct DecodeConfig {
  static constexpr int kWarps = HD >= 256 ? 2 : 4;  // hd 256: two warps, so three blocks fit an SM
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBK = 16 * kWarps;          // KV positions per tile: 16 per warp
  static constexpr int kStages = HD <= 64 ? 3 : 2;  // K/V tiles in flight per block (small tiles: more)
  static constexpr int kStagesE = kFp8 ? 1 : kStages;  // E stages the MMAs read
  static constexpr int kLd = HD + 8;
  static constexpr int kQElems = kQRows * kLd;
  static constexpr int kTileElems = kBK * kLd;  // one K or V stage
  static constexpr int kCodeTileBytes = kFp8 ? kBK * HD : 0;  // one K or V stage of codes
  static constexpr int kCopyElems = kFp8 ? 16 : 8;  // cache elements per 16-byte copy
  static constexpr int kChunks = HD / kCopyElems;   // 16-byte chunks per K/V row
  static constexpr int kRowStep = kThreads / kChunks;  // a thread copies rows r0, r0 + kRowStep, ...
  static constexpr int kRowsPerThread = kBK / kRowStep;
  static constexpr bool kQInRegs = HD <= 128;  // q fragments held in registers (hd 256: reloaded)
  static constexpr int kRedLd = HD + 4;        // merge rows, padded against bank conflicts
  static constexpr size_t kKvBytes =
      size_t(2 * kStagesE * kTileElems) * sizeof(uint16_t) + size_t(2 * kStages) * kCodeTileBytes;
  static constexpr size_t kSmemBytes = size_t(kQElems) * sizeof(uint16_t) + kKvBytes;
  static_assert(HD % 16 == 0 && kThreads % kChunks == 0 && kBK % kRowStep == 0, "tile shape");
  static_assert(size_t(kWarps) * kQRows * (kRedLd + 2) * sizeof(float) <= kKvBytes,
                "the merge area fits in the K/V stages");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

using namespace mma;  // cuda/mma_primitives.cuh

// One head's output from its merged state (acc relative to max `mx`, log2 domain; sum):
// acc / sum, or with a sink logit (natural units, not scaled) acc / (sum + exp(sink - max)).
__device__ __forceinline__ float4 finish4(float4 acc, float sum, float mx, const float* sinks, int h) {
  float f = 1.f;
  if (sinks && mx != -INFINITY) {
    const float sink = sinks[h] * kLog2e;
    const float mm = fmaxf(mx, sink);
    f = exp2f(mx - mm);
    sum = sum * f + exp2f(sink - mm);
  }
  const float inv = sum > 0.f ? f / sum : 0.f;
  return make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

// Four consecutive output elements (E): one 8-byte store when `vec` (ld_out % 4 == 0, out 8-byte aligned).
template <typename E>
__device__ __forceinline__ void store4(E* dst, float4 v, bool vec) {
  if (vec) {
    uint2 packed;
    packed.x = pack2<E>(v.x, v.y);
    packed.y = pack2<E>(v.z, v.w);
    *reinterpret_cast<uint2*>(dst) = packed;
  } else {
    dst[0] = from_float<E>(v.x);
    dst[1] = from_float<E>(v.y);
    dst[2] = from_float<E>(v.z);
    dst[3] = from_float<E>(v.w);
  }
}

__device__ __forceinline__ void fma4(float4& acc, float4 v, float f) {
  acc.x = fmaf(v.x, f, acc.x);
  acc.y = fmaf(v.y, f, acc.y);
  acc.z = fmaf(v.z, f, acc.z);
  acc.w = fmaf(v.w, f, acc.w);
}

// scale_log2 = scale * log2(e) (times k_scale with an fp8 cache): scores live in the log2 domain
// (exp2f), sinks are converted to it. kFp8: the cache holds e4m3 codes (a.kv_fp8), read as
// code * k_scale / v_scale.
template <typename E, bool kFp8, int HD>
__global__ void __launch_bounds__(DecodeConfig<HD, kFp8>::kThreads)
    flash_decode_kernel(AttentionArgs a, int* tickets, float scale_log2, int vec_out) {
  using C = DecodeConfig<HD, kFp8>;
  using KV = std::conditional_t<kFp8, __nv_fp8_storage_t, E>;  // a cache element
  constexpr int BK = C::kBK, LD = C::kLd, kStages = C::kStages, kWarps = C::kWarps, kThreads = C::kThreads;
  constexpr int kNT = HD / 8;  // n-tiles of the output (and 16-byte chunks of a row of E)
  constexpr int kRowStep = C::kRowStep, kRowsPerThread = C::kRowsPerThread;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* q_s = smem;                              // [16, LD]
  uint16_t* k_s = smem + C::kQElems;                 // [kStagesE, BK, LD]
  uint16_t* v_s = k_s + C::kStagesE * C::kTileElems;  // [kStagesE, BK, LD]
  uint8_t* k8_s = reinterpret_cast<uint8_t*>(v_s + C::kStagesE * C::kTileElems);  // fp8: [kStages, BK, HD]
  uint8_t* v8_s = k8_s + kStages * C::kCodeTileBytes;                             // fp8: [kStages, BK, HD]
  float* red = reinterpret_cast<float*>(k_s);        // after the loop: [kWarps, 16, kRedLd]
  float* red_ml = red + kWarps * kQRows * C::kRedLd;  // [kWarps, 16, 2]
  __shared__ int is_last_s;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = blockIdx.x, split = blockIdx.z, S = gridDim.z;
  const int G = a.nq / a.nkv, groups = (G + kQRows - 1) / kQRows;
  const int kvh = blockIdx.y / groups, grp = blockIdx.y % groups;
  const int h0 = kvh * G + grp * kQRows;        // this block's first q head
  const int rows = min(kQRows, G - grp * kQRows);  // and how many it has

  // This split's share of the token's range [first, ctx), in whole tiles (the last one ragged).
  const int ctx = a.positions[t] + 1;
  const int first = a.window > 0 ? max(0, ctx - a.window) : 0;
  const int per_split = ((ctx - first + S - 1) / S + BK - 1) / BK * BK;
  const int begin = first + split * per_split;
  const int end = min(ctx, begin + per_split);
  const int n_tiles = end > begin ? (end - begin + BK - 1) / BK : 0;

  // q rows of the block's heads -> E (rows past them: zeros). An empty split (a context shorter
  // than the splits) only publishes (max -inf, sum 0) and takes its ticket.
  if (n_tiles > 0) {
    const float* qg = a.q + (size_t(t) * a.nq + h0) * HD;
    for (int c = tid; c < kQRows * (HD / 4); c += kThreads) {
      const int r = c / (HD / 4), d = (c % (HD / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < rows) v = *reinterpret_cast<const float4*>(qg + size_t(r) * HD + d);
      uint2 packed;
      packed.x = pack2<E>(v.x, v.y);
      packed.y = pack2<E>(v.z, v.w);
      *reinterpret_cast<uint2*>(q_s + r * LD + d) = packed;
    }
  }

  // The K/V copies: this thread's 16-byte chunk `ch` of rows r0 + i * kRowStep of each tile,
  // from the cache slots found a tile ahead (-1: past the range, zeros and no read).
  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);
  const size_t kv_row_stride = size_t(a.nkv) * HD, head_off = size_t(kvh) * HD;
  const int bs = a.block_size;
  const int32_t* table = a.block_tables + size_t(a.token_seq[t]) * (*a.table_stride);
  const int ch = (tid % C::kChunks) * C::kCopyElems, r0 = tid / C::kChunks;
  int slot[kRowsPerThread];
  auto fetch_slots = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; i++) {
      const int p = k0 + r0 + i * kRowStep;
      slot[i] = p < end ? table[p / bs] * bs + p % bs : -1;
    }
  };
  auto issue_tile = [&](int st) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; i++) {
      const int r = r0 + i * kRowStep;
      const bool ok = slot[i] >= 0;
      const size_t off = ok ? size_t(slot[i]) * kv_row_stride + head_off + ch : 0;
      if constexpr (kFp8) {
        copy16_async(smem_addr(k8_s + st * C::kCodeTileBytes + r * HD + ch), kc + off, ok);
        copy16_async(smem_addr(v8_s + st * C::kCodeTileBytes + r * HD + ch), vc + off, ok);
      } else {
        copy16_async(smem_addr(k_s + st * C::kTileElems + r * LD + ch), kc + off, ok);
        copy16_async(smem_addr(v_s + st * C::kTileElems + r * LD + ch), vc + off, ok);
      }
    }
  };
  // fp8: this warp's 16 positions of code stage `st` -> its rows of the E stage, 8 codes (16
  // bytes of E) a step.
  auto convert_warp_rows = [&](int st) {
    const uint8_t* ks8 = k8_s + st * C::kCodeTileBytes + warp * 16 * HD;
    const uint8_t* vs8 = v8_s + st * C::kCodeTileBytes + warp * 16 * HD;
    uint16_t* ks = k_s + warp * 16 * LD;
    uint16_t* vs = v_s + warp * 16 * LD;
#pragma unroll 2
    for (int i = 0; i < 16 * kNT / 32; i++) {  // (unrolled fully, the bf16 hd 64 variant spills)
      const int c = lane + i * 32, r = c / kNT, d = (c % kNT) * 8;
      *reinterpret_cast<uint4*>(ks + r * LD + d) = e4m3x8_to_e8<E>(*reinterpret_cast<const uint2*>(ks8 + r * HD + d));
      *reinterpret_cast<uint4*>(vs + r * LD + d) = e4m3x8_to_e8<E>(*reinterpret_cast<const uint2*>(vs8 + r * HD + d));
    }
  };

  // Prologue: the first kStages - 1 tiles in flight, the slots of the next one requested.
#pragma unroll
  for (int st = 0; st < kStages - 1; st++) {
    if (st < n_tiles) {
      fetch_slots(begin + st * BK);
      issue_tile(st);
    }
    async_commit();
  }
  if (kStages - 1 < n_tiles) fetch_slots(begin + (kStages - 1) * BK);
  __syncthreads();  // q_s

  // q as A fragments (rows = heads, k = head dims), kept in registers when they fit.
  uint32_t qf[C::kQInRegs ? HD / 16 : 1][4];
  if constexpr (C::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
      ldsm_x4(qf[kk], smem_addr(q_s + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8));
  }

  // This thread's accumulator rows: heads g and g + 8 of the block's 16 (mma C-fragment layout).
  const int g = lane >> 2, tig = lane & 3;
  float o[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; j++)
#pragma unroll
    for (int r = 0; r < 4; r++) o[j][r] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 domain)
  float l[2] = {0.f, 0.f};              // running sum over this thread's columns (quad-reduced at the end)

  for (int it = 0; it < n_tiles; it++) {
    async_wait<kStages - 2>();  // this thread's copies of tile `it` have landed
    __syncthreads();            // everyone's have; every warp has left tile it - 1 (the stage refilled next)
    const int next = it + kStages - 1;
    if (next < n_tiles) issue_tile(next % kStages);
    async_commit();
    if (next + 1 < n_tiles) fetch_slots(begin + (next + 1) * BK);  // consumed at the next iteration

    const int kw = begin + it * BK + warp * 16;  // this warp's first position
    if (kw >= end) continue;                     // all past the range (the ragged last tile)
    if constexpr (kFp8) {
      // The code stage it % kStages is refilled only after the next iteration's barrier; the
      // warp's E rows were last read by its own MMAs of tile it - 1.
      convert_warp_rows(it % kStages);
      __syncwarp();
    }
    const uint16_t* ks = k_s + (kFp8 ? 0 : (it % kStages) * C::kTileElems) + warp * 16 * LD;
    const uint16_t* vs = v_s + (kFp8 ? 0 : (it % kStages) * C::kTileElems) + warp * 16 * LD;

    // S = Q K^T: 16 heads x 16 positions.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) s[j][r] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t b[4];
      ldsm_x4(b, smem_addr(ks + ((lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8));
      if constexpr (C::kQInRegs) {
        mma_16816<E>(s[0], qf[kk], b[0], b[1]);
        mma_16816<E>(s[1], qf[kk], b[2], b[3]);
      } else {
        uint32_t qa[4];
        ldsm_x4(qa, smem_addr(q_s + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8));
        mma_16816<E>(s[0], qa, b[0], b[1]);
        mma_16816<E>(s[1], qa, b[2], b[3]);
      }
    }

    // Scale, mask (positions past the range), online softmax. Element (j, r): head g + 8 (r >> 1),
    // position kw + 8j + 2 tig + (r & 1).
    const bool need_mask = kw + 16 > end;
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        float v = s[j][r] * scale_log2;
        if (need_mask && kw + j * 8 + tig * 2 + (r & 1) >= end) v = -INFINITY;
        s[j][r] = v;
        tmax[r >> 1] = fmaxf(tmax[r >> 1], v);
      }
    float ref[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
      tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
      const float m_new = fmaxf(m[i], tmax[i]);
      ref[i] = m_new == -INFINITY ? 0.f : m_new;
      const float corr = exp2f(m[i] - ref[i]);
      m[i] = m_new;
      l[i] *= corr;
#pragma unroll
      for (int j = 0; j < kNT; j++) {
        o[j][2 * i] *= corr;
        o[j][2 * i + 1] *= corr;
      }
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const float p = exp2f(s[j][r] - ref[r >> 1]);
        s[j][r] = p;
        l[r >> 1] += p;
      }

    // O += P V: P (rounded to E) straight from the S registers as the A operand (k = positions).
    uint32_t pa[4];
    pa[0] = pack2<E>(s[0][0], s[0][1]);
    pa[1] = pack2<E>(s[0][2], s[0][3]);
    pa[2] = pack2<E>(s[1][0], s[1][1]);
    pa[3] = pack2<E>(s[1][2], s[1][3]);
#pragma unroll
    for (int j = 0; j < kNT; j += 2) {
      uint32_t b[4];
      ldsm_x4_t(b, smem_addr(vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + j * 8 + (lane >> 4) * 8));
      mma_16816<E>(o[j], pa, b[0], b[1]);
      mma_16816<E>(o[j + 1], pa, b[2], b[3]);
    }
  }
  async_wait<0>();  // the empty groups committed by the last iterations
  __syncthreads();  // every warp has left the K/V stages: they become the merge area

  // The warps' states -> shared memory.
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int row = warp * kQRows + g + 8 * i;
#pragma unroll
    for (int j = 0; j < kNT; j++)
      *reinterpret_cast<float2*>(red + row * C::kRedLd + j * 8 + tig * 2) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
    if (tig == 0) {
      red_ml[row * 2] = m[i];
      red_ml[row * 2 + 1] = l[i];
    }
  }
  __syncthreads();

  // Merge the warps (in warp order); one thread per 4 head dims of a head.
  E* out = static_cast<E*>(a.out);
  const bool vec = vec_out != 0;
  for (int c = tid; c < rows * (HD / 4); c += kThreads) {
    const int r = c / (HD / 4), d = (c % (HD / 4)) * 4;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; w++) mx = fmaxf(mx, red_ml[(w * kQRows + r) * 2]);
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; w++) {
        const float wm = red_ml[(w * kQRows + r) * 2];
        if (wm == -INFINITY) continue;  // a warp that saw no position
        const float f = exp2f(wm - mx);
        sum = fmaf(red_ml[(w * kQRows + r) * 2 + 1], f, sum);
        fma4(acc, *reinterpret_cast<const float4*>(red + (w * kQRows + r) * C::kRedLd + d), f);
      }
    }
    if constexpr (kFp8) acc = make_float4(acc.x * a.v_scale, acc.y * a.v_scale, acc.z * a.v_scale, acc.w * a.v_scale);
    const int h = h0 + r;
    if (S == 1) {
      store4<E>(out + size_t(t) * a.ld_out + size_t(h) * HD + d, finish4(acc, sum, mx, a.sinks, h), vec);
    } else {
      const size_t part = (size_t(t) * a.nq + h) * S + split;
      if (mx != -INFINITY) *reinterpret_cast<float4*>(a.partial_acc + part * HD + d) = acc;  // else never read
      if (d == 0) *reinterpret_cast<float2*>(a.partial_ml + part * 2) = make_float2(mx, sum);
    }
  }
  if (S == 1) return;

  // Publish this block's partials; the last block of the (token, kv head) merges every split.
  __threadfence();
  __syncthreads();
  int* ticket = tickets + size_t(t) * a.nkv + kvh;
  if (tid == 0) is_last_s = atomicAdd(ticket, 1) == S * groups - 1;
  __syncthreads();
  if (!is_last_s) return;
  __threadfence();
  for (int c = tid; c < G * (HD / 4); c += kThreads) {
    const int r = c / (HD / 4), d = (c % (HD / 4)) * 4;
    const int h = kvh * G + r;
    const size_t base = (size_t(t) * a.nq + h) * S;
    float mx = -INFINITY;
    for (int sp = 0; sp < S; sp++) mx = fmaxf(mx, __ldcg(a.partial_ml + (base + sp) * 2));
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mx != -INFINITY) {
      for (int sp = 0; sp < S; sp++) {
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(a.partial_ml + (base + sp) * 2));
        if (ml.x == -INFINITY) continue;  // an empty split
        const float f = exp2f(ml.x - mx);
        sum = fmaf(ml.y, f, sum);
        fma4(acc, __ldcg(reinterpret_cast<const float4*>(a.partial_acc + (base + sp) * HD + d)), f);
      }
    }
    store4<E>(out + size_t(t) * a.ld_out + size_t(h) * HD + d, finish4(acc, sum, mx, a.sinks, h), vec);
  }
  if (tid == 0) *ticket = 0;  // ready for the next launch (and graph replay)
}

template <int HD>
constexpr int blocks_per_sm() {
  // 228 KiB of shared memory per SM (H100; 1 KiB of it reserved per block), 2048 threads.
  using C = DecodeConfig<HD>;
  const int by_smem = int((228 * 1024) / (C::kSmemBytes + 1024 + 64));
  const int by_threads = 2048 / C::kThreads;
  return by_smem < by_threads ? by_smem : by_threads;
}

template <typename E, bool kFp8, int HD>
void launch(const AttentionArgs& a, int splits, int* tickets, cudaStream_t stream) {
  using C = DecodeConfig<HD, kFp8>;
  auto kernel = flash_decode_kernel<E, kFp8, HD>;
  static bool attr_set = false;  // once per instantiation (per process, device 0), as the GEMM
  if (!attr_set) {
    SLUICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
    attr_set = true;
  }
  const bool vec_out = a.ld_out % 4 == 0 && reinterpret_cast<uintptr_t>(a.out) % 8 == 0;
  const int G = a.nq / a.nkv, groups = (G + kQRows - 1) / kQRows;
  const dim3 grid(a.T, a.nkv * groups, splits);
  const float scale = kFp8 ? a.scale * a.k_scale : a.scale;  // q . (code * k_scale) * scale
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a, tickets, scale * kLog2e, vec_out ? 1 : 0);
  SLUICE_CUDA_LAUNCH_CHECK("flash_decode_kernel");
}

template <typename E, bool kFp8>
void launch_typed(const AttentionArgs& a, int splits, int* tickets, cudaStream_t stream) {
  switch (a.hd) {
    case 64: return launch<E, kFp8, 64>(a, splits, tickets, stream);
    case 128: return launch<E, kFp8, 128>(a, splits, tickets, stream);
    default: return launch<E, kFp8, 256>(a, splits, tickets, stream);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool flash_decode_supported(int hd, int nq, int nkv) {
  return (hd == 64 || hd == 128 || hd == 256) && nq > 0 && nkv > 0 && nq % nkv == 0;
}

void flash_decode_attention(const AttentionArgs& a, DType e, int* tickets, cudaStream_t stream) {
  if (a.T <= 0) return;
  if (e != DType::BF16 && e != DType::F16)
    throw Error(ErrorCode::kInternal, "flash decode attention: element type must be bf16 or f16");
  const int splits = std::max(1, a.num_splits);
  const bool split_ok = splits == 1 || (tickets && aligned16(a.partial_acc) && aligned16(a.partial_ml));
  if (!flash_decode_supported(a.hd, a.nq, a.nkv) || !aligned16(a.q) || !aligned16(a.k_cache) ||
      !aligned16(a.v_cache) || !split_ok || a.last)
    return paged_attention(a, e, stream);
  if (e == DType::BF16) {
    if (a.kv_fp8) launch_typed<__nv_bfloat16, true>(a, splits, tickets, stream);
    else launch_typed<__nv_bfloat16, false>(a, splits, tickets, stream);
  } else {
    if (a.kv_fp8) launch_typed<__half, true>(a, splits, tickets, stream);
    else launch_typed<__half, false>(a, splits, tickets, stream);
  }
}

int flash_decode_splits(int T, int nq, int nkv, int hd, int64_t max_ctx, int num_sms, int max_splits) {
  if (T <= 0 || num_sms <= 0 || !flash_decode_supported(hd, nq, nkv)) return 1;
  const int bk = hd == 64 ? DecodeConfig<64>::kBK : hd == 128 ? DecodeConfig<128>::kBK : DecodeConfig<256>::kBK;
  const int per_sm = hd == 64 ? blocks_per_sm<64>() : hd == 128 ? blocks_per_sm<128>() : blocks_per_sm<256>();
  const int64_t groups = (nq / nkv + kQRows - 1) / kQRows;
  const int64_t blocks = int64_t(T) * nkv * groups, slots = int64_t(num_sms) * per_sm;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(max_splits, max_ctx / (2 * bk)));
  // The fewest splits whose blocks fill whole waves well (85%) or make four waves or more (the
  // last one's shortfall then matters little); failing that, the best filled.
  int best = 1;
  double best_fill = 0.0;
  for (int64_t s = 1; s <= cap; s++) {
    const int64_t n = blocks * s, waves = (n + slots - 1) / slots;
    const double fill = double(n) / double(waves * slots);
    if (fill >= 0.85 || waves >= 4) return int(s);
    if (fill > best_fill + 1e-9) {
      best_fill = fill;
      best = int(s);
    }
  }
  return best;
}

}  // namespace sluice::cuda
