// Tensor-core GEMM for the projections: y[T, N] = x[T, K] · W[N, K]^T with mma.sync m16n8k16
// (bf16 or f16 operands, f32 accumulators), cp.async multi-stage pipelines and ldmatrix.
//
// The MMA's M dimension runs over output features (weight rows) and its N dimension over
// tokens, so decode-sized batches waste at most 7 of 8 token columns instead of 15 of 16 rows,
// and both operands are read K-contiguous exactly as stored. Grids too small to fill the GPU
// split K; each block writes its partial tile, and the last block to finish a tile (ticket
// counter) sums the partials in split order and runs the epilogue: deterministic, one launch.
//
// The grouped variant (mixture of experts, kernels.h GroupedRows) is the same kernel with each
// grid row tile mapped to one expert's rows: its weights, its bias, and token rows gathered.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/gated_act.cuh"
#include "cuda/cublaslt.h"
#include "cuda/kernels.h"

namespace sluice::cuda {

// gemv.cu: the decode path (T <= 8) without tensor cores.
void gemv(const GemmArgs& a, DType e, int num_sms, cudaStream_t stream);

namespace {

struct GemmParams {
  const uint16_t* x;
  int ld_x;
  const uint16_t* w;
  int ld_w;
  const float* bias;
  int T, N, K;  // K rounded up to a multiple of 8 (operands are zero padded)
  Epilogue epilogue;
  float* y;
  int ld_y;
  uint16_t* h;
  int ld_h;
  GateAct act;
  float act_limit;
  GroupedRows grouped;  // the grouped kernel's (GROUPED = true)
  int splits;         // gridDim.z
  int k_per_split;    // multiple of BK
  float* partials;    // [splits, T, N]
  int* tickets;       // [tiles]
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 zero-fills the 16 bytes without reading the source.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

template <typename E>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One output element after all K: bias, then the epilogue. For kGatedMul the caller passes the
// gate value (row g of a 16-row group) and `up` (row g + 8); `i` is the intermediate feature.
__device__ __forceinline__ void store_out(const GemmParams& p, const float* bias, int t, int n, float v) {
  if (bias) v += bias[n];
  if (p.epilogue == Epilogue::kStore) p.y[size_t(t) * p.ld_y + n] = v;
  else p.y[size_t(t) * p.ld_y + n] += v;
}

template <typename E>
__device__ __forceinline__ void store_gated(const GemmParams& p, const float* bias, int t, int n_gate, float gate,
                                            float up) {
  if (bias) {
    gate += bias[n_gate];
    up += bias[n_gate + 8];
  }
  const int i = (n_gate >> 4) * 8 + (n_gate & 7);
  reinterpret_cast<E*>(p.h)[size_t(t) * p.ld_h + i] = from_float<E>(gated_value(gate, up, p.act, p.act_limit));
}

// Block tile: BM features x BN tokens x BK, warps WM x WN each, STAGES-deep cp.async pipeline.
template <typename E, int BM, int BN, int BK, int WM, int WN, int STAGES>
struct GemmConfig {
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kMI = WM / 16, kNI = WN / 8;
  static constexpr int kLd = BK + 8;  // smem row stride (elements): 16-byte pad, ldmatrix conflict-free
  static constexpr int kStageElems = (BM + BN) * kLd;
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageElems * sizeof(uint16_t);
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0 && BK % 16 == 0, "tile shape");
};

template <typename E, int BM, int BN, int BK, int WM, int WN, int STAGES, bool GROUPED>
__global__ void __launch_bounds__(GemmConfig<E, BM, BN, BK, WM, WN, STAGES>::kThreads)
    gemm_kernel(GemmParams p) {
  using C = GemmConfig<E, BM, BN, BK, WM, WN, STAGES>;
  extern __shared__ __align__(16) uint16_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % C::kWarpsM, warp_n = warp / C::kWarpsM;
  const int m0 = blockIdx.x * BM;
  // Token rows n0 .. row_end - 1 of this tile, the weights and bias they multiply.
  int n0 = blockIdx.y * BN, row_end = p.T;
  const uint16_t* wmat = p.w;
  const float* bias = p.bias;
  if constexpr (GROUPED) {
    // Every split of a tile past the step's tiles leaves here, before any barrier or ticket.
    if (int(blockIdx.y) >= *p.grouped.num_tiles) return;
    const int e = p.grouped.tile_expert[blockIdx.y];
    n0 = p.grouped.tile_row0[blockIdx.y];
    row_end = min(p.grouped.expert_offsets[e + 1], n0 + BN);
    wmat += size_t(e) * p.grouped.w_stride;
    if (bias) bias += size_t(e) * p.grouped.bias_stride;
  }
  const int k_begin = blockIdx.z * p.k_per_split;
  const int k_end = min(p.K, k_begin + p.k_per_split);
  const int num_k_tiles = (k_end - k_begin + BK - 1) / BK;

  auto stage_a = [&](int s) { return smem + s * C::kStageElems; };
  auto stage_b = [&](int s) { return smem + s * C::kStageElems + BM * C::kLd; };

  // Loads k-tile `kt` into stage `s`: A = W rows m0.., B = x rows (tokens) n0..
  auto load_tile = [&](int s, int kt) {
    const int k0 = k_begin + kt * BK;
    constexpr int kChunksPerRow = BK / 8;
    for (int c = tid; c < BM * kChunksPerRow; c += C::kThreads) {
      const int row = c / kChunksPerRow, k = k0 + (c % kChunksPerRow) * 8;
      const int n = m0 + row;
      const bool ok = n < p.N && k < k_end;
      const uint16_t* src = ok ? wmat + size_t(n) * p.ld_w + k : wmat;
      cp_async16(smem_u32(stage_a(s) + row * C::kLd + (c % kChunksPerRow) * 8), src, ok);
    }
    for (int c = tid; c < BN * kChunksPerRow; c += C::kThreads) {
      const int row = c / kChunksPerRow, k = k0 + (c % kChunksPerRow) * 8;
      const int t = n0 + row;
      const bool ok = t < row_end && k < k_end;
      int x_row = t;
      if constexpr (GROUPED) {
        if (ok && p.grouped.gather) x_row = p.grouped.gather[t];
      }
      const uint16_t* src = ok ? p.x + size_t(x_row) * p.ld_x + k : p.x;
      cp_async16(smem_u32(stage_b(s) + row * C::kLd + (c % kChunksPerRow) * 8), src, ok);
    }
  };

  float acc[C::kMI][C::kNI][4];
#pragma unroll
  for (int i = 0; i < C::kMI; i++)
#pragma unroll
    for (int j = 0; j < C::kNI; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < num_k_tiles) load_tile(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < num_k_tiles; kt++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; every warp is done with tile kt - 1
    {
      const int next = kt + STAGES - 1;
      if (next < num_k_tiles) load_tile(next % STAGES, next);
      cp_async_commit();
    }
    const uint16_t* As = stage_a(kt % STAGES);
    const uint16_t* Bs = stage_b(kt % STAGES);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[C::kMI][4];
#pragma unroll
      for (int i = 0; i < C::kMI; i++) {
        const int row = warp_m * WM + i * 16 + (lane & 15);
        ldmatrix_x4(a[i], smem_u32(As + row * C::kLd + kk + (lane >> 4) * 8));
      }
      uint32_t b[C::kNI][2];
#pragma unroll
      for (int j = 0; j + 1 < C::kNI; j += 2) {
        uint32_t r[4];
        const int row = warp_n * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(r, smem_u32(Bs + row * C::kLd + kk + ((lane >> 3) & 1) * 8));
        b[j][0] = r[0];
        b[j][1] = r[1];
        b[j + 1][0] = r[2];
        b[j + 1][1] = r[3];
      }
      if constexpr (C::kNI % 2 == 1) {
        constexpr int j = C::kNI - 1;
        uint32_t r[2];
        const int row = warp_n * WN + j * 8 + (lane & 7);
        ldmatrix_x2(r, smem_u32(Bs + row * C::kLd + kk + ((lane >> 3) & 1) * 8));
        b[j][0] = r[0];
        b[j][1] = r[1];
      }
#pragma unroll
      for (int i = 0; i < C::kMI; i++)
#pragma unroll
        for (int j = 0; j < C::kNI; j++) mma16816<E>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  cp_async_wait<0>();

  // Accumulator element r of (i, j): feature row g (+8 for r >= 2), token column 2*tig (+1 for odd r).
  const int g = lane >> 2, tig = lane & 3;
  const int fm = m0 + warp_m * WM + g, tn = n0 + warp_n * WN + tig * 2;

  // Calls f(i, j, r, feature n, token t) for every accumulator element acc[i][j][r] of this thread.
  auto for_each_acc = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < C::kMI; i++)
#pragma unroll
      for (int j = 0; j < C::kNI; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) f(i, j, r, fm + i * 16 + (r >= 2 ? 8 : 0), tn + j * 8 + (r & 1));
  };

