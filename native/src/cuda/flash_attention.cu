// Flash attention (FlashAttention-2 style) for prefill chunks over the paged KV cache, on tensor
// cores: mma.sync m16n8k16 (bf16 / f16 operands, f32 accumulators), ldmatrix, cp.async.
//
// Grid: (tiles of kRows = 64 consecutive step tokens, q heads), the tiles of the latest tokens
// (the most KV to read) first. A block of 4 warps holds its tile's q rows (one head, rounded to
// E) in shared memory; warp w owns rows 16w..16w+15 and keeps their output accumulators,
// running max and sum in registers. K/V tiles of BK positions are gathered through the block
// table with cp.async into a two-stage buffer (the next tile loads while the current one is
// multiplied). Per KV tile a warp computes S = Q K^T, masks it (causal, sliding window, rows of
// other sequences), updates the online softmax in the log2 domain, rounds P to E and adds P V.
//
// A tile of the step can hold rows of several sequences (a chunk's tail, then the next
// sequence's chunk, or decode rows): its rows are cut into runs of one sequence each, and each
// run is a pass over that sequence's KV range [min first position, max position + 1) with the
// other runs' rows masked out. Warps skip the KV tiles that none of their rows can see (the
// causal upper triangle, positions before their windows, runs they have no row in). A row's
// range is [window start, last position]: its own position, or with a.last (bidirectional image
// attention) a later one, which the run's range, the tile skipping and the mask all follow. The
// attention sink (gpt-oss) joins the softmax's sum at the end. Output rows are staged in the
// warp's own q rows and leave with 16-byte stores.
//
// An fp8 cache (kv_fp8, e4m3 codes): cp.async fills two stages of raw codes instead, and at each
// tile the block converts the current stage into one E stage of K and V (exact: bf16 and f16
// hold every e4m3 value), a second barrier later the MMAs read it as in the E path. k_scale is
// folded into the score scale and v_scale into the output normalisation (exact to f32 rounding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/e4m3_convert.cuh"
#include "cuda/mma_primitives.cuh"
#include "cuda/flash_attention.h"
#include "cuda/kernels.h"

namespace sluice::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows (step tokens) per block
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory (in 16-bit elements): q [kRows, kLd], then K and V, kStagesE stages each [BK, kLd]
// (two; one with an fp8 cache), then with an fp8 cache the codes: K and V, two stages each
// [BK, HD] bytes. Rows of E are padded by 8 elements (16 bytes), so the 8 rows an ldmatrix
// reads hit distinct banks; rows of codes are only read and written by consecutive 8-byte chunks.
template <int HD, bool kFp8>
struct FlashConfig {
  static constexpr int kBK = HD >= 256 ? 32 : 64;  // KV positions per tile (hd 256: registers)
  static constexpr int kLd = HD + 8;
  static constexpr int kQElems = kRows * kLd;
  static constexpr int kTileElems = kBK * kLd;  // one K or V stage
  static constexpr int kStagesE = kFp8 ? 1 : 2;
  static constexpr int kCodeTileBytes = kFp8 ? kBK * HD : 0;  // one K or V stage of codes
  static constexpr size_t kSmemBytes =
      size_t(kQElems + 2 * kStagesE * kTileElems) * sizeof(uint16_t) + size_t(4) * kCodeTileBytes;
  static_assert(HD % 16 == 0 && kBK % 16 == 0 && kBK * (HD / 8) % kThreads == 0, "tile shape");
  static_assert(kBK * (HD / 16) % kThreads == 0, "fp8 copies: whole 16-byte chunks per thread");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

using namespace mma;  // cuda/mma_primitives.cuh

__device__ __forceinline__ int warp_min_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_max_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// scale_log2 = scale * log2(e) (times k_scale with an fp8 cache): scores live in the log2 domain
// (exp2f), sinks are converted to it. vec_out: out and ld_out allow 16-byte row stores.
// kFp8: the cache holds e4m3 codes (a.kv_fp8), read as code * k_scale / v_scale.
template <typename E, bool kFp8, int HD>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(AttentionArgs a, float scale_log2, int vec_out) {
  using C = FlashConfig<HD, kFp8>;
  using KV = std::conditional_t<kFp8, __nv_fp8_storage_t, E>;  // a cache element
  constexpr int BK = C::kBK, LD = C::kLd;
  constexpr int kNT = HD / 8;  // n-tiles of the output (and 16-byte chunks of a row)
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* q_s = smem;                                  // [kRows, LD]
  uint16_t* k_s = smem + C::kQElems;                     // [kStagesE, BK, LD]
  uint16_t* v_s = k_s + C::kStagesE * C::kTileElems;     // [kStagesE, BK, LD]
  uint8_t* k8_s = reinterpret_cast<uint8_t*>(v_s + C::kStagesE * C::kTileElems);  // fp8: [2, BK, HD]
  uint8_t* v8_s = k8_s + 2 * C::kCodeTileBytes;                                   // fp8: [2, BK, HD]
  __shared__ int lo_s[kRows], hi_s[kRows];   // each row's first and last visible position
  __shared__ uint32_t starts_s[2];           // bit r: row r begins a run (a new sequence)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int rows = min(kRows, a.T - t0);
  const int h = blockIdx.y, kvh = h / (a.nq / a.nkv);

  // Row metadata and the run starts (a run: consecutive rows of one sequence).
  if (tid < kRows) {
    int lo = INT_MAX, hi = -1;
    bool start = false;
    if (tid < rows) {
      const int t = t0 + tid, pos = a.positions[t];
      hi = a.last ? a.last[t] : pos;  // bidirectional image attention: past pos, to the image's end
      lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
      start = tid == 0 || a.token_seq[t] != a.token_seq[t - 1];
    }
    lo_s[tid] = lo;
    hi_s[tid] = hi;
    const uint32_t bits = __ballot_sync(0xffffffffu, start);
    if (lane == 0) starts_s[warp] = bits;
  }
  // q rows of this head -> E (rows past the step: zeros).
  {
    const float* qg = a.q + (size_t(t0) * a.nq + h) * HD;
    const size_t q_stride = size_t(a.nq) * HD;
    for (int c = tid; c < kRows * (HD / 4); c += kThreads) {
      const int r = c / (HD / 4), d = (c % (HD / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < rows) v = *reinterpret_cast<const float4*>(qg + r * q_stride + d);
      uint2 packed;
      packed.x = pack2<E>(v.x, v.y);
      packed.y = pack2<E>(v.z, v.w);
      *reinterpret_cast<uint2*>(q_s + r * LD + d) = packed;
    }
  }
  __syncthreads();

  // This thread's accumulator rows: g and g + 8 of the warp's 16 (mma C-fragment layout).
  const int g = lane >> 2, tig = lane & 3;
  const int row0 = warp * 16 + g;
  float o[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; j++)
#pragma unroll
    for (int r = 0; r < 4; r++) o[j][r] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 domain)
  float l[2] = {0.f, 0.f};              // running sum over this thread's columns (quad-reduced at the end)

  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);
  const size_t kv_row_stride = size_t(a.nkv) * HD, head_off = size_t(kvh) * HD;
  const int bs = a.block_size;
  const int table_stride = *a.table_stride;

