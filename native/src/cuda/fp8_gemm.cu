// FP8 (e4m3) GEMM and the activations' dynamic quantization (fp8_gemm.h has the contract).
//
// As in gemm.cu, the MMA's M dimension runs over output features (weight rows) and its N
// dimension over tokens, so both operands are read K-contiguous exactly as stored: W [N, K] is
// the row-major A operand and x [T, K] the column-major B operand of
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32.
//
// Tiles: BM features x BN tokens x 128 columns of K per stage, STAGES-deep cp.async pipeline
// (16-byte copies; shared rows padded to 144 bytes so that ldmatrix is conflict-free). Each stage
// also holds the 128-column block's scales of its BM weight rows and BN tokens (4-byte cp.async)
// when the scales vary along K.
//
// Fragments (PTX ISA, mma.m16n8k32 with 8-bit types; g = lane / 4, q = lane % 4; each .b32
// register holds four consecutive k values, the lowest k in the lowest byte):
//   A (16 x 32, features x k): a[0] row g,     k 4q .. 4q+3      a[1] row g + 8, k 4q .. 4q+3
//                              a[2] row g,     k 16+4q .. 16+4q+3 a[3] row g + 8, k 16+4q ..
//   B (32 x 8, k x tokens):    b[0] token g,   k 4q .. 4q+3      b[1] token g,   k 16+4q ..
//   C (16 x 8, f32):           c[0], c[1] row g, tokens 2q, 2q+1; c[2], c[3] row g + 8, same tokens.
// An 8x8 b16 ldmatrix tile is 8 rows of 16 bytes, and gives lane l row l / 4, bytes 4 (l % 4) ..
// 4 (l % 4) + 3: exactly an 8-row, 16-k quarter of A or half of B. So the addressing is gemm.cu's
// with byte columns: ldmatrix.x4 over (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7,
// k 16-31), (rows 8-15, k 16-31) yields a[0..3], and over (tokens j, k 0-15), (tokens j, k 16-31),
// (tokens j+1, k 0-15), (tokens j+1, k 16-31) yields b[0..1] of token groups j and j + 1.
// A and B take their k from the same byte positions, so the products pair up the same way
// whichever k labelling the hardware uses inside a register pair (some projects document 8q ..).
//
// Accumulation: the e4m3 MMA's accumulator is narrower than f32 on sm_89 / sm_90 (reported as
// 13 mantissa bits), so each 128-column block is accumulated alone (its first MMA starts from
// zero, at most 4 chained MMAs) and then promoted into f32 registers: acc += partial, or with
// scales varying along K, acc = fma(partial, w_scale(n, b) * x_scale(t, b), acc); per-tensor and
// per-channel scales multiply once at the end. Every output sums its blocks in K order, alone:
// the bits do not depend on T, the tile shape or the batch's other tokens.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/fp8_gemm.h"
#include "cuda/mma_primitives.cuh"

namespace sluice::cuda {

namespace {

constexpr float kE4m3Max = 448.f;
constexpr int kKAlign = 32;  // the MMA's K: the GEMM reads K rounded up to this

// ---- activation quantization ---------------------------------------------------------------

// Codes of v[0..3] / scale, v[0] in the low byte; zero codes when scale is 0 (an all-zero group).
__device__ __forceinline__ uint32_t e4m3x4(const float* v, float scale) {
  if (scale == 0.f) return 0u;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v[0], scale), __fdiv_rn(v[1], scale)),
                                               __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v[2], scale), __fdiv_rn(v[3], scale)),
                                               __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

// NUM elements of `row` from column c as floats, zeros at and past K (one vector load when whole).
template <typename E, int NUM>
__device__ __forceinline__ void load_elems(const E* row, int c, int K, float (&v)[NUM]) {
  struct alignas(sizeof(E) * NUM) Vec {
    E e[NUM];
  };
  if (c + NUM <= K) {
    const Vec vec = *reinterpret_cast<const Vec*>(row + c);
#pragma unroll
    for (int i = 0; i < NUM; i++) v[i] = to_float(vec.e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < NUM; i++) v[i] = c + i < K ? to_float(row[c + i]) : 0.f;
  }
}

constexpr int kQuantThreads = 256;