  if (p.splits > 1) {
    // Publish this split's partial tile, then let the last block of the tile finish it.
    float* part = p.partials + size_t(blockIdx.z) * p.T * p.N;
    for_each_acc([&](int i, int j, int r, int n, int t) {
      if (n < p.N && t < row_end) part[size_t(t) * p.N + n] = acc[i][j][r];
    });
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) is_last = atomicAdd(&p.tickets[tile], 1) == p.splits - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    // Sum the splits in order 0..S-1 (this block's own from a register copy: the same bits it
    // wrote), so the result does not depend on which block finished last. Splits outer,
    // elements inner: each thread has kMI * kNI * 4 independent loads in flight per split.
    float own[C::kMI][C::kNI][4];
    for_each_acc([&](int i, int j, int r, int, int) {
      own[i][j][r] = acc[i][j][r];
      acc[i][j][r] = 0.f;
    });
    for (int s = 0; s < p.splits; s++) {
      const float* src = p.partials + size_t(s) * p.T * p.N;
      const bool mine = s == int(blockIdx.z);
      for_each_acc([&](int i, int j, int r, int n, int t) {
        acc[i][j][r] += mine ? own[i][j][r] : n < p.N && t < row_end ? __ldcg(src + size_t(t) * p.N + n) : 0.f;
      });
    }
    if (tid == 0) p.tickets[tile] = 0;  // ready for the next launch (and graph replay)
  }

#pragma unroll
  for (int i = 0; i < C::kMI; i++)
#pragma unroll
    for (int j = 0; j < C::kNI; j++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int n = fm + i * 16, t = tn + j * 8 + r;
        if (t >= row_end) continue;
        if (p.epilogue == Epilogue::kGatedMul) {
          if (n < p.N) store_gated<E>(p, bias, t, n, acc[i][j][r], acc[i][j][r + 2]);
        } else {
          if (n < p.N) store_out(p, bias, t, n, acc[i][j][r]);
          if (n + 8 < p.N) store_out(p, bias, t, n + 8, acc[i][j][r + 2]);
        }
      }
}