  uint64_t runs = (uint64_t(starts_s[1]) << 32) | starts_s[0];
  while (runs) {
    const int rb = __ffsll(static_cast<long long>(runs)) - 1;
    runs &= runs - 1;
    const int re = runs ? __ffsll(static_cast<long long>(runs)) - 1 : rows;

    // The run's KV range (every warp computes it; lanes take rows lane and lane + 32).
    int kv_lo = INT_MAX, kv_hi = -1;
#pragma unroll
    for (int r = lane; r < kRows; r += 32)
      if (r >= rb && r < re) {
        kv_lo = min(kv_lo, lo_s[r]);
        kv_hi = max(kv_hi, hi_s[r]);
      }
    kv_lo = warp_min_i(kv_lo);
    kv_hi = warp_max_i(kv_hi) + 1;

    // This thread's rows in the run (others: an empty range), and the warp's bounds: the
    // tiles it can see, and those where none of its rows needs a mask.
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int r = row0 + 8 * i;
      const bool in = r >= rb && r < re;
      lo[i] = in ? lo_s[r] : INT_MAX;
      hi[i] = in ? hi_s[r] : -1;
    }
    const int w_lo = warp_min_i(min(lo[0], lo[1])), w_hi = warp_max_i(max(hi[0], hi[1]));
    const int w_lo_max = warp_max_i(max(lo[0], lo[1])), w_hi_min = warp_min_i(min(hi[0], hi[1]));