// One block per token: the row's amax, then its codes (8 columns per thread per pass).
template <typename E>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_rows_kernel(const E* x, int K, int Kp, int ld_x, uint8_t* xq, int ld_q, float* x_scale) {
  __shared__ float warp_amax[kQuantThreads / 32];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const E* row = x + size_t(t) * ld_x;
  float amax = 0.f;
  for (int c = threadIdx.x * 8; c < K; c += kQuantThreads * 8) {
    float v[8];
    load_elems<E, 8>(row, c, K, v);
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; w++) amax = fmaxf(amax, warp_amax[w]);
  const float scale = __fdiv_rn(amax, kE4m3Max);
  if (threadIdx.x == 0) x_scale[t] = scale;
  uint8_t* q = xq + size_t(t) * ld_q;
  for (int c = threadIdx.x * 8; c < Kp; c += kQuantThreads * 8) {  // Kp % 8 == 0: whole 8-byte stores
    float v[8];
    load_elems<E, 8>(row, c, K, v);
    *reinterpret_cast<uint2*>(q + c) = make_uint2(e4m3x4(v, scale), e4m3x4(v + 4, scale));
  }
}

// One warp per (token, 128-column block): 4 columns per lane.
template <typename E>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_blocks_kernel(const E* x, int T, int K, int Kp, int ld_x, uint8_t* xq, int ld_q, float* x_scale,
                           int ld_scale, int blocks_per_row) {
  const int group = blockIdx.x * (kQuantThreads / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (group >= T * blocks_per_row) return;  // the whole warp
  const int t = group / blocks_per_row, b = group % blocks_per_row;
  const int c = b * kFp8BlockCols + lane * 4;
  float v[4];
  load_elems<E, 4>(x + size_t(t) * ld_x, c, K, v);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warp_max(amax);
  const float scale = __fdiv_rn(amax, kE4m3Max);
  if (lane == 0) x_scale[size_t(t) * ld_scale + b] = scale;
  if (c < Kp) *reinterpret_cast<uint32_t*>(xq + size_t(t) * ld_q + c) = e4m3x4(v, scale);  // Kp % 32 == 0
}

// ---- GEMM -----------------------------------------------------------------------------------

struct Fp8Params {
  const uint8_t* x;
  int ld_x;
  const float* x_scale;
  int ld_x_scale;  // 0: one scale per token
  const uint8_t* w;
  int ld_w;
  const float* w_scale;
  Fp8Scales w_scales;
  int w_block_rows;
  int scale_cols;  // ceil(K / 128): the row stride of block-scaled weights' scales
  const float* bias;
  int T, N, Kp;  // Kp: K rounded up to 32
  void* y;
  int ld_y;
  DType y_type;
  bool accumulate;
};

// The scale of weight row n in 128-column block b, and of token t.
__device__ __forceinline__ const float* w_scale_ptr(const Fp8Params& p, int n, int b) {
  switch (p.w_scales) {
    case Fp8Scales::Channel: return p.w_scale + n;
    case Fp8Scales::Block: return p.w_scale + size_t(n / p.w_block_rows) * p.scale_cols + b;
    default: return p.w_scale;
  }
}
__device__ __forceinline__ const float* x_scale_ptr(const Fp8Params& p, int t, int b) {
  return p.ld_x_scale ? p.x_scale + size_t(t) * p.ld_x_scale + b : p.x_scale + t;
}

// 4 bytes global -> shared through L1; `valid` false writes zeros without reading `src`.
__device__ __forceinline__ void copy4_async(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// c (16x8 f32) = a (16x32 e4m3) · b (32x8 e4m3) (+ c when ACCUMULATE; else from zero).
template <bool ACCUMULATE>
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float c0 = ACCUMULATE ? c[0] : 0.f, c1 = ACCUMULATE ? c[1] : 0.f;
  const float c2 = ACCUMULATE ? c[2] : 0.f, c3 = ACCUMULATE ? c[3] : 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
#else
  __trap();  // the launcher runs the kernel on sm_89+ only
#endif
}

// Block tile: BM features x BN tokens x kBK columns, warps WM x WN each, STAGES-deep pipeline.
template <int BM, int BN, int WM, int WN, int STAGES>
struct Fp8Config {
  static constexpr int kBK = kFp8BlockCols;  // bytes = columns; one scale block per k-tile
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kMI = WM / 16, kNI = WN / 8;
  static constexpr int kLd = kBK + 16;  // shared row stride in bytes: 16-byte pad, ldmatrix conflict-free
  // One stage: A [BM][kLd], B [BN][kLd] codes, then the block's scales w [BM] and x [BN] (f32).
  static constexpr int kStageBytes = (BM + BN) * kLd + (BM + BN) * 4;
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageBytes;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0, "tile shape");
  static_assert((BM + BN) * kLd % 16 == 0 && kStageBytes % 16 == 0, "16-byte aligned stages");
};