template <typename E, int BM, int BN, int BK, int WM, int WN, int STAGES, bool GROUPED = false>
void launch(const GemmArgs& a, const GemmWorkspace& ws, cudaStream_t stream) {
  using C = GemmConfig<E, BM, BN, BK, WM, WN, STAGES>;
  auto kernel = gemm_kernel<E, BM, BN, BK, WM, WN, STAGES, GROUPED>;
  static bool attr_set = false;  // NOTE: set once per instantiation (per process, device 0)
  if (!attr_set) {
    SLUICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
    attr_set = true;
  }
  GemmParams p{};
  p.x = static_cast<const uint16_t*>(a.x);
  p.ld_x = a.ld_x;
  p.w = static_cast<const uint16_t*>(a.w);
  p.ld_w = a.ld_w;
  p.bias = a.bias;
  p.T = a.T;
  p.N = a.N;
  p.K = (a.K + 7) / 8 * 8;
  p.epilogue = a.epilogue;
  p.y = a.y;
  p.ld_y = a.ld_y;
  p.h = static_cast<uint16_t*>(a.h);
  p.ld_h = a.ld_h;
  p.act = a.act;
  p.act_limit = a.act_limit;
  if constexpr (GROUPED) p.grouped = *a.grouped;
  // Grouped: one grid row per possible tile of the step (those past *num_tiles exit at once).
  const int tiles_m = (a.N + BM - 1) / BM, tiles_n = GROUPED ? a.grouped->max_tiles : (a.T + BN - 1) / BN;
  const int tiles = tiles_m * tiles_n;
  // The split decision counts the tiles that can have rows: a grouped step of R routes fills at
  // most ceil(R / BN) full tiles plus one partial tile per expert it reaches (at most R of them).
  int busy_n = tiles_n;
  if constexpr (GROUPED) {
    const int full = (a.T + BN - 1) / BN;
    busy_n = std::min(tiles_n, full + std::min(a.T, tiles_n - full));
  }
  const int busy = tiles_m * busy_n;
  const int k_tiles = (p.K + BK - 1) / BK;
  // Split K while the grid is under one wave, keeping >= 4 k-tiles per split and the partials
  // within the workspace.
  int splits = 1;
  if (a.splits > 0) {
    splits = std::min(a.splits, k_tiles);
    while (splits > 1 && size_t(splits) * a.T * a.N > ws.partial_floats) splits--;
  } else if (busy < ws.num_sms && tiles <= ws.num_tickets) {
    splits = std::min({(ws.num_sms + busy - 1) / busy, k_tiles / 4, 16});
    const size_t per_split = size_t(a.T) * a.N;
    while (splits > 1 && size_t(splits) * per_split > ws.partial_floats) splits--;
    splits = std::max(splits, 1);
  }
  if (tiles > ws.num_tickets) splits = 1;
  const int k_tiles_per_split = (k_tiles + splits - 1) / splits;
  splits = (k_tiles + k_tiles_per_split - 1) / k_tiles_per_split;  // no empty splits
  p.splits = splits;
  p.k_per_split = k_tiles_per_split * BK;
  p.partials = ws.partials;
  p.tickets = ws.tickets;
  dim3 grid(tiles_m, tiles_n, splits);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  SLUICE_CUDA_LAUNCH_CHECK("gemm_kernel");
}