    const int32_t* table = a.block_tables + size_t(a.token_seq[t0 + rb]) * table_stride;
    // K and V rows k0 .. k0 + BK - 1 into stage `st` (past kv_hi: zeros, nothing read): of E, or
    // of codes with an fp8 cache (16 codes a copy).
    auto load_tile = [&](int st, int k0) {
      if constexpr (kFp8) {
        constexpr int kCh = HD / 16;
        uint8_t* ks = k8_s + st * C::kCodeTileBytes;
        uint8_t* vs = v8_s + st * C::kCodeTileBytes;
#pragma unroll
        for (int i = 0; i < BK * kCh / kThreads; i++) {
          const int c = tid + i * kThreads, r = c / kCh, ch = (c % kCh) * 16;
          const int p = k0 + r;
          const bool ok = p < kv_hi;
          size_t off = 0;
          if (ok) off = (size_t(table[p / bs]) * bs + p % bs) * kv_row_stride + head_off + ch;
          copy16_async(smem_addr(ks + r * HD + ch), kc + off, ok);
          copy16_async(smem_addr(vs + r * HD + ch), vc + off, ok);
        }
      } else {
        uint16_t* ks = k_s + st * C::kTileElems;
        uint16_t* vs = v_s + st * C::kTileElems;
#pragma unroll
        for (int i = 0; i < BK * kNT / kThreads; i++) {
          const int c = tid + i * kThreads, r = c / kNT, ch = (c % kNT) * 8;
          const int p = k0 + r;
          const bool ok = p < kv_hi;
          size_t off = 0;
          if (ok) off = (size_t(table[p / bs]) * bs + p % bs) * kv_row_stride + head_off + ch;
          copy16_async(smem_addr(ks + r * LD + ch), kc + off, ok);
          copy16_async(smem_addr(vs + r * LD + ch), vc + off, ok);
        }
      }
    };
    // fp8: the codes of stage `st` -> the E stage the MMAs read, 8 codes (16 bytes of E) a step.
    auto convert_tile = [&](int st) {
      const uint8_t* ks8 = k8_s + st * C::kCodeTileBytes;
      const uint8_t* vs8 = v8_s + st * C::kCodeTileBytes;
#pragma unroll
      for (int i = 0; i < BK * kNT / kThreads; i++) {
        const int c = tid + i * kThreads, r = c / kNT, ch = (c % kNT) * 8;
        *reinterpret_cast<uint4*>(k_s + r * LD + ch) = e4m3x8_to_e8<E>(*reinterpret_cast<const uint2*>(ks8 + r * HD + ch));
        *reinterpret_cast<uint4*>(v_s + r * LD + ch) = e4m3x8_to_e8<E>(*reinterpret_cast<const uint2*>(vs8 + r * HD + ch));
      }
    };

    const int n_tiles = (kv_hi - kv_lo + BK - 1) / BK;
    __syncthreads();  // every warp is done with the stages of the previous run
    load_tile(0, kv_lo);
    async_commit();
    for (int it = 0; it < n_tiles; it++) {
      const int k0 = kv_lo + it * BK;
      async_wait_all();
      __syncthreads();  // tile `it` is visible; every warp has left tile it - 1 (the other stage)
      if (it + 1 < n_tiles) load_tile((it + 1) & 1, k0 + BK);
      async_commit();
      if constexpr (kFp8) {
        // The E stage is free (every warp has left tile it - 1); the codes of stage it & 1 are
        // not refilled before the next iteration's barrier.
        convert_tile(it & 1);
        __syncthreads();  // the converted tile is visible
      }
      if (k0 > w_hi || k0 + BK - 1 < w_lo) continue;  // no row of this warp sees this tile

      const uint16_t* ks = k_s + (kFp8 ? 0 : (it & 1) * C::kTileElems);
      const uint16_t* vs = v_s + (kFp8 ? 0 : (it & 1) * C::kTileElems);

      // S = Q K^T: 16 rows x BK positions per warp.
      float s[BK / 8][4];
#pragma unroll
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) s[j][r] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t qa[4];
        ldsm_x4(qa, smem_addr(q_s + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int j = 0; j < BK / 8; j += 2) {
          uint32_t b[4];
          ldsm_x4(b, smem_addr(ks + (j * 8 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8));
          mma_16816<E>(s[j], qa, b[0], b[1]);
          mma_16816<E>(s[j + 1], qa, b[2], b[3]);
        }
      }

      // Scale, mask, online softmax. Element (j, r): row g + 8 (r >> 1), position k0 + 8j + 2 tig + (r & 1).
      const bool need_mask = !(k0 >= w_lo_max && k0 + BK - 1 <= w_hi_min);
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          float v = s[j][r] * scale_log2;
          if (need_mask) {
            const int p = k0 + j * 8 + tig * 2 + (r & 1), i = r >> 1;
            if (p < lo[i] || p > hi[i]) v = -INFINITY;
          }
          s[j][r] = v;
          tmax[r >> 1] = fmaxf(tmax[r >> 1], v);
        }
      float ref[2];
#pragma unroll
      for (int i = 0; i < 2; i++) {
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 1));
        tmax[i] = fmaxf(tmax[i], __shfl_xor_sync(0xffffffffu, tmax[i], 2));
        const float m_new = fmaxf(m[i], tmax[i]);
        ref[i] = m_new == -INFINITY ? 0.f : m_new;  // a row that has seen nothing yet stays at zero
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
      for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          const float p = exp2f(s[j][r] - ref[r >> 1]);
          s[j][r] = p;
          l[r >> 1] += p;
        }

      // O += P V: P (rounded to E) straight from the S registers as the A operand.
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t pa[4];
        pa[0] = pack2<E>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack2<E>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int j = 0; j < kNT; j += 2) {
          uint32_t b[4];
          ldsm_x4_t(b, smem_addr(vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + j * 8 + (lane >> 4) * 8));
          mma_16816<E>(o[j], pa, b[0], b[1]);
          mma_16816<E>(o[j + 1], pa, b[2], b[3]);
        }
      }
    }
    async_wait_all();  // the empty group committed by the last iteration
  }

  // Finish: O / (l [+ exp(sink - m)]), rounded to E.
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float sum = l[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    float f = 1.f;
    if (a.sinks && m[i] != -INFINITY) {
      const float sink = a.sinks[h] * kLog2e;  // sink logits are not multiplied by the scale
      const float mm = fmaxf(m[i], sink);
      f = exp2f(m[i] - mm);
      sum = sum * f + exp2f(sink - mm);
    }
    inv[i] = sum > 0.f ? f / sum : 0.f;
    if constexpr (kFp8) inv[i] *= a.v_scale;  // O summed codes
  }
  E* out = static_cast<E*>(a.out);
  const size_t col0 = size_t(h) * HD;
  if (vec_out) {
    // Stage the warp's 16 rows in its own q rows (no other warp reads them), then 16-byte stores.
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int i = 0; i < 2; i++)
        *reinterpret_cast<uint32_t*>(q_s + (row0 + 8 * i) * LD + j * 8 + tig * 2) =
            pack2<E>(o[j][2 * i] * inv[i], o[j][2 * i + 1] * inv[i]);
    __syncwarp();
    for (int c = lane; c < 16 * kNT; c += 32) {
      const int r = warp * 16 + c / kNT, ch = (c % kNT) * 8;
      if (r < rows)
        *reinterpret_cast<uint4*>(out + size_t(t0 + r) * a.ld_out + col0 + ch) =
            *reinterpret_cast<const uint4*>(q_s + r * LD + ch);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int r = row0 + 8 * i;
      if (r >= rows) continue;
      E* dst = out + size_t(t0 + r) * a.ld_out + col0;
#pragma unroll
      for (int j = 0; j < kNT; j++) {
        dst[j * 8 + tig * 2] = from_float<E>(o[j][2 * i] * inv[i]);
        dst[j * 8 + tig * 2 + 1] = from_float<E>(o[j][2 * i + 1] * inv[i]);
      }
    }
  }
}