// PER_TILE: the scales vary along K (block-scaled weights or activations) and each block's
// partial is scaled as it is promoted; else the partials add up and one product scales the sum.
// NOTE: the minimum of 1 block per SM lets ptxas use up to 255 registers (the 128 x 32 tiles
// spilled under its default cap of 128); the 128 x 128 tiles take about 240.
template <int BM, int BN, int WM, int WN, int STAGES, bool PER_TILE>
__global__ void __launch_bounds__(Fp8Config<BM, BN, WM, WN, STAGES>::kThreads, 1) fp8_gemm_kernel(Fp8Params p) {
  using C = Fp8Config<BM, BN, WM, WN, STAGES>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % C::kWarpsM, warp_n = warp / C::kWarpsM;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int num_k_tiles = (p.Kp + C::kBK - 1) / C::kBK;

  auto stage_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * C::kStageBytes + BM * C::kLd; };
  auto stage_ws = [&](int s) { return reinterpret_cast<float*>(smem + s * C::kStageBytes + (BM + BN) * C::kLd); };
  auto stage_xs = [&](int s) { return stage_ws(s) + BM; };

  // Loads k-tile `kt` into stage `s`: A = W rows m0.., B = x rows (tokens) n0.., and with
  // PER_TILE the tile's scales.
  auto load_tile = [&](int s, int kt) {
    const int k0 = kt * C::kBK;
    constexpr int kChunksPerRow = C::kBK / 16;
    for (int c = tid; c < BM * kChunksPerRow; c += C::kThreads) {
      const int row = c / kChunksPerRow, k = k0 + (c % kChunksPerRow) * 16;
      const int n = m0 + row;
      const bool ok = n < p.N && k < p.Kp;
      const uint8_t* src = ok ? p.w + size_t(n) * p.ld_w + k : p.w;
      mma::copy16_async(mma::smem_addr(stage_a(s) + row * C::kLd + (c % kChunksPerRow) * 16), src, ok);
    }
    for (int c = tid; c < BN * kChunksPerRow; c += C::kThreads) {
      const int row = c / kChunksPerRow, k = k0 + (c % kChunksPerRow) * 16;
      const int t = n0 + row;
      const bool ok = t < p.T && k < p.Kp;
      const uint8_t* src = ok ? p.x + size_t(t) * p.ld_x + k : p.x;
      mma::copy16_async(mma::smem_addr(stage_b(s) + row * C::kLd + (c % kChunksPerRow) * 16), src, ok);
    }
    if constexpr (PER_TILE) {
      for (int c = tid; c < BM + BN; c += C::kThreads) {
        if (c < BM) {
          const int n = m0 + c;
          const bool ok = n < p.N;
          copy4_async(mma::smem_addr(stage_ws(s) + c), ok ? w_scale_ptr(p, n, kt) : p.w_scale, ok);
        } else {
          const int t = n0 + c - BM;
          const bool ok = t < p.T;
          copy4_async(mma::smem_addr(stage_xs(s) + c - BM), ok ? x_scale_ptr(p, t, kt) : p.x_scale, ok);
        }
      }
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
    mma::async_commit();
  }

  const int g = lane >> 2, tig = lane & 3;
  for (int kt = 0; kt < num_k_tiles; kt++) {
    mma::async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; every warp is done with tile kt - 1
    {
      const int next = kt + STAGES - 1;
      if (next < num_k_tiles) load_tile(next % STAGES, next);
      mma::async_commit();
    }
    const int s = kt % STAGES;
    const uint8_t* As = stage_a(s);
    const uint8_t* Bs = stage_b(s);
    float part[C::kMI][C::kNI][4];
#pragma unroll
    for (int kk = 0; kk < C::kBK; kk += 32) {
      if (kk > 0 && kt * C::kBK + kk >= p.Kp) break;  // the last tile's missing 32-column steps
      uint32_t a[C::kMI][4];
#pragma unroll
      for (int i = 0; i < C::kMI; i++) {
        const int row = warp_m * WM + i * 16 + (lane & 15);
        mma::ldsm_x4(a[i], mma::smem_addr(As + row * C::kLd + kk + (lane >> 4) * 16));
      }
      uint32_t b[C::kNI][2];
#pragma unroll
      for (int j = 0; j + 1 < C::kNI; j += 2) {
        uint32_t r[4];
        const int row = warp_n * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        mma::ldsm_x4(r, mma::smem_addr(Bs + row * C::kLd + kk + ((lane >> 3) & 1) * 16));
        b[j][0] = r[0];
        b[j][1] = r[1];
        b[j + 1][0] = r[2];
        b[j + 1][1] = r[3];
      }
      if constexpr (C::kNI % 2 == 1) {
        constexpr int j = C::kNI - 1;
        uint32_t r[2];
        const int row = warp_n * WN + j * 8 + (lane & 7);
        ldsm_x2(r, mma::smem_addr(Bs + row * C::kLd + kk + ((lane >> 3) & 1) * 16));
        b[j][0] = r[0];
        b[j][1] = r[1];
      }
#pragma unroll
      for (int i = 0; i < C::kMI; i++)
#pragma unroll
        for (int j = 0; j < C::kNI; j++) {
          if (kk == 0) mma_e4m3<false>(part[i][j], a[i], b[j][0], b[j][1]);
          else mma_e4m3<true>(part[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    // Promote the block's partial sums into the f32 accumulators. Stage s stays intact until
    // every warp has passed the next iteration's barrier.
    if constexpr (PER_TILE) {
      const float* ws = stage_ws(s);
      const float* xs = stage_xs(s);
      float sx[C::kNI][2];
#pragma unroll
      for (int j = 0; j < C::kNI; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) sx[j][h] = xs[warp_n * WN + j * 8 + tig * 2 + h];
#pragma unroll
      for (int i = 0; i < C::kMI; i++) {
        const float sw0 = ws[warp_m * WM + i * 16 + g], sw1 = ws[warp_m * WM + i * 16 + g + 8];
#pragma unroll
        for (int j = 0; j < C::kNI; j++)
#pragma unroll
          for (int r = 0; r < 4; r++)
            acc[i][j][r] = fmaf(part[i][j][r], (r < 2 ? sw0 : sw1) * sx[j][r & 1], acc[i][j][r]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kMI; i++)
#pragma unroll
        for (int j = 0; j < C::kNI; j++)
#pragma unroll
          for (int r = 0; r < 4; r++) acc[i][j][r] += part[i][j][r];
    }
  }
  mma::async_wait_all();

  // Accumulator r of (i, j): feature row g (+8 for r >= 2), token 2 tig (+1 for odd r).
  const int fm = m0 + warp_m * WM + g, tn = n0 + warp_n * WN + tig * 2;
#pragma unroll
  for (int i = 0; i < C::kMI; i++)
#pragma unroll
    for (int j = 0; j < C::kNI; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int n = fm + i * 16 + (r >= 2 ? 8 : 0), t = tn + j * 8 + (r & 1);
        if (n >= p.N || t >= p.T) continue;
        float v = acc[i][j][r];
        if constexpr (!PER_TILE) v *= __ldg(w_scale_ptr(p, n, 0)) * __ldg(x_scale_ptr(p, t, 0));
        if (p.bias) v += __ldg(p.bias + n);
        const size_t at = size_t(t) * p.ld_y + n;
        if (p.y_type == DType::F32) {
          float* y = static_cast<float*>(p.y) + at;
          *y = p.accumulate ? *y + v : v;
        } else if (p.y_type == DType::BF16) {
          static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(v);
        } else {
          static_cast<__half*>(p.y)[at] = __float2half_rn(v);
        }
      }
}

// What the launchers need of the device, read once (NOTE: per process, the device current at
// the first call: the engine runs on one device).
struct Fp8Device {
  bool mma_e4m3 = false;
  size_t smem_optin = 0;
};
const Fp8Device& fp8_device() {
  static const Fp8Device d = [] {
    Fp8Device r;
    int dev = 0, major = 0, minor = 0, smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return r;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    r.mma_e4m3 = major * 10 + minor >= 89;
    r.smem_optin = size_t(smem);
    return r;
  }();
  return d;
}

// Lets the kernel use C::kSmemBytes of dynamic shared memory (set once per instantiation; NOTE:
// per process, one device).
template <int BM, int BN, int WM, int WN, int STAGES, bool PER_TILE>
void allow_smem() {
  using C = Fp8Config<BM, BN, WM, WN, STAGES>;
  static bool attr_set = false;
  if (!attr_set) {
    SLUICE_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<BM, BN, WM, WN, STAGES, PER_TILE>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
    attr_set = true;
  }
}

template <int BM, int BN, int WM, int WN, int STAGES, bool PER_TILE>
void launch(const Fp8Params& p, cudaStream_t stream) {
  using C = Fp8Config<BM, BN, WM, WN, STAGES>;
  auto kernel = fp8_gemm_kernel<BM, BN, WM, WN, STAGES, PER_TILE>;
  allow_smem<BM, BN, WM, WN, STAGES, PER_TILE>();
  const dim3 grid((p.N + BM - 1) / BM, (p.T + BN - 1) / BN);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  SLUICE_CUDA_LAUNCH_CHECK("fp8_gemm_kernel");
}

// Tile shapes by batch size. None changes an output's order of summation (blocks of 128 columns
// in K order, each promoted alone), so a token's result is the same whichever runs.
template <bool PER_TILE>
void launch_sized(const Fp8Params& p, cudaStream_t stream) {
  if (p.T <= 8) return launch<64, 8, 16, 8, 4, PER_TILE>(p, stream);      // decode: 4 warps of 16 features
  if (p.T <= 32) return launch<128, 32, 64, 16, 4, PER_TILE>(p, stream);  // small batches: 4 warps
  // Prefill: 8 warps of 64 x 32; 3 stages need 111 KiB of shared memory (sm_90: 227 KiB per
  // block; sm_89: 99 KiB, where 128 x 64 tiles run instead).
  if (fp8_device().smem_optin >= Fp8Config<128, 128, 64, 32, 3>::kSmemBytes)
    return launch<128, 128, 64, 32, 3, PER_TILE>(p, stream);
  launch<128, 64, 64, 32, 3, PER_TILE>(p, stream);
}

// Every tile shape launch_sized may pick (the sizes must match it).
template <bool PER_TILE>
void allow_smem_all() {
  allow_smem<64, 8, 16, 8, 4, PER_TILE>();
  allow_smem<128, 32, 64, 16, 4, PER_TILE>();
  if (fp8_device().smem_optin >= Fp8Config<128, 128, 64, 32, 3>::kSmemBytes)
    allow_smem<128, 128, 64, 32, 3, PER_TILE>();
  else
    allow_smem<128, 64, 64, 32, 3, PER_TILE>();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int round_up_k(int K) { return (K + kKAlign - 1) / kKAlign * kKAlign; }

void check_quantize_args(const void* x, DType e, int K, int ld_x, const uint8_t* xq, int ld_q, const char* what) {
  if (e != DType::BF16 && e != DType::F16) throw Error(ErrorCode::kInternal, std::string(what) + ": x must be bf16 or f16");
  if (K <= 0 || ld_x < K || ld_x % 8 || !aligned16(x) || ld_q < round_up_k(K) || ld_q % 16 || !aligned16(xq))
    throw Error(ErrorCode::kInternal, std::string(what) +
                                          ": needs ld_x % 8 == 0 covering K, ld_q % 16 == 0 covering K rounded up to "
                                          "32, and 16-byte aligned rows");
}

}  // namespace

bool fp8_gemm_supported() { return fp8_device().mma_e4m3; }

void fp8_gemm_prepare() {
  if (!fp8_gemm_supported()) return;
  allow_smem_all<false>();
  allow_smem_all<true>();
}

void quantize_rows_fp8(const void* x, DType e, int T, int K, int ld_x, uint8_t* xq, int ld_q, float* x_scale,
                       cudaStream_t stream) {
  if (T <= 0) return;
  check_quantize_args(x, e, K, ld_x, xq, ld_q, "quantize_rows_fp8");
  const int Kp = round_up_k(K);
  if (e == DType::BF16)
    quantize_rows_kernel<<<T, kQuantThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), K, Kp, ld_x, xq, ld_q,
                                                          x_scale);
  else
    quantize_rows_kernel<<<T, kQuantThreads, 0, stream>>>(static_cast<const __half*>(x), K, Kp, ld_x, xq, ld_q,
                                                          x_scale);
  SLUICE_CUDA_LAUNCH_CHECK("quantize_rows_kernel");
}

void quantize_rows_fp8_blocks(const void* x, DType e, int T, int K, int ld_x, uint8_t* xq, int ld_q, float* x_scale,
                              int ld_scale, cudaStream_t stream) {
  if (T <= 0) return;
  check_quantize_args(x, e, K, ld_x, xq, ld_q, "quantize_rows_fp8_blocks");
  const int blocks_per_row = (K + kFp8BlockCols - 1) / kFp8BlockCols;
  if (ld_scale < blocks_per_row)
    throw Error(ErrorCode::kInternal, "quantize_rows_fp8_blocks: ld_scale must cover ceil(K / 128)");
  const int Kp = round_up_k(K), warps_per_block = kQuantThreads / 32;
  const int grid = int((int64_t(T) * blocks_per_row + warps_per_block - 1) / warps_per_block);
  if (e == DType::BF16)
    quantize_blocks_kernel<<<grid, kQuantThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), T, K, Kp, ld_x, xq,
                                                               ld_q, x_scale, ld_scale, blocks_per_row);
  else
    quantize_blocks_kernel<<<grid, kQuantThreads, 0, stream>>>(static_cast<const __half*>(x), T, K, Kp, ld_x, xq, ld_q,
                                                               x_scale, ld_scale, blocks_per_row);
  SLUICE_CUDA_LAUNCH_CHECK("quantize_blocks_kernel");
}

void fp8_gemm(const Fp8GemmArgs& a, cudaStream_t stream) {
  if (a.T <= 0 || a.N <= 0) return;
  if (!fp8_gemm_supported()) throw Error(ErrorCode::kInternal, "fp8_gemm: the device has no e4m3 MMA (needs sm_89+)");
  const int Kp = round_up_k(a.K), scale_cols = (a.K + kFp8BlockCols - 1) / kFp8BlockCols;
  if (a.K <= 0 || a.ld_x < Kp || a.ld_w < Kp || a.ld_x % 16 || a.ld_w % 16 || !aligned16(a.x) || !aligned16(a.w))
    throw Error(ErrorCode::kInternal,
                "fp8_gemm: code rows must be 16-byte aligned, ld_x and ld_w multiples of 16 covering K rounded up to 32");
  if (!a.x_scale || !a.w_scale || (a.x_block_scales && a.ld_x_scale < scale_cols))
    throw Error(ErrorCode::kInternal, "fp8_gemm: scales missing, or block activation scales narrower than ceil(K / 128)");
  if (a.w_scales != Fp8Scales::Tensor && a.w_scales != Fp8Scales::Channel &&
      (a.w_scales != Fp8Scales::Block || a.w_block_rows <= 0))
    throw Error(ErrorCode::kInternal, "fp8_gemm: weight scales must be per tensor, per channel or per block");
  if ((a.y_type != DType::F32 && a.y_type != DType::BF16 && a.y_type != DType::F16) ||
      (a.accumulate && a.y_type != DType::F32) || a.ld_y < a.N)
    throw Error(ErrorCode::kInternal, "fp8_gemm: y must be f32, bf16 or f16 (accumulate: f32) with ld_y >= N");
  Fp8Params p{};
  p.x = a.x;
  p.ld_x = a.ld_x;
  p.x_scale = a.x_scale;
  p.ld_x_scale = a.x_block_scales ? a.ld_x_scale : 0;
  p.w = a.w;
  p.ld_w = a.ld_w;
  p.w_scale = a.w_scale;
  p.w_scales = a.w_scales;
  p.w_block_rows = a.w_block_rows;
  p.scale_cols = scale_cols;
  p.bias = a.bias;
  p.T = a.T;
  p.N = a.N;
  p.Kp = Kp;
  p.y = a.y;
  p.ld_y = a.ld_y;
  p.y_type = a.y_type;
  p.accumulate = a.accumulate;
  if (a.x_block_scales || a.w_scales == Fp8Scales::Block) launch_sized<true>(p, stream);
  else launch_sized<false>(p, stream);
}

}  // namespace sluice::cuda