// The grouped GEMM's tile shapes follow the rows per tile that moe_plan laid out.
template <typename E>
void grouped_typed(const GemmArgs& a, const GemmWorkspace& ws, cudaStream_t stream) {
  switch (a.grouped->tile_rows) {
    case 8: return launch<E, 128, 8, 64, 32, 8, 4, true>(a, ws, stream);
    case 32: return launch<E, 128, 32, 64, 64, 16, 4, true>(a, ws, stream);
    case 128: return launch<E, 128, 128, 32, 64, 32, 4, true>(a, ws, stream);
    default: throw Error(ErrorCode::kInternal, "grouped gemm: tile_rows must be 8, 32 or 128");
  }
}

template <typename E>
void gemm_typed(const GemmArgs& a, const GemmWorkspace& ws, cudaStream_t stream) {
  if (a.T <= 8) launch<E, 128, 8, 64, 32, 8, 4>(a, ws, stream);          // decode: 4 warps of 32 features
  else if (a.T <= 32) launch<E, 128, 32, 64, 64, 16, 4>(a, ws, stream);  // small batches
  else launch<E, 128, 128, 32, 64, 32, 4>(a, ws, stream);                // prefill and large batches
}

}  // namespace

int grouped_tile_rows(int routes, int experts) {
  const int per_expert = (routes + experts - 1) / std::max(experts, 1);
  return per_expert <= 8 ? 8 : per_expert <= 32 ? 32 : 128;
}

void gemm(const GemmArgs& a, DType e, const GemmWorkspace& ws, cudaStream_t stream) {
  if (a.T <= 0 || a.N <= 0) return;
  if (a.ld_x % 8 || a.ld_w % 8 || a.ld_x < a.K || a.ld_w < a.K)
    throw Error(ErrorCode::kInternal, "gemm: operand strides must be multiples of 8 covering K");
  if (a.epilogue == Epilogue::kGatedMul && a.N % 16)
    throw Error(ErrorCode::kInternal, "gemm: the gated epilogue needs N % 16 == 0");
  if (a.grouped) {
    if (a.grouped->max_tiles <= 0) return;
    if (e == DType::BF16) return grouped_typed<__nv_bfloat16>(a, ws, stream);
    if (e == DType::F16) return grouped_typed<__half>(a, ws, stream);
    throw Error(ErrorCode::kInternal, "gemm: element type must be bf16 or f16");
  }
  if (a.T <= 8 && a.splits == 0) return gemv(a, e, ws.num_sms, stream);
  if (ws.lt && a.splits == 0 &&
      ws.lt->gemm(a, e, ws.lt_workspace, ws.lt_workspace_bytes, ws.lt_scratch, ws.lt_scratch_floats, stream))
    return;
  if (e == DType::BF16) gemm_typed<__nv_bfloat16>(a, ws, stream);
  else if (e == DType::F16) gemm_typed<__half>(a, ws, stream);
  else throw Error(ErrorCode::kInternal, "gemm: element type must be bf16 or f16");
}

}  // namespace sluice::cuda