template <typename E, bool kFp8, int HD>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  using C = FlashConfig<HD, kFp8>;
  auto kernel = flash_prefill_kernel<E, kFp8, HD>;
  static bool attr_set = false;  // once per instantiation (per process, device 0), as the GEMM
  if (!attr_set) {
    SLUICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
    attr_set = true;
  }
  const bool vec_out = a.ld_out % 8 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  const dim3 grid((a.T + kRows - 1) / kRows, a.nq);
  const float scale = kFp8 ? a.scale * a.k_scale : a.scale;  // q . (code * k_scale) * scale
  kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(a, scale * kLog2e, vec_out ? 1 : 0);
  SLUICE_CUDA_LAUNCH_CHECK("flash_prefill_kernel");
}

template <typename E, bool kFp8>
void launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.hd) {
    case 64: return launch<E, kFp8, 64>(a, stream);
    case 128: return launch<E, kFp8, 128>(a, stream);
    default: return launch<E, kFp8, 256>(a, stream);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool flash_prefill_supported(int hd, int nq, int nkv) {
  return (hd == 64 || hd == 128 || hd == 256) && nq > 0 && nkv > 0 && nq % nkv == 0;
}

void flash_prefill_attention(const AttentionArgs& a, DType e, cudaStream_t stream) {
  if (a.T <= 0) return;
  if (e != DType::BF16 && e != DType::F16)
    throw Error(ErrorCode::kInternal, "flash attention: element type must be bf16 or f16");
  if (!flash_prefill_supported(a.hd, a.nq, a.nkv) || !aligned16(a.q) || !aligned16(a.k_cache) ||
      !aligned16(a.v_cache)) {
    AttentionArgs single = a;
    single.num_splits = 1;
    return paged_attention(single, e, stream);
  }
  if (e == DType::BF16) {
    if (a.kv_fp8) launch_typed<__nv_bfloat16, true>(a, stream);
    else launch_typed<__nv_bfloat16, false>(a, stream);
  } else {
    if (a.kv_fp8) launch_typed<__half, true>(a, stream);
    else launch_typed<__half, false>(a, stream);
  }
}

}  // namespace sluice::cuda
